//! Connection rotation during a drain — Envoy's own connection drain, event ③
//! of a pod termination. Pure.
//!
//! The health role asks Envoy's admin API for
//! `POST /drain_listeners?graceful&skip_exit`: Envoy starts its own drain
//! sequence, so every HTTP/1.1 connection gets `connection: close` on its next
//! response and every HTTP/2 connection a GOAWAY, while new connections are
//! still accepted. Behind an L4 LB that pins a client's keep-alive connection
//! to this gateway, the client then reconnects through the LB before the LB
//! marks the gateway DOWN, instead of being reset by it.
//!
//! **When** ([`due`]): Envoy's drain sequence cannot be narrowed to the
//! connections of the moment — once started, every response of every
//! connection asks its client to close, until the process ends — and a wasm
//! filter can neither add `connection: close` to a response (Envoy strips
//! hop-by-hop headers) nor send a GOAWAY. So the rotation waits until a
//! reconnect goes elsewhere or the LB is about to reset what stays: in a soft
//! drain, when the gate passes (every LB checker was served the 404: the LB
//! sends no new connection here); in a drain answering 200, at the flip (the
//! LB marks the gateway DOWN `fall` checks later). Until then keep-alive
//! connections are kept — an L7 LB's pool, a pinned client — and no request
//! pays a new connection (or TLS handshake) for the rotation. A drain that
//! refuses new requests (`draining_new_requests: refuse`) rotates at once:
//! nothing is served here any more, and the refusal that closes a pinned
//! client's connection sends it through the LB to another gateway.
//!
//! `skip_exit` keeps every listener open — the health listener included — for
//! good: the two other forms (`drain_listeners`, `drain_listeners?graceful`)
//! stop the listeners, the health listener with them, so the LB would mark the
//! gateway DOWN with requests in flight. `ADMIN_PATH` is the only call made.
//!
//! Exactly once per drain: the health worker whose compare-and-swap claims the
//! drain's rotation record asks; a failure is recorded, never retried, and
//! never changes the drain. A maintenance drain (`?hold=closing`) never
//! rotates: it is meant to be reopened, and Envoy's drain sequence lasts
//! until istio-proxy restarts.

pub mod host;

use std::time::Duration;

use crate::json::{named, record};

use crate::gate::fsm::{self, State};
use crate::gate::lb::Gate;

/// The Envoy cluster that reaches the admin API, unless configured otherwise.
pub const DEFAULT_CLUSTER: &str = "drain_gate_envoy_admin";
/// The one admin call: rotate connections, keep every listener open.
pub const ADMIN_PATH: &str = "/drain_listeners?graceful&skip_exit";
/// How long Envoy waits for the admin API to answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

named! {
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum Outcome {
        /// Sent, no answer yet.
        #[default]
        Pending = "pending",
        /// The admin API answered 2xx: Envoy is rotating connections.
        Done = "done",
        /// Not sent (no such cluster), not answered, or answered non-2xx.
        Failed = "failed",
    }
}

named! {
    /// What made the rotation due.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Trigger {
        /// A soft drain's gate passed: the LB sends no new connection here.
        SoftDrainGate = "soft_drain_gate",
        /// The flip to 503: the LB marks the gateway DOWN `fall` checks later.
        Flip = "flip",
        /// A drain that refuses new requests began: nothing is served here.
        Refusing = "refusing",
    }
}

record! {
    /// What became of the rotation of one drain; shared by every worker.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Record {
        /// The drain this rotation belongs to (`fsm::Record::drain_started_ms`).
        pub drain_started_ms: u64,
        pub trigger: Option<Trigger>,
        pub outcome: Outcome,
        pub requested_ms: Option<u64>,
        pub answered_ms: Option<u64>,
        /// The admin API's HTTP status, when it answered.
        pub admin_status: Option<u16>,
        pub error: Option<String>,
    }
}

/// Whether the rotation of the drain `rec` holds is due now, and why: when a
/// drain that `refusing` new requests begins; in a gated soft drain once
/// `gate` passes; in any drain at the flip (CLOSING, or CLOSED for a drain
/// that got there within a tick). Never for a maintenance drain. The caller
/// sends it once per drain (the rotation record's claim).
pub fn due(rec: &fsm::Record, gate: Option<Gate>, refusing: bool) -> Option<Trigger> {
    let plan = rec.plan.filter(|p| !p.hold_closing)?;
    match rec.state {
        State::Draining if refusing => Some(Trigger::Refusing),
        State::Draining if plan.lb_gate && gate.is_some_and(Gate::passes) => {
            Some(Trigger::SoftDrainGate)
        }
        State::Closing | State::Closed => Some(Trigger::Flip),
        _ => None,
    }
}

impl Record {
    /// The call went out at `now_ms`.
    pub fn pending(drain_ms: u64, trigger: Trigger, now_ms: u64) -> Record {
        Record {
            drain_started_ms: drain_ms,
            trigger: Some(trigger),
            requested_ms: Some(now_ms),
            ..Record::default()
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
    use crate::gate::clock::Now;
    use crate::gate::fsm::{advance, Move, Reason};

    fn mv(from: State, to: State, reason: Reason) -> Move {
        Move {
            expected_from: from,
            to,
            reason,
            plan: Some(crate::config::Health::default().plan()),
            force: false,
        }
    }

    #[test]
    fn the_rotation_waits_for_the_lb_to_leave_for_the_flip_or_for_refusals() {
        let open = fsm::Record::new(10);
        assert_eq!(due(&open, None, false), None);
        let draining = advance(
            &open,
            mv(State::Open, State::Draining, Reason::DrainRequested),
            Now::wall(50),
            3,
        )
        .unwrap();
        assert_eq!(
            due(&draining, None, false),
            None,
            "200 while draining: keep the connections"
        );
        let mut soft = draining.clone();
        soft.plan = soft.plan.map(|p| fsm::DrainPlan { lb_gate: true, ..p });
        assert_eq!(due(&soft, Some(Gate::Waiting), false), None);
        assert_eq!(due(&soft, Some(Gate::NoChecker), false), None);
        assert_eq!(
            due(&soft, Some(Gate::Open), false),
            Some(Trigger::SoftDrainGate)
        );
        assert_eq!(
            due(&soft, Some(Gate::NoLb), false),
            Some(Trigger::SoftDrainGate)
        );
        let closing = advance(
            &draining,
            mv(State::Draining, State::Closing, Reason::ActiveZero),
            Now::wall(60),
            0,
        )
        .unwrap();
        assert_eq!(due(&closing, None, false), Some(Trigger::Flip));
        // A drain that refuses new requests rotates as it begins.
        assert_eq!(due(&draining, None, true), Some(Trigger::Refusing));
        assert_eq!(due(&open, None, true), None);
        // A maintenance drain is meant to be reopened: it never rotates.
        let mut maintenance = closing.clone();
        maintenance.plan = maintenance.plan.map(|p| fsm::DrainPlan {
            hold_closing: true,
            ..p
        });
        assert_eq!(due(&maintenance, None, false), None);
        assert_eq!(due(&maintenance, None, true), None);
        let reopened = advance(
            &draining,
            mv(State::Draining, State::Open, Reason::ReopenRequested),
            Now::wall(70),
            0,
        )
        .unwrap();
        assert_eq!(due(&reopened, None, false), None);
    }

    #[test]
    fn answers_become_outcomes() {
        let p = Record::pending(50, Trigger::Flip, 60);
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
