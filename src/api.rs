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

use serde::Serialize;
use std::net::IpAddr;

use crate::config::{parse_duration_ms, Config, MAX_DURATION_MS};
use crate::fsm::{CloseAfter, Illegal, Reason, Record, State};
use crate::lb::Checkers;

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
pub enum Audience {
    /// `/health_check.html`: the external load balancer.
    Lb,
    /// `/health`: Kubernetes readiness.
    Readiness,
    /// `/live`: Kubernetes liveness.
    Liveness,
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

/// One complete answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const HEALTH_CACHE: &str = "max-age=1";

impl Reply {
    fn new(status: u16, content_type: &str, body: Vec<u8>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type", content_type.to_string())],
            body,
        }
    }

    fn json<T: Serialize>(status: u16, body: &T) -> Reply {
        // Serializing these plain structs cannot fail; an empty body is the
        // harmless fallback if it ever did.
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        Reply::new(status, JSON, bytes).with("cache-control", "no-store")
    }

    fn with(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.retain(|(n, _)| *n != name);
        self.headers.push((name, value.into()));
        self
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
}

fn error(status: u16, error: &str, message: &str) -> Reply {
    Reply::json(status, &ErrorBody { error, message })
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
            return Err(error(
                400,
                "bad_request",
                "timeout is only valid with wait=closed",
            ))
        }
        "/prestop" if params.wait => {
            return Err(error(
                400,
                "bad_request",
                "/prestop always waits; drop wait=",
            ))
        }
        "/prestop" => wait(&params),
        _ if params.seen => {
            return Err(error(
                400,
                "bad_request",
                "this endpoint takes no query parameters",
            ))
        }
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
                "wait" => {
                    return Err(error(
                        400,
                        "bad_request",
                        "wait: the only value is \"closed\"",
                    ))
                }
                "timeout" => match parse_duration_ms(v) {
                    Ok(ms) if ms > 0 && ms <= MAX_DURATION_MS => p.timeout_ms = Some(ms),
                    _ => {
                        return Err(error(
                            400,
                            "bad_request",
                            "timeout: expected a duration from 1ms to 60m, e.g. 90s",
                        ))
                    }
                },
                _ => {
                    return Err(error(
                        400,
                        "bad_request",
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

/// Entity tag of a health answer: changes exactly when the answer does.
pub fn etag(state: State, status: u16) -> String {
    format!("\"{}-{}\"", state.name().to_ascii_lowercase(), status)
}

fn none_match(header: Option<&str>, tag: &str) -> bool {
    let Some(h) = header else { return false };
    h.split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag)
}

#[derive(Serialize)]
struct Readiness {
    state: State,
    ready: bool,
}

#[derive(Serialize)]
struct Liveness {
    state: State,
    live: bool,
}

/// Answer of a health check for the current state.
pub fn check(audience: Audience, state: State, cfg: &Config, if_none_match: Option<&str>) -> Reply {
    let reply = match audience {
        Audience::Lb => {
            let status = state.lb_status(cfg.draining_lb_status);
            let body: &[u8] = if status == 200 { b"OK\n" } else { b"DRAIN\n" };
            Reply::new(status, TEXT, body.to_vec())
        }
        Audience::Readiness => Reply::json(
            state.readiness_status(),
            &Readiness {
                state,
                ready: state.ready(),
            },
        ),
        Audience::Liveness => Reply::json(
            state.liveness_status(),
            &Liveness {
                state,
                live: state.live(),
            },
        ),
    };
    let tag = etag(state, reply.status);
    let reply = reply
        .with("cache-control", HEALTH_CACHE)
        .with("etag", tag.clone());
    // Preconditions only apply to answers that would be 2xx (RFC 9110 §13.2.2).
    if reply.status == 200 && none_match(if_none_match, &tag) {
        return Reply {
            status: 304,
            headers: vec![("cache-control", HEALTH_CACHE.to_string()), ("etag", tag)],
            body: Vec::new(),
        };
    }
    reply
}

/// What the LB check and readiness answer while no traffic role counts.
pub const WAITING_STATUS: u16 = 503;
pub const WAITING_FOR_TRAFFIC: &str = "traffic_role";

#[derive(Serialize)]
struct Waiting {
    state: State,
    ready: bool,
    waiting_for: &'static str,
}

/// A health check while no traffic role has registered in this `vm_id`:
/// the gateway does not count its streams yet, so neither the LB nor
/// Kubernetes may send it any (LB check and readiness 503; liveness as
/// usual, so that the pod is not restarted for it).
pub fn check_waiting(audience: Audience, state: State, cfg: &Config, if_none_match: Option<&str>) -> Reply {
    let reply = match audience {
        Audience::Liveness => return check(audience, state, cfg, if_none_match),
        Audience::Lb => Reply::new(WAITING_STATUS, TEXT, b"WAIT\n".to_vec()),
        Audience::Readiness => Reply::json(
            WAITING_STATUS,
            &Waiting {
                state,
                ready: false,
                waiting_for: WAITING_FOR_TRAFFIC,
            },
        ),
    };
    reply
        .with("cache-control", HEALTH_CACHE)
        .with("etag", etag(state, WAITING_STATUS))
}

/// How the active count is kept; reported in the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CountInfo {
    /// `gauge` (a live Envoy gauge) or `shared_data` (the stats
    /// configuration dropped the gauge, so the count lives in shared data).
    pub source: &'static str,
    /// False once a stream could not be counted, a traffic VM was lost or
    /// the traffic filter went away: the drain then waits for
    /// `drain_timeout` instead of trusting a zero.
    pub reliable: bool,
    /// Why it is not reliable (`crate::liveness::Why`), `null` when it is.
    pub unreliable_reason: Option<&'static str>,
}

/// The traffic roles of this `vm_id` (see `crate::liveness`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TrafficInfo {
    /// A traffic root has registered at least once.
    pub seen: bool,
    /// Traffic root contexts registered now (one per worker per filter configuration).
    pub roots: usize,
    /// Traffic root contexts that stopped beating without a goodbye.
    pub lost: u64,
}

/// Everything a status answer shows.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub rec: &'a Record,
    pub active: u64,
    pub now_ms: u64,
    pub count: CountInfo,
    pub traffic: TrafficInfo,
    pub draining_lb_status: u16,
    pub checkers: &'a Checkers,
    pub lb_fall: u32,
    pub close_after: CloseAfter,
}

