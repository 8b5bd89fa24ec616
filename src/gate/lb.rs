//! What the load balancer has seen: every source that asks
//! `/health_check.html` is a checker; the health role counts the consecutive
//! answers it served each one. Once every checker has been served `lb_fall`
//! consecutive 503s, the LB has marked this backend DOWN (and run its
//! shutdown-sessions on nothing). Pure.
//!
//! The LB as drain-gate sees it: each checker's check interval, measured from
//! the gaps between its checks (`Checker::interval`), and whether what CLOSING
//! waits before CLOSED covers the LB's detection, `lb_fall` × that interval
//! (`Checkers::detection`).
//!
//! Every time here is on the clock the drain timers run on
//! (`crate::gate::clock::Now::timer_ms`, monotonic when the host has it): a
//! wall-clock step can neither age every checker out at once — which would
//! open a soft-drain gate the LB never passed — nor make a DOWN look older
//! than the CLOSING it followed.

use serde::Serialize;
use std::net::IpAddr;

use crate::json::record;

/// A checker not seen for this long is gone (LB failover, reconfiguration)
/// and no longer holds up `observed_down` or the soft-drain gate.
pub const CHECKER_TTL_MS: u64 = 30_000;
/// At most this many checkers are remembered; the longest unseen goes first.
pub const MAX_CHECKERS: usize = 32;
/// A cut this soon after a checker was served its `lb_fall`-th consecutive
/// 503 is the LB's: HAProxy (`on-marked-down shutdown-sessions`) and NetScaler
/// (`downStateFlush`) reset the backend's sessions in the same step that marks
/// it DOWN, on that check's answer; the resets reach Envoy within
/// milliseconds. Two seconds leaves room for a busy LB and for the record's
/// resolution, and is far below any LB's check interval: a cut later than that
/// is not the DOWN's. (From the checker's own address the window also opens
/// at its next 503s: `DOWN_SPREAD`, `Checkers::cut_by_lb`.)
pub const CUT_WINDOW_MS: u64 = 2_000;
/// One source address can be several checks: HAProxy checks a gateway once
/// per backend that lists it (haproxy.cfg's HTTP and TLS-passthrough backends,
/// from the same address), and each backend marks it DOWN at its own
/// `lb_fall`-th 503 — within one check interval of the others, so up to the
/// source's `DOWN_SPREAD × lb_fall`-th consecutive 503. Each 503 from the
/// `lb_fall`-th to that one opens the cut window again
/// (`Checker::down_last_ms`) — for cuts from that address only: the LB's
/// sessions come from the address it checks from.
pub const DOWN_SPREAD: u32 = 2;
/// The gaps between a checker's checks kept to measure its interval: a fixed
/// number, so that the record stays bounded (at most `MAX_CHECKERS` × this).
pub const MAX_GAPS: usize = 8;
/// Gaps a checker needs before its interval is shown: their median is then
/// the interval even if one check was missed (one gap twice as long) or one
/// came out of turn (one gap split in two: from 5 gaps on).
pub const MIN_GAPS: usize = 3;

record! {
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Checker {
        pub source: String,
        pub consecutive_non_200: u32,
        pub consecutive_503: u32,
        /// Timer-clock time of its last check.
        pub last_seen_ms: u64,
        /// When this checker was last served a 404 (soft drain).
        pub last_404_ms: Option<u64>,
        /// When this checker was last served its `lb_fall`-th consecutive 503:
        /// the LB marked the gateway DOWN then.
        pub down_ms: Option<u64>,
        /// The last of its 503s from the `lb_fall`-th to the
        /// `DOWN_SPREAD × lb_fall`-th: another check from the same address (a
        /// second HAProxy backend) may have marked the gateway DOWN then.
        pub down_last_ms: Option<u64>,
        /// The last `MAX_GAPS` gaps between its checks (ms, oldest first),
        /// each one that followed a check it was answered 200 or 404: the
        /// LB's interval while it holds the gateway UP. After a 503 an LB
        /// checks at another pace (HAProxy's `fastinter`, `downinter`).
        pub gaps_ms: Vec<u32> = Vec::new(),
    }
}

