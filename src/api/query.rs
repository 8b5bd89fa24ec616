//! The query string of a health-listener request: which parameters each
//! endpoint takes and how they are spelled. Pure.
//!
//! Rules (the same in `openapi.yaml` and the README):
//! - each endpoint takes only its own parameters (`/drain`: `wait`, `timeout`,
//!   `hold`; `/prestop`: `timeout`; `/reopen`: `force`; every other endpoint
//!   none); anything else is a 400 that says what the endpoint takes;
//! - a parameter given twice is a 400 naming it (never "last one wins");
//! - names and values are percent-decoded (`timeout=%31s` is `timeout=1s`);
//!   a malformed escape (`%`, `%4`, `%zz`) is a 400. `+` is not a space.
//!
//! No error message repeats request input: an unknown name is described, not
//! quoted; only the names drain-gate itself defines are named.

use super::reply::{bad_request, Reply};
use crate::duration;

/// Every query parameter any endpoint takes.
const NAMES: [&str; 4] = ["wait", "timeout", "hold", "force"];

/// The parameters of one request, as given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// `wait=closed` was given.
    pub wait: bool,
    pub timeout_ms: Option<u64>,
    /// `hold=closing` was given: a maintenance drain that stays in CLOSING.
    pub hold: bool,
    /// `force=true` was given: reopen through an active preStop hold.
    pub force: bool,
}

impl Params {
    /// Parses `query` (without the `?`) for an endpoint that takes `takes`.
    pub fn parse(query: &str, takes: &[&str]) -> Result<Params, Reply> {
        let mut p = Params::default();
        let mut given: Vec<&str> = Vec::new();
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode(k)?, decode(v)?);
            let known = NAMES.iter().copied().find(|n| n.as_bytes() == k);
            let Some(name) = known.filter(|n| takes.contains(n)) else {
                return Err(not_taken(known, takes));
            };
            if given.contains(&name) {
                return Err(bad_request(&format!(
                    "{name}: given more than once; give each query parameter once"
                )));
            }
            given.push(name);
            p.set(name, &v)?;
        }
        Ok(p)
    }

    fn set(&mut self, name: &str, value: &[u8]) -> Result<(), Reply> {
        let (flag, only) = match name {
            "wait" => (&mut self.wait, "closed"),
            "hold" => (&mut self.hold, "closing"),
            "force" => (&mut self.force, "true"),
            _ => {
                let ms = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| duration::parse_ms(v).ok());
                let Some(ms) = ms.filter(|ms| (1..=duration::MAX_MS).contains(ms)) else {
                    return Err(bad_request(&format!(
                        "timeout: expected a duration from 1ms to {}, e.g. 90s",
                        duration::format_ms(duration::MAX_MS)
                    )));
                };
                self.timeout_ms = Some(ms);
                return Ok(());
            }
        };
        if value != only.as_bytes() {
            return Err(bad_request(&format!(
                "{name}: the only value is \"{only}\""
            )));
        }
        *flag = true;
        Ok(())
    }
}

/// 400 for a parameter the endpoint does not take (`known`: one another
/// endpoint takes), saying what it takes: "no query parameters", "wait, timeout".
fn not_taken(known: Option<&str>, takes: &[&str]) -> Reply {
    let given = match known {
        Some(name) => format!("{name}: not a parameter of this endpoint, which"),
        None => "unknown query parameter; this endpoint".to_string(),
    };
    let takes = match takes {
        [] => "no query parameters".to_string(),
        _ => crate::config::listed(takes),
    };
    bad_request(&format!("{given} takes {takes}"))
}

/// Percent-decodes one name or value (RFC 3986 `%HH`); `+` stays `+`.
pub fn decode(s: &str) -> Result<Vec<u8>, Reply> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        out.push(match b {
            b'%' => hex(bytes.next())? << 4 | hex(bytes.next())?,
            _ => b,
        });
    }
    Ok(out)
}

/// One hex digit of a percent-escape.
fn hex(b: Option<u8>) -> Result<u8, Reply> {
    let digit = b.and_then(|b| char::from(b).to_digit(16));
    digit
        .map(|d| d as u8)
        .ok_or_else(|| bad_request("malformed percent-escape in the query (expected %HH)"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::api::reply::tests::body;

    const DRAIN: &[&str] = &["wait", "timeout"];

    fn message(query: &str, takes: &[&str]) -> String {
        let r = Params::parse(query, takes).unwrap_err();
        assert_eq!(r.status, 400, "{query}");
        body(&r)["message"].as_str().unwrap().to_string()
    }

    #[test]
    fn each_endpoint_names_what_it_takes() {
        assert_eq!(
            message("a", &[]),
            "unknown query parameter; this endpoint takes no query parameters"
        );
        assert_eq!(
            message("x=1", DRAIN),
            "unknown query parameter; this endpoint takes wait, timeout"
        );
        assert_eq!(
            message("timeout=1s", &[]),
            "timeout: not a parameter of this endpoint, which takes no query parameters"
        );
        assert_eq!(
            message("wait=closed", &["timeout"]),
            "wait: not a parameter of this endpoint, which takes timeout"
        );
    }

    #[test]
    fn a_parameter_given_twice_is_refused_by_name() {
        assert_eq!(
            message("timeout=1s&timeout=3s", DRAIN),
            "timeout: given more than once; give each query parameter once"
        );
        assert_eq!(
            message("wait=closed&timeout=1s&wait=closed", DRAIN),
            "wait: given more than once; give each query parameter once"
        );
        // Spelled differently, still the same parameter.
        assert!(message("timeout=1s&%74imeout=1s", DRAIN).starts_with("timeout: given more"));
    }

    #[test]
    fn names_and_values_are_percent_decoded() {
        let p = Params::parse("%77ait=%63losed&timeout=%31s", DRAIN).unwrap();
        assert_eq!(
            p,
            Params {
                wait: true,
                timeout_ms: Some(1_000),
                ..Params::default()
            }
        );
        assert_eq!(decode("a%2Fb%2fc").unwrap(), b"a/b/c");
        assert_eq!(decode("1+s").unwrap(), b"1+s");
        for bad in ["%", "%4", "%zz", "timeout=%3", "%g0"] {
            assert_eq!(
                message(bad, DRAIN),
                "malformed percent-escape in the query (expected %HH)",
                "{bad}"
            );
        }
        // Bytes that decode to no UTF-8 are simply not a duration.
        assert!(message("timeout=%ff", DRAIN).starts_with("timeout: expected a duration"));
    }

    #[test]
    fn a_flag_takes_its_one_value() {
        assert_eq!(
            message("wait=open", DRAIN),
            "wait: the only value is \"closed\""
        );
        assert_eq!(
            message("hold=1", &["hold"]),
            "hold: the only value is \"closing\""
        );
        assert_eq!(
            message("force=1", &["force"]),
            "force: the only value is \"true\""
        );
        assert!(message("timeout=0s", DRAIN)
            .starts_with("timeout: expected a duration from 1ms to 60m"));
    }

    #[test]
    fn empty_pieces_are_ignored() {
        assert_eq!(Params::parse("&&", &[]).unwrap(), Params::default());
        assert_eq!(Params::parse("", &[]).unwrap(), Params::default());
    }
}
