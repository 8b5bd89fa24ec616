//! The HTTP surface of the health listener (:18180): which request maps to
//! which endpoint, who may call it, and every answer it can give. Pure.
//! The contract, with every status, header and body, is `openapi.yaml`.
//!
//! | request                                   | answer                                              |
//! |-------------------------------------------|-----------------------------------------------------|
//! | GET/HEAD /health_check.html               | LB code per state (200 `OK`, 404/503 `DRAIN`)       |
//! | GET/HEAD /health, /live                   | readiness / liveness per state, JSON                |
//! | GET/HEAD /drain/status                    | 200 status JSON                                     |
//! | POST /drain, /close-lb, /close, /reopen, /fault | 200 status JSON, or 409 illegal transition    |
//! | POST /drain?wait=closed[&timeout=DUR]     | drain (or join it), answer once CLOSED (200), aborted (409) or timed out (504) |
//! | GET /prestop[?timeout=DUR]                | the same, for a Kubernetes `preStop.httpGet`        |
//! | anything else                             | 404; a known path with the wrong method: 405 + Allow |
//!
//! Admin calls (the POSTs and /prestop) need a source address in `admin_allow`
//! or, when `admin_token` is set, `Authorization: Bearer <one of the tokens>`: 403, or 401
//! when a token is configured and missing or wrong.
//!
//! This file routes and authorizes; the answers live beside it: `checks`
//! (LB check, readiness, liveness), `status` (the status document and held
//! `wait=closed` answers), `reply` (the `Reply` type and the error answers).

use std::net::IpAddr;

use crate::config::Config;
use crate::duration;
use crate::fsm::{Reason, State};

pub mod checks;
pub mod reply;
pub mod status;

pub use checks::{check, etag, Audience};
use reply::{bad_request, error};
pub use reply::{illegal, unavailable, Reply};
pub use status::{
    rfc3339, status, wait_end, wait_reply, ClockInfo, CountInfo, RotationView, View, WaitEnd,
};

/// What the host hands over of one request on the health listener.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The raw `:path`, query included.
    pub path: &'a str,
    pub if_none_match: Option<&'a str>,
    pub authorization: Option<&'a str>,
    /// Downstream peer address; `None` when the host could not tell.
    pub source: Option<IpAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Drain,
    CloseLb,
    Close,
    Reopen,
    Fault,
}

impl Command {
    pub fn target(self) -> State {
        match self {
            Command::Drain => State::Draining,
            Command::CloseLb => State::Closing,
            Command::Close => State::Closed,
            Command::Reopen => State::Open,
            Command::Fault => State::Fault,
        }
    }

    pub fn reason(self) -> Reason {
        match self {
            Command::Drain => Reason::DrainRequested,
            Command::CloseLb => Reason::CloseLbRequested,
            Command::Close => Reason::CloseRequested,
            Command::Reopen => Reason::ReopenRequested,
            Command::Fault => Reason::FaultRequested,
        }
    }

