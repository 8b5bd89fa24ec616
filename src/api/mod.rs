//! The HTTP surface of the health listener (:18180): which request maps to
//! which endpoint, who may call it, and every answer it can give. Pure.
//! The contract, with every status, header and body, is `openapi.yaml`.
//!
//! Every endpoint is one row of [`ROUTES`]; the table below says what each answers.
//!
//! | request                                   | answer                                              |
//! |-------------------------------------------|-----------------------------------------------------|
//! | GET/HEAD /health_check.html               | LB code per state (200 `OK`, 404/503 `DRAIN`): `crate::gate::answer` |
//! | GET/HEAD /health, /live                   | readiness / liveness per state, JSON: `crate::gate::answer` |
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
//! This file routes and authorizes; the health checks are answered by
//! `crate::gate::answer`, the rest beside it: `crate::instruments::status` (the status
//! document and held `wait=closed` answers), `reply` (the `Reply` type and the error answers),
//! `query` (which query parameters each endpoint takes, and how they are spelled).

use std::net::IpAddr;

use crate::config::Health;
use crate::gate::fsm::{DrainPlan, Move, Reason, State};

pub mod query;
pub mod reply;

pub use crate::gate::answer::Audience;
pub use crate::instruments::status::{status, wait_end, View, WaitEnd};
use query::Params;
use reply::{bad_request, error};
pub use reply::{illegal, unavailable, Reply};

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
    /// The FSM move this command asks for in `current`: /reopen and /fault
    /// apply to the current state (`fsm::legal` decides whether that is
    /// allowed); a drain follows the configured plan.
    pub fn move_in(self, current: State, cfg: &Health) -> Move {
        use State::{Closed, Closing, Draining, Open};
        let (expected_from, to, reason) = match self {
            Command::Drain | Command::HoldDrain => (Open, Draining, Reason::DrainRequested),
            Command::CloseLb => (Draining, Closing, Reason::CloseLbRequested),
            Command::Close => (Closing, Closed, Reason::CloseRequested),
            Command::Reopen | Command::ForceReopen => (current, Open, Reason::ReopenRequested),
            Command::Fault => (current, State::Fault, Reason::FaultRequested),
        };
        Move {
            expected_from,
            to,
            reason,
            plan: Some(DrainPlan {
                hold_closing: self == Command::HoldDrain,
                ..cfg.plan()
            }),
            force: self == Command::ForceReopen,
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

/// One endpoint of the health listener, as the router, the property tests
/// and the OpenAPI check (`openapi_lists_every_route`) all read it.
#[derive(Clone, Copy, Debug)]
pub struct Route {
    pub path: &'static str,
    /// The `Allow` header: every method the endpoint takes.
    pub allow: &'static str,
    /// An admin call: needs `admin_allow` or a bearer token.
    pub admin: bool,
    /// The query parameters it takes.
    pub params: &'static [&'static str],
    /// What it answers; its parameters may choose otherwise ([`chosen`]).
    endpoint: Endpoint,
}

impl Route {
    /// A read anyone may make: GET or HEAD, without parameters.
    const fn read(path: &'static str, endpoint: Endpoint) -> Route {
        Route {
            path,
            allow: "GET, HEAD",
            admin: false,
            params: &[],
            endpoint,
        }
    }

    /// An admin command.
    const fn post(path: &'static str, params: &'static [&'static str], command: Command) -> Route {
        Route {
            path,
            allow: "POST",
            admin: true,
            params,
            endpoint: Endpoint::Transition(command),
        }
    }

    /// Whether the endpoint takes `method`.
    pub fn allows(&self, method: &str) -> bool {
        self.allow.split(',').any(|m| m.trim_start() == method)
    }
}

/// Every endpoint of the health listener.
pub const ROUTES: [Route; 10] = [
    Route::read("/health_check.html", Endpoint::Check(Audience::Lb)),
    Route::read("/health", Endpoint::Check(Audience::Readiness)),
    Route::read("/live", Endpoint::Check(Audience::Liveness)),
    Route::read("/drain/status", Endpoint::Status),
    Route::post("/drain", &["wait", "timeout", "hold"], Command::Drain),
    Route::post("/close-lb", &[], Command::CloseLb),
    Route::post("/close", &[], Command::Close),
    Route::post("/reopen", &["force"], Command::Reopen),
    Route::post("/fault", &[], Command::Fault),
    Route {
        path: "/prestop",
        allow: "GET",
        admin: true,
        params: &["timeout"],
        endpoint: Endpoint::DrainAndWait { timeout_ms: 0 },
    },
];

/// The route of a path (without its query), if the listener has one.
pub fn route_of(path: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|r| r.path == path)
}

/// The endpoint a request to `route` with these parameters asks for: a held
/// drain (`wait=closed`, `/prestop`) waits until CLOSED or its `timeout`,
/// `hold=closing` makes a maintenance drain, `force=true` reopens through a
/// preStop hold.
fn chosen(route: &Route, p: &Params, cfg: &Health) -> Result<Endpoint, Reply> {
    let wait = || Endpoint::DrainAndWait {
        timeout_ms: p.timeout_ms.unwrap_or_else(|| cfg.default_wait_ms()),
    };
    match route.endpoint {
        Endpoint::DrainAndWait { .. } => Ok(wait()),
        Endpoint::Transition(Command::Reopen) if p.force => {
            Ok(Endpoint::Transition(Command::ForceReopen))
        }
        Endpoint::Transition(Command::Drain) => match (p.wait, p.hold) {
            (true, true) => Err(bad_request(
                "hold=closing never reaches CLOSED by itself: drop wait or hold",
            )),
            (true, false) => Ok(wait()),
            (false, _) if p.timeout_ms.is_some() => {
                Err(bad_request("timeout is only valid with wait=closed"))
            }
            (false, true) => Ok(Endpoint::Transition(Command::HoldDrain)),
            (false, false) => Ok(Endpoint::Transition(Command::Drain)),
        },
        e => Ok(e),
    }
}

/// Maps a request to an endpoint, or to the error answer (400, 401, 403, 404, 405).
pub fn route(req: &Request, cfg: &Health) -> Result<Endpoint, Reply> {
    let (path, query) = req.path.split_once('?').unwrap_or((req.path, ""));
    let route = route_of(path)
        .ok_or_else(|| error(404, "not_found", "no such endpoint; see openapi.yaml"))?;
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
    chosen(route, &Params::parse(query, route.params)?, cfg)
}

fn authorize(req: &Request, cfg: &Health) -> Result<(), Reply> {
    let allowed = |ip: IpAddr| cfg.admin_allow.iter().any(|c| c.contains(ip));
    if req.source.is_some_and(allowed) {
        return Ok(());
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
    let known = |t: &str| {
        cfg.admin_tokens
            .iter()
            .any(|k| constant_time_eq(t.as_bytes(), k.as_bytes()))
    };
    if presented.is_some_and(known) {
        return Ok(());
    }
    Err(error(401, "unauthorized", "missing or wrong bearer token")
        .with("www-authenticate", "Bearer realm=\"drain-gate\""))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
pub(crate) mod tests {
    use super::*;
    use crate::api::reply::tests::{body, header};

    pub(crate) fn cfg() -> Health {
        Health::default()
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
        let hold = Command::HoldDrain.move_in(State::Closing, &c);
        assert!(hold.plan.unwrap().hold_closing);
        assert!(
            !Command::Drain
                .move_in(State::Open, &c)
                .plan
                .unwrap()
                .hold_closing
        );
        assert_eq!(hold.to, State::Draining);
        assert_eq!(hold.expected_from, State::Open);
        let reopen = |cmd: Command| cmd.move_in(State::Closing, &c);
        assert!(reopen(Command::ForceReopen).force && !reopen(Command::Reopen).force);
        assert_eq!(reopen(Command::ForceReopen).expected_from, State::Closing);
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
