//! A stand-in host for `cargo test`: shared data with versions, metrics by
//! name, two settable clocks, recorded HTTP calls and local answers — and
//! injected faults (lost compare-and-swap races, failed writes). One `Sim`
//! is one Envoy process: every simulated VM of a test shares it, through
//! `&Sim` (the `Host` the shell is generic over). Built for the host only,
//! never into the wasm module.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use proxy_wasm::types::{MetricType, Status};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use super::wasm_host::Host;
use crate::gate::clock::Now;

/// An HTTP call the shell made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
}

/// A local answer the shell sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The stream it went to (`None`: the stream whose callback ran).
    pub context_id: Option<u32>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A shared-data value and its version.
type Versioned = (Vec<u8>, u32);

#[derive(Default)]
pub struct Sim {
    data: RefCell<HashMap<String, Versioned>>,
    /// Metric definitions: id → name.
    ids: RefCell<Vec<String>>,
    /// Stat values by name (one stat per name, whatever the id).
    values: RefCell<HashMap<String, i64>>,
    /// Names a `stats_matcher` excludes: null stats that read 0.
    pub excluded: RefCell<Vec<String>>,
    /// The next this many versioned writes lose a race (CasMismatch, nothing written).
    pub cas_races: Cell<u32>,
    /// The next read of this key answers what it held before its last write
    /// (absent, if that write created it): a reader that read just before
    /// another writer wrote, and writes only now.
    pub stale_read: RefCell<Option<String>>,
    /// What each key held before its last write.
    before: RefCell<HashMap<String, Option<Versioned>>>,
    /// The next this many writes or metric updates fail outright.
    pub failures: Cell<u32>,
    /// Failures actually returned so far.
    pub failed: Cell<u32>,
    pub wall_ms: Cell<u64>,
    /// `None`: a host without a monotonic clock.
    pub mono_ms: Cell<Option<u64>>,
    pub calls: RefCell<Vec<Call>>,
    /// What `http_call` answers (`Err`: the cluster does not exist).
    pub call_refused: Cell<bool>,
    /// The `:status` of the HTTP call answer being delivered.
    pub call_status: Cell<Option<u16>>,
    /// The names of its other headers.
    pub call_headers: RefCell<Vec<String>>,
    pub answers: RefCell<Vec<Answer>>,
    /// Properties of the stream whose callback runs, by dotted path.
    pub properties: RefCell<HashMap<String, Vec<u8>>>,
    /// Request headers of the stream whose callback runs.
    pub request_headers: RefCell<HashMap<String, String>>,
    /// Response headers the shell set, in order.
    pub response_headers: RefCell<Vec<(String, String)>>,
    /// Streams the shell reset.
    pub resets: Cell<u32>,
    /// The plugin configuration a root context reads on configure.
    pub configuration: RefCell<Vec<u8>>,
    /// The tick period the last configured root context asked for.
    pub tick_period: Cell<Option<Duration>>,
    /// Host calls made so far (what a hot path costs), counted as the ABI
    /// calls Envoy serves: `now` is two (the wall clock and WASI's monotonic
    /// one), an answer on another stream two (`proxy_set_effective_context`
    /// first), as `wasm_host::Envoy` makes them.
    pub host_calls: Cell<u64>,
}

impl Sim {
    /// A host at wall time `wall_ms` with its monotonic clock at 1 s.
    pub fn at(wall_ms: u64) -> Sim {
        let sim = Sim::default();
        sim.wall_ms.set(wall_ms);
        sim.mono_ms.set(Some(1_000));
        sim
    }

    /// Both clocks move on by `ms`.
    pub fn advance(&self, ms: u64) {
        self.wall_ms.set(self.wall_ms.get() + ms);
        self.mono_ms.set(self.mono_ms.get().map(|m| m + ms));
    }

    /// The response flags the next ending stream reports (`response.flags`).
    pub fn set_flags(&self, flags: u64) {
        self.set_property("response.flags", &flags.to_le_bytes());
    }

    /// A property of the stream whose callback runs next, by dotted path
    /// (`response.code_details`, `source.address`).
    pub fn set_property(&self, path: &str, value: &[u8]) {
        self.properties
            .borrow_mut()
            .insert(path.to_string(), value.to_vec());
    }

    /// Both clocks now (what `Host::now` answers).
    pub fn now_of(&self) -> Now {
        Now {
            wall_ms: self.wall_ms.get(),
            mono_ms: self.mono_ms.get(),
        }
    }

