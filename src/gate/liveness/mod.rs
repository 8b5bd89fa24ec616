//! Is the traffic role there, and alive? Pure.
//!
//! Every traffic root context (one per worker VM per listener filter
//! configuration, and one in the main thread's VM) takes an id from the
//! [`Registry`] on its first tick, writes a heartbeat from every tick (its
//! own shared-data key, no compare-and-swap, no per-stream cost) and leaves
//! when its root context is removed cleanly (`on_done`, or dropped: LDS
//! update, plugin reconfigured). Ids are reused: the smallest free one is
//! taken, so the beat and in-flight keys stay as many as the roots alive at
//! once, however many reconfigurations come and go.
//!
//! The health role judges on its tick (one health root per tick period does,
//! see [`Judging`]):
//!
//! - no traffic root ever registered in this `vm_id`: the gateway does not
//!   count, so it is not announced ([`Verdict::waiting`]: LB check and
//!   readiness 503);
//! - a root silent for [`stale_after_ms`] without a goodbye is **lost**: its
//!   VM may have failed, so what it counted may never be given back and what
//!   its worker runs now may go uncounted — the count is unreliable (it never
//!   reads 0; a drain waits). A lost root that **beats again** was only late
//!   (a busy worker, a long main-thread task): it is registered again, and
//!   once no root is lost the count is trusted again. A VM that really died
//!   never beats again: the count stays unreliable until istio-proxy restarts;
//! - silence is only judged while the health role itself runs: when its own
//!   tick was late by [`late_after_ms`] — the whole process stalled (SIGSTOP,
//!   CPU throttling, a node under memory pressure) — every root gets a fresh
//!   [`stale_after_ms`] to beat before any is judged, so a stall of the whole
//!   process loses nothing;
//! - every root gone with a goodbye and none back for [`stale_after_ms`] of
//!   the shortest tick: the filter disappeared from the listeners, the
//!   streams that run now are not counted — unreliable too, and for the life
//!   of the process: a stream that started in the gap is invisible to
//!   drain-gate and nothing bounds how long it runs, so no later moment is
//!   provably exact.
//!
//! None of this changes the LB answer: a flip would cut what is in flight.

pub mod host;

use crate::json::{named, record};

/// A root silent this long is never lost sooner: a worker busy for a moment.
pub const STALE_MIN_MS: u64 = 2_000;
/// Most traffic roots registered at once: one per worker and traffic filter
/// configuration, one more in the main thread's VM, and the roots of every
/// replaced filter chain until it has drained (Envoy keeps it for its drain
/// time: a listener updated every second with a 45 s drain time holds 45 sets
/// of roots). Past it a root is refused (and the count not trusted: nobody
/// watches that root).
pub const MAX_ROOTS: usize = 512;

/// How long a root with this tick may stay silent before it counts as lost:
/// ten of its ticks, `STALE_MIN_MS` at least.
pub fn stale_after_ms(tick_ms: u64) -> u64 {
    tick_ms.saturating_mul(10).max(STALE_MIN_MS)
}

/// A gap this long between two health ticks is a stall of the process (the
/// health role did not run either): silence is judged afresh after it.
pub fn late_after_ms(tick_ms: u64) -> u64 {
    tick_ms.saturating_mul(5).max(1_000)
}

record! {
    /// One registered traffic root context.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Root {
        pub id: u64,
        pub tick_ms: u64,
        pub since_ms: u64,
    }
}

record! {
    /// A root that went silent without a goodbye.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Lost {
        pub id: u64,
        pub tick_ms: u64,
        pub last_beat_ms: u64,
        pub at_ms: u64,
    }
}

named! {
    /// Why the count is not trusted.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Unreliable {
        /// A stream is in flight that could not be counted (a host call failed).
        StreamNotCounted = "stream_not_counted",
        /// A traffic root went silent without a goodbye (its VM may have failed).
        TrafficRoleLost = "traffic_role_lost",
        /// Every traffic root said goodbye and none came back.
        TrafficRoleGone = "traffic_role_gone",
        /// No traffic root has registered in this `vm_id` yet.
        TrafficRoleNotSeen = "traffic_role_not_seen",
        /// More traffic roots than the registry watches (`MAX_ROOTS`).
        TooManyTrafficRoots = "too_many_traffic_roots",
        /// A role was loaded as the wrong kind of filter: what passes it is not counted.
        MisplacedRole = "misplaced_role",
    }
}

