//! The HTTP surface of the health listener (:18180): which request maps to
//! which endpoint, who may call it, and every answer it can give. Pure.
//! The contract, with every status, header and body, is `openapi.yaml`.
//!
//! Every endpoint is one row of [`ROUTES`]; the table below says what each answers.
//!
//! | request                                   | answer                                              |
//! |-------------------------------------------|-----------------------------------------------------|
//! | GET/HEAD /health_check.html               | LB code per state (200 `OK`, 404/503 `DRAIN`)       |
//! | GET/HEAD /health, /live                   | readiness / liveness per state, JSON                |
//! | GET/HEAD /drain/status                    | 200 status JSON                                     |
//! | POST /drain, /close-lb, /close, /reopen, /fault | 200 status JSON, or 409 illegal transition    |
//! | POST /drain?hold=closing                  | maintenance drain: CLOSING lasts until /reopen or /close |
//! | POST /reopen?force=true                   | reopen even while a preStop hold is active (else 409 `prestop_hold`) |
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
//! `wait=closed` answers), `reply` (the `Reply` type and the error answers),
//! `query` (which query parameters each endpoint takes, and how they are spelled).

use std::net::IpAddr;

use crate::config::Config;
use crate::fsm::{DrainPlan, Reason, State};

pub mod checks;
pub mod query;
pub mod reply;
pub mod status;

pub use crate::clock::rfc3339;
pub use checks::{check, check_waiting, etag, Audience};
use query::Params;
use reply::{bad_request, error};
pub use reply::{illegal, unavailable, Reply};
pub use status::{
    status, wait_end, wait_reply, CountInfo, Footprint, RotationView, TrafficInfo, View, WaitEnd,
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
    /// `POST /drain?hold=closing`: a maintenance drain.
    HoldDrain,
    CloseLb,
    Close,
    Reopen,
    /// `POST /reopen?force=true`: reopen through a preStop hold.
    ForceReopen,
    Fault,
}

impl Command {
    pub fn target(self) -> State {
        match self {
            Command::Drain | Command::HoldDrain => State::Draining,
            Command::CloseLb => State::Closing,
            Command::Close => State::Closed,
            Command::Reopen | Command::ForceReopen => State::Open,
            Command::Fault => State::Fault,
        }
    }

    pub fn reason(self) -> Reason {
        match self {
            Command::Drain | Command::HoldDrain => Reason::DrainRequested,
            Command::CloseLb => Reason::CloseLbRequested,
            Command::Close => Reason::CloseRequested,
            Command::Reopen | Command::ForceReopen => Reason::ReopenRequested,
            Command::Fault => Reason::FaultRequested,
        }
    }

    /// The state this command moves from. /reopen and /fault apply to the
    /// current state; `fsm::legal` decides whether that is allowed.
    pub fn expected_from(self, current: State) -> State {
        match self {
            Command::Drain | Command::HoldDrain => State::Open,
            Command::CloseLb => State::Draining,
            Command::Close => State::Closing,
            Command::Reopen | Command::ForceReopen | Command::Fault => current,
        }
    }

    /// The plan a drain started by this command follows.
    pub fn plan(self, cfg: &Config) -> DrainPlan {
        DrainPlan {
            hold_closing: self == Command::HoldDrain,
            ..cfg.plan()
        }
    }

    /// Whether the move goes through an active preStop hold.
    pub fn force(self) -> bool {
        self == Command::ForceReopen
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

/// One endpoint of the health listener, as the router, the property tests
/// and the OpenAPI check (`openapi_lists_every_route`) all read it.
#[derive(Clone, Copy)]
pub struct Route {
    pub path: &'static str,
    /// The `Allow` header: every method the endpoint takes.
    pub allow: &'static str,
    /// An admin call: needs `admin_allow` or a bearer token.
    pub admin: bool,
    /// The query parameters it takes.
    pub params: &'static [&'static str],
    /// The endpoint a request with these parameters asks for.
    endpoint: fn(&Params, &Config) -> Result<Endpoint, Reply>,
}

impl Route {
    /// Whether the endpoint takes `method`.
    pub fn allows(&self, method: &str) -> bool {
        self.allow.split(',').any(|m| m.trim_start() == method)
    }
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.allow, self.path)
    }
}

const READ: &str = "GET, HEAD";