#[derive(Serialize)]
struct StepOut {
    from: State,
    to: State,
    reason: &'static str,
    at: String,
    active: u64,
}

#[derive(Serialize)]
struct Progress {
    reason: &'static str,
    forced: bool,
    since: String,
    drain_started_at: Option<String>,
    closing_at: Option<String>,
    closed_at: Option<String>,
    drain_duration_ms: Option<u64>,
    active_at_closing: Option<u64>,
    min_drain_ms: Option<u64>,
    drain_timeout_ms: Option<u64>,
    lb_buffer_ms: Option<u64>,
    transitions: Vec<StepOut>,
}

#[derive(Serialize)]
struct CheckerOut<'a> {
    source: &'a str,
    consecutive_non_200: u32,
    consecutive_503: u32,
    last_seen: String,
    last_404: Option<String>,
}

#[derive(Serialize)]
struct Lb<'a> {
    close_after: CloseAfter,
    lb_fall: u32,
    observed_down: bool,
    observed_down_at: Option<String>,
    /// DRAINING: every live checker has been served a 404 since the drain
    /// began (what a gated soft drain waits for). False in every other state.
    saw_drain: bool,
    checkers: Vec<CheckerOut<'a>>,
}

#[derive(Serialize)]
struct Status<'a> {
    state: State,
    ready: bool,
    live: bool,
    lb_status: u16,
    active: u64,
    count: CountInfo,
    /// `traffic_role` while no traffic role has registered: the gateway is
    /// not announced (LB check and readiness 503).
    waiting_for: Option<&'static str>,
    traffic: TrafficInfo,
    progress: Progress,
    lb: Lb<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait: Option<&'a str>,
}