record! {
    /// The traffic roots of one `vm_id`, in shared data (compare-and-swap).
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Registry {
        /// Moves on with every change (the verdicts judged from it are ordered by it).
        pub generation: u64,
        /// One above the highest id ever handed out: how many beat and in-flight
        /// keys exist.
        pub ids_high: u64,
        /// A traffic root has registered at least once.
        pub seen: bool,
        /// A role was loaded as the wrong kind of filter: what passed it was not
        /// counted, for the life of the process.
        pub misplaced: bool,
        pub roots: Vec<Root>,
        /// Lost and not back (their ids stay reserved, so that a beat on their
        /// key is theirs). At most `MAX_ROOTS`; past that the oldest is dropped
        /// and counted in `dropped_lost`.
        pub lost: Vec<Lost>,
        /// Lost roots dropped from `lost`: never seen back, so never trusted again.
        pub dropped_lost: u64,
        /// Roots lost in total, and lost roots that beat again.
        pub lost_total: u64,
        pub back_total: u64,
        /// Registrations refused because `MAX_ROOTS` were registered.
        pub refused: u64,
        /// When the last refusal happened (a refused root retries every tick:
        /// none for `stale_after_ms` means every root got in).
        pub last_refused_ms: Option<u64>,
        /// When the last root said goodbye, while none is registered.
        pub empty_since_ms: Option<u64>,
        /// A gap without any root (every root said goodbye, none back in time)
        /// began then: streams that started in it were not counted.
        pub gap_since_ms: Option<u64>,
        /// The shortest tick of any root seen: bounds how long "gone" waits.
        pub min_tick_ms: Option<u64>,
    }
}

/// What the health role does with the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// No traffic root has registered yet: do not announce the gateway.
    pub waiting: bool,
    /// The count cannot be trusted to reach 0.
    pub unreliable: Option<Unreliable>,
}

impl Registry {
    /// Registers a root; returns its id: the smallest one neither a
    /// registered nor a lost root holds. `None` when `MAX_ROOTS` are
    /// registered (the caller retries from its next tick).
    pub fn announce(&mut self, tick_ms: u64, now_ms: u64) -> Option<u64> {
        if self.roots.len() >= MAX_ROOTS {
            self.refused = self.refused.saturating_add(1);
            self.last_refused_ms = Some(now_ms);
            return None;
        }
        let taken =
            |id: u64| self.roots.iter().any(|r| r.id == id) || self.lost.iter().any(|l| l.id == id);
        let id = (0u64..).find(|id| !taken(*id))?;
        self.ids_high = self.ids_high.max(id.saturating_add(1));
        self.seen = true;
        self.empty_since_ms = None;
        self.min_tick_ms = Some(self.min_tick_ms.map_or(tick_ms, |t| t.min(tick_ms)));
        self.roots.push(Root {
            id,
            tick_ms,
            since_ms: now_ms,
        });
        Some(id)
    }

    /// A root leaves cleanly. Returns whether it was registered.
    pub fn goodbye(&mut self, id: u64, now_ms: u64) -> bool {
        let at = self.roots.iter().position(|r| r.id == id);
        let left = at.map(|i| self.roots.remove(i)).is_some();
        if left && self.roots.is_empty() {
            self.empty_since_ms = Some(now_ms);
        }
        left
    }

