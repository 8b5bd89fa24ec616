//! How long streams last, and the drain they call for: the input for
//! `drain_timeout` and `terminationGracePeriodSeconds`, measured from the
//! traffic itself.
//!
//! Each traffic root (one per worker) counts the streams that ended since its
//! last tick by the whole ticks they lasted (`Pending`: one division and one
//! increment, no host call, no search); the tick buckets them (`Durations`)
//! into the process's total (`merge`) and the Prometheus bucket counters
//! (`Histogram::cumulative`).
//!
//! Buckets (`BOUNDS_MS`): a duration `d` lands in the first with `d ≤ bound`,
//! ten per decade from 10 ms to 80 min, and one above. A quantile is the upper
//! bound of the bucket its rank falls in, never above the longest duration
//! seen: at most one bucket high (by under a third, or under 10 ms in the
//! first bucket) on top of the tick a duration is rounded up to (`Pending`),
//! never low. Durations are measured on tick boundaries: true to one `tick`
//! (100 ms by default), or to how late a busy worker runs its tick.
//!
//! The advice (`advise`) is built on the longest stream measured, not on a
//! quantile: a `drain_timeout` below it would have cut streams this traffic
//! already carried.

pub mod host;

use std::num::NonZeroU64;

use crate::json::object;

/// Upper bounds of the buckets (ms); one more bucket holds what is above.
pub const BOUNDS_MS: [u64; 60] = [
    10, 12, 15, 20, 25, 30, 40, 50, 60, 80, //
    100, 120, 150, 200, 250, 300, 400, 500, 600, 800, //
    1_000, 1_200, 1_500, 2_000, 2_500, 3_000, 4_000, 5_000, 6_000, 8_000, //
    10_000, 12_000, 15_000, 20_000, 25_000, 30_000, 40_000, 50_000, 60_000, 80_000, //
    100_000, 120_000, 150_000, 200_000, 250_000, 300_000, 400_000, 500_000, 600_000, 800_000,
    1_000_000, 1_200_000, 1_500_000, 2_000_000, 2_500_000, 3_000_000, 4_000_000, 5_000_000,
    6_000_000, 8_000_000,
];
/// Buckets: one per bound and one above the last.
pub const BUCKETS: usize = BOUNDS_MS.len() + 1;

/// The `le` bounds exported to Prometheus (ms), then `+Inf`, each a bound
/// here (an exported bucket is an exact sum): Envoy's own histogram bounds
/// (25 ms … 10 s, 30 s, 60 s, 5 min, 10 min), and 2, 20 and 50 min, so that a
/// `drain_timeout` of up to 60 min has a bucket at or above it.
pub const EXPORT_LE_MS: [u64; 16] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    1_200_000, 3_000_000,
];

/// Fewer samples than this and there is no advice ("not enough data").
pub const MIN_SAMPLES: u64 = 20;
/// What the advice adds to the measured tail, and its floor (s): the README's
/// sizing rule, `drain_timeout` = max(D + 30 s, 120 s).
pub const MARGIN_S: u64 = 30;
pub const FLOOR_S: u64 = 120;
/// The longest `drain_timeout` drain-gate accepts (s).
pub const MAX_DRAIN_TIMEOUT_S: u64 = 3_600;
/// What the grace period adds after `drain_timeout` + the longest CLOSING +
/// `scrape_interval` (s): the preStop hold's margin (5 s), istio-proxy's
/// `terminationDrainDuration` (5 s, Istio's default and the shipped values')
/// and 5 s spare — `verify.py --pod-spec`'s sum.
pub const GRACE_EXTRA_S: u64 = 15;

/// An HTTP stream is asked whether it was upgraded (an `upgrade` request
/// header: an HTTP/1.1 upgrade, or an HTTP/2 extended CONNECT as Envoy
/// presents it; else the CONNECT method) only when it lasted this long:
/// shorter streams cost no host call, and count as `Http`.
pub const CLASSIFY_FROM_MS: u64 = 1_000;

/// What a duration was of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An HTTP stream (request, gRPC call) that was not upgraded.
    Http,
    /// A WebSocket or CONNECT stream.
    Upgraded,
    /// A TCP or TLS-passthrough connection.
    Tcp,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Http, Kind::Upgraded, Kind::Tcp];
}

/// The bucket of a duration.
pub fn bucket(ms: u64) -> usize {
    BOUNDS_MS.partition_point(|b| *b < ms)
}

