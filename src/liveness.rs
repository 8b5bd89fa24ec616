//! Is the traffic role there, and alive? Pure.
//!
//! Every traffic root context (one per worker VM per listener filter
//! configuration) takes an id from the [`Registry`] when it is configured,
//! writes a heartbeat from its tick (its own shared-data key, no
//! compare-and-swap, no per-stream cost) and removes itself when its root
//! context is removed cleanly (`on_done`, or dropped: LDS update, plugin
//! reconfigured). The health role, on its tick, compares each registered
//! root's last beat with [`stale_after_ms`]:
//!
//! - no traffic root ever registered in this `vm_id`: the gateway does not
//!   count, so it is not announced ([`Verdict::waiting`]: LB check and
//!   readiness 503);
//! - a root that stops beating without a goodbye (its VM failed) is moved
//!   to `lost`: what it counted is never given back, and what it did not
//!   count may still be in flight, so the count is unreliable from then on
//!   (it never reads 0; a drain closes at `drain_timeout`, `forced`);
//! - every root gone with a goodbye and none back for [`stale_after_ms`] of
//!   the shortest tick: the filter disappeared from the listeners, the
//!   streams that run now are not counted — unreliable too.
//!
//! Neither changes the LB answer: a flip would cut what is in flight.

use serde::{Deserialize, Serialize};

/// A root whose last beat is older than this many of its ticks is dead.
pub const STALE_TICKS: u64 = 10;
/// ... and never less than this: a worker busy for a moment is not dead.
pub const STALE_MIN_MS: u64 = 2_000;
/// At most this many lost roots are listed (the flag stays regardless).
pub const MAX_LOST: usize = 16;

/// How long a root with this tick may stay silent before it counts as dead.
pub fn stale_after_ms(tick_ms: u64) -> u64 {
    tick_ms.saturating_mul(STALE_TICKS).max(STALE_MIN_MS)
}

/// One registered traffic root context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Root {
    pub id: u64,
    pub tick_ms: u64,
    pub since_ms: u64,
}

/// A root that stopped beating without a goodbye.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    pub id: u64,
    pub last_beat_ms: u64,
    pub at_ms: u64,
}

/// Why the count is not trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// A stream could not be counted (a host call failed).
    StreamNotCounted,
    /// A traffic root stopped beating without a goodbye (its VM failed).
    TrafficRoleLost,
    /// Every traffic root said goodbye and none came back.
    TrafficRoleGone,
    /// No traffic root has registered in this `vm_id` yet.
    TrafficRoleNotSeen,
}

impl Why {
    pub const ALL: [Why; 4] = [
        Why::StreamNotCounted,
        Why::TrafficRoleLost,
        Why::TrafficRoleGone,
        Why::TrafficRoleNotSeen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Why::StreamNotCounted => "stream_not_counted",
            Why::TrafficRoleLost => "traffic_role_lost",
            Why::TrafficRoleGone => "traffic_role_gone",
            Why::TrafficRoleNotSeen => "traffic_role_not_seen",
        }
    }

    pub fn from_name(s: &str) -> Option<Why> {
        Why::ALL.into_iter().find(|w| w.name() == s)
    }
}

/// The traffic roots of one `vm_id`, in shared data (compare-and-swap).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registry {
    pub next_id: u64,
    /// A traffic root has registered at least once.
    pub seen: bool,
    pub roots: Vec<Root>,
    /// Newest last, at most `MAX_LOST`.
    pub lost: Vec<Lost>,
    /// Roots lost in total (the list is bounded).
    pub lost_total: u64,
    /// When the last root said goodbye, while none is registered.
    pub empty_since_ms: Option<u64>,
    /// The shortest tick of any root seen: bounds how long "gone" waits.
    pub min_tick_ms: Option<u64>,
}

/// What the health role does with the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// No traffic root has registered yet: do not announce the gateway.
    pub waiting: bool,
    /// The count cannot be trusted to reach 0.
    pub unreliable: Option<Why>,
}

