//! Traffic-role liveness in shared data (the decisions are `crate::gate::liveness`).
//!
//! A traffic root registers ([`Heartbeat::beat`], first tick), writes its beat
//! from every tick to its own key (one unconditional write of 8 bytes, nothing
//! per stream), and unregisters when removed cleanly. The health roots'
//! [`Judge`] judges the registry — at most one health tick per half `tick`
//! does, the others skip — and writes the verdict the count reads
//! (`keys::VERDICT`).
//!
//! Registrations and beats are written on the timers' clock
//! (`clock::Now::timer_ms`): the host's monotonic clock, one for every worker
//! of the process (no wall-clock step moves it, so a step can neither fake a
//! dead root nor hide one), else the wall clock.

use std::cell::Cell;
use std::rc::Rc;

use crate::gate::count;
use crate::gate::liveness::{self as core, Judging, Registry};
use crate::host::keys::{self, REGISTRY, WATCH};
use crate::host::logs;
use crate::host::metrics::{Id, Metrics};
use crate::host::shared::{self, cas_update, Decision, Seen, SharedError};
use crate::host::wasm_host::{Envoy, Host};

/// Creates the registry and the judging record if absent (configure runs on
/// the main thread before any worker VM, so this cannot race another creator).
pub fn ensure_registry<H: Host>(host: &H) {
    shared::ensure_json(host, REGISTRY, &Registry::default());
    shared::ensure(host, WATCH, &Judging::default().to_bytes());
}

/// Changes the registry (compare-and-swap), moving its generation on: the
/// verdicts judged from it are ordered by it. One copy for every caller.
fn update<H: Host>(host: &H, f: &mut dyn FnMut(&mut Registry)) -> Result<(), SharedError> {
    Seen::new(REGISTRY).update(host, |r: &mut Registry| {
        r.generation = r.generation.saturating_add(1);
        f(r);
    })
}

/// Marks the count unreliable for the life of the process because a role
/// is loaded where it cannot count (`Unreliable::MisplacedRole`).
pub fn misplaced<H: Host>(host: &H) {
    let marked = update(host, &mut |r| r.misplaced = true);
    shared::logged(log::Level::Error, REGISTRY, marked);
}

/// A root's membership of a shared record (the traffic roots' registry, the
/// placeholders), registered once by its owner until its goodbye (which the
/// owner also says from `Drop`): `None` until registered, then `Some(id)`,
/// `Some(None)` once gone (never registered again).
#[derive(Debug, Default)]
pub struct Member(Cell<Option<Option<u64>>>);

impl Member {
    /// The id, registering with `register` first unless registered or gone
    /// (one `Cell` read once registered).
    #[inline(always)]
    pub fn ensure(&self, register: impl FnOnce() -> Option<u64>) -> Option<u64> {
        if self.0.get().is_none() {
            self.0.set(register().map(Some));
        }
        self.0.get().flatten()
    }

    /// Gone for good: the id to leave the record with, if registered (once).
    pub fn gone(&self) -> Option<u64> {
        self.0.replace(Some(None)).flatten()
    }
}

/// One per traffic root context. It registers on its first tick or its
/// first stream, not on configure: Envoy also configures the plugin once in
/// the main thread's base VM to validate it, and that root context never
/// ticks, carries no stream and is never removed — registered, it would look
/// like a lost VM.
#[derive(Debug)]
pub struct Heartbeat<H: Host = Envoy> {
    host: H,
    tick_ms: u64,
    member: Member,
    /// A registration was refused (`MAX_ROOTS`): logged once.
    refused: Cell<bool>,
}

impl<H: Host> Heartbeat<H> {
    pub fn new(host: H, tick_ms: u64) -> Heartbeat<H> {
        Heartbeat {
            host,
            tick_ms,
            member: Member::default(),
            refused: Cell::new(false),
        }
    }

    /// This root's registry id, once registered.
    pub fn id(&self) -> Option<u64> {
        self.member.0.get().flatten()
    }

    /// From a stream's creation and every tick: registers a root not yet
    /// registered (one `Cell` read once it is). A VM can only fail while it
    /// runs a callback — a tick or a stream — so every VM that fails was
    /// registered first and is noticed. Its id, once registered.
    #[inline(always)]
    pub fn ensure(&self) -> Option<u64> {
        self.member.ensure(|| self.register())
    }

    /// From the tick: registers (first tick, or retried until it works),
    /// then says this root is alive. Its id, once registered.
    pub fn beat(&self) -> Option<u64> {
        let id = self.ensure()?;
        let now = self.host.now().timer_ms();
        let _ = self.host.set(&keys::beat(id), &now.to_le_bytes(), None);
        Some(id)
    }

