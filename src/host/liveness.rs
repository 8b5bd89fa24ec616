//! Traffic-role liveness in shared data (the decisions are `crate::liveness`).
//!
//! A traffic root registers ([`Heartbeat::beat`], first tick), writes its beat from
//! every tick to its own key (one unconditional write of 8 bytes, nothing
//! per stream), and unregisters when removed cleanly. A health root
//! ([`Watch`]) moves silent roots to `lost` on its tick and turns the
//! registry into a verdict.

use std::cell::Cell;

use super::clock::mono_ms;
use super::count;
use super::metrics::Metrics;
use super::shared::{json_read, json_update, Envoy, Host};
use super::wall_ms;
use crate::liveness::{Lost, Registry, Verdict, Why};

const REGISTRY_KEY: &str = "drain_gate.traffic.v1";

/// The clock registrations and beats are written on: the host's monotonic
/// clock (one for every worker of the process; no wall-clock step moves it,
/// so a step can neither fake a dead root nor hide one), else the wall clock.
fn now_ms() -> u64 {
    mono_ms().unwrap_or_else(wall_ms)
}

fn beat_key(id: u64) -> String {
    format!("drain_gate.beat.v1.{id}")
}

fn read_beat(id: u64) -> Option<u64> {
    let (bytes, _) = Envoy.get(&beat_key(id)).ok()?;
    let b = <[u8; 8]>::try_from(bytes?.as_slice()).ok()?;
    Some(u64::from_le_bytes(b))
}

/// Creates the registry if absent (configure runs on the main thread before
/// any worker VM, so this cannot race another creator).
pub fn ensure_registry() {
    if matches!(Envoy.get(REGISTRY_KEY), Ok((None, _))) {
        if let Ok(bytes) = serde_json::to_vec(&Registry::default()) {
            if let Err(e) = Envoy.set(REGISTRY_KEY, &bytes, None) {
                log::error!("event=shared_data_error key={REGISTRY_KEY} status={e:?}");
            }
        }
    }
}

/// One per traffic root context. It registers on its first tick, not on
/// configure: Envoy also configures the plugin once in the main thread's
/// base VM to validate it, and that root context never ticks and is never
/// removed — registered, it would look like a failed VM.
#[derive(Debug)]
pub struct Heartbeat {
    tick_ms: u64,
    id: Cell<Option<u64>>,
    /// Set by a goodbye: never register again.
    done: Cell<bool>,
}

impl Heartbeat {
    pub fn new(tick_ms: u64) -> Heartbeat {
        Heartbeat {
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
        let _ = Envoy.set(&beat_key(id), &now_ms().to_le_bytes(), None);
    }

    fn register(&self) -> Option<u64> {
        let now = now_ms();
        let tick_ms = self.tick_ms;
        match json_update(&Envoy, REGISTRY_KEY, |r: &mut Registry| {
            Ok::<_, String>(r.announce(tick_ms, now))
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
        let now = now_ms();
        match json_update(&Envoy, REGISTRY_KEY, |r: &mut Registry| {
            Ok::<_, String>(r.goodbye(id, now))
        }) {
            Ok(_) => log::info!("event=traffic_role_unregistered id={id} why=goodbye"),
            Err(e) => log::error!("event=traffic_role_goodbye_failed id={id} error=\"{e}\""),
        }
        let _ = Envoy.set(&beat_key(id), &[], None);
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.goodbye();
    }
}

/// One per health root context.
#[derive(Debug, Default)]
pub struct Watch {
    /// Once a traffic root was seen, it stays seen: no read per check.
    seen: Cell<bool>,
}

impl Watch {
    /// Whether the gateway may be announced (a traffic root has registered).
    pub fn seen(&self) -> bool {
        if !self.seen.get() {
            let seen = json_read::<_, Registry>(&Envoy, REGISTRY_KEY).is_ok_and(|r| r.seen);
            self.seen.set(seen);
        }
        self.seen.get()
    }

    /// From the health tick: moves silent roots to `lost`, marks the count
    /// unreliable when a root was lost or every root is gone.
    pub fn tick(&self, metrics: &Metrics) {
        let now = now_ms();
        let Ok(reg) = json_read::<_, Registry>(&Envoy, REGISTRY_KEY) else {
            return;
        };
        self.seen.set(self.seen.get() || reg.seen);
        let dead = reg.stale(now, read_beat);
        let mut lost_now = false;
        if !dead.is_empty() {
            let moved = json_update(&Envoy, REGISTRY_KEY, |r: &mut Registry| {
                Ok::<_, String>(r.mark_lost(&dead))
            });
            for l in moved.unwrap_or_default() {
                report_lost(&l, metrics);
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
        let reg = json_read::<_, Registry>(&Envoy, REGISTRY_KEY).unwrap_or_default();
        let v = reg.verdict(now_ms());
        (reg, v)
    }
}

fn report_lost(l: &Lost, metrics: &Metrics) {
    log::error!(
        "event=traffic_role_lost id={} last_beat_ms={} what=\"a traffic VM stopped without a goodbye; the count is unreliable, a drain closes at drain_timeout\"",
        l.id,
        l.last_beat_ms
    );
    metrics.traffic_role_lost();
    let _ = Envoy.set(&beat_key(l.id), &[], None);
}
