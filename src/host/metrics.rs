//! Defines the metrics of `crate::metric_names`, probes whether a gauge is
//! live, and records transitions.

use crate::json::record;
use proxy_wasm::types::MetricType;
use std::sync::atomic::{AtomicU64, Ordering};

use super::keys;
use super::logs;
use super::shared;
use super::wasm_host::{Envoy, Host};
use crate::gate::fsm::{Record, State};
use crate::instruments::receipt::{End, Tally};
use crate::instruments::sizing::Kind as DurationKind;
use crate::metric_names::{self as names, histogram_counter, Kind, HISTOGRAM_COUNTERS as COUNTERS};

/// Metric ids of this VM. A missing id (the host refused the definition) only
/// loses that metric.
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics<H: Host = Envoy> {
    host: H,
    pub active: Option<u32>,
    pub active_connections: Option<u32>,
    state: Option<u32>,
    /// The state gauge proved live: traffic streams may read it as a hint.
    state_live: bool,
    /// The count's gauges proved live (else the count lives in shared data).
    pub active_live: bool,
    pub active_connections_live: bool,
    transitions: [Option<u32>; 5],
    forced: Option<u32>,
    count_errors: Option<u32>,
    count_unreliable: Option<u32>,
    traffic_roles_lost: Option<u32>,
    oldest_in_flight: Option<u32>,
    clock_steps: Option<u32>,
    lb_checks_ignored: Option<u32>,
    /// The receipt's counters (`crate::instruments::receipt`).
    cut: Option<u32>,
    cut_lb: Option<u32>,
    cut_tcp: Option<u32>,
    completed: Option<u32>,
    ended_upstream: Option<u32>,
    refused: Option<u32>,
    drains_cut_short: Option<u32>,
    termination_watch_unavailable: Option<u32>,
    drain_timeout: Option<u32>,
    drain_duration: Option<u32>,
    /// The LB's measured check interval and what `lb_buffer` lacks (`crate::gate::lb::Detection`).
    lb_check_interval: Option<u32>,
    lb_buffer_short: Option<u32>,
    /// The stream-duration counters (`host::sizing`).
    pub durations: Ids,
}

/// Metric definitions this VM made (Envoy keeps every one: this must stay
/// flat across reconfigurations).
static DEFINITIONS: AtomicU64 = AtomicU64::new(0);

/// How many metric definitions this VM has made.
pub fn definitions() -> u64 {
    DEFINITIONS.load(Ordering::Relaxed)
}

fn define<H: Host>(host: &H, name: &str) -> Option<u32> {
    DEFINITIONS.fetch_add(1, Ordering::Relaxed);
    let kind = names::ALL
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(Kind::Counter, |(_, k)| *k);
    let t = match kind {
        Kind::Counter | Kind::Buckets => MetricType::Counter,
        Kind::Gauge => MetricType::Gauge,
        Kind::Histogram => MetricType::Histogram,
    };
    match host.define_metric(t, name) {
        Ok(id) => Some(id),
        Err(e) => {
            logs::warning!("event=metric_unavailable name={name} status={e:?}");
            None
        }
    }
}

/// The ids of every kind's counters (`Metrics::define` defines them once per VM).
pub type Ids = [[Option<u32>; COUNTERS]; 3];

/// Defines every kind's counters (`Metrics::define`: once per VM, as Envoy
/// keeps every definition).
pub fn define_durations<H: Host>(host: &H) -> Ids {
    let mut ids = [[None; COUNTERS]; 3];
    for (row, kind) in ids.iter_mut().zip(DurationKind::ALL) {
        for (j, slot) in row.iter_mut().enumerate() {
            *slot = define(host, &histogram_counter(family(kind), j));
        }
    }
    ids
}

/// The metric family of a kind (`crate::metric_names`).
fn family(kind: DurationKind) -> &'static str {
    match kind {
        DurationKind::Http => names::STREAM_DURATION,
        DurationKind::Upgraded => names::UPGRADED_DURATION,
        DurationKind::Tcp => names::TCP_DURATION,
    }
}

/// Adds 1 to the gauge, reads it back, removes the 1: a null stat (a gauge a
/// `stats_matcher` excludes) reads 0.
fn gauge_is_live<H: Host>(host: &H, id: Option<u32>) -> bool {
    let Some(id) = id else { return false };
    if host.metric_add(id, 1).is_err() {
        return false;
    }
    let seen = host.metric_get(id).unwrap_or(0);
    let _ = host.metric_add(id, -1);
    seen >= 1
}

