//! The count and the state machine as a model: N simulated worker VMs run
//! the real traffic role (`host::traffic`: the lease, settle, exact mode, the
//! flip check, the heartbeat, the refusal, the receipt's sorting) and the
//! real health role (`host::health`: the liveness watch, the verdict, the
//! automatic transitions) against the stand-in host (`host::sim`) — shared
//! data with versions, a gauge per part, two clocks — that injects
//! `CasMismatch`, failed writes and stale reads. Random interleavings of
//! requests arriving (drain-gate is the first HTTP filter: a request exists
//! for it from the moment the connection manager decodes it, see
//! `FILTERS_BEFORE`) and ending (completed, cut by the client, ended by the
//! upstream), time passing with every live worker ticking, a worker busy for
//! a while (its ticks late), a stall of the whole process (nothing runs, the
//! clocks move on), a drain start, a root context replaced (an LDS update:
//! its streams run on, on the old root, which ticks until the last one ends
//! and then says goodbye), VM death and a reloaded VM, and two workers whose
//! first failed count coincides. Even workers count HTTP streams, odd ones
//! TCP connections (the two parts of `ActiveCount`, read as one count). Each run
//! draws whether new requests are refused while draining.
//!
//! The count's invariants (`check_count`), after every step:
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
//! The state machine's (`check_state`), after every step, failures included:
//! - it never goes DRAINING → CLOSING unforced while a request the gateway
//!   decoded is in flight, nor before `min_drain` (outside `drain_timeout`, no
//!   run reaches it; the only excused window is the false 0 above: a VM's
//!   death not yet noticed, a write a worker still owes);
//! - the receipt: every stream that ended on a root that had seen the drain
//!   is sorted once, into what it was (completed, cut, ended upstream,
//!   refused), the completed ones by the next tick of their root.
//!
//! Run with `cargo test --test model`.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use std::rc::Rc;

use drain_gate::config::{self, Config, Shared};
use drain_gate::gate::count::Part;
use drain_gate::gate::fsm::host::Store;
use drain_gate::gate::fsm::{Move, Reason, Record, State};
use drain_gate::gate::liveness::{self, Unreliable};
use drain_gate::host::health::Health;
use drain_gate::host::keys;
use drain_gate::host::metrics::Metrics;
use drain_gate::host::sim::Sim;
use drain_gate::host::traffic::{Traffic, TrafficStream};
use drain_gate::host::wasm_host::Host;
use drain_gate::instruments::receipt;
use drain_gate::instruments::receipt::{Tally, DOWNSTREAM_FLAGS};
use drain_gate::metric_names as names;
use proptest::prelude::*;
use proxy_wasm::types::{Action, PeerType};

const TICK_MS: u64 = 100;

/// How many of the gateway's HTTP filters stand before drain-gate, where a
/// request they hold (an authorization call, a JWKS fetch, an injected delay)
/// does not exist for drain-gate yet: none, drain-gate is the first HTTP
/// filter of every chain (envoyfilter/docs/counting.md, "What is counted"). A
/// request is then counted from the moment the connection manager decodes it.
const FILTERS_BEFORE: usize = 0;

/// How a stream ends.
#[derive(Clone, Copy, Debug)]
enum How {
    /// Its response ended (`on_http_response_*` with end of stream).
    Completed,
    /// The client went away first (response flags DC/DR).
    Cut,
    /// The upstream or Envoy ended it (an upstream reset, a timeout).
    Upstream,
}

#[derive(Clone, Debug)]
enum Op {
    /// The connection manager decodes a request on this worker.
    Arrive(usize),
    /// A filter before drain-gate lets a request it held go on (only with
    /// `FILTERS_BEFORE` > 0).
    Release(usize),
    /// A request of this worker ends: the newest stream of its root, else of
    /// a replaced root, else one held before drain-gate (answered there), else
    /// one taken uncounted.
    Exit(usize, How),
    /// Time passes: every live worker that is not busy ticks (its replaced
    /// roots too), and the health role (before them, or after).
    Time(u64, bool),
    /// The worker's thread is busy: its roots do not tick until `Free`.
    Busy(usize),
    Free(usize),
    /// The whole process stops (SIGSTOP, CPU throttling): nothing runs for
    /// this long, every clock moves on.
    Stall(u64),
    DrainStart,
    /// The root context is replaced (LDS update): a new root takes the new
    /// requests; the old one keeps its streams, ticks until the last one
    /// ends, then says goodbye and is dropped.
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
    /// The first failed counts of two workers coincide: each one's count
    /// fails, and the second read the uncounted key before the first wrote it.
    Coinciding(usize, usize),
}