/// Durations of one kind, bucketed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Histogram {
    pub buckets: [u64; BUCKETS],
    pub count: u64,
    pub sum_ms: u64,
    pub max_ms: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            buckets: [0; BUCKETS],
            count: 0,
            sum_ms: 0,
            max_ms: 0,
        }
    }
}

/// What `/drain/status` shows of one kind: the count, quantiles and max.
impl serde::Serialize for Histogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let summary = object!(Summary {
            count: self.count,
            p50_ms: self.quantile(500),
            p99_ms: self.quantile(990),
            p999_ms: self.quantile(999),
            max_ms: (self.count > 0).then_some(self.max_ms),
        });
        summary.serialize(s)
    }
}

impl Histogram {
    /// `n` durations of `ms` into the buckets (not the count, sum or max).
    fn fill(&mut self, ms: u64, n: u64) {
        if let Some(b) = self.buckets.get_mut(bucket(ms)) {
            *b = b.saturating_add(n);
        }
    }

    /// `n` durations, `sum_ms` in all and `max_ms` the longest, into the
    /// count, sum and max (not the buckets).
    fn tally(&mut self, n: u64, sum_ms: u64, max_ms: u64) {
        self.count = self.count.saturating_add(n);
        self.sum_ms = self.sum_ms.saturating_add(sum_ms);
        self.max_ms = self.max_ms.max(max_ms);
    }

    /// The `q`-quantile (`per_mille` / 1000) of what was recorded: the
    /// upper bound of the bucket holding the sample of rank ⌈q × count⌉,
    /// at most `max_ms` (`None`: nothing recorded).
    pub fn quantile(&self, per_mille: u64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = self.count.saturating_mul(per_mille).div_ceil(1_000);
        let (rank, mut seen) = (rank.max(1).min(self.count), 0u64);
        let i = self.buckets.iter().position(|n| {
            seen = seen.saturating_add(*n);
            seen >= rank
        });
        let bound = i.and_then(|i| BOUNDS_MS.get(i)).unwrap_or(&u64::MAX);
        Some(self.max_ms.min(*bound))
    }

    /// The samples in buckets whose upper bound is above `ms`: every sample
    /// longer than `ms`, and those of its bucket that are not (exact when
    /// `ms` is a bound).
    pub fn above(&self, ms: u64) -> u64 {
        self.buckets
            .iter()
            .skip(bucket(ms.saturating_add(1)))
            .fold(0, |n, b| n.saturating_add(*b))
    }

    /// The samples at or below each of `EXPORT_LE_MS`, in order (then the
    /// `+Inf` bucket is `count`).
    pub fn cumulative(&self) -> [u64; EXPORT_LE_MS.len()] {
        let mut seen = 0u64;
        // One pass: each `le` takes up the running sums where the last left off.
        let mut sums = BOUNDS_MS.iter().zip(self.buckets.iter()).map(|(bound, n)| {
            seen = seen.saturating_add(*n);
            (*bound, seen)
        });
        EXPORT_LE_MS.map(|le| sums.find(|(b, _)| *b == le).map_or(0, |(_, n)| n))
    }
}

/// The length of the shared-data form of `Durations`: little-endian u64s,
/// per kind, the buckets, count, sum, max (fixed size, no parser). No
/// durations: `BYTES` zeros.
pub const BYTES: usize = 3 * (BUCKETS + 3) * 8;

/// Durations up to this many ticks are counted by ticks (`Pending`); longer
/// ones are bucketed at once.
pub const SLOTS: usize = 64;

/// One worker's stream ends since its last tick. A duration is measured on
/// tick boundaries, so it is a whole number of ticks but for the timers'
/// jitter: a stream is counted in the slot of its ticks rounded up, and read
/// back as that many ticks; the count, sum and max keep the milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// Never 0: a duration's ticks are a division without a check.
    tick_ms: NonZeroU64,
    /// Per kind (`Kind::ALL`'s order), the ends by ticks lasted, rounded up.
    slots: [[u64; SLOTS]; 3],
    /// Every end's count, sum and max; in the buckets, what lasted `SLOTS`
    /// ticks or more (or was kept back, `keep`).
    long: Durations,
}

impl Pending {
    pub fn new(tick_ms: u64) -> Pending {
        Pending {
            tick_ms: NonZeroU64::new(tick_ms).unwrap_or(NonZeroU64::MIN),
            slots: [[0; SLOTS]; 3],
            long: Durations::default(),
        }
    }

