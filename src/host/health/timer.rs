//! What each tick of a health root does: the clock-step watch, automatic
//! transitions, the placeholders, and the release of held answers.

use super::{lb_unavailable, send, state_unavailable, Health};
use std::cell::OnceCell;

use crate::api;
use crate::gate::clock::{self, Now};
use crate::gate::fsm::host as store;
use crate::gate::fsm::{self, Move, Reason, Record, State};
use crate::gate::placeholder::{self, Action as PlaceholderAction};
use crate::host::wasm_host::Host;
use crate::host::{logs, metrics::Id};
use crate::instruments::in_flight::{self, host::published};

/// How often a health root sets the LB detection gauges: each second, not
/// each tick (one read and parse of the LB record).
pub const LB_GAUGES_MS: u64 = 1_000;

impl<H: Host> Health<H> {
    /// Runs every `tick` on each worker: the clock-step watch, automatic
    /// transitions, then the release of held answers that are over.
    pub fn tick(&self) {
        self.watch_clock();
        let judged = self.watch.tick(&self.metrics);
        let reading = self.active.read();
        let due = self.apply_due(reading.for_decisions());
        self.unreadable.set(due.is_err());
        let Ok(rec) = due.map_err(state_unavailable) else {
            return;
        };
        self.metrics.sync_state(rec.state);
        self.judge_placeholders(&rec);
        self.rotator.tick(&rec, self.store.gate(&rec));
        let now = self.host().now();
        // The process's gauges are written by the tick that judged liveness
        // (one per half tick in the process); the in-flight summaries are
        // read for it, and by a tick that finds the oldest stream at the flip
        // not recorded yet (`keep_receipt`): once at most.
        let oldest = OnceCell::new();
        let oldest = || {
            *oldest.get_or_init(|| {
                let p = published(self.host(), self.watch.ids());
                in_flight::merge(&p, now.timer_ms()).oldest_age_ms
            })
        };
        if judged {
            self.metrics.set(Id::CountUnreliable, !reading.reliable);
            self.metrics
                .set(Id::OldestInFlight, oldest().unwrap_or(0) / 1000);
            self.lb_gauges(now.timer_ms());
        }
        self.keep_receipt(&rec, &oldest);
        let held = self.release_waiters(&rec, now);
        let holding = held && matches!(rec.state, State::Draining | State::Closing);
        self.termination.tick(holding, &self.metrics);
    }

    /// Sets the gauges of the LB's measured check interval and of what
    /// `lb_buffer` lacks (`crate::gate::lb::Checkers::detection`), once a second.
    fn lb_gauges(&self, now: u64) {
        let at = self.lb_gauges_at.get();
        if at.is_some_and(|at| now.saturating_sub(at) < LB_GAUGES_MS) {
            return;
        }
        self.lb_gauges_at.set(Some(now));
        if let Ok(checkers) = self.store.lb_checkers().map_err(lb_unavailable) {
            let d = checkers.detection(now, self.config.lb_fall, self.config.lb_wait());
            // Nothing measured: both 0.
            let (interval, short) = d.map_or((0, 0), |d| (d.interval_ms, d.short_ms));
            self.metrics.set(Id::LbCheckInterval, interval);
            self.metrics.set(Id::LbBufferShort, short);
        }
    }

    /// Makes a wall-clock step visible: the worker that sees it first logs
    /// and counts it. The timers themselves never look at the wall clock.
    pub(super) fn watch_clock(&self) {
        let now = self.host().now();
        let threshold = clock::step_threshold_ms(self.config.shared.tick_ms);
        match self.store.clock_look(now, threshold) {
            Ok(Some((steps, by))) => {
                logs::warning!(
                    "event=clock_step step_ms={by} wall={} steps={} timers={}",
                    clock::rfc3339(now.wall_ms),
                    steps.count,
                    now.timers().name()
                );
                self.metrics.add(Id::ClockSteps, 1);
            }
            Ok(None) => {}
            Err(e) => logs::warning!("event=clock_record_unavailable error=\"{e}\""),
        }
    }

    /// Keeps a gateway not yet announced out while a placeholder runs, and
    /// drains an announced one once a placeholder served a request: a drain
    /// that holds CLOSING, as a maintenance drain does (`crate::gate::placeholder`).
    fn judge_placeholders(&self, rec: &Record) {
        let p = placeholder::host::read_seen(self.host(), &self.placeholders_seen);
        if !self.announced.get() && p.present() > 0 {
            if let Ok(c) = self.store.lb_checkers().map_err(lb_unavailable) {
                self.announced.set(c.announced_ms.is_some());
            }
        }
        let action = placeholder::action(p.present(), p.serving(), self.announced.get(), rec.state);
        self.placeholders.set(action);
        if action != PlaceholderAction::Drain {
            return;
        }
        // A maintenance drain (`POST /drain?hold=closing`), for its own reason.
        let started = self.advance(&|r: &Record| Move {
            reason: Reason::FilterNotLoaded,
            ..api::Command::HoldDrain.move_in(r.state, &self.config)
        });
        match started {
            Ok(_) => logs::error!(
                "event=placeholder_drain placeholders={} what=\"a traffic filter serves without its own \
                 configuration: the gateway drains out of the LB (CLOSING holds: /reopen once the filter loads)\"",
                p.present()
            ),
            // Another worker started it first.
            Err(store::TransitionError::Illegal(_)) => {}
            Err(store::TransitionError::Shared(e)) => state_unavailable(e),
        }
    }

    /// Keeps the preStop hold of this worker's held answers alive.
    pub(super) fn renew_hold(&self) {
        let lease = self.config.hold_lease_ms();
        let now = self.host().now();
        if let Err(e) = self.store.update(&|r| fsm::renew_hold(r, now, lease)) {
            logs::warning!("event=hold_unavailable error=\"{e}\"");
        }
    }

    /// Answers the held `wait=closed` requests whose wait is over; renews the
    /// preStop hold of the others. Returns whether any are still held.
    fn release_waiters(&self, rec: &Record, now: Now) -> bool {
        let mut over = Vec::new();
        self.waiters.borrow_mut().retain(|w| {
            let timed_out = now.passed(Some(w.since.wall_ms), w.since.mono_ms, w.timeout_ms);
            let end = self.wait_end(rec, now, timed_out);
            over.extend(end.map(|end| (w.context_id, end)));
            end.is_none()
        });
        let held = !self.waiters.borrow().is_empty();
        if held {
            self.renew_hold();
        }
        for (context_id, end) in over {
            send(self.host(), Some(context_id), &self.status(rec, Some(end)));
        }
        held
    }

    /// How a held wait ends now (`api::wait_end`), if it does: CLOSED lingers
    /// while it began less than `scrape_interval` ago (the record of a CLOSED
    /// gateway always says when), for a scrape to see it.
    pub(super) fn wait_end(&self, rec: &Record, now: Now, timed_out: bool) -> Option<api::WaitEnd> {
        let lingering = !now.passed(rec.closed_ms, None, self.config.scrape_interval_ms);
        api::wait_end(rec.state, timed_out, lingering)
    }
}