fn status_body<'a>(v: &View<'a>, error: Option<&'a str>, wait: Option<&'a str>) -> Status<'a> {
    let r = v.rec;
    let waiting = !v.traffic.seen;
    Status {
        state: r.state,
        ready: r.state.ready() && !waiting,
        live: r.state.live(),
        lb_status: if waiting {
            WAITING_STATUS
        } else {
            r.state.lb_status(v.draining_lb_status)
        },
        active: v.active,
        count: v.count,
        waiting_for: waiting.then_some(WAITING_FOR_TRAFFIC),
        traffic: v.traffic,
        progress: Progress {
            reason: r.reason.name(),
            forced: r.forced,
            since: rfc3339(r.since_ms),
            drain_started_at: r.drain_started_ms.map(rfc3339),
            closing_at: r.closing_ms.map(rfc3339),
            closed_at: r.closed_ms.map(rfc3339),
            drain_duration_ms: r.drain_duration_ms(v.now_ms),
            active_at_closing: r.active_at_closing,
            min_drain_ms: r.plan.map(|p| p.min_drain_ms),
            drain_timeout_ms: r.plan.map(|p| p.drain_timeout_ms),
            lb_buffer_ms: r.plan.map(|p| p.lb_buffer_ms),
            transitions: r
                .history
                .iter()
                .map(|s| StepOut {
                    from: s.from,
                    to: s.to,
                    reason: s.reason.name(),
                    at: rfc3339(s.at_ms),
                    active: s.active,
                })
                .collect(),
        },
        lb: Lb {
            close_after: v.close_after,
            lb_fall: v.lb_fall,
            observed_down: v.checkers.all_down(v.now_ms, v.lb_fall),
            observed_down_at: v.checkers.down_since(v.now_ms, v.lb_fall).map(rfc3339),
            saw_drain: r.state == State::Draining
                && r
                    .drain_started_ms
                    .is_some_and(|t| v.checkers.saw_drain(t, v.now_ms)),
            checkers: v
                .checkers
                .list
                .iter()
                .map(|c| CheckerOut {
                    source: &c.source,
                    consecutive_non_200: c.consecutive_non_200,
                    consecutive_503: c.consecutive_503,
                    last_seen: rfc3339(c.last_seen_ms),
                    last_404: c.last_404_ms.map(rfc3339),
                })
                .collect(),
        },
        error,
        wait,
    }
}

/// `GET /drain/status` and the answer to a successful transition.
pub fn status(v: &View) -> Reply {
    Reply::json(200, &status_body(v, None, None))
}

#[derive(Serialize)]
struct IllegalBody {
    error: &'static str,
    state: State,
    requested: State,
}

/// 409 for a refused transition.
pub fn illegal(e: Illegal) -> Reply {
    Reply::json(
        409,
        &IllegalBody {
            error: "illegal_transition",
            state: e.state,
            requested: e.requested,
        },
    )
}

/// How a held `wait=closed` ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    Closed,
    /// The drain was abandoned (reopen or fault) while waiting.
    Aborted,
    TimedOut,
}

/// Whether a held wait is over: CLOSED ends it, leaving the drain aborts it,
/// the deadline times it out.
pub fn wait_end(state: State, timed_out: bool) -> Option<WaitEnd> {
    match state {
        State::Closed => Some(WaitEnd::Closed),
        State::Open | State::Fault => Some(WaitEnd::Aborted),
        State::Draining | State::Closing if timed_out => Some(WaitEnd::TimedOut),
        State::Draining | State::Closing => None,
    }
}

/// The final answer of a held wait: the status, with `wait` saying how it ended.
pub fn wait_reply(end: WaitEnd, v: &View) -> Reply {
    let (code, error, wait) = match end {
        WaitEnd::Closed => (200, None, "closed"),
        WaitEnd::Aborted => (409, Some("drain_aborted"), "aborted"),
        WaitEnd::TimedOut => (504, Some("wait_timeout"), "timeout"),
    };
    Reply::json(code, &status_body(v, error, Some(wait)))
}

