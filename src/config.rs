//! Plugin configuration: the raw JSON object → a validated `Config`, once, at
//! load: the role, with what it reads. Every refusal names the key and the
//! problem. Pure.
//!
//! [`Shared`] holds the keys both the traffic and the health role read (all
//! the traffic role reads), [`Health`] those and the health role's own. Every
//! key is checked whatever the role (a chart passes every value to every
//! role), in the order of `KEYS`, the one table that writes each key.

use serde_json::{Map, Value};
use std::fmt;
use std::net::IpAddr;

use crate::duration::{self, MAX_MS};
use crate::gate::fsm::{CloseAfter, DrainPlan};
use crate::gate::lb::Wait;
use crate::gate::refusal::{NewRequests, Refusal};
use crate::gate::rotation;
use crate::json::FromJson;
use crate::net::{Cidr, LOOPBACK};

/// A validated configuration: the role, with the keys it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Config {
    /// Counts every HTTP stream of the gateway's traffic listener(s).
    Traffic(Shared),
    /// Counts every connection of the TCP and TLS-passthrough filter chains
    /// (a network filter before `tcp_proxy`).
    TrafficTcp(Shared),
    /// Serves the FSM on the dedicated health listener.
    Health(Health),
    /// Stands in for a traffic filter whose own configuration did not load
    /// (Envoy's ECDS `default_config`, or a refused one): counts nothing, and
    /// keeps the gateway out (`crate::gate::placeholder`). Reads only `tick`.
    Placeholder(Shared),
}

/// The keys both the traffic and the health role read: all the traffic role
/// reads. The health role shows the refusing in its status, and rotates the
/// connections at a drain's start only when it refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared {
    pub tick_ms: u64,
    /// What the traffic role does with a new HTTP request while draining.
    pub draining_new_requests: NewRequests,
    /// How it refuses (`refused_requests`, `draining_grpc_requests`,
    /// `refuse_with`).
    pub refusal: Refusal,
}

/// What the health role reads: the shared keys and its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub shared: Shared,
    pub drain_timeout_ms: u64,
    pub min_drain_ms: u64,
    pub lb_buffer_ms: u64,
    pub draining_lb_status: u16,
    pub admin_allow: Vec<Cidr>,
    /// Bearer tokens that authorize admin calls; empty: token authorization
    /// disabled. More than one lets a token be rotated without a gap.
    pub admin_tokens: Vec<String>,
    pub close_after: CloseAfter,
    /// Consecutive 503s a checker must be served before the LB counts as
    /// having marked this backend DOWN.
    pub lb_fall: u32,
    pub lb_down_timeout_ms: u64,
    /// The Envoy cluster that reaches Envoy's admin API, through which a drain
    /// start rotates the traffic connections (`crate::gate::rotation`); `None`: off.
    pub rotate_connections: Option<String>,
    /// Sources whose `/health_check.html` requests count as LB checkers;
    /// `None`: every source.
    pub lb_checkers: Option<Vec<Cidr>>,
    /// With `draining_lb_status: 404`: the active = 0 flip also waits until
    /// every live checker has been served a 404 since the drain began.
    pub soft_drain_gate: bool,
    /// The Envoy cluster that reaches pilot-agent's status port: while a
    /// preStop answer is held, its readiness turning 503 is the pod's SIGTERM
    /// (`host::termination`); `None`: not watched.
    pub termination_watch: Option<String>,
    /// A held preStop answer comes this long after CLOSED: one scrape of the
    /// pod sees CLOSED and the drain's counters before it exits.
    pub scrape_interval_ms: u64,
}

/// A refused configuration: which key, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub key: String,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration: {}: {}", self.key, self.problem)
    }
}

/// Shortest accepted admin token: long enough not to be guessed.
pub const MIN_TOKEN_LEN: usize = 16;
/// Most admin tokens accepted at once (the current one and the next, with room).
pub const MAX_TOKENS: usize = 4;
/// Longest `tick` accepted.
const MAX_TICK_MS: u64 = 10_000;
/// Longest `scrape_interval` accepted.
const MAX_SCRAPE_INTERVAL_MS: u64 = 60_000;
/// Longest accepted cluster name.
const MAX_CLUSTER_LEN: usize = 256;
/// istio-proxy's cluster to pilot-agent's status port (`termination_watch: true`).
pub const AGENT_CLUSTER: &str = "agent";
/// The longest a held `wait=closed` or `/prestop` can last, under any
/// configuration: `drain_timeout` + `lb_down_timeout` (each at most 60m) +
/// `scrape_interval` (at most 60s) + 5s. The health listener's
/// `stream_idle_timeout` is set above it (`envoyfilter/envoy.yaml` and the
/// Istio health listeners).
pub const MAX_WAIT_MS: u64 = 2 * MAX_MS + MAX_SCRAPE_INTERVAL_MS + 5_000;

