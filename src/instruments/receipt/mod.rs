//! A drain's receipt: how every stream and connection that ended during it
//! ended, and what the LB cut. Pure.
//!
//! The traffic roles sort each stream or connection that ends while the
//! state is not OPEN — and only those: outside a drain no end costs a host
//! call — into one of four counts: **completed**; **ended by the upstream or
//! by Envoy** (an upstream reset or timeout, a local reply); **refused**
//! (`draining_new_requests: refuse`); and **cut**: ended by the downstream
//! before it completed. An HTTP stream is sorted by what Envoy says happened
//! to it, one property read per end: a stream whose response ended by its
//! `response.code_details` ([`http_done`]: the upstream's answer or the
//! route's direct response completed; any other answer is Envoy's own local
//! reply), one whose response did not end by its `response.flags`
//! ([`http_end`]). A TCP connection by the side that ended first
//! ([`tcp_end`]). A cut soon after an LB checker was served its `lb_fall`-th
//! consecutive 503 — the moment the LB marks the gateway DOWN and resets its
//! sessions (HAProxy `shutdown-sessions`, NetScaler `downStateFlush`) — is an
//! **LB cut** (`crate::gate::lb::Checkers::cut_by_lb` says how soon, and from which
//! address); any other cut is a client that gave up by itself (or an LB whose
//! checks drain-gate does not see).
//!
//! Every end is counted at once (process-wide stats), but for the common
//! one: a completed end is added up by its worker and counted at its next
//! tick. A drain's receipt is the counters minus those at its start (its
//! [`Tally`] base in the receipt's own [`Record`], beside the FSM's); its
//! line is written when the drain ends and logged a tick later, with the
//! completed ends its workers counted meanwhile ([`Record::write_line`]).

pub mod host;

use crate::json::record;

use crate::gate::clock::{rfc3339, Now};
use crate::gate::fsm::{self, State};

record! {
    /// The counters a receipt is made of, as read at one moment.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Tally {
        pub cut: u64,
        pub cut_lb: u64,
        pub cut_tcp: u64,
        pub completed: u64,
        pub ended_upstream: u64,
        pub refused: u64,
    }
}

impl Tally {
    /// What happened since `base` (a counter never goes back; one that read
    /// lower — its stat was reset — counts from 0).
    pub fn since(&self, base: &Tally) -> Tally {
        Tally {
            cut: self.cut.saturating_sub(base.cut),
            cut_lb: self.cut_lb.saturating_sub(base.cut_lb),
            cut_tcp: self.cut_tcp.saturating_sub(base.cut_tcp),
            completed: self.completed.saturating_sub(base.completed),
            ended_upstream: self.ended_upstream.saturating_sub(base.ended_upstream),
            refused: self.refused.saturating_sub(base.refused),
        }
    }
}

record! {
    /// The receipt's own record, one per process beside the FSM's, written on
    /// the events of a drain (`crate::instruments::receipt::host`): the latest drain's
    /// base and flip, and the line of a drain that ended until it is logged.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Record {
        /// The drain the rest is of (`crate::gate::fsm::Record::drain_id`).
        pub drain: Option<u64>,
        /// The counters when it began: its receipt is the counters now minus these.
        pub base: Option<Tally>,
        /// The oldest stream in flight just after its flip to CLOSING (ms;
        /// `None` when nothing was), recorded by the health role within a
        /// tick of it (`flip_recorded`).
        pub oldest_at_flip_ms: Option<u64>,
        pub flip_recorded: bool = false,
        /// The pending receipt line of a drain that ended, written then and
        /// logged a tick later (`write_line`; the next drain may begin
        /// meanwhile): what comes before its completed count, that count, and
        /// what comes after. (`owed_*`: the record's field names, as written.)
        pub owed_line: Option<String>,
        pub owed_completed: u64 = 0,
        pub owed_tail: Option<String>,
        /// The drain that line is of, kept once it is logged: the drain whose
        /// line is written (pending, then logged), once per drain.
        pub owed_drain: Option<u64>,
    }
}

impl Record {
    /// Moves the record on to drain `drain` if it is not there (a drain whose
    /// beginning it missed counts from no base), the pending line kept.
    fn at(&mut self, drain: u64) {
        if self.drain != Some(drain) {
            self.drain = Some(drain);
            self.base = None;
            self.oldest_at_flip_ms = None;
            self.flip_recorded = false;
        }
    }

    /// Drain `drain` began with the counters at `base` (`false`: recorded).
    pub fn began(&mut self, drain: u64, base: Tally) -> bool {
        self.at(drain);
        let fresh = self.base.is_none();
        self.base.get_or_insert(base);
        fresh
    }

