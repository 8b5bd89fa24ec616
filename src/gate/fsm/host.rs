//! The FSM record in shared data — one value per `vm_id`, process-wide,
//! written only by compare-and-swap so that every worker sees one state and
//! two racing callers of a transition get one success and one 409 — and the
//! records beside it that have no shell of their own (see `host`): what the LB
//! checkers were served, the clock-step watch.

use std::cell::Cell;
use std::rc::Rc;

use crate::gate::clock::{Look, Now, Steps};
use crate::gate::fsm::{self, Illegal, Move, Record};
use crate::gate::lb::{Checkers, Gate};
use crate::host::keys;
use crate::host::logs;
use crate::host::metrics::Metrics;
use crate::host::shared::{Decision, Seen, SharedError};
use crate::host::wasm_host::Host;

/// Why a transition did not happen.
#[derive(Debug)]
pub enum TransitionError {
    /// The move is not legal from the current state (HTTP 409).
    Illegal(Illegal),
    /// Shared data could not be read or written (HTTP 503).
    Shared(SharedError),
}

/// What a role's shell runs after each transition it wrote (the instruments
/// that hang off transitions: `Store::raising`).
pub type Raise<H> = fn(&H, &Record, Now, &Metrics<H>);

/// The shared records, through one host, and the versions of them this
/// reader parsed last (`shared::Seen`).
#[derive(Debug)]
pub struct Store<H: Host> {
    host: H,
    fsm: Seen<Record>,
    clock: Seen<Steps>,
    lb: Seen<Checkers>,
    raise: Raise<H>,
}

impl<H: Host> Store<H> {
    pub fn new(host: H) -> Store<H> {
        Store {
            host,
            fsm: Seen::new(keys::FSM),
            clock: Seen::new(keys::CLOCK),
            lb: Seen::new(keys::LB),
            raise: |_, _, _, _| {},
        }
    }

