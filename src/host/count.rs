//! The active count across every worker of the Envoy, in two parts: HTTP
//! streams (the `traffic` role) and TCP connections (the `traffic_tcp` role,
//! on TCP and TLS-passthrough chains). Each part is one `Counter`, kept by the
//! same rules; `Counts` reads both, and the active count is their sum.
//!
//! Primary: the part's gauge (`drain_gate_active_requests`,
//! `drain_gate_active_connections`). A gauge defined by name is
//! one stat for all worker VMs, +1/-1 is one host call each, and `get_metric`
//! reads the global value. But a `stats_matcher` that excludes the name turns
//! it into a null stat that silently reads 0, so the gauge is used only after
//! a probe proves it live; otherwise the count lives in shared data (CAS),
//! where the stats configuration cannot reach.
//!
//! Host calls are the cost of a wasm filter, so the count leases: a root
//! context adds to the global count in chunks of `LEASE` and keeps what it
//! added (`held`) at least as large as what it really has in flight
//! (`local`). The global count can lead the truth, never trail it. Outside a
//! drain a stream costs no host call at all most of the time, and the tick
//! gives back what is not used; during a drain (and whenever the caller asks
//! for `exact`) every stream end gives back at once, so the count reaches 0
//! exactly when the last stream ends.
//!
//! Every failure errs toward "still active": a stream that could not be
//! counted marks the count unreliable, and an unreliable count never reads 0.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use std::cell::Cell;

use super::metrics::{gauge_is_live, Metrics};

const UNRELIABLE_KEY: &str = "drain_gate.count_unreliable.v1";
/// Set by every traffic root context at configure time. Shared data is per
/// `vm_id`: a health role that cannot see it is not in the traffic role's
/// vm_id, so its count may miss streams and is not trusted to reach 0.
const TRAFFIC_KEY: &str = "drain_gate.traffic_present.v1";
const RETRIES: usize = 64;
/// How much a root context adds to the global count at a time outside a drain.
pub const LEASE: u64 = 8;

/// What a traffic role counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// HTTP streams (HTTP/1.1 requests, HTTP/2 and gRPC streams, websockets).
    Streams,
    /// Downstream connections of a TCP or TLS-passthrough filter chain.
    Connections,
}

impl Part {
    /// The shared-data key of the part's count when its gauge is not live.
    fn shared_key(self) -> &'static str {
        match self {
            Part::Streams => "drain_gate.active.v1",
            Part::Connections => "drain_gate.active_connections.v1",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Gauge(u32),
    SharedData,
}

/// One per root context.
#[derive(Debug)]
pub struct Counter {
    source: Source,
    key: &'static str,
    /// Streams this root context counted and has not yet released.
    local: Cell<u64>,
    /// What this root context has added to the global count: never below `local`.
    held: Cell<u64>,
}

fn shared_read(key: &str) -> Result<(u64, Option<u32>), Status> {
    let (bytes, cas) = hostcalls::get_shared_data(key)?;
    let value = bytes
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(0, u64::from_le_bytes);
    Ok((value, cas))
}

fn shared_add(key: &str, delta: i64) -> bool {
    for _ in 0..RETRIES {
        let Ok((value, cas)) = shared_read(key) else {
            return false;
        };
        // The key is created at configure time (`Counter::new`); a write
        // without a version would overwrite concurrent updates.
        let Some(cas) = cas else {
            return false;
        };
        let next = value.saturating_add_signed(delta);
        match hostcalls::set_shared_data(key, Some(&next.to_le_bytes()), Some(cas)) {
            Ok(()) => return true,
            Err(Status::CasMismatch) => continue,
            Err(_) => return false,
        }
    }
    false
}

impl Counter {
    /// `gauge`: the id of the part's gauge, if the host defined it; it is
    /// used only if it proves live.
    pub fn new(part: Part, gauge: Option<u32>) -> Counter {
        let key = part.shared_key();
        // Shared data has no create-if-absent: the key is created here, on
        // configure, which Envoy runs on the main thread before any worker VM
        // exists (and every later configure finds the key).
        if matches!(shared_read(key), Ok((_, None))) {
            if let Err(e) = hostcalls::set_shared_data(key, Some(&0u64.to_le_bytes()), None) {
                log::error!("event=shared_data_error key={key} status={e:?}");
            }
        }
        let source = match gauge {
            Some(id) if gauge_is_live(id) => Source::Gauge(id),
            _ => {
                log::warn!(
                    "event=count_source part={part:?} source=shared_data why=\"gauge is not live (stats_matcher?)\""
                );
                Source::SharedData
            }
        };
        Counter {
            source,
            key,
            local: Cell::new(0),
            held: Cell::new(0),
        }
    }

    /// Announces a traffic role in this vm_id (see `TRAFFIC_KEY`).
    pub fn announce_traffic() {
        if let Err(e) = hostcalls::set_shared_data(TRAFFIC_KEY, Some(b"1"), None) {
            log::error!("event=shared_data_error key={TRAFFIC_KEY} status={e:?}");
        }
    }

    fn source_name(&self) -> &'static str {
        match self.source {
            Source::Gauge(_) => "gauge",
            Source::SharedData => "shared_data",
        }
    }