    /// A stream of `kind` ended after `ms`.
    pub fn record(&mut self, kind: Kind, ms: u64) {
        // Rounded up, never down: the slot is read back as its ticks, and a
        // duration read back shorter than it was would land in a bucket below
        // it — a quantile or an `le` bucket would say a stream was shorter
        // than measured. Up, it reads at most one tick long, and no search is
        // spent per stream.
        let ticks = ms / self.tick_ms + u64::from(ms % self.tick_ms != 0);
        let ticks = usize::try_from(ticks).unwrap_or(usize::MAX);
        if let Some((slots, h)) = self.lane(kind) {
            match slots.get_mut(ticks) {
                Some(n) => *n = n.wrapping_add(1),
                None => h.fill(ms, 1),
            }
            h.tally(1, ms, ms);
        }
    }

    /// `n` streams of `kind` that lasted 0 ms: `record(kind, 0)` `n` times.
    pub fn record_instant(&mut self, kind: Kind, n: u64) {
        if let Some(([first, ..], h)) = self.lane(kind) {
            *first = first.wrapping_add(n);
            h.tally(n, 0, 0);
        }
    }

    /// The slots of `kind`, and its histogram of the rest.
    fn lane(&mut self, kind: Kind) -> Option<(&mut [u64; SLOTS], &mut Histogram)> {
        let k = kind as usize;
        self.slots.get_mut(k).zip(self.long.0.get_mut(k))
    }

    pub fn is_empty(&self) -> bool {
        self.long.0.iter().all(|h| h.count == 0)
    }

    /// What was recorded, bucketed; and starts again. Only the slots up to
    /// each kind's longest end are looked at.
    pub fn take(&mut self) -> Durations {
        let mut d = std::mem::take(&mut self.long);
        let tick_ms = self.tick_ms.get();
        for (slots, h) in self.slots.iter_mut().zip(&mut d.0) {
            // Nothing recorded: no slot to look at.
            if h.count == 0 {
                continue;
            }
            let top = usize::try_from(h.max_ms.div_ceil(tick_ms)).unwrap_or(SLOTS);
            for (ticks, n) in (0u64..).zip(slots.iter_mut().take(top.saturating_add(1))) {
                if *n > 0 {
                    h.fill(ticks.saturating_mul(tick_ms), std::mem::take(n));
                }
            }
        }
        d
    }
}

/// Rewrites the `i`th little-endian `u64` of `bytes` as `f` makes it.
fn update_word(bytes: &mut [u8], i: usize, f: impl Fn(u64) -> u64) {
    if let Some(w) = bytes.get_mut(i * 8..i * 8 + 8) {
        let v = <[u8; 8]>::try_from(&*w).map_or(0, u64::from_le_bytes);
        w.copy_from_slice(&f(v).to_le_bytes());
    }
}

/// The durations of every kind, in `Kind::ALL`'s order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durations(pub [Histogram; 3]);

/// `/drain/status` `durations`: each kind's summary by its name.
impl serde::Serialize for Durations {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(["http", "upgraded", "tcp"].iter().zip(&self.0))
    }
}

impl Durations {
    pub fn merge(&mut self, other: &Durations) {
        for (h, o) in self.0.iter_mut().zip(&other.0) {
            for (a, b) in h.buckets.iter_mut().zip(o.buckets.iter()) {
                *a = a.saturating_add(*b);
            }
            h.tally(o.count, o.sum_ms, o.max_ms);
        }
    }

    /// Adds these durations to `bytes`, the shared-data form (`BYTES`) of a total, in
    /// place: only the words of buckets that moved are read and written. `false`:
    /// `bytes` is not that form (left as it was).
    pub fn add_into(&self, bytes: &mut [u8]) -> bool {
        if bytes.len() != BYTES {
            return false;
        }
        // Per kind: the buckets, count, sum, then max.
        for (h, words) in self.0.iter().zip(bytes.chunks_exact_mut(BYTES / 3)) {
            if h.count == 0 {
                continue; // nothing recorded: every bucket, the sum and the max are 0
            }
            let adds = h.buckets.iter().copied().chain([h.count, h.sum_ms]);
            for (i, n) in adds.enumerate().filter(|(_, n)| *n > 0) {
                update_word(words, i, |v| v.saturating_add(n));
            }
            if h.max_ms > 0 {
                update_word(words, BUCKETS + 2, |v| v.max(h.max_ms));
            }
        }
        true
    }

