//! Time for the drain timers. Pure. Every timer measures elapsed time on the
//! host's monotonic clock, which no step of the wall clock moves (a host
//! without one leaves them on the wall clock); the wall clock only dates what
//! the status and the log show. `Steps` watches wall minus monotonic, constant
//! until someone steps the wall clock, to make a step visible.

use crate::json::{named, record};

/// Both host clocks, read together (milliseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Since the Unix epoch: for display only.
    pub wall_ms: u64,
    /// The host's monotonic clock (arbitrary origin, one per process), if it answered.
    pub mono_ms: Option<u64>,
}

named! {
    /// Which clock the timers run on.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Timers {
        Monotonic = "monotonic",
        Wall = "wall",
    }
}

impl Now {
    pub fn timers(self) -> Timers {
        self.mono_ms.map_or(Timers::Wall, |_| Timers::Monotonic)
    }

    /// Milliseconds on the clock the timers run on (monotonic when the host
    /// has it): for ages compared within one process, never for display.
    pub fn timer_ms(self) -> u64 {
        self.mono_ms.unwrap_or(self.wall_ms)
    }

    /// Milliseconds since the instant that read `wall_at` and `mono_at`: on
    /// the monotonic clock when both readings have it, else on the wall clock.
    pub fn since(self, wall_at: u64, mono_at: Option<u64>) -> u64 {
        match (self.mono_ms, mono_at) {
            (Some(now), Some(at)) => now.saturating_sub(at),
            _ => self.wall_ms.saturating_sub(wall_at),
        }
    }

    /// Whether `span_ms` has passed since that instant (`false` for an
    /// instant that has not come).
    pub fn passed(self, wall_at: Option<u64>, mono_at: Option<u64>, span_ms: u64) -> bool {
        wall_at.is_some_and(|at| self.since(at, mono_at) >= span_ms)
    }

    /// Wall clock minus monotonic clock, if the host has both.
    pub fn offset_ms(self) -> Option<i64> {
        let wall = i64::try_from(self.wall_ms).ok()?;
        let mono = i64::try_from(self.mono_ms?).ok()?;
        Some(wall.saturating_sub(mono))
    }
}

/// An offset change at least this large is a step (smaller: rounding, tick
/// jitter or NTP slewing, at most 0.5 ms per second).
pub fn step_threshold_ms(tick_ms: u64) -> u64 {
    tick_ms.saturating_mul(3).max(100)
}

record! {
    /// Wall against monotonic clock, and the steps seen so far: one value per
    /// process (shared data), so a step is counted once.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Steps {
        /// Wall minus monotonic when last recorded.
        pub offset_ms: Option<i64>,
        /// Steps seen since the process started.
        pub count: u64,
        /// The last step (positive: the wall clock jumped forward).
        pub last_step_ms: Option<i64>,
        /// When it was seen (wall clock after the step).
        pub last_step_wall_ms: Option<u64>,
    }
}

/// What one look at the clocks found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// Nothing to record.
    Same,
    /// The offset crept (slewing): recorded silently, never adding up to a step.
    Crept(Steps),
    /// The wall clock stepped by this much: record, log and count it.
    Stepped(Steps, i64),
}

impl Steps {
    pub fn look(&self, now: Now, threshold_ms: u64) -> Look {
        let Some(offset) = now.offset_ms() else {
            return Look::Same;
        };
        let crept = Steps {
            offset_ms: Some(offset),
            ..*self
        };
        // The first look only records the offset.
        match self.offset_ms.map(|before| offset.saturating_sub(before)) {
            Some(moved) if moved.unsigned_abs() >= threshold_ms => {
                let next = Steps {
                    count: self.count.saturating_add(1),
                    last_step_ms: Some(moved),
                    last_step_wall_ms: Some(now.wall_ms),
                    ..crept
                };
                Look::Stepped(next, moved)
            }
            Some(moved) if moved.unsigned_abs() <= threshold_ms / 4 => Look::Same,
            _ => Look::Crept(crept),
        }
    }
}

/// Formats milliseconds since the Unix epoch as RFC 3339 UTC.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    impl Now {
        /// A host that answered only the wall clock.
        pub fn wall(wall_ms: u64) -> Now {
            Now {
                wall_ms,
                mono_ms: None,
            }
        }
    }

    #[test]
    fn rfc3339_formatting() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_795_910_400_000), "2026-11-29T00:00:00.000Z");
    }

    fn at(wall_ms: u64, mono_ms: u64) -> Now {
        Now {
            wall_ms,
            mono_ms: Some(mono_ms),
        }
    }

    #[test]
    fn elapsed_time_is_monotonic_when_both_readings_have_it() {
        let start = at(10_000_000, 50);
        let later = at(10_000_000 + 3_600_000, 1_050); // wall stepped +1h
        assert_eq!(later.since(start.wall_ms, start.mono_ms), 1_000);
        assert!(later.passed(Some(start.wall_ms), start.mono_ms, 1_000));
        assert!(!later.passed(Some(start.wall_ms), start.mono_ms, 1_001));
        let back = at(10_000_000 - 3_600_000, 1_050); // wall stepped -1h
        assert_eq!(back.since(start.wall_ms, start.mono_ms), 1_000);
        assert_eq!(later.timers(), Timers::Monotonic);
    }

    #[test]
    fn without_a_monotonic_reading_the_wall_clock_decides() {
        let now = Now::wall(5_000);
        assert_eq!(now.timers(), Timers::Wall);
        assert_eq!(now.since(1_000, Some(7)), 4_000);
        assert_eq!(
            at(5_000, 9).since(1_000, None),
            4_000,
            "a mark taken without it"
        );
        assert_eq!(Now::wall(500).since(1_000, None), 0, "backwards saturates");
    }

    #[test]
    fn a_step_is_seen_once_and_creep_is_absorbed() {
        let t = step_threshold_ms(100);
        assert_eq!(t, 300);
        let s = Steps::default();
        let Look::Crept(s) = s.look(at(10_000, 1_000), t) else {
            panic!("first look records the offset")
        };
        assert_eq!((s.offset_ms, s.count), (Some(9_000), 0));
        assert_eq!(s.look(at(10_050, 1_000), t), Look::Same, "jitter");
        let Look::Crept(s2) = s.look(at(10_100, 1_000), t) else {
            panic!("creep past a quarter of the threshold is recorded")
        };
        assert_eq!((s2.offset_ms, s2.count), (Some(9_100), 0));
        let Look::Stepped(s3, by) = s2.look(at(3_610_100, 1_000), t) else {
            panic!("a 1 h jump is a step")
        };
        assert_eq!(
            (by, s3.count, s3.last_step_wall_ms),
            (3_600_000, 1, Some(3_610_100))
        );
        assert_eq!(s3.look(at(3_610_200, 1_100), t), Look::Same, "seen once");
        let Look::Stepped(s4, by) = s3.look(at(10_200, 1_100), t) else {
            panic!("a backward jump is a step")
        };
        assert_eq!((by, s4.count), (-3_600_000, 2));
        assert_eq!(
            s4.look(Now::wall(1), t),
            Look::Same,
            "no monotonic clock: nothing to compare"
        );
    }
}
