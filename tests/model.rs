//! The count as a model: N simulated worker VMs run the real `Counter`
//! (leases, settle, exact mode, compare-and-swap through `cas_update`, root
//! drop) against a simulated host — shared data with versions, a gauge per
//! part —
//! that injects `CasMismatch` and failed writes. Random interleavings of
//! stream enter / exit, ticks, drain start, clean root removal and VM death.
//! Even workers count HTTP streams, odd ones TCP connections (the two parts
//! of `Counts`, read as one count).
//!
//! Invariants, checked after every step:
//! - the global count never reads below what the live counters hold in
//!   flight (a dead VM's streams are never released twice, nothing is given
//!   back that was not taken);
//! - without failures or VM deaths, it never reads below the true number of
//!   streams in flight; with them, a count that could read low is marked
//!   unreliable, and an unreliable count never reads 0 for a decision;
//! - during a drain with no failure, once every worker has ticked, it reads
//!   exactly the streams in flight: 0 exactly when the last one ended.
//!
//! Run with `cargo test --test model`.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use drain_gate::host::count::{self, Counter, Counts, Part, Source};
use drain_gate::host::shared::Host;
use drain_gate::host::sim::Sim;
use drain_gate::liveness::Why;
use proptest::prelude::*;
use proxy_wasm::types::MetricType;

/// The gauge of each part in the gauge mode (defined first: ids 0 and 1).
const GAUGE: u32 = 0;
const GAUGE_NAMES: [&str; 2] = [
    "drain_gate_active_requests",
    "drain_gate_active_connections",
];

/// A host where both gauges are defined, with ids `GAUGE` and `GAUGE + 1`.
fn sim() -> Sim {
    let sim = Sim::default();
    for name in GAUGE_NAMES {
        (&sim).define_metric(MetricType::Gauge, name).unwrap();
    }
    sim
}

/// The gauges never go below 0: nothing is given back twice.
fn gauges_never_negative(sim: &Sim) -> Result<(), TestCaseError> {
    for name in GAUGE_NAMES {
        let g = sim.metric(name);
        prop_assert!(
            g >= 0,
            "{name} went below 0: something was given back twice ({g})"
        );
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Enter(usize),
    Exit(usize),
    Tick(usize),
    DrainStart,
    /// The root context removed cleanly (LDS update): its streams have ended;
    /// a new root context takes its place.
    RootDrop(usize),
    /// The VM traps: its streams are cut, its counter never runs again; the
    /// worker keeps taking streams uncounted (FAIL_OPEN); liveness marks the
    /// count unreliable.
    VmDeath(usize),
    /// The health role's tick (liveness marks a lost root).
    HealthTick,
    CasRaces(u32),
    Failures(u32),
}

fn op(workers: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..workers).prop_map(Op::Enter),
        6 => (0..workers).prop_map(Op::Exit),
        3 => (0..workers).prop_map(Op::Tick),
        1 => Just(Op::DrainStart),
        1 => (0..workers).prop_map(Op::RootDrop),
        1 => (0..workers).prop_map(Op::VmDeath),
        2 => Just(Op::HealthTick),
        2 => (1u32..4).prop_map(Op::CasRaces),
        1 => (1u32..3).prop_map(Op::Failures),
    ]
}

/// One worker VM: its root's counter, as `host::traffic` drives it.
struct Worker<'a> {
    counter: Option<Counter<&'a Sim>>,
    /// As `Traffic::draining`: true from creation until a tick says otherwise.
    draining: bool,
    /// Its streams in flight: whether each was counted.
    open: Vec<bool>,
    /// Streams taken while its VM is dead (FAIL_OPEN: uncounted).
    uncounted: u64,
    ticked_in_drain: bool,
}

/// The part worker `w` counts.
fn part_of(w: usize) -> Part {
    if w % 2 == 0 {
        Part::Streams
    } else {
        Part::Connections
    }
}

/// A part's source: the gauge mode gives each part its own gauge.
fn source_of(source: Source, part: Part) -> Source {
    match (source, part) {
        (Source::Gauge(id), Part::Connections) => Source::Gauge(id + 1),
        _ => source,
    }
}

