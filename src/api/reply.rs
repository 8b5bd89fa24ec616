//! One complete answer of the health listener, and the error answers every
//! part of the API shares. Pure.

use serde::Serialize;

use crate::gate::fsm::Illegal;
use crate::json::{object, Absent};

/// One complete answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

const JSON: &str = "application/json";
pub(crate) const TEXT: &str = "text/plain; charset=utf-8";

impl Reply {
    pub(crate) fn new(status: u16, content_type: &str, body: Vec<u8>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type", content_type.to_string())],
            body,
        }
    }

    pub(crate) fn json<T: Serialize>(status: u16, body: &T) -> Reply {
        // Serializing these plain structs cannot fail; an empty body is the
        // harmless fallback if it ever did.
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        Reply::new(status, JSON, bytes).with("cache-control", "no-store")
    }

    pub(crate) fn with(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.retain(|(n, _)| *n != name);
        self.headers.push((name, value.into()));
        self
    }
}

/// `{"error": ..., "message": ...}` with `status`.
pub(crate) fn error(status: u16, error: &str, message: &str) -> Reply {
    let body = object!(ErrorBody {
        error: error,
        message: message,
    });
    Reply::json(status, &body)
}

/// 400 for a request the API understands but cannot take as written.
pub(crate) fn bad_request(message: &str) -> Reply {
    error(400, "bad_request", message)
}

/// 503 when the drain state cannot be read: the health listener fails closed.
pub fn unavailable() -> Reply {
    error(
        503,
        "state_unavailable",
        "the drain state could not be read; failing closed",
    )
}

/// Why a reopen through a preStop hold is refused.
const PRESTOP_HOLD: &str = "a preStop hold is active: GET /prestop or POST /drain?wait=closed \
    is waiting for CLOSED. Reopening releases it, and kubelet then stops the pod while the LB \
    check says 200 again. POST /reopen?force=true to reopen anyway.";

/// 409 for a refused transition; `prestop_hold` when only an active preStop
/// hold refused it.
pub fn illegal(e: Illegal) -> Reply {
    let (error, message) = match e.hold_until_ms {
        Some(_) => ("prestop_hold", Some(PRESTOP_HOLD)),
        None => ("illegal_transition", None),
    };
    let body = object!(IllegalBody {
        error: error,
        state: e.state,
        requested: e.requested,
        #[serde(
            skip_serializing_if = "Absent::absent",
            bound = "hold_until: Serialize + Absent"
        )]
        hold_until: e.hold_until_ms.map(crate::gate::clock::rfc3339),
        #[serde(
            skip_serializing_if = "Absent::absent",
            bound = "message: Serialize + Absent"
        )]
        message: message,
    });
    Reply::json(409, &body)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
pub(crate) mod tests {
    use super::*;
    use crate::gate::fsm::State;

    pub(crate) fn body(r: &Reply) -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    pub(crate) fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
        r.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn conflict_body() {
        let c = body(&illegal(Illegal {
            state: State::Closed,
            requested: State::Open,
            hold_until_ms: None,
        }));
        assert_eq!(
            c,
            serde_json::json!({"error":"illegal_transition","state":"CLOSED","requested":"OPEN"})
        );
    }

    #[test]
    fn a_prestop_hold_is_named() {
        let c = body(&illegal(Illegal {
            state: State::Draining,
            requested: State::Open,
            hold_until_ms: Some(1_764_000_000_000),
        }));
        assert_eq!(c["error"], "prestop_hold");
        assert_eq!(c["hold_until"], "2025-11-24T16:00:00.000Z");
        let m = c["message"].as_str().unwrap();
        assert!(m.contains("preStop") && m.contains("force=true"), "{m}");
    }

    #[test]
    fn unavailable_fails_closed() {
        let r = unavailable();
        assert_eq!(r.status, 503);
        assert_eq!(
            r.headers,
            vec![
                ("content-type", "application/json".to_string()),
                ("cache-control", "no-store".to_string())
            ]
        );
        assert_eq!(
            r.body,
            br#"{"error":"state_unavailable","message":"the drain state could not be read; failing closed"}"#
        );
    }
}
