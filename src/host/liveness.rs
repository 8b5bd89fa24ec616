//! Traffic-role liveness in shared data (the decisions are `crate::liveness`).
//!
//! A traffic root registers ([`Heartbeat::beat`], first tick), writes its beat from
//! every tick to its own key (one unconditional write of 8 bytes, nothing
//! per stream), and unregisters when removed cleanly. A health root
//! ([`Watch`]) moves silent roots to `lost` on its tick and turns the
//! registry into a verdict.

use std::cell::Cell;

use super::count;
use super::keys;
use super::metrics::Metrics;
use super::shared::{self, json_read, json_update, Envoy, Host, SharedError};
use crate::liveness::{Lost, Registry, Verdict, Why};

/// The clock registrations and beats are written on: the host's monotonic
/// clock (one for every worker of the process; no wall-clock step moves it,
/// so a step can neither fake a dead root nor hide one), else the wall clock.
fn now_ms<H: Host>(host: &H) -> u64 {
    host.now().timer_ms()
}

fn read_beat<H: Host>(host: &H, id: u64) -> Option<u64> {
    shared::read_u64(host, &keys::beat(id)).ok().flatten()
}

/// Creates the registry if absent (configure runs on the main thread before
/// any worker VM, so this cannot race another creator).
pub fn ensure_registry<H: Host>(host: &H) {
    let created = shared::encode(keys::REGISTRY, &Registry::default())
        .and_then(|bytes| shared::create(host, keys::REGISTRY, &bytes));
    if let Err(e) = created {
        log::error!(
            "event=shared_data_error key={} error=\"{e}\"",
            keys::REGISTRY
        );
    }
}

/// One per traffic root context. It registers on its first tick, not on
/// configure: Envoy also configures the plugin once in the main thread's
/// base VM to validate it, and that root context never ticks and is never
/// removed — registered, it would look like a failed VM.
#[derive(Debug)]
pub struct Heartbeat<H: Host = Envoy> {
    host: H,
    tick_ms: u64,
    id: Cell<Option<u64>>,
    /// Set by a goodbye: never register again.
    done: Cell<bool>,
}

impl<H: Host> Heartbeat<H> {
    pub fn new(host: H, tick_ms: u64) -> Heartbeat<H> {
        Heartbeat {
            host,
            tick_ms,
            id: Cell::new(None),
            done: Cell::new(false),
        }
    }

    /// From the tick: registers (first tick, or retried until it works),
    /// then says this root is alive.
    pub fn beat(&self) {
        if self.done.get() {
            return;
        }
        let id = match self.id.get() {
            Some(id) => id,
            None => match self.register() {
                Some(id) => id,
                None => return,
            },
        };
        let _ = self
            .host
            .set(&keys::beat(id), &now_ms(&self.host).to_le_bytes(), None);
    }

    fn register(&self) -> Option<u64> {
        let now = now_ms(&self.host);
        let tick_ms = self.tick_ms;
        match json_update(&self.host, keys::REGISTRY, |r: &mut Registry| {
            Ok::<_, SharedError>(r.announce(tick_ms, now))
        }) {
            Ok(id) => {
                log::info!("event=traffic_role_registered id={id}");
                self.id.set(Some(id));
                Some(id)
            }
            Err(e) => {
                log::error!("event=traffic_role_unregistered error=\"{e}\"");
                None
            }
        }
    }

    /// Leaves the registry (root removed cleanly). Idempotent.
    pub fn goodbye(&self) {
        self.done.set(true);
        let Some(id) = self.id.take() else { return };
        let now = now_ms(&self.host);
        match json_update(&self.host, keys::REGISTRY, |r: &mut Registry| {
            Ok::<_, SharedError>(r.goodbye(id, now))
        }) {
            Ok(_) => log::info!("event=traffic_role_unregistered id={id} why=goodbye"),
            Err(e) => log::error!("event=traffic_role_goodbye_failed id={id} error=\"{e}\""),
        }
        let _ = self.host.set(&keys::beat(id), &[], None);
    }
}

impl<H: Host> Drop for Heartbeat<H> {
    fn drop(&mut self) {
        self.goodbye();
    }
}

/// One per health root context.
#[derive(Debug)]
pub struct Watch<H: Host = Envoy> {
    host: H,
    /// Once a traffic root was seen, it stays seen: no read per check.
    seen: Cell<bool>,
}

impl<H: Host> Watch<H> {
    pub fn new(host: H) -> Watch<H> {
        Watch {
            host,
            seen: Cell::new(false),
        }
    }