impl<'a> Worker<'a> {
    fn new(sim: &'a Sim, source: Source, w: usize) -> Worker<'a> {
        let part = part_of(w);
        Worker {
            counter: Some(Counter::with_host(sim, part, source_of(source, part))),
            draining: true,
            open: Vec::new(),
            uncounted: 0,
            ticked_in_drain: false,
        }
    }
}

struct Model<'a> {
    sim: &'a Sim,
    source: Source,
    workers: Vec<Worker<'a>>,
    drain: bool,
    deaths: u32,
    /// A VM died and the health role has not yet marked the count (the window
    /// between the death and the stale threshold, or a failed mark write).
    death_unmarked: bool,
}

impl<'a> Model<'a> {
    fn step(&mut self, op: &Op) {
        match *op {
            Op::Enter(w) => {
                let wk = &mut self.workers[w];
                match &wk.counter {
                    Some(c) => {
                        // On failure the counter marks the count unreliable itself
                        // (or owes the mark until a write succeeds).
                        let counted = c.enter(wk.draining);
                        wk.open.push(counted);
                    }
                    None => wk.uncounted += 1,
                }
            }
            Op::Exit(w) => {
                let wk = &mut self.workers[w];
                if let Some(c) = &wk.counter {
                    if let Some(counted) = wk.open.pop() {
                        if counted {
                            c.exit(wk.draining);
                        }
                    }
                } else if wk.uncounted > 0 {
                    wk.uncounted -= 1;
                }
            }
            Op::Tick(w) => {
                let drain = self.drain;
                let wk = &mut self.workers[w];
                if let Some(c) = &wk.counter {
                    wk.draining = drain;
                    wk.ticked_in_drain |= drain;
                    c.settle();
                }
            }
            Op::DrainStart => self.drain = true,
            Op::RootDrop(w) => {
                let (sim, source) = (self.sim, self.source);
                let wk = &mut self.workers[w];
                if wk.counter.is_some() && wk.open.is_empty() {
                    *wk = Worker::new(sim, source, w); // the old counter drops here
                }
            }
            Op::VmDeath(w) => {
                let wk = &mut self.workers[w];
                if let Some(c) = wk.counter.take() {
                    std::mem::forget(c); // a dead VM runs nothing, not even Drop
                    wk.open.clear(); // Envoy cuts what was in flight on it
                    self.deaths += 1;
                    self.death_unmarked = true;
                }
            }
            Op::HealthTick => {
                // Liveness: a lost root marks the count unreliable, retried every
                // health tick until the write succeeds.
                if self.death_unmarked
                    && count::flag_unreliable(&self.sim, Why::TrafficRoleLost).is_some()
                {
                    self.death_unmarked = false;
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
            .filter_map(|w| w.counter.as_ref())
            .map(|c| c.in_flight())
            .sum()
    }

    fn reader(&self) -> Counts<&'a Sim> {
        let part = |p| Counter::with_host(self.sim, p, source_of(self.source, p));
        Counts::of(part(Part::Streams), part(Part::Connections))
    }
}

fn check(m: &Model, after: &Op) -> Result<(), TestCaseError> {
    gauges_never_negative(m.sim)?;
    let reader = m.reader();
    let r = reader.read();
    let truth = m.truth();
    let clean = m.sim.failed.get() == 0 && m.deaths == 0;
    prop_assert!(
        r.active >= m.held_in_flight(),
        "count {} below what live counters hold {} after {after:?}",
        r.active,
        m.held_in_flight()
    );
    if clean {
        prop_assert!(
            r.active >= truth,
            "count {} below the truth {truth} after {after:?}",
            r.active
        );
        prop_assert!(r.reliable, "nothing failed, yet unreliable: {r:?}");
    }
    if !r.reliable {
        prop_assert!(r.for_decisions() >= 1, "an unreliable count read 0");
    }
    // Marks not yet written (a worker's failed stream, a VM death the health
    // role has not seen yet) are the only window for a low count.
    let owed = m.death_unmarked
        || m.workers
            .iter()
            .filter_map(|w| w.counter.as_ref())
            .any(|c| c.mark_pending());
    if truth > 0 && !owed {
        prop_assert!(
            r.for_decisions() >= 1,
            "a false 0 with {truth} in flight after {after:?}: {r:?}"
        );
    }
    let all_ticked = m
        .workers
        .iter()
        .all(|w| w.counter.is_none() || w.ticked_in_drain);
    if m.drain && clean && all_ticked {
        prop_assert_eq!(
            r.active,
            truth,
            "during a drain the count is exact (after {:?})",
            after
        );
    }
    Ok(())
}

fn run(workers: usize, source: Source, ops: &[Op]) -> Result<(), TestCaseError> {
    let sim = sim();
    count::create_shared(&&sim);
    count::announce_traffic(&&sim);
    let mut m = Model {
        sim: &sim,
        source,
        workers: (0..workers).map(|w| Worker::new(&sim, source, w)).collect(),
        drain: false,
        deaths: 0,
        death_unmarked: false,
    };
    for op in ops {
        m.step(op);
        check(&m, op)?;
    }
    // Every stream ends, every live worker ticks: a clean run ends at exactly 0.
    m.sim.failures.set(0);
    m.step(&Op::HealthTick);
    prop_assert!(
        !m.death_unmarked,
        "the health tick marks a lost root once writes succeed"
    );
    m.drain = true;
    for w in 0..workers {
        while !m.workers[w].open.is_empty() || m.workers[w].uncounted > 0 {
            m.step(&Op::Exit(w));
        }
        m.step(&Op::Tick(w));
        let owes = m.workers[w]
            .counter
            .as_ref()
            .is_some_and(|c| c.mark_pending());
        prop_assert!(
            !owes,
            "a tick writes the mark a worker owes once writes succeed"
        );
    }
    let r = m.reader().read();
    if m.sim.failed.get() == 0 && m.deaths == 0 {
        prop_assert_eq!(r.active, 0);
        prop_assert!(r.reliable);
    } else {
        prop_assert!(r.for_decisions() >= 1 || r.active == 0 && r.reliable);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn shared_data_count(workers in 1usize..5, ops in prop::collection::vec(op(4), 1..120)) {
        let ops: Vec<Op> = ops.into_iter().map(|o| clamp(o, workers)).collect();
        run(workers, Source::SharedData, &ops)?;
    }

    #[test]
    fn gauge_count(workers in 1usize..5, ops in prop::collection::vec(op(4), 1..120)) {
        let ops: Vec<Op> = ops.into_iter().map(|o| clamp(o, workers)).collect();
        run(workers, Source::Gauge(GAUGE), &ops)?;
    }
}

fn clamp(op: Op, workers: usize) -> Op {
    match op {
        Op::Enter(w) => Op::Enter(w % workers),
        Op::Exit(w) => Op::Exit(w % workers),
        Op::Tick(w) => Op::Tick(w % workers),
        Op::RootDrop(w) => Op::RootDrop(w % workers),
        Op::VmDeath(w) => Op::VmDeath(w % workers),
        other => other,
    }
}

/// A failure-free drain over two workers, one per part, written out: the
/// count reaches 0 on the very exit that ends the last stream, not a tick
/// later.
#[test]
fn zero_exactly_at_the_last_exit() {
    let sim = sim();
    count::create_shared(&&sim);
    count::announce_traffic(&&sim);
    let a = Counter::with_host(&sim, Part::Streams, Source::SharedData);
    let b = Counter::with_host(&sim, Part::Connections, Source::SharedData);
    assert!(a.enter(false) && a.enter(false) && b.enter(false));
    let reader = Counts::of(
        Counter::with_host(&sim, Part::Streams, Source::SharedData),
        Counter::with_host(&sim, Part::Connections, Source::SharedData),
    );
    assert_eq!(reader.read().active, 16, "two leases of 8");
    a.settle();
    b.settle();
    assert_eq!(reader.read().active, 3);
    assert_eq!((reader.read().streams, reader.read().connections), (2, 1));
    sim.cas_races.set(3); // retried transparently
    assert_eq!(a.exit(true), 1);
    assert_eq!(reader.read().active, 2);
    assert_eq!(b.exit(true), 0);
    assert_eq!(reader.read().active, 1);
    assert_eq!(a.exit(true), 0);
    assert!(reader.reads_zero() && reader.read().reliable);
}
