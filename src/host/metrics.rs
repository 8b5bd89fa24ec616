//! Defines the metrics of `crate::metric_names`, probes whether a gauge is
//! live, and records transitions.

use proxy_wasm::types::MetricType;
use std::sync::atomic::{AtomicU64, Ordering};

use super::wasm_host::{Envoy, Host};
use super::{keys, logs, shared};
use crate::gate::fsm::{Record, State};
use crate::instruments::receipt::Tally;
use crate::json::record;
pub use crate::metric_names::Id;
use crate::metric_names::{self as names, histogram_counter, Kind, HISTOGRAM_COUNTERS as COUNTERS};

/// Metric ids of this VM. A missing id (the host refused the definition) only
/// loses that metric.
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics<H: Host = Envoy> {
    host: H,
    /// Which gauges proved live: the state gauge (traffic streams may read
    /// it as a hint) and the count's (else the count lives in shared data).
    pub live: Live,
    /// One id per metric of `names::ALL`, indexed by its `Id` (none for a
    /// histogram of counters: its counters are `durations`).
    ids: [Option<u32>; names::ALL.len()],
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

fn define<H: Host>(host: &H, name: &str, t: MetricType) -> Option<u32> {
    DEFINITIONS.fetch_add(1, Ordering::Relaxed);
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

fn live_gauges<H: Host>(m: &Metrics<H>) -> Live {
    let host = &m.host;
    if let Ok(Some(live)) = shared::Seen::new(keys::GAUGES).load(host) {
        return live;
    }
    let live = Live {
        state: gauge_is_live(host, m.id(Id::State)),
        active: gauge_is_live(host, m.id(Id::ActiveRequests)),
        active_connections: gauge_is_live(host, m.id(Id::ActiveConnections)),
    };
    let written = shared::encode(keys::GAUGES, &live)
        .and_then(|bytes| shared::create(host, keys::GAUGES, &bytes));
    shared::logged(log::Level::Warn, keys::GAUGES, written);
    live
}

impl<H: Host> Metrics<H> {
    pub fn define(host: H) -> Metrics<H> {
        let ids = names::ALL.map(|(name, kind)| match kind {
            Kind::Counter => define(&host, name, MetricType::Counter),
            Kind::Gauge => define(&host, name, MetricType::Gauge),
            Kind::Histogram => define(&host, name, MetricType::Histogram),
            Kind::Buckets => None,
        });
        let counter = |name: &str| define(&host, name, MetricType::Counter);
        let mut m = Metrics {
            live: Live::default(),
            ids,
            durations: FAMILIES.map(|f| std::array::from_fn(|j| counter(&histogram_counter(f, j)))),
            host,
        };
        m.live = live_gauges(&m);
        m
    }

    /// The id of a metric (`None`: the host refused its definition).
    #[inline(always)]
    pub fn id(&self, id: Id) -> Option<u32> {
        self.ids.get(id as usize).copied().flatten()
    }

    /// The host these metrics live in.
    pub fn host(&self) -> &H {
        &self.host
    }

    /// Adds `n` to a counter.
    #[inline(always)]
    pub fn add(&self, id: Id, n: u64) {
        if let (Some(id), true) = (self.id(id), n > 0) {
            let _ = self
                .host
                .metric_add(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets a gauge to `value`, or records it in a histogram.
    pub fn set(&self, id: Id, value: impl Into<u64>) {
        if let Some(id) = self.id(id) {
            let _ = self.host.metric_record(id, value.into());
        }
    }

    pub fn set_state(&self, state: State) {
        self.set(Id::State, state.code());
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
        let id = self.id(Id::State).filter(|_| self.live.state)?;
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
        let to = self
            .ids
            .get(Id::TransitionsToOpen as usize + next.state as usize);
        if let Some(&Some(id)) = to {
            let _ = self.host.metric_add(id, 1);
        }
        if next.state == State::Closing && next.forced {
            self.add(Id::ForcedCloses, 1);
        }
    }

    /// A counter over every VM (0 when it cannot be read).
    pub fn read(&self, id: Id) -> u64 {
        self.id(id)
            .and_then(|id| self.host.metric_get(id).ok())
            .unwrap_or(0)
    }

    /// The receipt's counters now.
    pub fn tally(&self) -> Tally {
        Tally {
            cut: self.read(Id::Cut),
            cut_lb: self.read(Id::CutLb),
            cut_tcp: self.read(Id::CutTcp),
            completed: self.read(Id::DrainCompleted),
            ended_upstream: self.read(Id::DrainEndedUpstream),
            refused: self.read(Id::Refused),
        }
    }
}
