//! Defines the metrics of `crate::metrics` and records transitions.

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use crate::fsm::{Record, State};
use crate::metrics::{self as names, Kind};

/// Metric ids of this VM. A missing id (the host refused the definition) only
/// loses that metric.
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics {
    pub active: Option<u32>,
    state: Option<u32>,
    transitions: [Option<u32>; 5],
    forced: Option<u32>,
    count_errors: Option<u32>,
}

fn define(name: &str) -> Option<u32> {
    let kind = names::ALL
        .iter()
        .find(|m| m.name == name)
        .map_or(Kind::Counter, |m| m.kind);
    let t = match kind {
        Kind::Counter => MetricType::Counter,
        Kind::Gauge => MetricType::Gauge,
    };
    match hostcalls::define_metric(t, name) {
        Ok(id) => Some(id),
        Err(e) => {
            log::warn!("event=metric_unavailable name={name} status={e:?}");
            None
        }
    }
}

fn bump(id: Option<u32>) {
    if let Some(id) = id {
        let _ = hostcalls::increment_metric(id, 1);
    }
}

impl Metrics {
    pub fn define() -> Metrics {
        let mut transitions = [None; 5];
        for (slot, name) in transitions.iter_mut().zip(names::TRANSITIONS_TO) {
            *slot = define(name);
        }
        Metrics {
            active: define(names::ACTIVE_REQUESTS),
            state: define(names::STATE),
            transitions,
            forced: define(names::FORCED_CLOSES),
            count_errors: define(names::COUNT_ERRORS),
        }
    }

    pub fn set_state(&self, state: State) {
        if let Some(id) = self.state {
            let _ = hostcalls::record_metric(id, state.code());
        }
    }

    /// Called once per transition, by the worker whose write won.
    pub fn transition(&self, next: &Record) {
        self.set_state(next.state);
        let i = State::ALL.iter().position(|s| *s == next.state);
        bump(i.and_then(|i| self.transitions.get(i).copied().flatten()));
        if next.state == State::Closing && next.forced {
            bump(self.forced);
        }
    }

    pub fn count_error(&self) {
        bump(self.count_errors);
    }
}
