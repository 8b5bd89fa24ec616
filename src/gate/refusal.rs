//! Refusing a new request while draining (`draining_new_requests: refuse`):
//! which requests are refused, and how. Pure. drain-gate refuses only what
//! the LB in front may resend without running it twice (`refused_requests`;
//! envoyfilter/docs/refuse.md, "Which requests are refused, per LB").

use crate::json::named;

named! {
    /// What the traffic role does with a new HTTP request from DRAINING on.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum NewRequests {
        /// Serve it (the LB still sends them while its check says 200).
        #[default]
        Serve = "serve",
        /// Answer it at once, never forwarded, for an LB that resends it.
        Refuse = "refuse",
    }
}

named! {
    /// How a refused request is met.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum RefuseWith {
        /// The 503 answer, `x-drain-gate: refused; draining`: for an LB that
        /// resends a 503 (HAProxy `retry-on 503`, Envoy `retriable_status_codes`).
        #[default]
        Response = "response",
        /// The stream reset, no answer: for an LB that resends what failed
        /// but passes every answer on (nginx `proxy_next_upstream error`).
        Reset = "reset",
    }
}

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

/// The response header a refused gRPC request's answer gets back its 503 in
/// (Envoy makes a local reply to gRPC `:status: 200`, `grpc-status: 14`).
pub const STATUS_HEADER: &str = ":status";
pub const CONTENT_TYPE: &str = "content-type";
pub const METHOD: &str = ":method";
/// IETF httpapi `Idempotency-Key`: the server runs one request per key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The RFC 9110 §9.2.2 idempotent methods: their second run has the effect
/// of the first, so an LB may send them again. Methods are case-sensitive.
pub const IDEMPOTENT_METHODS: [&str; 6] = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"];

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

named! {
    /// Which requests (gRPC apart) a refusing drain refuses: those the LB in
    /// front may send again (`refused_requests`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum Refused {
        /// The idempotent methods: every recipe shipped may resend them.
        #[default]
        Idempotent = "idempotent",
        /// Those, and a request with an `Idempotency-Key` (never behind nginx).
        IdempotentOrKeyed = "idempotent_or_key",
        /// Every request: behind an LB that resends drain-gate's refusal and
        /// nothing else (Envoy's `retriable-headers` on `x-drain-gate`).
        All = "all",
    }
}

/// The refusing's configuration: `refused_requests`,
/// `draining_grpc_requests` and `refuse_with`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusal {
    pub requests: Refused,
    pub grpc: NewRequests,
    pub with: RefuseWith,
}

