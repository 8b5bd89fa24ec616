//! Carries each worker's in-flight ages (`crate::in_flight`) through shared
//! data: every traffic root context claims a slot at configure time and its
//! tick publishes its summary there; a reader merges every slot.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

use crate::in_flight::{self, InFlight, Published};

const SLOTS_KEY: &str = "drain_gate.in_flight.slots.v1";
/// Every traffic root context claims a slot (the main thread's, each
/// worker's, again on every reconfiguration); past this many they are reused
/// round-robin. A slot nobody refreshes goes stale and readers leave it out.
const MAX_SLOTS: u32 = 64;
const RETRIES: usize = 64;

fn slot_key(slot: u32) -> String {
    format!("drain_gate.in_flight.v1.{slot}")
}

fn claimed() -> Result<(u32, Option<u32>), Status> {
    let (bytes, cas) = hostcalls::get_shared_data(SLOTS_KEY)?;
    let n = bytes
        .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
        .map_or(0, u32::from_le_bytes);
    Ok((n, cas))
}

/// This root context's slot, or None if shared data refused (its streams then
/// go unreported; the count is not affected).
pub fn claim_slot() -> Option<u32> {
    for _ in 0..RETRIES {
        // No version yet: the first claim creates the key. Configure runs on
        // the main thread before any worker VM exists, so nothing races it.
        let (n, cas) = claimed().ok()?;
        let next = n.wrapping_add(1);
        match hostcalls::set_shared_data(SLOTS_KEY, Some(&next.to_le_bytes()), cas) {
            Ok(()) => return Some(n % MAX_SLOTS),
            Err(Status::CasMismatch) => continue,
            Err(e) => {
                log::warn!("event=shared_data_error key={SLOTS_KEY} status={e:?}");
                return None;
            }
        }
    }
    None
}

pub fn publish(slot: u32, summary: &Published) {
    let Ok(bytes) = serde_json::to_vec(summary) else {
        return;
    };
    if let Err(e) = hostcalls::set_shared_data(&slot_key(slot), Some(&bytes), None) {
        log::warn!(
            "event=shared_data_error key={} status={e:?}",
            slot_key(slot)
        );
    }
}

/// Every worker's ages, merged, as of `now_ms`.
pub fn read(now_ms: u64) -> InFlight {
    let slots = claimed().map_or(0, |(n, _)| n.min(MAX_SLOTS));
    let published: Vec<Published> = (0..slots)
        .filter_map(|slot| hostcalls::get_shared_data(&slot_key(slot)).ok())
        .filter_map(|(bytes, _)| bytes)
        .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
        .collect();
    in_flight::merge(&published, now_ms)
}