/// Formats milliseconds since the Unix epoch as RFC 3339 UTC.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::config::Role;

    fn cfg() -> Config {
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

    fn body(r: &Reply) -> serde_json::Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
        r.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
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

    #[test]
    fn health_answers_follow_the_state_table() {
        let c = cfg();
        for s in State::ALL {
            let lb = check(Audience::Lb, s, &c, None);
            assert_eq!(lb.status, s.lb_status(200));
            assert_eq!(
                lb.body,
                if lb.status == 200 {
                    b"OK\n".to_vec()
                } else {
                    b"DRAIN\n".to_vec()
                }
            );
            assert_eq!(header(&lb, "cache-control"), Some("max-age=1"));
            let ready = check(Audience::Readiness, s, &c, None);
            assert_eq!(ready.status, s.readiness_status());
            assert_eq!(body(&ready)["ready"], s.ready());
            assert_eq!(body(&ready)["state"], s.name());
            let live = check(Audience::Liveness, s, &c, None);
            assert_eq!(live.status, s.liveness_status());
            assert_eq!(body(&live)["live"], s.live());
        }
    }

    #[test]
    fn etags_and_304() {
        let c = cfg();
        let r = check(Audience::Lb, State::Open, &c, None);
        let tag = header(&r, "etag").unwrap().to_string();
        assert_eq!(tag, "\"open-200\"");
        let r304 = check(Audience::Lb, State::Open, &c, Some(&tag));
        assert_eq!(r304.status, 304);
        assert!(r304.body.is_empty());
        let weak = format!("\"x\", W/{tag}");
        assert_eq!(
            check(Audience::Lb, State::Open, &c, Some(&weak)).status,
            304
        );
        assert_eq!(
            check(Audience::Lb, State::Closing, &c, Some(&tag)).status,
            503
        );
        assert_eq!(
            check(Audience::Lb, State::Closing, &c, Some("*")).status,
            503,
            "no 304 for a 503"
        );
    }

    #[test]
    fn soft_drain_answers_404_to_the_lb() {
        let c = Config {
            draining_lb_status: 404,
            ..cfg()
        };
        assert_eq!(check(Audience::Lb, State::Draining, &c, None).status, 404);
        assert_eq!(
            check(Audience::Readiness, State::Draining, &c, None).status,
            200
        );
    }

    #[test]
    fn status_and_conflict_bodies() {
        let rec = Record::new(1_764_000_000_000);
        let v = View {
            rec: &rec,
            active: 3,
            now_ms: 1_764_000_000_500,
            count: CountInfo {
                source: "gauge",
                reliable: true,
                unreliable_reason: None,
            },
            traffic: TrafficInfo {
                seen: true,
                roots: 2,
                lost: 0,
            },
            draining_lb_status: 200,
            checkers: &Checkers::default(),
            lb_fall: 2,
            close_after: CloseAfter::LbBuffer,
        };
        let s = body(&status(&v));
        assert_eq!(s["state"], "OPEN");
        assert_eq!(s["active"], 3);
        assert_eq!(s["ready"], true);
        assert_eq!(s["progress"]["reason"], "start");
        assert_eq!(s["progress"]["since"], "2025-11-24T16:00:00.000Z");
        let c = body(&illegal(Illegal {
            state: State::Closed,
            requested: State::Open,
        }));
        assert_eq!(
            c,
            serde_json::json!({"error":"illegal_transition","state":"CLOSED","requested":"OPEN"})
        );
        let w = wait_reply(WaitEnd::TimedOut, &v);
        assert_eq!(w.status, 504);
        assert_eq!(body(&w)["wait"], "timeout");
        assert_eq!(s["waiting_for"], serde_json::Value::Null);
        let waiting = View {
            traffic: TrafficInfo {
                seen: false,
                roots: 0,
                lost: 0,
            },
            ..v
        };
        let s = body(&status(&waiting));
        assert_eq!(
            (&s["waiting_for"], &s["ready"], &s["lb_status"]),
            (&serde_json::json!("traffic_role"), &serde_json::json!(false), &serde_json::json!(503))
        );
    }

    #[test]
    fn waiting_for_the_traffic_role_answers_503_to_lb_and_readiness() {
        let c = cfg();
        let lb = check_waiting(Audience::Lb, State::Open, &c, Some("\"open-200\""));
        assert_eq!((lb.status, lb.body.as_slice()), (503, b"WAIT\n".as_slice()));
        assert_ne!(header(&lb, "etag"), Some("\"open-200\""));
        let ready = check_waiting(Audience::Readiness, State::Open, &c, None);
        assert_eq!(ready.status, 503);
        assert_eq!(
            body(&ready),
            serde_json::json!({"state":"OPEN","ready":false,"waiting_for":"traffic_role"})
        );
        let live = check_waiting(Audience::Liveness, State::Open, &c, None);
        assert_eq!(live, check(Audience::Liveness, State::Open, &c, None));
    }

    #[test]
    fn wait_outcomes() {
        assert_eq!(wait_end(State::Draining, false), None);
        assert_eq!(wait_end(State::Closing, true), Some(WaitEnd::TimedOut));
        assert_eq!(wait_end(State::Closed, true), Some(WaitEnd::Closed));
        assert_eq!(wait_end(State::Open, false), Some(WaitEnd::Aborted));
        assert_eq!(wait_end(State::Fault, false), Some(WaitEnd::Aborted));
    }

    #[test]
    fn rfc3339_formatting() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_795_910_400_000), "2026-11-29T00:00:00.000Z");
    }
}