impl Refusal {
    /// What a new request meets, reading its headers through `header`, each
    /// one a host call: only those the decision needs are asked for. A gRPC
    /// call is a POST: it is refused only when gRPC is
    /// (`draining_grpc_requests`), whatever `refused_requests`.
    pub fn meet(self, header: impl Fn(&str) -> Option<String>) -> Meet {
        // Its `content-type` (one host call) is not asked for when every
        // request is reset alike.
        let all_alike = self.requests == Refused::All && self.grpc == NewRequests::Refuse;
        let grpc = !(all_alike && self.with == RefuseWith::Reset)
            && is_grpc(header(CONTENT_TYPE).as_deref());
        // A request to refuse (gRPC apart): the method is read only when the
        // requests refused are not all, the key only when the method does not
        // decide.
        let refused = if grpc {
            self.grpc == NewRequests::Refuse
        } else {
            let keyed = self.requests == Refused::IdempotentOrKeyed;
            self.requests == Refused::All
                || header(METHOD).is_some_and(|m| IDEMPOTENT_METHODS.contains(&m.as_str()))
                || (keyed && header(IDEMPOTENCY_KEY).is_some())
        };
        match (refused, self.with) {
            (false, _) => Meet::Serve,
            (true, RefuseWith::Response) => Meet::Respond { grpc },
            (true, RefuseWith::Reset) => Meet::Reset,
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
    use std::cell::RefCell;

    /// A request's headers, and the names a decision asked for.
    struct Req {
        headers: Vec<(&'static str, &'static str)>,
        asked: RefCell<Vec<String>>,
    }

    fn req(headers: &[(&'static str, &'static str)]) -> Req {
        Req {
            headers: headers.to_vec(),
            asked: RefCell::new(Vec::new()),
        }
    }

    impl Req {
        fn get(&self, name: &str) -> Option<String> {
            self.asked.borrow_mut().push(name.to_string());
            self.headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_string())
        }
    }

    /// What the request meets under `r`.
    fn meets(r: Refusal, req: &Req) -> Meet {
        r.meet(|name| req.get(name))
    }

    const GRPC: (&str, &str) = ("content-type", "application/grpc");

    fn refusal(requests: Refused, grpc: NewRequests, with: RefuseWith) -> Refusal {
        Refusal {
            requests,
            grpc,
            with,
        }
    }

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
    fn by_default_only_idempotent_methods_are_refused() {
        let r = Refusal::default();
        for m in IDEMPOTENT_METHODS {
            assert_eq!(
                meets(r, &req(&[(":method", m)])),
                Meet::Respond { grpc: false },
                "{m}"
            );
        }
        for m in ["POST", "PATCH", "CONNECT", "LOCK", "get", "PROPFIND", ""] {
            assert_eq!(meets(r, &req(&[(":method", m)])), Meet::Serve, "{m}");
        }
        assert_eq!(meets(r, &req(&[])), Meet::Serve, "no method: served");
        let keyed = req(&[(":method", "POST"), ("idempotency-key", "k1")]);
        assert_eq!(
            meets(r, &keyed),
            Meet::Serve,
            "a key counts only when chosen"
        );
    }

    #[test]
    fn a_key_makes_a_request_refusable_when_chosen() {
        let r = refusal(
            Refused::IdempotentOrKeyed,
            NewRequests::Serve,
            RefuseWith::Response,
        );
        let keyed = req(&[(":method", "POST"), ("idempotency-key", "k1")]);
        assert_eq!(meets(r, &keyed), Meet::Respond { grpc: false });
        assert_eq!(meets(r, &req(&[(":method", "POST")])), Meet::Serve);
        let get = req(&[(":method", "GET")]);
        assert_eq!(meets(r, &get), Meet::Respond { grpc: false });
        assert!(
            !get.asked.borrow().iter().any(|n| n == IDEMPOTENCY_KEY),
            "a GET needs no key"
        );
    }

    #[test]
    fn all_refuses_every_method_without_reading_it() {
        let r = refusal(Refused::All, NewRequests::Serve, RefuseWith::Response);
        let post = req(&[(":method", "POST")]);
        assert_eq!(meets(r, &post), Meet::Respond { grpc: false });
        assert_eq!(*post.asked.borrow(), vec![CONTENT_TYPE.to_string()]);
    }

    #[test]
    fn grpc_is_served_unless_refused_too_whatever_the_methods() {
        for requests in [
            Refused::Idempotent,
            Refused::IdempotentOrKeyed,
            Refused::All,
        ] {
            let serve = refusal(requests, NewRequests::Serve, RefuseWith::Response);
            assert_eq!(
                meets(serve, &req(&[(":method", "POST"), GRPC])),
                Meet::Serve
            );
            let refuse = refusal(requests, NewRequests::Refuse, RefuseWith::Response);
            assert_eq!(
                meets(refuse, &req(&[(":method", "POST"), GRPC])),
                Meet::Respond { grpc: true },
                "{requests:?}"
            );
        }
    }

    #[test]
    fn a_reset_refuses_what_a_response_would() {
        let reset = refusal(Refused::Idempotent, NewRequests::Serve, RefuseWith::Reset);
        assert_eq!(meets(reset, &req(&[(":method", "GET")])), Meet::Reset);
        assert_eq!(meets(reset, &req(&[(":method", "POST")])), Meet::Serve);
        assert_eq!(
            meets(reset, &req(&[(":method", "POST"), GRPC])),
            Meet::Serve
        );
        let reset_all = refusal(Refused::All, NewRequests::Refuse, RefuseWith::Reset);
        let post = req(&[(":method", "POST"), GRPC]);
        assert_eq!(meets(reset_all, &post), Meet::Reset);
        assert!(
            post.asked.borrow().is_empty(),
            "every request reset alike: no host call"
        );
    }

    /// A `refused_requests` value, read as the configuration reads it.
    fn parse(name: &str) -> Option<Refused> {
        crate::json::FromJson::from_json(&serde_json::Value::from(name)).ok()
    }

    #[test]
    fn names_read_back() {
        for r in [
            Refused::Idempotent,
            Refused::IdempotentOrKeyed,
            Refused::All,
        ] {
            assert_eq!(parse(r.name()), Some(r));
        }
        assert_eq!(parse("any"), None);
    }
}