    /// The wall clock steps by `ms` (the monotonic clock does not move).
    pub fn step_wall(&self, ms: i64) {
        self.wall_ms
            .set(self.wall_ms.get().saturating_add_signed(ms));
    }

    /// Counts `n` ABI calls.
    fn calls(&self, n: u64) {
        self.host_calls.set(self.host_calls.get() + n);
    }

    fn fail_now(&self) -> bool {
        if self.failures.get() == 0 {
            return false;
        }
        self.failures.set(self.failures.get() - 1);
        self.failed.set(self.failed.get() + 1);
        true
    }

    /// A stat's value by name, as signed (a value below 0 is a bug the
    /// caller asserts on); 0 when never touched.
    pub fn metric(&self, name: &str) -> i64 {
        self.values.borrow().get(name).copied().unwrap_or(0)
    }

    /// How many times a metric was defined (Envoy keeps every definition).
    pub fn definitions(&self) -> usize {
        self.ids.borrow().len()
    }

    /// How many shared-data keys exist.
    pub fn keys(&self) -> usize {
        self.data.borrow().len()
    }

    /// The raw bytes under `key`.
    pub fn value(&self, key: &str) -> Option<Vec<u8>> {
        self.data.borrow().get(key).map(|(v, _)| v.clone())
    }

    /// Writes `key` behind every simulated VM's back (what another writer,
    /// or a corrupting one, would leave).
    pub fn put(&self, key: &str, value: &[u8]) {
        let mut data = self.data.borrow_mut();
        let version = data.get(key).map_or(1, |(_, c)| c + 1);
        let before = data.insert(key.to_string(), (value.to_vec(), version));
        self.before.borrow_mut().insert(key.to_string(), before);
    }

    /// The next read of `key` answers what it held before its last write.
    pub fn read_stale(&self, key: &str) {
        *self.stale_read.borrow_mut() = Some(key.to_string());
    }

    fn name_of(&self, id: u32) -> Result<String, Status> {
        self.ids
            .borrow()
            .get(id as usize)
            .cloned()
            .ok_or(Status::NotFound)
    }

    fn is_null(&self, name: &str) -> bool {
        self.excluded.borrow().iter().any(|n| n == name)
    }
}