fn how() -> impl Strategy<Value = How> {
    prop_oneof![4 => Just(How::Completed), 1 => Just(How::Cut), 1 => Just(How::Upstream)]
}

fn op(workers: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..workers).prop_map(Op::Arrive),
        1 => (0..workers).prop_map(Op::Release),
        6 => ((0..workers), how()).prop_map(|(w, h)| Op::Exit(w, h)),
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
        1 => ((0..workers), (0..workers)).prop_map(|(a, b)| Op::Coinciding(a, b)),
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

/// A root and its streams in flight. `sorts`: the state was not OPEN at its
/// last tick, so it sorts its ends into the receipt; `unflushed`: its
/// completed ends its next tick adds to the receipt.
struct Root<'a> {
    traffic: Rc<Traffic<&'a Sim>>,
    open: Vec<TrafficStream<&'a Sim>>,
    sorts: bool,
    unflushed: u64,
}

/// One worker: its root (none while its VM is dead), the roots it replaced,
/// and what runs on it.
struct Worker<'a> {
    root: Option<Root<'a>>,
    /// Replaced roots whose streams still run.
    replaced: Vec<Root<'a>>,
    /// Requests a filter before drain-gate holds (`FILTERS_BEFORE` > 0).
    held: u64,
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

impl<'a> Worker<'a> {
    fn roots(&self) -> impl Iterator<Item = &Root<'a>> {
        self.root.iter().chain(self.replaced.iter())
    }
}

/// What the receipt must say of the drain, as the model saw the streams end.
#[derive(Default, Debug)]
struct Expected {
    completed: u64,
    cut: u64,
    ended_upstream: u64,
    refused: u64,
}

struct Model<'a> {
    sim: &'a Sim,
    metrics: Metrics<&'a Sim>,
    workers: Vec<Worker<'a>>,
    health: Health<&'a Sim>,
    drain: bool,
    /// The drains' `min_drain`.
    min_drain_ms: u64,
    /// `draining_new_requests: refuse`.
    refuse: bool,
    deaths: u32,
    /// A root was declared lost whose worker was never late (only the whole
    /// process stalled): must never happen.
    stall_loss: Option<String>,
    expected: Expected,
    /// The drain's start on the timer clock and the receipt's base, once it began.
    drain_started: Option<(u64, Tally)>,
}

/// `min_drain`s a run draws from: none, one that ends within most runs, one
/// that outlasts every run.
const MIN_DRAINS_MS: [u64; 3] = [0, 500, 3_600_000];

fn config(role: &str, min_drain_ms: u64, refuse: bool) -> Config {
    // No timeout within a run: the count's exactness is what is checked.
    let new_requests = if refuse { "refuse" } else { "serve" };
    let raw = format!(
        r#"{{"role":"{role}","min_drain":"{min_drain_ms}ms","drain_timeout":"60m","draining_new_requests":"{new_requests}"}}"#
    );
    Config::parse(raw.as_bytes()).unwrap()
}

/// What the health role reads of `config("health", ...)`.
fn health_config(min_drain_ms: u64, refuse: bool) -> config::Health {
    match config("health", min_drain_ms, refuse) {
        Config::Health(h) => h,
        other => panic!("not a health role: {other:?}"),
    }
}

/// What the traffic role reads of `config("traffic", ...)`.
fn traffic_config(refuse: bool) -> Shared {
    match config("traffic", 0, refuse) {
        Config::Traffic(s) => s,
        other => panic!("not a traffic role: {other:?}"),
    }
}

