//! Every call the shell makes into the host, behind one small trait: Envoy in
//! production ([`Envoy`]), a stand-in in `cargo test` (`host::sim`). Nothing
//! above this trait names `proxy_wasm::hostcalls`, so the logic that talks to
//! shared data, metrics, clocks and held answers — leases, compare-and-swap
//! retries, liveness, the health role's timers — runs without Envoy.

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType, Status};
use std::cell::Cell;
use std::time::{Duration, UNIX_EPOCH};

use crate::gate::clock::Now;

/// What the shell needs from the host.
pub trait Host {
    /// Shared data (per `vm_id`, versioned): the value and its version;
    /// `(None, None)` when the key is absent.
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status>;
    /// Writes if the version still is `cas` (`None`: unconditionally);
    /// `Err(CasMismatch)` when another writer came first.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status>;
    /// Defines a metric by name; every definition of a name is the same stat.
    fn define_metric(&self, kind: MetricType, name: &str) -> Result<u32, Status>;
    fn metric_add(&self, id: u32, delta: i64) -> Result<(), Status>;
    fn metric_get(&self, id: u32) -> Result<u64, Status>;
    fn metric_record(&self, id: u32, value: u64) -> Result<(), Status>;
    /// Both clocks, read together.
    fn now(&self) -> Now;
    /// An HTTP call to `cluster` from the root context — `request`: its method,
    /// path and authority, no body; `wait`: its timeout. The answer comes back
    /// to `on_http_call_response` with the returned token.
    fn http_call(&self, cluster: &str, request: [&str; 3], wait: Duration) -> Result<u32, Status>;
    /// The `:status` of the HTTP call answer being delivered, if it has one.
    fn http_call_status(&self) -> Option<u16>;
    /// Whether the HTTP call answer being delivered has the header `name`.
    fn http_call_has_header(&self, name: &str) -> bool;
    /// A property of the stream or connection whose callback is running
    /// (`None`: absent, or the host refused), by its path as the ABI spells
    /// it: its parts joined by NUL (`"response\0flags"`), so that reading one
    /// allocates nothing but the value.
    fn property(&self, path: &str) -> Option<Vec<u8>>;
    /// Sends a complete local answer on the HTTP stream `context_id` (`None`:
    /// the stream whose callback is running).
    fn respond(
        &self,
        context_id: Option<u32>,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), Status>;
    /// A request header of the HTTP stream whose callback is running (`None`:
    /// absent, not UTF-8, or the host refused).
    fn request_header(&self, name: &str) -> Option<String>;
    /// Sets a response header of the HTTP stream whose callback is running.
    fn set_response_header(&self, name: &str, value: &str) -> Result<(), Status>;
    /// Resets the HTTP stream whose callback is running, with no answer.
    fn reset_stream(&self) -> Result<(), Status>;
    /// The plugin configuration of the root context being configured
    /// (`None`: empty).
    fn configuration(&self) -> Result<Option<Vec<u8>>, Status>;
    /// How often the root context's `on_tick` runs.
    fn set_tick_period(&self, period: Duration) -> Result<(), Status>;
}

/// The real host.
#[derive(Clone, Copy, Debug, Default)]
pub struct Envoy;

thread_local! {
    /// Inside `one_instant`: the clocks as that callback first read them
    /// (`Some(None)`: not read yet).
    static INSTANT: Cell<Option<Option<Now>>> = const { Cell::new(None) };
}

/// Runs `f` at one instant: every `Envoy::now` inside it returns what the
/// first one read (two host calls per callback, however many decisions
/// look at the time — a tick's are of one moment).
pub fn one_instant<R>(f: impl FnOnce() -> R) -> R {
    INSTANT.with(|i| i.set(Some(None)));
    let r = f();
    INSTANT.with(|i| i.set(None));
    r
}

// The host's imports below are declared for every target: off wasm (the
// tests, on `sim`) nothing calls `Envoy`, and the linker drops what uses them.
#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    /// WASI preview 1. Envoy answers clock 1 (monotonic) from its time
    /// source's `monotonicTime()` (`std::chrono::steady_clock`), the clock
    /// its own timers run on; one clock for every worker of the process.
    fn clock_time_get(id: u32, precision: u64, time: *mut u64) -> u16;
}

