//! The count as a model: N simulated worker VMs run the real traffic role
//! (`host::traffic`: the lease, settle, exact mode, the flip check, the
//! heartbeat) and the real health role (`host::health`: the liveness watch,
//! the verdict) against the stand-in host (`host::sim`) — shared data with
//! versions, a gauge per part, two clocks — that injects `CasMismatch` and
//! failed writes. Random interleavings of stream enter / exit, time passing
//! with every live worker ticking, a worker busy for a while (its ticks
//! late), a stall of the whole process (nothing runs, the clocks move on), a
//! drain start, clean root removal, VM death and a reloaded VM. Even workers
//! count HTTP streams, odd ones TCP connections (the two parts of `Counts`,
//! read as one count).
//!
//! Invariants, checked after every step:
//! - the global count never reads below what the live roots hold in flight
//!   (a dead VM's streams are never released twice, nothing is given back
//!   that was not taken), and never wraps below 0;
//! - without failures or VM deaths it never reads below the true number of
//!   streams in flight, and it is reliable unless a live root is declared
//!   lost (a busy worker) — never because of a stall of the whole process;
//! - a count that could read low is unreliable, and an unreliable count
//!   never reads 0 for a decision: a false 0 is only possible in the window
//!   between a VM's death and the moment it is declared lost (or a write a
//!   worker still owes);
//! - during a drain with no failure, once every worker has ticked since
//!   nothing holds the flip back any more (`min_drain` over) and none is
//!   lost, it reads exactly the streams in flight. While `min_drain` holds
//!   it, the count may lead the truth (the lease of outside a drain), never
//!   trail it. Each run draws its `min_drain`: none, one that ends within
//!   the run, one that outlasts it.
//!
//! Run with `cargo test --test model`.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use std::rc::Rc;

use drain_gate::config::Config;
use drain_gate::fsm::{Move, Reason, State};
use drain_gate::host::count::Part;
use drain_gate::host::health::Health;
use drain_gate::host::metrics::Metrics;
use drain_gate::host::shared::Host;
use drain_gate::host::sim::Sim;
use drain_gate::host::store::Store;
use drain_gate::host::traffic::{Traffic, TrafficStream};
use drain_gate::liveness::{self, Why};
use drain_gate::metric_names as names;
use proptest::prelude::*;

const TICK_MS: u64 = 100;

#[derive(Clone, Debug)]
enum Op {
    Enter(usize),
    Exit(usize),
    /// Time passes: every live worker that is not busy ticks, and the health
    /// role (before them, or after).
    Time(u64, bool),
    /// The worker's thread is busy: its root does not tick until `Free`.
    Busy(usize),
    Free(usize),
    /// The whole process stops (SIGSTOP, CPU throttling): nothing runs for
    /// this long, every clock moves on.
    Stall(u64),
    DrainStart,
    /// The root context removed cleanly (LDS update): its streams have
    /// ended; a new root context takes its place.
    RootDrop(usize),
    /// The VM traps: its streams are cut, its roots never run again, not
    /// even `Drop`; the worker keeps taking streams uncounted (FAIL_OPEN).
    /// A VM fails only while it runs a callback (a tick or a stream), so only
    /// a root that ran one — and registered there — dies.
    VmDeath(usize),
    /// FAIL_RELOAD: a dead worker gets a new VM, whose root registers anew.
    Reload(usize),
    CasRaces(u32),
    Failures(u32),
}

fn op(workers: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..workers).prop_map(Op::Enter),
        6 => (0..workers).prop_map(Op::Exit),
        4 => (prop::sample::select(vec![10u64, 100, 300, 1_000]), any::<bool>())
            .prop_map(|(ms, health_first)| Op::Time(ms, health_first)),
        1 => (0..workers).prop_map(Op::Busy),
        2 => (0..workers).prop_map(Op::Free),
        1 => prop::sample::select(vec![1_500u64, 3_500, 12_000]).prop_map(Op::Stall),
        1 => Just(Op::DrainStart),
        1 => (0..workers).prop_map(Op::RootDrop),
        1 => (0..workers).prop_map(Op::VmDeath),
        1 => (0..workers).prop_map(Op::Reload),
        2 => (1u32..4).prop_map(Op::CasRaces),
        1 => (1u32..3).prop_map(Op::Failures),
    ]
}

