//! The drain state machine: states, the transition table, `advance()`.
//! Pure: no proxy-wasm types, no clock.
//!
//! ```text
//!             POST /drain               active=0 (after min_drain),
//!   OPEN ───────────────────▶ DRAINING ─ drain_timeout (forced), ─▶ CLOSING ─ lb_buffer, ─▶ CLOSED
//!     ▲                          │        POST /close-lb                │     POST /close
//!     └──────── POST /reopen ────┴──────────────────────────────────────┘
//!   any state except FAULT ── POST /fault ──▶ FAULT
//! ```
//!
//! A maintenance drain (`DrainPlan::hold_closing`) stays in CLOSING until
//! `/reopen` or `/close` (`resume` makes it automatic again); an active
//! preStop hold (`Record::hold`) refuses an unforced `/reopen`.

pub mod host;

use crate::json::{named, record};

use crate::gate::clock::Now;

named! {
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub enum State {
        #[default]
        Open = "OPEN",
        Draining = "DRAINING",
        Closing = "CLOSING",
        Closed = "CLOSED",
        Fault = "FAULT",
    }
}

impl State {
    /// The state whose `code()` this is.
    pub fn from_code(code: u64) -> Option<State> {
        State::ALL.iter().copied().find(|s| s.code() == code)
    }

    /// Numeric value of the `drain_gate_state` gauge: the declaration order.
    pub fn code(self) -> u64 {
        self as u64
    }
}

named! {
    /// Why a transition happened (`reason` in logs and status); `*_requested`:
    /// the admin call of that name (`drain`: also `GET /prestop`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum Reason {
        /// The process started (initial record).
        #[default]
        Start = "start",
        DrainRequested = "drain_requested",
        /// The last in-flight request ended while DRAINING.
        ActiveZero = "active_zero",
        /// `drain_timeout` passed with requests still in flight (forced).
        DrainTimeout = "drain_timeout",
        CloseLbRequested = "close_lb_requested",
        LbBufferElapsed = "lb_buffer_elapsed",
        /// `close_after: lb_observed_down`: `lb_buffer` passed after every LB
        /// checker was served `lb_fall` 503s, ...
        LbObservedDown = "lb_observed_down",
        /// ... or the LB was not observed DOWN within `lb_down_timeout`.
        LbDownTimeout = "lb_down_timeout",
        CloseRequested = "close_requested",
        ReopenRequested = "reopen_requested",
        FaultRequested = "fault_requested",
        /// A placeholder served a request on an announced gateway
        /// (`crate::gate::placeholder`): a drain that holds CLOSING.
        FilterNotLoaded = "filter_not_loaded",
    }
}

/// The only legal moves. Everything else is an illegal transition (HTTP 409).
pub fn legal(from: State, to: State) -> bool {
    use State::*;
    (to == Fault && from != Fault)
        || matches!(
            (from, to),
            (Open, Draining) | (Draining, Closing) | (Closing, Closed) | (Draining | Closing, Open)
        )
}

named! {
    /// When CLOSING ends.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum CloseAfter {
        /// `lb_buffer` after CLOSING began (the default: a fixed wait).
        #[default]
        LbBuffer = "lb_buffer",
        /// `lb_buffer` after every LB checker was seen served `lb_fall` 503s,
        /// or `lb_down_timeout` after CLOSING began if that never happens.
        LbObservedDown = "lb_observed_down",
    }
}

record! {
    /// Timings fixed when a drain starts, so that every worker (and the traffic
    /// role, which has no timing configuration) applies the same deadlines.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct DrainPlan {
        pub min_drain_ms: u64,
        pub drain_timeout_ms: u64,
        pub lb_buffer_ms: u64,
        pub close_after: CloseAfter = Default::default(),
        pub lb_down_timeout_ms: u64 = 0,
        /// Soft drain: the active = 0 flip also waits until the LB has been
        /// served the draining answer (see `due_gated`).
        pub lb_gate: bool = false,
        /// With `lb_gate`: `lb_checkers` names the LB's addresses, so a drain
        /// during which none of them asks holds the gate (`crate::gate::lb::Gate`).
        pub lb_gate_needs_checker: bool = false,
        /// A maintenance drain (`POST /drain?hold=closing`): CLOSING lasts until
        /// `/reopen` or `/close`, never ended by a timer.
        pub hold_closing: bool = false,
    }
}

record! {
    /// One line of the transition history.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Step {
        pub from: State,
        pub to: State,
        pub reason: Reason,
        pub at_ms: u64,
        pub active: u64,
    }
}

