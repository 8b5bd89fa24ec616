//! Property tests of the pure core, fed arbitrary input: the request router
//! and health answers give only documented codes, the configuration parser
//! names a key in every refusal, the state machine takes only legal moves and
//! keeps a bounded history, and status bodies stay well-formed JSON.
//! Run with `cargo test --test props`.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use std::net::IpAddr;

use drain_gate::api::{self, Audience, Endpoint, Request};
use drain_gate::config::{Config, Health, KEYS};
use drain_gate::gate::answer::{self, answer, Inputs};
use drain_gate::gate::clock::{self, Look, Now, Steps};
use drain_gate::gate::fsm::{self, CloseAfter, DrainPlan, Move, Reason, Record, State, HISTORY};
use drain_gate::gate::lb::{self as lb, Checkers, Gate, CHECKER_TTL_MS, MAX_GAPS, MIN_GAPS};
use drain_gate::gate::placeholder::Action;
use drain_gate::instruments::in_flight::{Ages, InFlight};
use proptest::prelude::*;
use serde_json::{json, Value};

/// A host that answered only the wall clock.
fn wall_clock(wall_ms: u64) -> Now {
    Now {
        wall_ms,
        mono_ms: None,
    }
}

/// The reads, which anyone may call.
/// Every path the router knows (`api::ROUTES`), and one it does not.
fn paths() -> Vec<&'static str> {
    api::ROUTES.iter().map(|r| r.path).chain(["/"]).collect()
}

/// Whether `path` is an admin call (needs `admin_allow` or a token).
fn admin(path: &str) -> bool {
    api::route_of(path).is_some_and(|r| r.admin)
}
const TOKEN: &str = "s3cret-token-0123456789";

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT", "get",
            "post", "", "G ET",
        ])
        .prop_map(str::to_string),
        "\\PC{0,12}",
    ]
}

fn query_part() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "wait=closed",
            "wait=open",
            "wait",
            "timeout=90s",
            "timeout=0s",
            "timeout=2h",
            "timeout=61m",
            "timeout=1ms",
            "timeout=%39%30s",
            "timeout=",
            "x=1",
            "%ZZ",
            "&",
            "=",
        ])
        .prop_map(str::to_string),
        "[a-z=%&0-9]{0,12}",
        "\\PC{0,16}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    (
        prop::sample::select(paths()),
        prop_oneof![Just(String::new()), "[/%.a-zA-Z0-9]{0,8}", "\\PC{0,8}"],
        prop::option::of(prop::collection::vec(query_part(), 0..4)),
    )
        .prop_map(|(p, suffix, q)| match q {
            Some(parts) => format!("{p}{suffix}?{}", parts.join("&")),
            None => format!("{p}{suffix}"),
        })
}

fn source() -> impl Strategy<Value = Option<IpAddr>> {
    prop::option::of(prop_oneof![
        Just("127.0.0.1".parse().unwrap()),
        Just("127.0.0.2".parse().unwrap()),
        Just("::1".parse().unwrap()),
        Just("::ffff:127.0.0.1".parse().unwrap()),
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u16; 8]>().prop_map(IpAddr::from),
    ])
}

fn authorization() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![
        Just(format!("Bearer {TOKEN}")),
        Just(format!("bearer   {TOKEN}  ")),
        Just(format!("Basic {TOKEN}")),
        Just(format!("Bearer {TOKEN}x")),
        Just("Bearer".to_string()),
        "\\PC{0,40}",
    ])
}

/// What the health role reads of `bytes`, a health role's configuration.
fn health(bytes: &[u8]) -> Health {
    match Config::parse(bytes) {
        Ok(Config::Health(h)) => h,
        other => panic!("not a health role: {other:?}"),
    }
}

fn config() -> impl Strategy<Value = Health> {
    (any::<bool>(), any::<bool>()).prop_map(|(narrow, token)| {
        let mut raw = json!({"role": "health"});
        if narrow {
            raw["admin_allow"] = json!(["127.0.0.2/32"]);
        }
        if token {
            raw["admin_token"] = json!(TOKEN);
        }
        health(raw.to_string().as_bytes())
    })
}

fn header<'a>(r: &'a api::Reply, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_str())
}