impl Registry {
    /// Registers a root; returns its id.
    pub fn announce(&mut self, tick_ms: u64, now_ms: u64) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.saturating_add(1);
        self.seen = true;
        self.empty_since_ms = None;
        self.min_tick_ms = Some(self.min_tick_ms.map_or(tick_ms, |t| t.min(tick_ms)));
        self.roots.push(Root {
            id,
            tick_ms,
            since_ms: now_ms,
        });
        id
    }

    /// A root leaves cleanly. Returns whether it was registered.
    pub fn goodbye(&mut self, id: u64, now_ms: u64) -> bool {
        let before = self.roots.len();
        self.roots.retain(|r| r.id != id);
        let left = self.roots.len() < before;
        if left && self.roots.is_empty() {
            self.empty_since_ms = Some(now_ms);
        }
        left
    }

    /// Roots whose last beat (`beat(id)`; a root that never beat counts from
    /// its registration) is older than their stale threshold.
    pub fn stale(&self, now_ms: u64, beat: impl Fn(u64) -> Option<u64>) -> Vec<Lost> {
        self.roots
            .iter()
            .filter_map(|r| {
                let last = beat(r.id).unwrap_or(r.since_ms).max(r.since_ms);
                (now_ms.saturating_sub(last) > stale_after_ms(r.tick_ms)).then_some(Lost {
                    id: r.id,
                    last_beat_ms: last,
                    at_ms: now_ms,
                })
            })
            .collect()
    }

    /// Moves `dead` roots from `roots` to `lost`; returns those that were
    /// still registered (another health worker may have moved them first).
    pub fn mark_lost(&mut self, dead: &[Lost]) -> Vec<Lost> {
        let mut moved = Vec::new();
        for d in dead {
            if self.roots.iter().any(|r| r.id == d.id) {
                self.roots.retain(|r| r.id != d.id);
                moved.push(d.clone());
            }
        }
        self.lost_total = self.lost_total.saturating_add(moved.len() as u64);
        self.lost.extend(moved.iter().cloned());
        if self.lost.len() > MAX_LOST {
            let extra = self.lost.len() - MAX_LOST;
            self.lost.drain(..extra);
        }
        moved
    }

    /// Every root gone with a goodbye, none back in time.
    pub fn gone(&self, now_ms: u64) -> bool {
        let grace = stale_after_ms(self.min_tick_ms.unwrap_or(0));
        self.roots.is_empty()
            && self
                .empty_since_ms
                .is_some_and(|t| now_ms.saturating_sub(t) > grace)
    }

    pub fn verdict(&self, now_ms: u64) -> Verdict {
        let unreliable = if self.lost_total > 0 {
            Some(Why::TrafficRoleLost)
        } else if self.gone(now_ms) {
            Some(Why::TrafficRoleGone)
        } else {
            None
        };
        Verdict {
            waiting: !self.seen,
            unreliable,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn waiting_until_a_traffic_root_registers() {
        let mut r = Registry::default();
        assert!(r.verdict(0).waiting);
        assert_eq!(r.verdict(0).unreliable, None);
        let a = r.announce(100, 10);
        let b = r.announce(100, 10);
        assert_ne!(a, b, "every root gets its own id");
        assert_eq!(
            r.verdict(10),
            Verdict {
                waiting: false,
                unreliable: None
            }
        );
    }

    #[test]
    fn a_silent_root_is_lost_after_several_ticks() {
        let mut r = Registry::default();
        let a = r.announce(100, 0);
        let b = r.announce(100, 0);
        let beats = |id: u64| Some(if id == a { 5_000 } else { 1_000 });
        assert_eq!(stale_after_ms(100), STALE_MIN_MS);
        assert!(r.stale(3_000, beats).is_empty(), "2 s is not yet stale");
        let dead = r.stale(3_001, beats);
        assert_eq!(dead.len(), 1);
        assert_eq!((dead[0].id, dead[0].last_beat_ms), (b, 1_000));
        assert_eq!(r.mark_lost(&dead).len(), 1);
        assert!(
            r.mark_lost(&dead).is_empty(),
            "a second health worker moves nothing"
        );
        assert_eq!(r.lost_total, 1);
        assert_eq!(r.verdict(3_001).unreliable, Some(Why::TrafficRoleLost));
        assert!(!r.verdict(3_001).waiting);
        // Long ticks stretch the threshold.
        assert_eq!(stale_after_ms(1_000), 10_000);
    }

    #[test]
    fn a_root_that_never_beat_counts_from_its_registration() {
        let mut r = Registry::default();
        r.announce(100, 50_000);
        assert!(r.stale(51_000, |_| None).is_empty());
        assert_eq!(r.stale(52_001, |_| None).len(), 1);
        // A beat older than the registration (a reused id cannot happen, but
        // a clock step back can) does not make a new root stale.
        assert!(r.stale(51_000, |_| Some(0)).is_empty());
    }

    #[test]
    fn goodbye_marks_nothing_and_replacement_is_seamless() {
        let mut r = Registry::default();
        let old = r.announce(100, 0);
        let new = r.announce(100, 500); // LDS: the new listener's root first
        assert!(r.goodbye(old, 1_000));
        assert!(!r.goodbye(old, 1_000), "twice is once");
        assert_eq!(r.verdict(100_000).unreliable, None);
        assert!(r.goodbye(new, 2_000));
        // Every root gone: a grace of the stale threshold for a replacement.
        assert_eq!(r.verdict(2_000 + STALE_MIN_MS).unreliable, None);
        r.announce(100, 3_000);
        assert_eq!(r.verdict(100_000).unreliable, None, "came back in time");
        let mut r2 = r.clone();
        let ids: Vec<u64> = r2.roots.iter().map(|x| x.id).collect();
        for id in ids {
            r2.goodbye(id, 10_000);
        }
        assert_eq!(
            r2.verdict(10_000 + STALE_MIN_MS + 1).unreliable,
            Some(Why::TrafficRoleGone)
        );
    }

    #[test]
    fn lost_list_is_bounded_but_the_total_is_not() {
        let mut r = Registry::default();
        for _ in 0..40 {
            r.announce(100, 0);
        }
        let dead = r.stale(10_000, |_| None);
        assert_eq!(r.mark_lost(&dead).len(), 40);
        assert_eq!(r.lost.len(), MAX_LOST);
        assert_eq!(r.lost_total, 40);
    }

    #[test]
    fn why_names_round_trip() {
        for w in Why::ALL {
            assert_eq!(Why::from_name(w.name()), Some(w));
            assert_eq!(
                serde_json::to_string(&w).unwrap(),
                format!("\"{}\"", w.name())
            );
        }
        assert_eq!(Why::from_name("1"), None);
    }
}