    /// The drain whose flip to CLOSING `rec` (the FSM's record) holds and
    /// this record has not recorded yet, if any.
    pub fn flip_due(&self, rec: &fsm::Record) -> Option<u64> {
        let drain = rec.drain_id.filter(|_| rec.state == State::Closing)?;
        (self.drain != Some(drain) || !self.flip_recorded).then_some(drain)
    }

    /// Records the oldest stream in flight at that flip, once per drain.
    pub fn flipped(&mut self, rec: &fsm::Record, oldest_ms: Option<u64>) -> bool {
        let Some(drain) = self.flip_due(rec) else {
            return false;
        };
        self.at(drain);
        self.oldest_at_flip_ms = oldest_ms;
        self.flip_recorded = true;
        true
    }

    /// Writes the receipt line of the drain `rec` (the FSM's record) holds
    /// (`ended`: the state it ended in, or `SIGTERM`), its tally the
    /// `counters` now minus the drain's base (the completed ends its workers
    /// have not counted yet come with `add_completed`); `None` when no drain
    /// began or its line is written. The line is pending until it is logged
    /// a tick later (`take_line`). A line still pending then — a second drain
    /// ended within a tick — is returned to be logged at once.
    ///
    /// The line (`event=drain_receipt`, once per drain: at CLOSED, on a
    /// reopen, in FAULT, or at the pod's SIGTERM before CLOSED) is kept in
    /// two halves around its completed count, the one field that can still
    /// grow once it is written: `flipped` is when the LB check flipped to 503
    /// (CLOSING), `oldest_at_flip_ms` the oldest stream in flight just after.
    pub fn write_line(
        &mut self,
        rec: &fsm::Record,
        ended: &str,
        counters: Tally,
        now: Now,
    ) -> Option<Option<String>> {
        let (drain, started_ms) = (rec.drain_id?, rec.drain_started_ms?);
        if self.owed_drain == Some(drain) {
            return None;
        }
        self.at(drain);
        let t = counters.since(&self.base.unwrap_or_default());
        let displaced = self.take_line();
        self.owed_line = Some(format!(
            "event=drain_receipt started={} flipped={} closed={} ended={ended} forced={} \
             duration_ms={} completed=",
            rfc3339(started_ms),
            dash(rec.closing_ms.map(rfc3339)),
            dash(rec.closed_ms.map(rfc3339)),
            rec.forced,
            dash(rec.drain_duration_ms(now)),
        ));
        self.owed_completed = t.completed;
        self.owed_tail = Some(format!(
            " cut={} cut_http={} cut_tcp={} cut_lb={} cut_other={} ended_upstream={} refused={} \
             active_at_flip={} oldest_at_flip_ms={}",
            t.cut,
            t.cut.saturating_sub(t.cut_tcp),
            t.cut_tcp,
            t.cut_lb,
            t.cut.saturating_sub(t.cut_lb),
            t.ended_upstream,
            t.refused,
            dash(rec.active_at_closing),
            dash(self.oldest_at_flip_ms),
        ));
        self.owed_drain = Some(drain);
        Some(displaced)
    }

    /// Takes the pending line out (being logged), with the completed ends
    /// counted since; `None` when none is pending (another worker logged it).
    pub fn take_line(&mut self) -> Option<String> {
        let head = self.owed_line.take()?;
        let tail = self.owed_tail.take().unwrap_or_default();
        let completed = std::mem::take(&mut self.owed_completed);
        Some(format!("{head}{completed}{tail}"))
    }

    /// Adds `n` completed ends of drain `drain`, counted by a traffic root at
    /// its tick (its counter not moved yet), to that drain's pending line
    /// while it waits, and takes them out of the latest drain's receipt if a
    /// newer one began meanwhile (its base moves up with them). `false`:
    /// nothing to change.
    pub fn add_completed(&mut self, drain: u64, n: u64) -> bool {
        let pending = self.owed_drain == Some(drain) && self.owed_line.is_some();
        let newer = self.drain != Some(drain) && self.base.is_some();
        if n == 0 || !(pending || newer) {
            return false;
        }
        if pending {
            self.owed_completed = self.owed_completed.saturating_add(n);
        }
        if let (true, Some(base)) = (newer, self.base.as_mut()) {
            base.completed = base.completed.saturating_add(n);
        }
        true
    }
}

/// The `duration_ms` of a receipt line (`None`: none, or `-`).
pub fn duration_of(line: &str) -> Option<u64> {
    line.split(' ')
        .find_map(|f| f.strip_prefix("duration_ms="))?
        .parse()
        .ok()
}

