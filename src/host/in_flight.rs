//! Carries each worker's in-flight ages (`crate::in_flight`) through shared
//! data: every traffic root context claims a slot at configure time and its
//! tick publishes its summary there; a reader merges every slot.

use std::convert::Infallible;

use super::keys;
use super::shared::{self, cas_update, Host, Step};
use crate::in_flight::{self, InFlight, Published};

/// Every traffic root context claims a slot (the main thread's, each
/// worker's, again on every reconfiguration); past this many they are reused
/// round-robin. A slot nobody refreshes goes stale and readers leave it out.
const MAX_SLOTS: u32 = 64;

fn claimed_of(bytes: Option<&[u8]>) -> u32 {
    bytes
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, u32::from_le_bytes)
}

/// This root context's slot, or None if shared data refused (its streams then
/// go unreported; the count is not affected).
pub fn claim_slot<H: Host>(host: &H) -> Option<u32> {
    let claimed = cas_update(host, keys::IN_FLIGHT_SLOTS, |bytes| {
        let n = claimed_of(bytes);
        Ok::<_, Infallible>(Step::Write(n.wrapping_add(1).to_le_bytes().to_vec(), n))
    });
    match claimed {
        Ok(n) => Some(n % MAX_SLOTS),
        Err(e) => {
            log::warn!(
                "event=shared_data_error key={} error=\"{e}\"",
                keys::IN_FLIGHT_SLOTS
            );
            None
        }
    }
}

pub fn publish<H: Host>(host: &H, slot: u32, summary: &Published) {
    let key = keys::in_flight(slot);
    let written = shared::encode(&key, summary).and_then(|bytes| {
        host.set(&key, &bytes, None)
            .map_err(shared::SharedError::Write)
    });
    if let Err(e) = written {
        log::warn!("event=shared_data_error key={key} error=\"{e}\"");
    }
}

/// Every worker's ages, merged, as of `now_ms`.
pub fn read<H: Host>(host: &H, now_ms: u64) -> InFlight {
    let slots = host
        .get(keys::IN_FLIGHT_SLOTS)
        .map_or(0, |(b, _)| claimed_of(b.as_deref()))
        .min(MAX_SLOTS);
    let published: Vec<Published> = (0..slots)
        .filter_map(|slot| host.get(&keys::in_flight(slot)).ok())
        .filter_map(|(bytes, _)| bytes)
        .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
        .collect();
    in_flight::merge(&published, now_ms)
}