    /// Out of the stream's path: its room is taken only when it runs.
    #[cold]
    #[inline(never)]
    fn register(&self) -> Option<u64> {
        let (now, tick_ms) = (self.host.now().timer_ms(), self.tick_ms);
        let mut id = None;
        let announced = update(&self.host, &mut |r| id = r.announce(tick_ms, now)).map(|()| id);
        match &announced {
            Ok(Some(id)) => logs::info!("event=traffic_role_registered id={id}"),
            Ok(None) if !self.refused.replace(true) => logs::error!(
                "event=traffic_role_refused why=too_many_traffic_roots max={} what=\"more \
                 traffic root contexts than drain-gate watches (one per worker and traffic \
                 filter, plus the main thread's): lower the Envoy concurrency; the count is \
                 not trusted meanwhile\"",
                core::MAX_ROOTS
            ),
            Ok(None) => {}
            Err(e) => logs::error!("event=traffic_role_unregistered error=\"{e}\""),
        }
        announced.ok().flatten()
    }

    /// Leaves the registry (root removed cleanly). Idempotent.
    pub fn goodbye(&self) {
        let Some(id) = self.member.gone() else { return };
        let now = self.host.now().timer_ms();
        match update(&self.host, &mut |r| _ = r.goodbye(id, now)) {
            Ok(()) => logs::info!("event=traffic_role_unregistered id={id} why=goodbye"),
            Err(e) => logs::error!("event=traffic_role_goodbye_failed id={id} error=\"{e}\""),
        }
    }
}

impl<H: Host> Drop for Heartbeat<H> {
    fn drop(&mut self) {
        self.goodbye();
    }
}

/// One per health root context: judges the traffic roots.
#[derive(Debug)]
pub struct Judge<H: Host = Envoy> {
    host: H,
    tick_ms: u64,
    /// Once a traffic root was seen, it stays seen: no read per check.
    seen: Cell<bool>,
    /// The registry as this root parsed it last.
    registry: Seen<Registry>,
}

impl<H: Host> Judge<H> {
    pub fn new(host: H, tick_ms: u64) -> Judge<H> {
        Judge {
            host,
            tick_ms,
            seen: Cell::new(false),
            registry: Seen::new(REGISTRY),
        }
    }

    /// The ids of the registered roots now (the registry parsed only when it
    /// changed since this root parsed it last).
    pub fn ids(&self) -> Vec<u64> {
        let reg = self.registry.read(&self.host).ok().flatten();
        reg.map_or_else(Vec::new, |r| r.roots.iter().map(|r| r.id).collect())
    }

    /// Whether the gateway may be announced (a traffic root has registered).
    pub fn seen(&self) -> bool {
        if !self.seen.get() {
            let reg = self.registry.read(&self.host);
            self.seen.set(reg.is_ok_and(|r| r.is_some_and(|r| r.seen)));
        }
        self.seen.get()
    }

    /// Whether this health tick judges, and silence counted from when (see
    /// `Judging::next`).
    fn judge(&self, now: u64) -> Option<u64> {
        let judged = cas_update(&self.host, WATCH, |bytes, _| {
            // Absent or of another form (never expected): judged afresh.
            let judging = bytes.and_then(Judging::from_bytes).unwrap_or_default();
            Ok::<_, SharedError>(match judging.next(now, self.tick_ms) {
                None => Decision::Keep(None),
                Some((j, stall)) => {
                    Decision::Write(j.to_bytes().to_vec(), Some((j.since_ms, stall)))
                }
            })
        });
        let (since, stall) = shared::logged(log::Level::Warn, WATCH, judged).flatten()?;
        if let Some(gap) = stall {
            logs::warning!(
                "event=stall late_ms={gap} what=\"the health role did not run for {gap} ms (the \
                 process stalled: CPU throttling, a long main-thread task, memory pressure); \
                 traffic roots get a fresh {} ms to beat before any is judged lost\"",
                core::stale_after_ms(self.tick_ms)
            );
        }
        Some(since)
    }

