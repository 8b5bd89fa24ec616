//! Defines the metrics of `crate::metric_names`, probes whether a gauge is
//! live, and records transitions.

use proxy_wasm::types::MetricType;
use std::sync::atomic::{AtomicU64, Ordering};

use super::wasm_host::{Envoy, Host};
use super::{keys, logs, shared};
use crate::gate::fsm::{Record, State};
use crate::instruments::receipt::{End, Tally};
use crate::json::record;
use crate::metric_names::{self as names, histogram_counter, Kind, HISTOGRAM_COUNTERS as COUNTERS};

/// `Named`: one id per metric of the table, each defined by its name; a
/// counter with a method name (`+=`) is bumped by that method of `Metrics`, a
/// gauge or histogram with one (`=`) set to (or recorded) the value given; a
/// counter with a `Tally` field (`=>`) is read into it by `Metrics::tally`.
macro_rules! named {
    ($($field:ident: $name:ident $(+= $bump:ident)? $(= $set:ident)? $(=> $tally:ident)?,)*) => {
        #[derive(Clone, Copy, Debug, Default)]
        struct Named {
            $($field: Option<u32>,)*
        }

        impl Named {
            fn define<H: Host>(host: &H) -> Named {
                Named { $($field: define(host, names::$name),)* }
            }
        }

        impl<H: Host> Metrics<H> {
            $($(pub fn $bump(&self) {
                self.add(self.ids.$field, 1);
            })?)*

            $($(pub fn $set(&self, value: impl Into<u64>) {
                self.record(self.ids.$field, value.into());
            })?)*

            /// The receipt's counters now.
            pub fn tally(&self) -> Tally {
                Tally { $($($tally: self.read(self.ids.$field),)?)* }
            }
        }
    };
}

named! {
    state: STATE,
    forced: FORCED_CLOSES,
    // 1 (`true`) while the count is not trusted.
    count_unreliable: COUNT_UNRELIABLE = set_count_unreliable,
    // In whole seconds, as the gauge's name says (Envoy gauges are integers).
    oldest_in_flight: OLDEST_IN_FLIGHT = set_oldest_in_flight_seconds,
    count_errors: COUNT_ERRORS += count_error,
    traffic_roles_lost: TRAFFIC_ROLES_LOST += traffic_role_lost,
    clock_steps: CLOCK_STEPS += clock_step,
    lb_checks_ignored: LB_CHECKS_IGNORED += lb_check_ignored,
    cut: CUT => cut,
    cut_lb: CUT_LB => cut_lb,
    cut_tcp: CUT_TCP => cut_tcp,
    completed: DRAIN_COMPLETED => completed,
    ended_upstream: DRAIN_ENDED_UPSTREAM => ended_upstream,
    refused: REFUSED => refused,
    drains_cut_short: DRAINS_CUT_SHORT += drain_cut_short,
    // Bumped when the termination watch cannot see the SIGTERM (once per watch).
    termination_watch_unavailable: TERMINATION_WATCH_UNAVAILABLE += termination_watch_unavailable,
    // The configured `drain_timeout`, in whole seconds.
    drain_timeout: DRAIN_TIMEOUT = set_drain_timeout_seconds,
    // A drain's receipt line was logged: how long it took, in ms.
    drain_duration: DRAIN_DURATION = drain_took,
    // The LB's detection as measured now (`crate::gate::lb::Detection`).
    lb_check_interval: LB_CHECK_INTERVAL = set_lb_check_interval_ms,
    lb_buffer_short: LB_BUFFER_SHORT = set_lb_buffer_short_ms,
}

/// Metric ids of this VM. A missing id (the host refused the definition) only
/// loses that metric.
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics<H: Host = Envoy> {
    host: H,
    pub active: Option<u32>,
    pub active_connections: Option<u32>,
    /// Which gauges proved live: the state gauge (traffic streams may read
    /// it as a hint) and the count's (else the count lives in shared data).
    pub live: Live,
    /// The transition counters, indexed by the target state's code.
    transitions: [Option<u32>; 5],
    ids: Named,
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
    let t = match names::ALL.iter().find(|(n, _)| *n == name) {
        Some((_, Kind::Gauge)) => MetricType::Gauge,
        Some((_, Kind::Histogram)) => MetricType::Histogram,
        _ => MetricType::Counter,
    };
    host.define_metric(t, name)
        .map_err(|e| logs::warning!("event=metric_unavailable name={name} status={e:?}"))
        .ok()
}