impl<'a> Model<'a> {
    fn new(sim: &'a Sim, workers: usize, min_drain_ms: u64, refuse: bool) -> Model<'a> {
        // What configure does, on the main thread before any worker runs.
        drain_gate::host::root::create_shared(sim);
        drain_gate::gate::count::announce_traffic(&sim);
        // Every request the model sends is a GET: one a refusing drain refuses.
        sim.request_headers
            .borrow_mut()
            .insert(":method".into(), "GET".into());
        let mut m = Model {
            sim,
            metrics: Metrics::define(sim),
            workers: Vec::new(),
            health: Health::new(health_config(min_drain_ms, refuse), Metrics::define(sim)),
            drain: false,
            min_drain_ms,
            refuse,
            deaths: 0,
            stall_loss: None,
            expected: Expected::default(),
            drain_started: None,
        };
        m.workers = (0..workers)
            .map(|w| Worker {
                root: Some(m.root(w)),
                replaced: Vec::new(),
                held: 0,
                uncounted: 0,
                busy: false,
                late: false,
                ticked_in_drain: false,
                dead_ids: Vec::new(),
            })
            .collect();
        m
    }

    fn root(&self, w: usize) -> Root<'a> {
        Root {
            traffic: Rc::new(Traffic::new(
                part_of(w),
                self.metrics,
                &traffic_config(self.refuse),
            )),
            open: Vec::new(),
            sorts: false,
            unflushed: 0,
        }
    }

    fn record(&self) -> Option<Record> {
        Store::new(self.sim).load().ok()
    }

    /// The state, as the state gauge says (written with every transition).
    fn state(&self) -> Option<State> {
        self.metrics.state_hint()
    }

    /// Whether the drain runs and its `min_drain` is over.
    fn drain_unheld(&self) -> bool {
        let now = self.sim.now().timer_ms();
        self.state() == Some(State::Draining)
            && self
                .drain_started
                .is_some_and(|(t, _)| now >= t + self.min_drain_ms)
    }

    /// Worker `w`'s roots tick; `unheld`: the drain runs and its `min_drain`
    /// is over; `sorts`: the state is not OPEN.
    fn tick(&mut self, w: usize, unheld: bool, sorts: bool) {
        let wk = &mut self.workers[w];
        if wk.busy {
            return;
        }
        if let Some(r) = &mut wk.root {
            r.traffic.tick();
            r.sorts = sorts;
            self.expected.completed += std::mem::take(&mut r.unflushed);
            wk.late = false;
            wk.ticked_in_drain |= unheld;
        }
        for r in &mut wk.replaced {
            r.traffic.tick();
            r.sorts = sorts;
            self.expected.completed += std::mem::take(&mut r.unflushed);
        }
    }

    /// A request reaches drain-gate on worker `w`'s root (uncounted when its
    /// VM is dead): counted, then forwarded or, while draining in the refuse
    /// mode, answered 503 and ended at once.
    fn reach(&mut self, w: usize) {
        let wk = &mut self.workers[w];
        let Some(r) = &mut wk.root else {
            wk.uncounted += 1;
            return;
        };
        let mut s = TrafficStream::new(Rc::clone(&r.traffic));
        if part_of(w) == Part::Streams && s.request_headers() == Action::Pause {
            s.log();
            drop(s);
            if r.sorts {
                self.expected.refused += 1;
            }
            return;
        }
        r.open.push(s);
    }

    /// A stream ends as `how` says: its response's end and its `on_log` (an
    /// HTTP stream), or its downstream's reset (a connection cut), then its
    /// drop. A connection that is not cut completed, whichever side ended it.
    fn end(
        sim: &Sim,
        part: Part,
        root: &mut Root<'a>,
        mut s: TrafficStream<&'a Sim>,
        how: How,
        expected: &mut Expected,
    ) {
        let how = match (part, how) {
            (Part::Streams, How::Completed) => {
                s.response(true);
                s.log();
                how
            }
            (Part::Streams, How::Cut) => {
                sim.set_flags(DOWNSTREAM_FLAGS);
                s.log();
                how
            }
            (Part::Streams, How::Upstream) => {
                sim.set_flags(0);
                s.log();
                how
            }
            (Part::Connections, How::Cut) => {
                s.side_ended(true, Some(PeerType::Remote));
                how
            }
            (Part::Connections, _) => How::Completed,
        };
        drop(s);
        if root.sorts {
            match how {
                How::Completed => root.unflushed += 1,
                How::Cut => expected.cut += 1,
                How::Upstream => expected.ended_upstream += 1,
            }
        }
    }