/// How many transitions the record remembers.
pub const HISTORY: usize = 16;

record! {
    /// The whole shared state: one value for every worker of the Envoy.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Record {
        pub state: State,
        /// When the current state was entered (ms since the Unix epoch).
        pub since_ms: u64,
        /// Reason of the last transition.
        pub reason: Reason,
        /// Present from `/drain` until the record leaves the drain (reopen).
        pub plan: Option<DrainPlan>,
        pub drain_started_ms: Option<u64>,
        pub closing_ms: Option<u64>,
        pub closed_ms: Option<u64>,
        /// In-flight requests when CLOSING was entered (non-zero only when forced).
        pub active_at_closing: Option<u64>,
        pub forced: bool,
        /// Oldest first, at most `HISTORY` entries.
        pub history: Vec<Step>,
        /// Transitions since the process started: orders log lines written by
        /// different workers.
        pub seq: u64 = 0,
        /// `drain_started_ms` and `closing_ms` on the host's monotonic clock: the
        /// timers measure from these (see `crate::gate::clock`).
        pub drain_started_mono_ms: Option<u64>,
        pub closing_mono_ms: Option<u64>,
        /// The preStop hold, while some worker holds a `wait=closed` answer.
        pub hold: Option<Hold>,
        /// The drain's id: the `seq` of its transition into DRAINING (what a
        /// traffic root sorts the ends of a drain for, `crate::instruments::receipt`).
        pub drain_id: Option<u64>,
    }
}

record! {
    /// A preStop hold: a lease the worker holding a `wait=closed` answer renews
    /// every tick (`renew_hold`): a dead worker's hold expires by itself.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Hold {
        pub renewed_ms: u64,
        pub renewed_mono_ms: Option<u64>,
        pub lease_ms: u64,
    }
}

impl Hold {
    /// When the lease runs out, on the wall clock (for display).
    pub fn until_ms(&self) -> u64 {
        self.renewed_ms.saturating_add(self.lease_ms)
    }
}

impl Record {
    pub fn new(now_ms: u64) -> Record {
        Record {
            since_ms: now_ms,
            ..Record::default()
        }
    }

    /// The active preStop hold, if any.
    pub fn active_hold(&self, now: Now) -> Option<Hold> {
        self.hold
            .filter(|h| !now.passed(Some(h.renewed_ms), h.renewed_mono_ms, h.lease_ms))
    }

    /// Whether CLOSING waits for an operator (a maintenance drain).
    pub fn holds_closing(&self) -> bool {
        self.plan.is_some_and(|p| p.hold_closing)
    }

    /// Milliseconds the drain has run (until CLOSING, or until now), on the
    /// clock the timers run on.
    pub fn drain_duration_ms(&self, now: Now) -> Option<u64> {
        let start = self.drain_started_ms?;
        let end = self.closing_ms.map_or(now, |wall_ms| Now {
            wall_ms,
            mono_ms: self.closing_mono_ms,
        });
        Some(end.since(start, self.drain_started_mono_ms))
    }