    /// The state this command moves from. /reopen and /fault apply to the
    /// current state; `fsm::legal` decides whether that is allowed.
    pub fn expected_from(self, current: State) -> State {
        match self {
            Command::Drain => State::Open,
            Command::CloseLb => State::Draining,
            Command::Close => State::Closing,
            Command::Reopen | Command::Fault => current,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// GET or HEAD. For HEAD the host (Envoy) sends the headers of the same
    /// answer, `content-length` included, without the body.
    Check(Audience),
    Status,
    Transition(Command),
    /// Start or join a drain and hold the answer until CLOSED or `timeout_ms`.
    DrainAndWait {
        timeout_ms: u64,
    },
}

/// Maps a request to an endpoint, or to the error answer (400, 401, 403, 404, 405).
pub fn route(req: &Request, cfg: &Config) -> Result<Endpoint, Reply> {
    let (path, query) = match req.path.split_once('?') {
        Some((p, q)) => (p, q),
        None => (req.path, ""),
    };
    let (allow, admin): (&str, bool) = match path {
        "/health_check.html" | "/health" | "/live" | "/drain/status" => ("GET, HEAD", false),
        "/drain" | "/close-lb" | "/close" | "/reopen" | "/fault" => ("POST", true),
        "/prestop" => ("GET", true),
        _ => {
            return Err(error(
                404,
                "not_found",
                "no such endpoint; see openapi.yaml",
            ))
        }
    };
    let method_ok = allow.split(", ").any(|m| m == req.method);
    if !method_ok {
        return Err(error(
            405,
            "method_not_allowed",
            "this endpoint does not take that method; see the Allow header",
        )
        .with("allow", allow));
    }
    if admin {
        authorize(req, cfg)?;
    }
    let params = Params::parse(query)?;
    let wait = |p: &Params| Endpoint::DrainAndWait {
        timeout_ms: p.timeout_ms.unwrap_or_else(|| cfg.default_wait_ms()),
    };
    let endpoint = match path {
        "/drain" if params.wait => wait(&params),
        "/drain" if params.timeout_ms.is_some() => {
            return Err(bad_request("timeout is only valid with wait=closed"))
        }
        "/prestop" if params.wait => return Err(bad_request("/prestop always waits; drop wait=")),
        "/prestop" => wait(&params),
        _ if params.seen => return Err(bad_request("this endpoint takes no query parameters")),
        "/health_check.html" => Endpoint::Check(Audience::Lb),
        "/health" => Endpoint::Check(Audience::Readiness),
        "/live" => Endpoint::Check(Audience::Liveness),
        "/drain/status" => Endpoint::Status,
        "/drain" => Endpoint::Transition(Command::Drain),
        "/close-lb" => Endpoint::Transition(Command::CloseLb),
        "/close" => Endpoint::Transition(Command::Close),
        "/reopen" => Endpoint::Transition(Command::Reopen),
        _ => Endpoint::Transition(Command::Fault),
    };
    Ok(endpoint)
}

#[derive(Default)]
struct Params {
    wait: bool,
    timeout_ms: Option<u64>,
    seen: bool,
}

impl Params {
    fn parse(query: &str) -> Result<Params, Reply> {
        let mut p = Params::default();
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            p.seen = true;
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "wait" if v == "closed" => p.wait = true,
                "wait" => return Err(bad_request("wait: the only value is \"closed\"")),
                "timeout" => match duration::parse_ms(v) {
                    Ok(ms) if ms > 0 && ms <= duration::MAX_MS => p.timeout_ms = Some(ms),
                    _ => {
                        return Err(bad_request(&format!(
                            "timeout: expected a duration from 1ms to {}, e.g. 90s",
                            duration::format_ms(duration::MAX_MS)
                        )))
                    }
                },
                _ => {
                    return Err(bad_request(
                        "unknown query parameter (known: wait, timeout)",
                    ))
                }
            }
        }
        Ok(p)
    }
}

