//! Carries the stream durations (`crate::instruments::sizing`) from each
//! traffic root to the process and to Prometheus: a stream's end adds to the
//! root's pending ones (no host call); the tick adds those to
//! `keys::DURATIONS` (one compare-and-swap) and to the bucket counters.
//!
//! The counters, per kind: `drain_gate_<kind>_duration_ms_bucket` for each `le`
//! of `EXPORT_LE_MS` and `+Inf` (its bound in the name as Istio's tag
//! extraction reads it: `le=.=250;.;drain_gate_stream_duration_ms_bucket`,
//! `extraStatTags: [le]`), `…_count` and `…_sum`: a histogram every worker and
//! pod sums into, one host call per bucket that moved per tick (an Envoy
//! histogram would take one per sample).

use std::cell::{Cell, RefCell};

use crate::host::keys::DURATIONS;
use crate::host::metrics::Ids;
use crate::host::shared::{self, cas_update, Decision, SharedError};
use crate::host::wasm_host::Host;
use crate::instruments::sizing::{Durations, Kind, Pending, BYTES};

/// The durations of every traffic root of this process since it started.
pub fn read<H: Host>(host: &H) -> Durations {
    let (bytes, _) = host.get(DURATIONS).unwrap_or_default();
    Durations::from_bytes(&bytes.unwrap_or_default()).unwrap_or_default()
}

/// One traffic root's durations since its last tick, and its counters.
#[derive(Debug)]
pub struct Book<H: Host> {
    host: H,
    pending: RefCell<Pending>,
    /// Per kind (`Kind::ALL`'s order), the streams that ended in the tick
    /// they started in (0 ms: most), counted here and added to `pending` by
    /// the tick.
    instant: [Cell<u64>; 3],
    ids: Ids,
}

impl<H: Host> Book<H> {
    /// `ids`: the counters' (`define`).
    pub fn new(host: H, tick_ms: u64, ids: Ids) -> Book<H> {
        Book {
            host,
            pending: RefCell::new(Pending::new(tick_ms)),
            instant: Default::default(),
            ids,
        }
    }

    /// A stream of `kind` ended after `ms`.
    pub fn record(&self, kind: Kind, ms: u64) {
        if let (0, Some(n)) = (ms, self.instant.get(kind as usize)) {
            n.set(n.get().wrapping_add(1));
        } else if let Ok(mut d) = self.pending.try_borrow_mut() {
            d.record(kind, ms);
        }
    }

    /// Adds what ended since the last tick to the process's durations and to
    /// the counters. Kept pending if the shared write fails (retried next tick).
    pub fn tick(&self) {
        let Ok(mut book) = self.pending.try_borrow_mut() else {
            return;
        };
        for (n, kind) in self.instant.iter().zip(Kind::ALL) {
            book.record_instant(kind, n.take());
        }
        if book.is_empty() {
            return;
        }
        let pending = book.take();
        let merged = cas_update(&self.host, DURATIONS, |bytes, _| {
            // Absent or not this form (never expected): starts again from these.
            let total = bytes.filter(|b| b.len() == BYTES);
            let mut total = total.map_or_else(|| vec![0; BYTES], <[u8]>::to_vec);
            pending.add_into(&mut total);
            Ok::<_, SharedError>(Decision::Write(total, ()))
        });
        if shared::logged(log::Level::Warn, DURATIONS, merged).is_none() {
            book.long.merge(&pending); // kept for the next tick
            return;
        }
        for (row, h) in self.ids.iter().zip(&pending.0) {
            if h.count == 0 {
                continue;
            }
            let cumulative = h.cumulative();
            let values = cumulative.into_iter().chain([h.count, h.count, h.sum_ms]);
            for (id, v) in row.iter().zip(values) {
                if let (Some(id), true) = (id, v > 0) {
                    let _ = self.host.metric_add(*id, v.try_into().unwrap_or(i64::MAX));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::config::Shared;
    use crate::gate::count::Part;
    use crate::host::metrics::Metrics;
    use crate::host::sim::Sim;
    use crate::host::traffic::{Traffic, TrafficStream};
    use std::rc::Rc;

    #[test]
    fn the_counters_are_defined_once_per_vm_not_per_root() {
        let sim = Sim::at(0);
        let metrics = Metrics::define(&sim);
        let defined = sim.definitions();
        let config = Shared::default();
        for part in [Part::Streams, Part::Connections, Part::Streams] {
            drop(Traffic::new(part, metrics, &config));
        }
        assert_eq!(
            sim.definitions(),
            defined,
            "a reconfiguration defines nothing new"
        );
        assert!(metrics.durations.iter().flatten().all(Option::is_some));
    }

    fn traffic(sim: &Sim, part: Part) -> Rc<Traffic<&Sim>> {
        crate::host::root::create_shared(sim);
        let config = Shared::default();
        Rc::new(Traffic::new(part, Metrics::define(sim), &config))
    }

    #[test]
    fn streams_are_timed_on_tick_boundaries_and_flushed_once_a_tick() {
        let sim = Sim::at(1_000_000);
        let t = traffic(&sim, Part::Streams);
        t.tick();
        let short: Vec<_> = (0..3).map(|_| TrafficStream::new(t.clone())).collect();
        let long = TrafficStream::new(t.clone());
        for _ in 0..3 {
            sim.advance(100);
            t.tick();
        }
        let calls = sim.host_calls.get();
        drop(short);
        assert_eq!(
            sim.host_calls.get(),
            calls,
            "a stream's end makes no host call"
        );
        for _ in 0..17 {
            sim.advance(100);
            t.tick();
        }
        let mut long = long;
        sim.request_headers
            .borrow_mut()
            .insert("upgrade".into(), "websocket".into());
        long.log();
        drop(long);
        assert_eq!(
            read(&&sim).kind(Kind::Upgraded).count,
            0,
            "not before the tick"
        );
        sim.advance(100);
        t.tick();
        let d = read(&&sim);
        let (http, upgraded) = (d.kind(Kind::Http), d.kind(Kind::Upgraded));
        assert_eq!((http.count, http.max_ms), (3, 300));
        assert_eq!((upgraded.count, upgraded.max_ms), (1, 2_000));
        let m = |n: &str| sim.metric(n);
        assert_eq!(m("drain_gate_stream_duration_ms_count"), 3);
        assert_eq!(m("drain_gate_stream_duration_ms_sum"), 900);
        assert_eq!(m("le=.=250;.;drain_gate_stream_duration_ms_bucket"), 0);
        assert_eq!(m("le=.=500;.;drain_gate_stream_duration_ms_bucket"), 3);
        assert_eq!(m("le=.=+Inf;.;drain_gate_upgraded_duration_ms_bucket"), 1);
        assert_eq!(m("le=.=1000;.;drain_gate_upgraded_duration_ms_bucket"), 0);
        let calls = sim.host_calls.get();
        sim.advance(100);
        t.tick();
        let tcp = traffic(&sim, Part::Connections);
        drop(TrafficStream::new(tcp.clone()));
        tcp.tick();
        assert_eq!(
            read(&&sim).kind(Kind::Tcp).count,
            1,
            "merged with what was there"
        );
        assert_eq!(read(&&sim).kind(Kind::Http).count, 3);
        assert!(sim.host_calls.get() > calls);
    }
}