    /// `None`: not the shared-data form (`BYTES`).
    pub fn from_bytes(bytes: &[u8]) -> Option<Durations> {
        let mut next = crate::gate::liveness::words(bytes, BYTES / 8)?;
        let mut d = Durations::default();
        for h in &mut d.0 {
            h.buckets.fill_with(&mut next);
            (h.count, h.sum_ms, h.max_ms) = (next(), next(), next());
        }
        Some(d)
    }
}

/// `/drain/status` `advice`: what the measured traffic calls for.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Advice {
    pub drain_timeout_s: Option<u64>,
    pub termination_grace_period_s: Option<u64>,
    /// The measured figure D is made from (ms): the longest HTTP stream.
    pub based_on_ms: Option<u64>,
    pub based_on: String,
}

/// The advice for the HTTP streams `d` measured, CLOSING lasting up to
/// `closing_ms` (`lb_buffer`, or `lb_down_timeout` with `close_after:
/// lb_observed_down`) and the preStop's answer `scrape_ms` after CLOSED:
/// `drain_timeout` = max(D + 30 s, 120 s), D the longest HTTP stream in whole
/// seconds (at most 60 min: `based_on` then says how many it may cut), and
/// `terminationGracePeriodSeconds` = `drain_timeout` + CLOSING +
/// `scrape_interval` + 15 s. D is the longest, not a quantile: from 1,000
/// streams on a p99.9 can sit below the slowest. Upgraded streams and TCP
/// connections are not in D: they last as long as their clients keep them
/// (drain_timeout ends them; the receipt counts them).
pub fn advise(d: &Durations, closing_ms: u64, scrape_ms: u64) -> Advice {
    let [http, ..] = &d.0;
    let (n, longest) = (http.count, http.max_ms);
    if n < MIN_SAMPLES {
        return Advice {
            based_on: format!("not enough data: {n} HTTP streams measured, {MIN_SAMPLES} needed"),
            ..Advice::default()
        };
    }
    // Whole seconds of a u64 of ms: adding to them cannot overflow.
    let wanted = longest.div_ceil(1_000) + MARGIN_S;
    let timeout = wanted.clamp(FLOOR_S, MAX_DRAIN_TIMEOUT_S);
    let grace = timeout + closing_ms.saturating_add(scrape_ms).div_ceil(1_000) + GRACE_EXTRA_S;
    let cut = (wanted > MAX_DRAIN_TIMEOUT_S).then(|| http.above(MAX_DRAIN_TIMEOUT_S * 1_000));
    let capped = cut.map_or_else(String::new, |cut| {
        format!(" (capped at drain_timeout's 60m: up to {cut} of them last longer and are cut)")
    });
    Advice {
        drain_timeout_s: Some(timeout),
        termination_grace_period_s: Some(grace),
        based_on_ms: Some(longest),
        based_on: format!("longest of {n} HTTP streams: {longest} ms{capped}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    impl Histogram {
        pub fn record(&mut self, ms: u64) {
            self.fill(ms, 1);
            self.tally(1, ms, ms);
        }
    }

    impl Durations {
        pub fn kind(&self, kind: Kind) -> &Histogram {
            &self.0[kind as usize]
        }

        pub fn kind_mut(&mut self, kind: Kind) -> &mut Histogram {
            &mut self.0[kind as usize]
        }

        pub fn record(&mut self, kind: Kind, ms: u64) {
            self.kind_mut(kind).record(ms);
        }

        /// The shared-data form (`BYTES`) of these durations.
        pub fn to_bytes(&self) -> Vec<u8> {
            let mut out = Vec::with_capacity(BYTES);
            for h in &self.0 {
                for v in h.buckets.iter().chain([h.count, h.sum_ms, h.max_ms].iter()) {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            out
        }
    }

    #[test]
    fn bounds_rise_by_at_most_a_third_and_exports_are_bounds() {
        for w in BOUNDS_MS.windows(2) {
            assert!(w[0] < w[1] && w[1] * 3 <= w[0] * 4, "{w:?}");
        }
        for le in EXPORT_LE_MS {
            assert!(BOUNDS_MS.contains(&le), "{le}");
        }
        assert!(EXPORT_LE_MS.windows(2).all(|w| w[0] < w[1]));
        assert!(*EXPORT_LE_MS.last().unwrap() >= MAX_DRAIN_TIMEOUT_S * 1_000 / 2);
    }

    #[test]
    fn a_duration_lands_in_the_first_bucket_at_or_above_it() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(10), 0);
        assert_eq!(bucket(11), 1);
        assert_eq!(bucket(2_000), 23);
        assert_eq!(bucket(8_000_000), 59);
        assert_eq!(bucket(8_000_001), 60);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn twenty_short_and_four_long_streams() {
        let mut h = Histogram::default();
        for _ in 0..20 {
            h.record(300);
        }
        for _ in 0..4 {
            h.record(2_100);
        }
        let s = serde_json::to_value(h).unwrap();
        assert_eq!(s["count"], 24);
        assert_eq!(s["p50_ms"], 300);
        assert_eq!(s["p99_ms"], 2_100, "the bucket's 2.5 s, capped at the max");
        assert_eq!(s["p999_ms"], 2_100);
        assert_eq!(s["max_ms"], 2_100);
        assert_eq!(h.cumulative()[..6], [0, 0, 0, 0, 20, 20]);
        assert_eq!(h.cumulative()[6], 24);
        let none = serde_json::json!({"count": 0, "p50_ms": null, "p99_ms": null, "p999_ms": null, "max_ms": null});
        assert_eq!(serde_json::to_value(Histogram::default()).unwrap(), none);
    }

    #[test]
    fn bytes_round_trip_and_a_wrong_length_is_refused() {
        assert_eq!(Durations::default().to_bytes(), vec![0; BYTES]);
        let mut d = Durations::default();
        d.record(Kind::Upgraded, 3_000);
        d.record(Kind::Tcp, u64::MAX);
        assert_eq!(Durations::from_bytes(&d.to_bytes()), Some(d));
        assert_eq!(Durations::from_bytes(&[0; 7]), None);
        // The last kind's max is the last word: added in place like the rest.
        let mut bytes = Durations::default().to_bytes();
        let mut one = Durations::default();
        one.record(Kind::Tcp, 0);
        assert!(one.add_into(&mut bytes));
        assert_eq!(Durations::from_bytes(&bytes), Some(one));
        assert_eq!(Durations::from_bytes(b""), None);
    }

    #[test]
    fn advice_follows_the_sizing_rule() {
        let mut d = Durations::default();
        let a = advise(&d, 10_000, 0);
        assert_eq!(a.drain_timeout_s, None);
        assert!(a.based_on.starts_with("not enough data: 0 HTTP streams"));
        for _ in 0..19 {
            d.record(Kind::Http, 2_000);
        }
        assert_eq!(advise(&d, 10_000, 0).drain_timeout_s, None);
        d.record(Kind::Http, 2_000);
        let a = advise(&d, 10_000, 0);
        assert_eq!(
            (a.drain_timeout_s, a.termination_grace_period_s),
            (Some(120), Some(145)),
            "the table's 2 s row"
        );
        assert_eq!(a.based_on, "longest of 20 HTTP streams: 2000 ms");
        assert_eq!(a.based_on_ms, Some(2_000));
        let mut long = Durations::default();
        for _ in 0..20 {
            long.record(Kind::Http, 100_000);
            long.record(Kind::Upgraded, 9_000_000);
        }
        let a = advise(&long, 10_000, 0);
        assert_eq!(
            (a.drain_timeout_s, a.termination_grace_period_s),
            (Some(130), Some(155))
        );
        long.record(Kind::Http, 9_000_000);
        let a = advise(&long, 60_000, 0);
        assert_eq!(a.drain_timeout_s, Some(3_600));
        assert_eq!(a.termination_grace_period_s, Some(3_675));
        assert_eq!(
            a.based_on,
            "longest of 21 HTTP streams: 9000000 ms \
             (capped at drain_timeout's 60m: up to 1 of them last longer and are cut)"
        );
        assert_eq!(
            advise(&long, 60_000, 15_000).termination_grace_period_s,
            Some(3_690)
        );
    }

    #[test]
    fn the_advice_covers_the_one_long_stream_among_ten_thousand_short() {
        let mut p = Pending::new(100);
        for i in 0..10_000u64 {
            p.record(Kind::Http, 200 + i % 100);
        }
        p.record(Kind::Http, 95_001);
        let mut d = Durations::default();
        d.merge(&p.take());
        assert_eq!(
            d.kind(Kind::Http).quantile(999),
            Some(300),
            "the p99.9 is a short one"
        );
        let a = advise(&d, 10_000, 0);
        assert_eq!(a.based_on_ms, Some(95_001));
        assert_eq!(
            (a.drain_timeout_s, a.termination_grace_period_s),
            (Some(126), Some(151)),
            "96 s + 30 s"
        );
        assert_eq!(a.based_on, "longest of 10001 HTTP streams: 95001 ms");
    }

    #[test]
    fn above_counts_the_buckets_past_a_duration() {
        let mut h = Histogram::default();
        for ms in [100, 3_000_000, 3_500_000, 4_000_000, 9_000_000] {
            h.record(ms);
        }
        assert_eq!(h.above(3_000_000), 3, "a bound: exact");
        assert_eq!(h.above(3_600_000), 3, "3.5 M shares 4 M's bucket");
        assert_eq!(h.above(8_000_000), 1);
        assert_eq!(h.above(u64::MAX), 1, "the last bucket has no bound");
        assert_eq!(h.above(0), 5);
    }

    #[test]
    fn pending_counts_by_ticks_and_buckets_at_the_tick() {
        let mut p = Pending::new(100);
        assert!(p.is_empty());
        for ms in [0, 99, 300, 2_004, 6_400, 9_000_000] {
            p.record(Kind::Http, ms);
        }
        p.record(Kind::Tcp, 250);
        assert!(!p.is_empty());
        let d = p.take();
        assert!(p.is_empty() && p.take() == Durations::default());
        p.long.merge(&d);
        assert_eq!(p.take(), d, "kept for the next tick");
        let mut want = Durations::default();
        for ms in [0, 100, 300, 2_100, 6_400, 9_000_000] {
            want.record(Kind::Http, ms);
        }
        want.record(Kind::Tcp, 300);
        want.kind_mut(Kind::Http).sum_ms = 99 + 300 + 2_004 + 6_400 + 9_000_000;
        want.kind_mut(Kind::Tcp).sum_ms = 250;
        want.kind_mut(Kind::Tcp).max_ms = 250;
        assert_eq!(d, want, "ticks rounded up, the sum and max in ms");
    }

    /// The exact `per_mille` quantile of `samples`: the sample of rank ⌈q × n⌉.
    fn exact(samples: &[u64], per_mille: u64) -> u64 {
        let mut s = samples.to_vec();
        s.sort_unstable();
        let n = s.len() as u64;
        let rank = (n * per_mille).div_ceil(1_000).clamp(1, n);
        s[(rank - 1) as usize]
    }

    proptest! {
        #[test]
        fn a_quantile_reads_high_by_at_most_one_bucket_never_low(
            samples in prop::collection::vec(prop_oneof![0u64..20_000, 0u64..10_000_000], 1..300),
            per_mille in prop::sample::select(vec![1u64, 500, 900, 990, 999, 1_000]),
        ) {
            let mut h = Histogram::default();
            for s in &samples {
                h.record(*s);
            }
            let got = h.quantile(per_mille).unwrap();
            let want = exact(&samples, per_mille);
            prop_assert!(got >= want, "{got} < {want}");
            prop_assert!(got <= h.max_ms);
            // One bucket high at most: a third, under 10 ms in the first
            // bucket, the max itself above the last bound.
            prop_assert!(got * 3 <= want * 4 || got <= 10 || got == h.max_ms, "{got} vs {want}");
        }

        #[test]
        fn merging_is_recording_everything_in_one(
            a in prop::collection::vec(0u64..10_000_000, 0..100),
            b in prop::collection::vec(0u64..10_000_000, 0..100),
        ) {
            let (mut ha, mut hb, mut all) = (Durations::default(), Durations::default(), Durations::default());
            for s in &a { ha.record(Kind::Http, *s); all.record(Kind::Http, *s); }
            for s in &b { hb.record(Kind::Tcp, *s); all.record(Kind::Tcp, *s); }
            let mut m = ha;
            m.merge(&hb);
            prop_assert_eq!(m, all);
            let mut r = hb;
            r.merge(&ha);
            prop_assert_eq!(r, all);
            prop_assert_eq!(Durations::from_bytes(&m.to_bytes()), Some(m));
            let mut bytes = ha.to_bytes();
            prop_assert!(hb.add_into(&mut bytes));
            prop_assert_eq!(Durations::from_bytes(&bytes), Some(all));
            prop_assert!(!hb.add_into(&mut bytes[1..].to_vec()));
            let cum = m.kind(Kind::Http).cumulative();
            for (le, n) in EXPORT_LE_MS.iter().zip(cum) {
                prop_assert_eq!(n, a.iter().filter(|s| *s <= le).count() as u64);
            }
            prop_assert_eq!(m.kind(Kind::Http).buckets.iter().sum::<u64>(), a.len() as u64);
        }
    }
}
