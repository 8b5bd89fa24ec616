//! The active count across every worker of the Envoy: HTTP streams (the
//! `traffic` role) plus TCP connections (`traffic_tcp`, on TCP and
//! TLS-passthrough chains), one `PartCounter` each, kept by the same rules and
//! read together by `ActiveCount`.
//!
//! A part lives in its gauge (`drain_gate_active_requests`,
//! `drain_gate_active_connections`: one stat for every worker VM, +1/-1 one
//! host call) once a probe proved it live: a `stats_matcher` that excludes the
//! name makes it a null stat that reads 0, and then the part lives in shared
//! data (CAS), out of the stats configuration's reach.
//!
//! Host calls are a wasm filter's cost, so a root context leases: it adds to
//! the global count `LEASE` at a time and keeps what it added (`held`) at
//! least what it has in flight (`local`): the count can lead the truth, never
//! trail it. Outside a drain most streams make no host call and the tick gives
//! back what is unused; during a drain (`exact`) every end gives back at once,
//! so the count reaches 0 when the last stream ends.
//!
//! Every failure errs toward "still active": a stream that could not be
//! counted is counted in `keys::UNCOUNTED` until it ends, and while that is
//! above 0, or the liveness verdict (`keys::VERDICT`, the health role's watch
//! writes it) names a reason, the count is unreliable and never reads 0.

use std::cell::Cell;

use crate::gate::liveness::Unreliable;
use crate::host::keys::{ACTIVE_CONNECTIONS, ACTIVE_STREAMS, TRAFFIC_PRESENT, UNCOUNTED, VERDICT};
use crate::host::logs;
use crate::host::metrics::{Id, Metrics};
use crate::host::shared::{self, cas_update, Decision, SharedError};
use crate::host::wasm_host::{Envoy, Host};
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

/// One per root context. `H` is the host (`Envoy`; a simulated one in
/// `tests/model.rs`).
#[derive(Debug)]
pub struct PartCounter<H: Host = Envoy> {
    host: H,
    /// The part's live gauge; `None`: the part lives in shared data, at `key`.
    gauge: Option<u32>,
    key: &'static str,
    /// Streams this root context counted and has not yet released.
    local: Cell<u64>,
    /// What this root context has added to the global count: never below `local`.
    held: Cell<u64>,
    /// Streams in flight here that could not be counted and are not yet in
    /// `keys::UNCOUNTED` (its write failed too): retried on every `admit` and
    /// `settle` (tick); meanwhile this root's own reads are unreliable.
    owed: Cell<u64>,
    /// Uncounted streams that ended but whose -1 in `keys::UNCOUNTED` could
    /// not be written yet (retried the same way).
    owed_release: Cell<u64>,
}

/// Creates the count's shared keys if absent: both parts, the uncounted
/// streams and the liveness verdict (generation 0, no reason), all 0. Shared
/// data has no create-if-absent, and two workers' first, unversioned writes of
/// a key could lose one update (for `keys::UNCOUNTED`, a stream in flight).
/// Configure runs this on the main thread before any worker VM exists, so
/// every later write is versioned.
pub fn create_shared<H: Host>(host: &H) {
    for key in [ACTIVE_STREAMS, ACTIVE_CONNECTIONS, UNCOUNTED, VERDICT] {
        shared::ensure(host, key, &0u64.to_le_bytes());
    }
}

/// Announces a traffic role in this vm_id (`keys::TRAFFIC_PRESENT`): until a
/// health role sees it, the count is not trusted (`crate::gate::liveness`).
pub fn announce_traffic<H: Host>(host: &H) {
    if let Err(e) = host.set(TRAFFIC_PRESENT, b"1", None) {
        logs::error!("event=shared_data_error key={TRAFFIC_PRESENT} status={e:?}");
    }
}

impl<H: Host> PartCounter<H> {
    /// `gauge`: the id of the part's gauge, if the host defined it and it
    /// proved live (`Metrics`); otherwise the part lives in shared data.
    pub fn new(host: H, part: Part, gauge: Option<u32>) -> PartCounter<H> {
        create_shared(&host);
        if gauge.is_none() {
            logs::warning!(
                "event=count_source part={part:?} source=shared_data why=\"gauge is not live (stats_matcher?)\""
            );
        }
        PartCounter {
            host,
            gauge,
            key: match part {
                Part::Streams => ACTIVE_STREAMS,
                Part::Connections => ACTIVE_CONNECTIONS,
            },
            local: Cell::new(0),
            held: Cell::new(0),
            owed: Cell::new(0),
            owed_release: Cell::new(0),
        }
    }

