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
//! **LB cut** (`crate::lb::Checkers::cut_by_lb` says how soon, and from which
//! address); any other cut is a client that gave up by itself (or an LB whose
//! checks drain-gate does not see).
//!
//! Each traffic root adds up the ends of the drain its last tick saw and adds
//! them, at its next tick, to that drain's tally in the FSM record (the
//! running drain's, or an ended drain's [`Owed`] receipt): one receipt per
//! drain, however soon the next drain begins.

use crate::json::{named, record};
use std::fmt;

use crate::clock::rfc3339;

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
    /// Counts one end: `tcp` a connection (else an HTTP stream), `by_lb` a
    /// cut the LB made.
    pub fn count(&mut self, end: End, tcp: bool, by_lb: bool) {
        let n = match end {
            End::Completed => &mut self.completed,
            End::Upstream => &mut self.ended_upstream,
            End::Refused => &mut self.refused,
            End::Cut => {
                if tcp {
                    self.cut_tcp = self.cut_tcp.saturating_add(1);
                }
                if by_lb {
                    self.cut_lb = self.cut_lb.saturating_add(1);
                }
                &mut self.cut
            }
        };
        *n = n.saturating_add(1);
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Tally) {
        self.cut = self.cut.saturating_add(other.cut);
        self.cut_lb = self.cut_lb.saturating_add(other.cut_lb);
        self.cut_tcp = self.cut_tcp.saturating_add(other.cut_tcp);
        self.completed = self.completed.saturating_add(other.completed);
        self.ended_upstream = self.ended_upstream.saturating_add(other.ended_upstream);
        self.refused = self.refused.saturating_add(other.refused);
    }

    /// Nothing counted.
    pub fn is_empty(&self) -> bool {
        *self == Tally::default()
    }
}

/// How many ended drains' receipts can wait for their line at once.
pub const KEPT: usize = 4;

named! {
    /// How a drain's receipt came to be owed: the state the drain ended in —
    /// or the pod's SIGTERM, seen before CLOSED (`crate::fsm::cut_short`):
    /// the drain was cut short, and the pod exits with it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Ended {
        Closed = "CLOSED",
        /// Reopened.
        Open = "OPEN",
        Fault = "FAULT",
        Sigterm = "SIGTERM",
    }
}

/// One drain that ended, as its receipt line tells it (everything but the
/// tally, which the traffic roots complete a tick later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drain {
    pub started_ms: u64,
    /// When the LB check flipped to 503 (CLOSING), if it did.
    pub flipped_ms: Option<u64>,
    pub closed_ms: Option<u64>,
    pub ended: Ended,
    pub forced: bool,
    pub duration_ms: Option<u64>,
    pub active_at_flip: Option<u64>,
    /// The oldest stream in flight just after the flip (`None`: none was).
    pub oldest_at_flip_ms: Option<u64>,
}

record! {
    /// A drain that ended and whose receipt line (`event=drain_receipt`) is
    /// owed: kept in the FSM record until the line is logged, a tick later,
    /// once every traffic root has added the drain's last ends to `tally`.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Owed {
        /// The drain's id (`crate::fsm::Record::drain_id`).
        pub drain: u64,
        /// The line's fields up to `duration_ms`, written when it ended.
        pub head: String,
        pub active_at_flip: Option<u64>,
        pub oldest_at_flip_ms: Option<u64>,
        pub tally: Tally,
    }
}

fn stamp(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".to_string(), rfc3339)
}

fn num(n: Option<u64>) -> String {
    n.map_or_else(|| "-".to_string(), |n| n.to_string())
}

impl Drain {
    /// Its receipt, owed, under the drain's id, with the ends counted so far.
    pub fn owed(&self, drain: u64, tally: Tally) -> Owed {
        Owed {
            drain,
            head: format!(
                "started={} flipped={} closed={} ended={} forced={} duration_ms={}",
                rfc3339(self.started_ms),
                stamp(self.flipped_ms),
                stamp(self.closed_ms),
                self.ended.name(),
                self.forced,
                num(self.duration_ms),
            ),
            active_at_flip: self.active_at_flip,
            oldest_at_flip_ms: self.oldest_at_flip_ms,
            tally,
        }
    }
}

impl fmt::Display for Owed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.tally;
        write!(
            f,
            "event=drain_receipt {} completed={} cut={} cut_http={} cut_tcp={} cut_lb={} \
             cut_other={} ended_upstream={} refused={} active_at_flip={} oldest_at_flip_ms={}",
            self.head,
            t.completed,
            t.cut,
            t.cut.saturating_sub(t.cut_tcp),
            t.cut_tcp,
            t.cut_lb,
            t.cut.saturating_sub(t.cut_lb),
            t.ended_upstream,
            t.refused,
            num(self.active_at_flip),
            num(self.oldest_at_flip_ms),
        )
    }
}

/// How one stream or connection ended during a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Completed,
    /// Ended by the upstream or by Envoy itself.
    Upstream,
    /// Ended by the downstream before it completed.
    Cut,
    /// Answered 503 by drain-gate (`draining_new_requests: refuse`).
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
    if flags & DOWNSTREAM_FLAGS != 0 {
        End::Cut
    } else {
        End::Upstream
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
        let d = Drain {
            started_ms: 1_764_000_000_000,
            flipped_ms: Some(1_764_000_009_000),
            closed_ms: None,
            ended: Ended::Open,
            forced: false,
            duration_ms: Some(9_000),
            active_at_flip: Some(0),
            oldest_at_flip_ms: None,
        };
        let tally = Tally {
            cut: 3,
            cut_lb: 2,
            cut_tcp: 1,
            completed: 40,
            ended_upstream: 1,
            refused: 7,
        };
        let r = d.owed(3, tally);
        assert_eq!(
            r.to_string(),
            "event=drain_receipt started=2025-11-24T16:00:00.000Z flipped=2025-11-24T16:00:09.000Z \
             closed=- ended=OPEN forced=false duration_ms=9000 completed=40 cut=3 cut_http=2 cut_tcp=1 \
             cut_lb=2 cut_other=1 ended_upstream=1 refused=7 active_at_flip=0 oldest_at_flip_ms=-"
        );
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

    #[test]
    fn a_tally_counts_each_end_where_it_belongs() {
        let mut one = Tally::default();
        one.count(End::Completed, false, false);
        one.count(End::Cut, true, true);
        one.count(End::Cut, false, false);
        one.count(End::Upstream, false, false);
        one.count(End::Refused, false, false);
        assert_eq!(
            one,
            Tally {
                cut: 2,
                cut_lb: 1,
                cut_tcp: 1,
                completed: 1,
                ended_upstream: 1,
                refused: 1,
            }
        );
    }
}
