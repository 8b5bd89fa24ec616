//! What the count, the state record and the registries need from the host:
//! shared data (per `vm_id`, versioned) and gauges (one stat across worker
//! VMs). Behind a trait so that the logic above it — leases, settle,
//! compare-and-swap retries, root drop — runs in `cargo test` against a
//! simulated host with injected failures (`tests/model.rs`).

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

/// Shared data and gauges, as Envoy offers them to a wasm VM.
pub trait Host {
    /// The value and its version; `(None, None)` when the key is absent.
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status>;
    /// Writes if the version still is `cas` (`None`: unconditionally);
    /// `Err(CasMismatch)` when another writer came first.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status>;
    fn gauge_add(&self, id: u32, delta: i64) -> Result<(), Status>;
    fn gauge_get(&self, id: u32) -> Result<u64, Status>;
}

/// The real host.
#[derive(Clone, Copy, Debug, Default)]
pub struct Envoy;

impl Host for Envoy {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
        hostcalls::get_shared_data(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
        hostcalls::set_shared_data(key, Some(value), cas)
    }
    fn gauge_add(&self, id: u32, delta: i64) -> Result<(), Status> {
        hostcalls::increment_metric(id, delta)
    }
    fn gauge_get(&self, id: u32) -> Result<u64, Status> {
        hostcalls::get_metric(id)
    }
}

/// Compare-and-swap retries before an update gives up (only under
/// pathological contention).
pub const RETRIES: usize = 64;

/// What the update function decides for the value it was shown.
pub enum Step<R> {
    /// Write these bytes (if nobody wrote meanwhile) and return `R`.
    Write(Vec<u8>, R),
    /// Write nothing and return `R`.
    Keep(R),
}

/// Why an update did not happen.
#[derive(Debug, PartialEq, Eq)]
pub enum Failed<E> {
    /// The update function refused the value it was shown.
    Refused(E),
    Read(Status),
    Write(Status),
    /// `RETRIES` writers in a row came first.
    Contention,
}

impl<E> Failed<E> {
    /// What the update function refused, or what the host failed at.
    pub fn refused(self) -> Result<E, String> {
        match self {
            Failed::Refused(e) => Ok(e),
            Failed::Read(s) => Err(format!("shared data read failed: {s:?}")),
            Failed::Write(s) => Err(format!("shared data write failed: {s:?}")),
            Failed::Contention => Err("too much contention on shared data".to_string()),
        }
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Failed<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Refused(e) => write!(f, "{e}"),
            Failed::Read(s) => write!(f, "shared data read failed: {s:?}"),
            Failed::Write(s) => write!(f, "shared data write failed: {s:?}"),
            Failed::Contention => write!(f, "too much contention on shared data"),
        }
    }
}

/// The one compare-and-swap loop: reads `key`, lets `f` decide from the
/// current bytes (`None`: absent), writes with the version it read, and
/// starts again when another writer came first. An absent key is written
/// unconditionally (shared data has no create-if-absent; every key is
/// created on configure, which Envoy runs on the main thread first).
pub fn cas_update<H: Host + ?Sized, R, E>(
    host: &H,
    key: &str,
    mut f: impl FnMut(Option<&[u8]>) -> Result<Step<R>, E>,
) -> Result<R, Failed<E>> {
    for _ in 0..RETRIES {
        let (bytes, cas) = host.get(key).map_err(Failed::Read)?;
        match f(bytes.as_deref()).map_err(Failed::Refused)? {
            Step::Keep(r) => return Ok(r),
            Step::Write(next, r) => match host.set(key, &next, cas) {
                Ok(()) => return Ok(r),
                Err(Status::CasMismatch) => continue,
                Err(e) => return Err(Failed::Write(e)),
            },
        }
    }
    Err(Failed::Contention)
}

/// `cas_update` for a JSON value that starts as `T::default()` when absent.
pub fn json_update<H, T, R, E>(
    host: &H,
    key: &str,
    mut f: impl FnMut(&mut T) -> Result<R, E>,
) -> Result<R, Failed<String>>
where
    H: Host + ?Sized,
    T: serde::Serialize + serde::de::DeserializeOwned + Default,
    E: std::fmt::Display,
{
    cas_update(host, key, |bytes| {
        let mut value: T = match bytes {
            Some(b) => serde_json::from_slice(b).map_err(|e| format!("unreadable {key}: {e}"))?,
            None => T::default(),
        };
        let r = f(&mut value).map_err(|e| e.to_string())?;
        let next = serde_json::to_vec(&value).map_err(|e| e.to_string())?;
        Ok(Step::Write(next, r))
    })
}

/// A JSON value, `T::default()` when absent.
pub fn json_read<H, T>(host: &H, key: &str) -> Result<T, String>
where
    H: Host + ?Sized,
    T: serde::de::DeserializeOwned + Default,
{
    match host.get(key) {
        Ok((Some(b), _)) => {
            serde_json::from_slice(&b).map_err(|e| format!("unreadable {key}: {e}"))
        }
        Ok((None, _)) => Ok(T::default()),
        Err(e) => Err(format!("shared data read failed: {e:?}")),
    }
}
