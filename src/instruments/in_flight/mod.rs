//! How old the streams in flight are: what a drain is waiting for.
//!
//! No host call per stream: each traffic root context (one per worker) keeps
//! its streams in buckets keyed by the tick they started in (`Ages`, on the
//! timers' clock: `clock::Now::timer_ms`), and its tick publishes a
//! `Published` summary of them when it changed (otherwise it is as fresh as
//! the worker's heartbeat). A reader merges every worker's (`merge`). A
//! stream starts at the last tick before it, so an age reads long by less than
//! one `tick`, and a summary is at most one tick old, in and outside a drain.
//!
//! Memory stays bounded: past `MAX_BUCKETS` distinct start ticks the two
//! closest buckets merge under the older key (ages read long, never short).
//!
//! The list is as old as its summaries, the count exact at any moment: a
//! reader sets the list beside the count it reads after them
//! (`InFlight::beside_count`), so that a status never lists a stream the count
//! says has ended, and says how old the list is.

pub mod host;

use crate::gate::liveness::{put_words, words};
use crate::json::record;

/// Upper bounds of the age classes: < 1 s, < 10 s, < 60 s, and ≥ 60 s.
pub const AGE_BOUNDS_MS: [u64; 3] = [1_000, 10_000, 60_000];
/// Distinct start ticks one worker keeps apart before merging the closest.
pub const MAX_BUCKETS: usize = 256;
/// A worker's summary is stale after three of its ticks, and never before this.
const STALE_MIN_MS: u64 = 1_000;

/// One worker's streams in flight, by start tick (ms since the epoch).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ages {
    /// (start tick, streams), oldest first, every count above 0, at most
    /// `MAX_BUCKETS` and the current tick's: at that size as quick as a tree
    /// (a stream usually enters and ends in the newest bucket).
    buckets: Vec<(u64, u64)>,
}

record! {
    /// The streams in flight per age class, youngest first.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Histogram {
        pub lt_1s: u64,
        pub lt_10s: u64,
        pub lt_60s: u64,
        pub ge_60s: u64,
    }
}

impl Histogram {
    /// The age classes, youngest first.
    fn counts(self) -> [u64; 4] {
        [self.lt_1s, self.lt_10s, self.lt_60s, self.ge_60s]
    }

    fn add(&mut self, age_ms: u64, n: u64) {
        let slot = match age_ms {
            a if a < AGE_BOUNDS_MS[0] => &mut self.lt_1s,
            a if a < AGE_BOUNDS_MS[1] => &mut self.lt_10s,
            a if a < AGE_BOUNDS_MS[2] => &mut self.lt_60s,
            _ => &mut self.ge_60s,
        };
        *slot = slot.saturating_add(n);
    }

    fn merge(&mut self, other: &Histogram) {
        self.lt_1s = self.lt_1s.saturating_add(other.lt_1s);
        self.lt_10s = self.lt_10s.saturating_add(other.lt_10s);
        self.lt_60s = self.lt_60s.saturating_add(other.lt_60s);
        self.ge_60s = self.ge_60s.saturating_add(other.ge_60s);
    }
}

/// What a worker publishes from its tick when it differs from what it
/// published last but for `at_ms` (`same_as`): a worker whose streams did not
/// change writes nothing, and its readers, who take its last tick from its
/// beat, parse nothing new.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// When it was published (ms, on the timers' clock); a reader takes the
    /// publisher's last tick instead, when it knows it.
    pub at_ms: u64,
    /// The publisher's `tick`: a summary not refreshed for three of them
    /// (and at least a second) is a worker that stopped, and is left out.
    pub tick_ms: u64,
    /// The start tick of the oldest stream in flight, if any.
    pub oldest_started_ms: Option<u64>,
    /// Ages as of `at_ms`: as of every tick since, when they are the same.
    pub ages: Histogram,
}

impl Published {
    /// Whether `other` says what this says, but for when it was published.
    pub fn same_as(&self, other: &Published) -> bool {
        Published {
            at_ms: other.at_ms,
            ..*self
        } == *other
    }