    fn exit(&mut self, w: usize, how: How) {
        let (sim, part) = (self.sim, part_of(w));
        let wk = &mut self.workers[w];
        if let Some(r) = wk.root.as_mut().filter(|r| !r.open.is_empty()) {
            if let Some(s) = r.open.pop() {
                Self::end(sim, part, r, s, how, &mut self.expected);
            }
            return;
        }
        if let Some(at) = wk.replaced.iter().rposition(|r| !r.open.is_empty()) {
            let r = &mut wk.replaced[at];
            if let Some(s) = r.open.pop() {
                Self::end(sim, part, r, s, how, &mut self.expected);
            }
            if r.open.is_empty() {
                // Its last stream ended: Envoy calls on_done, then drops it.
                let r = wk.replaced.remove(at);
                r.traffic.goodbye();
                self.expected.completed += r.unflushed;
            }
            return;
        }
        if wk.held > 0 {
            wk.held -= 1; // answered by the filter that held it
        } else if wk.uncounted > 0 {
            wk.uncounted -= 1;
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Arrive(w) => {
                if FILTERS_BEFORE == 0 {
                    self.reach(w);
                } else {
                    self.workers[w].held += 1;
                }
            }
            Op::Release(w) => {
                if self.workers[w].held > 0 {
                    self.workers[w].held -= 1;
                    self.reach(w);
                }
            }
            Op::Exit(w, how) => self.exit(w, how),
            Op::Time(ms, health_first) => {
                self.sim.advance(ms);
                if health_first {
                    self.health_tick();
                }
                let unheld = self.drain_unheld();
                let sorts = self.state().is_some_and(|s| s != State::Open);
                for w in 0..self.workers.len() {
                    self.tick(w, unheld, sorts);
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
                    let store = Store::new(self.sim).raising(receipt::host::transition);
                    let mv = Move {
                        expected_from: State::Open,
                        to: State::Draining,
                        reason: Reason::DrainRequested,
                        plan: Some(health_config(self.min_drain_ms, self.refuse).plan()),
                        force: false,
                    };
                    // An injected failure leaves it OPEN: tried again later.
                    if let Ok(rec) = store.advance(&|_| mv, 0, &self.metrics) {
                        self.drain = true;
                        let base = drain_gate::host::shared::Seen::new(keys::RECEIPT)
                            .load(&self.sim)
                            .map(|r: drain_gate::instruments::receipt::Record| r.base);
                        self.drain_started = rec.drain_started_timer_ms().zip(base.ok().flatten());
                    }
                }
            }
            Op::RootDrop(w) => {
                if self.workers[w].root.is_none() {
                    return;
                }
                let fresh = self.root(w);
                let wk = &mut self.workers[w];
                if let Some(old) = wk.root.take() {
                    if old.open.is_empty() {
                        old.traffic.goodbye(); // on_done, then the root is dropped
                        self.expected.completed += old.unflushed;
                    } else {
                        wk.replaced.push(old);
                    }
                    wk.root = Some(fresh);
                }
            }
            Op::VmDeath(w) => {
                let wk = &mut self.workers[w];
                if wk
                    .root
                    .as_ref()
                    .is_some_and(|r| r.traffic.heartbeat.id().is_some())
                {
                    // A dead VM runs nothing, not even Drop; Envoy cuts what
                    // was in flight on it, on every root of the VM.
                    for r in wk.root.take().into_iter().chain(wk.replaced.drain(..)) {
                        wk.dead_ids.extend(r.traffic.heartbeat.id());
                        for s in r.open {
                            std::mem::forget(s);
                        }
                        std::mem::forget(r.traffic);
                    }
                    self.deaths += 1;
                }
            }
            Op::Reload(w) => {
                if self.workers[w].root.is_none() {
                    self.workers[w].root = Some(self.root(w));
                }
            }
            Op::CasRaces(n) => self.sim.cas_races.set(n),
            Op::Failures(n) => self.sim.failures.set(n),
            Op::Coinciding(a, b) => {
                let registered = |w: usize| {
                    self.workers[w]
                        .root
                        .as_ref()
                        .is_some_and(|r| r.traffic.heartbeat.id().is_some())
                };
                if a != b && registered(a) && registered(b) {
                    self.sim.failures.set(1);
                    self.reach(a);
                    self.sim.failures.set(1);
                    self.sim.read_stale(keys::UNCOUNTED);
                    self.reach(b);
                    self.sim.failures.set(0);
                    self.sim.stale_read.borrow_mut().take();
                }
            }
        }
    }