/// Sets one field from the key's value, or says what is wrong with the
/// value (the caller names the key). Every key but `role` sets a field of
/// what the health role reads, which holds every other role's keys.
type Apply = fn(&mut Health, &Value) -> Result<(), String>;

/// The values `role` takes.
const ROLES: &str = "\"traffic\", \"traffic_tcp\", \"health\" or \"placeholder\"";
/// The values `draining_new_requests` and `draining_grpc_requests` take.
const SERVE_OR_REFUSE: &str = "\"serve\" or \"refuse\"";

/// Declares `KEYS` (the names, `role` first) and `RULES` (each other name
/// with what sets it) from one list, so a key is written exactly once.
macro_rules! key_table {
    ($(#[$doc:meta])* pub const KEYS: [&str; $n:literal] = [$role:literal, $($key:literal => $apply:expr),* $(,)?];) => {
        $(#[$doc])*
        pub const KEYS: [&str; $n] = [$role, $($key),*];
        const ROLE: &str = $role;
        const RULES: [(&str, Apply); $n - 1] = [$(($key, $apply)),*];
    };
}

key_table! {
    /// Every configuration key, in the order they are checked.
    pub const KEYS: [&str; 20] = [
        "role",
        "drain_timeout" => |c, v| duration(v, 1, MAX_MS).map(|x| c.drain_timeout_ms = x),
        "min_drain" => min_drain,
        "lb_buffer" => |c, v| duration(v, 0, MAX_MS).map(|x| c.lb_buffer_ms = x),
        "tick" => |c, v| duration(v, 10, MAX_TICK_MS).map(|x| c.shared.tick_ms = x),
        "draining_lb_status" => |c, v| {
            let status = v.as_u64().filter(|s| *s == 200 || *s == 404);
            found(status.map(|s| s as u16), "200 or 404", v).map(|x| c.draining_lb_status = x)
        },
        "admin_allow" => |c, v| cidr_list(v).map(|x| c.admin_allow = x),
        "admin_token" => |c, v| admin_tokens(v).map(|x| c.admin_tokens = x),
        "close_after" => |c, v| {
            one_of(v, "\"lb_buffer\" or \"lb_observed_down\"").map(|x| c.close_after = x)
        },
        "lb_fall" => |c, v| {
            let fall = v.as_u64().filter(|n| matches!(n, 1..=10));
            found(fall.map(|n| n as u32), "a whole number from 1 to 10", v).map(|x| c.lb_fall = x)
        },
        "lb_down_timeout" => |c, v| duration(v, 1, MAX_MS).map(|x| c.lb_down_timeout_ms = x),
        "rotate_connections" => |c, v| {
            cluster(v, rotation::DEFAULT_CLUSTER).map(|x| c.rotate_connections = x)
        },
        "lb_checkers" => |c, v| lb_checkers(v).map(|x| c.lb_checkers = x),
        "soft_drain_gate" => |c, v| one_of(v, "true or false").map(|x| c.soft_drain_gate = x),
        "draining_new_requests" => |c, v| {
            one_of(v, SERVE_OR_REFUSE).map(|x| c.shared.draining_new_requests = x)
        },
        "refused_requests" => |c, v| {
            refusing(c, v, "\"idempotent\", \"idempotent_or_key\" or \"all\"", |r| &mut r.requests)
        },
        "draining_grpc_requests" => |c, v| refusing(c, v, SERVE_OR_REFUSE, |r| &mut r.grpc),
        "refuse_with" => |c, v| refusing(c, v, "\"response\" or \"reset\"", |r| &mut r.with),
        "termination_watch" => |c, v| cluster(v, AGENT_CLUSTER).map(|x| c.termination_watch = x),
        "scrape_interval" => |c, v| {
            duration(v, 0, MAX_SCRAPE_INTERVAL_MS).map(|x| c.scrape_interval_ms = x)
        },
    ];
}

impl Default for Shared {
    fn default() -> Shared {
        Shared {
            tick_ms: 100,
            draining_new_requests: NewRequests::Serve,
            refusal: Refusal::default(),
        }
    }
}

impl Default for Health {
    fn default() -> Health {
        Health {
            shared: Shared::default(),
            drain_timeout_ms: 120_000,
            min_drain_ms: 0,
            lb_buffer_ms: 10_000,
            draining_lb_status: 200,
            admin_allow: LOOPBACK.to_vec(),
            admin_tokens: Vec::new(),
            close_after: CloseAfter::LbBuffer,
            lb_fall: 2,
            lb_down_timeout_ms: 60_000,
            rotate_connections: Some(rotation::DEFAULT_CLUSTER.into()),
            lb_checkers: None,
            soft_drain_gate: true,
            termination_watch: None,
            scrape_interval_ms: 0,
        }
    }
}

fn err(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        problem: problem.into(),
    }
}

/// A configuration value as an error message shows it. (Not `Value`'s own
/// `Display`, which brings a float formatter into the module.)
fn shown(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.to_string(),
            (None, Some(i)) => i.to_string(),
            (None, None) => "a fractional number".into(),
        },
        Value::String(s) => format!("\"{s}\""),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// What was found in `v`, or that it should have been `what`: the error
/// says what it was (`shown`).
fn found<T>(read: Option<T>, what: &str, v: &Value) -> Result<T, String> {
    read.ok_or_else(|| format!("expected {what}, got {}", shown(v)))
}

/// A duration value from `min_ms` to `max_ms`.
fn duration(v: &Value, min_ms: u64, max_ms: u64) -> Result<u64, String> {
    let s = found(v.as_str(), "a duration string like \"30s\"", v)?;
    let ms = duration::parse_ms(s)?;
    let (side, limit) = match ms {
        _ if ms < min_ms => ("below the minimum", min_ms),
        _ if ms > max_ms => ("above the maximum", max_ms),
        _ => return Ok(ms),
    };
    Err(format!("\"{s}\" is {side} {}", duration::format_ms(limit)))
}

/// What `v` holds (a `named!` enum's variant, a bool), or that it should
/// have been `what`.
fn one_of<T: FromJson>(v: &Value, what: &str) -> Result<T, String> {
    found(T::from_json(v).ok(), what, v)
}

/// Sets a way of refusing: one other than the default needs the refusing
/// (checked after `draining_new_requests`, the order of `KEYS`).
fn refusing<T: FromJson + Default + PartialEq>(
    c: &mut Health,
    v: &Value,
    what: &str,
    way: fn(&mut Refusal) -> &mut T,
) -> Result<(), String> {
    let set = one_of(v, what)?;
    if set != T::default() && c.shared.draining_new_requests != NewRequests::Refuse {
        return Err(shown(v) + " needs draining_new_requests: \"refuse\"");
    }
    *way(&mut c.shared.refusal) = set;
    Ok(())
}

/// The role a `role` value names: what makes its configuration of the keys.
fn role(v: &Value) -> Result<fn(Health) -> Config, String> {
    match v.as_str() {
        Some("traffic") => Ok(|h| Config::Traffic(h.shared)),
        Some("traffic_tcp") => Ok(|h| Config::TrafficTcp(h.shared)),
        Some("health") => Ok(Config::Health),
        Some("placeholder") => Ok(|h| Config::Placeholder(h.shared)),
        _ => found(None, ROLES, v),
    }
}

/// Checked after `drain_timeout` (the order of `KEYS`); without the key it
/// is 0, which never exceeds a valid `drain_timeout`.
fn min_drain(c: &mut Health, v: &Value) -> Result<(), String> {
    c.min_drain_ms = duration(v, 0, MAX_MS)?;
    if c.min_drain_ms > c.drain_timeout_ms {
        return Err("must not exceed drain_timeout".into());
    }
    Ok(())
}

fn cidr_list(v: &Value) -> Result<Vec<Cidr>, String> {
    let items = found(v.as_array(), "a list of CIDRs", v)?;
    let cidr = |item: &Value| found(item.as_str(), "a CIDR string", item).and_then(Cidr::parse);
    items.iter().map(cidr).collect()
}

/// `null` (the chart's default) is the default: every source counts.
fn lb_checkers(v: &Value) -> Result<Option<Vec<Cidr>>, String> {
    match v {
        Value::Null => Ok(None),
        Value::Array(items) if items.is_empty() => Err(
            "an empty list would ignore every checker; omit the key to count every source".into(),
        ),
        _ => cidr_list(v).map(Some),
    }
}

fn admin_tokens(v: &Value) -> Result<Vec<String>, String> {
    let tokens: Vec<&str> = match v {
        Value::String(t) if t.is_empty() => Vec::new(),
        Value::String(t) => vec![t.as_str()],
        Value::Array(items) if !items.is_empty() && items.len() <= MAX_TOKENS => items
            .iter()
            .map(|i| i.as_str().ok_or("expected strings"))
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(format!(
                "expected a string or a list of 1 to {MAX_TOKENS} strings"
            ))
        }
    };
    // RFC 7235 token68 characters (what may follow `Bearer `).
    let token68 = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b);
    for t in &tokens {
        if t.len() < MIN_TOKEN_LEN {
            return Err(format!("shorter than {MIN_TOKEN_LEN} characters"));
        }
        if !t.bytes().all(token68) {
            return Err("may only hold letters, digits and -._~+/=".into());
        }
    }
    Ok(tokens.into_iter().map(str::to_string).collect())
}