/// A checker's check interval, as its gaps say (`Checker::interval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Interval {
    /// The median of its gaps; `None` until it has `MIN_GAPS`.
    pub ms: Option<u64>,
    /// How many gaps it is based on (at most `MAX_GAPS`).
    pub gaps: usize,
    pub min_gap_ms: Option<u64>,
    pub max_gap_ms: Option<u64>,
}

impl Checker {
    /// Its check interval, as its last gaps (ms, any order) say: their median
    /// once there are `MIN_GAPS` of them, never below the shortest nor above
    /// the longest. One missed check (a gap twice as long) moves it by at most
    /// one rank.
    pub fn interval(&self) -> Interval {
        // Sorted by insertion: at most MAX_GAPS, and no sort routine in the module.
        let mut sorted: Vec<u64> = Vec::with_capacity(self.gaps_ms.len());
        for g in self.gaps_ms.iter().map(|g| u64::from(*g)) {
            sorted.insert(sorted.partition_point(|x| *x <= g), g);
        }
        let n = sorted.len();
        let mid = |i: usize| sorted.get(i).copied();
        // Of an even number, between the two middle gaps: neither is passed.
        let ms = (mid(n.saturating_sub(1) / 2).zip(mid(n / 2)))
            .filter(|_| n >= MIN_GAPS)
            .map(|(a, b)| a + (b - a) / 2);
        Interval {
            ms,
            gaps: n,
            min_gap_ms: sorted.first().copied(),
            max_gap_ms: sorted.last().copied(),
        }
    }

    /// Records an answer `status` served at `now_ms`; returns whether it
    /// changed the checker. The gap since its last check is kept when that
    /// one was answered 200 or 404. A check no later than the last one
    /// recorded (the same millisecond, or another worker's later check written
    /// first) adds no gap; one after the checker was gone (`CHECKER_TTL_MS`)
    /// starts its gaps anew: its LB may have been reconfigured meanwhile.
    fn served(&mut self, status: u16, now_ms: u64, lb_fall: u32) -> bool {
        // Only a 200 to a checker whose last answer was 200, in no later
        // millisecond, changes nothing (`consecutive_503` never exceeds
        // `consecutive_non_200`; its gaps change only with `last_seen_ms`).
        // A non-200 counts as a change even at the counts' saturation.
        let mut changed = status != 200 || self.consecutive_non_200 > 0;
        // The counts are still those of its last check here.
        if let Some(gap) = now_ms.checked_sub(self.last_seen_ms).filter(|g| *g > 0) {
            changed = true;
            self.last_seen_ms = now_ms;
            if gap > CHECKER_TTL_MS {
                self.gaps_ms.clear();
            } else if self.consecutive_503 == 0 {
                self.gaps_ms.push(u32::try_from(gap).unwrap_or(u32::MAX));
                let excess = self.gaps_ms.len().saturating_sub(MAX_GAPS);
                self.gaps_ms.drain(..excess);
            }
        }
        let non_200 = self.consecutive_non_200.saturating_add(1);
        self.consecutive_non_200 = if status == 200 { 0 } else { non_200 };
        if status == 404 {
            self.last_404_ms = Some(now_ms);
        }
        if status == 503 {
            self.consecutive_503 = self.consecutive_503.saturating_add(1);
            if self.consecutive_503 == lb_fall {
                self.down_ms = Some(now_ms);
            }
            if (lb_fall..=lb_fall.saturating_mul(DOWN_SPREAD)).contains(&self.consecutive_503) {
                self.down_last_ms = Some(now_ms);
            }
        } else {
            self.consecutive_503 = 0;
        }
        changed
    }
}

/// What CLOSING waits for the LB, at the longest, before CLOSED: `lb_buffer`
/// after the flip, or with `close_after: lb_observed_down` (CLOSED `lb_buffer`
/// after every checker's DOWN) `lb_down_timeout`, CLOSED anyway if no DOWN is
/// seen by then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    /// The setting: `lb_buffer` or `lb_down_timeout`.
    pub name: &'static str,
    pub ms: u64,
}

/// The LB's detection of the flip, as drain-gate measures it, beside what
/// CLOSING waits (`Checkers::detection`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection<'a> {
    /// The live checker with the longest interval.
    pub checker: &'a str,
    pub interval_ms: u64,
    pub lb_fall: u32,
    /// `lb_fall` × `interval_ms`: the flip's first 503 reaches the checker
    /// within one interval, its `lb_fall`-th that many intervals after it.
    pub detection_ms: u64,
    pub wait: Wait,
    /// How much `wait` falls short of `detection_ms` (0: it covers it).
    pub short_ms: u64,
}