    /// Streams drain-gate counted (or a dead VM took uncounted) and still in flight.
    fn counted_truth(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.roots().map(|r| r.open.len() as u64).sum::<u64>() + w.uncounted)
            .sum()
    }

    /// Requests the gateway decoded and has in flight, wherever they are.
    fn in_flight(&self) -> u64 {
        self.counted_truth() + self.workers.iter().map(|w| w.held).sum::<u64>()
    }

    fn held_in_flight(&self) -> u64 {
        self.workers
            .iter()
            .flat_map(|w| w.roots())
            .map(|r| r.traffic.counter().in_flight())
            .sum()
    }

    /// Whether a live root owes a write of its uncounted streams.
    fn owed(&self) -> bool {
        self.workers
            .iter()
            .flat_map(|w| w.roots())
            .any(|r| r.traffic.counter().mark_pending())
    }

    /// The health tick; a live root it declares lost must belong to a worker
    /// that was late.
    fn health_tick(&mut self) {
        self.health.tick();
        let (reg, _) = drain_gate::gate::liveness::host::Judge::new(self.sim, TICK_MS).snapshot();
        for w in &self.workers {
            let lost = w
                .root
                .as_ref()
                .and_then(|r| r.traffic.heartbeat.id())
                .filter(|id| reg.lost.iter().any(|l| l.id == *id));
            if let (Some(id), false) = (lost, w.late) {
                self.stall_loss
                    .get_or_insert(format!("root {id} lost though its worker was never late"));
            }
        }
    }

    /// Live roots the registry holds as lost now.
    fn lost_alive_now(&self) -> u64 {
        let (reg, _) = drain_gate::gate::liveness::host::Judge::new(self.sim, TICK_MS).snapshot();
        self.workers
            .iter()
            .filter_map(|w| w.root.as_ref().and_then(|r| r.traffic.heartbeat.id()))
            .filter(|id| reg.lost.iter().any(|l| l.id == *id))
            .count() as u64
    }

    /// A dead VM whose root the registry has not declared lost yet (or one
    /// that died before it registered).
    fn death_unmarked(&self) -> bool {
        let (reg, _) = drain_gate::gate::liveness::host::Judge::new(self.sim, TICK_MS).snapshot();
        let verdict_lost = self.health.active.read().why == Some(Unreliable::TrafficRoleLost);
        self.workers.iter().any(|w| {
            w.dead_ids
                .iter()
                .any(|id| !reg.lost.iter().any(|l| l.id == *id) || !verdict_lost)
        })
    }

    /// A run without injected failures or VM deaths.
    fn clean(&self) -> bool {
        self.sim.failed.get() == 0 && self.deaths == 0
    }

    /// The drain's receipt so far (none before the drain).
    fn receipt(&self) -> Option<Tally> {
        let (_, base) = self.drain_started?;
        Some(self.metrics.tally().since(&base))
    }
}