/// An Envoy cluster a key names: `false` turns it off, `true` is `default`,
/// a string names the cluster.
fn cluster(v: &Value, default: &str) -> Result<Option<String>, String> {
    let printable = |name: &str| name.bytes().all(|b| b.is_ascii_graphic());
    match v {
        Value::Bool(on) => Ok(on.then(|| default.into())),
        Value::String(name) if (1..=MAX_CLUSTER_LEN).contains(&name.len()) && printable(name) => {
            Ok(Some(name.clone()))
        }
        _ => Err(format!(
            "expected false, true or an Envoy cluster name (1 to {MAX_CLUSTER_LEN} \
             printable ASCII characters), got {}",
            shown(v)
        )),
    }
}

/// `names` for an error message: `a, b, c` (one small loop, not the
/// standard library's generic `join`: the module's size is budgeted).
pub fn listed(names: &[&str]) -> String {
    let mut out = String::new();
    for name in names {
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(name);
    }
    out
}

impl Config {
    /// Parses the plugin configuration bytes. Empty input is refused: the role
    /// must be chosen explicitly.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| err("(configuration)", format!("not valid JSON: {e}")))?;
        let obj = value.as_object();
        Config::from_object(obj.ok_or_else(|| err("(configuration)", "expected a JSON object"))?)
    }

    /// Applies every key of `obj` in the order of `KEYS`.
    pub fn from_object(obj: &Map<String, Value>) -> Result<Config, ConfigError> {
        if let Some(unknown) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(err(
                unknown,
                format!("unknown key (known keys: {})", listed(&KEYS)),
            ));
        }
        let make = obj
            .get(ROLE)
            .map_or(Err(format!("required: {ROLES}")), role)
            .map_err(|problem| err(ROLE, problem))?;
        let mut keys = Health::default();
        for (key, apply) in RULES {
            if let Some(v) = obj.get(key) {
                apply(&mut keys, v).map_err(|problem| err(key, problem))?;
            }
        }
        Ok(make(keys))
    }

    /// The tick every role runs on (`tick`).
    pub fn tick_ms(&self) -> u64 {
        match self {
            Config::Traffic(s) | Config::TrafficTcp(s) | Config::Placeholder(s) => s.tick_ms,
            Config::Health(h) => h.shared.tick_ms,
        }
    }
}

