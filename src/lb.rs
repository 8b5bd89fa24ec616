//! What the load balancer has seen: every source that asks
//! `/health_check.html` is a checker; the health role counts the consecutive
//! answers it served each one. Once every checker has been served `lb_fall`
//! consecutive 503s, the LB has marked this backend DOWN (and run its
//! shutdown-sessions on nothing). Pure.

use serde::{Deserialize, Serialize};

/// A checker not seen for this long is gone (LB failover, reconfiguration)
/// and no longer holds up `observed_down`.
pub const CHECKER_TTL_MS: u64 = 30_000;
/// At most this many checkers are remembered; the longest unseen goes first.
pub const MAX_CHECKERS: usize = 32;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checker {
    pub source: String,
    pub consecutive_non_200: u32,
    pub consecutive_503: u32,
    pub last_seen_ms: u64,
    /// When this checker was last served a 404 (soft drain).
    #[serde(default)]
    pub last_404_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkers {
    pub list: Vec<Checker>,
    /// When the last live checker reached `lb_fall` consecutive 503s.
    pub observed_down_ms: Option<u64>,
}

impl Checkers {
    fn live(&self, now_ms: u64) -> impl Iterator<Item = &Checker> {
        self.list
            .iter()
            .filter(move |c| now_ms.saturating_sub(c.last_seen_ms) <= CHECKER_TTL_MS)
    }

    /// True when there is at least one live checker and each has been served
    /// `lb_fall` consecutive 503s.
    pub fn all_down(&self, now_ms: u64, lb_fall: u32) -> bool {
        let mut any = false;
        for c in self.live(now_ms) {
            if c.consecutive_503 < lb_fall {
                return false;
            }
            any = true;
        }
        any
    }

    /// Records one answer served to `source`.
    pub fn observe(&mut self, source: &str, status: u16, now_ms: u64, lb_fall: u32) {
        let idx = match self.list.iter().position(|c| c.source == source) {
            Some(i) => i,
            None => {
                if self.list.len() >= MAX_CHECKERS {
                    if let Some(oldest) = self
                        .list
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, c)| c.last_seen_ms)
                        .map(|(i, _)| i)
                    {
                        self.list.swap_remove(oldest);
                    }
                }
                self.list.push(Checker {
                    source: source.to_string(),
                    consecutive_non_200: 0,
                    consecutive_503: 0,
                    last_seen_ms: now_ms,
                    last_404_ms: None,
                });
                self.list.len() - 1
            }
        };
        if let Some(c) = self.list.get_mut(idx) {
            c.last_seen_ms = now_ms;
            if status == 200 {
                c.consecutive_non_200 = 0;
            } else {
                c.consecutive_non_200 = c.consecutive_non_200.saturating_add(1);
            }
            if status == 404 {
                c.last_404_ms = Some(now_ms);
            }
            if status == 503 {
                c.consecutive_503 = c.consecutive_503.saturating_add(1);
            } else {
                c.consecutive_503 = 0;
            }
        }
        if self.all_down(now_ms, lb_fall) {
            self.observed_down_ms.get_or_insert(now_ms);
        } else {
            self.observed_down_ms = None;
        }
    }

    /// Whether every live checker has been served a 404 at or after
    /// `since_ms` (the drain start): HAProxy `disable-on-404` stops sending
    /// new requests on the first one. A checker that appears mid-drain is
    /// live at once and is served 404 on its first check; one that vanishes
    /// stops holding the gate after `CHECKER_TTL_MS`; `drain_timeout` bounds
    /// both. No live checker: nothing to wait for.
    pub fn saw_drain(&self, since_ms: u64, now_ms: u64) -> bool {
        self.live(now_ms)
            .all(|c| c.last_404_ms.is_some_and(|t| t >= since_ms))
    }

    /// The moment the LB was observed DOWN, if that is still true now.
    pub fn down_since(&self, now_ms: u64, lb_fall: u32) -> Option<u64> {
        self.observed_down_ms
            .filter(|_| self.all_down(now_ms, lb_fall))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn every_checker_must_see_fall_503s() {
        let mut c = Checkers::default();
        assert!(!c.all_down(0, 2), "no checker: nothing observed");
        c.observe("10.0.0.1", 200, 0, 2);
        c.observe("10.0.0.2", 200, 0, 2);
        c.observe("10.0.0.1", 503, 1_000, 2);
        c.observe("10.0.0.1", 503, 2_000, 2);
        assert!(!c.all_down(2_000, 2));
        c.observe("10.0.0.2", 503, 2_100, 2);
        assert!(!c.all_down(2_100, 2));
        c.observe("10.0.0.2", 503, 3_100, 2);
        assert!(c.all_down(3_100, 2));
        assert_eq!(c.down_since(3_200, 2), Some(3_100));
        assert_eq!(c.list[0].consecutive_non_200, 2);
    }

    #[test]
    fn a_200_resets_and_404_is_not_down() {
        let mut c = Checkers::default();
        c.observe("a", 503, 0, 2);
        c.observe("a", 503, 1, 2);
        assert!(c.down_since(1, 2).is_some());
        c.observe("a", 200, 2, 2);
        assert_eq!(c.down_since(2, 2), None);
        c.observe("a", 404, 3, 2);
        c.observe("a", 404, 4, 2);
        assert_eq!(c.list[0].consecutive_non_200, 2);
        assert!(!c.all_down(4, 2), "soft drain (NOLB) is not DOWN");
    }

    #[test]
    fn stale_checkers_stop_counting() {
        let mut c = Checkers::default();
        c.observe("gone", 200, 0, 1);
        c.observe("here", 503, CHECKER_TTL_MS + 1, 1);
        assert!(c.all_down(CHECKER_TTL_MS + 1, 1));
    }

    #[test]
    fn saw_drain_needs_a_404_from_every_live_checker_since_the_drain() {
        let mut c = Checkers::default();
        assert!(c.saw_drain(0, 0), "no checker: nothing to wait for");
        c.observe("a", 404, 500, 2); // a 404 of an earlier drain
        c.observe("b", 200, 900, 2);
        assert!(!c.saw_drain(1_000, 1_000));
        c.observe("a", 404, 1_100, 2);
        assert!(!c.saw_drain(1_000, 1_100), "b not yet");
        c.observe("b", 404, 1_900, 2);
        assert!(c.saw_drain(1_000, 1_900));
        // A checker appearing mid-drain holds the gate until its first check
        // is answered, which in DRAINING is a 404.
        c.observe("new", 200, 2_000, 2);
        assert!(!c.saw_drain(1_000, 2_000));
        c.observe("new", 404, 2_500, 2);
        assert!(c.saw_drain(1_000, 2_500));
        // One that vanishes stops holding it after the TTL.
        c.observe("late", 200, 900, 2);
        assert!(!c.saw_drain(1_000, 2_500));
        let later = 900 + CHECKER_TTL_MS + 1;
        for k in ["a", "b", "new"] {
            c.observe(k, 404, later, 2);
        }
        assert!(c.saw_drain(1_000, later), "late is no longer live");
    }

    #[test]
    fn bounded() {
        let mut c = Checkers::default();
        for i in 0..100u64 {
            c.observe(&format!("10.0.0.{i}"), 200, i, 2);
        }
        assert_eq!(c.list.len(), MAX_CHECKERS);
        assert!(c.list.iter().any(|x| x.source == "10.0.0.99"));
    }
}
