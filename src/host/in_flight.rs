//! Carries each worker's in-flight ages (`crate::in_flight`) through shared
//! data: every traffic root context publishes its summary from its tick
//! under its registry id (`keys::in_flight`), so the keys are as many as the
//! roots alive at once; a reader merges the summaries of the registered
//! roots.

use super::keys;
use super::logs;
use super::shared;
use super::wasm_host::Host;
use crate::in_flight::{self, InFlight, Published};
use crate::json;

pub fn publish<H: Host>(host: &H, id: u64, summary: &Published) {
    let key = keys::in_flight(id);
    let written = shared::encode(keys::IN_FLIGHT, summary).and_then(|bytes| {
        host.set(&key, &bytes, None)
            .map_err(shared::SharedError::Write)
    });
    if let Err(e) = written {
        logs::warning!("event=shared_data_error key={key} error=\"{e}\"");
    }
}

/// The summaries of the roots `ids` (one that is missing is left out).
pub fn published<H: Host>(host: &H, ids: impl IntoIterator<Item = u64>) -> Vec<Published> {
    ids.into_iter()
        .filter_map(|id| host.get(&keys::in_flight(id)).ok())
        .filter_map(|(bytes, _)| bytes)
        .filter_map(|bytes| json::from_slice(&bytes).ok())
        .collect()
}

/// The ages of the roots `ids`, merged, as of `now_ms` (a summary that is
/// missing or stale is left out).
pub fn read<H: Host>(host: &H, now_ms: u64, ids: impl IntoIterator<Item = u64>) -> InFlight {
    in_flight::merge(&published(host, ids), now_ms)
}