record! {
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Checkers {
        pub list: Vec<Checker>,
        /// When the last live checker reached `lb_fall` consecutive 503s.
        pub observed_down_ms: Option<u64>,
        /// The last source whose checks were answered but not recorded (outside
        /// `lb_checkers`), and when it was first seen.
        pub ignored: Option<Ignored>,
        /// When a check, from any source, was first answered 200 in this process:
        /// from then on the LB may have sent the gateway requests.
        pub announced_ms: Option<u64> = None,
    }
}

record! {
    /// A source outside `lb_checkers` that asked `/health_check.html`.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Ignored {
        pub source: String,
        pub since_ms: u64,
    }
}

/// What a gated soft drain is waiting for (see `Checkers::gate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Every live checker has been served the 404 since the drain began.
    Open,
    /// Some live checker has not been served the 404 yet.
    Waiting,
    /// No live checker, and `lb_checkers` names the LB's addresses: the LB's
    /// checks come from elsewhere (SNAT, a wrong CIDR), or it stopped asking.
    /// Nothing was seen, so the gate holds; `drain_timeout` bounds it.
    NoChecker,
    /// No live checker and every source counts: no LB asks, nothing to wait for.
    NoLb,
}

impl Gate {
    /// Whether the active = 0 flip may go ahead.
    pub fn passes(self) -> bool {
        matches!(self, Gate::Open | Gate::NoLb)
    }
}

impl Checkers {
    /// The checkers that asked within `CHECKER_TTL_MS`.
    pub fn live(&self, now_ms: u64) -> impl Iterator<Item = &Checker> {
        self.list
            .iter()
            .filter(move |c| now_ms.saturating_sub(c.last_seen_ms) <= CHECKER_TTL_MS)
    }

    /// True when there is at least one live checker and each has been served
    /// `lb_fall` consecutive 503s.
    pub fn all_down(&self, now_ms: u64, lb_fall: u32) -> bool {
        let mut live = self.live(now_ms).peekable();
        live.peek().is_some() && live.all(|c| c.consecutive_503 >= lb_fall)
    }

    /// Records one answer served to `source`. Returns whether anything
    /// changed (the caller writes only then).
    pub fn observe(&mut self, source: &str, status: u16, now_ms: u64, lb_fall: u32) -> bool {
        let was = (self.observed_down_ms, self.announced_ms);
        let changed = match self.list.iter_mut().find(|c| c.source == source) {
            Some(c) => c.served(status, now_ms, lb_fall),
            None => {
                if self.list.len() >= MAX_CHECKERS {
                    let seen = |(i, c): (usize, &Checker)| (c.last_seen_ms, i);
                    if let Some((_, oldest)) = self.list.iter().enumerate().map(seen).min() {
                        self.list.swap_remove(oldest);
                    }
                }
                let mut c = Checker {
                    source: source.to_string(),
                    last_seen_ms: now_ms,
                    ..Checker::default()
                };
                c.served(status, now_ms, lb_fall);
                self.list.push(c);
                true
            }
        };
        if status == 200 {
            self.announced_ms.get_or_insert(now_ms);
        }
        let down = self.all_down(now_ms, lb_fall);
        self.observed_down_ms = down.then(|| self.observed_down_ms.unwrap_or(now_ms));
        changed || (self.observed_down_ms, self.announced_ms) != was
    }

    /// An answer of 200 to a source outside `lb_checkers`: not a checker, but
    /// the gateway is announced. Returns whether that is new.
    pub fn announce(&mut self, now_ms: u64) -> bool {
        let new = self.announced_ms.is_none();
        self.announced_ms.get_or_insert(now_ms);
        new
    }

    /// Records a check from a source outside `lb_checkers` (answered, not
    /// counted). Returns whether anything changed.
    pub fn ignore(&mut self, source: &str, now_ms: u64) -> bool {
        if self.ignored.as_ref().is_some_and(|i| i.source == source) {
            return false;
        }
        self.ignored = Some(Ignored {
            source: source.to_string(),
            since_ms: now_ms,
        });
        true
    }

