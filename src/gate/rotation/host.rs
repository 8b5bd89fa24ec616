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
use crate::gate::rotation::{self, Outcome, Record as Rotation};
use crate::host::keys;
use crate::host::logs;
use crate::host::shared::{self, Seen, SharedError};
use crate::host::wasm_host::{Envoy, Host};

/// This worker's part in the rotation: at most one call at a time.
#[derive(Debug)]
pub struct Rotator<H: Host = Envoy> {
    host: H,
    /// `None`: rotation is turned off.
    cluster: Option<String>,
    refusing: bool,
    /// This worker's rotation call in flight, if any: its token and record.
    sent: RefCell<Option<(u32, Rotation)>>,
}

/// Creates the rotation record (none yet) unless it exists: on configure,
/// with the records beside the FSM's (see `root::create_shared`).
pub fn create<H: Host>(host: &H) {
    shared::ensure_json(host, keys::ROTATION, &None::<Rotation>);
}

/// The rotation record of the last drain (`crate::gate::rotation`): written only
/// by the worker that owns that drain's rotation, read by any status answer.
pub fn load<H: Host>(host: &H) -> Result<Option<Rotation>, SharedError> {
    Seen::new(keys::ROTATION).load(host)
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
        let claim = Rotation::pending(drain_ms, trigger, self.host.now().wall_ms);
        if self.write(&claim, true) {
            self.save(&self.send(claim));
        } // else another worker sent it, or a later drain's is recorded
    }

    /// Writes `rec` as the rotation record unless a later drain's rotation is
    /// recorded, or (`claim`: claiming the drain's rotation for this worker)
    /// this drain's already is. `true`: written.
    fn write(&self, rec: &Rotation, claim: bool) -> bool {
        let ms = Some(rec.drain_started_ms);
        Seen::new(keys::ROTATION)
            .edit(&self.host, &mut |slot: &mut Option<Rotation>| {
                let recorded = slot.as_ref().map(|r| r.drain_started_ms);
                let free = if claim { recorded < ms } else { recorded <= ms };
                if free {
                    *slot = Some(rec.clone());
                }
                free
            })
            .unwrap_or_else(|e| {
                logs::warning!("event=rotation_record_unavailable error=\"{e}\"");
                false
            })
    }

    /// Logs `rec`, and saves it unless a later drain's rotation is already
    /// recorded (after the claim, one writer per drain).
    fn save(&self, rec: &Rotation) {
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
        self.write(rec, false);
    }

    fn send(&self, claim: Rotation) -> Rotation {
        let cluster = self.cluster.as_deref().unwrap_or(rotation::DEFAULT_CLUSTER);
        let request = ["POST", rotation::ADMIN_PATH, "envoy-admin"];
        match self.host.http_call(cluster, request, rotation::TIMEOUT) {
            Ok(token) => {
                *self.sent.borrow_mut() = Some((token, claim.clone()));
                claim
            }
            Err(e) => Rotation {
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
