//! The host shell: translates between proxy-wasm and the pure core. Nothing
//! here decides anything the core can decide.

pub mod count;
pub mod health;
pub mod metrics;
pub mod root;
pub mod rotation;
pub mod store;
pub mod traffic;

use proxy_wasm::hostcalls;
use std::time::UNIX_EPOCH;

/// Milliseconds since the Unix epoch from the host clock (0 if it fails,
/// which only delays timed transitions).
pub fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