    /// From the health tick: registers again the lost roots that beat again,
    /// moves silent roots to `lost`, notes a gap without roots, and writes
    /// the verdict the count reads. `true`: this tick judged.
    pub fn tick(&self, metrics: &Metrics<H>) -> bool {
        let now = self.host.now().timer_ms();
        let Some(since) = self.judge(now) else {
            return false;
        };
        let beat = |id| shared::read_u64(&self.host, &keys::beat(id)).ok().flatten();
        // Written only when the judgement changed it: a judgement that finds
        // every root beating leaves the registry (and its generation) as it
        // was, and the next reader parses nothing.
        let judged = self.registry.change(&self.host, |seen| {
            let absent = seen.is_none();
            let was = seen.unwrap_or_default();
            let mut r = Registry::clone(&was);
            let back = r.revive(beat);
            let dead = r.stale(now, since, beat);
            let lost = r.mark_lost(&dead);
            let gap = r.note_gap(now, since);
            let changed = absent || r != *was;
            r.generation = r.generation.saturating_add(u64::from(changed));
            let out = (back, lost, gap, r.verdict(now), r.generation);
            match changed {
                true => Decision::Write(r, out),
                false => Decision::Keep(out),
            }
        });
        let Some((back, lost, gap, verdict, gen)) =
            shared::logged(log::Level::Warn, REGISTRY, judged)
        else {
            return true;
        };
        self.seen.set(self.seen.get() || !verdict.waiting);
        for l in &back {
            logs::warning!(
                "event=traffic_role_back id={} silent_ms={} what=\"a traffic root declared lost \
                 beats again: it was late, not dead\"",
                l.id,
                now.saturating_sub(l.last_beat_ms)
            );
        }
        for l in &lost {
            logs::error!(
                "event=traffic_role_lost id={} last_beat_ms={} what=\"a traffic root went silent \
                 without a goodbye (its VM may have failed); the count is not trusted until it \
                 beats again\"",
                l.id,
                l.last_beat_ms
            );
            metrics.add(Id::TrafficRolesLost, 1);
        }
        if gap {
            logs::error!(
                "event=traffic_role_gone what=\"every traffic root said goodbye and none came back: \
                 the traffic filter left the listeners; streams that ran meanwhile are not \
                 counted, so the count is not trusted until istio-proxy restarts\""
            );
        }
        if count::write_verdict(&self.host, gen, verdict.unreliable) {
            match verdict.unreliable {
                Some(why) => logs::error!(
                    "event=count_unreliable why={} what=\"the count is not trusted to reach 0; a \
                     drain waits for drain_timeout unless the reason ends first\"",
                    why.name()
                ),
                None => logs::info!("event=count_reliable what=\"the count is trusted again\""),
            }
        }
        true
    }

