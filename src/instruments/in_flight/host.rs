//! Carries each worker's in-flight ages (`crate::instruments::in_flight`) through shared
//! data: every traffic root context publishes its summary from its tick
//! under its registry id (`keys::in_flight`) when it changed, so the keys are
//! as many as the roots alive at once; a reader merges the summaries of the
//! registered roots, each as fresh as its root's beat.

use crate::host::keys;
use crate::host::logs;
use crate::host::shared;
use crate::host::wasm_host::Host;
use crate::instruments::in_flight::{self, InFlight, Published};

/// Writes `summary` under `id`; `true` when it was written.
pub fn publish<H: Host>(host: &H, id: u64, summary: &Published) -> bool {
    let key = keys::in_flight(id);
    host.set(&key, &summary.to_bytes(), None)
        .inspect_err(|e| logs::warning!("event=shared_data_error key={key} status={e:?}"))
        .is_ok()
}

/// The summaries of the roots `ids` (one that is missing is left out). A
/// root writes its summary only when it changed, and beats every tick: its
/// summary is as fresh as its beat.
pub fn published<H: Host>(host: &H, ids: impl IntoIterator<Item = u64>) -> Vec<Published> {
    ids.into_iter()
        .filter_map(|id| {
            let (bytes, _) = host.get(&keys::in_flight(id)).ok()?;
            let p = Published::from_bytes(&bytes?)?;
            let beat = shared::read_u64(host, &keys::beat(id)).ok().flatten();
            Some(Published {
                at_ms: beat.map_or(p.at_ms, |b| b.max(p.at_ms)),
                ..p
            })
        })
        .collect()
}

/// The ages of the roots `ids`, merged, as of `now_ms` (a summary that is
/// missing or stale is left out).
pub fn read<H: Host>(host: &H, now_ms: u64, ids: impl IntoIterator<Item = u64>) -> InFlight {
    in_flight::merge(&published(host, ids), now_ms)
}