    fn add(&self, delta: i64) -> bool {
        match self.gauge {
            Some(id) => self.host.metric_add(id, delta).is_ok(),
            None => change(&self.host, self.key, |v| v.saturating_add_signed(delta)),
        }
    }

    /// A traffic stream started. Returns whether it was counted; if not, it
    /// is counted as uncounted (`keys::UNCOUNTED`) until the caller reports
    /// its end with `uncounted_ended`, and the caller logs it
    /// (`not_counted`). `exact` adds just this stream; otherwise a lease of
    /// `LEASE` when needed.
    pub fn admit(&self, exact: bool) -> bool {
        let local = self.local.get() + 1;
        if local > self.held.get() {
            let step = if exact { 1 } else { LEASE };
            if !self.add(step as i64) {
                self.owed.set(self.owed.get() + 1);
                self.write_owed();
                return false;
            }
            self.held.set(self.held.get() + step);
        }
        self.local.set(local);
        true
    }

    /// An uncounted stream ended: it no longer makes the count unreliable.
    pub fn uncounted_ended(&self) {
        if self.owed.get() > 0 {
            self.owed.set(self.owed.get() - 1); // never published
            return;
        }
        self.owed_release.set(self.owed_release.get() + 1);
        self.write_owed();
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

    /// Writes what this root context owes to `keys::UNCOUNTED`, if anything.
    fn write_owed(&self) {
        let (owed, released) = (self.owed.get(), self.owed_release.get());
        let total = |v: u64| v.saturating_add(owed).saturating_sub(released);
        // Failed: retried from the tick.
        if (owed, released) != (0, 0) && change(&self.host, UNCOUNTED, total) {
            self.owed.set(0);
            self.owed_release.set(0);
        }
    }

    /// Whether this root context has an uncounted stream in flight that the
    /// shared count does not know of yet (its write failed).
    pub fn mark_pending(&self) -> bool {
        self.owed.get() > 0
    }

    /// Gives back what this root context holds beyond its streams in flight
    /// (and retries what it owes to `keys::UNCOUNTED`).
    pub fn settle(&self) {
        self.write_owed();
        let excess = self.held.get().saturating_sub(self.local.get());
        if excess == 0 || self.add(-(excess as i64)) {
            self.held.set(self.local.get());
        } else {
            // Left over-counted: the drain waits longer, never flips early.
            logs::error!("event=count_error what=\"count not given back\"");
        }
    }

    /// This part over every worker (one host call); `None` when it cannot
    /// be read.
    fn value(&self) -> Option<u64> {
        match self.gauge {
            Some(id) => self.host.metric_get(id).ok(),
            None => shared::read_u64(&self.host, self.key).ok().flatten(),
        }
    }
}

/// Changes the count under `key` (compare-and-swap) as `f` makes it;
/// `false`: not written. An absent key (`create_shared` made it) or one that
/// is not a count is a failure: an unversioned write could lose an update.
fn change<H: Host>(host: &H, key: &str, f: impl Fn(u64) -> u64) -> bool {
    cas_update(host, key, |bytes, _| {
        let value = bytes.and_then(shared::u64_of).ok_or(None)?;
        Ok::<_, Option<SharedError>>(Decision::Write(f(value).to_le_bytes().to_vec(), ()))
    })
    .is_ok()
}

/// Both parts of the count, as every role of a root context holds them: a
/// traffic root counts into its own part and reads the other; the health
/// role only reads.
#[derive(Debug)]
pub struct ActiveCount<H: Host = Envoy> {
    streams: PartCounter<H>,
    connections: PartCounter<H>,
    /// `keys::TRAFFIC_PRESENT` was read present: it stays (nothing removes
    /// it), so it is not read again.
    traffic_seen: Cell<bool>,
}

impl<H: Host + Copy> ActiveCount<H> {
    pub fn new(metrics: &Metrics<H>) -> ActiveCount<H> {
        let (m, host) = (metrics, *metrics.host());
        let streams = m.id(Id::ActiveRequests).filter(|_| m.live.active);
        let connections = m
            .id(Id::ActiveConnections)
            .filter(|_| m.live.active_connections);
        ActiveCount {
            streams: PartCounter::new(host, Part::Streams, streams),
            connections: PartCounter::new(host, Part::Connections, connections),
            traffic_seen: Cell::new(false),
        }
    }
}

impl<H: Host> ActiveCount<H> {
    /// The counter of one part.
    pub fn part(&self, part: Part) -> &PartCounter<H> {
        match part {
            Part::Streams => &self.streams,
            Part::Connections => &self.connections,
        }
    }