    /// Roots whose last beat (`beat(id)`, else their registration) is older
    /// than their stale threshold, silence counted from `judging_since_ms` at
    /// the earliest (the health role's own run of on-time ticks).
    pub fn stale(
        &self,
        now_ms: u64,
        judging_since_ms: u64,
        beat: impl Fn(u64) -> Option<u64>,
    ) -> Vec<Lost> {
        self.roots
            .iter()
            .filter_map(|r| {
                let last = beat(r.id).unwrap_or(r.since_ms).max(r.since_ms);
                let silent_from = last.max(judging_since_ms);
                (now_ms.saturating_sub(silent_from) > stale_after_ms(r.tick_ms)).then_some(Lost {
                    id: r.id,
                    tick_ms: r.tick_ms,
                    last_beat_ms: last,
                    at_ms: now_ms,
                })
            })
            .collect()
    }

    /// Moves `dead` roots from `roots` to `lost`; returns those that were
    /// still registered (another health worker may have moved them first).
    pub fn mark_lost(&mut self, dead: &[Lost]) -> Vec<Lost> {
        let registered = |d: &&Lost| self.roots.iter().any(|r| r.id == d.id);
        let moved: Vec<Lost> = dead.iter().filter(registered).cloned().collect();
        self.roots.retain(|r| !moved.iter().any(|m| m.id == r.id));
        self.lost_total = self.lost_total.saturating_add(moved.len() as u64);
        self.lost.extend(moved.iter().cloned());
        let extra = self.lost.len().saturating_sub(MAX_ROOTS);
        self.lost.drain(..extra);
        self.dropped_lost = self.dropped_lost.saturating_add(extra as u64);
        if self.roots.is_empty() && !moved.is_empty() {
            // Not a goodbye: "gone" does not apply, "lost" does.
            self.empty_since_ms = None;
        }
        moved
    }

    /// Lost roots that beat again after they were declared lost (`beat(id)`
    /// newer than the last beat seen): registered again. Returns them.
    pub fn revive(&mut self, beat: impl Fn(u64) -> Option<u64>) -> Vec<Lost> {
        let (back, still): (Vec<Lost>, Vec<Lost>) = self
            .lost
            .drain(..)
            .partition(|l| beat(l.id).is_some_and(|b| b > l.last_beat_ms));
        self.lost = still;
        for l in &back {
            self.roots.push(Root {
                id: l.id,
                tick_ms: l.tick_ms,
                since_ms: beat(l.id).unwrap_or(l.last_beat_ms),
            });
            self.empty_since_ms = None;
        }
        self.back_total = self.back_total.saturating_add(back.len() as u64);
        back
    }

    /// Notes the start of a gap once every root has been gone with a goodbye
    /// past the grace of the shortest tick — counted, like silence, from
    /// `judging_since_ms` at the earliest (a stall right after an LDS update's
    /// goodbye is not a missing replacement). Returns whether this call began it.
    pub fn note_gap(&mut self, now_ms: u64, judging_since_ms: u64) -> bool {
        let grace = stale_after_ms(self.min_tick_ms.unwrap_or(0));
        let began = self.gap_since_ms.is_none()
            && self.roots.is_empty()
            && (self.empty_since_ms)
                .is_some_and(|t| now_ms.saturating_sub(t.max(judging_since_ms)) > grace);
        if began {
            self.gap_since_ms = self.empty_since_ms;
        }
        began
    }

    pub fn verdict(&self, now_ms: u64) -> Verdict {
        let unreliable = if self.misplaced {
            Some(Unreliable::MisplacedRole)
        } else if !self.lost.is_empty() || self.dropped_lost > 0 {
            Some(Unreliable::TrafficRoleLost)
        } else if self.gap_since_ms.is_some() {
            Some(Unreliable::TrafficRoleGone)
        } else if self.last_refused_ms.is_some_and(|t| {
            now_ms.saturating_sub(t) <= stale_after_ms(self.min_tick_ms.unwrap_or(0))
        }) {
            Some(Unreliable::TooManyTrafficRoots)
        } else {
            None
        };
        Verdict {
            waiting: !self.seen,
            unreliable,
        }
    }
}