fn authorize(req: &Request, cfg: &Config) -> Result<(), Reply> {
    if let Some(ip) = req.source {
        if cfg.admin_allow.iter().any(|c| c.contains(ip)) {
            return Ok(());
        }
    }
    if cfg.admin_tokens.is_empty() {
        return Err(error(
            403,
            "forbidden",
            "source address is not in admin_allow",
        ));
    }
    let presented = req.authorization.and_then(|h| {
        let (scheme, token) = h.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    });
    match presented {
        Some(t)
            if cfg
                .admin_tokens
                .iter()
                .any(|k| constant_time_eq(t.as_bytes(), k.as_bytes())) =>
        {
            Ok(())
        }
        _ => Err(error(401, "unauthorized", "missing or wrong bearer token")
            .with("www-authenticate", "Bearer realm=\"drain-gate\"")),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
pub(crate) mod tests {
    use super::*;
    use crate::api::reply::tests::{body, header};
    use crate::config::Role;

    pub(crate) fn cfg() -> Config {
        Config {
            role: Role::Health,
            ..Config::default()
        }
    }

    fn req<'a>(method: &'a str, path: &'a str) -> Request<'a> {
        Request {
            method,
            path,
            source: Some("127.0.0.1".parse().unwrap()),
            ..Request::default()
        }
    }

    #[test]
    fn routes() {
        let c = cfg();
        let ok = |m, p| route(&req(m, p), &c).unwrap();
        assert_eq!(
            ok("GET", "/health_check.html"),
            Endpoint::Check(Audience::Lb)
        );
        assert_eq!(ok("HEAD", "/live"), Endpoint::Check(Audience::Liveness));
        assert_eq!(ok("GET", "/drain/status"), Endpoint::Status);
        assert_eq!(ok("POST", "/drain"), Endpoint::Transition(Command::Drain));
        assert_eq!(
            ok("POST", "/close-lb"),
            Endpoint::Transition(Command::CloseLb)
        );
        assert_eq!(ok("POST", "/fault"), Endpoint::Transition(Command::Fault));
        assert_eq!(
            ok("POST", "/drain?wait=closed&timeout=90s"),
            Endpoint::DrainAndWait { timeout_ms: 90_000 }
        );
        assert_eq!(
            ok("GET", "/prestop"),
            Endpoint::DrainAndWait {
                timeout_ms: c.default_wait_ms()
            }
        );
    }

    #[test]
    fn errors_are_specific() {
        let c = cfg();
        let err = |m, p| route(&req(m, p), &c).unwrap_err();
        assert_eq!(err("GET", "/nope").status, 404);
        assert_eq!(err("GET", "/health/").status, 404);
        let r = err("GET", "/drain");
        assert_eq!((r.status, header(&r, "allow")), (405, Some("POST")));
        let r = err("POST", "/health");
        assert_eq!((r.status, header(&r, "allow")), (405, Some("GET, HEAD")));
        assert_eq!(err("HEAD", "/prestop").status, 405, "HEAD must never drain");
        for bad in [
            "/drain?wait=open",
            "/drain?wait=closed&timeout=x",
            "/drain?wait=closed&timeout=2h",
            "/drain?timeout=5s",
            "/drain?foo=1",
            "/close?wait=closed",
        ] {
            let r = err("POST", bad);
            assert_eq!(r.status, 400, "{bad}");
            assert_eq!(body(&r)["error"], "bad_request");
        }
        assert_eq!(err("GET", "/health?x=1").status, 400);
        let r = err("POST", "/drain?wait=closed&timeout=61m");
        assert_eq!(
            body(&r)["message"],
            "timeout: expected a duration from 1ms to 60m, e.g. 90s"
        );
    }

    #[test]
    fn admin_needs_allowed_source_or_token() {
        let mut c = cfg();
        let remote = Request {
            source: Some("203.0.113.5".parse().unwrap()),
            ..req("POST", "/drain")
        };
        let r = route(&remote, &c).unwrap_err();
        assert_eq!(
            (r.status, body(&r)["error"].as_str()),
            (403, Some("forbidden"))
        );
        let unknown = Request {
            source: None,
            ..remote
        };
        assert_eq!(route(&unknown, &c).unwrap_err().status, 403);
        // Reads are open to everyone.
        assert!(route(
            &Request {
                method: "GET",
                path: "/health",
                ..remote
            },
            &c
        )
        .is_ok());

        c.admin_tokens = vec![
            "old-token-0123456789".into(),
            "s3cret-token-0123456789".into(),
        ];
        let r = route(&remote, &c).unwrap_err();
        assert_eq!(r.status, 401);
        assert!(header(&r, "www-authenticate").is_some());
        let wrong = Request {
            authorization: Some("Bearer nope"),
            ..remote
        };
        assert_eq!(route(&wrong, &c).unwrap_err().status, 401);
        let basic = Request {
            authorization: Some("Basic s3cret-token-0123456789"),
            ..remote
        };
        assert_eq!(route(&basic, &c).unwrap_err().status, 401);
        let good = Request {
            authorization: Some("bearer  s3cret-token-0123456789"),
            ..remote
        };
        assert_eq!(
            route(&good, &c).unwrap(),
            Endpoint::Transition(Command::Drain)
        );
        // Loopback is allowed without a token.
        assert!(route(&req("POST", "/drain"), &c).is_ok());
    }
}