    /// `gauge` or `shared_data` when both parts agree, else `mixed`.
    pub fn source_name(&self) -> &'static str {
        match (self.streams.gauge, self.connections.gauge) {
            (Some(_), Some(_)) => "gauge",
            (None, None) => "shared_data",
            _ => "mixed",
        }
    }

    /// Whether the whole count reads 0 (no reliability checks). A part that
    /// was released before this read and the other part read after it: of
    /// two roles ending the last of each part at once, the later sees both.
    pub fn reads_zero(&self) -> bool {
        self.streams.value() == Some(0) && self.connections.value() == Some(0)
    }

    /// The count over every worker. A failed read is unreliable, never 0.
    pub fn read(&self) -> CountReading {
        let (streams, connections) = (self.streams.value(), self.connections.value());
        let host = &self.streams.host;
        let uncounted = shared::read_u64(host, UNCOUNTED).map(|v| v.unwrap_or(0));
        let verdict = verdict(host);
        let traffic_seen =
            self.traffic_seen.get() || matches!(host.get(TRAFFIC_PRESENT), Ok((Some(_), _)));
        self.traffic_seen.set(traffic_seen);
        // This root context knows of a stream it did not count even when the
        // shared value could not be written yet.
        let owed = self.streams.mark_pending() || self.connections.mark_pending();
        let why = match (&verdict, &uncounted) {
            (Ok(Some(why)), _) => Some(*why),
            (_, Ok(n)) if *n > 0 => Some(Unreliable::StreamNotCounted),
            _ if owed => Some(Unreliable::StreamNotCounted),
            _ if !traffic_seen => Some(Unreliable::TrafficRoleNotSeen),
            _ => None,
        };
        let read = streams.and(connections).is_some() && verdict.is_ok() && uncounted.is_ok();
        let (s, c) = (streams.unwrap_or(0), connections.unwrap_or(0));
        CountReading {
            active: s.saturating_add(c),
            streams: s,
            connections: c,
            reliable: read && why.is_none(),
            why,
        }
    }
}

impl<H: Host> Drop for PartCounter<H> {
    /// The root context is gone (plugin removed or reconfigured) and so are
    /// its streams: give back everything it still holds.
    fn drop(&mut self) {
        if self.held.get() > 0 {
            self.add(-(self.held.get() as i64));
        }
    }
}

/// The liveness verdict the health role's watch last wrote
/// (`keys::VERDICT`: the registry generation it was judged at, then the
/// reason's name; no reason when empty or absent).
fn verdict<H: Host>(host: &H) -> Result<Option<Unreliable>, ()> {
    let (bytes, _) = host.get(VERDICT).map_err(|_| ())?;
    // Shorter than a generation, or a name drain-gate does not write: not
    // trusted.
    let reason = |n: &[u8]| std::str::from_utf8(n).ok().and_then(Unreliable::from_name);
    Ok(bytes.and_then(|b| match b.get(8..) {
        Some([]) => None,
        name => Some(name.and_then(reason).unwrap_or(Unreliable::TrafficRoleLost)),
    }))
}

/// Writes the verdict judged at registry generation `gen`, unless a verdict
/// of a later generation is already written (two judges never turn a newer
/// verdict back into an older one). Returns whether the reason changed with
/// this write (the caller logs it once).
pub fn write_verdict<H: Host>(host: &H, gen: u64, why: Option<Unreliable>) -> bool {
    let name = why.map_or("", Unreliable::name).as_bytes();
    let mut bytes = gen.to_le_bytes().to_vec();
    bytes.extend_from_slice(name);
    cas_update(host, VERDICT, |current, _| {
        let written = current.unwrap_or_default();
        let newer = written.get(..8).and_then(shared::u64_of) > Some(gen);
        Ok::<_, SharedError>(if newer || written == bytes {
            Decision::Keep(false)
        } else {
            Decision::Write(bytes.clone(), written.get(8..).unwrap_or_default() != name)
        })
    })
    .unwrap_or(false)
}

/// A stream that could not be counted (the counter counts it as uncounted
/// until it ends): counted as an error, logged.
pub fn not_counted<H: Host>(metrics: &Metrics<H>) {
    metrics.add(Id::CountErrors, 1);
    logs::error!(
        "event=count_error what=\"stream not counted; the count is unreliable until it ends\""
    );
    metrics.set(Id::CountUnreliable, true);
}

/// The global count as a role reads it.
#[derive(Clone, Copy, Debug)]
pub struct CountReading {
    /// HTTP streams plus TCP connections.
    pub active: u64,
    pub streams: u64,
    pub connections: u64,
    pub reliable: bool,
    /// Why it is not reliable (`None` when it is, or the read failed).
    pub why: Option<Unreliable>,
}