/// Who judged the registry last, and since when the health role's run of
/// on-time ticks lasts: one per process in shared data (`keys::WATCH`), in a
/// fixed form that costs no parse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Judging {
    /// The last judging tick (timer clock).
    pub last_ms: Option<u64>,
    /// Silence is judged from here at the earliest: the first on-time tick
    /// after the last stall.
    pub since_ms: u64,
    /// Stalls seen (the health role did not run for `late_after_ms`), and the
    /// longest.
    pub stalls: u64,
    pub longest_stall_ms: u64,
}

impl Judging {
    /// Four little-endian `u64`: `last_ms` (`u64::MAX`: none), `since_ms`,
    /// `stalls`, `longest_stall_ms`.
    pub fn to_bytes(&self) -> [u8; 32] {
        let last = self.last_ms.unwrap_or(u64::MAX);
        put_words(&[last, self.since_ms, self.stalls, self.longest_stall_ms])
    }

    /// What `to_bytes` wrote (`None`: another form).
    pub fn from_bytes(bytes: &[u8]) -> Option<Judging> {
        let mut next = words(bytes, 4)?;
        Some(Judging {
            last_ms: Some(next()).filter(|v| *v != u64::MAX),
            since_ms: next(),
            stalls: next(),
            longest_stall_ms: next(),
        })
    }

    /// A health tick at `now_ms`: `None` when another one judged less than
    /// half a tick ago; else it judges, from the `since_ms` of the record it
    /// writes, with the gap when the health role did not run for
    /// `late_after_ms` (a stall: judged afresh from now on).
    pub fn next(&self, now_ms: u64, tick_ms: u64) -> Option<(Judging, Option<u64>)> {
        let gap = self.last_ms.map(|last| now_ms.saturating_sub(last));
        if gap.is_some_and(|g| g < tick_ms / 2) {
            return None;
        }
        let stall = gap.filter(|g| *g >= late_after_ms(tick_ms));
        let afresh = gap.is_none() || stall.is_some();
        let next = Judging {
            last_ms: Some(now_ms),
            since_ms: if afresh { now_ms } else { self.since_ms },
            stalls: self.stalls.saturating_add(u64::from(stall.is_some())),
            longest_stall_ms: self.longest_stall_ms.max(stall.unwrap_or(0)),
        };
        Some((next, stall))
    }
}