impl Health {
    pub fn plan(&self) -> DrainPlan {
        DrainPlan {
            min_drain_ms: self.min_drain_ms,
            drain_timeout_ms: self.drain_timeout_ms,
            lb_buffer_ms: self.lb_buffer_ms,
            close_after: self.close_after,
            lb_down_timeout_ms: self.lb_down_timeout_ms,
            lb_gate: self.draining_lb_status == 404 && self.soft_drain_gate,
            lb_gate_needs_checker: self.lb_checkers.is_some(),
            hold_closing: false,
        }
    }

    /// Whether a check from `source` counts as one of the LB's.
    pub fn is_checker(&self, source: IpAddr) -> bool {
        self.lb_checkers
            .as_ref()
            .map_or(true, |list| list.iter().any(|c| c.contains(source)))
    }

    /// What CLOSING waits for the LB before CLOSED: `lb_buffer`, or
    /// `lb_down_timeout` with `close_after: lb_observed_down`.
    pub fn lb_wait(&self) -> Wait {
        let (name, ms) = match self.close_after {
            CloseAfter::LbBuffer => ("lb_buffer", self.lb_buffer_ms),
            CloseAfter::LbObservedDown => ("lb_down_timeout", self.lb_down_timeout_ms),
        };
        Wait { name, ms }
    }