/// Every endpoint of the health listener.
pub const ROUTES: [Route; 10] = [
    Route {
        path: "/health_check.html",
        allow: READ,
        admin: false,
        params: &[],
        endpoint: |_, _| Ok(Endpoint::Check(Audience::Lb)),
    },
    Route {
        path: "/health",
        allow: READ,
        admin: false,
        params: &[],
        endpoint: |_, _| Ok(Endpoint::Check(Audience::Readiness)),
    },
    Route {
        path: "/live",
        allow: READ,
        admin: false,
        params: &[],
        endpoint: |_, _| Ok(Endpoint::Check(Audience::Liveness)),
    },
    Route {
        path: "/drain/status",
        allow: READ,
        admin: false,
        params: &[],
        endpoint: |_, _| Ok(Endpoint::Status),
    },
    Route {
        path: "/drain",
        allow: "POST",
        admin: true,
        params: &["wait", "timeout", "hold"],
        endpoint: drain,
    },
    Route {
        path: "/close-lb",
        allow: "POST",
        admin: true,
        params: &[],
        endpoint: |_, _| Ok(Endpoint::Transition(Command::CloseLb)),
    },
    Route {
        path: "/close",
        allow: "POST",
        admin: true,
        params: &[],
        endpoint: |_, _| Ok(Endpoint::Transition(Command::Close)),
    },
    Route {
        path: "/reopen",
        allow: "POST",
        admin: true,
        params: &["force"],
        endpoint: |p, _| {
            Ok(Endpoint::Transition(if p.force {
                Command::ForceReopen
            } else {
                Command::Reopen
            }))
        },
    },
    Route {
        path: "/fault",
        allow: "POST",
        admin: true,
        params: &[],
        endpoint: |_, _| Ok(Endpoint::Transition(Command::Fault)),
    },
    Route {
        path: "/prestop",
        allow: "GET",
        admin: true,
        params: &["timeout"],
        endpoint: |p, cfg| Ok(wait(p, cfg)),
    },
];

/// The route of a path (without its query), if the listener has one.
pub fn route_of(path: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|r| r.path == path)
}

/// A held drain: until CLOSED, or the request's `timeout`.
fn wait(p: &Params, cfg: &Config) -> Endpoint {
    Endpoint::DrainAndWait {
        timeout_ms: p.timeout_ms.unwrap_or_else(|| cfg.default_wait_ms()),
    }
}

/// `POST /drain`: a drain, a held drain (`wait=closed`) or a maintenance
/// drain (`hold=closing`).
fn drain(p: &Params, cfg: &Config) -> Result<Endpoint, Reply> {
    match (p.wait, p.hold) {
        (true, true) => Err(bad_request(
            "hold=closing never reaches CLOSED by itself: drop wait or hold",
        )),
        (true, false) => Ok(wait(p, cfg)),
        (false, _) if p.timeout_ms.is_some() => {
            Err(bad_request("timeout is only valid with wait=closed"))
        }
        (false, true) => Ok(Endpoint::Transition(Command::HoldDrain)),
        (false, false) => Ok(Endpoint::Transition(Command::Drain)),
    }
}