    /// Whether the gateway may be announced (a traffic root has registered).
    pub fn seen(&self) -> bool {
        if !self.seen.get() {
            let seen = json_read::<_, Registry>(&self.host, keys::REGISTRY).is_ok_and(|r| r.seen);
            self.seen.set(seen);
        }
        self.seen.get()
    }

    /// From the health tick: moves silent roots to `lost`, marks the count
    /// unreliable when a root was lost or every root is gone.
    pub fn tick(&self, metrics: &Metrics<H>) {
        let now = now_ms(&self.host);
        let Ok(reg) = json_read::<_, Registry>(&self.host, keys::REGISTRY) else {
            return;
        };
        self.seen.set(self.seen.get() || reg.seen);
        let dead = reg.stale(now, |id| read_beat(&self.host, id));
        let mut lost_now = false;
        if !dead.is_empty() {
            let moved = json_update(&self.host, keys::REGISTRY, |r: &mut Registry| {
                Ok::<_, SharedError>(r.mark_lost(&dead))
            });
            for l in moved.unwrap_or_default() {
                self.report_lost(&l, metrics);
                lost_now = true;
            }
        }
        // Every tick while it holds (one read once marked): a mark whose write
        // failed is written by a later tick.
        let why = reg.verdict(now).unreliable;
        if let Some(why) = why.or(lost_now.then_some(Why::TrafficRoleLost)) {
            count::mark_unreliable(why, metrics);
        }
    }

    /// The registry now (for `/drain/status`).
    pub fn snapshot(&self) -> (Registry, Verdict) {
        let reg = json_read::<_, Registry>(&self.host, keys::REGISTRY).unwrap_or_default();
        let v = reg.verdict(now_ms(&self.host));
        (reg, v)
    }

    fn report_lost(&self, l: &Lost, metrics: &Metrics<H>) {
        log::error!(
            "event=traffic_role_lost id={} last_beat_ms={} what=\"a traffic VM stopped without a goodbye; the count is unreliable, a drain closes at drain_timeout\"",
            l.id,
            l.last_beat_ms
        );
        metrics.traffic_role_lost();
        let _ = self.host.set(&keys::beat(l.id), &[], None);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::host::count::{Counter, Counts, Part, Source};
    use crate::host::sim::Sim;

    fn reading(sim: &Sim) -> count::Reading {
        let part = |p| Counter::with_host(sim, p, Source::SharedData);
        Counts::of(part(Part::Streams), part(Part::Connections)).read()
    }

    fn process(sim: &Sim) -> (Watch<&Sim>, Metrics<&Sim>) {
        count::create_shared(&sim);
        count::announce_traffic(&sim);
        ensure_registry(&sim);
        (Watch::new(sim), Metrics::define(sim))
    }

    #[test]
    fn a_root_that_says_goodbye_marks_nothing() {
        let sim = Sim::at(1_000);
        let (watch, metrics) = process(&sim);
        let old = Heartbeat::new(&sim, 100);
        old.beat();
        let new = Heartbeat::new(&sim, 100);
        new.beat();
        assert!(watch.seen());
        drop(old); // removed cleanly (LDS update)
        for _ in 0..50 {
            sim.advance(100);
            new.beat();
            watch.tick(&metrics);
        }
        assert!(reading(&sim).reliable);
        assert_eq!(watch.snapshot().0.roots.len(), 1);
    }

    #[test]
    fn a_root_that_stops_beating_is_lost_and_the_count_unreliable() {
        let sim = Sim::at(1_000);
        let (watch, metrics) = process(&sim);
        let dead = Heartbeat::new(&sim, 100);
        dead.beat();
        std::mem::forget(dead); // a trapped VM runs nothing, not even Drop
        for _ in 0..20 {
            sim.advance(100);
            watch.tick(&metrics);
        }
        assert!(reading(&sim).reliable, "2 s is not yet stale");
        sim.advance(100);
        watch.tick(&metrics);
        let r = reading(&sim);
        assert!(!r.reliable && r.for_decisions() >= 1);
        assert_eq!(r.why, Some(Why::TrafficRoleLost));
        assert_eq!(sim.metric(crate::metric_names::TRAFFIC_ROLES_LOST), 1);
        assert_eq!(watch.snapshot().0.lost_total, 1);
    }

    #[test]
    fn every_root_gone_without_a_replacement_is_unreliable() {
        let sim = Sim::at(1_000);
        let (watch, metrics) = process(&sim);
        let only = Heartbeat::new(&sim, 100);
        only.beat();
        only.goodbye();
        for _ in 0..21 {
            sim.advance(100);
            watch.tick(&metrics);
        }
        assert_eq!(reading(&sim).why, Some(Why::TrafficRoleGone));
    }
}
