//! Traffic role: counts every HTTP stream of the listener it is inserted in,
//! flips DRAINING → CLOSING from the callback that ends the last one, and
//! keeps the ages of its streams in flight.

use proxy_wasm::traits::{Context, HttpContext};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::count::{self, Counter};
use super::liveness::Heartbeat;
use super::metrics::Metrics;
use super::{in_flight, now, store};
use crate::fsm::State;
use crate::in_flight::Ages;

/// This worker's streams by start tick (`crate::in_flight`). A stream is
/// stamped with the time of the last tick, so starting and ending one makes
/// no host call; the tick publishes the summary.
#[derive(Debug)]
struct AgeBook {
    ages: RefCell<Ages>,
    last_tick_ms: Cell<u64>,
    tick_ms: u64,
    slot: Option<u32>,
}

impl AgeBook {
    fn new(tick_ms: u64) -> AgeBook {
        AgeBook {
            ages: RefCell::new(Ages::default()),
            last_tick_ms: Cell::new(now().timer_ms()),
            tick_ms,
            slot: in_flight::claim_slot(),
        }
    }

    fn enter(&self) -> u64 {
        let started = self.last_tick_ms.get();
        if let Ok(mut ages) = self.ages.try_borrow_mut() {
            ages.enter(started);
        }
        started
    }

    fn exit(&self, started_ms: u64) {
        if let Ok(mut ages) = self.ages.try_borrow_mut() {
            ages.exit(started_ms);
        }
    }

    fn tick(&self) {
        let now = now().timer_ms();
        self.last_tick_ms.set(now);
        let (Some(slot), Ok(mut ages)) = (self.slot, self.ages.try_borrow_mut()) else {
            return;
        };
        ages.compact();
        in_flight::publish(slot, &ages.publish(now, self.tick_ms));
    }
}

/// Shared by every stream of one traffic root context.
#[derive(Debug)]
pub struct Traffic {
    counter: Counter,
    metrics: Metrics,
    /// Whether a drain was running at the last tick (or may be: it starts
    /// true). Outside a drain no stream end needs to look any further.
    draining: Cell<bool>,
    ages: AgeBook,
    heartbeat: Heartbeat,
}

impl Traffic {
    pub fn new(counter: Counter, metrics: Metrics, tick_ms: u64) -> Traffic {
        Traffic {
            counter,
            metrics,
            draining: Cell::new(true),
            ages: AgeBook::new(tick_ms),
            heartbeat: Heartbeat::new(tick_ms),
        }
    }

    /// The root context is being removed cleanly: leave the registry.
    pub fn goodbye(&self) {
        self.heartbeat.goodbye();
    }

    /// Every `tick`: publish the ages; is a drain running? Give back the
    /// unused lease, and during a drain check whether this VM's last stream
    /// already ended before it knew about the drain.
    pub fn tick(&self) {
        self.heartbeat.beat();
        self.ages.tick();
        let state = match self.metrics.state_hint() {
            Some(state) => state,
            None => match store::load() {
                Ok(rec) => rec.state,
                Err(_) => State::Draining, // unknown: keep looking
            },
        };
        let draining = state == State::Draining;
        self.draining.set(draining);
        self.counter.settle();
        if draining && self.counter.in_flight() == 0 {
            self.try_flip();
        }
    }

    /// The hot path. Outside a drain: no host call most of the time (see the
    /// lease in `count`). During one, the stream that brings the count to 0 flips DRAINING →
    /// CLOSING itself. That is exact without polling because every
    /// transition writer publishes the state and then reads the count, while
    /// this side releases its count and then reads the state: of two such
    /// interleavings at least one side sees the other (both are sequentially
    /// consistent atomics in Envoy). A stream ending before this VM's next
    /// tick has seen a new drain is left to the health role's tick.
    fn stream_ended(&self) {
        let draining = self.draining.get();
        if self.counter.exit(draining) > 0 || !draining {
            return; // streams in flight here, or no drain running
        }
        self.try_flip();
    }

    /// The global count may be 0 during a drain: flip if it is.
    fn try_flip(&self) {
        if self
            .metrics
            .state_hint()
            .is_some_and(|s| s != State::Draining)
        {
            return;
        }
        if !self.counter.reads_zero() || self.counter.read().for_decisions() > 0 {
            return;
        }
        if let Err(e) = store::apply_due(0, None, &self.metrics) {
            log::error!("event=state_unavailable role=traffic error=\"{e}\"");
        }
    }
}

/// One HTTP stream. It is counted from creation, whether or not its headers
/// callback ever runs (an earlier filter may answer locally), and released in
/// `Drop`, which the host runs for every stream end, resets included.
pub struct TrafficStream {
    traffic: Rc<Traffic>,
    counted: bool,
    started_ms: u64,
}

impl TrafficStream {
    pub fn new(traffic: Rc<Traffic>) -> TrafficStream {
        let counted = traffic.counter.enter(traffic.draining.get());
        if !counted {
            count::not_counted(&traffic.metrics);
        }
        let started_ms = traffic.ages.enter();
        TrafficStream {
            traffic,
            counted,
            started_ms,
        }
    }
}

impl Context for TrafficStream {}

impl HttpContext for TrafficStream {}

impl Drop for TrafficStream {
    fn drop(&mut self) {
        self.traffic.ages.exit(self.started_ms);
        if self.counted {
            self.traffic.stream_ended();
        }
    }
}