fn authorized(req: &Request, cfg: &Health) -> bool {
    let allowed = req
        .source
        .is_some_and(|ip| cfg.admin_allow.iter().any(|c| c.contains(ip)));
    let token = !cfg.admin_tokens.is_empty()
        && req.authorization.is_some_and(|h| {
            h.trim()
                .split_once(' ')
                .is_some_and(|(s, t)| s.eq_ignore_ascii_case("bearer") && t.trim() == TOKEN)
        });
    allowed || token
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, .. ProptestConfig::default() })]

    /// `api::route` never panics; it answers with an endpoint only for a known
    /// path, an allowed method and (for admin) an authorized caller, and every
    /// refusal is one of the documented codes with a JSON error body.
    #[test]
    fn route_answers_only_documented_codes(
        m in method(), p in path(), auth in authorization(), src in source(), cfg in config(),
        inm in prop::option::of("\\PC{0,20}"),
    ) {
        let req = Request {
            method: &m,
            path: &p,
            if_none_match: inm.as_deref(),
            authorization: auth.as_deref(),
            source: src,
        };
        let bare = p.split_once('?').map_or(p.as_str(), |(b, _)| b);
        match api::route(&req, &cfg) {
            Ok(endpoint) => {
                prop_assert!(paths().contains(&bare) && bare != "/", "{bare}");
                let admin = admin(bare);
                prop_assert!(!admin || authorized(&req, &cfg), "unauthorized admin call routed: {req:?}");
                let ok_method = api::route_of(bare).is_some_and(|r| r.allows(&m));
                prop_assert!(ok_method, "{m} {p} routed to {endpoint:?}");
                if let Endpoint::DrainAndWait { timeout_ms } = endpoint {
                    prop_assert!(timeout_ms > 0);
                    prop_assert!(bare == "/drain" || bare == "/prestop");
                }
            }
            Err(reply) => {
                prop_assert!([400, 401, 403, 404, 405].contains(&reply.status), "{}", reply.status);
                let body: Value = serde_json::from_slice(&reply.body).unwrap();
                prop_assert!(body["error"].is_string() && body["message"].is_string(), "{body}");
                prop_assert_eq!(body.as_object().unwrap().len(), 2);
                prop_assert_eq!(header(&reply, "content-type"), Some("application/json"));
                prop_assert_eq!(header(&reply, "cache-control"), Some("no-store"));
                prop_assert_eq!(header(&reply, "allow").is_some(), reply.status == 405);
                prop_assert_eq!(header(&reply, "www-authenticate").is_some(), reply.status == 401);
                if reply.status == 401 || reply.status == 403 {
                    prop_assert!(admin(bare) && !authorized(&req, &cfg));
                    prop_assert_eq!(reply.status == 401, !cfg.admin_tokens.is_empty());
                }
                // Nothing of the request comes back.
                let text = String::from_utf8(reply.body.clone()).unwrap();
                for input in [m.as_str(), p.as_str()] {
                    if input.len() >= 6 {
                        prop_assert!(!text.contains(input), "{input:?} echoed in {text}");
                    }
                }
            }
        }
    }

    /// Health answers: documented codes, a 304 only where the answer is 200.
    #[test]
    fn checks_answer_per_state(s in prop::sample::select(State::ALL.to_vec()), inm in prop::option::of("\\PC{0,30}"),
                               soft in any::<bool>()) {
        let mut cfg = health(br#"{"role":"health"}"#);
        if soft {
            cfg.draining_lb_status = 404;
        }
        for audience in [Audience::Lb, Audience::Readiness, Audience::Liveness] {
            let check = |if_none_match| answer(&Inputs { audience, state: Some(s), traffic_seen: true,
                                                         placeholders: Action::None,
                                                         draining_lb_status: cfg.draining_lb_status, if_none_match }).reply;
            let plain = check(None);
            let r = check(inm.as_deref());
            prop_assert!([200, 304, 404, 500, 503].contains(&r.status));
            prop_assert_eq!(header(&r, "cache-control"), Some("max-age=1"));
            prop_assert_eq!(header(&r, "etag").map(str::to_string), Some(format!("\"{}-{}\"", s.name().to_ascii_lowercase(), plain.status)));
            if r.status == 304 {
                prop_assert_eq!(plain.status, 200);
                prop_assert!(r.body.is_empty());
            } else {
                prop_assert_eq!(&r, &plain);
            }
        }
    }
}

/// Every byte as `%HH`, upper or lower case hex.
fn percent_encode(s: &str, upper: bool) -> String {
    s.bytes()
        .map(|b| {
            if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

fn local() -> Request<'static> {
    Request {
        method: "POST",
        path: "/drain",
        source: Some("127.0.0.1".parse().unwrap()),
        ..Request::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, .. ProptestConfig::default() })]

    /// Percent-encoding any part of a query changes nothing: the same
    /// endpoint, or the same refusal.
    #[test]
    fn percent_encoding_routes_the_same(parts in prop::collection::vec(query_part(), 0..4),
                                        which in prop::collection::vec(any::<bool>(), 8), upper in any::<bool>(),
                                        path in prop::sample::select(paths())) {
        let cfg = health(br#"{"role":"health"}"#);
        // The endpoint's first method (GET for the unknown path).
        let method = api::route_of(path).map_or("GET", |r| r.allow.split(", ").next().unwrap());
        // Only parts free of `%`, `&` and `=` are encoded: those three are syntax.
        let encoded: Vec<String> = parts.iter().zip(which.iter().cycle()).map(|(part, &enc)| {
            match part.split_once('=') {
                Some((k, v)) if enc && !k.contains('%') && !v.contains(['%', '&', '=']) =>
                    format!("{}={}", percent_encode(k, upper), percent_encode(v, upper)),
                _ => part.clone(),
            }
        }).collect();
        let plain = format!("{path}?{}", parts.join("&"));
        let coded = format!("{path}?{}", encoded.join("&"));
        let a = api::route(&Request { method, path: &plain, ..local() }, &cfg);
        let b = api::route(&Request { method, path: &coded, ..local() }, &cfg);
        prop_assert_eq!(a, b, "{} vs {}", plain, coded);
    }

    /// A parameter given twice is refused with a 400 that names it, whatever
    /// the values and wherever the repeat stands.
    #[test]
    fn a_repeated_parameter_is_refused_by_name(name in prop::sample::select(vec!["wait", "timeout"]),
                                               first in prop::sample::select(vec!["closed", "1s", "90s", "x"]),
                                               second in prop::sample::select(vec!["closed", "3s", "", "%31s"]),
                                               middle in prop::option::of(prop::sample::select(vec!["wait=closed", "timeout=2s"]))) {
        let cfg = health(br#"{"role":"health"}"#);
        let mut parts = vec![format!("{name}={first}")];
        if let Some(m) = middle.filter(|m| !m.starts_with(name)) {
            parts.push(m.to_string());
        }
        parts.push(format!("{name}={second}"));
        let path = format!("/drain?{}", parts.join("&"));
        let r = api::route(&Request { path: &path, ..local() }, &cfg);
        let Err(r) = r else { return Err(TestCaseError::fail(format!("{path} routed"))) };
        prop_assert_eq!(r.status, 400);
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        let message = body["message"].as_str().unwrap();
        // The first value may already be refused on its own; otherwise the repeat is.
        let first_ok = (name == "wait" && first == "closed") || (name == "timeout" && first.ends_with('s'));
        if first_ok {
            prop_assert_eq!(message, format!("{name}: given more than once; give each query parameter once"));
        }
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(vec![
            "traffic",
            "health",
            "0s",
            "1ms",
            "10ms",
            "30s",
            "2m",
            "1h",
            "61m",
            "12x",
            "-1s",
            "",
            "lb_buffer",
            "lb_observed_down",
            "127.0.0.0/8",
            "::1/128",
            "10.0.0.0/40",
            TOKEN,
            "short",
        ])
        .prop_map(Value::from),
        "[0-9]{0,14}(ms|s|m|h|)".prop_map(Value::from),
        "\\PC{0,20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{0,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn config_object() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        4 => prop::sample::select(KEYS.to_vec()).prop_map(str::to_string),
        1 => "\\PC{0,12}",
    ];
    (
        prop::option::of(prop::sample::select(vec!["traffic", "health", "both"])),
        prop::collection::btree_map(key, json_value(), 0..6),
    )
        .prop_map(|(role, extra)| {
            let mut obj: serde_json::Map<String, Value> = extra.into_iter().collect();
            if let Some(r) = role {
                obj.insert("role".to_string(), Value::from(r));
            }
            Value::Object(obj)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, .. ProptestConfig::default() })]

    /// `Config::parse` never panics, and every refusal names a key: one of
    /// KEYS, an unknown key the input really has, or "(configuration)".
    #[test]
    fn config_errors_name_a_key(v in config_object()) {
        let bytes = v.to_string();
        match Config::parse(bytes.as_bytes()) {
            Ok(c) => {
                let obj = v.as_object().unwrap();
                prop_assert!(obj.keys().all(|k| KEYS.contains(&k.as_str())));
                prop_assert_eq!(matches!(c, Config::Health(_)), obj["role"] == "health");
                // Every key is checked whatever the role: as the health role reads them.
                let mut as_health = obj.clone();
                as_health.insert("role".to_string(), Value::from("health"));
                let Ok(Config::Health(c)) = Config::from_object(&as_health) else {
                    panic!("{v} is valid for a traffic role but not for the health role");
                };
                prop_assert!(c.min_drain_ms <= c.drain_timeout_ms);
                prop_assert!((10..=10_000).contains(&c.shared.tick_ms));
                prop_assert!(c.draining_lb_status == 200 || c.draining_lb_status == 404);
                prop_assert!((1..=10).contains(&c.lb_fall));
            }
            Err(e) => {
                let obj = v.as_object().unwrap();
                prop_assert!(KEYS.contains(&e.key.as_str()) || obj.contains_key(&e.key), "{e}");
                prop_assert!(!e.problem.is_empty());
                let prefix = format!("invalid configuration: {}: ", e.key);
                prop_assert!(e.to_string().starts_with(&prefix), "{}", e);
            }
        }
    }

    #[test]
    fn config_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Err(e) = Config::parse(&bytes) {
            prop_assert!(e.key == "(configuration)" || e.key == "role" || KEYS.contains(&e.key.as_str())
                || std::str::from_utf8(&bytes).is_ok_and(|s| s.contains(&e.key)), "{e}");
        }
    }
}