    /// The registry (this root's parsed copy, shared) and the judging record
    /// now (for `/drain/status`).
    pub fn snapshot(&self) -> (Rc<Registry>, Judging) {
        let reg = self.registry.read(&self.host).ok().flatten();
        let (bytes, _) = self.host.get(WATCH).unwrap_or_default();
        let judging = bytes.and_then(|b| Judging::from_bytes(&b));
        (reg.unwrap_or_default(), judging.unwrap_or_default())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::gate::count::ActiveCount;
    use crate::gate::liveness::Unreliable;
    use crate::host::sim::Sim;

    fn reading(sim: &Sim) -> count::CountReading {
        ActiveCount::new(&Metrics::define(sim)).read()
    }

    fn process(sim: &Sim) -> (Judge<&Sim>, Metrics<&Sim>) {
        count::create_shared(&sim);
        count::announce_traffic(&sim);
        ensure_registry(&sim);
        (Judge::new(sim, 100), Metrics::define(sim))
    }

    #[test]
    fn a_root_that_says_goodbye_marks_nothing() {
        let sim = Sim::at(1_000);
        let (judge, metrics) = process(&sim);
        let old = Heartbeat::new(&sim, 100);
        old.beat();
        let new = Heartbeat::new(&sim, 100);
        new.beat();
        assert!(judge.seen());
        drop(old); // removed cleanly (LDS update)
        for _ in 0..50 {
            sim.advance(100);
            new.beat();
            judge.tick(&metrics);
        }
        assert!(reading(&sim).reliable);
        assert_eq!(judge.snapshot().0.roots.len(), 1);
    }

    #[test]
    fn a_judgement_that_changes_nothing_writes_nothing() {
        let sim = Sim::at(1_000);
        let (judge, metrics) = process(&sim);
        let root = Heartbeat::new(&sim, 100);
        let tick = |beat: bool| {
            sim.advance(100);
            if beat {
                root.beat();
            }
            judge.tick(&metrics);
        };
        tick(true);
        let version = |key| (&sim).get(key).unwrap().1.unwrap();
        let (registry, verdict) = (version(keys::REGISTRY), version(keys::VERDICT));
        for _ in 0..30 {
            tick(true);
        }
        assert_eq!(version(keys::REGISTRY), registry, "every root beats");
        assert_eq!(version(keys::VERDICT), verdict);
        for _ in 0..30 {
            tick(false);
        }
        assert_ne!(version(keys::REGISTRY), registry, "judged lost");
        assert_eq!(reading(&sim).why, Some(Unreliable::TrafficRoleLost));
        std::mem::forget(root);
    }

    #[test]
    fn a_root_that_stops_beating_is_lost_and_the_count_unreliable() {
        let sim = Sim::at(1_000);
        let (judge, metrics) = process(&sim);
        let dead = Heartbeat::new(&sim, 100);
        dead.beat();
        std::mem::forget(dead); // a trapped VM runs nothing, not even Drop
        for _ in 0..20 {
            sim.advance(100);
            judge.tick(&metrics);
        }
        assert!(reading(&sim).reliable, "2 s is not yet stale");
        // Silence counts from the watch's first tick (1.1 s): lost after 3.1 s.
        sim.advance(100);
        judge.tick(&metrics);
        assert!(
            reading(&sim).reliable,
            "2 s of judged silence is not yet stale"
        );
        sim.advance(100);
        judge.tick(&metrics);
        let r = reading(&sim);
        assert!(!r.reliable && r.for_decisions() >= 1);
        assert_eq!(r.why, Some(Unreliable::TrafficRoleLost));
        assert_eq!(sim.metric(crate::metric_names::TRAFFIC_ROLES_LOST), 1);
        assert_eq!(judge.snapshot().0.lost_total, 1);
    }

    #[test]
    fn a_stall_of_the_whole_process_loses_nothing() {
        let sim = Sim::at(1_000);
        let (judge, metrics) = process(&sim);
        let roots: Vec<_> = (0..3).map(|_| Heartbeat::new(&sim, 100)).collect();
        let tick = |sim: &Sim| {
            sim.advance(100);
            roots.iter().for_each(|r| _ = r.beat());
            judge.tick(&metrics);
        };
        for _ in 0..10 {
            tick(&sim);
        }
        sim.advance(3_500); // SIGSTOP: nothing runs, every clock moves on
        judge.tick(&metrics); // the health tick comes first after it
        tick(&sim);
        let (reg, w) = judge.snapshot();
        assert_eq!((reg.roots.len(), reg.lost_total), (3, 0));
        assert_eq!((w.stalls, w.longest_stall_ms), (1, 3_500));
        assert!(reading(&sim).reliable);
    }

    #[test]
    fn a_late_root_is_lost_then_back_and_the_count_trusted_again() {
        let sim = Sim::at(1_000);
        let (judge, metrics) = process(&sim);
        let on_time = Heartbeat::new(&sim, 100);
        let late = Heartbeat::new(&sim, 100);
        for i in 0..40 {
            sim.advance(100);
            on_time.beat();
            if i < 5 {
                late.beat(); // then its worker is busy for 3.5 s
            }
            judge.tick(&metrics);
        }
        assert_eq!(reading(&sim).why, Some(Unreliable::TrafficRoleLost));
        late.beat();
        sim.advance(100);
        judge.tick(&metrics);
        let r = reading(&sim);
        assert!(r.reliable, "back: {r:?}");
        let (reg, _) = judge.snapshot();
        assert_eq!((reg.lost_total, reg.back_total, reg.roots.len()), (1, 1, 2));
    }

    #[test]
    fn every_root_gone_without_a_replacement_is_unreliable_for_good() {
        let sim = Sim::at(1_000);
        let (judge, metrics) = process(&sim);
        let only = Heartbeat::new(&sim, 100);
        only.beat();
        only.goodbye();
        // The grace counts from the watch's first tick (1.1 s): gone after 3.1 s.
        for _ in 0..22 {
            sim.advance(100);
            judge.tick(&metrics);
        }
        assert_eq!(reading(&sim).why, Some(Unreliable::TrafficRoleGone));
        let again = Heartbeat::new(&sim, 100);
        again.beat();
        sim.advance(100);
        judge.tick(&metrics);
        assert_eq!(reading(&sim).why, Some(Unreliable::TrafficRoleGone));
    }

    #[test]
    fn heartbeat_keys_stay_bounded_over_reconfigurations() {
        let sim = Sim::at(1_000);
        let (judge, metrics) = process(&sim);
        for _ in 0..300 {
            let root = Heartbeat::new(&sim, 100);
            root.beat();
            sim.advance(100);
            judge.tick(&metrics);
        } // each dropped: a goodbye
        let beats = (0..400u64)
            .filter(|id| sim.value(&keys::beat(*id)).is_some())
            .count();
        assert_eq!(beats, 1, "one id, reused 300 times");
    }

    #[test]
    fn a_newer_verdict_is_never_overwritten_by_an_older_one() {
        let sim = Sim::at(1_000);
        assert!(count::write_verdict(
            &&sim,
            5,
            Some(Unreliable::TrafficRoleLost)
        ));
        assert!(
            !count::write_verdict(&&sim, 4, None),
            "judged from an older registry"
        );
        assert_eq!(reading(&sim).why, Some(Unreliable::TrafficRoleLost));
        assert!(count::write_verdict(&&sim, 6, None));
        assert!(
            !count::write_verdict(&&sim, 6, None),
            "unchanged: not rewritten"
        );
    }
}