record! {
    /// Which gauges are live, probed once per process: by the first root
    /// context configured, which Envoy configures on the main thread before any
    /// worker VM exists — so nobody else writes a gauge while it is probed (a
    /// probe racing a `record` could leave the state gauge wrapped to 2⁶⁴−1), and
    /// no later root probes again (a `stats_matcher` is fixed at bootstrap).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct Live {
        state: bool,
        active: bool,
        active_connections: bool,
    }
}

fn live_gauges<H: Host>(
    host: &H,
    state: Option<u32>,
    active: Option<u32>,
    conns: Option<u32>,
) -> Live {
    if let Ok(Some(b)) = host.get(keys::GAUGES).map(|(b, _)| b) {
        if let Ok(live) = shared::parse(keys::GAUGES, &b) {
            return live;
        }
    }
    let live = Live {
        state: gauge_is_live(host, state),
        active: gauge_is_live(host, active),
        active_connections: gauge_is_live(host, conns),
    };
    let written = shared::encode(keys::GAUGES, &live)
        .and_then(|bytes| shared::create(host, keys::GAUGES, &bytes));
    if let Err(e) = written {
        logs::warning!("event=shared_data_error key={} error=\"{e}\"", keys::GAUGES);
    }
    live
}

impl<H: Host + Copy> Metrics<H> {
    pub fn define(host: H) -> Metrics<H> {
        let mut transitions = [None; 5];
        for (slot, name) in transitions.iter_mut().zip(names::TRANSITIONS_TO) {
            *slot = define(&host, name);
        }
        let state = define(&host, names::STATE);
        let active = define(&host, names::ACTIVE_REQUESTS);
        let active_connections = define(&host, names::ACTIVE_CONNECTIONS);
        let live = live_gauges(&host, state, active, active_connections);
        Metrics {
            host,
            active,
            active_connections,
            state,
            state_live: live.state,
            active_live: live.active,
            active_connections_live: live.active_connections,
            transitions,
            forced: define(&host, names::FORCED_CLOSES),
            count_unreliable: define(&host, names::COUNT_UNRELIABLE),
            oldest_in_flight: define(&host, names::OLDEST_IN_FLIGHT),
            count_errors: define(&host, names::COUNT_ERRORS),
            traffic_roles_lost: define(&host, names::TRAFFIC_ROLES_LOST),
            clock_steps: define(&host, names::CLOCK_STEPS),
            lb_checks_ignored: define(&host, names::LB_CHECKS_IGNORED),
            cut: define(&host, names::CUT),
            cut_lb: define(&host, names::CUT_LB),
            cut_tcp: define(&host, names::CUT_TCP),
            completed: define(&host, names::DRAIN_COMPLETED),
            ended_upstream: define(&host, names::DRAIN_ENDED_UPSTREAM),
            refused: define(&host, names::REFUSED),
            drains_cut_short: define(&host, names::DRAINS_CUT_SHORT),
            termination_watch_unavailable: define(&host, names::TERMINATION_WATCH_UNAVAILABLE),
            drain_timeout: define(&host, names::DRAIN_TIMEOUT),
            drain_duration: define(&host, names::DRAIN_DURATION),
            lb_check_interval: define(&host, names::LB_CHECK_INTERVAL),
            lb_buffer_short: define(&host, names::LB_BUFFER_SHORT),
            durations: define_durations(&host),
        }
    }
}

impl<H: Host> Metrics<H> {
    /// The host these metrics live in.
    pub fn host(&self) -> &H {
        &self.host
    }

    fn bump(&self, id: Option<u32>) {
        if let Some(id) = id {
            let _ = self.host.metric_add(id, 1);
        }
    }

    fn record(&self, id: Option<u32>, value: u64) {
        if let Some(id) = id {
            let _ = self.host.metric_record(id, value);
        }
    }

    pub fn set_state(&self, state: State) {
        self.record(self.state, state.code());
    }

    /// The state as the `drain_gate_state` gauge says, if that gauge is live
    /// and holds a state's code (`None`: the caller asks the store or the count).
    /// It is written right after every winning transition, so a reader that
    /// sees an older value either runs before the writer's next step (which
    /// re-reads the count) or is covered by the tick.
    pub fn state_hint(&self) -> Option<State> {
        self.state_gauge().and_then(State::from_code)
    }