    /// The longest CLOSING can last: what it waits for the LB, never less
    /// than `lb_buffer`.
    pub fn max_closing_ms(&self) -> u64 {
        self.lb_wait().ms.max(self.lb_buffer_ms)
    }

    /// How long a preStop hold outlives the last tick that renewed it: the
    /// hold of a worker that died is gone this long after.
    pub fn hold_lease_ms(&self) -> u64 {
        self.shared.tick_ms.saturating_mul(10).max(2_000)
    }

    /// Accepted, but probably not what was meant: one sentence each, logged
    /// when the health role loads the configuration.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.lb_buffer_ms > self.drain_timeout_ms {
            out.push(format!(
                "lb_buffer ({}) is longer than drain_timeout ({}): the LB needs only fall × inter \
                 after the 503 to mark the gateway DOWN, and every drain then holds the pod for up \
                 to {} before CLOSED; keep terminationGracePeriodSeconds above that",
                duration::format_ms(self.lb_buffer_ms),
                duration::format_ms(self.drain_timeout_ms),
                duration::format_ms(self.drain_timeout_ms + self.max_closing_ms()),
            ));
        }
        if self.admin_allow.is_empty() && self.admin_tokens.is_empty() {
            out.push(
                "admin_allow is empty and no admin_token is set: nobody can call the admin \
                 endpoints (POST /drain, GET /prestop, ...), so a preStop hook gets 403 and the \
                 pod is never drained"
                    .to_string(),
            );
        }
        out
    }

    /// How long a `wait=closed` is held when the caller gives no timeout: the
    /// longest a drain can take, plus a margin for the tick. At most
    /// [`MAX_WAIT_MS`].
    pub fn default_wait_ms(&self) -> u64 {
        self.drain_timeout_ms + self.max_closing_ms() + self.scrape_interval_ms + 5_000
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::gate::refusal::{RefuseWith, Refused};

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s.as_bytes())
    }

    /// What the health role reads of `s`, a health role's configuration.
    fn health(s: &str) -> Health {
        match parse(s).unwrap() {
            Config::Health(h) => h,
            other => panic!("not the health role: {other:?}"),
        }
    }

    /// What both roles read of `s`, a traffic or health role's configuration.
    fn shared(s: &str) -> Shared {
        match parse(s).unwrap() {
            Config::Traffic(s) | Config::TrafficTcp(s) => s,
            Config::Health(h) => h.shared,
            other => panic!("not a traffic or health role: {other:?}"),
        }
    }

    #[test]
    fn defaults_need_only_a_role() {
        let c = parse(r#"{"role":"health"}"#).unwrap();
        assert_eq!(c, Config::Health(Health::default()));
        let c = Health::default();
        assert_eq!(c.admin_allow[0].to_string(), "127.0.0.0/8");
        assert_eq!(c.admin_allow[1].to_string(), "::1/128");
    }

    #[test]
    fn each_role_by_name() {
        for (name, role) in [
            ("traffic", Config::Traffic(Shared::default())),
            ("traffic_tcp", Config::TrafficTcp(Shared::default())),
            ("health", Config::Health(Health::default())),
            ("placeholder", Config::Placeholder(Shared::default())),
        ] {
            let c = parse(&format!(r#"{{"role":"{name}"}}"#)).unwrap();
            assert_eq!(c, role, "{name}");
        }
    }

    #[test]
    fn full_configuration() {
        let keys = r#""drain_timeout":"2m","min_drain":"500ms","lb_buffer":"0s",
                "tick":"50ms","draining_lb_status":404,"admin_allow":["10.0.0.0/8","fd00::/8","192.0.2.7"],
                "admin_token":"abcdefghijklmnop","close_after":"lb_observed_down","lb_fall":3,
                "lb_down_timeout":"30s"}"#;
        let traffic = parse(&format!(r#"{{"role":"traffic",{keys}"#)).unwrap();
        assert!(matches!(traffic, Config::Traffic(_)), "{traffic:?}");
        assert_eq!(traffic.tick_ms(), 50);
        // The keys only the health role reads, as it reads them.
        let c = health(&format!(r#"{{"role":"health",{keys}"#));
        assert_eq!(
            (
                c.drain_timeout_ms,
                c.min_drain_ms,
                c.lb_buffer_ms,
                c.shared.tick_ms
            ),
            (120_000, 500, 0, 50)
        );
        assert_eq!(c.draining_lb_status, 404);
        assert_eq!(c.admin_tokens, vec!["abcdefghijklmnop".to_string()]);
        let two =
            health(r#"{"role":"health","admin_token":["abcdefghijklmnop","qrstuvwxyz012345"]}"#);
        assert_eq!(two.admin_tokens.len(), 2);
        assert_eq!(
            (c.close_after, c.lb_fall, c.lb_down_timeout_ms),
            (CloseAfter::LbObservedDown, 3, 30_000)
        );
        assert_eq!(c.admin_allow.len(), 3);
        assert_eq!(c.admin_allow[2].to_string(), "192.0.2.7/32");
        assert_eq!(
            c.rotate_connections.as_deref(),
            Some(rotation::DEFAULT_CLUSTER)
        );
    }

    #[test]
    fn rotation_names_a_cluster_or_is_off() {
        let named = health(r#"{"role":"health","rotate_connections":"admin"}"#);
        assert_eq!(named.rotate_connections.as_deref(), Some("admin"));
        let off = health(r#"{"role":"health","rotate_connections":false}"#);
        assert_eq!(off.rotate_connections, None);
        let on = health(r#"{"role":"health","rotate_connections":true}"#);
        assert_eq!(
            on.rotate_connections.as_deref(),
            Some(rotation::DEFAULT_CLUSTER)
        );
    }

    #[test]
    fn new_requests_while_draining_are_served_unless_refused() {
        let c = shared(r#"{"role":"traffic"}"#);
        assert_eq!(c.draining_new_requests, NewRequests::Serve);
        let c = shared(r#"{"role":"traffic","draining_new_requests":"refuse"}"#);
        assert_eq!(c.draining_new_requests.name(), "refuse");
        assert_eq!(c.refusal.grpc, NewRequests::Serve, "gRPC served");
        assert_eq!(c.refusal.with, RefuseWith::Response, "with the 503");
        let c = shared(
            r#"{"role":"traffic","draining_new_requests":"refuse","draining_grpc_requests":"refuse",
                "refuse_with":"reset"}"#,
        );
        assert_eq!(c.refusal.grpc.name(), "refuse");
        assert_eq!(c.refusal.with.name(), "reset");
        assert_eq!(
            c.refusal.requests,
            Refused::Idempotent,
            "what every LB may resend"
        );
        let c = shared(
            r#"{"role":"traffic","draining_new_requests":"refuse","refused_requests":"all"}"#,
        );
        assert_eq!(c.refusal.requests, Refused::All);
        // The defaults spelled out are valid in either mode (the chart passes every value).
        let c = shared(
            r#"{"role":"traffic","draining_grpc_requests":"serve","refuse_with":"response",
                "refused_requests":"idempotent"}"#,
        );
        assert_eq!(c.draining_new_requests, NewRequests::Serve);
    }

    #[test]
    fn lb_checkers_and_the_soft_drain_gate() {
        let c = health(r#"{"role":"health"}"#);
        assert!(
            c.is_checker("203.0.113.9".parse().unwrap()),
            "default: any source"
        );
        assert!(!c.plan().lb_gate, "200 while draining: nothing to gate");
        let c = health(
            r#"{"role":"health","draining_lb_status":404,"lb_checkers":["10.1.0.0/16","::1/128"]}"#,
        );
        assert!(c.is_checker("10.1.2.3".parse().unwrap()));
        assert!(c.is_checker("::1".parse().unwrap()));
        assert!(!c.is_checker("10.2.0.1".parse().unwrap()));
        assert!(c.plan().lb_gate, "404 gates by default");
        let c = health(r#"{"role":"health","draining_lb_status":404,"soft_drain_gate":false}"#);
        assert!(!c.plan().lb_gate);
    }

    #[test]
    fn each_bad_field_is_named() {
        let whole = [
            ("", "(configuration)"),
            ("[]", "(configuration)"),
            (r#"{}"#, "role"),
            (r#"{"role":"both"}"#, "role"),
        ];
        // Each key with a refused value, beside a valid role.
        let keyed = [
            ("drain_timeot", r#""1s""#),
            ("drain_timeout", r#""12x""#),
            ("drain_timeout", "120"),
            ("drain_timeout", r#""0s""#),
            ("min_drain", r#""-1s""#),
            ("min_drain", r#""3m""#),
            ("lb_buffer", r#""2h""#),
            ("tick", r#""1ms""#),
            ("tick", r#""11s""#),
            ("draining_lb_status", "503"),
            ("draining_lb_status", r#""200""#),
            ("admin_allow", r#""127.0.0.1""#),
            ("admin_allow", r#"["127.0.0.0/33"]"#),
            ("admin_allow", r#"["localhost"]"#),
            ("admin_allow", "[8]"),
            ("admin_allow", r#"["10.0.0.1/8"]"#),
            ("admin_token", r#""short""#),
            ("admin_token", r#""has spaces in the token""#),
            ("admin_token", "7"),
            ("rotate_connections", r#""""#),
            ("rotate_connections", r#""two words""#),
            ("rotate_connections", "0"),
            ("admin_token", "[]"),
            ("admin_token", r#"["abcdefghijklmnopq",3]"#),
            ("admin_token", r#"["abcdefghijklmnopq","short"]"#),
            ("close_after", r#""lb_down""#),
            ("lb_fall", "0"),
            ("lb_fall", "2.5"),
            ("lb_down_timeout", r#""0s""#),
            ("lb_checkers", "[]"),
            ("lb_checkers", r#"["10.0.0.300/32"]"#),
            ("lb_checkers", r#""10.0.0.0/8""#),
            ("soft_drain_gate", r#""yes""#),
            ("draining_new_requests", r#""drop""#),
            ("draining_new_requests", "true"),
            ("draining_grpc_requests", r#""drop""#),
            ("draining_grpc_requests", r#""refuse""#),
            ("refuse_with", "503"),
            ("refuse_with", r#""reset""#),
            ("refused_requests", r#""any""#),
            ("refused_requests", r#""all""#),
            ("refused_requests", r#""GET""#),
        ];
        let keyed = keyed.map(|(key, value)| {
            let input = format!(r#"{{"role":"health","{key}":{value}}}"#);
            (input, key)
        });
        let cases = whole.map(|(input, key)| (input.to_string(), key));
        for (input, key) in cases.into_iter().chain(keyed) {
            let e = parse(&input).unwrap_err();
            assert_eq!(e.key, key, "{input} -> {e}");
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn refusals_read_as_documented() {
        let problem = |s: &str| parse(s).unwrap_err().to_string();
        assert_eq!(
            problem(r#"{"role":"health","lb_buffer":"2h"}"#),
            "invalid configuration: lb_buffer: \"2h\" is above the maximum 60m"
        );
        assert_eq!(
            problem(r#"{"role":"health","tick":"11s"}"#),
            "invalid configuration: tick: \"11s\" is above the maximum 10s"
        );
        assert_eq!(
            problem(r#"{"role":"health","min_drain":"3m"}"#),
            "invalid configuration: min_drain: must not exceed drain_timeout"
        );
        assert_eq!(
            problem(r#"{"drain_timeout":"1s"}"#),
            "invalid configuration: role: required: \"traffic\", \"traffic_tcp\", \"health\" or \"placeholder\""
        );
        assert_eq!(
            problem(r#"{"role":"health","drain_timeout":"0s"}"#),
            "invalid configuration: drain_timeout: \"0s\" is below the minimum 1ms"
        );
        assert_eq!(
            problem(r#"{"role":"traffic","refused_requests":"every"}"#),
            "invalid configuration: refused_requests: expected \"idempotent\", \
             \"idempotent_or_key\" or \"all\", got \"every\""
        );
        assert_eq!(
            problem(r#"{"role":"traffic","draining_grpc_requests":"refuse"}"#),
            "invalid configuration: draining_grpc_requests: \"refuse\" needs \
             draining_new_requests: \"refuse\""
        );
        assert_eq!(
            problem(r#"{"role":"traffic","draining_new_requests":"refuse","refuse_with":503}"#),
            "invalid configuration: refuse_with: expected \"response\" or \"reset\", got 503"
        );
        assert_eq!(
            problem(r#"{"role":"health","admin_allow":["10.0.0.1/8"]}"#),
            "invalid configuration: admin_allow: \"10.0.0.1/8\" has host bits set (did you mean \"10.0.0.0/8\"?)"
        );
    }

    #[test]
    fn odd_but_valid_configurations_are_explained() {
        assert!(health(r#"{"role":"health"}"#).warnings().is_empty());
        let long = health(r#"{"role":"health","lb_buffer":"5m","drain_timeout":"10s"}"#);
        let w = long.warnings();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("lb_buffer (5m) is longer than drain_timeout (10s)"),
            "{}",
            w[0]
        );
        assert!(w[0].contains("up to 310s"), "{}", w[0]);
        let closed = health(r#"{"role":"health","admin_allow":[]}"#);
        assert!(closed.warnings()[0].contains("nobody can call the admin endpoints"));
        let token =
            health(r#"{"role":"health","admin_allow":[],"admin_token":"abcdefghijklmnop"}"#);
        assert!(token.warnings().is_empty(), "the token holders can");
    }

    #[test]
    fn the_termination_watch_names_a_cluster_and_the_scrape_interval_lengthens_the_hold() {
        let off = health(r#"{"role":"health"}"#);
        assert_eq!(
            (off.termination_watch.as_deref(), off.scrape_interval_ms),
            (None, 0)
        );
        let on = health(r#"{"role":"health","termination_watch":true,"scrape_interval":"5s"}"#);
        assert_eq!(on.termination_watch.as_deref(), Some(AGENT_CLUSTER));
        assert_eq!(on.default_wait_ms(), off.default_wait_ms() + 5_000);
        let named = health(r#"{"role":"health","termination_watch":"pilot"}"#);
        assert_eq!(named.termination_watch.as_deref(), Some("pilot"));
        assert_eq!(
            parse(r#"{"role":"health","scrape_interval":"61s"}"#)
                .unwrap_err()
                .to_string(),
            "invalid configuration: scrape_interval: \"61s\" is above the maximum 1m"
        );
        assert!(parse(r#"{"role":"health","termination_watch":""}"#)
            .unwrap_err()
            .to_string()
            .starts_with("invalid configuration: termination_watch: expected false, true or an Envoy cluster name"));
    }

    #[test]
    fn the_longest_default_hold_is_max_wait() {
        let longest = health(
            r#"{"role":"health","drain_timeout":"60m","close_after":"lb_observed_down",
                "lb_down_timeout":"60m","lb_buffer":"60m","scrape_interval":"60s"}"#,
        );
        assert_eq!(longest.default_wait_ms(), MAX_WAIT_MS);
        let explicit = health(r#"{"role":"health"}"#)
            .default_wait_ms()
            .max(duration::MAX_MS);
        assert!(explicit <= MAX_WAIT_MS, "an explicit timeout= fits too");
    }

    /// Every shipped health listener lets a held `wait=closed` run its
    /// longest: Envoy's `stream_idle_timeout` must not cut it first.
    #[test]
    fn shipped_stream_idle_timeouts_outlast_the_longest_hold() {
        let shipped = [
            include_str!("../envoyfilter/envoy.yaml"),
            include_str!("../envoyfilter/istio/health-listener.yaml"),
            include_str!("../envoyfilter/istio/wasmplugin/health-listener.yaml"),
            include_str!("../envoyfilter/chart/templates/health-listener.yaml"),
            include_str!("../envoyfilter/gateway-api/health-listener.yaml"),
            include_str!("../envoyfilter/gateway-api/wasmplugin/health-listener.yaml"),
        ];
        for text in shipped {
            let secs: Vec<u64> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("stream_idle_timeout: "))
                .map(|v| v.trim_end_matches('s').parse().unwrap())
                .collect();
            assert_eq!(secs.len(), 1, "one health listener per file");
            assert!(secs[0] * 1000 > MAX_WAIT_MS, "{} s", secs[0]);
        }
    }
}