/// Even workers count HTTP streams, odd ones TCP connections.
fn part_of(w: usize) -> Part {
    if w % 2 == 0 {
        Part::Streams
    } else {
        Part::Connections
    }
}

/// One worker: its root (none while its VM is dead) and what runs on it.
struct Worker<'a> {
    root: Option<Rc<Traffic<&'a Sim>>>,
    open: Vec<TrafficStream<&'a Sim>>,
    /// Streams taken while its VM is dead (FAIL_OPEN: uncounted).
    uncounted: u64,
    busy: bool,
    /// Busy at some time since its root last beat: a loss of it is excused.
    late: bool,
    /// Ticked during the drain after its `min_drain` was over: from then on
    /// this worker counts exactly.
    ticked_in_drain: bool,
    /// The registry ids of its VMs that died.
    dead_ids: Vec<u64>,
}

struct Model<'a> {
    sim: &'a Sim,
    workers: Vec<Worker<'a>>,
    health: Health<&'a Sim>,
    drain: bool,
    /// The drains' `min_drain`.
    min_drain_ms: u64,
    deaths: u32,
    /// A root was declared lost whose worker was never late (only the whole
    /// process stalled): must never happen.
    stall_loss: Option<String>,
}

/// `min_drain`s a run draws from: none, one that ends within most runs, one
/// that outlasts every run.
const MIN_DRAINS_MS: [u64; 3] = [0, 500, 3_600_000];