fn dash(v: Option<impl std::fmt::Display>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// How one stream or connection ended during a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Completed,
    /// Ended by the upstream or by Envoy itself.
    Upstream,
    /// Ended by the downstream before it completed.
    Cut,
    /// Refused by drain-gate (`draining_new_requests: refuse`): answered 503, or reset.
    Refused,
}

/// Envoy's response flags (`response.flags`, Envoy 1.36–1.40) that say the
/// downstream ended the stream: `DC` (downstream connection termination) and
/// `DR` (downstream remote reset, an HTTP/2 or HTTP/3 RST_STREAM).
pub const DOWNSTREAM_FLAGS: u64 = 0x4000 | 0x1000_0000;

/// How an HTTP stream whose response did not end ended, from its response
/// flags: the downstream's end (`DOWNSTREAM_FLAGS`) is a cut; anything else
/// — an upstream reset or timeout — ended upstream. (A stream whose response
/// ended is sorted by [`http_done`].)
pub fn http_end(flags: u64) -> End {
    match flags & DOWNSTREAM_FLAGS {
        0 => End::Upstream,
        _ => End::Cut,
    }
}

/// What `response.code_details` says of the upstream's own answer, and of a
/// route's direct response (or redirect): the two answers a stream completes
/// with. Every other value names a local reply of Envoy's — an upstream
/// connect failure (`upstream_reset_before_response_started{…}`, 503 `UF`),
/// a route timeout (`response_timeout`, 504 `UT`), a request timeout
/// (`request_overall_timeout`, 408, no response flag), no healthy upstream,
/// a filter's refusal.
pub const COMPLETED_DETAILS: [&[u8]; 2] = [b"via_upstream", b"direct_response"];

/// How an HTTP stream whose response ended ended, from its
/// `response.code_details` (`None`: the host did not say): the upstream's
/// answer or the route's completed it; an answer Envoy made itself ended it
/// upstream, whatever reached the client.
pub fn http_done(details: Option<&[u8]>) -> End {
    match details {
        Some(d) if !d.is_empty() && !COMPLETED_DETAILS.contains(&d) => End::Upstream,
        _ => End::Completed,
    }
}

/// Which side of a TCP or TLS-passthrough connection ended first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum First {
    /// The upstream ended first, or Envoy closed both (or nothing ended yet).
    #[default]
    Upstream,
    /// The downstream half-closed (its FIN) while the upstream was open.
    DownstreamFin,
    /// The downstream closed — a reset — while the upstream was open.
    DownstreamReset,
}