fn check_count(m: &Model, after: &Op) -> Result<(), TestCaseError> {
    for name in [names::ACTIVE_REQUESTS, names::ACTIVE_CONNECTIONS] {
        let g = m.sim.metric(name);
        prop_assert!(
            g >= 0,
            "{name} went below 0 after {after:?}: something was given back twice ({g})"
        );
    }
    let r = m.health.active.read();
    let truth = m.counted_truth();
    prop_assert!(
        r.active >= m.held_in_flight(),
        "count {} below what live roots hold {} after {after:?}",
        r.active,
        m.held_in_flight()
    );
    if m.clean() {
        prop_assert!(
            r.active >= truth,
            "count {} below the truth {truth} after {after:?}",
            r.active
        );
        if !r.reliable {
            prop_assert_eq!(
                r.why,
                Some(Unreliable::TrafficRoleLost),
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
    if truth > 0 && !m.owed() && !m.death_unmarked() {
        prop_assert!(
            r.for_decisions() >= 1,
            "a false 0 with {truth} in flight after {after:?}: {r:?}"
        );
    }
    let all_ticked = m
        .workers
        .iter()
        .all(|w| w.root.is_none() || w.ticked_in_drain);
    if m.clean() && all_ticked && r.reliable && m.drain_unheld() {
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

/// Whether the state was DRAINING before a step, and whether the one window
/// in which a false 0 is possible was open then.
struct Before {
    draining: bool,
    excused: bool,
}

fn before(m: &Model) -> Before {
    let draining = m.state() == Some(State::Draining);
    Before {
        draining,
        // Only a drain can flip in the next step.
        excused: draining && (m.owed() || m.death_unmarked()),
    }
}

fn check_state(m: &Model, was: &Before, after: &Op) -> Result<(), TestCaseError> {
    let flipped = was.draining && matches!(m.state(), Some(State::Closing | State::Closed));
    if let Some(rec) = m.record().filter(|r| flipped && !r.forced) {
        let excused = was.excused || m.owed() || m.death_unmarked();
        let in_flight = m.in_flight();
        prop_assert!(
            in_flight == 0 || excused,
            "CLOSING ({:?}) with {in_flight} request(s) in flight after {after:?}",
            rec.reason
        );
        let ran = rec.drain_duration_ms(m.sim.now()).unwrap_or(0);
        prop_assert!(
            ran >= m.min_drain_ms,
            "CLOSING after {ran} ms, before min_drain {} ms",
            m.min_drain_ms
        );
    }
    if let (Some(t), true) = (m.receipt(), m.clean()) {
        let e = &m.expected;
        prop_assert_eq!(
            (t.cut, t.ended_upstream, t.refused, t.cut_lb),
            (e.cut, e.ended_upstream, e.refused, 0),
            "the receipt after {:?}: {:?}, the model saw {:?}",
            after,
            t,
            e
        );
        prop_assert_eq!(
            t.completed,
            e.completed,
            "completed ends in the receipt after {:?} (counted at their root's tick)",
            after
        );
    }
    Ok(())
}

/// Which invariants a run checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Invariants {
    Count,
    State,
}

fn check(which: Invariants, m: &Model, was: &Before, after: &Op) -> Result<(), TestCaseError> {
    match which {
        Invariants::Count => check_count(m, after),
        Invariants::State => check_state(m, was, after),
    }
}

/// A run of `ops` on a fresh host (`excluded`: the gauges a `stats_matcher`
/// excludes), checked after every step; then the drain starts (if it has
/// not), every request ends and time passes. Without a VM death or a
/// failure the count ends at exactly 0, trusted again; the drain flipped
/// unless its `min_drain` outlasts the run, and the receipt is complete.
fn run(
    (workers, min_drain_ms, refuse, ops): &(usize, u64, bool, Vec<Op>),
    excluded: bool,
    which: Invariants,
) -> Result<(), TestCaseError> {
    let (workers, min_drain_ms) = (*workers, *min_drain_ms);
    let sim = Sim::at(1_764_000_000_000);
    if excluded {
        for name in [names::ACTIVE_REQUESTS, names::ACTIVE_CONNECTIONS] {
            sim.excluded.borrow_mut().push(name.to_string());
        }
    }
    let mut m = Model::new(&sim, workers, min_drain_ms, *refuse);
    m.step(&Op::Time(TICK_MS, false)); // every root registers on its first tick
    if excluded {
        prop_assert_eq!(m.health.active.source_name(), "shared_data");
    }
    for op in ops {
        let was = before(&m);
        m.step(op);
        check(which, &m, &was, op)?;
    }
    sim.failures.set(0);
    sim.cas_races.set(0);
    let mut tail = vec![Op::DrainStart];
    for w in 0..workers {
        m.workers[w].busy = false;
        tail.extend((0..m.workers[w].held).map(|_| Op::Release(w)));
    }
    for w in 0..workers {
        let left = m.workers[w]
            .roots()
            .map(|r| r.open.len() as u64)
            .sum::<u64>()
            + m.workers[w].held
            + m.workers[w].uncounted;
        tail.extend((0..left).map(|_| Op::Exit(w, How::Completed)));
    }
    // Time for min_drain (unless it outlasts every run) and three more ticks.
    let ticks = 3 + MIN_DRAINS_MS[1] / TICK_MS;
    tail.extend((0..ticks).map(|_| Op::Time(TICK_MS, false)));
    for op in &tail {
        let was = before(&m);
        m.step(op);
        check(which, &m, &was, op)?;
    }
    match which {
        Invariants::Count => count_at_the_end(&m),
        Invariants::State => state_at_the_end(&m),
    }
}

fn count_at_the_end(m: &Model) -> Result<(), TestCaseError> {
    for w in &m.workers {
        prop_assert!(
            !w.root
                .as_ref()
                .is_some_and(|r| r.traffic.counter().mark_pending()),
            "a tick writes what a worker owes once writes succeed"
        );
    }
    let r = m.health.active.read();
    if m.clean() {
        prop_assert_eq!(r.active, 0, "{:?}", r);
        prop_assert!(r.reliable, "late roots came back, yet: {r:?}");
    } else {
        // A failed give-back leaves the count high (a drain then waits for
        // its timeout), never low.
        prop_assert!(r.for_decisions() >= 1 || r.active == 0 && r.reliable);
    }
    Ok(())
}

fn state_at_the_end(m: &Model) -> Result<(), TestCaseError> {
    if m.clean() && m.min_drain_ms < MIN_DRAINS_MS[2] {
        let state = m.state();
        prop_assert!(
            matches!(state, Some(State::Closing | State::Closed)),
            "nothing in flight, nothing holds it, and the drain did not flip: {state:?}"
        );
    }
    Ok(())
}

fn clamp(op: Op, workers: usize) -> Op {
    match op {
        Op::Arrive(w) => Op::Arrive(w % workers),
        Op::Release(w) => Op::Release(w % workers),
        Op::Exit(w, h) => Op::Exit(w % workers, h),
        Op::Busy(w) => Op::Busy(w % workers),
        Op::Free(w) => Op::Free(w % workers),
        Op::RootDrop(w) => Op::RootDrop(w % workers),
        Op::VmDeath(w) => Op::VmDeath(w % workers),
        Op::Reload(w) => Op::Reload(w % workers),
        Op::Coinciding(a, b) => Op::Coinciding(a % workers, b % workers),
        other => other,
    }
}

fn ops() -> impl Strategy<Value = (usize, u64, bool, Vec<Op>)> {
    (
        1usize..5,
        prop::sample::select(MIN_DRAINS_MS.to_vec()),
        any::<bool>(),
        prop::collection::vec(op(4), 1..120),
    )
        .prop_map(|(workers, min_drain_ms, refuse, ops)| {
            let ops = ops.into_iter().map(|o| clamp(o, workers)).collect();
            (workers, min_drain_ms, refuse, ops)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_count_keeps_its_invariants(run_of in ops()) {
        run(&run_of, false, Invariants::Count)?;
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
        .run(&ops(), |run_of| run(&run_of, true, Invariants::Count))
        .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The state machine over the same runs (gauge or shared-data count):
    /// never CLOSING while a request is in flight, and the receipt says how
    /// each stream of the drain ended.
    #[test]
    fn the_state_machine_never_flips_with_a_request_in_flight(
        run_of in ops(),
        excluded in any::<bool>(),
    ) {
        run(&run_of, excluded, Invariants::State)?;
    }
}

/// A scenario, written out: `ops` on `workers` workers (no `min_drain`),
/// the state machine's and the count's invariants checked after each.
fn scenario(workers: usize, refuse: bool, ops: &[Op]) -> Model<'static> {
    let sim: &'static Sim = Box::leak(Box::new(Sim::at(1_764_000_000_000)));
    let mut m = Model::new(sim, workers, 0, refuse);
    steps(&mut m, &[Op::Time(TICK_MS, false)]);
    steps(&mut m, ops);
    m
}

fn steps(m: &mut Model, ops: &[Op]) {
    for op in ops {
        let was = before(m);
        m.step(op);
        check_state(m, &was, op).unwrap();
        check_count(m, op).unwrap();
    }
}

fn ticks(n: usize) -> Vec<Op> {
    vec![Op::Time(TICK_MS, true); n]
}

fn state(m: &Model) -> State {
    m.state().unwrap()
}

/// The drain still waits; `ops` (the last request's end, a tick) flip it.
fn flips_after(m: &mut Model, ops: &[Op]) {
    assert_eq!(state(m), State::Draining);
    steps(m, ops);
    assert_eq!(state(m), State::Closing);
}

/// A request that a filter after drain-gate holds (an authorization call, a
/// delay) is counted from its arrival: the drain waits for it, and its end
/// flips.
#[test]
fn a_request_held_after_its_arrival_holds_the_drain() {
    let mut m = scenario(2, false, &[Op::Arrive(0), Op::DrainStart]);
    steps(&mut m, &ticks(10));
    assert_eq!(state(&m), State::Draining);
    steps(&mut m, &[Op::Exit(0, How::Completed)]);
    let rec = m.record().unwrap();
    assert_eq!(
        (rec.state, rec.reason),
        (State::Closing, Reason::ActiveZero)
    );
}

/// Two workers whose first failed counts coincide: both streams stay in the
/// uncounted part, so the drain waits for the second one too.
#[test]
fn coinciding_failed_counts_keep_the_drain_waiting() {
    let mut m = scenario(
        2,
        false,
        &[
            Op::Coinciding(0, 1),
            Op::DrainStart,
            Op::Exit(0, How::Completed),
        ],
    );
    steps(&mut m, &ticks(10));
    // One uncounted stream still in flight.
    flips_after(
        &mut m,
        &[Op::Exit(1, How::Completed), Op::Time(TICK_MS, true)],
    );
}

/// The lease of outside a drain covers a stream until it ends, on a root
/// that is replaced meanwhile too: the drain waits, and flips at its end.
#[test]
fn a_stream_counted_under_a_lease_holds_the_drain_until_it_ends() {
    let ops = [
        Op::Arrive(0),
        Op::Arrive(1),
        Op::Time(TICK_MS, false),
        Op::RootDrop(1),
        Op::DrainStart,
    ];
    let mut m = scenario(2, false, &ops);
    steps(&mut m, &ticks(10));
    assert_eq!(state(&m), State::Draining);
    steps(&mut m, &[Op::Exit(0, How::Completed)]);
    assert_eq!(
        state(&m),
        State::Draining,
        "the replaced root's stream runs on"
    );
    flips_after(&mut m, &[Op::Exit(1, How::Cut), Op::Time(TICK_MS, false)]);
    assert!(
        m.workers[1].replaced.is_empty(),
        "said goodbye after its last stream"
    );
    assert_eq!(m.receipt().unwrap().cut, 1);
}

/// Refused while draining: answered at once, never in flight, in the receipt.
#[test]
fn refused_requests_are_sorted_and_never_hold_the_drain() {
    let mut m = scenario(
        1,
        true,
        &[Op::Arrive(0), Op::DrainStart, Op::Time(TICK_MS, false)],
    );
    steps(&mut m, &[Op::Arrive(0), Op::Arrive(0)]);
    assert_eq!(m.receipt().unwrap().refused, 2);
    flips_after(
        &mut m,
        &[Op::Exit(0, How::Completed), Op::Time(TICK_MS, false)],
    );
}

/// The stall of a few seconds that once disarmed every later drain, written
/// out: 3.5 s without anything running, then the gateway drains — idle it
/// flips at once, unforced; with a stream in flight it holds until the
/// stream ends and flips then. Nothing is lost, nothing unreliable.
#[test]
fn a_stall_of_the_whole_process_disarms_nothing() {
    let sim = Sim::at(1_764_000_000_000);
    let mut m = Model::new(&sim, 3, MIN_DRAINS_MS[2], false);
    for _ in 0..10 {
        m.step(&Op::Time(TICK_MS, false));
    }
    m.step(&Op::Arrive(0));
    m.step(&Op::Stall(3_500));
    for _ in 0..30 {
        m.step(&Op::Time(TICK_MS, false));
    }
    let r = m.health.active.read();
    assert!(r.reliable, "{r:?}");
    let (reg, watch) = drain_gate::gate::liveness::host::Judge::new(&sim, TICK_MS).snapshot();
    assert_eq!((reg.lost_total, watch.stalls), (0, 1));
    // A drain with the stream in flight: held; the stream's end flips it.
    let store = Store::new(&sim).raising(receipt::host::transition);
    let metrics = Metrics::define(&sim);
    let plan = config::Health::default().plan();
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
    m.step(&Op::Exit(0, How::Completed));
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
    let mut m = Model::new(&sim, 2, MIN_DRAINS_MS[2], false);
    m.step(&Op::Time(TICK_MS, false));
    m.step(&Op::Busy(1));
    let stale = liveness::stale_after_ms(TICK_MS);
    for _ in 0..(stale / TICK_MS + 3) {
        m.step(&Op::Time(TICK_MS, false));
    }
    assert_eq!(
        m.health.active.read().why,
        Some(Unreliable::TrafficRoleLost)
    );
    m.step(&Op::Free(1));
    m.step(&Op::Time(TICK_MS, false));
    m.step(&Op::Time(TICK_MS, false));
    let r = m.health.active.read();
    assert!(r.reliable, "{r:?}");
    let (reg, _) = drain_gate::gate::liveness::host::Judge::new(&sim, TICK_MS).snapshot();
    assert_eq!((reg.lost_total, reg.back_total), (1, 1));
    assert_eq!(sim.metric(names::TRAFFIC_ROLES_LOST), 1);
    let _ = (&sim).now();
}