fn state() -> impl Strategy<Value = State> {
    prop::sample::select(State::ALL.to_vec())
}

fn reason() -> impl Strategy<Value = Reason> {
    prop::sample::select(vec![
        Reason::DrainRequested,
        Reason::ActiveZero,
        Reason::DrainTimeout,
        Reason::CloseLbRequested,
        Reason::LbBufferElapsed,
        Reason::LbObservedDown,
        Reason::LbDownTimeout,
        Reason::CloseRequested,
        Reason::ReopenRequested,
        Reason::FaultRequested,
    ])
}

fn plan() -> impl Strategy<Value = DrainPlan> {
    (
        0u64..5_000,
        1u64..20_000,
        0u64..5_000,
        any::<bool>(),
        1u64..20_000,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(min, timeout, buffer, observed, down, hold, gate, needs)| DrainPlan {
                min_drain_ms: min.min(timeout),
                drain_timeout_ms: timeout,
                lb_buffer_ms: buffer,
                close_after: if observed {
                    CloseAfter::LbObservedDown
                } else {
                    CloseAfter::LbBuffer
                },
                lb_down_timeout_ms: down,
                lb_gate: gate,
                lb_gate_needs_checker: needs,
                hold_closing: hold,
            },
        )
}

#[derive(Clone, Debug)]
enum Op {
    /// A requested move.
    Ask(Move, u64, u64),
    /// Whatever `due` says, applied.
    Due(u64, u64, Option<u64>),
    /// A worker holding a preStop answer renews its lease.
    Hold(u64, u64),
    /// A preStop joins a maintenance drain.
    Resume,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            state(),
            state(),
            reason(),
            prop::option::of(plan()),
            0u64..30_000,
            0u64..3,
            any::<bool>()
        )
            .prop_map(|(from, to, reason, plan, dt, active, force)| Op::Ask(
                Move {
                    expected_from: from,
                    to,
                    reason,
                    plan,
                    force
                },
                dt,
                active
            )),
        (0u64..30_000, 0u64..3, prop::option::of(0u64..30_000))
            .prop_map(|(dt, a, down)| Op::Due(dt, a, down)),
        (0u64..30_000, 1u64..10_000).prop_map(|(dt, lease)| Op::Hold(dt, lease)),
        Just(Op::Resume),
    ]
}

