//! Plugin configuration: the raw JSON object → a validated `Config`, once, at
//! load. Every refusal names the key and the problem. Pure.

use serde_json::{Map, Value};
use std::fmt;
use std::net::IpAddr;

use crate::fsm::{CloseAfter, DrainPlan};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Counts every HTTP stream of the gateway's traffic listener(s).
    Traffic,
    /// Serves the FSM on the dedicated health listener.
    Health,
}

/// An IPv4 or IPv6 network, e.g. `127.0.0.0/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{s:?} has a prefix length outside 0..={max}")),
            },
        };
        Ok(Cidr { net, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                masked(u32::from(n).into(), self.prefix, 32)
                    == masked(u32::from(a).into(), self.prefix, 32)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                masked(u128::from(n), self.prefix, 128) == masked(u128::from(a), self.prefix, 128)
            }
            _ => false,
        }
    }
}

fn masked(bits: u128, prefix: u8, width: u32) -> u128 {
    if prefix == 0 {
        return 0;
    }
    let keep = u32::from(prefix).min(width);
    bits >> (width - keep)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// Parses `500ms`, `30s`, `2m`, `1h` into milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("{s:?} is not a duration (use e.g. 500ms, 30s, 2m)")),
    };
    if digits.is_empty() || digits.len() > 12 {
        return Err(format!("{s:?} is not a duration (use e.g. 500ms, 30s, 2m)"));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (use e.g. 500ms, 30s, 2m)"))?;
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// Formats milliseconds the way the configuration spells durations.
pub fn format_duration_ms(ms: u64) -> String {
    if ms != 0 && ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1_000 == 0 {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub role: Role,
    pub drain_timeout_ms: u64,
    pub min_drain_ms: u64,
    pub lb_buffer_ms: u64,
    pub tick_ms: u64,
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
    /// Sources whose `/health_check.html` requests count as LB checkers;
    /// `None`: every source.
    pub lb_checkers: Option<Vec<Cidr>>,
    /// With `draining_lb_status: 404`: the active = 0 flip also waits until
    /// every live checker has been served a 404 since the drain began.
    pub soft_drain_gate: bool,
}

fn cidr_list(key: &str, v: &Value) -> Result<Vec<Cidr>, ConfigError> {
    let items = v
        .as_array()
        .ok_or_else(|| err(key, format!("expected a list of CIDRs, got {v}")))?;
    items
        .iter()
        .map(|item| {
            item.as_str()
                .ok_or_else(|| err(key, format!("expected a CIDR string, got {item}")))
                .and_then(|s| Cidr::parse(s).map_err(|p| err(key, p)))
        })
        .collect()
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

pub const KEYS: [&str; 13] = [
    "role",
    "drain_timeout",
    "min_drain",
    "lb_buffer",
    "tick",
    "draining_lb_status",
    "admin_allow",
    "admin_token",
    "close_after",
    "lb_fall",
    "lb_down_timeout",
    "lb_checkers",
    "soft_drain_gate",
];

/// Shortest accepted admin token: long enough not to be guessed.
pub const MIN_TOKEN_LEN: usize = 16;
/// Most admin tokens accepted at once (the current one and the next, with room).
pub const MAX_TOKENS: usize = 4;
/// Longest drain this filter accepts (also bounds a held `wait=closed`).
pub const MAX_DURATION_MS: u64 = 3_600_000;

impl Default for Config {
    fn default() -> Config {
        Config {
            role: Role::Traffic,
            drain_timeout_ms: 120_000,
            min_drain_ms: 0,
            lb_buffer_ms: 10_000,
            tick_ms: 100,
            draining_lb_status: 200,
            admin_allow: vec![
                Cidr {
                    net: IpAddr::from([127, 0, 0, 0]),
                    prefix: 8,
                },
                Cidr {
                    net: IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
                    prefix: 128,
                },
            ],
            admin_tokens: Vec::new(),
            close_after: CloseAfter::LbBuffer,
            lb_fall: 2,
            lb_down_timeout_ms: 60_000,
            lb_checkers: None,
            soft_drain_gate: true,
        }
    }
}

fn err(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        problem: problem.into(),
    }
}

fn duration(key: &str, v: &Value, min_ms: u64) -> Result<u64, ConfigError> {
    let s = v.as_str().ok_or_else(|| {
        err(
            key,
            format!("expected a duration string like \"30s\", got {v}"),
        )
    })?;
    let ms = parse_duration_ms(s).map_err(|p| err(key, p))?;
    if ms < min_ms {
        return Err(err(
            key,
            format!("{s:?} is below the minimum {}", format_duration_ms(min_ms)),
        ));
    }
    if ms > MAX_DURATION_MS {
        return Err(err(key, format!("{s:?} is above the maximum 60m")));
    }
    Ok(ms)
}

impl Config {
    /// Parses the plugin configuration bytes. Empty input is refused: the role
    /// must be chosen explicitly.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| err("(configuration)", format!("not valid JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| err("(configuration)", "expected a JSON object"))?;
        Config::from_object(obj)
    }

    pub fn from_object(obj: &Map<String, Value>) -> Result<Config, ConfigError> {
        if let Some(unknown) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(err(
                unknown,
                format!("unknown key (known keys: {})", KEYS.join(", ")),
            ));
        }
        let role = match obj.get("role") {
            None => return Err(err("role", "required: \"traffic\" or \"health\"")),
            Some(v) => match v.as_str() {
                Some("traffic") => Role::Traffic,
                Some("health") => Role::Health,
                _ => {
                    return Err(err(
                        "role",
                        format!("expected \"traffic\" or \"health\", got {v}"),
                    ))
                }
            },
        };
        let mut c = Config {
            role,
            ..Config::default()
        };
        if let Some(v) = obj.get("drain_timeout") {
            c.drain_timeout_ms = duration("drain_timeout", v, 1)?;
        }
        if let Some(v) = obj.get("min_drain") {
            c.min_drain_ms = duration("min_drain", v, 0)?;
        }
        if let Some(v) = obj.get("lb_buffer") {
            c.lb_buffer_ms = duration("lb_buffer", v, 0)?;
        }
        if let Some(v) = obj.get("tick") {
            c.tick_ms = duration("tick", v, 10)?;
            if c.tick_ms > 10_000 {
                return Err(err("tick", format!("{v} is above the maximum 10s")));
            }
        }
        if c.min_drain_ms > c.drain_timeout_ms {
            return Err(err("min_drain", "must not exceed drain_timeout"));
        }
        if let Some(v) = obj.get("draining_lb_status") {
            c.draining_lb_status = match v.as_u64() {
                Some(200) => 200,
                Some(404) => 404,
                _ => {
                    return Err(err(
                        "draining_lb_status",
                        format!("expected 200 or 404, got {v}"),
                    ))
                }
            };
        }
        if let Some(v) = obj.get("admin_allow") {
            c.admin_allow = cidr_list("admin_allow", v)?;
        }
        if let Some(v) = obj.get("lb_checkers") {
            let list = cidr_list("lb_checkers", v)?;
            if list.is_empty() {
                return Err(err(
                    "lb_checkers",
                    "an empty list would ignore every checker; omit the key to count every source",
                ));
            }
            c.lb_checkers = Some(list);
        }
        if let Some(v) = obj.get("soft_drain_gate") {
            c.soft_drain_gate = v
                .as_bool()
                .ok_or_else(|| err("soft_drain_gate", format!("expected true or false, got {v}")))?;
        }
        if let Some(v) = obj.get("admin_token") {
            let tokens: Vec<&str> = match v {
                Value::String(t) if t.is_empty() => Vec::new(),
                Value::String(t) => vec![t.as_str()],
                Value::Array(items) if !items.is_empty() && items.len() <= MAX_TOKENS => items
                    .iter()
                    .map(|i| {
                        i.as_str()
                            .ok_or_else(|| err("admin_token", "expected strings"))
                    })
                    .collect::<Result<_, _>>()?,
                _ => {
                    return Err(err(
                        "admin_token",
                        format!("expected a string or a list of 1 to {MAX_TOKENS} strings"),
                    ))
                }
            };
            for t in &tokens {
                if t.len() < MIN_TOKEN_LEN {
                    return Err(err(
                        "admin_token",
                        format!("shorter than {MIN_TOKEN_LEN} characters"),
                    ));
                }
                if !t.bytes().all(is_token68) {
                    return Err(err(
                        "admin_token",
                        "may only hold letters, digits and -._~+/=",
                    ));
                }
            }
            c.admin_tokens = tokens.into_iter().map(str::to_string).collect();
        }
        if let Some(v) = obj.get("close_after") {
            c.close_after = match v.as_str() {
                Some("lb_buffer") => CloseAfter::LbBuffer,
                Some("lb_observed_down") => CloseAfter::LbObservedDown,
                _ => {
                    return Err(err(
                        "close_after",
                        format!("expected \"lb_buffer\" or \"lb_observed_down\", got {v}"),
                    ))
                }
            };
        }
        if let Some(v) = obj.get("lb_fall") {
            c.lb_fall = match v.as_u64() {
                Some(n @ 1..=10) => n as u32,
                _ => {
                    return Err(err(
                        "lb_fall",
                        format!("expected a whole number from 1 to 10, got {v}"),
                    ))
                }
            };
        }
        if let Some(v) = obj.get("lb_down_timeout") {
            c.lb_down_timeout_ms = duration("lb_down_timeout", v, 1)?;
        }
        Ok(c)
    }

    pub fn plan(&self) -> DrainPlan {
        DrainPlan {
            min_drain_ms: self.min_drain_ms,
            drain_timeout_ms: self.drain_timeout_ms,
            lb_buffer_ms: self.lb_buffer_ms,
            close_after: self.close_after,
            lb_down_timeout_ms: self.lb_down_timeout_ms,
            lb_gate: self.draining_lb_status == 404 && self.soft_drain_gate,
        }
    }

    /// Whether a check from `source` counts as one of the LB's.
    pub fn is_checker(&self, source: IpAddr) -> bool {
        self.lb_checkers
            .as_ref()
            .map_or(true, |list| list.iter().any(|c| c.contains(source)))
    }

    /// The longest CLOSING can last.
    pub fn max_closing_ms(&self) -> u64 {
        match self.close_after {
            CloseAfter::LbBuffer => self.lb_buffer_ms,
            CloseAfter::LbObservedDown => self.lb_down_timeout_ms.max(self.lb_buffer_ms),
        }
    }

    /// How long a `wait=closed` is held when the caller gives no timeout: the
    /// longest a drain can take, plus a margin for the tick.
    pub fn default_wait_ms(&self) -> u64 {
        self.drain_timeout_ms + self.max_closing_ms() + 5_000
    }
}

