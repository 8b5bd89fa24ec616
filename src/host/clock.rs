//! Reads the two host clocks the pure core's `clock::Now` holds.

use proxy_wasm::hostcalls;
use std::time::UNIX_EPOCH;

use crate::clock::Now;

/// Milliseconds since the Unix epoch from the host's wall clock (0 if it
/// fails, which only delays timed transitions).
pub fn wall_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    /// WASI preview 1. Envoy answers clock 1 (monotonic) from its time
    /// source's `monotonicTime()` (`std::chrono::steady_clock`), the clock
    /// its own timers run on; one clock for every worker of the process.
    fn clock_time_get(id: u32, precision: u64, time: *mut u64) -> u16;
}

/// Milliseconds on the host's monotonic clock, or `None` if the host does not
/// answer. Called directly rather than through `std::time::Instant`, which
/// panics (aborting the VM) when the host refuses the clock.
#[cfg(target_arch = "wasm32")]
pub fn mono_ms() -> Option<u64> {
    const MONOTONIC: u32 = 1;
    let mut nanos: u64 = 0;
    // SAFETY: the host writes one u64 to the pointer it is given, which
    // points at a live local of that type.
    let errno = unsafe { clock_time_get(MONOTONIC, 1_000_000, &mut nanos) };
    (errno == 0).then_some(nanos / 1_000_000)
}

/// Off wasm (host-side unit tests) there is no Envoy clock.
#[cfg(not(target_arch = "wasm32"))]
pub fn mono_ms() -> Option<u64> {
    None
}

/// Both clocks, read together.
pub fn now() -> Now {
    Now {
        wall_ms: wall_ms(),
        mono_ms: mono_ms(),
    }
}