/// The ids of every kind's counters (`Metrics::define` defines them once per VM).
pub type Ids = [[Option<u32>; COUNTERS]; 3];

/// The metric family of each kind, in `crate::instruments::sizing::Kind::ALL`'s order.
const FAMILIES: [&str; 3] = [
    names::STREAM_DURATION,
    names::UPGRADED_DURATION,
    names::TCP_DURATION,
];

/// Adds 1 to the gauge, reads it back, removes the 1: a null stat (a gauge a
/// `stats_matcher` excludes) reads 0.
fn gauge_is_live<H: Host>(host: &H, id: Option<u32>) -> bool {
    let Some(id) = id.filter(|&id| host.metric_add(id, 1).is_ok()) else {
        return false;
    };
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
    pub struct Live {
        state: bool,
        pub active: bool,
        pub active_connections: bool,
    }
}

fn live_gauges<H: Host>(host: &H, [state, active, conns]: [Option<u32>; 3]) -> Live {
    if let Ok(Some(live)) = shared::Seen::new(keys::GAUGES).load(host) {
        return live;
    }
    let live = Live {
        state: gauge_is_live(host, state),
        active: gauge_is_live(host, active),
        active_connections: gauge_is_live(host, conns),
    };
    let written = shared::encode(keys::GAUGES, &live)
        .and_then(|bytes| shared::create(host, keys::GAUGES, &bytes));
    shared::logged(log::Level::Warn, keys::GAUGES, written);
    live
}

impl<H: Host> Metrics<H> {
    pub fn define(host: H) -> Metrics<H> {
        let transitions = names::TRANSITIONS_TO.map(|name| define(&host, name));
        let ids = Named::define(&host);
        let active = define(&host, names::ACTIVE_REQUESTS);
        let active_connections = define(&host, names::ACTIVE_CONNECTIONS);
        Metrics {
            active,
            active_connections,
            live: live_gauges(&host, [ids.state, active, active_connections]),
            transitions,
            ids,
            durations: FAMILIES
                .map(|f| std::array::from_fn(|j| define(&host, &histogram_counter(f, j)))),
            host,
        }
    }

    /// The host these metrics live in.
    pub fn host(&self) -> &H {
        &self.host
    }

    fn add(&self, id: Option<u32>, n: u64) {
        if let (Some(id), true) = (id, n > 0) {
            let _ = self
                .host
                .metric_add(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn record(&self, id: Option<u32>, value: u64) {
        if let Some(id) = id {
            let _ = self.host.metric_record(id, value);
        }
    }

    pub fn set_state(&self, state: State) {
        self.record(self.ids.state, state.code());
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
        let id = self.ids.state.filter(|_| self.live.state)?;
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
        let id = self.transitions.get(next.state as usize).copied().flatten();
        self.add(id, 1);
        if next.state == State::Closing && next.forced {
            self.add(self.ids.forced, 1);
        }
    }

    /// The ignored-checks counter over every VM (0 when it cannot be read).
    pub fn lb_checks_ignored(&self) -> u64 {
        self.read(self.ids.lb_checks_ignored)
    }

    /// A counter over every VM (0 when it cannot be read).
    fn read(&self, id: Option<u32>) -> u64 {
        id.and_then(|id| self.host.metric_get(id).ok()).unwrap_or(0)
    }

    /// How a stream or connection that ended during a drain ended.
    pub fn ended(&self, end: End, tcp: bool, by_lb: bool) {
        match end {
            End::Completed => self.completed(1),
            End::Upstream => self.add(self.ids.ended_upstream, 1),
            End::Refused => self.add(self.ids.refused, 1),
            End::Cut => {
                self.add(self.ids.cut, 1);
                self.add(self.ids.cut_tcp.filter(|_| tcp), 1);
                self.add(self.ids.cut_lb.filter(|_| by_lb), 1);
            }
        }
    }

    /// `n` streams or connections that ended during a drain completed
    /// (the traffic role adds them up between its ticks).
    pub fn completed(&self, n: u64) {
        self.add(self.ids.completed, n);
    }
}
