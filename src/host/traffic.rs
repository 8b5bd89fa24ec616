//! Traffic roles: `traffic` counts every HTTP stream of the listener it is
//! inserted in, `traffic_tcp` every connection of the TCP or TLS-passthrough
//! filter chain it is inserted in (a network filter before `tcp_proxy`).
//! Both are one root type: each counts into its part of the count, beats the
//! same heartbeat, flips DRAINING → CLOSING from the callback that ends the
//! last stream or connection of either part, and keeps the ages of what it
//! has in flight.

use proxy_wasm::traits::{Context, HttpContext, StreamContext};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::count::{self, Counter, Counts, Part};
use super::in_flight;
use super::liveness::Heartbeat;
use super::metrics::Metrics;
use super::shared::{Envoy, Host};
use super::store::Store;
use crate::fsm::State;
use crate::in_flight::Ages;

/// This worker's streams by start tick (`crate::in_flight`). A stream is
/// stamped with the time of the last tick, so starting and ending one makes
/// no host call; the tick publishes the summary.
#[derive(Debug)]
struct AgeBook<H: Host> {
    host: H,
    ages: RefCell<Ages>,
    last_tick_ms: Cell<u64>,
    tick_ms: u64,
}

impl<H: Host> AgeBook<H> {
    fn new(host: H, tick_ms: u64) -> AgeBook<H> {
        let last_tick_ms = Cell::new(host.now().timer_ms());
        AgeBook {
            host,
            ages: RefCell::new(Ages::default()),
            last_tick_ms,
            tick_ms,
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

    /// Publishes the summary under the root's registry id (none yet: the
    /// root has not registered, and no reader looks for it).
    fn tick(&self, id: Option<u64>) {
        let now = self.host.now().timer_ms();
        self.last_tick_ms.set(now);
        let (Some(id), Ok(mut ages)) = (id, self.ages.try_borrow_mut()) else {
            return;
        };
        ages.compact();
        in_flight::publish(&self.host, id, &ages.publish(now, self.tick_ms));
    }
}

/// Shared by every stream (or connection) of one traffic root context.
#[derive(Debug)]
pub struct Traffic<H: Host = Envoy> {
    /// What this root counts.
    pub part: Part,
    counts: Counts<H>,
    metrics: Metrics<H>,
    store: Store<H>,
    /// Whether a drain was running at the last tick (or may be: it starts
    /// true). Outside a drain no stream end needs to look any further.
    draining: Cell<bool>,
    ages: AgeBook<H>,
    heartbeat: Heartbeat<H>,
}

impl<H: Host + Copy> Traffic<H> {
    pub fn new(part: Part, metrics: Metrics<H>, tick_ms: u64) -> Traffic<H> {
        let host = *metrics.host();
        Traffic {
            part,
            counts: Counts::new(&metrics),
            metrics,
            store: Store::new(host),
            draining: Cell::new(true),
            ages: AgeBook::new(host, tick_ms),
            heartbeat: Heartbeat::new(host, tick_ms),
        }
    }
}

impl<H: Host> Traffic<H> {
    /// The counter of this root's part.
    fn counter(&self) -> &Counter<H> {
        self.counts.part(self.part)
    }

    /// Streams (or connections) this root counted and has in flight.
    pub fn in_flight(&self) -> u64 {
        self.counter().in_flight()
    }

    /// Whether this root has an uncounted stream the shared count does not
    /// know of yet (its write failed; retried from the tick).
    pub fn owes_uncounted(&self) -> bool {
        self.counter().mark_pending()
    }

    /// This root's registry id, once it registered (its first tick).
    pub fn id(&self) -> Option<u64> {
        self.heartbeat.id()
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
        self.ages.tick(self.heartbeat.id());
        let state = match self.metrics.state_hint() {
            Some(state) => state,
            None => match self.store.load() {
                Ok(rec) => rec.state,
                Err(_) => State::Draining, // unknown: keep looking
            },
        };
        let draining = state == State::Draining;
        self.draining.set(draining);
        self.counter().settle();
        if draining && self.counter().in_flight() == 0 {
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
    /// tick has seen a new drain is left to the health role's tick. The other
    /// part is read after this one is released (`Counts::reads_zero`), so
    /// the last HTTP stream and the last TCP connection ending at once is
    /// the same argument once more.
    fn stream_ended(&self) {
        let draining = self.draining.get();
        if self.counter().exit(draining) > 0 || !draining {
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
        if !self.counts.reads_zero() || self.counts.read().for_decisions() > 0 {
            return;
        }
        if let Err(e) = self.store.apply_due(0, None, &self.metrics) {
            log::error!("event=state_unavailable role=traffic error=\"{e}\"");
        }
    }
}

/// One HTTP stream or one TCP connection. It is counted from creation,
/// whether or not any of its callbacks ever runs (an earlier filter may
/// answer locally), and released in `Drop`, which the host runs for every
/// stream end and connection close, resets included. It implements no data
/// callback: the host's per-read calls get the SDK's `Continue`.
pub struct TrafficStream<H: Host = Envoy> {
    traffic: Rc<Traffic<H>>,
    counted: bool,
    started_ms: u64,
}

impl<H: Host> TrafficStream<H> {
    /// Whether this stream is in the count (else in `keys::UNCOUNTED`).
    pub fn counted(&self) -> bool {
        self.counted
    }

    pub fn new(traffic: Rc<Traffic<H>>) -> TrafficStream<H> {
        traffic.heartbeat.ensure();
        let counted = traffic.counter().enter(traffic.draining.get());
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

impl StreamContext for TrafficStream {}

impl<H: Host> Drop for TrafficStream<H> {
    fn drop(&mut self) {
        self.traffic.ages.exit(self.started_ms);
        if self.counted {
            self.traffic.stream_ended();
        } else {
            self.traffic.counter().uncounted_ended();
        }
    }
}