/// `fields` as little-endian `u64`s, in order (`B`: eight bytes each): the
/// fixed forms kept in shared data, which cost no parse.
pub fn put_words<const B: usize>(fields: &[u64]) -> [u8; B] {
    let mut out = [0; B];
    for (chunk, v) in out.chunks_exact_mut(8).zip(fields) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// The little-endian `u64`s of a fixed form, one per call, if `bytes` holds
/// `n` of them (`None`: another form).
pub fn words(bytes: &[u8], n: usize) -> Option<impl FnMut() -> u64 + '_> {
    let mut fields = bytes
        .chunks_exact(8)
        .map(|c| <[u8; 8]>::try_from(c).map_or(0, u64::from_le_bytes));
    (bytes.len() == n * 8).then_some(move || fields.next().unwrap_or_default())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn waiting_until_a_traffic_root_registers() {
        let mut r = Registry::default();
        assert!(r.verdict(0).waiting);
        assert_eq!(r.verdict(0).unreliable, None);
        let a = r.announce(100, 10).unwrap();
        let b = r.announce(100, 10).unwrap();
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
        let a = r.announce(100, 0).unwrap();
        let b = r.announce(100, 0).unwrap();
        let beats = |id: u64| Some(if id == a { 5_000 } else { 1_000 });
        assert_eq!(stale_after_ms(100), STALE_MIN_MS);
        assert!(r.stale(3_000, 0, beats).is_empty(), "2 s is not yet stale");
        let dead = r.stale(3_001, 0, beats);
        assert_eq!(dead.len(), 1);
        assert_eq!((dead[0].id, dead[0].last_beat_ms), (b, 1_000));
        assert_eq!(r.mark_lost(&dead).len(), 1);
        assert!(
            r.mark_lost(&dead).is_empty(),
            "a second health worker moves nothing"
        );
        assert_eq!(r.lost_total, 1);
        assert_eq!(
            r.verdict(3_001).unreliable,
            Some(Unreliable::TrafficRoleLost)
        );
        assert!(!r.verdict(3_001).waiting);
        // Long ticks stretch the threshold.
        assert_eq!(stale_after_ms(1_000), 10_000);
    }

    #[test]
    fn silence_is_judged_only_from_the_health_role_s_own_run_of_ticks() {
        let mut r = Registry::default();
        r.announce(100, 0).unwrap();
        let beats = |_| Some(1_000);
        // The whole process stopped from 1.0 s to 4.5 s: the health role's
        // first tick after it judges from 4.5 s on.
        assert!(r.stale(4_500, 4_500, beats).is_empty());
        assert!(r.stale(6_500, 4_500, beats).is_empty());
        assert_eq!(
            r.stale(6_501, 4_500, beats).len(),
            1,
            "then silent for real"
        );
    }

    #[test]
    fn a_lost_root_that_beats_again_is_registered_again_and_trusted() {
        let mut r = Registry::default();
        let a = r.announce(100, 0).unwrap();
        let lost = r.stale(5_000, 0, |_| Some(1_000));
        r.mark_lost(&lost);
        assert_eq!(
            r.verdict(5_000).unreliable,
            Some(Unreliable::TrafficRoleLost)
        );
        assert!(r.revive(|_| Some(1_000)).is_empty(), "the same old beat");
        let back = r.revive(|_| Some(5_100));
        assert_eq!(back.len(), 1);
        assert_eq!(r.roots[0].id, a, "its id kept");
        assert_eq!((r.lost_total, r.back_total), (1, 1));
        assert_eq!(r.verdict(5_100).unreliable, None);
    }

    #[test]
    fn ids_are_reused_and_a_lost_root_keeps_its_own() {
        let mut r = Registry::default();
        let a = r.announce(100, 0).unwrap();
        let b = r.announce(100, 0).unwrap();
        assert_eq!((a, b), (0, 1));
        r.goodbye(a, 10);
        assert_eq!(r.announce(100, 20), Some(0), "the smallest free id");
        let lost = r.stale(10_000, 0, |id| (id == 0).then_some(9_000));
        assert_eq!(lost.len(), 1);
        r.mark_lost(&lost);
        assert_eq!(
            r.announce(100, 10_000),
            Some(2),
            "1 is reserved for the lost root"
        );
        for _ in 0..1_000 {
            let id = r.announce(100, 10_000).unwrap();
            r.goodbye(id, 10_000);
        }
        assert!(
            r.roots
                .iter()
                .chain(r.lost.iter().map(|_| &r.roots[0]))
                .count()
                <= 3,
            "a thousand reconfigurations leave the ids as they were"
        );
        assert_eq!(r.announce(100, 10_000), Some(3));
    }

    #[test]
    fn registrations_past_the_bound_are_refused_and_named() {
        let mut r = Registry::default();
        for _ in 0..MAX_ROOTS {
            assert!(r.announce(100, 0).is_some());
        }
        assert_eq!(r.announce(100, 0), None);
        assert_eq!(r.refused, 1);
        assert_eq!(
            r.verdict(0).unreliable,
            Some(Unreliable::TooManyTrafficRoots)
        );
        assert_eq!(
            r.verdict(STALE_MIN_MS + 1).unreliable,
            None,
            "no refusal for a stale period: every root got in"
        );
    }

    #[test]
    fn a_root_that_never_beat_counts_from_its_registration() {
        let mut r = Registry::default();
        r.announce(100, 50_000).unwrap();
        assert!(r.stale(51_000, 0, |_| None).is_empty());
        assert_eq!(r.stale(52_001, 0, |_| None).len(), 1);
        // A beat older than the registration (a clock step back cannot move
        // the monotonic clock, but a reused key may hold an older beat) does
        // not make a new root stale.
        assert!(r.stale(51_000, 0, |_| Some(0)).is_empty());
    }

    #[test]
    fn goodbye_marks_nothing_and_replacement_is_seamless() {
        let mut r = Registry::default();
        let old = r.announce(100, 0).unwrap();
        let new = r.announce(100, 500).unwrap(); // LDS: the new listener's root first
        assert!(r.goodbye(old, 1_000));
        assert!(!r.goodbye(old, 1_000), "twice is once");
        assert_eq!(r.verdict(100_000).unreliable, None);
        assert!(r.goodbye(new, 2_000));
        // Every root gone: a grace of the stale threshold for a replacement.
        assert!(!r.note_gap(2_000 + STALE_MIN_MS, 0));
        // ... counted from the health role's run of ticks (a stall right after).
        assert!(!r.note_gap(10_000, 9_000));
        r.announce(100, 3_000).unwrap();
        assert!(!r.note_gap(100_000, 0), "came back in time");
        assert_eq!(r.verdict(100_000).unreliable, None);
        let mut r2 = r.clone();
        let ids: Vec<u64> = r2.roots.iter().map(|x| x.id).collect();
        for id in ids {
            r2.goodbye(id, 10_000);
        }
        let late = 10_000 + STALE_MIN_MS + 1;
        assert!(r2.note_gap(late, 0) && !r2.note_gap(late, 0));
        assert_eq!(
            r2.verdict(late).unreliable,
            Some(Unreliable::TrafficRoleGone)
        );
        r2.announce(100, 20_000).unwrap();
        assert_eq!(
            r2.verdict(1 << 40).unreliable,
            Some(Unreliable::TrafficRoleGone),
            "a stream of the gap is invisible: never trusted again"
        );
    }

    #[test]
    fn lost_list_is_bounded_and_what_falls_off_is_never_trusted_again() {
        let mut r = Registry::default();
        for _ in 0..MAX_ROOTS {
            r.announce(100, 0).unwrap();
        }
        let dead = r.stale(10_000, 0, |_| None);
        assert_eq!(r.mark_lost(&dead).len(), MAX_ROOTS);
        for _ in 0..10 {
            r.announce(100, 10_000).unwrap();
        }
        let dead = r.stale(20_000, 0, |_| None);
        r.mark_lost(&dead);
        assert_eq!(r.lost.len(), MAX_ROOTS);
        assert_eq!(r.dropped_lost, 10);
        assert_eq!(r.lost_total, MAX_ROOTS as u64 + 10);
        r.revive(|_| Some(30_000));
        assert!(r.lost.is_empty());
        assert_eq!(
            r.verdict(30_000).unreliable,
            Some(Unreliable::TrafficRoleLost)
        );
    }

    #[test]
    fn one_health_tick_judges_per_half_tick_and_a_stall_restarts_the_run() {
        let w = Judging::default();
        let Some((w, None)) = w.next(1_000, 100) else {
            panic!("the first tick judges")
        };
        assert_eq!(w.next(1_040, 100), None, "another worker judged 40 ms ago");
        let Some((w, None)) = w.next(1_100, 100) else {
            panic!("on time")
        };
        assert_eq!(w.since_ms, 1_000);
        let Some((w, Some(gap))) = w.next(4_600, 100) else {
            panic!("3.5 s without a health tick is a stall")
        };
        assert_eq!((gap, w.since_ms, w.stalls), (3_500, 4_600, 1));
    }

    #[test]
    fn the_judging_record_round_trips_its_fixed_form() {
        for w in [
            Judging::default(),
            Judging {
                last_ms: Some(0),
                since_ms: 7,
                stalls: 2,
                longest_stall_ms: 3_500,
            },
        ] {
            assert_eq!(Judging::from_bytes(&w.to_bytes()), Some(w));
        }
        assert_eq!(Judging::from_bytes(b"{}"), None);
    }

    #[test]
    fn why_names_round_trip() {
        for &w in Unreliable::ALL {
            assert_eq!(Unreliable::from_name(w.name()), Some(w));
            assert_eq!(
                serde_json::to_string(&w).unwrap(),
                format!("\"{}\"", w.name())
            );
        }
        assert_eq!(Unreliable::from_name("1"), None);
    }
}