    /// Seven little-endian `u64` (`crate::gate::liveness::put_words`): `at_ms`,
    /// `tick_ms`, `oldest_started_ms` (`u64::MAX`: none), then the ages
    /// youngest first.
    pub fn to_bytes(&self) -> [u8; 56] {
        let [a, b, c, d] = self.ages.counts();
        let oldest = self.oldest_started_ms.unwrap_or(u64::MAX);
        put_words(&[self.at_ms, self.tick_ms, oldest, a, b, c, d])
    }

    /// The summary `to_bytes` wrote (`None`: another form).
    pub fn from_bytes(bytes: &[u8]) -> Option<Published> {
        let mut next = words(bytes, 7)?;
        Some(Published {
            at_ms: next(),
            tick_ms: next(),
            oldest_started_ms: Some(next()).filter(|v| *v != u64::MAX),
            ages: Histogram {
                lt_1s: next(),
                lt_10s: next(),
                lt_60s: next(),
                ge_60s: next(),
            },
        })
    }
}

/// Every worker's streams, merged: what `/drain/status` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Age of the oldest stream in flight (ms), to one `tick`.
    pub oldest_age_ms: Option<u64>,
    pub ages: Histogram,
    /// The moment the list is true at (timers' clock): the oldest of the
    /// merged summaries' (`None`: none was merged), or, set beside a count
    /// that reads 0, the moment of that reading.
    pub as_of_ms: Option<u64>,
    /// Set beside a reliable count below the streams listed: at least one of
    /// them has ended since `as_of_ms`, which the list cannot say.
    pub older_than_count: bool,
    /// The oldest of the last ticks of every worker whose summary was read,
    /// stale ones included: what the workers count at the tick that publishes
    /// their summaries (a drain's completed ends, `crate::instruments::receipt`)
    /// is counted up to this moment.
    pub ticked_ms: Option<u64>,
}

impl Ages {
    /// `n` streams started at `tick_ms` (none: nothing changes).
    pub fn enter(&mut self, tick_ms: u64, n: u64) {
        if n == 0 {
            return;
        }
        let i = self.buckets.partition_point(|(k, _)| *k < tick_ms);
        match self.buckets.get_mut(i) {
            Some((k, m)) if *k == tick_ms => *m = m.saturating_add(n),
            _ => self.buckets.insert(i, (tick_ms, n)),
        }
    }

    /// A stream that entered at `started_ms` ends. Its bucket is the one with
    /// the greatest key not after it (a merge may have moved it older); if the
    /// clock stepped back there may be none, and the oldest bucket gives one.
    pub fn exit(&mut self, started_ms: u64) {
        let after = self.buckets.partition_point(|(k, _)| *k <= started_ms);
        let i = after.saturating_sub(1);
        let Some((_, n)) = self.buckets.get_mut(i) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.buckets.remove(i);
        }
    }

    pub fn in_flight(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0, |a, (_, n)| a.saturating_add(*n))
    }

    /// Keeps at most `MAX_BUCKETS` buckets (the tick runs this): merges the
    /// two adjacent buckets closest in start time into the older one.
    pub fn compact(&mut self) {
        while self.buckets.len() > MAX_BUCKETS {
            let gaps = self.buckets.iter().zip(self.buckets.iter().skip(1));
            let closest = gaps
                .enumerate()
                .map(|(i, ((a, _), (b, _)))| (b.saturating_sub(*a), i));
            let Some((_, older)) = closest.min() else {
                return;
            };
            let (_, moved) = self.buckets.remove(older.saturating_add(1));
            if let Some((_, n)) = self.buckets.get_mut(older) {
                *n = n.saturating_add(moved);
            }
        }
    }

    pub fn publish(&self, now_ms: u64, tick_ms: u64) -> Published {
        let mut ages = Histogram::default();
        for (started, n) in &self.buckets {
            ages.add(now_ms.saturating_sub(*started), *n);
        }
        Published {
            at_ms: now_ms,
            tick_ms,
            oldest_started_ms: self.buckets.first().map(|(k, _)| *k),
            ages,
        }
    }
}

