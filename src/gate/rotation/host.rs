//! Connection rotation (`crate::gate::rotation`): the health root context's call to
//! Envoy's admin API, and its record in shared data (`keys::ROTATION`).
//!
//! The health root context's tick sends it once it is due
//! (`rotation::due`): a call made from a stream would belong to it, and Envoy
//! cancels a stream's calls when the stream ends — which the `/drain` answer
//! does at once. One worker per drain sends it: the one whose
//! compare-and-swap claims the drain's rotation record.

use std::cell::RefCell;

use crate::gate::fsm::Record;
use crate::gate::lb::Gate;
use crate::gate::rotation::{self, Outcome};
use crate::host::keys;
use crate::host::logs;
use crate::host::shared::{self, json_change, json_read, SharedError};
use crate::host::wasm_host::{Envoy, Host};

/// This worker's part in the rotation: at most one call at a time.
#[derive(Debug)]
pub struct Rotator<H: Host = Envoy> {
    host: H,
    /// `None`: rotation is turned off.
    cluster: Option<String>,
    refusing: bool,
    /// This worker's rotation call in flight, if any: its token and record.
    sent: RefCell<Option<(u32, rotation::Record)>>,
}

/// Creates the rotation record (none yet) unless it exists: on configure,
/// with the records of `Store::create` (see `root::create_shared`).
pub fn create<H: Host>(host: &H) {
    shared::ensure_json(host, keys::ROTATION, &None::<rotation::Record>);
}

/// The rotation record of the last drain (`crate::gate::rotation`): written only
/// by the worker that owns that drain's rotation, read by any status answer.
pub fn load<H: Host>(host: &H) -> Result<Option<rotation::Record>, SharedError> {
    json_read(host, keys::ROTATION)
}

/// Claims the rotation of `claim`'s drain for this worker: written unless
/// that drain (or a later one) already has a record. `true`: claimed.
fn claim_drain<H: Host>(host: &H, claim: &rotation::Record) -> Result<bool, SharedError> {
    let drain_ms = claim.drain_started_ms;
    json_change(host, keys::ROTATION, |rec: &mut Option<_>| {
        // Free when no drain, or only an earlier one, has a record.
        let free = rec.as_ref().map(|r: &rotation::Record| r.drain_started_ms) < Some(drain_ms);
        if free {
            *rec = Some(claim.clone());
        }
        free
    })
}

impl<H: Host> Rotator<H> {
    /// `refusing`: drains refuse new requests (`draining_new_requests`).
    pub fn new(host: H, cluster: Option<String>, refusing: bool) -> Rotator<H> {
        Rotator {
            host,
            cluster,
            refusing,
            sent: RefCell::new(None),
        }
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
        let claim = rotation::Record::pending(drain_ms, trigger, self.host.now().wall_ms);
        let claimed = claim_drain(&self.host, &claim).unwrap_or_else(|e| {
            logs::warning!("event=rotation_record_unavailable error=\"{e}\"");
            false
        });
        if !claimed {
            return; // another worker sent it, or a later drain's is recorded
        }
        self.save(&self.send(claim));
    }

    /// Logs `rec`, and saves it unless a later drain's rotation is already
    /// recorded. After the claim, one writer per drain, so no
    /// compare-and-swap: the last write wins.
    fn save(&self, rec: &rotation::Record) {
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
        if matches!(load(&self.host), Ok(Some(r)) if r.drain_started_ms > rec.drain_started_ms) {
            return;
        }
        let saved = shared::encode(keys::ROTATION, rec).and_then(|bytes| {
            (self.host.set(keys::ROTATION, &bytes, None)).map_err(SharedError::Write)
        });
        if let Err(e) = saved {
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
        match self.host.http_call(cluster, &headers, rotation::TIMEOUT) {
            Ok(token) => {
                *self.sent.borrow_mut() = Some((token, claim.clone()));
                claim
            }
            Err(e) => rotation::Record {
                outcome: Outcome::Failed,
                requested_ms: None,
                error: Some(format!(
                    "Envoy refused the call to cluster \"{cluster}\" ({e:?}): no such cluster?"
                )),
                ..claim
            },
        }
    }

    /// The admin API's answer (or its absence) to the call sent with `token`.
    pub fn answered(&self, token: u32, num_headers: usize) {
        let Some((_, sent)) = self.sent.borrow_mut().take_if(|(t, _)| *t == token) else {
            return;
        };
        let status = (num_headers > 0).then(|| self.host.http_call_status());
        self.save(&sent.answered(status.flatten(), self.host.now().wall_ms));
    }
}