#[link(wasm_import_module = "env")]
extern "C" {
    /// proxy-wasm ABI 0.2.1: the value is written into memory the host
    /// allocates through the module's `proxy_on_memory_allocate`.
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
}

impl Host for Envoy {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
        hostcalls::get_shared_data(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
        hostcalls::set_shared_data(key, Some(value), cas)
    }

    fn define_metric(&self, kind: MetricType, name: &str) -> Result<u32, Status> {
        hostcalls::define_metric(kind, name)
    }

    fn metric_add(&self, id: u32, delta: i64) -> Result<(), Status> {
        hostcalls::increment_metric(id, delta)
    }

    fn metric_get(&self, id: u32) -> Result<u64, Status> {
        hostcalls::get_metric(id)
    }

    fn metric_record(&self, id: u32, value: u64) -> Result<(), Status> {
        hostcalls::record_metric(id, value)
    }

    fn now(&self) -> Now {
        let held = INSTANT.with(Cell::get);
        if let Some(Some(now)) = held {
            return now;
        }
        // Milliseconds since the Unix epoch from the host's wall clock (0 if
        // it fails, which only delays timed transitions).
        let wall_ms = hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // Milliseconds on the host's monotonic clock (`None`: the host does
        // not answer), read directly rather than through `std::time::Instant`,
        // which panics (aborting the VM) when the host refuses the clock.
        const MONOTONIC: u32 = 1;
        let mut nanos: u64 = 0;
        // SAFETY: the host writes one u64 to the pointer it is given, which
        // points at a live local of that type.
        let errno = unsafe { clock_time_get(MONOTONIC, 1_000_000, &mut nanos) };
        let now = Now {
            wall_ms,
            mono_ms: (errno == 0).then_some(nanos / 1_000_000),
        };
        if held.is_some() {
            INSTANT.with(|i| i.set(Some(Some(now))));
        }
        now
    }

    fn http_call(&self, to: &str, [m, p, a]: [&str; 3], wait: Duration) -> Result<u32, Status> {
        let headers = vec![(":method", m), (":path", p), (":authority", a)];
        hostcalls::dispatch_http_call(to, headers, None, vec![], wait)
    }

    fn http_call_status(&self) -> Option<u16> {
        let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status");
        status.ok()??.parse().ok()
    }

    fn http_call_has_header(&self, name: &str) -> bool {
        hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, name)
            .is_ok_and(|v| v.is_some())
    }

    /// A property by its path, its parts joined by NUL (`None`: absent, or the
    /// host refused).
    /// The status is read as a number: one the SDK does not know cannot abort
    /// the VM.
    fn property(&self, path: &str) -> Option<Vec<u8>> {
        const OK: u32 = 0;
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: the host reads `path` and writes a pointer and a size to two
        // live locals of those types.
        let status = unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) };
        if status != OK || data.is_null() {
            return None;
        }
        // SAFETY: `data` is a `size`-byte allocation the host made through
        // `proxy_on_memory_allocate` (a boxed `[u8]` of that length), handed
        // over to this module: owned by the Vec from here on.
        Some(unsafe { Vec::from_raw_parts(data, size, size) })
    }

    fn respond(
        &self,
        context_id: Option<u32>,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), Status> {
        if let Some(id) = context_id {
            hostcalls::set_effective_context(id)?;
        }
        hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body))
    }

    /// Taken as bytes: the SDK's string form aborts the VM on a value that is
    /// not UTF-8.
    fn request_header(&self, name: &str) -> Option<String> {
        let v = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name);
        String::from_utf8(v.ok()??).ok()
    }

    fn set_response_header(&self, name: &str, value: &str) -> Result<(), Status> {
        hostcalls::set_map_value(MapType::HttpResponseHeaders, name, Some(value))
    }

    fn reset_stream(&self) -> Result<(), Status> {
        hostcalls::reset_http_request()
    }

    fn configuration(&self) -> Result<Option<Vec<u8>>, Status> {
        hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
    }

    fn set_tick_period(&self, period: Duration) -> Result<(), Status> {
        hostcalls::set_tick_period(period)
    }
}
