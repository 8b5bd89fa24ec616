//! Connection rotation at drain start (`crate::rotation`): the health root
//! context's call to Envoy's admin API, and its record in shared data.
//!
//! The stream that moves the state to DRAINING only marks the rotation due;
//! the root context sends it on its next tick. A call made from that stream
//! would belong to it, and Envoy cancels a stream's calls when the stream ends
//! — which the `/drain` answer does at once.

use std::cell::RefCell;
use std::time::Duration;

use super::shared::{Envoy, Host};
use super::store::Store;
use crate::fsm::Record;
use crate::rotation::{self, Outcome};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Idle,
    /// This worker moved the state to DRAINING at this instant; not sent yet.
    Due(u64),
    /// Sent; the answer comes back with this token.
    Sent(u32, rotation::Record),
}

/// This worker's part in the rotation: at most one call at a time.
#[derive(Debug)]
pub struct Rotator<H: Host = Envoy> {
    store: Store<H>,
    /// `None`: rotation is turned off.
    cluster: Option<String>,
    step: RefCell<Step>,
}

fn log_outcome(rec: &rotation::Record) {
    match rec.outcome {
        Outcome::Done | Outcome::Pending => log::info!(
            "event=connection_rotation outcome={:?} admin_status={:?}",
            rec.outcome,
            rec.admin_status
        ),
        Outcome::Failed | Outcome::Skipped => log::warn!(
            "event=connection_rotation outcome={:?} error=\"{}\"",
            rec.outcome,
            rec.error.as_deref().unwrap_or("")
        ),
    }
}

impl<H: Host> Rotator<H> {
    pub fn new(host: H, cluster: Option<String>) -> Rotator<H> {
        Rotator {
            store: Store::new(host),
            cluster,
            step: RefCell::new(Step::Idle),
        }
    }

    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// Called with the record a successful move returned: marks the
    /// rotation due when that move started a drain.
    pub fn moved(&self, next: &Record) {
        if let (Some(drain_ms), Some(_)) = (rotation::started_by(next), &self.cluster) {
            *self.step.borrow_mut() = Step::Due(drain_ms);
        }
    }

    /// Runs in the root context's tick: sends a due call.
    pub fn tick(&self, now: &Record) {
        let Step::Due(drain_ms) = *self.step.borrow() else {
            return;
        };
        let rec = self.send(now, drain_ms);
        log_outcome(&rec);
        self.save(&rec);
    }

    /// Saves `rec` unless a later drain's rotation is already recorded.
    fn save(&self, rec: &rotation::Record) {
        let newer = matches!(self.store.rotation_load(),
            Ok(Some(r)) if r.drain_started_ms > rec.drain_started_ms);
        if newer {
            return;
        }
        if let Err(e) = self.store.rotation_save(rec) {
            log::warn!("event=rotation_record_unavailable error=\"{e}\"");
        }
    }

    fn send(&self, now: &Record, drain_ms: u64) -> rotation::Record {
        *self.step.borrow_mut() = Step::Idle;
        if !rotation::still_wanted(now, drain_ms) {
            let why = format!("the drain ended ({}) before the call", now.state.name());
            return rotation::Record::not_sent(drain_ms, Outcome::Skipped, why);
        }
        let cluster = self.cluster.as_deref().unwrap_or(rotation::DEFAULT_CLUSTER);
        let headers = [
            (":method", "POST"),
            (":path", rotation::ADMIN_PATH),
            (":authority", "envoy-admin"),
        ];
        let timeout = Duration::from_millis(rotation::TIMEOUT_MS);
        let host = self.store.host();
        match host.http_call(cluster, &headers, timeout) {
            Ok(token) => {
                let rec = rotation::Record::pending(drain_ms, host.now().wall_ms);
                *self.step.borrow_mut() = Step::Sent(token, rec.clone());
                rec
            }
            Err(e) => rotation::Record::not_sent(
                drain_ms,
                Outcome::Failed,
                format!("Envoy refused the call to cluster {cluster:?} ({e:?}): no such cluster?"),
            ),
        }
    }

    /// The admin API's answer (or its absence) to the call sent with `token`.
    pub fn answered(&self, token: u32, num_headers: usize) {
        let sent = match &*self.step.borrow() {
            Step::Sent(t, rec) if *t == token => rec.clone(),
            _ => return,
        };
        *self.step.borrow_mut() = Step::Idle;
        let host = self.store.host();
        let status = if num_headers == 0 {
            None
        } else {
            host.http_call_status()
        };
        let rec = sent.answered(status, host.now().wall_ms);
        log_outcome(&rec);
        self.save(&rec);
    }
}