/// How a TCP or TLS-passthrough connection ended, by the side that ended
/// first. A downstream reset is a cut. A downstream FIN is a cut only at the
/// LB's DOWN (`at_lb_down`, read only for that case): HAProxy's
/// `shutdown-sessions` in `mode tcp` ends a session with a FIN toward the
/// server, the same packet a client that is done with its connection sends;
/// any other FIN first, and any end the upstream began, completed it.
pub fn tcp_end(first: First, at_lb_down: impl FnOnce() -> bool) -> End {
    match first {
        First::DownstreamReset => End::Cut,
        First::DownstreamFin if at_lb_down() => End::Cut,
        First::DownstreamFin | First::Upstream => End::Completed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_ends_by_their_flags() {
        assert_eq!(
            http_end(0),
            End::Upstream,
            "no response end, no downstream flag"
        );
        assert_eq!(
            http_end(0x4000),
            End::Cut,
            "DC: the client's connection went away"
        );
        assert_eq!(
            http_end(0x1000_0000),
            End::Cut,
            "DR: the client reset the stream"
        );
        assert_eq!(
            http_end(0x4000 | 0x10),
            End::Cut,
            "the downstream's end wins"
        );
        assert_eq!(http_end(0x10), End::Upstream, "UR: upstream remote reset");
        assert_eq!(
            http_end(0x80_0000),
            End::Upstream,
            "UPE: upstream protocol error"
        );
    }

    #[test]
    fn tcp_ends_by_the_side_that_ended_first() {
        let read = std::cell::Cell::new(0);
        let never = || {
            read.set(read.get() + 1);
            true
        };
        assert_eq!(tcp_end(First::DownstreamReset, never), End::Cut);
        assert_eq!(tcp_end(First::Upstream, never), End::Completed);
        assert_eq!(read.get(), 0, "the LB's window is read for a FIN only");
        assert_eq!(
            tcp_end(First::DownstreamFin, || true),
            End::Cut,
            "a FIN at the LB's DOWN: shutdown-sessions"
        );
        assert_eq!(
            tcp_end(First::DownstreamFin, || false),
            End::Completed,
            "a client done with its connection"
        );
    }

    #[test]
    fn the_receipt_line_names_every_count() {
        let mut rec = fsm::Record::new(0);
        rec.drain_id = Some(1);
        rec.drain_started_ms = Some(1_764_000_000_000);
        rec.closing_ms = Some(1_764_000_009_000);
        rec.active_at_closing = Some(0);
        let tally = Tally {
            cut: 3,
            cut_lb: 2,
            cut_tcp: 1,
            completed: 40,
            ended_upstream: 1,
            refused: 7,
        };
        let mut book = Record::default();
        let at = Now::wall(1_764_000_020_000);
        assert_eq!(book.write_line(&rec, "OPEN", tally, at), Some(None));
        let pending = book.clone();
        let line = book.take_line().unwrap_or_default();
        assert_eq!(
            line,
            "event=drain_receipt started=2025-11-24T16:00:00.000Z flipped=2025-11-24T16:00:09.000Z \
             closed=- ended=OPEN forced=false duration_ms=9000 completed=40 cut=3 cut_http=2 cut_tcp=1 \
             cut_lb=2 cut_other=1 ended_upstream=1 refused=7 active_at_flip=0 oldest_at_flip_ms=-"
        );
        assert_eq!(duration_of(&line), Some(9_000));
        assert_eq!(duration_of(&line.replace("=9000", "=-")), None);
        let mut book = pending;
        assert!(book.add_completed(1, 2));
        assert_eq!(
            book.take_line(),
            Some(line.replace(" completed=40 ", " completed=42 "))
        );
    }

    #[test]
    fn the_receipt_s_record_writes_one_line_per_drain_and_takes_late_completed_ends() {
        let mut rec = fsm::Record::new(0);
        rec.state = State::Open;
        rec.drain_id = Some(1);
        rec.drain_started_ms = Some(1_764_000_000_000);
        let base = Tally {
            completed: 10,
            cut: 1,
            ..Tally::default()
        };
        let mut book = Record::default();
        assert!(book.began(1, base));
        assert!(!book.began(1, base), "recorded once");
        let now = Tally {
            completed: 13,
            cut: 2,
            ..Tally::default()
        };
        let at = Now::wall(1_764_000_001_000);
        assert_eq!(book.write_line(&rec, "OPEN", now, at), Some(None));
        assert_eq!(
            book.write_line(&rec, "OPEN", now, at),
            None,
            "once per drain"
        );
        assert!(book.add_completed(1, 2), "its line waits: counted in it");
        assert!(!book.add_completed(1, 0));
        // A second drain began before the line was logged: the first's late
        // ends go to its line and out of the second's receipt.
        assert!(book.began(2, now));
        assert!(book.add_completed(1, 1));
        assert_eq!(book.base.map(|b| b.completed), Some(14));
        let line = book.take_line().unwrap_or_default();
        assert!(line.contains(" ended=OPEN "), "{line}");
        assert!(line.contains(" completed=6 cut=1 "), "{line}");
        assert_eq!(book.take_line(), None, "logged once");
        assert!(
            !book.add_completed(2, 5),
            "the running drain's: its counter says it"
        );
        rec.state = State::Closing;
        rec.drain_id = Some(2);
        assert_eq!(book.flip_due(&rec), Some(2));
        assert!(book.flipped(&rec, Some(700)));
        assert_eq!(
            (book.flip_due(&rec), book.flipped(&rec, None)),
            (None, false)
        );
        assert_eq!(book.oldest_at_flip_ms, Some(700));
    }

    #[test]
    fn a_receipt_is_the_counters_since_the_drain_began() {
        let base = Tally {
            cut: 2,
            completed: 10,
            ..Tally::default()
        };
        let now = Tally {
            cut: 5,
            cut_lb: 1,
            completed: 12,
            refused: 4,
            ..Tally::default()
        };
        assert_eq!(
            now.since(&base),
            Tally {
                cut: 3,
                cut_lb: 1,
                completed: 2,
                refused: 4,
                ..Tally::default()
            }
        );
        assert_eq!(base.since(&now).cut, 0, "a reset stat counts from 0");
    }

    #[test]
    fn a_stream_whose_response_ended_is_sorted_by_who_answered() {
        assert_eq!(http_done(Some(b"via_upstream")), End::Completed);
        assert_eq!(
            http_done(Some(b"direct_response")),
            End::Completed,
            "a route's direct response or redirect"
        );
        for local in [
            b"response_timeout".as_slice(),
            b"upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            b"request_overall_timeout",
            b"no_healthy_upstream",
        ] {
            assert_eq!(http_done(Some(local)), End::Upstream, "{local:?}");
        }
        assert_eq!(http_done(None), End::Completed, "the host did not say");
        assert_eq!(http_done(Some(b"")), End::Completed);
    }
}