fn check_record(r: &Record) -> Result<(), TestCaseError> {
    prop_assert!(r.history.len() <= HISTORY);
    for pair in r.history.windows(2) {
        prop_assert_eq!(pair[0].to, pair[1].from, "history is not one chain");
        prop_assert!(pair[0].at_ms <= pair[1].at_ms);
    }
    for s in &r.history {
        prop_assert!(fsm::legal(s.from, s.to), "{s:?}");
    }
    if let Some(last) = r.history.last() {
        prop_assert_eq!(last.to, r.state);
        prop_assert_eq!(last.reason, r.reason);
    }
    match r.state {
        State::Draining | State::Closing | State::Closed => {
            prop_assert!(r.plan.is_some() && r.drain_started_ms.is_some())
        }
        State::Open => prop_assert!(r.plan.is_none() && !r.forced && r.hold.is_none()),
        State::Fault => {}
    }
    if r.state == State::Closing || r.state == State::Closed {
        prop_assert!(r.closing_ms.is_some() && r.active_at_closing.is_some());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, .. ProptestConfig::default() })]

    /// `advance` takes only legal moves from the expected state (DRAINING needs
    /// a plan); a refusal carries the current state and changes nothing; `due`
    /// proposes only moves `advance` accepts; the history stays one bounded chain.
    #[test]
    fn fsm_keeps_its_invariants(ops in prop::collection::vec(op(), 1..80)) {
        let mut now = 1_000_000u64;
        let mut rec = Record::new(now);
        for op in ops {
            match op {
                Op::Ask(mv, dt, active) => {
                    now += dt;
                    let before = rec.clone();
                    match fsm::advance(&rec, mv, wall_clock(now), active) {
                        Ok(next) => {
                            prop_assert!(fsm::legal(before.state, mv.to));
                            prop_assert_eq!(mv.expected_from, before.state);
                            prop_assert!(mv.to != State::Draining || mv.plan.is_some());
                            prop_assert_eq!(next.state, mv.to);
                            prop_assert_eq!(next.since_ms, now);
                            let last = next.history.last().unwrap();
                            prop_assert_eq!((last.from, last.to, last.reason, last.active), (before.state, mv.to, mv.reason, active));
                            rec = next;
                        }
                        Err(e) => {
                            prop_assert_eq!(e.state, before.state);
                            prop_assert_eq!(e.requested, mv.to);
                            let held = mv.to == State::Open && before.active_hold(wall_clock(now)).is_some() && !mv.force;
                            prop_assert_eq!(e.hold_until_ms.is_some(), held && fsm::legal(before.state, mv.to)
                                && mv.expected_from == before.state);
                            prop_assert!(!fsm::legal(before.state, mv.to) || mv.expected_from != before.state
                                || (mv.to == State::Draining && mv.plan.is_none()) || held);
                        }
                    }
                }
                Op::Due(dt, active, down) => {
                    now += dt;
                    let down = down.map(|d| now.saturating_sub(d));
                    if let Some(mv) = fsm::due(&rec, wall_clock(now), active, down) {
                        prop_assert_eq!(mv.expected_from, rec.state);
                        prop_assert!(matches!(rec.state, State::Draining | State::Closing));
                        if mv.reason == Reason::ActiveZero {
                            prop_assert_eq!(active, 0);
                        }
                        prop_assert!(mv.to != State::Closed || !rec.holds_closing(),
                            "a maintenance drain closed by itself");
                        let next = fsm::advance(&rec, mv, wall_clock(now), active);
                        prop_assert!(next.is_ok(), "due proposed a move advance refuses: {mv:?}");
                        rec = next.unwrap();
                    }
                }
                Op::Hold(dt, lease) => {
                    now += dt;
                    if let Some(next) = fsm::renew_hold(&rec, wall_clock(now), lease) {
                        prop_assert!(matches!(rec.state, State::Draining | State::Closing));
                        prop_assert!(next.active_hold(wall_clock(now)).is_some() && next.state == rec.state && next.seq == rec.seq);
                        rec = next;
                    }
                }
                Op::Resume => {
                    if let Some(next) = fsm::resume(&rec) {
                        prop_assert!(rec.holds_closing() && !next.holds_closing());
                        prop_assert_eq!((next.state, next.closing_ms), (rec.state, rec.closing_ms));
                        rec = next;
                    }
                }
            }
            check_record(&rec)?;
            let round: Record = drain_gate::json::from_slice(&serde_json::to_vec(&rec).unwrap()).unwrap();
            prop_assert_eq!(&round, &rec);
        }
    }

    /// Status and conflict bodies of any reachable record are JSON objects
    /// with the documented top-level fields.
    #[test]
    fn status_bodies_are_json(ops in prop::collection::vec(op(), 0..20), active in 0u64..1_000_000) {
        let mut rec = Record::new(1_764_000_000_000);
        let mut now = rec.since_ms;
        for op in ops {
            if let Op::Ask(mv, dt, a) = op {
                now += dt;
                if let Ok(next) = fsm::advance(&rec, mv, wall_clock(now), a) {
                    rec = next;
                }
            }
        }
        let checkers = Checkers::default();
        let mut registry = drain_gate::gate::liveness::Registry::default();
        registry.announce(100, now);
        let view = api::View {
            rec: &rec,
            now: wall_clock(now),
            steps: Steps::default(),
            in_flight: InFlight::default(),
            count: drain_gate::gate::count::CountReading { active, streams: active, connections: 0, reliable: true, why: None },
            count_source: "gauge",
            registry: &registry,
            watch: Default::default(),
            placeholders: &Default::default(),
            config: &Health::default(),
            checkers: &checkers,
            ignored_checks: 0,
            rotation: None,
            metric_definitions: 0,
            shared_keys: 0,
            receipt: drain_gate::instruments::receipt::Tally::default(),
            durations: drain_gate::instruments::sizing::Durations::default(),
        };
        let body: Value = serde_json::from_slice(&api::status(&view, None).body).unwrap();
        for field in ["state", "ready", "live", "lb_status", "active", "count", "waiting_for", "traffic", "in_flight", "progress", "lb", "clock", "connection_rotation"] {
            prop_assert!(body.get(field).is_some(), "{field} missing: {body}");
        }
        prop_assert_eq!(body["state"].as_str(), Some(rec.state.name()));
    }
}

// -- in-flight ages ---------------------------------------------------------

/// Streams start at nondecreasing ticks and end in any order; the tick compacts
/// (800 operations pass `MAX_BUCKETS` distinct start ticks).
#[derive(Clone, Debug)]
enum AgeOp {
    Start(u64),
    End(usize),
    Compact,
}

