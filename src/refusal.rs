//! Refusing a new request while draining (`draining_new_requests: refuse`):
//! which requests are refused, and how. Pure.
//!
//! A refusal is never forwarded, so an LB that resends it loses nothing; what
//! an LB resends decides the form. The 503 answer (`refuse_with: response`)
//! for one that resends a 503, the stream reset (`reset`) for one that
//! resends only what failed. A gRPC request is served unless
//! `draining_grpc_requests: refuse`: nginx's `grpc_pass` never resends a
//! gRPC call, and HAProxy only one it holds whole (envoyfilter/docs/refuse.md,
//! "Refusing new requests while draining").

use crate::config::{NewRequests, RefuseWith};

/// The refusal's status.
pub const STATUS: u16 = 503;

/// The refusal's headers: who refused and why, and that it may be resent at once.
pub const HEADERS: [(&str, &str); 3] = [
    ("content-type", "application/json"),
    ("x-drain-gate", "refused; draining"),
    ("retry-after", "0"),
];

/// The refusal's body: small, and saying who refused and why.
pub const BODY: &[u8] = br#"{"error":"draining","message":"this gateway is draining and takes no new requests; resend to another one"}"#;

/// The response header a refused gRPC request's answer gets back its 503 in:
/// Envoy turns a filter's local reply to a gRPC request into `:status: 200`
/// with `grpc-status: 14`, which no LB resends.
pub const STATUS_HEADER: &str = ":status";

/// The request header that tells gRPC.
pub const CONTENT_TYPE: &str = "content-type";

/// What a new request meets while the refusing runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meet {
    /// Served: forwarded as outside a drain.
    Serve,
    /// The 503 answer; `grpc`: its status is given back on the way out.
    Respond { grpc: bool },
    /// The stream reset.
    Reset,
}

/// The refusing's configuration: `draining_grpc_requests` and `refuse_with`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusal {
    pub grpc: NewRequests,
    pub with: RefuseWith,
}

impl Refusal {
    /// Whether meeting a request needs its `content-type` (one host call):
    /// not when every request is reset alike.
    pub fn asks_content_type(self) -> bool {
        self.grpc == NewRequests::Serve || self.with == RefuseWith::Response
    }

    /// What a new request meets, `grpc` or not.
    pub fn meet(self, grpc: bool) -> Meet {
        if grpc && self.grpc == NewRequests::Serve {
            return Meet::Serve;
        }
        match self.with {
            RefuseWith::Response => Meet::Respond { grpc },
            RefuseWith::Reset => Meet::Reset,
        }
    }
}

/// Whether a request with this `content-type` is gRPC, as Envoy tells it
/// (`Grpc::Common::hasGrpcContentType`): exactly `application/grpc`, or
/// `application/grpc+` a codec (`application/grpc-web` is not).
pub fn is_grpc(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|c| c.strip_prefix("application/grpc"))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('+'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_is_envoys_content_type() {
        assert!(is_grpc(Some("application/grpc")));
        assert!(is_grpc(Some("application/grpc+proto")));
        for other in [
            None,
            Some(""),
            Some("application/grpc-web"),
            Some("application/grpc-web+proto"),
            Some("application/json"),
            Some("application/grpcx"),
            Some("Application/grpc"),
        ] {
            assert!(!is_grpc(other), "{other:?}");
        }
    }

    #[test]
    fn grpc_is_served_unless_refused_too() {
        let serve_grpc = Refusal::default();
        assert_eq!(serve_grpc.meet(true), Meet::Serve);
        assert_eq!(serve_grpc.meet(false), Meet::Respond { grpc: false });
        let refuse_grpc = Refusal {
            grpc: NewRequests::Refuse,
            with: RefuseWith::Response,
        };
        assert_eq!(refuse_grpc.meet(true), Meet::Respond { grpc: true });
        assert_eq!(refuse_grpc.meet(false), Meet::Respond { grpc: false });
    }

    #[test]
    fn a_reset_is_the_same_for_every_request() {
        let reset = Refusal {
            grpc: NewRequests::Refuse,
            with: RefuseWith::Reset,
        };
        assert!(!reset.asks_content_type(), "no host call to tell gRPC");
        assert_eq!(reset.meet(true), Meet::Reset);
        assert_eq!(reset.meet(false), Meet::Reset);
        let reset_serve_grpc = Refusal {
            grpc: NewRequests::Serve,
            with: RefuseWith::Reset,
        };
        assert!(reset_serve_grpc.asks_content_type());
        assert_eq!(reset_serve_grpc.meet(true), Meet::Serve);
        assert_eq!(reset_serve_grpc.meet(false), Meet::Reset);
        assert!(Refusal::default().asks_content_type());
    }
}