fn owned(headers: &[(&str, &str)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

impl Host for &Sim {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
        self.calls(1);
        let stale = self.stale_read.borrow().as_deref() == Some(key);
        let value = if stale {
            self.stale_read.borrow_mut().take();
            self.before.borrow().get(key).cloned().flatten()
        } else {
            self.data.borrow().get(key).cloned()
        };
        Ok(match value {
            Some((v, cas)) => (Some(v), Some(cas)),
            None => (None, None),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
        self.calls(1);
        if self.fail_now() {
            return Err(Status::InternalFailure);
        }
        let mut data = self.data.borrow_mut();
        let current = data.get(key).map(|(_, c)| *c);
        if let Some(want) = cas {
            if self.cas_races.get() > 0 {
                self.cas_races.set(self.cas_races.get() - 1);
                return Err(Status::CasMismatch);
            }
            if current != Some(want) {
                return Err(Status::CasMismatch);
            }
        }
        let before = data.insert(key.to_string(), (value.to_vec(), current.unwrap_or(0) + 1));
        self.before.borrow_mut().insert(key.to_string(), before);
        Ok(())
    }

    fn define_metric(&self, _kind: MetricType, name: &str) -> Result<u32, Status> {
        self.calls(1);
        let mut ids = self.ids.borrow_mut();
        ids.push(name.to_string());
        u32::try_from(ids.len() - 1).map_err(|_| Status::InternalFailure)
    }

    fn metric_add(&self, id: u32, delta: i64) -> Result<(), Status> {
        self.calls(1);
        let name = self.name_of(id)?;
        if self.fail_now() {
            return Err(Status::InternalFailure);
        }
        if !self.is_null(&name) {
            *self.values.borrow_mut().entry(name).or_default() += delta;
        }
        Ok(())
    }

    fn metric_get(&self, id: u32) -> Result<u64, Status> {
        self.calls(1);
        let name = self.name_of(id)?;
        // Envoy's gauges are u64: a value below 0 reads wrapped.
        Ok(self.metric(&name) as u64)
    }

    fn metric_record(&self, id: u32, value: u64) -> Result<(), Status> {
        self.calls(1);
        let name = self.name_of(id)?;
        if !self.is_null(&name) {
            self.values.borrow_mut().insert(name, value as i64);
        }
        Ok(())
    }

    fn now(&self) -> Now {
        // proxy_get_current_time_nanoseconds, then WASI clock_time_get.
        self.calls(2);
        self.now_of()
    }

    fn http_call(&self, cluster: &str, [m, p, a]: [&str; 3], _: Duration) -> Result<u32, Status> {
        self.calls(1);
        if self.call_refused.get() {
            return Err(Status::BadArgument);
        }
        let mut calls = self.calls.borrow_mut();
        let token = u32::try_from(calls.len() + 1).map_err(|_| Status::InternalFailure)?;
        calls.push(Call {
            token,
            cluster: cluster.to_string(),
            headers: owned(&[(":method", m), (":path", p), (":authority", a)]),
        });
        Ok(token)
    }

    fn http_call_status(&self) -> Option<u16> {
        self.calls(1);
        self.call_status.get()
    }

    fn http_call_has_header(&self, name: &str) -> bool {
        self.calls(1);
        self.call_headers.borrow().iter().any(|h| h == name)
    }

    fn property(&self, path: &str) -> Option<Vec<u8>> {
        self.calls(1);
        self.properties
            .borrow()
            .get(&path.replace('\0', "."))
            .cloned()
    }

    fn respond(
        &self,
        context_id: Option<u32>,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), Status> {
        // On another stream: proxy_set_effective_context, then the answer.
        self.calls(if context_id.is_some() { 2 } else { 1 });
        self.answers.borrow_mut().push(Answer {
            context_id,
            status,
            headers: owned(headers),
            body: body.to_vec(),
        });
        Ok(())
    }

    fn request_header(&self, name: &str) -> Option<String> {
        self.host_calls.set(self.host_calls.get() + 1);
        self.request_headers.borrow().get(name).cloned()
    }

    fn set_response_header(&self, name: &str, value: &str) -> Result<(), Status> {
        self.host_calls.set(self.host_calls.get() + 1);
        self.response_headers
            .borrow_mut()
            .push((name.to_string(), value.to_string()));
        Ok(())
    }

    fn reset_stream(&self) -> Result<(), Status> {
        self.host_calls.set(self.host_calls.get() + 1);
        self.resets.set(self.resets.get() + 1);
        Ok(())
    }

    fn configuration(&self) -> Result<Option<Vec<u8>>, Status> {
        self.calls(1);
        let bytes = self.configuration.borrow().clone();
        Ok((!bytes.is_empty()).then_some(bytes))
    }

    fn set_tick_period(&self, period: Duration) -> Result<(), Status> {
        self.calls(1);
        self.tick_period.set(Some(period));
        Ok(())
    }
}

/// The SDK's host-call imports, so that a test binary links: the stream
/// contexts a root context hands out (`Box<dyn HttpContext>`) carry every
/// default method of the SDK's traits, which name them. The shell never calls
/// them (every host call goes through `Host`, here the `Sim`): each aborts.
#[cfg(test)]
mod abi {
    macro_rules! absent {
        ($($name:ident),* $(,)?) => {
            $(
                #[no_mangle]
                extern "C" fn $name() -> u32 {
                    std::process::abort()
                }
            )*
        };
    }

    absent!(
        proxy_add_header_map_value,
        proxy_call_foreign_function,
        proxy_close_stream,
        proxy_continue_stream,
        proxy_dequeue_shared_queue,
        proxy_done,
        proxy_enqueue_shared_queue,
        proxy_get_buffer_bytes,
        proxy_get_current_time_nanoseconds,
        proxy_get_header_map_pairs,
        proxy_get_header_map_value,
        proxy_get_property,
        proxy_get_shared_data,
        proxy_get_status,
        proxy_grpc_call,
        proxy_grpc_cancel,
        proxy_grpc_close,
        proxy_grpc_send,
        proxy_grpc_stream,
        proxy_http_call,
        proxy_register_shared_queue,
        proxy_remove_header_map_value,
        proxy_replace_header_map_value,
        proxy_resolve_shared_queue,
        proxy_send_local_response,
        proxy_set_buffer_bytes,
        proxy_set_header_map_pairs,
        proxy_set_property,
        proxy_set_shared_data,
    );
}