fn age_op() -> impl Strategy<Value = AgeOp> {
    prop_oneof![
        6 => (0u64..500).prop_map(AgeOp::Start),
        2 => any::<usize>().prop_map(AgeOp::End),
        1 => Just(AgeOp::Compact),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The ages count every stream in flight exactly, the oldest age never
    /// reads younger than the truth, and every stream's end empties them.
    #[test]
    fn ages_count_exactly_and_never_read_young(ops in prop::collection::vec(age_op(), 0..800)) {
        let mut ages = Ages::default();
        let mut live: Vec<u64> = Vec::new();
        let mut tick = 0u64;
        for op in ops {
            match op {
                AgeOp::Start(dt) => {
                    tick += dt;
                    ages.enter(tick, 1);
                    live.push(tick);
                }
                AgeOp::End(i) if !live.is_empty() => {
                    let started = live.swap_remove(i % live.len());
                    ages.exit(started);
                }
                AgeOp::End(_) => {}
                AgeOp::Compact => ages.compact(),
            }
            let p = ages.publish(tick, 100);
            prop_assert_eq!(ages.in_flight(), live.len() as u64);
            let h = p.ages;
            prop_assert_eq!(h.lt_1s + h.lt_10s + h.lt_60s + h.ge_60s, live.len() as u64);
            prop_assert!(p.oldest_started_ms <= live.iter().min().copied());
        }
        for started in live.drain(..) {
            ages.exit(started);
        }
        prop_assert_eq!(ages.publish(tick, 100).oldest_started_ms, None);
    }
}

/// Two workers' streams: start, end, a worker's tick (its summary published),
/// time passing; the count leads the truth by `lead` (a lease; 0 in a drain).
#[derive(Clone, Debug)]
enum ListOp {
    Start(usize),
    End(usize),
    Tick(usize),
    Pass(u64),
}

fn list_op() -> impl Strategy<Value = ListOp> {
    prop_oneof![
        3 => (0usize..2).prop_map(ListOp::Start),
        3 => any::<usize>().prop_map(ListOp::End),
        2 => (0usize..2).prop_map(ListOp::Tick),
        2 => (1u64..400).prop_map(ListOp::Pass),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Set beside a count read after the summaries, the list never shows
    /// more streams than the count without saying it is older, shows none
    /// when the count reads 0, and says it is older only when a stream it
    /// lists has ended.
    #[test]
    fn the_list_beside_the_count_never_outnumbers_it_unsaid(
        ops in prop::collection::vec(list_op(), 0..200),
        lead in prop_oneof![3 => Just(0u64), 1 => 0u64..8],
    ) {
        let mut now = 10_000u64;
        let mut ages = [Ages::default(), Ages::default()];
        let mut tick = [now, now];
        // Streams in flight: (id, worker, start tick); what each worker's summary listed.
        let mut live: Vec<(u64, usize, u64)> = Vec::new();
        let mut summary: [Option<(drain_gate::instruments::in_flight::Published, Vec<u64>)>; 2] = [None, None];
        let mut next = 0u64;
        for op in ops {
            match op {
                ListOp::Start(w) => {
                    ages[w].enter(tick[w], 1);
                    live.push((next, w, tick[w]));
                    next += 1;
                }
                ListOp::End(i) if !live.is_empty() => {
                    let (_, w, started) = live.swap_remove(i % live.len());
                    ages[w].exit(started);
                }
                ListOp::End(_) => {}
                ListOp::Tick(w) => {
                    tick[w] = now;
                    let ids = live.iter().filter(|s| s.1 == w).map(|s| s.0).collect();
                    summary[w] = Some((ages[w].publish(now, 100), ids));
                }
                ListOp::Pass(dt) => now += dt,
            }
            let published: Vec<_> = summary.iter().flatten().map(|(p, _)| *p).collect();
            let count = live.len() as u64 + lead;
            let merged = drain_gate::instruments::in_flight::merge(&published, now);
            let f = merged.beside_count(count, true, now);
            if count == 0 {
                prop_assert_eq!(f.listed(), 0);
                prop_assert_eq!(f.oldest_age_ms, None);
                prop_assert_eq!(f.as_of_ms, Some(now));
            } else {
                prop_assert!(f.older_than_count || f.listed() <= count, "{f:?} beside {count}");
            }
            if f.older_than_count {
                let still: u64 = summary.iter().flatten()
                    .filter(|(p, _)| now.saturating_sub(p.at_ms) <= 1_000)
                    .map(|(_, ids)| ids.iter().filter(|id| live.iter().any(|s| s.0 == **id)).count() as u64)
                    .sum();
                prop_assert!(still < merged.listed(), "older, yet every listed stream is in flight");
            }
            prop_assert_eq!(f.ticked_ms, published.iter().map(|p| p.at_ms).min());
        }
    }
}

/// One tick: the monotonic clock advances by `dt` (a tick, on time or late),
/// the wall clock by the same plus `step` (mostly 0; else up to a day either way).
#[derive(Clone, Copy, Debug)]
struct Tick {
    dt: u64,
    step: i64,
    active: u64,
}

fn tick() -> impl Strategy<Value = Tick> {
    (
        1u64..2_000,
        prop_oneof![3 => Just(0i64), 1 => -86_400_000i64..86_400_000],
        0u64..2,
    )
        .prop_map(|(dt, step, active)| Tick { dt, step, active })
}

fn wall_after(wall: u64, t: Tick) -> u64 {
    wall.saturating_add_signed(i64::try_from(t.dt).unwrap() + t.step)
}

/// What is due by the monotonic clock alone: the model the timers must follow.
fn due_by_monotonic(rec: &Record, plan: &DrainPlan, mono: u64, active: u64) -> Option<Reason> {
    let since_drain = mono - rec.drain_started_mono_ms.unwrap();
    match rec.state {
        State::Draining if active == 0 && since_drain >= plan.min_drain_ms => {
            Some(Reason::ActiveZero)
        }
        State::Draining if since_drain >= plan.drain_timeout_ms => Some(Reason::DrainTimeout),
        State::Closing if plan.hold_closing => None,
        State::Closing => {
            let since_closing = mono - rec.closing_mono_ms.unwrap();
            match plan.close_after {
                CloseAfter::LbBuffer => {
                    (since_closing >= plan.lb_buffer_ms).then_some(Reason::LbBufferElapsed)
                }
                CloseAfter::LbObservedDown => {
                    (since_closing >= plan.lb_down_timeout_ms).then_some(Reason::LbDownTimeout)
                }
            }
        }
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, .. ProptestConfig::default() })]

    /// With the wall clock stepped forward and back at random between ticks,
    /// a timed transition (min_drain, drain_timeout, lb_buffer,
    /// lb_down_timeout) fires at a tick exactly when its time has passed on
    /// the monotonic clock: never before, and never later than the first tick
    /// after it (so no step, backward included, delays it at all).
    #[test]
    fn timers_ignore_wall_clock_steps(
        plan in plan(),
        ticks in prop::collection::vec(tick(), 1..200),
        mut wall in 0u64..1 << 42,
        mut mono in 0u64..1 << 40,
    ) {
        let start = Move { expected_from: State::Open, to: State::Draining, reason: Reason::DrainRequested, plan: Some(plan), force: false };
        let mut rec = fsm::advance(&Record::new(wall), start, Now { wall_ms: wall, mono_ms: Some(mono) }, 1).unwrap();
        for t in ticks {
            mono += t.dt;
            wall = wall_after(wall, t);
            let now = Now { wall_ms: wall, mono_ms: Some(mono) };
            let want = due_by_monotonic(&rec, &plan, mono, t.active);
            let got = fsm::due(&rec, now, t.active, None);
            prop_assert_eq!(got.map(|m| m.reason), want, "state {:?} at {:?}", rec.state, now);
            if let Some(mv) = got {
                rec = fsm::advance(&rec, mv, now, t.active).unwrap();
                prop_assert_eq!(rec.since_ms, wall, "the record still dates on the wall clock");
            }
        }
    }

    /// The LB view and the soft-drain gate run on the monotonic clock too: a
    /// drain whose checker is answered at every tick (what the state answers
    /// it) takes exactly the same transitions, at the same ticks, whether or
    /// not the wall clock steps in between — `lb_observed_down`'s close, the
    /// gate's flip, the timeouts.
    #[test]
    fn lb_view_and_gate_ignore_wall_clock_steps(
        plan in plan(),
        ticks in prop::collection::vec((tick(), any::<bool>()), 1..150),
        wall in 1u64 << 41..1 << 42,
        mono in 0u64..1 << 40,
    ) {
        let start = Move { expected_from: State::Open, to: State::Draining, reason: Reason::DrainRequested, plan: Some(plan), force: false };
        let begin = |wall_ms| Now { wall_ms, mono_ms: Some(mono) };
        let mut stepped = fsm::advance(&Record::new(wall), start, begin(wall), 1).unwrap();
        let mut steady = stepped.clone();
        let (mut c_stepped, mut c_steady) = (Checkers::default(), Checkers::default());
        let (mut wall_s, mut wall_0, mut m) = (wall, wall, mono);
        for (t, checks) in ticks {
            m += t.dt;
            wall_s = wall_after(wall_s, t);
            wall_0 += t.dt;
            let mut got = Vec::new();
            for (rec, checkers, wall_ms) in [(&mut stepped, &mut c_stepped, wall_s), (&mut steady, &mut c_steady, wall_0)] {
                let now = Now { wall_ms, mono_ms: Some(m) };
                if checks {
                    checkers.observe("10.0.0.1", answer::verdict(rec.state, true, Action::None, 404).lb_status, m, 2);
                }
                let lb_down = checkers.down_since(m, 2);
                let since = rec.drain_started_timer_ms().unwrap();
                let gate = checkers.gate(since, m, plan.lb_gate_needs_checker).passes();
                let due = fsm::due_gated(rec, now, t.active, lb_down, gate);
                if let Some(mv) = due {
                    *rec = fsm::advance(rec, mv, now, t.active).unwrap();
                }
                got.push(due.map(|mv| mv.reason));
            }
            prop_assert_eq!(got[0], got[1], "a wall-clock step of {} ms changed a decision", t.step);
            prop_assert_eq!(stepped.state, steady.state);
        }
    }

    /// A wall-clock step of 5/4 of the threshold or more is counted at the
    /// tick it happens; changes below 3/4 of it never are; the recorded
    /// offset never lags the real one by more than a quarter of the threshold.
    #[test]
    fn clock_steps_are_counted_once(
        ticks in prop::collection::vec(tick(), 1..200),
        tick_ms in 10u64..10_000,
        mut wall in 1u64 << 41..1 << 42,
        mut mono in 0u64..1 << 40,
    ) {
        let threshold = clock::step_threshold_ms(tick_ms);
        // The first look (the process starting) only records the offset.
        let first = Now { wall_ms: wall, mono_ms: Some(mono) };
        let Look::Crept(mut steps) = Steps::default().look(first, threshold) else {
            panic!("the first look must record the offset");
        };
        prop_assert_eq!(steps.count, 0);
        for t in ticks {
            mono += t.dt;
            wall = wall_after(wall, t);
            let now = Now { wall_ms: wall, mono_ms: Some(mono) };
            let before = steps.count;
            match steps.look(now, threshold) {
                Look::Same => {}
                Look::Crept(next) => steps = next,
                Look::Stepped(next, by) => {
                    prop_assert!(by.unsigned_abs() >= threshold);
                    prop_assert_eq!(next.last_step_ms, Some(by));
                    steps = next;
                }
            }
            let size = t.step.unsigned_abs();
            if size >= threshold + threshold / 4 {
                prop_assert_eq!(steps.count, before + 1, "a step of {} ms was missed", t.step);
            }
            if size < threshold - threshold / 4 {
                prop_assert_eq!(steps.count, before, "{} ms counted as a step", t.step);
            }
            let lag = now.offset_ms().unwrap() - steps.offset_ms.unwrap();
            prop_assert!(lag.unsigned_abs() <= threshold / 4);
        }
    }
}