    /// This store, raising each transition it writes to `raise`.
    pub fn raising(self, raise: Raise<H>) -> Store<H> {
        Store { raise, ..self }
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    /// The current record, created OPEN on first use. Two VMs that create it
    /// at once both write OPEN before any transition can have happened.
    pub fn load(&self) -> Result<Record, SharedError> {
        self.current().map(Rc::unwrap_or_clone)
    }

    /// `load`, shared with the version parsed last (no copy of the record).
    pub fn current(&self) -> Result<Rc<Record>, SharedError> {
        self.update(&|_| None)
    }

    /// Applies `fsm::advance` with the move `choose` picks for the current
    /// record, retrying on CAS conflicts. The winner logs the transition,
    /// raises it (`Store::raising`) and counts it.
    pub fn advance(
        &self,
        choose: &dyn Fn(&Record) -> Move,
        active: u64,
        metrics: &Metrics<H>,
    ) -> Result<Record, TransitionError> {
        let now = self.host.now();
        // Why the last attempt could not move.
        let illegal = Cell::new(None);
        let next = self
            .update(&|rec| {
                let moved = fsm::advance(rec, choose(rec), now, active);
                illegal.set(moved.as_ref().err().copied());
                moved.ok()
            })
            .map_err(TransitionError::Shared)?;
        if let Some(e) = illegal.get() {
            return Err(TransitionError::Illegal(e));
        }
        let next = Rc::unwrap_or_clone(next);
        let from = next.history.last().map_or(next.state, |s| s.from);
        logs::info!(
            "event=transition from={} to={} reason={} active={} forced={} seq={}",
            from.name(),
            next.state.name(),
            next.reason.name(),
            active,
            next.forced,
            next.seq
        );
        (self.raise)(&self.host, &next, now, metrics);
        metrics.transition(&next);
        Ok(next)
    }

    /// Rewrites the record with what `change` makes of it (a lease or a plan
    /// change, not a transition), retrying on CAS conflicts; `None` from
    /// `change` writes nothing (but the OPEN record of a process that never
    /// wrote one). Returns the record as it now stands, shared, not copied.
    pub fn update(
        &self,
        change: &dyn Fn(&Record) -> Option<Record>,
    ) -> Result<Rc<Record>, SharedError> {
        self.fsm.change(&self.host, |seen| {
            let present = seen.is_some();
            // Absent: the OPEN record of a process that never wrote one (the
            // first VM creates it on its first write).
            let rec = seen.unwrap_or_else(|| Rc::new(Record::new(self.host.now().wall_ms)));
            let next = match change(&rec) {
                Some(next) => Rc::new(next),
                None if present => return Decision::Keep(rec),
                None => rec,
            };
            Decision::Write(Rc::clone(&next), next)
        })
    }

    /// Applies every automatic transition that is due (active=0 flip, drain
    /// timeout, lb_buffer, LB observed DOWN) and returns the resulting record.
    pub fn apply_due(
        &self,
        active: u64,
        lb_down_ms: Option<u64>,
        metrics: &Metrics<H>,
    ) -> Result<Rc<Record>, SharedError> {
        let mut rec = self.current()?;
        // At most two automatic steps can follow each other (CLOSING, then
        // CLOSED when lb_buffer is 0).
        for _ in 0..3 {
            let now = self.host.now();
            // A gated soft drain's flip waits for the gate (unreadable: not
            // yet; `drain_timeout` bounds it).
            let saw_drain = self.gate(&rec).map_or(true, Gate::passes);
            let Some(mv) = fsm::due_gated(&rec, now, active, lb_down_ms, saw_drain) else {
                return Ok(rec);
            };
            rec = match self.advance(&|_| mv, active, metrics) {
                Ok(next) => Rc::new(next),
                // Another worker moved first: look again at what it left.
                Err(TransitionError::Illegal(_)) => self.current()?,
                Err(TransitionError::Shared(e)) => return Err(e),
            };
        }
        Ok(rec)
    }

    /// What a gated soft drain waits for (`None`: not a gated drain now).
    pub fn gate(&self, rec: &Record) -> Option<Gate> {
        let plan = rec
            .plan
            .filter(|p| p.lb_gate && rec.state == fsm::State::Draining)?;
        let since = rec.drain_started_timer_ms().unwrap_or(0);
        let now = self.host.now().timer_ms();
        // An LB record that cannot be read: waiting.
        let gate = |c: Rc<Checkers>| c.gate(since, now, plan.lb_gate_needs_checker);
        Some(self.lb_checkers().map_or(Gate::Waiting, gate))
    }

    /// What every LB checker has been answered so far (parsed only when it
    /// changed since this store parsed it: a cut during a drain reads it),
    /// shared with the version parsed last (no copy).
    pub fn lb_checkers(&self) -> Result<Rc<Checkers>, SharedError> {
        Ok(self.lb.read(&self.host)?.unwrap_or_default())
    }

    /// Rewrites the LB record with `change` (a `Checkers` method given the
    /// timer-clock time: `observe`, `announce`, `ignore`) when it says it
    /// changed it (compare-and-swap, retried; parsed only when its version
    /// moved since this store parsed it). Each check a gap after the last one
    /// changes the record (the gap is the checker's interval,
    /// `crate::gate::lb`); a check that changes nothing costs the read alone.
    pub fn lb_change(
        &self,
        change: &mut dyn FnMut(&mut Checkers, u64) -> bool,
    ) -> Result<bool, SharedError> {
        let now_ms = self.host.now().timer_ms();
        self.lb.change(&self.host, |seen| {
            let mut c = seen.map_or_else(Checkers::default, |c| Checkers::clone(&c));
            match change(&mut c, now_ms) {
                true => Decision::Write(c, true),
                false => Decision::Keep(false),
            }
        })
    }

    /// The clock-step record (see `crate::gate::clock::Steps`).
    pub fn clock_steps(&self) -> Result<Steps, SharedError> {
        let steps = self.clock.read(&self.host)?;
        Ok(steps.map_or_else(Steps::default, |s| *s))
    }

    /// Compares the clocks with the clock-step record and updates it. Returns
    /// the step when this caller recorded one (so that each step is logged and
    /// counted once, by the worker that saw it first).
    pub fn clock_look(
        &self,
        now: Now,
        threshold_ms: u64,
    ) -> Result<Option<(Steps, i64)>, SharedError> {
        self.clock.change(&self.host, |seen| {
            let steps = seen.map_or_else(Steps::default, |s| *s);
            match steps.look(now, threshold_ms) {
                Look::Same => Decision::Keep(None),
                Look::Crept(next) => Decision::Write(next, None),
                Look::Stepped(next, by) => Decision::Write(next, Some((next, by))),
            }
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::config;
    use crate::gate::fsm::{Reason, State};
    use crate::host::sim::Sim;

    fn drain() -> Move {
        Move {
            expected_from: State::Open,
            to: State::Draining,
            reason: Reason::DrainRequested,
            plan: Some(config::Health::default().plan()),
            force: false,
        }
    }

    #[test]
    fn the_record_is_created_open_once_and_one_of_two_racing_drains_wins() {
        let sim = Sim::at(5_000);
        let store = Store::new(&sim);
        let metrics = Metrics::define(&sim);
        assert_eq!(store.load().unwrap().state, State::Open);
        sim.cas_races.set(3); // retried transparently
        let first = store.advance(&|_| drain(), 2, &metrics).unwrap();
        assert_eq!((first.state, first.seq), (State::Draining, 1));
        let second = store.advance(&|_| drain(), 2, &metrics).unwrap_err();
        assert!(matches!(second, TransitionError::Illegal(i) if i.state == State::Draining));
        assert_eq!(sim.metric("drain_gate_transitions_to_draining"), 1);
        assert_eq!(sim.metric(crate::metric_names::STATE), 1);
    }

    #[test]
    fn endless_contention_and_unreadable_values_are_errors_not_panics() {
        let sim = Sim::at(5_000);
        let store = Store::new(&sim);
        store.load().unwrap();
        sim.cas_races.set(u32::MAX);
        let e = store.update(&|r| Some(r.clone())).unwrap_err();
        assert_eq!(e, SharedError::Contention);
        sim.cas_races.set(0);
        sim.put(keys::LB, b"[1,2");
        let e = store.lb_checkers().unwrap_err();
        assert!(
            e.to_string().starts_with("unreadable drain_gate.lb.v2: "),
            "{e}"
        );
    }

    #[test]
    fn a_clock_step_is_recorded_once() {
        let sim = Sim::at(5_000);
        let store = Store::new(&sim);
        assert_eq!(
            store.clock_look(sim.now_of(), 300).unwrap(),
            None,
            "first look"
        );
        sim.step_wall(3_600_000);
        let (steps, by) = store.clock_look(sim.now_of(), 300).unwrap().unwrap();
        assert_eq!((steps.count, by), (1, 3_600_000));
        assert_eq!(
            store.clock_look(sim.now_of(), 300).unwrap(),
            None,
            "seen once"
        );
    }
}