fn config(role: &str, min_drain_ms: u64) -> Config {
    // No timeout within a run: the count's exactness is what is checked.
    let raw =
        format!(r#"{{"role":"{role}","min_drain":"{min_drain_ms}ms","drain_timeout":"60m"}}"#);
    Config::parse(raw.as_bytes()).unwrap()
}

fn root(sim: &Sim, w: usize) -> Rc<Traffic<&Sim>> {
    Rc::new(Traffic::new(
        part_of(w),
        Metrics::define(sim),
        &config("traffic", 0),
    ))
}

impl<'a> Model<'a> {
    fn new(sim: &'a Sim, workers: usize, min_drain_ms: u64) -> Model<'a> {
        drain_gate::host::liveness::ensure_registry(&sim);
        drain_gate::host::count::announce_traffic(&sim);
        let workers = (0..workers)
            .map(|w| Worker {
                root: Some(root(sim, w)),
                open: Vec::new(),
                uncounted: 0,
                busy: false,
                late: false,
                ticked_in_drain: false,
                dead_ids: Vec::new(),
            })
            .collect();
        let health = Health::new(config("health", min_drain_ms), Metrics::define(sim));
        Model {
            sim,
            workers,
            health,
            drain: false,
            min_drain_ms,
            deaths: 0,
            stall_loss: None,
        }
    }

    /// Whether the drain runs and its `min_drain` is over.
    fn drain_unheld(&self) -> bool {
        let Ok(rec) = Store::new(self.sim).load() else {
            return false;
        };
        let now = self.sim.now().timer_ms();
        rec.state == State::Draining
            && rec
                .drain_started_timer_ms()
                .is_some_and(|t| now >= t + self.min_drain_ms)
    }

    fn tick(&mut self, w: usize) {
        let unheld = self.drain_unheld();
        let wk = &mut self.workers[w];
        if let (Some(r), false) = (&wk.root, wk.busy) {
            r.tick();
            wk.late = false;
            wk.ticked_in_drain |= unheld;
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Enter(w) => {
                let wk = &mut self.workers[w];
                match &wk.root {
                    Some(r) => wk.open.push(TrafficStream::new(Rc::clone(r))),
                    None => wk.uncounted += 1,
                }
            }
            Op::Exit(w) => {
                let wk = &mut self.workers[w];
                if wk.open.pop().is_none() && wk.uncounted > 0 {
                    wk.uncounted -= 1;
                }
            }
            Op::Time(ms, health_first) => {
                self.sim.advance(ms);
                if health_first {
                    self.health_tick();
                }
                for w in 0..self.workers.len() {
                    self.tick(w);
                }
                if !health_first {
                    self.health_tick();
                }
            }
            Op::Busy(w) => {
                self.workers[w].busy = true;
                self.workers[w].late = true;
            }
            Op::Free(w) => self.workers[w].busy = false,
            Op::Stall(ms) => self.sim.advance(ms),
            Op::DrainStart => {
                if !self.drain {
                    let store = Store::new(self.sim);
                    let mv = Move {
                        expected_from: State::Open,
                        to: State::Draining,
                        reason: Reason::DrainRequested,
                        plan: Some(config("health", self.min_drain_ms).plan()),
                        force: false,
                    };
                    // An injected failure leaves it OPEN: tried again later.
                    self.drain = store
                        .advance(&|_| mv, 0, &Metrics::define(self.sim))
                        .is_ok();
                }
            }
            Op::RootDrop(w) => {
                let sim = self.sim;
                let wk = &mut self.workers[w];
                if wk.root.is_some() && wk.open.is_empty() {
                    if let Some(r) = wk.root.take() {
                        r.goodbye(); // on_done, then the root is dropped
                    }
                    wk.root = Some(root(sim, w));
                }
            }
            Op::VmDeath(w) => {
                let wk = &mut self.workers[w];
                if let Some(r) = wk.root.take_if(|r| r.id().is_some()) {
                    wk.dead_ids.extend(r.id());
                    // A dead VM runs nothing, not even Drop; Envoy cuts what
                    // was in flight on it.
                    for s in wk.open.drain(..) {
                        std::mem::forget(s);
                    }
                    std::mem::forget(r);
                    self.deaths += 1;
                }
            }
            Op::Reload(w) => {
                let sim = self.sim;
                let wk = &mut self.workers[w];
                if wk.root.is_none() {
                    wk.root = Some(root(sim, w));
                }
            }
            Op::CasRaces(n) => self.sim.cas_races.set(n),
            Op::Failures(n) => self.sim.failures.set(n),
        }
    }

    fn truth(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.open.len() as u64 + w.uncounted)
            .sum()
    }

    fn held_in_flight(&self) -> u64 {
        self.workers
            .iter()
            .filter_map(|w| w.root.as_ref())
            .map(|r| r.in_flight())
            .sum()
    }

    /// The health tick; a live root it declares lost must belong to a worker
    /// that was late.
    fn health_tick(&mut self) {
        self.health.tick();
        let (reg, _, _) = drain_gate::host::liveness::Watch::new(self.sim, TICK_MS).snapshot();
        for w in &self.workers {
            let lost = w
                .root
                .as_ref()
                .and_then(|r| r.id())
                .filter(|id| reg.lost.iter().any(|l| l.id == *id));
            if let (Some(id), false) = (lost, w.late) {
                self.stall_loss
                    .get_or_insert(format!("root {id} lost though its worker was never late"));
            }
        }
    }

    /// Live roots the registry holds as lost now.
    fn lost_alive_now(&self) -> u64 {
        let (reg, _, _) = drain_gate::host::liveness::Watch::new(self.sim, TICK_MS).snapshot();
        self.workers
            .iter()
            .filter_map(|w| w.root.as_ref().and_then(|r| r.id()))
            .filter(|id| reg.lost.iter().any(|l| l.id == *id))
            .count() as u64
    }

    /// A dead VM whose root the registry has not declared lost yet (or one
    /// that died before it registered).
    fn death_unmarked(&self) -> bool {
        let (reg, _, _) = drain_gate::host::liveness::Watch::new(self.sim, TICK_MS).snapshot();
        let verdict_lost = self.health.counter.read().why == Some(Why::TrafficRoleLost);
        self.workers.iter().any(|w| {
            w.dead_ids
                .iter()
                .any(|id| !reg.lost.iter().any(|l| l.id == *id) || !verdict_lost)
        })
    }
}

fn check(m: &Model, after: &Op) -> Result<(), TestCaseError> {
    for name in [names::ACTIVE_REQUESTS, names::ACTIVE_CONNECTIONS] {
        let g = m.sim.metric(name);
        prop_assert!(
            g >= 0,
            "{name} went below 0 after {after:?}: something was given back twice ({g})"
        );
    }
    let r = m.health.counter.read();
    let truth = m.truth();
    let clean = m.sim.failed.get() == 0 && m.deaths == 0;
    prop_assert!(
        r.active >= m.held_in_flight(),
        "count {} below what live roots hold {} after {after:?}",
        r.active,
        m.held_in_flight()
    );
    if clean {
        prop_assert!(
            r.active >= truth,
            "count {} below the truth {truth} after {after:?}",
            r.active
        );
        if !r.reliable {
            prop_assert_eq!(
                r.why,
                Some(Why::TrafficRoleLost),
                "unreliable without a failure: {:?}",
                r
            );
            prop_assert!(
                m.lost_alive_now() > 0,
                "lost, but every root is back: {r:?}"
            );
        }
    }
    prop_assert!(m.stall_loss.is_none(), "{:?} after {after:?}", m.stall_loss);
    if !r.reliable {
        prop_assert!(r.for_decisions() >= 1, "an unreliable count read 0");
    }
    let owed = m
        .workers
        .iter()
        .filter_map(|w| w.root.as_ref())
        .any(|r| r.owes_uncounted());
    if truth > 0 && !owed && !m.death_unmarked() {
        prop_assert!(
            r.for_decisions() >= 1,
            "a false 0 with {truth} in flight after {after:?}: {r:?}"
        );
    }
    let all_ticked = m
        .workers
        .iter()
        .all(|w| w.root.is_none() || w.ticked_in_drain);
    if m.drain_unheld() && clean && all_ticked && r.reliable {
        prop_assert_eq!(
            r.active,
            truth,
            "during a drain nothing holds the count is exact (min_drain {} ms, after {:?})",
            m.min_drain_ms,
            after
        );
    }
    Ok(())
}

fn run(workers: usize, min_drain_ms: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let sim = Sim::at(1_764_000_000_000);
    let mut m = Model::new(&sim, workers, min_drain_ms);
    m.step(&Op::Time(TICK_MS, false)); // every root registers on its first tick
    for op in ops {
        m.step(op);
        check(&m, op)?;
    }
    // Every stream ends, every worker is free, time passes: a run without a
    // VM death or a failure ends at exactly 0, trusted again.
    sim.failures.set(0);
    sim.cas_races.set(0);
    m.step(&Op::DrainStart);
    for w in 0..workers {
        m.workers[w].busy = false;
        while !m.workers[w].open.is_empty() || m.workers[w].uncounted > 0 {
            m.step(&Op::Exit(w));
        }
    }
    for _ in 0..3 {
        m.step(&Op::Time(TICK_MS, false));
    }
    for w in &m.workers {
        prop_assert!(
            !w.root.as_ref().is_some_and(|r| r.owes_uncounted()),
            "a tick writes what a worker owes once writes succeed"
        );
    }
    let r = m.health.counter.read();
    if m.deaths == 0 && sim.failed.get() == 0 {
        prop_assert_eq!(r.active, 0, "{:?}", r);
        prop_assert!(r.reliable, "late roots came back, yet: {r:?}");
    } else {
        // A failed give-back leaves the count high (a drain then waits for
        // its timeout), never low.
        prop_assert!(r.for_decisions() >= 1 || r.active == 0 && r.reliable);
    }
    Ok(())
}

fn clamp(op: Op, workers: usize) -> Op {
    match op {
        Op::Enter(w) => Op::Enter(w % workers),
        Op::Exit(w) => Op::Exit(w % workers),
        Op::Busy(w) => Op::Busy(w % workers),
        Op::Free(w) => Op::Free(w % workers),
        Op::RootDrop(w) => Op::RootDrop(w % workers),
        Op::VmDeath(w) => Op::VmDeath(w % workers),
        Op::Reload(w) => Op::Reload(w % workers),
        other => other,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_count_keeps_its_invariants(
        workers in 1usize..5,
        min_drain_ms in prop::sample::select(MIN_DRAINS_MS.to_vec()),
        ops in prop::collection::vec(op(4), 1..120),
    ) {
        let ops: Vec<Op> = ops.into_iter().map(|o| clamp(o, workers)).collect();
        run(workers, min_drain_ms, &ops)?;
    }
}

/// The same host with the gauges excluded by a `stats_matcher`: the count
/// lives in shared data, and keeps every invariant there too.
#[test]
fn the_shared_data_count_keeps_its_invariants() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                1usize..5,
                prop::sample::select(MIN_DRAINS_MS.to_vec()),
                prop::collection::vec(op(4), 1..120),
            ),
            |(workers, min_drain_ms, ops)| {
                let ops: Vec<Op> = ops.into_iter().map(|o| clamp(o, workers)).collect();
                let sim = Sim::at(1_764_000_000_000);
                for name in [names::ACTIVE_REQUESTS, names::ACTIVE_CONNECTIONS] {
                    sim.excluded.borrow_mut().push(name.to_string());
                }
                let mut m = Model::new(&sim, workers, min_drain_ms);
                m.step(&Op::Time(TICK_MS, false));
                prop_assert_eq!(m.health.counter.source_name(), "shared_data");
                for op in &ops {
                    m.step(op);
                    check(&m, op)?;
                }
                Ok(())
            },
        )
        .unwrap();
}