// ---- soft-drain gate and traffic-role liveness ----------------------------

use drain_gate::gate::liveness::{self, Registry, Unreliable};

proptest! {
    /// With the gate in the plan, a DRAINING record never flips on active = 0
    /// before the LB saw the drain, yet drain_timeout still closes it; once the
    /// LB saw it, the gate changes nothing.
    #[test]
    fn gate_holds_only_the_zero(p in plan(), started in 0u64..10_000, dt in 0u64..30_000, active in 0u64..3) {
        let mut rec = Record::new(0);
        rec.state = State::Draining;
        rec.plan = Some(DrainPlan { lb_gate: true, ..p });
        rec.drain_started_ms = Some(started);
        let now = started + dt;
        let now = wall_clock(now);
        prop_assert_eq!(fsm::due_gated(&rec, now, active, None, true), fsm::due(&rec, now, active, None));
        match fsm::due_gated(&rec, now, active, None, false) {
            Some(mv) => {
                prop_assert_eq!(mv.reason, Reason::DrainTimeout);
                prop_assert!(now.wall_ms >= started + p.drain_timeout_ms);
            }
            None => prop_assert!(now.wall_ms < started + p.drain_timeout_ms),
        }
    }

    /// The checkers' view: the drain is seen (`Gate::Open`, the status'
    /// `saw_drain`) exactly "at least one live checker, and every one was
    /// served a 404 at or after the drain start", and the gate holds
    /// exactly until then — or, with no live checker, holds only when
    /// `lb_checkers` names the LB.
    #[test]
    fn saw_drain_matches_its_definition(answers in prop::collection::vec((0u8..6, prop::sample::select(vec![200u16, 404, 503]), 0u64..50_000), 0..40),
                                       since in 0u64..50_000) {
        let mut c = Checkers::default();
        let mut now = 0;
        for (who, status, dt) in answers {
            now += dt / 10;
            c.observe(&format!("10.0.0.{who}"), status, now, 2);
        }
        let live: Vec<_> = c.list.iter().filter(|x| now - x.last_seen_ms <= drain_gate::gate::lb::CHECKER_TTL_MS).collect();
        let all_404 = live.iter().all(|x| x.last_404_ms.is_some_and(|t| t >= since));
        prop_assert_eq!(c.gate(since, now, false) == Gate::Open, !live.is_empty() && all_404, "never saw what nobody asked");
        for need in [false, true] {
            let expect = match (live.is_empty(), all_404, need) {
                (true, _, false) => Gate::NoLb,
                (true, _, true) => Gate::NoChecker,
                (false, true, _) => Gate::Open,
                (false, false, _) => Gate::Waiting,
            };
            prop_assert_eq!(c.gate(since, now, need), expect);
        }
    }
}