    /// Whether every live checker has been served a 404 at or after
    /// `since_ms` (the drain start): HAProxy `disable-on-404` stops sending
    /// new requests on the first one. A checker that appears mid-drain is
    /// live at once and is served 404 on its first check; one that vanishes
    /// stops holding the gate after `CHECKER_TTL_MS`; `drain_timeout` bounds
    /// both. Without a live checker: `NoChecker` when `lb_checkers` names the
    /// LB (`need_checker`: something should ask, and nothing does), else `NoLb`.
    pub fn gate(&self, since_ms: u64, now_ms: u64, need_checker: bool) -> Gate {
        let mut live = self.live(now_ms).peekable();
        match (live.peek().is_some(), need_checker) {
            (false, true) => Gate::NoChecker,
            (false, false) => Gate::NoLb,
            _ if live.all(|c| c.last_404_ms.is_some_and(|t| t >= since_ms)) => Gate::Open,
            _ => Gate::Waiting,
        }
    }

    /// Whether a cut at `now_ms` is the LB's. An LB resets its own sessions,
    /// which come from the address it checks from (HAProxy's source, a
    /// NetScaler's SNIP): a cut from a checker's address (`source`, the
    /// downstream's, asked for only when some checker's window is open) is
    /// the LB's within `CUT_WINDOW_MS` after that checker was served its
    /// `lb_fall`-th consecutive 503 or one of its next (`DOWN_SPREAD`). A cut
    /// from another address — a client in the cluster, or an LB that passes
    /// its clients' addresses on (PROXY protocol, transparent mode) — is the
    /// LB's only within `CUT_WINDOW_MS` after a checker's first DOWN.
    pub fn cut_by_lb(&self, now_ms: u64, source: impl FnOnce() -> Option<IpAddr>) -> bool {
        let open = |c: &Checker, spread: bool| {
            c.down_ms.is_some_and(|first| {
                let last = c.down_last_ms.filter(|_| spread).unwrap_or(first);
                first <= now_ms && now_ms <= last.max(first).saturating_add(CUT_WINDOW_MS)
            })
        };
        if !self.list.iter().any(|c| open(c, true)) {
            return false;
        }
        let source = source().map(|ip| ip.to_string());
        let own = |c: &&Checker| source.as_deref() == Some(c.source.as_str());
        match self.list.iter().find(own) {
            Some(c) => open(c, true),
            None => self.list.iter().any(|c| open(c, false)),
        }
    }

    /// Whether any check was recorded at or after `since_ms` (a drain's start):
    /// an LB that still checks reads true from one of its check intervals into
    /// the drain on. False for longer: its checks of this node reach another
    /// pod (a Gateway API surge pod on the same node, which kube-proxy prefers
    /// as the node's ready endpoint).
    pub fn checked_since(&self, since_ms: u64) -> bool {
        self.list.iter().any(|c| c.last_seen_ms >= since_ms)
    }

    /// The LB's detection of a flip — `lb_fall` × the longest measured
    /// interval of a live checker — beside what CLOSING waits before CLOSED,
    /// and by how much that falls short (`None`: no live checker has
    /// `MIN_GAPS` gaps yet).
    pub fn detection(&self, now_ms: u64, lb_fall: u32, wait: Wait) -> Option<Detection<'_>> {
        // The first live checker of the longest interval.
        let (c, interval_ms) = self
            .live(now_ms)
            .filter_map(|c| c.interval().ms.map(|ms| (c, ms)))
            .min_by_key(|(_, ms)| std::cmp::Reverse(*ms))?;
        let detection_ms = interval_ms.saturating_mul(u64::from(lb_fall));
        Some(Detection {
            checker: &c.source,
            interval_ms,
            lb_fall,
            detection_ms,
            wait,
            short_ms: detection_ms.saturating_sub(wait.ms),
        })
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
    fn a_drain_sees_whether_the_lb_still_checks_from_its_next_check() {
        let mut c = Checkers::default();
        c.observe("a", 200, 10_000, 2);
        c.observe("a", 200, 10_400, 2);
        assert!(
            !c.checked_since(10_500),
            "the drain began at 10.5 s: nothing since"
        );
        c.observe("a", 200, 10_800, 2);
        assert!(c.checked_since(10_500), "the next check is recorded");
        assert!(
            !Checkers::default().checked_since(0),
            "no checker: nothing checked"
        );
    }