impl CountReading {
    /// What automatic transitions may act on: an unreliable count is never 0.
    pub fn for_decisions(self) -> u64 {
        self.active.max(u64::from(!self.reliable))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::host::keys;
    use crate::host::sim::Sim;
    use crate::metric_names as names;

    fn process(sim: &Sim) -> Metrics<&Sim> {
        let m = Metrics::define(sim);
        announce_traffic(&sim);
        m
    }

    #[test]
    fn a_live_gauge_counts_and_an_excluded_one_moves_the_count_to_shared_data() {
        let sim = Sim::at(0);
        let live = ActiveCount::new(&process(&sim));
        assert_eq!(live.source_name(), "gauge");
        let sim2 = Sim::at(0);
        sim2.excluded
            .borrow_mut()
            .push(names::ACTIVE_REQUESTS.to_string());
        let moved = ActiveCount::new(&process(&sim2));
        assert_eq!(
            moved.source_name(),
            "mixed",
            "streams in shared data, connections on the gauge"
        );
        let c = moved.part(Part::Streams);
        assert!(c.admit(true));
        assert_eq!(moved.read().streams, 1);
        assert_eq!(
            sim2.metric(names::ACTIVE_REQUESTS),
            0,
            "the null stat never moved"
        );
    }

    #[test]
    fn leases_lead_the_truth_outside_a_drain_and_are_given_back_by_the_tick() {
        let sim = Sim::at(0);
        let counts = ActiveCount::new(&process(&sim));
        let c = counts.part(Part::Streams);
        assert!(c.admit(false) && c.admit(false));
        assert_eq!(counts.read().active, LEASE, "one lease of 8");
        assert_eq!(c.exit(false), 1);
        assert_eq!(
            counts.read().active,
            LEASE,
            "outside a drain: nothing given back yet"
        );
        c.settle();
        assert_eq!(counts.read().active, 1);
        assert_eq!(c.exit(true), 0);
        assert!(counts.reads_zero() && counts.read().reliable);
    }

    #[test]
    fn a_stream_that_could_not_be_counted_is_owed_until_the_mark_is_written() {
        let sim = Sim::at(0);
        let counts = ActiveCount::new(&process(&sim));
        let c = counts.part(Part::Streams);
        sim.failures.set(2); // the gauge update and the mark's write both fail
        assert!(!c.admit(true));
        assert!(c.mark_pending());
        let r = counts.read();
        assert!(
            !r.reliable && r.for_decisions() == 1,
            "this root knows: {r:?}"
        );
        assert_eq!(r.why, Some(Unreliable::StreamNotCounted));
        c.settle(); // the tick writes the mark
        assert!(!c.mark_pending());
        let other = ActiveCount::new(&Metrics::define(&sim));
        assert_eq!(
            other.read().why,
            Some(Unreliable::StreamNotCounted),
            "every reader sees it"
        );
    }

    #[test]
    fn two_workers_whose_first_failed_counts_coincide_both_stay_counted() {
        let sim = Sim::at(0);
        let metrics = process(&sim);
        let (a, b) = (ActiveCount::new(&metrics), ActiveCount::new(&metrics));
        let health = ActiveCount::new(&metrics);
        // Each worker's count fails; the second read the uncounted key
        // before the first wrote it, and writes only now.
        sim.failures.set(1);
        assert!(!a.part(Part::Streams).admit(true));
        sim.failures.set(1);
        sim.read_stale(keys::UNCOUNTED);
        assert!(!b.part(Part::Streams).admit(true));
        assert_eq!(shared::read_u64(&&sim, keys::UNCOUNTED), Ok(Some(2)));
        a.part(Part::Streams).uncounted_ended();
        let r = health.read();
        assert_eq!(
            r.why,
            Some(Unreliable::StreamNotCounted),
            "one is still in flight: {r:?}"
        );
        assert_eq!(r.for_decisions(), 1);
        b.part(Part::Streams).uncounted_ended();
        assert!(health.read().reliable);
    }

    #[test]
    fn no_traffic_role_in_this_vm_id_is_never_a_zero() {
        let sim = Sim::at(0);
        let counts = ActiveCount::new(&Metrics::define(&sim));
        let r = counts.read();
        assert_eq!((r.active, r.reliable), (0, false));
        assert_eq!(r.why, Some(Unreliable::TrafficRoleNotSeen));
        assert_eq!(r.for_decisions(), 1);
    }
}