/// Merges the workers' summaries, read at `now_ms`, leaving out stale ones.
pub fn merge(published: &[Published], now_ms: u64) -> InFlight {
    let oldest = |a: Option<u64>, b: u64| Some(a.map_or(b, |a| a.min(b)));
    let mut out = InFlight::default();
    for p in published {
        out.ticked_ms = oldest(out.ticked_ms, p.at_ms);
        if now_ms.saturating_sub(p.at_ms) > p.tick_ms.saturating_mul(3).max(STALE_MIN_MS) {
            continue; // stale
        }
        out.ages.merge(&p.ages);
        out.as_of_ms = oldest(out.as_of_ms, p.at_ms);
        let age = p.oldest_started_ms.map(|s| now_ms.saturating_sub(s));
        out.oldest_age_ms = out.oldest_age_ms.max(age); // None < Some
    }
    out
}

impl InFlight {
    /// The streams listed, every age class.
    pub fn listed(&self) -> u64 {
        self.ages.counts().into_iter().fold(0, u64::saturating_add)
    }

    /// The list set beside the count `active`, read after the summaries it
    /// merges, at `now_ms`. A reliable count never reads below the counted
    /// streams in flight, and a listed stream still in flight was counted
    /// before its summary was published: at 0 the list is empty as of now;
    /// below it, at least that many listed streams ended since
    /// (`older_than_count`). An unreliable count says neither (a stream it
    /// could not count is listed).
    pub fn beside_count(self, active: u64, reliable: bool, now_ms: u64) -> InFlight {
        if reliable && active == 0 {
            return InFlight {
                as_of_ms: Some(now_ms),
                ticked_ms: self.ticked_ms,
                ..InFlight::default()
            };
        }
        InFlight {
            older_than_count: reliable && self.listed() > active,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_aged_by_their_start_tick() {
        let mut a = Ages::default();
        a.enter(1_000, 1);
        a.enter(1_000, 1);
        a.enter(5_500, 1);
        let p = a.publish(6_000, 100);
        assert_eq!(p.oldest_started_ms, Some(1_000));
        assert_eq!(
            p.ages,
            Histogram {
                lt_1s: 1,
                lt_10s: 2,
                lt_60s: 0,
                ge_60s: 0
            }
        );
        a.exit(1_000);
        a.exit(1_000);
        assert_eq!(a.publish(6_000, 100).oldest_started_ms, Some(5_500));
        a.exit(5_500);
        assert_eq!(
            a.publish(6_000, 100),
            Published {
                at_ms: 6_000,
                tick_ms: 100,
                ..Published::default()
            }
        );
    }

    #[test]
    fn a_summary_round_trips_its_fixed_form_and_compares_without_its_time() {
        let mut a = Ages::default();
        a.enter(1_000, 1);
        let p = a.publish(1_500, 100);
        assert_eq!(Published::from_bytes(&p.to_bytes()), Some(p));
        let none = Published::default();
        assert_eq!(Published::from_bytes(&none.to_bytes()), Some(none));
        assert_eq!(Published::from_bytes(b"{}"), None);
        assert!(p.same_as(&a.publish(1_900, 100)), "only its time moved");
        assert!(!p.same_as(&a.publish(2_000, 100)), "a second old now");
    }

    #[test]
    fn age_classes_have_their_bounds() {
        let mut h = Histogram::default();
        for age in [0, 999, 1_000, 9_999, 10_000, 59_999, 60_000, u64::MAX] {
            h.add(age, 1);
        }
        assert_eq!(
            h,
            Histogram {
                lt_1s: 2,
                lt_10s: 2,
                lt_60s: 2,
                ge_60s: 2
            }
        );
    }

    #[test]
    fn an_exit_finds_a_bucket_even_after_the_clock_stepped_back() {
        let mut a = Ages::default();
        a.exit(7);
        assert_eq!(a, Ages::default());
        a.enter(10, 1);
        a.exit(9);
        assert_eq!(a.in_flight(), 0);
    }

    #[test]
    fn streams_enter_a_tick_together() {
        let mut a = Ages::default();
        a.enter(4_000, 0);
        assert_eq!(a, Ages::default(), "no streams, no bucket");
        a.enter(4_000, 2);
        a.enter(4_000, 1);
        a.enter(3_500, 1);
        assert_eq!(a.buckets, vec![(3_500, 1), (4_000, 3)]);
    }

    #[test]
    fn compaction_bounds_buckets_and_ages_only_read_longer() {
        let mut a = Ages::default();
        let n = MAX_BUCKETS as u64 + 50;
        for t in 0..n {
            a.enter(t * 100, 1);
        }
        a.compact();
        assert!(a.buckets.len() <= MAX_BUCKETS);
        assert_eq!(a.in_flight(), n);
        assert_eq!(a.publish(n * 100, 100).oldest_started_ms, Some(0));
        for t in 0..n {
            a.exit(t * 100);
        }
        assert_eq!(a.in_flight(), 0);
        assert!(a.buckets.is_empty());
    }

    #[test]
    fn merge_takes_the_oldest_and_sums_and_drops_stale_workers() {
        let w1 = Published {
            at_ms: 10_000,
            tick_ms: 100,
            oldest_started_ms: Some(7_000),
            ages: Histogram {
                lt_1s: 1,
                lt_10s: 1,
                ..Histogram::default()
            },
        };
        let w2 = Published {
            at_ms: 10_050,
            tick_ms: 100,
            oldest_started_ms: Some(9_900),
            ages: Histogram {
                lt_1s: 2,
                ..Histogram::default()
            },
        };
        let dead = Published {
            at_ms: 8_000,
            tick_ms: 100,
            oldest_started_ms: Some(0),
            ages: Histogram {
                ge_60s: 9,
                ..Histogram::default()
            },
        };
        let m = merge(&[w1, w2, dead], 10_100);
        assert_eq!(m.oldest_age_ms, Some(3_100));
        assert_eq!(
            m.ages,
            Histogram {
                lt_1s: 3,
                lt_10s: 1,
                ..Histogram::default()
            }
        );
        assert_eq!(merge(&[], 5), InFlight::default());
        let slow = Published {
            tick_ms: 5_000,
            ..dead
        };
        assert_eq!(
            merge(&[slow], 10_100).ages.ge_60s,
            9,
            "a 5 s tick is stale only after 15 s"
        );
        assert_eq!(m.as_of_ms, Some(10_000), "the older of the fresh summaries");
        assert_eq!(
            m.ticked_ms,
            Some(8_000),
            "the stale worker's last tick counts too"
        );
    }

    /// One worker with `n` streams started at 5 000, published at 10 000.
    fn listed(n: u64) -> InFlight {
        let mut a = Ages::default();
        for _ in 0..n {
            a.enter(5_000, 1);
        }
        merge(&[a.publish(10_000, 100)], 10_040)
    }

    #[test]
    fn a_count_at_0_empties_the_list_as_of_its_reading() {
        let list = listed(1);
        assert_eq!(
            (list.oldest_age_ms, list.as_of_ms, list.listed()),
            (Some(5_040), Some(10_000), 1)
        );
        let beside = list.beside_count(0, true, 10_050);
        assert_eq!(
            beside,
            InFlight {
                as_of_ms: Some(10_050),
                ticked_ms: Some(10_000),
                ..InFlight::default()
            },
            "the stream ended after the summary: nothing in flight now"
        );
        assert_eq!(
            InFlight::default().beside_count(0, true, 7),
            InFlight {
                as_of_ms: Some(7),
                ..InFlight::default()
            },
            "no summary at all: the count alone says the list is empty"
        );
    }

    #[test]
    fn a_count_below_the_list_says_the_list_is_older() {
        let list = listed(3);
        let behind = list.beside_count(1, true, 10_050);
        assert!(behind.older_than_count);
        assert_eq!(
            (behind.listed(), behind.as_of_ms),
            (3, Some(10_000)),
            "which of them ended is not known: the list is kept, with its age"
        );
        for (active, reliable) in [(3, true), (9, true), (1, false), (0, false)] {
            assert_eq!(
                list.beside_count(active, reliable, 10_050),
                list,
                "active {active}, reliable {reliable}"
            );
        }
    }
}
