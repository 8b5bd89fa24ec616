//! Connection rotation at drain start — Envoy's own connection drain, event ③
//! of a pod termination. Pure.
//!
//! When DRAINING begins, the health role asks Envoy's admin API for
//! `POST /drain_listeners?graceful&skip_exit`: Envoy starts its own drain
//! sequence, so every HTTP/1.1 connection gets `connection: close` on its next
//! response and every HTTP/2 connection a GOAWAY, while new connections are
//! still accepted. Behind an L4 LB that pins a client's keep-alive connection
//! to this gateway, the client then reconnects through the LB before the LB
//! marks the gateway DOWN, instead of being reset by it.
//!
//! `skip_exit` keeps every listener open — the health listener included — for
//! good: the two other forms (`drain_listeners`, `drain_listeners?graceful`)
//! stop the listeners, the health listener with them, so the LB would mark the
//! gateway DOWN with requests in flight. `ADMIN_PATH` is the only call made.
//!
//! Exactly once per drain: only the caller whose compare-and-swap moved the
//! state to DRAINING (`started_by`) asks; a failure is recorded, never retried,
//! and never changes the drain.

use serde::{Deserialize, Serialize};

use crate::fsm::{self, State};

/// The Envoy cluster that reaches the admin API, unless configured otherwise.
pub const DEFAULT_CLUSTER: &str = "drain_gate_envoy_admin";
/// The one admin call: rotate connections, keep every listener open.
pub const ADMIN_PATH: &str = "/drain_listeners?graceful&skip_exit";
/// How long Envoy waits for the admin API to answer.
pub const TIMEOUT_MS: u64 = 2_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Sent, no answer yet.
    Pending,
    /// The admin API answered 2xx: Envoy is rotating connections.
    Done,
    /// Not sent (no such cluster), not answered, or answered non-2xx.
    Failed,
    /// The drain ended (reopen, fault) before the call went out.
    Skipped,
}

/// What became of the rotation of one drain; shared by every worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The drain this rotation belongs to (`fsm::Record::drain_started_ms`).
    pub drain_started_ms: u64,
    pub outcome: Outcome,
    pub requested_ms: Option<u64>,
    pub answered_ms: Option<u64>,
    /// The admin API's HTTP status, when it answered.
    pub admin_status: Option<u16>,
    pub error: Option<String>,
}

/// The drain whose rotation the caller owns: `Some` only for the record a
/// successful OPEN → DRAINING move returned, i.e. for the one caller whose
/// compare-and-swap wrote it. A maintenance drain (`?hold=closing`) owns
/// none: it is meant to be reopened, and Envoy's drain sequence, once started,
/// lasts until istio-proxy restarts (every response closes its connection).
pub fn started_by(moved: &fsm::Record) -> Option<u64> {
    if moved.state == State::Draining && !moved.holds_closing() {
        moved.drain_started_ms
    } else {
        None
    }
}

/// Whether the rotation of the drain started at `drain_ms` is still wanted
/// when the state is `now`: the same drain, not abandoned. (CLOSING and CLOSED
/// still want it: an idle gateway flips at once, and its keep-alive
/// connections must rotate all the same.)
pub fn still_wanted(now: &fsm::Record, drain_ms: u64) -> bool {
    matches!(now.state, State::Draining | State::Closing | State::Closed)
        && now.drain_started_ms == Some(drain_ms)
}

impl Record {
    /// The call went out at `now_ms`.
    pub fn pending(drain_ms: u64, now_ms: u64) -> Record {
        Record {
            drain_started_ms: drain_ms,
            outcome: Outcome::Pending,
            requested_ms: Some(now_ms),
            answered_ms: None,
            admin_status: None,
            error: None,
        }
    }

    /// The call was not made: `outcome` says why, `error` in words.
    pub fn not_sent(drain_ms: u64, outcome: Outcome, error: String) -> Record {
        Record {
            drain_started_ms: drain_ms,
            outcome,
            requested_ms: None,
            answered_ms: None,
            admin_status: None,
            error: Some(error),
        }
    }

    /// The call ended at `now_ms` with the admin API's status, or without an
    /// answer (`None`: timeout, connection refused, cluster without hosts).
    pub fn answered(self, status: Option<u16>, now_ms: u64) -> Record {
        let (outcome, error) = match status {
            Some(200..=299) => (Outcome::Done, None),
            Some(s) => (Outcome::Failed, Some(format!("Envoy admin answered {s}"))),
            None => (
                Outcome::Failed,
                Some("no answer from the Envoy admin (timeout or connection failure)".to_string()),
            ),
        };
        Record {
            outcome,
            answered_ms: Some(now_ms),
            admin_status: status,
            error,
            ..self
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::clock::Now;
    use crate::fsm::{advance, Move, Reason};

    fn mv(from: State, to: State, reason: Reason) -> Move {
        Move {
            expected_from: from,
            to,
            reason,
            plan: Some(crate::config::Config::default().plan()),
            force: false,
        }
    }

    #[test]
    fn only_the_move_into_draining_owns_the_rotation() {
        let open = fsm::Record::new(10);
        assert_eq!(started_by(&open), None);
        let draining = advance(
            &open,
            mv(State::Open, State::Draining, Reason::DrainRequested),
            Now::wall(50),
            3,
        )
        .unwrap();
        assert_eq!(started_by(&draining), Some(50));
        // A maintenance drain is meant to be reopened: it never rotates.
        let mut maintenance = draining.clone();
        maintenance.plan = maintenance.plan.map(|p| fsm::DrainPlan {
            hold_closing: true,
            ..p
        });
        assert_eq!(started_by(&maintenance), None);
        // The same drain, one step on: whoever moved it to CLOSING owns nothing.
        let closing = advance(
            &draining,
            mv(State::Draining, State::Closing, Reason::ActiveZero),
            Now::wall(60),
            0,
        )
        .unwrap();
        assert_eq!(started_by(&closing), None);
        assert!(still_wanted(&closing, 50));
        assert!(!still_wanted(&closing, 49));
        let reopened = advance(
            &draining,
            mv(State::Draining, State::Open, Reason::ReopenRequested),
            Now::wall(70),
            0,
        )
        .unwrap();
        assert!(!still_wanted(&reopened, 50));
    }

    #[test]
    fn answers_become_outcomes() {
        let p = Record::pending(50, 60);
        assert_eq!(p.outcome, Outcome::Pending);
        let done = p.clone().answered(Some(200), 65);
        assert_eq!(
            (done.outcome, done.admin_status, done.error),
            (Outcome::Done, Some(200), None)
        );
        let refused = p.clone().answered(Some(404), 65);
        assert_eq!(refused.outcome, Outcome::Failed);
        assert_eq!(refused.error.as_deref(), Some("Envoy admin answered 404"));
        let silent = p.answered(None, 2_060);
        assert_eq!(
            (silent.outcome, silent.admin_status),
            (Outcome::Failed, None)
        );
        assert_eq!(silent.requested_ms, Some(60));
        assert_eq!(silent.answered_ms, Some(2_060));
    }
}