#[derive(Clone, Debug)]
enum Life {
    Announce(u64),
    Beat(usize),
    Goodbye(usize),
    Die(usize),
    HealthTick(u64),
}

fn life() -> impl Strategy<Value = Life> {
    prop_oneof![
        prop::sample::select(vec![10u64, 100, 1_000]).prop_map(Life::Announce),
        (0usize..8).prop_map(Life::Beat),
        (0usize..8).prop_map(Life::Goodbye),
        (0usize..8).prop_map(Life::Die),
        (0u64..3_000).prop_map(Life::HealthTick),
    ]
}

proptest! {
    /// Roots that beat every tick and leave with a goodbye are never lost and
    /// never make the count unreliable; a root that dies is lost within its
    /// stale threshold plus one health tick, and only then; a root that was
    /// only late (it beats again) is registered again, and once none is lost
    /// the verdict is clear again.
    #[test]
    fn liveness_loses_exactly_the_dead(ops in prop::collection::vec(life(), 1..80)) {
        let mut reg = Registry::default();
        let mut now = 0u64;
        // (id, tick_ms, last beat, alive)
        let mut roots: Vec<(u64, u64, u64, bool)> = Vec::new();
        let mut died: Vec<(u64, u64, u64)> = Vec::new(); // (id, last beat, tick)
        for op in ops {
            match op {
                Life::Announce(tick) => {
                    let id = reg.announce(tick, now).unwrap();
                    prop_assert!(!roots.iter().any(|r| r.0 == id), "id {id} given twice");
                    roots.push((id, tick, now, true));
                }
                Life::Beat(i) => if let Some(r) = roots.get_mut(i) { if r.3 { r.2 = now; } },
                Life::Goodbye(i) => if i < roots.len() && roots[i].3 {
                    let r = roots.remove(i);
                    reg.goodbye(r.0, now);
                },
                Life::Die(i) => if i < roots.len() && roots[i].3 {
                    roots[i].3 = false;
                    died.push((roots[i].0, roots[i].2, roots[i].1));
                },
                Life::HealthTick(dt) => {
                    // A live root beats on its every tick: advance in its steps.
                    now += dt;
                    for r in roots.iter_mut().filter(|r| r.3) {
                        r.2 = now - (now - r.2) % r.1.max(1);
                    }
                    let beats: Vec<(u64, u64)> = roots.iter().map(|r| (r.0, r.2)).collect();
                    let beat = |id| beats.iter().find(|b| b.0 == id).map(|b| b.1);
                    let back = reg.revive(beat);
                    for b in &back {
                        prop_assert!(!died.iter().any(|x| x.0 == b.id), "a dead root came back: {b:?}");
                    }
                    let dead = reg.stale(now, 0, beat);
                    for d in &dead {
                        prop_assert!(died.iter().any(|x| x.0 == d.id), "a live root was declared lost: {d:?}");
                    }
                    reg.mark_lost(&dead);
                    for (id, last, tick) in &died {
                        if now - last > liveness::stale_after_ms(*tick) {
                            prop_assert!(!reg.roots.iter().any(|r| r.id == *id), "dead root {id} still registered");
                        }
                    }
                }
            }
        }
        let v = reg.verdict(now);
        prop_assert_eq!(v.waiting, !reg.seen);
        if !reg.lost.is_empty() {
            prop_assert_eq!(v.unreliable, Some(Unreliable::TrafficRoleLost));
            for l in &reg.lost {
                prop_assert!(died.iter().any(|x| x.0 == l.id), "only the dead stay lost");
            }
        } else if v.unreliable.is_some() {
            prop_assert_eq!(v.unreliable, Some(Unreliable::TrafficRoleGone));
            prop_assert!(reg.roots.is_empty());
        }
    }
}

// ---- stream durations and the advice ---------------------------------------

use drain_gate::instruments::sizing::{self, Durations, Kind, Pending, BOUNDS_MS};

/// The exact `per_mille` quantile of `samples`: the sample of rank ⌈q × n⌉.
fn exact_quantile(samples: &[u64], per_mille: u64) -> u64 {
    let mut s = samples.to_vec();
    s.sort_unstable();
    let n = s.len() as u64;
    s[((n * per_mille).div_ceil(1_000).clamp(1, n) - 1) as usize]
}

