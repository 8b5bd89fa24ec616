//! Connection rotation (`crate::rotation`): the health root context's call to
//! Envoy's admin API, and its record in shared data.
//!
//! The health root context's tick sends it once it is due
//! (`rotation::due`): a call made from a stream would belong to it, and Envoy
//! cancels a stream's calls when the stream ends — which the `/drain` answer
//! does at once. One worker per drain sends it: the one whose
//! compare-and-swap claims the drain's rotation record.

use std::cell::RefCell;
use std::time::Duration;

use super::logs;
use super::shared::{Envoy, Host};
use super::store::Store;
use crate::fsm::Record;
use crate::lb::Gate;
use crate::rotation::{self, Outcome};

/// This worker's rotation call in flight, if any: its token and record.
type Sent = Option<(u32, rotation::Record)>;

/// This worker's part in the rotation: at most one call at a time.
#[derive(Debug)]
pub struct Rotator<H: Host = Envoy> {
    store: Store<H>,
    /// `None`: rotation is turned off.
    cluster: Option<String>,
    refusing: bool,
    sent: RefCell<Sent>,
}

fn log_outcome(rec: &rotation::Record) {
    match rec.outcome {
        Outcome::Done | Outcome::Pending => logs::info!(
            "event=connection_rotation outcome={} trigger={} admin_status={}",
            rec.outcome.name(),
            rec.trigger.map_or("none", rotation::Trigger::name),
            rec.admin_status.unwrap_or(0)
        ),
        Outcome::Failed => logs::warning!(
            "event=connection_rotation outcome={} error=\"{}\"",
            rec.outcome.name(),
            rec.error.as_deref().unwrap_or("")
        ),
    }
}

impl<H: Host> Rotator<H> {
    /// `refusing`: drains refuse new requests (`draining_new_requests`).
    pub fn new(host: H, cluster: Option<String>, refusing: bool) -> Rotator<H> {
        Rotator {
            store: Store::new(host),
            cluster,
            refusing,
            sent: RefCell::new(None),
        }
    }

    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// Runs in the health root context's tick: sends the drain's rotation
    /// once it is due (`rotation::due`), if this worker claims it first.
    pub fn tick(&self, now: &Record, gate: Option<Gate>) {
        let (Some(_), Some(drain_ms), Some(trigger)) = (
            &self.cluster,
            now.drain_started_ms,
            rotation::due(now, gate, self.refusing),
        ) else {
            return;
        };
        let host = self.store.host();
        let claim = rotation::Record::pending(drain_ms, trigger, host.now().wall_ms);
        match self.store.rotation_claim(&claim) {
            Ok(true) => {}
            Ok(false) => return, // another worker sent it, or a later drain's is recorded
            Err(e) => {
                logs::warning!("event=rotation_record_unavailable error=\"{e}\"");
                return;
            }
        }
        let rec = self.send(claim);
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
            logs::warning!("event=rotation_record_unavailable error=\"{e}\"");
        }
    }

    fn send(&self, claim: rotation::Record) -> rotation::Record {
        let cluster = self.cluster.as_deref().unwrap_or(rotation::DEFAULT_CLUSTER);
        let headers = [
            (":method", "POST"),
            (":path", rotation::ADMIN_PATH),
            (":authority", "envoy-admin"),
        ];
        let timeout = Duration::from_millis(rotation::TIMEOUT_MS);
        match self.store.host().http_call(cluster, &headers, timeout) {
            Ok(token) => {
                *self.sent.borrow_mut() = Some((token, claim.clone()));
                claim
            }
            Err(e) => rotation::Record::not_sent(
                claim.drain_started_ms,
                claim.trigger.unwrap_or(rotation::Trigger::Flip),
                Outcome::Failed,
                format!(
                    "Envoy refused the call to cluster \"{cluster}\" ({e:?}): no such cluster?"
                ),
            ),
        }
    }

    /// The admin API's answer (or its absence) to the call sent with `token`.
    pub fn answered(&self, token: u32, num_headers: usize) {
        let sent = match &*self.sent.borrow() {
            Some((t, rec)) if *t == token => rec.clone(),
            _ => return,
        };
        *self.sent.borrow_mut() = None;
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