/// Maps a request to an endpoint, or to the error answer (400, 401, 403, 404, 405).
pub fn route(req: &Request, cfg: &Config) -> Result<Endpoint, Reply> {
    let (path, query) = match req.path.split_once('?') {
        Some((p, q)) => (p, q),
        None => (req.path, ""),
    };
    let Some(route) = route_of(path) else {
        return Err(error(
            404,
            "not_found",
            "no such endpoint; see openapi.yaml",
        ));
    };
    if !route.allows(req.method) {
        return Err(error(
            405,
            "method_not_allowed",
            "this endpoint does not take that method; see the Allow header",
        )
        .with("allow", route.allow));
    }
    if route.admin {
        authorize(req, cfg)?;
    }
    let params = Params::parse(query, route.params)?;
    (route.endpoint)(&params, cfg)
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
            ok("POST", "/drain?wait=%63losed&timeout=%31s"),
            Endpoint::DrainAndWait { timeout_ms: 1_000 }
        );
        assert_eq!(
            ok("GET", "/prestop"),
            Endpoint::DrainAndWait {
                timeout_ms: c.default_wait_ms()
            }
        );
        assert_eq!(
            ok("POST", "/drain?hold=closing"),
            Endpoint::Transition(Command::HoldDrain)
        );
        assert_eq!(
            ok("POST", "/reopen?force=true"),
            Endpoint::Transition(Command::ForceReopen)
        );
        assert_eq!(ok("POST", "/reopen"), Endpoint::Transition(Command::Reopen));
    }

    #[test]
    fn maintenance_drain_and_forced_reopen_commands() {
        let c = cfg();
        assert!(Command::HoldDrain.plan(&c).hold_closing);
        assert!(!Command::Drain.plan(&c).hold_closing);
        assert_eq!(Command::HoldDrain.target(), State::Draining);
        assert_eq!(
            Command::HoldDrain.expected_from(State::Closing),
            State::Open
        );
        assert!(Command::ForceReopen.force() && !Command::Reopen.force());
        assert_eq!(
            Command::ForceReopen.expected_from(State::Closing),
            State::Closing
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
            "/drain?wait=closed&timeout=1s&timeout=3s",
            "/drain?wait=closed&timeout=%3",
            "/drain?hold=open",
            "/drain?hold=closing&wait=closed",
            "/close?hold=closing",
            "/reopen?force=yes",
            "/reopen?force=true&wait=closed",
            "/drain?force=true",
        ] {
            let r = err("POST", bad);
            assert_eq!(r.status, 400, "{bad}");
            assert_eq!(body(&r)["error"], "bad_request");
        }
        assert_eq!(err("GET", "/health?x=1").status, 400);
        assert_eq!(err("GET", "/prestop?wait=closed").status, 400);
        let r = err("GET", "/live?a");
        assert_eq!(
            body(&r)["message"],
            "unknown query parameter; this endpoint takes no query parameters"
        );
        let r = err("POST", "/close?x");
        assert_eq!(
            body(&r)["message"],
            "unknown query parameter; this endpoint takes no query parameters"
        );
        let r = err("GET", "/prestop?x=1");
        assert_eq!(
            body(&r)["message"],
            "unknown query parameter; this endpoint takes timeout"
        );
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

    /// `openapi.yaml` describes exactly the routes of `ROUTES`: the same
    /// paths, each with the methods of its `Allow` header, the query
    /// parameters it takes, and the admin tag on the admin calls.
    #[test]
    fn openapi_lists_every_route() {
        let doc: serde_yaml::Value = serde_yaml::from_str(include_str!("../openapi.yaml")).unwrap();
        let paths = doc["paths"].as_mapping().unwrap();
        let documented: Vec<&str> = paths.keys().map(|k| k.as_str().unwrap()).collect();
        let routed: Vec<&str> = ROUTES.iter().map(|r| r.path).collect();
        assert_eq!(documented, routed, "openapi.yaml paths vs ROUTES");
        // A query parameter's name; `None` for headers.
        let param_name = |p: &serde_yaml::Value| -> Option<String> {
            let p = match p.get("$ref").and_then(|r| r.as_str()) {
                Some(r) => &doc["components"]["parameters"][r.rsplit('/').next().unwrap()],
                None => p,
            };
            (p["in"].as_str() == Some("query")).then(|| p["name"].as_str().unwrap().to_string())
        };
        for r in ROUTES {
            let ops = paths[r.path].as_mapping().unwrap();
            let mut methods: Vec<String> = ops
                .keys()
                .map(|k| k.as_str().unwrap().to_ascii_uppercase())
                .collect();
            methods.sort();
            let mut allowed: Vec<String> = r.allow.split(", ").map(str::to_string).collect();
            allowed.sort();
            assert_eq!(methods, allowed, "{}", r.path);
            for (_, op) in ops {
                let mut params: Vec<String> = op["parameters"]
                    .as_sequence()
                    .map(|ps| ps.iter().filter_map(param_name).collect())
                    .unwrap_or_default();
                params.sort();
                let mut takes: Vec<String> = r.params.iter().map(|p| p.to_string()).collect();
                takes.sort();
                assert_eq!(params, takes, "{} parameters", r.path);
                let admin = op["tags"]
                    .as_sequence()
                    .is_some_and(|t| t.iter().any(|t| t.as_str() == Some("admin")));
                assert_eq!(admin, r.admin, "{} admin tag", r.path);
            }
        }
    }
}