    /// When the drain started, on the clock the timers run on
    /// (`crate::gate::clock::Now::timer_ms`): what the LB record is compared with.
    pub fn drain_started_timer_ms(&self) -> Option<u64> {
        self.drain_started_mono_ms.or(self.drain_started_ms)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Illegal {
    pub state: State,
    pub requested: State,
    /// Set when the move was refused only because a preStop hold is active
    /// (until this time); a forced move would have been legal.
    pub hold_until_ms: Option<u64>,
}

/// A transition request: move from `expected_from` to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub expected_from: State,
    pub to: State,
    pub reason: Reason,
    /// Required when `to` is DRAINING.
    pub plan: Option<DrainPlan>,
    /// Reopen even while a preStop hold is active.
    pub force: bool,
}

/// The one transition function. Fails (409) when the record is not in
/// `expected_from` or the move is not in the table.
pub fn advance(rec: &Record, mv: Move, now: Now, active: u64) -> Result<Record, Illegal> {
    let now_ms = now.wall_ms;
    let illegal = |hold_until_ms| Illegal {
        state: rec.state,
        requested: mv.to,
        hold_until_ms,
    };
    if rec.state != mv.expected_from || !legal(rec.state, mv.to) {
        return Err(illegal(None));
    }
    let unforced_reopen = mv.to == State::Open && !mv.force;
    if let Some(hold) = rec.active_hold(now).filter(|_| unforced_reopen) {
        return Err(illegal(Some(hold.until_ms())));
    }
    let mut next = rec.clone();
    // What entering `mv.to` records: the timestamps and plan of a drain,
    // CLOSING's count and forced flag.
    next.state = mv.to;
    next.since_ms = now_ms;
    next.reason = mv.reason;
    next.seq = rec.seq.saturating_add(1);
    match mv.to {
        State::Draining => {
            next.plan = Some(mv.plan.ok_or(illegal(None))?);
            next.drain_id = Some(next.seq);
            next.drain_started_ms = Some(now_ms);
            next.drain_started_mono_ms = now.mono_ms;
            next.closing_ms = None;
            next.closing_mono_ms = None;
            next.closed_ms = None;
            next.active_at_closing = None;
            next.forced = false;
        }
        State::Closing => {
            next.closing_ms = Some(now_ms);
            next.closing_mono_ms = now.mono_ms;
            next.active_at_closing = Some(active);
            // Forced: closed by drain_timeout with requests still in flight
            // (the LB is left with them). A drain the soft-drain gate held
            // until drain_timeout with nothing in flight cut nothing.
            next.forced = mv.reason == Reason::DrainTimeout && active > 0;
        }
        State::Closed => next.closed_ms = Some(now_ms),
        State::Open => {
            next.plan = None;
            next.forced = false;
            next.hold = None;
        }
        State::Fault => {}
    }
    next.history.push(Step {
        from: rec.state,
        to: mv.to,
        reason: mv.reason,
        at_ms: now_ms,
        active,
    });
    let extra = next.history.len().saturating_sub(HISTORY);
    next.history.drain(..extra);
    Ok(next)
}

/// The automatic transition due now, if any (applied by the tick and by the
/// end of the last traffic stream). `lb_down_ms`: when the LB was observed
/// DOWN (`crate::gate::lb`), on the timers' clock (`crate::gate::clock`).
pub fn due(rec: &Record, now: Now, active: u64, lb_down_ms: Option<u64>) -> Option<Move> {
    use Reason::*;
    use State::*;
    let plan = rec.plan?;
    // Whether so long has passed since the drain started, since CLOSING began.
    let drain_for = |span| now.passed(rec.drain_started_ms, rec.drain_started_mono_ms, span);
    let closing_for = |span| now.passed(rec.closing_ms, rec.closing_mono_ms, span);
    let (to, reason) = match rec.state {
        Draining if active == 0 && drain_for(plan.min_drain_ms) => (Closing, ActiveZero),
        Draining if drain_for(plan.drain_timeout_ms) => (Closing, DrainTimeout),
        Closing if plan.hold_closing => return None,
        Closing if plan.close_after == CloseAfter::LbBuffer => {
            let elapsed = closing_for(plan.lb_buffer_ms);
            (Closed, elapsed.then_some(LbBufferElapsed)?)
        }
        Closing => {
            // When CLOSING began, on the clock the timers run on.
            let closing = rec.closing_mono_ms.or(rec.closing_ms)?;
            let seen = lb_down_ms.filter(|t| *t >= closing);
            if seen.is_some_and(|t| now.timer_ms() >= t.saturating_add(plan.lb_buffer_ms)) {
                (Closed, LbObservedDown)
            } else {
                let timed_out = closing_for(plan.lb_down_timeout_ms);
                (Closed, timed_out.then_some(LbDownTimeout)?)
            }
        }
        _ => return None,
    };
    Some(Move {
        expected_from: rec.state,
        to,
        reason,
        plan: None,
        force: false,
    })
}

/// `due`, but a soft drain (`plan.lb_gate`) acts on a count of 0 only once
/// `lb_saw_drain` (`crate::gate::lb::Checkers::gate`): else the LB would
/// go from UP straight to DOWN. `drain_timeout` applies with the real count.
pub fn due_gated(
    rec: &Record,
    now: Now,
    active: u64,
    lb_down_ms: Option<u64>,
    lb_saw_drain: bool,
) -> Option<Move> {
    let held = rec.plan.is_some_and(|p| p.lb_gate) && !lb_saw_drain;
    let active = if held { active.max(1) } else { active };
    due(rec, now, active, lb_down_ms)
}

/// The record with the preStop hold renewed from `now` for `lease_ms`, or
/// `None` when nothing needs writing: the hold is less than half a lease
/// old, or the record is not in a drain a hold can protect.
pub fn renew_hold(rec: &Record, now: Now, lease_ms: u64) -> Option<Record> {
    let fresh = |h: Hold| {
        h.lease_ms == lease_ms && !now.passed(Some(h.renewed_ms), h.renewed_mono_ms, lease_ms / 2)
    };
    if !matches!(rec.state, State::Draining | State::Closing) || rec.hold.is_some_and(fresh) {
        return None;
    }
    let mut next = rec.clone();
    next.hold = Some(Hold {
        renewed_ms: now.wall_ms,
        renewed_mono_ms: now.mono_ms,
        lease_ms,
    });
    Some(next)
}

/// The record with a maintenance drain turned automatic again (a preStop
/// joined it: the pod is going away, CLOSING must end by itself), or `None`
/// when it is not one. CLOSING keeps its start, so `lb_buffer` counts from it.
pub fn resume(rec: &Record) -> Option<Record> {
    let plan = rec
        .plan
        .filter(|p| p.hold_closing && matches!(rec.state, State::Draining | State::Closing))?;
    let mut next = rec.clone();
    next.plan = Some(DrainPlan {
        hold_closing: false,
        ..plan
    });
    Some(next)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use State::*;

    fn w(ms: u64) -> Now {
        Now::wall(ms)
    }

    const PLAN: DrainPlan = DrainPlan {
        min_drain_ms: 1_000,
        drain_timeout_ms: 10_000,
        lb_buffer_ms: 3_000,
        close_after: CloseAfter::LbBuffer,
        lb_down_timeout_ms: 60_000,
        lb_gate: false,
        lb_gate_needs_checker: false,
        hold_closing: false,
    };

    fn mv(from: State, to: State, reason: Reason) -> Move {
        Move {
            expected_from: from,
            to,
            reason,
            plan: Some(PLAN),
            force: false,
        }
    }

    fn at(state: State) -> Record {
        let mut r = Record::new(0);
        r.state = state;
        r.plan = Some(PLAN);
        r.drain_started_ms = Some(100);
        r.closing_ms = Some(200);
        r
    }

    #[test]
    fn exactly_the_documented_moves_are_legal() {
        let mut legal_moves = vec![];
        for &from in State::ALL {
            for &to in State::ALL {
                if legal(from, to) {
                    legal_moves.push((from, to));
                }
            }
        }
        assert_eq!(
            legal_moves,
            vec![
                (Open, Draining),
                (Open, Fault),
                (Draining, Open),
                (Draining, Closing),
                (Draining, Fault),
                (Closing, Open),
                (Closing, Closed),
                (Closing, Fault),
                (Closed, Fault),
            ]
        );
    }

    #[test]
    fn advance_refuses_a_stale_expected_state() {
        let r = at(Draining);
        let err = advance(&r, mv(Open, Draining, Reason::DrainRequested), w(5), 0).unwrap_err();
        assert_eq!(
            err,
            Illegal {
                state: Draining,
                requested: Draining,
                hold_until_ms: None,
            }
        );
        let err = advance(
            &at(Closed),
            mv(Closed, Open, Reason::ReopenRequested),
            w(5),
            0,
        );
        assert!(err.is_err(), "CLOSED -> OPEN must be illegal");
    }

    #[test]
    fn drain_records_plan_and_start() {
        let r = Record::new(0);
        let d = advance(&r, mv(Open, Draining, Reason::DrainRequested), w(50), 7).unwrap();
        assert_eq!(d.state, Draining);
        assert_eq!(d.drain_started_ms, Some(50));
        assert_eq!(d.plan, Some(PLAN));
        assert_eq!(d.history.len(), 1);
        assert_eq!(d.history[0].active, 7);
        assert_eq!(d.seq, 1);
    }

    #[test]
    fn drain_without_plan_is_refused() {
        let r = Record::new(0);
        let m = Move {
            plan: None,
            ..mv(Open, Draining, Reason::DrainRequested)
        };
        assert!(advance(&r, m, w(1), 0).is_err());
    }

    #[test]
    fn forced_close_keeps_the_active_count() {
        let r = at(Draining);
        let c = advance(
            &r,
            mv(Draining, Closing, Reason::DrainTimeout),
            w(10_100),
            3,
        )
        .unwrap();
        assert!(c.forced);
        assert_eq!(c.active_at_closing, Some(3));
        let c = advance(&r, mv(Draining, Closing, Reason::ActiveZero), w(900), 0).unwrap();
        assert!(!c.forced);
    }

    #[test]
    fn due_respects_min_drain_timeout_and_lb_buffer() {
        let r = at(Draining); // started at 100, min_drain 1000, timeout 10000
        assert_eq!(due(&r, w(500), 0, None), None, "min_drain not yet passed");
        assert_eq!(
            due(&r, w(1_100), 0, None).unwrap().reason,
            Reason::ActiveZero
        );
        assert_eq!(
            due(&r, w(5_000), 2, None),
            None,
            "still active, not yet timed out"
        );
        assert_eq!(
            due(&r, w(10_100), 2, None).unwrap().reason,
            Reason::DrainTimeout
        );
        let c = at(Closing); // closing at 200, lb_buffer 3000
        assert_eq!(due(&c, w(3_199), 0, None), None);
        let m = due(&c, w(3_200), 0, None).unwrap();
        assert_eq!((m.to, m.reason), (Closed, Reason::LbBufferElapsed));
        assert_eq!(due(&Record::new(0), w(1 << 40), 0, None), None);
        assert_eq!(due(&at(Closed), w(1 << 40), 0, None), None);
    }

    #[test]
    fn close_after_lb_observed_down() {
        let mut c = at(Closing); // closing at 200
        c.plan = Some(DrainPlan {
            close_after: CloseAfter::LbObservedDown,
            lb_buffer_ms: 500,
            lb_down_timeout_ms: 20_000,
            ..PLAN
        });
        assert_eq!(
            due(&c, w(10_000), 0, None),
            None,
            "not observed, not timed out"
        );
        assert_eq!(
            due(&c, w(10_000), 0, Some(100)),
            None,
            "observed before CLOSING: stale"
        );
        assert_eq!(due(&c, w(4_400), 0, Some(4_000)), None, "inside lb_buffer");
        let m = due(&c, w(4_500), 0, Some(4_000)).unwrap();
        assert_eq!((m.to, m.reason), (Closed, Reason::LbObservedDown));
        let m = due(&c, w(20_200), 0, None).unwrap();
        assert_eq!((m.to, m.reason), (Closed, Reason::LbDownTimeout));
    }

    #[test]
    fn soft_drain_gate_holds_the_zero_until_the_lb_saw_the_drain() {
        let mut r = at(Draining); // started at 100, min_drain 1000, timeout 10000
        r.plan = Some(DrainPlan {
            lb_gate: true,
            ..PLAN
        });
        assert_eq!(
            due_gated(&r, w(1_100), 0, None, false),
            None,
            "LB not yet served 404"
        );
        let m = due_gated(&r, w(1_100), 0, None, true).unwrap();
        assert_eq!(m.reason, Reason::ActiveZero);
        let m = due_gated(&r, w(10_100), 0, None, false).unwrap();
        assert_eq!(m.reason, Reason::DrainTimeout, "bounded by drain_timeout");
        let c = advance(&r, m, w(10_100), 0).unwrap();
        assert!(
            !c.forced && c.active_at_closing == Some(0),
            "nothing was in flight: the timeout closed it, nothing was cut"
        );
        assert_eq!(c.reason, Reason::DrainTimeout);
        // Without the gate in the plan, the LB view does not matter.
        let plain = at(Draining);
        assert_eq!(
            due_gated(&plain, w(1_100), 0, None, false).unwrap().reason,
            Reason::ActiveZero
        );
        // CLOSING's timers are not gated.
        let mut c = at(Closing);
        c.plan = r.plan;
        assert_eq!(due_gated(&c, w(3_200), 0, None, false).unwrap().to, Closed);
    }

    #[test]
    fn timers_run_on_the_monotonic_clock() {
        let at = |wall_ms, mono| Now {
            wall_ms,
            mono_ms: Some(mono),
        };
        let r = Record::new(0);
        let d = advance(
            &r,
            mv(Open, Draining, Reason::DrainRequested),
            at(1_000, 50),
            2,
        )
        .unwrap();
        assert_eq!(d.drain_started_mono_ms, Some(50));
        // The wall clock jumps a day ahead: 9.9 s of 10 s have passed.
        let ahead = at(1_000 + 86_400_000, 9_949);
        assert_eq!(due(&d, ahead, 2, None), None, "no early forced close");
        assert_eq!(d.drain_duration_ms(ahead), Some(9_899));
        let m = due(&d, at(0, 10_050), 2, None).unwrap();
        assert_eq!(m.reason, Reason::DrainTimeout, "on time after a step back");
        let c = advance(&d, m, at(0, 10_050), 2).unwrap();
        assert_eq!(c.closing_mono_ms, Some(10_050));
        assert_eq!(c.drain_duration_ms(at(5, 99_999)), Some(10_000));
        assert_eq!(
            due(&c, at(1 << 40, 13_049), 0, None),
            None,
            "lb_buffer not over"
        );
        let m = due(&c, at(0, 13_050), 0, None).unwrap();
        assert_eq!(m.reason, Reason::LbBufferElapsed);
    }

    #[test]
    fn history_is_bounded() {
        let mut r = Record::new(0);
        for i in 0..40 {
            r = advance(&r, mv(Open, Draining, Reason::DrainRequested), w(i), 0).unwrap();
            r = advance(&r, mv(Draining, Open, Reason::ReopenRequested), w(i), 0).unwrap();
        }
        assert_eq!(r.history.len(), HISTORY);
        assert_eq!(r.history.last().unwrap().to, Open);
    }

    #[test]
    fn record_round_trips_through_json() {
        let r = advance(
            &Record::new(0),
            mv(Open, Draining, Reason::DrainRequested),
            Now {
                wall_ms: 9,
                mono_ms: Some(4),
            },
            1,
        )
        .unwrap();
        let s = serde_json::to_string(&r).unwrap();
        assert!(s.contains("\"DRAINING\""), "{s}");
        assert_eq!(crate::json::from_slice::<Record>(s.as_bytes()).unwrap(), r);
    }

    #[test]
    fn a_prestop_hold_refuses_reopen_unless_forced() {
        for from in [Draining, Closing] {
            let r = renew_hold(&at(from), w(3_000), 2_000).unwrap();
            let err =
                advance(&r, mv(from, Open, Reason::ReopenRequested), w(4_999), 0).unwrap_err();
            assert_eq!(err.hold_until_ms, Some(5_000), "{from:?}");
            let forced = Move {
                force: true,
                ..mv(from, Open, Reason::ReopenRequested)
            };
            let open = advance(&r, forced, w(4_999), 0).unwrap();
            assert_eq!((open.state, open.hold), (Open, None));
            // An expired hold (its worker died) no longer refuses.
            let open = advance(&r, mv(from, Open, Reason::ReopenRequested), w(5_000), 0).unwrap();
            assert_eq!(open.state, Open);
            // Other moves ignore the hold.
            assert!(advance(&r, mv(from, Fault, Reason::FaultRequested), w(4_000), 0).is_ok());
        }
    }

    #[test]
    fn a_hold_is_renewed_at_half_lease_and_only_in_a_drain() {
        let r = at(Draining);
        let held = renew_hold(&r, w(1_000), 2_000).unwrap();
        assert_eq!(held.hold.map(|h| h.until_ms()), Some(3_000));
        assert!(
            renew_hold(&held, w(1_900), 2_000).is_none(),
            "fresh: no write"
        );
        let again = renew_hold(&held, w(2_001), 2_000).unwrap();
        assert_eq!(again.hold.map(|h| h.until_ms()), Some(4_001));
        for s in [Open, Closed, Fault] {
            assert!(renew_hold(&at(s), w(1_000), 2_000).is_none(), "{s:?}");
        }
        // On the monotonic clock, a wall-clock step neither ends nor stretches it.
        let mono = |wall, mono| Now {
            wall_ms: wall,
            mono_ms: Some(mono),
        };
        let held = renew_hold(&r, mono(1_000, 50), 2_000).unwrap();
        assert!(held.active_hold(mono(1_000_000, 2_049)).is_some());
        assert!(held.active_hold(mono(0, 2_050)).is_none());
    }

    #[test]
    fn a_maintenance_drain_holds_closing_until_resumed() {
        let mut c = at(Closing); // closing at 200, lb_buffer 3000
        c.plan = Some(DrainPlan {
            hold_closing: true,
            ..PLAN
        });
        assert!(c.holds_closing());
        assert_eq!(due(&c, w(1 << 40), 0, None), None, "held: never closes");
        let mut d = c.clone();
        d.state = Draining;
        assert_eq!(
            due(&d, w(1_100), 0, None).unwrap().to,
            Closing,
            "the drain itself stays automatic"
        );
        let resumed = resume(&c).unwrap();
        assert!(!resumed.holds_closing());
        assert_eq!(resumed.closing_ms, c.closing_ms);
        let m = due(&resumed, w(3_200), 0, None).unwrap();
        assert_eq!((m.to, m.reason), (Closed, Reason::LbBufferElapsed));
        assert!(resume(&resumed).is_none(), "already automatic");
        assert!(resume(&at(Closing)).is_none());
    }
}