/// RFC 7235 token68 characters (what may follow `Bearer `).
fn is_token68(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s.as_bytes())
    }

    #[test]
    fn defaults_need_only_a_role() {
        let c = parse(r#"{"role":"health"}"#).unwrap();
        assert_eq!(
            c,
            Config {
                role: Role::Health,
                ..Config::default()
            }
        );
        assert_eq!(c.admin_allow[0].to_string(), "127.0.0.0/8");
        assert_eq!(c.admin_allow[1].to_string(), "::1/128");
    }

    #[test]
    fn full_configuration() {
        let c = parse(
            r#"{"role":"traffic","drain_timeout":"2m","min_drain":"500ms","lb_buffer":"0s",
                "tick":"50ms","draining_lb_status":404,"admin_allow":["10.0.0.0/8","fd00::/8","192.0.2.7"],
                "admin_token":"abcdefghijklmnop","close_after":"lb_observed_down","lb_fall":3,
                "lb_down_timeout":"30s"}"#,
        )
        .unwrap();
        assert_eq!(c.role, Role::Traffic);
        assert_eq!(
            (
                c.drain_timeout_ms,
                c.min_drain_ms,
                c.lb_buffer_ms,
                c.tick_ms
            ),
            (120_000, 500, 0, 50)
        );
        assert_eq!(c.draining_lb_status, 404);
        assert_eq!(c.admin_tokens, vec!["abcdefghijklmnop".to_string()]);
        let two =
            parse(r#"{"role":"health","admin_token":["abcdefghijklmnop","qrstuvwxyz012345"]}"#)
                .unwrap();
        assert_eq!(two.admin_tokens.len(), 2);
        assert_eq!(
            (c.close_after, c.lb_fall, c.lb_down_timeout_ms),
            (CloseAfter::LbObservedDown, 3, 30_000)
        );
        assert_eq!(c.admin_allow.len(), 3);
        assert_eq!(c.admin_allow[2].to_string(), "192.0.2.7/32");
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            ("", "(configuration)"),
            ("[]", "(configuration)"),
            (r#"{}"#, "role"),
            (r#"{"role":"both"}"#, "role"),
            (r#"{"role":"health","drain_timeot":"1s"}"#, "drain_timeot"),
            (
                r#"{"role":"health","drain_timeout":"12x"}"#,
                "drain_timeout",
            ),
            (r#"{"role":"health","drain_timeout":120}"#, "drain_timeout"),
            (r#"{"role":"health","drain_timeout":"0s"}"#, "drain_timeout"),
            (r#"{"role":"health","min_drain":"-1s"}"#, "min_drain"),
            (r#"{"role":"health","min_drain":"3m"}"#, "min_drain"),
            (r#"{"role":"health","lb_buffer":"2h"}"#, "lb_buffer"),
            (r#"{"role":"health","tick":"1ms"}"#, "tick"),
            (r#"{"role":"health","tick":"11s"}"#, "tick"),
            (
                r#"{"role":"health","draining_lb_status":503}"#,
                "draining_lb_status",
            ),
            (
                r#"{"role":"health","draining_lb_status":"200"}"#,
                "draining_lb_status",
            ),
            (
                r#"{"role":"health","admin_allow":"127.0.0.1"}"#,
                "admin_allow",
            ),
            (
                r#"{"role":"health","admin_allow":["127.0.0.0/33"]}"#,
                "admin_allow",
            ),
            (
                r#"{"role":"health","admin_allow":["localhost"]}"#,
                "admin_allow",
            ),
            (r#"{"role":"health","admin_allow":[8]}"#, "admin_allow"),
            (r#"{"role":"health","admin_token":"short"}"#, "admin_token"),
            (
                r#"{"role":"health","admin_token":"has spaces in the token"}"#,
                "admin_token",
            ),
            (r#"{"role":"health","admin_token":7}"#, "admin_token"),
            (r#"{"role":"health","admin_token":[]}"#, "admin_token"),
            (
                r#"{"role":"health","admin_token":["abcdefghijklmnopq",3]}"#,
                "admin_token",
            ),
            (
                r#"{"role":"health","admin_token":["abcdefghijklmnopq","short"]}"#,
                "admin_token",
            ),
            (
                r#"{"role":"health","close_after":"lb_down"}"#,
                "close_after",
            ),
            (r#"{"role":"health","lb_fall":0}"#, "lb_fall"),
            (r#"{"role":"health","lb_checkers":[]}"#, "lb_checkers"),
            (r#"{"role":"health","lb_checkers":["10.0.0.300/32"]}"#, "lb_checkers"),
            (r#"{"role":"health","lb_checkers":"10.0.0.0/8"}"#, "lb_checkers"),
            (r#"{"role":"health","soft_drain_gate":"yes"}"#, "soft_drain_gate"),
            (r#"{"role":"health","lb_fall":2.5}"#, "lb_fall"),
            (
                r#"{"role":"health","lb_down_timeout":"0s"}"#,
                "lb_down_timeout",
            ),
        ];
        for (input, key) in cases {
            let e = parse(input).unwrap_err();
            assert_eq!(e.key, key, "{input} -> {e}");
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn lb_checkers_and_the_soft_drain_gate() {
        let c = parse(r#"{"role":"health"}"#).unwrap();
        assert!(c.is_checker("203.0.113.9".parse().unwrap()), "default: any source");
        assert!(!c.plan().lb_gate, "200 while draining: nothing to gate");
        let c = parse(r#"{"role":"health","draining_lb_status":404,"lb_checkers":["10.1.0.0/16","::1/128"]}"#).unwrap();
        assert!(c.is_checker("10.1.2.3".parse().unwrap()));
        assert!(c.is_checker("::1".parse().unwrap()));
        assert!(!c.is_checker("10.2.0.1".parse().unwrap()));
        assert!(c.plan().lb_gate, "404 gates by default");
        let c = parse(r#"{"role":"health","draining_lb_status":404,"soft_drain_gate":false}"#).unwrap();
        assert!(!c.plan().lb_gate);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("0s"), Ok(0));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        for bad in [
            "",
            "s",
            "10",
            "1.5s",
            "10 s",
            "+1s",
            "99999999999999s",
            "1sec",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad}");
        }
        assert_eq!(format_duration_ms(120_000), "2m");
        assert_eq!(format_duration_ms(10_000), "10s");
        assert_eq!(format_duration_ms(1_500), "1500ms");
        assert_eq!(format_duration_ms(0), "0s");
    }

    #[test]
    fn cidr_matching() {
        let lo = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(lo.contains("127.0.0.2".parse().unwrap()));
        assert!(lo.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!lo.contains("128.0.0.1".parse().unwrap()));
        assert!(!lo.contains("::1".parse().unwrap()));
        let one = Cidr::parse("127.0.0.1/32").unwrap();
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
    }
}