/// The stall of a few seconds that once disarmed every later drain, written
/// out: 3.5 s without anything running, then the gateway drains — idle it
/// flips at once, unforced; with a stream in flight it holds until the
/// stream ends and flips then. Nothing is lost, nothing unreliable.
#[test]
fn a_stall_of_the_whole_process_disarms_nothing() {
    let sim = Sim::at(1_764_000_000_000);
    let mut m = Model::new(&sim, 3, MIN_DRAINS_MS[2]);
    for _ in 0..10 {
        m.step(&Op::Time(TICK_MS, false));
    }
    m.step(&Op::Enter(0));
    m.step(&Op::Stall(3_500));
    for _ in 0..30 {
        m.step(&Op::Time(TICK_MS, false));
    }
    let r = m.health.counter.read();
    assert!(r.reliable, "{r:?}");
    let (reg, _, watch) = drain_gate::host::liveness::Watch::new(&sim, TICK_MS).snapshot();
    assert_eq!((reg.lost_total, watch.stalls), (0, 1));
    // A drain with the stream in flight: held; the stream's end flips it.
    let store = Store::new(&sim);
    let metrics = Metrics::define(&sim);
    let plan = Config::parse(br#"{"role":"health"}"#).unwrap().plan();
    let mv = Move {
        expected_from: State::Open,
        to: State::Draining,
        reason: Reason::DrainRequested,
        plan: Some(plan),
        force: false,
    };
    store.advance(&|_| mv, 1, &metrics).unwrap();
    m.step(&Op::Time(TICK_MS, false));
    assert_eq!(store.load().unwrap().state, State::Draining);
    m.step(&Op::Exit(0));
    let rec = store.load().unwrap();
    assert_eq!(
        (rec.state, rec.reason, rec.forced),
        (State::Closing, Reason::ActiveZero, false)
    );
}

/// A worker busy longer than the stale threshold is declared lost, the
/// count is not trusted meanwhile (a drain waits), and when the worker runs
/// again its root is back and the count trusted: no forced drain for good.
#[test]
fn a_busy_worker_is_lost_then_back() {
    let sim = Sim::at(1_764_000_000_000);
    let mut m = Model::new(&sim, 2, MIN_DRAINS_MS[2]);
    m.step(&Op::Time(TICK_MS, false));
    m.step(&Op::Busy(1));
    let stale = liveness::stale_after_ms(TICK_MS);
    for _ in 0..(stale / TICK_MS + 3) {
        m.step(&Op::Time(TICK_MS, false));
    }
    assert_eq!(m.health.counter.read().why, Some(Why::TrafficRoleLost));
    m.step(&Op::Free(1));
    m.step(&Op::Time(TICK_MS, false));
    m.step(&Op::Time(TICK_MS, false));
    let r = m.health.counter.read();
    assert!(r.reliable, "{r:?}");
    let (reg, _, _) = drain_gate::host::liveness::Watch::new(&sim, TICK_MS).snapshot();
    assert_eq!((reg.lost_total, reg.back_total), (1, 1));
    assert_eq!(sim.metric(names::TRAFFIC_ROLES_LOST), 1);
    let _ = (&sim).now();
}