    fn add(&self, delta: i64) -> bool {
        match self.source {
            Source::Gauge(id) => hostcalls::increment_metric(id, delta).is_ok(),
            Source::SharedData => shared_add(self.key, delta),
        }
    }

    /// A traffic stream started. Returns whether it was counted; if not, the
    /// count is marked unreliable (the drain waits for its timeout). `exact`
    /// adds just this stream; otherwise a lease of `LEASE` when needed.
    pub fn enter(&self, metrics: &Metrics, exact: bool) -> bool {
        let local = self.local.get() + 1;
        if local > self.held.get() {
            let step = if exact { 1 } else { LEASE };
            if !self.add(step as i64) {
                metrics.count_error();
                log::error!(
                    "event=count_error what=\"stream not counted; drain will wait for drain_timeout\""
                );
                let _ = hostcalls::set_shared_data(UNRELIABLE_KEY, Some(b"1"), None);
                return false;
            }
            self.held.set(self.held.get() + step);
        }
        self.local.set(local);
        true
    }

    /// A counted traffic stream ended. Returns how many streams this root
    /// context still holds: when that is not 0, the global count is not 0
    /// either. `exact` gives back everything not in use at once.
    pub fn exit(&self, exact: bool) -> u64 {
        let left = self.local.get().saturating_sub(1);
        self.local.set(left);
        if exact {
            self.settle();
        }
        left
    }

    /// Streams this root context has in flight.
    pub fn in_flight(&self) -> u64 {
        self.local.get()
    }

    /// Gives back what this root context holds beyond its streams in flight.
    pub fn settle(&self) {
        let excess = self.held.get().saturating_sub(self.local.get());
        if excess == 0 {
            return;
        }
        if self.add(-(excess as i64)) {
            self.held.set(self.local.get());
        } else {
            // Left over-counted: the drain waits longer, never flips early.
            log::error!("event=count_error what=\"count not given back\"");
        }
    }
}

impl Drop for Counter {
    /// The root context is gone (plugin removed or reconfigured) and so are
    /// its streams: give back everything it still holds.
    fn drop(&mut self) {
        let held = self.held.get();
        if held > 0 && self.add(-(held as i64)) {
            self.held.set(0);
        }
    }
}

/// The global count as a role reads it.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    /// HTTP streams plus TCP connections.
    pub active: u64,
    pub streams: u64,
    pub connections: u64,
    pub reliable: bool,
}

impl Reading {
    /// What automatic transitions may act on: an unreliable count is never 0.
    pub fn for_decisions(self) -> u64 {
        if self.reliable {
            self.active
        } else {
            self.active.max(1)
        }
    }
}

impl Counter {
    /// Whether this part reads 0 (one host call; no reliability checks).
    fn reads_zero(&self) -> bool {
        match self.source {
            Source::Gauge(id) => hostcalls::get_metric(id) == Ok(0),
            Source::SharedData => matches!(shared_read(self.key), Ok((0, _))),
        }
    }

    /// This part over every worker; `None` when it cannot be read.
    fn value(&self) -> Option<u64> {
        match self.source {
            Source::Gauge(id) => hostcalls::get_metric(id).ok(),
            Source::SharedData => shared_read(self.key).ok().map(|(v, _)| v),
        }
    }
}

/// Both parts of the count, as every role of a root context holds them: a
/// traffic root counts into its own part and reads the other; the health
/// role only reads.
#[derive(Debug)]
pub struct Counts {
    streams: Counter,
    connections: Counter,
}

impl Counts {
    pub fn new(metrics: &Metrics) -> Counts {
        Counts {
            streams: Counter::new(Part::Streams, metrics.active),
            connections: Counter::new(Part::Connections, metrics.active_connections),
        }
    }

    /// The counter of one part.
    pub fn part(&self, part: Part) -> &Counter {
        match part {
            Part::Streams => &self.streams,
            Part::Connections => &self.connections,
        }
    }

    /// `gauge` or `shared_data` when both parts agree, else `mixed`.
    pub fn source_name(&self) -> &'static str {
        let (s, c) = (self.streams.source_name(), self.connections.source_name());
        if s == c {
            s
        } else {
            "mixed"
        }
    }

    /// Whether the whole count reads 0 (no reliability checks). A part that
    /// was released before this read and the other part read after it: of
    /// two roles ending the last of each part at once, the later sees both.
    pub fn reads_zero(&self) -> bool {
        self.streams.reads_zero() && self.connections.reads_zero()
    }

    /// The count over every worker. A failed read is unreliable, never 0.
    pub fn read(&self) -> Reading {
        let (streams, connections) = (self.streams.value(), self.connections.value());
        let flagged = !matches!(hostcalls::get_shared_data(UNRELIABLE_KEY), Ok((None, _)));
        let traffic_seen = matches!(hostcalls::get_shared_data(TRAFFIC_KEY), Ok((Some(_), _)));
        let streams_n = streams.unwrap_or(0);
        let connections_n = connections.unwrap_or(0);
        Reading {
            active: streams_n.saturating_add(connections_n),
            streams: streams_n,
            connections: connections_n,
            reliable: streams.is_some() && connections.is_some() && !flagged && traffic_seen,
        }
    }
}