    #[test]
    fn the_first_200_announces_the_gateway() {
        let mut c = Checkers::default();
        c.observe("a", 503, 5, 2);
        assert_eq!(c.announced_ms, None, "a 503 WAIT announces nothing");
        c.observe("a", 200, 7, 2);
        c.observe("b", 200, 9, 2);
        assert_eq!(c.announced_ms, Some(7));
        let mut d = Checkers::default();
        assert!(d.announce(3) && !d.announce(4));
        assert_eq!(d.announced_ms, Some(3));
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
    fn the_gate_needs_a_404_from_every_live_checker_since_the_drain() {
        let mut c = Checkers::default();
        assert_eq!(
            c.gate(0, 0, false),
            Gate::NoLb,
            "no LB: nothing to wait for"
        );
        assert_eq!(
            c.gate(0, 0, true),
            Gate::NoChecker,
            "lb_checkers named, nobody asks"
        );
        assert!(
            c.gate(0, 0, false) != Gate::Open,
            "never saw what nobody asked"
        );
        c.observe("a", 404, 500, 2); // a 404 of an earlier drain
        c.observe("b", 200, 900, 2);
        assert_eq!(c.gate(1_000, 1_000, false), Gate::Waiting);
        c.observe("a", 404, 1_100, 2);
        assert!(c.gate(1_000, 1_100, false) != Gate::Open, "b not yet");
        c.observe("b", 404, 1_900, 2);
        assert!(c.gate(1_000, 1_900, false) == Gate::Open);
        // A checker appearing mid-drain holds the gate until its first check
        // is answered, which in DRAINING is a 404.
        c.observe("new", 200, 2_000, 2);
        assert!(c.gate(1_000, 2_000, false) != Gate::Open);
        c.observe("new", 404, 2_500, 2);
        assert!(c.gate(1_000, 2_500, false) == Gate::Open);
        // One that vanishes stops holding it after the TTL.
        c.observe("late", 200, 900, 2);
        assert!(c.gate(1_000, 2_500, false) != Gate::Open);
        let later = 900 + CHECKER_TTL_MS + 1;
        for k in ["a", "b", "new"] {
            c.observe(k, 404, later, 2);
        }
        assert!(
            c.gate(1_000, later, false) == Gate::Open,
            "late is no longer live"
        );
        // Every checker ages out: with lb_checkers named the gate holds again.
        let gone = later + CHECKER_TTL_MS + 1;
        assert_eq!(c.gate(1_000, gone, true), Gate::NoChecker);
        assert!(!Gate::NoChecker.passes() && Gate::NoLb.passes());
    }

    #[test]
    fn every_later_check_is_written_one_in_the_same_millisecond_is_not() {
        let mut c = Checkers::default();
        assert!(c.observe("a", 200, 0, 2), "a new checker");
        assert!(
            !c.observe("a", 200, 0, 2),
            "same answer, same millisecond: nothing to write"
        );
        assert!(c.observe("a", 200, 400, 2), "a gap: written");
        assert!(
            !c.observe("a", 200, 300, 2),
            "an earlier check written after a later one changes nothing"
        );
        assert_eq!(
            (c.list[0].last_seen_ms, &c.list[0].gaps_ms[..]),
            (400, &[400][..])
        );
        assert!(c.observe("a", 404, 400, 2), "a new answer always writes");
        assert!(c.ignore("10.9.9.9", 5), "a new ignored source");
        assert!(!c.ignore("10.9.9.9", 6));
    }

    /// Checks of "lb" at these times, answered `status`.
    fn checks(c: &mut Checkers, status: u16, times: impl IntoIterator<Item = u64>) {
        for t in times {
            c.observe("lb", status, t, 2);
        }
    }

    #[test]
    fn the_interval_is_the_median_of_the_last_gaps_once_there_are_three() {
        let mut c = Checkers::default();
        checks(&mut c, 200, [1_000, 1_501, 2_000]);
        let i = c.list[0].interval();
        assert_eq!(
            (i.ms, i.gaps, i.min_gap_ms, i.max_gap_ms),
            (None, 2, Some(499), Some(501)),
            "two gaps: no interval yet"
        );
        checks(&mut c, 200, [2_502]);
        assert_eq!(c.list[0].interval().ms, Some(501));
        // One missed check: a gap of 1 s among 500 ms ones.
        checks(&mut c, 200, [3_502, 4_002, 4_502]);
        let i = c.list[0].interval();
        assert_eq!((i.ms, i.gaps, i.max_gap_ms), (Some(500), 6, Some(1_000)));
        // The record keeps the last MAX_GAPS gaps only.
        checks(&mut c, 200, (1..=20).map(|k| 4_502 + k * 2_000));
        let i = c.list[0].interval();
        assert_eq!(
            (i.ms, i.gaps, i.min_gap_ms, i.max_gap_ms),
            (Some(2_000), MAX_GAPS, Some(2_000), Some(2_000)),
            "the LB now checks every 2 s"
        );
        assert_eq!(c.list[0].gaps_ms.len(), MAX_GAPS);
    }

    #[test]
    fn gaps_after_a_503_are_not_the_lb_s_interval_and_a_checker_back_starts_anew() {
        let mut c = Checkers::default();
        checks(&mut c, 200, [0, 2_000, 4_000, 6_000]);
        assert_eq!(c.list[0].interval().ms, Some(2_000));
        // The flip: the LB checks faster while it counts its fall (fastinter),
        // slower once the gateway is DOWN (downinter).
        checks(&mut c, 503, [8_000, 8_500, 18_500, 28_500]);
        assert_eq!(
            c.list[0].gaps_ms, [2_000; 4],
            "the gap to the first 503 is the LB's inter still; none after a 503"
        );
        checks(&mut c, 200, [29_000, 30_500]);
        assert_eq!(c.list[0].gaps_ms, [2_000, 2_000, 2_000, 2_000, 1_500]);
        // Gone longer than CHECKER_TTL_MS, then back: its old gaps are dropped.
        checks(&mut c, 200, [30_500 + CHECKER_TTL_MS + 1]);
        assert!(c.list[0].gaps_ms.is_empty());
        assert_eq!(c.list[0].interval().ms, None);
    }

    #[test]
    fn the_detection_is_lb_fall_times_the_slowest_live_checker_s_interval() {
        let wait = Wait {
            name: "lb_buffer",
            ms: 500,
        };
        let mut c = Checkers::default();
        assert_eq!(c.detection(0, 2, wait), None, "nobody checks");
        for t in [0, 500, 1_000, 1_500] {
            c.observe("fast", 200, t, 2);
        }
        for t in [0, 1_000, 2_000] {
            c.observe("slow", 200, t, 2);
        }
        let d = c.detection(2_000, 2, wait).unwrap();
        assert_eq!(
            (d.checker, d.interval_ms, d.detection_ms, d.short_ms),
            ("fast", 500, 1_000, 500),
            "slow has two gaps: not measured yet"
        );
        c.observe("slow", 200, 3_000, 2);
        let d = c.detection(3_000, 3, wait).unwrap();
        assert_eq!(
            (d.checker, d.interval_ms, d.detection_ms, d.short_ms),
            ("slow", 1_000, 3_000, 2_500)
        );
        let covered = Wait {
            name: "lb_buffer",
            ms: 3_000,
        };
        assert_eq!(c.detection(3_000, 3, covered).unwrap().short_ms, 0);
        let observed = Wait {
            name: "lb_down_timeout",
            ms: 2_000,
        };
        let d = c.detection(3_000, 2, observed).unwrap();
        assert_eq!((d.wait.name, d.short_ms), ("lb_down_timeout", 0));
        // slow stops checking: once it is gone, fast is the slowest again.
        for t in (4..=40).map(|k| k * 1_000) {
            c.observe("fast", 200, t, 2);
        }
        let later = 3_000 + CHECKER_TTL_MS + 1;
        assert_eq!(c.detection(later, 2, wait).unwrap().checker, "fast");
        assert_eq!(c.detection(later, 2, wait).unwrap().interval_ms, 1_000);
    }

    /// The address of the checker "lb" of the tests below, and of a client.
    fn lb() -> Option<IpAddr> {
        "10.0.0.9".parse().ok()
    }

    fn client() -> Option<IpAddr> {
        "10.1.2.3".parse().ok()
    }

    #[test]
    fn a_cut_right_after_a_checker_s_down_is_the_lb_s() {
        let mut c = Checkers::default();
        c.observe("10.0.0.9", 503, 1_000, 2);
        assert!(!c.cut_by_lb(1_100, lb), "one 503 is not DOWN");
        c.observe("10.0.0.9", 503, 2_000, 2);
        assert_eq!(c.list[0].down_ms, Some(2_000));
        for from in [lb, client] {
            assert!(c.cut_by_lb(2_000, from) && c.cut_by_lb(2_000 + CUT_WINDOW_MS, from));
            assert!(
                !c.cut_by_lb(2_001 + CUT_WINDOW_MS, from),
                "too late: not the DOWN's"
            );
            assert!(!c.cut_by_lb(1_999, from), "before the DOWN");
        }
        c.observe("10.0.0.9", 503, 3_000, 2);
        assert_eq!(c.list[0].down_ms, Some(2_000), "DOWN once per run of 503s");
        assert!(
            c.cut_by_lb(3_000 + CUT_WINDOW_MS, lb),
            "from the checker's address the 3rd 503 may be a second backend's DOWN"
        );
        assert!(
            !c.cut_by_lb(3_000 + CUT_WINDOW_MS, client),
            "from another address: 2 s after the DOWN, no more"
        );
        assert!(
            !c.cut_by_lb(3_000 + CUT_WINDOW_MS, || None),
            "an address unknown is another's"
        );
        c.observe("10.0.0.9", 200, 4_000, 2);
        c.observe("10.0.0.9", 503, 5_000, 2);
        c.observe("10.0.0.9", 503, 6_000, 2);
        assert_eq!(c.list[0].down_ms, Some(6_000), "DOWN again after an UP");
    }

    #[test]
    fn one_checker_at_inter_2s_holds_the_window_for_its_own_address_only() {
        // One HAProxy backend, inter 2s fall 2: 503s at 0, 2, 4, 6, 8 s. DOWN at
        // the 2nd; from its address the window runs to 2 s after the 4th
        // (DOWN_SPREAD); a client in the cluster closing then is not the LB's.
        let mut c = Checkers::default();
        for t in [10_000, 12_000, 14_000, 16_000, 18_000] {
            c.observe("10.0.0.9", 503, t, 2);
        }
        assert!(c.cut_by_lb(17_000, lb));
        assert!(!c.cut_by_lb(17_000, client), "3 s after the DOWN");
        assert!(
            c.cut_by_lb(13_000, client),
            "1 s after it: the LB's, by time alone"
        );
        assert!(!c.cut_by_lb(22_000, lb), "10 s after the DOWN: nobody's");
        let mut asked = false;
        assert!(!c.cut_by_lb(22_000, || {
            asked = true;
            lb()
        }));
        assert!(!asked, "no window open: the address is not read");
    }

    #[test]
    fn two_backends_checking_from_one_address_each_open_the_cut_window() {
        // haproxy.cfg with its passthrough frontend: backends A and B check the
        // same gateway from one address, 2 s apart each, 1.5 s out of phase.
        // The address's 2nd 503 (B's first) is not yet a DOWN; A's DOWN is its
        // 3rd, B's its 4th (2 s after the 2nd: the plain window would end there).
        let mut c = Checkers::default();
        for t in [10_000, 11_500, 12_000, 13_500] {
            c.observe("10.0.0.9", 503, t, 2);
        }
        assert_eq!(c.list[0].down_ms, Some(11_500));
        assert_eq!(c.list[0].down_last_ms, Some(13_500));
        assert!(c.cut_by_lb(12_001, lb), "A's DOWN");
        assert!(c.cut_by_lb(13_502, lb), "B's DOWN");
        assert!(c.cut_by_lb(13_500 + CUT_WINDOW_MS, lb));
        assert!(!c.cut_by_lb(13_501 + CUT_WINDOW_MS, lb));
        // Further 503s (both backends DOWN) no longer move the window.
        c.observe("10.0.0.9", 503, 14_000, 2);
        c.observe("10.0.0.9", 503, 15_500, 2);
        assert_eq!(c.list[0].down_last_ms, Some(13_500));
        assert!(
            !c.cut_by_lb(16_000, lb),
            "long after both DOWNs: not the LB's"
        );
        assert!(!c.cut_by_lb(11_499, lb), "before the first DOWN");
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