proptest! {
    /// Durations recorded as the traffic role does (a worker's `Pending`,
    /// taken at its ticks and added into the process's shared total): the
    /// count, sum and max are the durations', each lands in a bucket at or
    /// above itself and at most one tick above, no quantile reads below the
    /// exact one, and the advice is built on at least the longest, which its
    /// `drain_timeout` covers unless capped at 60 min (and then says so).
    #[test]
    fn recording_never_lowers_a_duration_and_the_advice_covers_the_longest(
        ends in prop::collection::vec(
            (prop::sample::select(Kind::ALL.to_vec()),
             prop_oneof![0u64..2_000, 0u64..20_000, 0u64..10_000_000, Just(u64::MAX)]),
            0..300),
        crowd in (0u64..2_000, 0usize..3_000),
        tick_ms in prop_oneof![Just(100u64), 10u64..10_000],
        ticks in 1usize..5,
        closing_ms in 0u64..600_000,
    ) {
        // A crowd of equal short streams: from 1,000 on, a p99.9 falls below the longest.
        let ends: Vec<(Kind, u64)> = std::iter::repeat_n((Kind::Http, crowd.0), crowd.1).chain(ends).collect();
        let mut pending = Pending::new(tick_ms);
        let mut total = vec![0u8; sizing::BYTES];
        for chunk in ends.chunks(ends.len().div_ceil(ticks).max(1)) {
            for (kind, ms) in chunk {
                pending.record(*kind, *ms);
            }
            prop_assert!(pending.take().add_into(&mut total));
        }
        let d = Durations::from_bytes(&total).unwrap();
        for (kind, h) in Kind::ALL.into_iter().zip(&d.0) {
            let ms: Vec<u64> = ends.iter().filter(|(k, _)| *k == kind).map(|(_, ms)| *ms).collect();
            prop_assert_eq!(h.count, ms.len() as u64);
            prop_assert_eq!(h.max_ms, ms.iter().copied().max().unwrap_or(0));
            prop_assert_eq!(h.sum_ms, ms.iter().fold(0u64, |a, b| a.saturating_add(*b)));
            let mut below = 0u64;
            for (bound, n) in BOUNDS_MS.iter().zip(h.buckets.iter()) {
                below += n;
                let at_most = |b: u64| ms.iter().filter(|m| **m <= b).count() as u64;
                prop_assert!(below <= at_most(*bound), "{kind:?}: {below} at or below {bound} ms, fewer were");
                prop_assert!(below >= at_most(bound.saturating_sub(tick_ms)), "{kind:?}: more than a tick high at {bound} ms");
            }
            if !ms.is_empty() {
                for per_mille in [1, 500, 990, 999, 1_000] {
                    let q = h.quantile(per_mille).unwrap();
                    prop_assert!(q >= exact_quantile(&ms, per_mille), "{kind:?} {per_mille}‰ {q}");
                }
            }
        }
        let a = sizing::advise(&d, closing_ms, 0);
        let [http, ..] = &d.0;
        if http.count < sizing::MIN_SAMPLES {
            prop_assert_eq!((a.drain_timeout_s, a.based_on_ms), (None, None));
            return Ok(());
        }
        let based_on = a.based_on_ms.unwrap();
        let timeout_s = a.drain_timeout_s.unwrap();
        prop_assert!(based_on >= http.max_ms, "{} below the longest {}", based_on, http.max_ms);
        let want = based_on.div_ceil(1_000).saturating_add(30).clamp(120, 3_600);
        prop_assert_eq!(timeout_s, want);
        if based_on <= 3_570_000 {
            prop_assert!(timeout_s * 1_000 >= http.max_ms + 30_000, "{:?}", a);
            prop_assert!(!a.based_on.contains("cut"), "{}", a.based_on);
        } else {
            let cut = http.above(3_600_000);
            prop_assert!(a.based_on.ends_with(&format!("up to {cut} of them last longer and are cut)")), "{}", a.based_on);
            prop_assert!(cut >= ends.iter().filter(|(k, ms)| *k == Kind::Http && *ms > 3_600_000).count() as u64);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the gaps, the interval is never below the shortest nor above
    /// the longest, and is shown from `MIN_GAPS` gaps on.
    #[test]
    fn the_interval_lies_between_the_shortest_and_the_longest_gap(
        gaps in prop::collection::vec(1u32..120_000, 0..=MAX_GAPS),
    ) {
        let i = lb::Checker { gaps_ms: gaps.clone(), ..Default::default() }.interval();
        prop_assert_eq!(i.gaps, gaps.len());
        prop_assert_eq!(i.ms.is_some(), gaps.len() >= MIN_GAPS);
        prop_assert_eq!(i.min_gap_ms, gaps.iter().min().map(|g| u64::from(*g)));
        prop_assert_eq!(i.max_gap_ms, gaps.iter().max().map(|g| u64::from(*g)));
        if let (Some(ms), Some(lo), Some(hi)) = (i.ms, i.min_gap_ms, i.max_gap_ms) {
            prop_assert!(lo <= ms && ms <= hi, "{} not in [{}, {}]", ms, lo, hi);
        }
    }

    /// An LB checking every `inter` ms, each check up to `jitter` ms late or
    /// early, one of its checks missed (one gap twice as long): once the
    /// checker has `MIN_GAPS` gaps, its interval reads within the jitter of
    /// `inter`, never twice it.
    #[test]
    fn one_missed_check_does_not_move_the_interval(
        inter in 100u64..10_000,
        jitter_pct in 0u64..10,
        offsets in prop::collection::vec(0u64..1_000, 5..30),
        missed in any::<prop::sample::Index>(),
        start in 0u64..1_000_000,
    ) {
        let jitter = inter * jitter_pct / 100;
        // Check k is due at start + k × inter, and comes within ±jitter of it.
        let times: Vec<u64> = offsets
            .iter()
            .enumerate()
            .map(|(k, o)| start + jitter + k as u64 * inter + o % (2 * jitter + 1) - jitter)
            .collect();
        let dropped = 1 + missed.index(times.len() - 2); // neither the first nor the last
        let mut c = Checkers::default();
        for (k, t) in times.iter().enumerate() {
            if k != dropped {
                c.observe("lb", 200, *t, 2);
            }
        }
        let checker = &c.list[0];
        prop_assert!(checker.gaps_ms.len() <= MAX_GAPS);
        let i = checker.interval();
        prop_assert!(i.gaps >= MIN_GAPS);
        let ms = i.ms.unwrap_or(0);
        // Two neighbouring checks each off by up to the jitter.
        prop_assert!(
            inter - 2 * jitter <= ms && ms <= inter + 2 * jitter,
            "inter {} jitter {}: read {} from {:?}", inter, jitter, ms, checker.gaps_ms
        );
        let last = times.last().copied().unwrap_or(0);
        let slowest = |now| c.detection(now, 2, lb::Wait { name: "lb_buffer", ms: 0 }).map(|d| d.interval_ms);
        prop_assert_eq!(slowest(last), Some(ms));
        prop_assert_eq!(slowest(last + CHECKER_TTL_MS + 1), None, "gone: nothing measured");
    }
}