    /// The raw value of the state gauge, if that gauge is live.
    fn state_gauge(&self) -> Option<u64> {
        let id = self.state.filter(|_| self.state_live)?;
        self.host.metric_get(id).ok()
    }

    /// Repairs the state gauge if a late writer left it stale, or it holds a
    /// value that is no state (the tick runs this).
    pub fn sync_state(&self, state: State) {
        if self.state_gauge().is_some_and(|v| v != state.code()) {
            self.set_state(state);
        }
    }

    /// Called once per transition, by the worker whose write won.
    pub fn transition(&self, next: &Record) {
        self.set_state(next.state);
        let i = State::ALL.iter().position(|s| *s == next.state);
        self.bump(i.and_then(|i| self.transitions.get(i).copied().flatten()));
        if next.state == State::Closing && next.forced {
            self.bump(self.forced);
        }
    }

    pub fn set_count_unreliable(&self, unreliable: bool) {
        self.record(self.count_unreliable, u64::from(unreliable));
    }

    /// Whole seconds, as the gauge's name says (Envoy gauges are integers).
    pub fn set_oldest_in_flight(&self, age_ms: Option<u64>) {
        self.record(self.oldest_in_flight, age_ms.unwrap_or(0) / 1000);
    }

    pub fn count_error(&self) {
        self.bump(self.count_errors);
    }

    pub fn traffic_role_lost(&self) {
        self.bump(self.traffic_roles_lost);
    }

    pub fn clock_step(&self) {
        self.bump(self.clock_steps);
    }

    /// The configured `drain_timeout`, in whole seconds.
    pub fn set_drain_timeout(&self, ms: u64) {
        self.record(self.drain_timeout, ms / 1000);
    }

    /// A drain's receipt line was logged: how long it took.
    pub fn drain_took(&self, ms: u64) {
        self.record(self.drain_duration, ms);
    }

    pub fn drain_cut_short(&self) {
        self.bump(self.drains_cut_short);
    }

    /// The termination watch cannot see the SIGTERM (said once per watch).
    pub fn termination_watch_unavailable(&self) {
        self.bump(self.termination_watch_unavailable);
    }

    /// The LB's detection as measured now (`None`: nothing measured, both 0).
    pub fn set_lb_detection(&self, d: Option<&crate::gate::lb::Detection>) {
        self.record(self.lb_check_interval, d.map_or(0, |d| d.interval_ms));
        self.record(self.lb_buffer_short, d.map_or(0, |d| d.short_ms));
    }

    pub fn lb_check_ignored(&self) {
        self.bump(self.lb_checks_ignored);
    }

    /// The ignored-checks counter over every VM (0 when it cannot be read).
    pub fn lb_checks_ignored(&self) -> u64 {
        self.read(self.lb_checks_ignored)
    }

    /// A counter over every VM (0 when it cannot be read).
    fn read(&self, id: Option<u32>) -> u64 {
        id.and_then(|id| self.host.metric_get(id).ok()).unwrap_or(0)
    }

    /// How a stream or connection that ended during a drain ended.
    pub fn ended(&self, end: End, tcp: bool, by_lb: bool) {
        match end {
            End::Completed => self.completed(1),
            End::Upstream => self.bump(self.ended_upstream),
            End::Refused => self.bump(self.refused),
            End::Cut => {
                self.bump(self.cut);
                if tcp {
                    self.bump(self.cut_tcp);
                }
                if by_lb {
                    self.bump(self.cut_lb);
                }
            }
        }
    }

    /// `n` streams or connections that ended during a drain completed
    /// (the traffic role adds them up between its ticks).
    pub fn completed(&self, n: u64) {
        if let (Some(id), true) = (self.completed, n > 0) {
            let _ = self
                .host
                .metric_add(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The receipt's counters now.
    pub fn tally(&self) -> Tally {
        Tally {
            cut: self.read(self.cut),
            cut_lb: self.read(self.cut_lb),
            cut_tcp: self.read(self.cut_tcp),
            completed: self.read(self.completed),
            ended_upstream: self.read(self.ended_upstream),
            refused: self.read(self.refused),
        }
    }
}
