//! What the health listener answers each of its audiences — the external LB
//! (`/health_check.html`), Kubernetes readiness (`/health`) and liveness
//! (`/live`) — as one function, [`answer`], of everything that decides it.
//! Pure. A gateway in service answers what its state says (README.md's state
//! table); one not yet announced ([`Verdict::waiting_for`]) answers the LB check 503
//! `WAIT` and readiness 503, whatever the state; a state that could not be
//! read answers every audience 503 (fail closed). An answer that would be 200
//! is 304 to a matching `If-None-Match`.

use serde::Serialize;

use crate::api::reply::{unavailable, Reply, TEXT};
use crate::gate::fsm::State;
use crate::gate::placeholder::Action;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// `/health_check.html`: the external load balancer.
    Lb,
    /// `/health`: Kubernetes readiness.
    Readiness,
    /// `/live`: Kubernetes liveness.
    Liveness,
}

/// Everything that decides a health check's answer, as the shell gathers it.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    pub audience: Audience,
    /// The drain state; `None` when the record could not be read.
    pub state: Option<State>,
    /// A traffic role has registered in this `vm_id` (`crate::gate::liveness`).
    pub traffic_seen: bool,
    /// What the placeholders call for (`crate::gate::placeholder::action`).
    pub placeholders: Action,
    /// The LB check's answer in DRAINING: 200, or 404 (HAProxy soft drain).
    pub draining_lb_status: u16,
    pub if_none_match: Option<&'a str>,
}

/// A health check's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub reply: Reply,
    /// What the LB check of a gateway in service served (a 304 is a 200), for
    /// the LB record (`crate::gate::lb`); `None` for every other answer: a check
    /// answered while the gateway waits is not recorded.
    pub lb_served: Option<u16>,
}

/// What each audience is answered, as the status document reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub ready: bool,
    pub live: bool,
    pub lb_status: u16,
    /// What the gateway waits for before it is announced.
    pub waiting_for: Option<&'static str>,
}

/// What a gateway not announced waits for: a traffic role to register, ...
pub const WAITING_FOR_TRAFFIC: &str = "traffic_role";
/// ... or a traffic filter's own configuration (a placeholder runs instead).
pub const WAITING_FOR_FILTER: &str = "filter_config";

/// What each audience is answered in `state` (the table above), unless the
/// gateway waits before it is announced (the placeholders' `action`: see
/// `crate::gate::placeholder`): then neither the LB nor Kubernetes may send it any.
pub fn verdict(
    state: State,
    traffic_seen: bool,
    placeholders: Action,
    draining_lb_status: u16,
) -> Verdict {
    let waiting_for = match (traffic_seen, placeholders) {
        (false, _) => Some(WAITING_FOR_TRAFFIC),
        (true, Action::KeepOut) => Some(WAITING_FOR_FILTER),
        (true, _) => None,
    };
    Verdict {
        // The endpoint stays until CLOSED; only FAULT asks for a restart.
        ready: !matches!(state, State::Closed | State::Fault) && waiting_for.is_none(),
        live: state != State::Fault,
        // The LB check (`/health_check.html`): in DRAINING 200 (the default)
        // or 404 (HAProxy soft drain).
        lb_status: match state {
            _ if waiting_for.is_some() => 503,
            State::Open => 200,
            State::Draining => draining_lb_status,
            State::Closing | State::Closed | State::Fault => 503,
        },
        waiting_for,
    }
}

/// The JSON body of readiness (`ready`, and `waiting_for` while the gateway
/// waits) and liveness (`live`).
#[derive(Serialize)]
struct Body {
    state: State,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_for: Option<&'static str>,
}

/// The answer to a health check: the only place it is decided.
pub fn answer(i: &Inputs) -> Answer {
    let Some(state) = i.state else {
        return Answer {
            reply: unavailable(),
            lb_served: None,
        };
    };
    let v = verdict(state, i.traffic_seen, i.placeholders, i.draining_lb_status);
    // `waiting_for` goes with readiness only.
    let body = |ready: Option<bool>, live| Body {
        state,
        ready,
        live,
        waiting_for: ready.and(v.waiting_for),
    };
    let reply = match i.audience {
        Audience::Lb => {
            let text: &[u8] = match (v.waiting_for, v.lb_status) {
                (Some(_), _) => b"WAIT\n",
                (None, 200) => b"OK\n",
                (None, _) => b"DRAIN\n",
            };
            Reply::new(v.lb_status, TEXT, text.to_vec())
        }
        Audience::Readiness => {
            Reply::json(if v.ready { 200 } else { 503 }, &body(Some(v.ready), None))
        }
        Audience::Liveness => {
            Reply::json(if v.live { 200 } else { 500 }, &body(None, Some(v.live)))
        }
    };
    let lb_served = (i.audience == Audience::Lb && v.waiting_for.is_none()).then_some(reply.status);
    // The entity tag: changes exactly when the answer does.
    let tag = format!("\"{}-{}\"", state.name().to_ascii_lowercase(), reply.status);
    // Preconditions only apply to answers that would be 2xx (RFC 9110 §13.2.2).
    // `If-None-Match`: a list of tags, weak or strong, or `*`.
    let matches = |t: &str| t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag;
    let listed = |h: &str| h.split(',').map(str::trim).any(matches);
    let not_modified = reply.status == 200 && i.if_none_match.is_some_and(listed);
    let mut reply = reply.with("cache-control", "max-age=1").with("etag", tag);
    if not_modified {
        reply.status = 304;
        reply.body.clear();
        reply.headers.retain(|(name, _)| *name != "content-type");
    }
    Answer { reply, lb_served }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::api::reply::tests::{body, header};
    use crate::api::tests::cfg;
    use crate::config::Health;
    use Audience::{Lb, Liveness, Readiness};
    use State::*;

    /// The answer of a gateway in service (a traffic role counts, no
    /// placeholder keeps it out).
    fn check(audience: Audience, state: State, cfg: &Health, inm: Option<&str>) -> Reply {
        answer(&Inputs {
            audience,
            state: Some(state),
            traffic_seen: true,
            placeholders: Action::None,
            draining_lb_status: cfg.draining_lb_status,
            if_none_match: inm,
        })
        .reply
    }

    fn inputs(audience: Audience, state: State, waiting: &'static str) -> Inputs<'static> {
        Inputs {
            audience,
            state: Some(state),
            traffic_seen: waiting != WAITING_FOR_TRAFFIC,
            placeholders: if waiting == WAITING_FOR_FILTER {
                Action::KeepOut
            } else {
                Action::None
            },
            draining_lb_status: 200,
            if_none_match: None,
        }
    }

    /// Every combination of the inputs, and the whole answer each gets:
    /// status, headers, body, and what the LB record notes.
    #[test]
    fn state_table_matches_the_readme() {
        // A gateway in service: the LB check with `draining_lb_status` 200
        // and 404, readiness, liveness.
        let table = [
            (Open, [200, 200], 200, 200),
            (Draining, [200, 404], 200, 200),
            (Closing, [503, 503], 200, 200),
            (Closed, [503, 503], 503, 200),
            (Fault, [503, 503], 503, 500),
        ];
        // What the gateway waits for, by traffic role seen and placeholders.
        let gathered = [
            (false, Action::None, Some("traffic_role")),
            (false, Action::KeepOut, Some("traffic_role")),
            (false, Action::Drain, Some("traffic_role")),
            (true, Action::KeepOut, Some("filter_config")),
            (true, Action::None, None),
            (true, Action::Drain, None),
        ];
        let mut seen = 0;
        for (state, lbs, ready, live) in table {
            let name = state.name();
            for (traffic_seen, placeholders, waiting) in gathered {
                for (draining_lb_status, lb) in [200, 404].into_iter().zip(lbs) {
                    for audience in [Lb, Readiness, Liveness] {
                        let (status, text) = match (audience, waiting) {
                            (Lb, Some(_)) => (503, "WAIT\n".to_string()),
                            (Lb, None) if lb == 200 => (lb, "OK\n".to_string()),
                            (Lb, None) => (lb, "DRAIN\n".to_string()),
                            (Readiness, Some(w)) => (
                                503,
                                format!(
                                    r#"{{"state":"{name}","ready":false,"waiting_for":"{w}"}}"#
                                ),
                            ),
                            (Readiness, None) => (
                                ready,
                                format!(r#"{{"state":"{name}","ready":{}}}"#, ready == 200),
                            ),
                            (Liveness, _) => (
                                live,
                                format!(r#"{{"state":"{name}","live":{}}}"#, live == 200),
                            ),
                        };
                        let content_type = match audience {
                            Lb => "text/plain; charset=utf-8",
                            _ => "application/json",
                        };
                        let tag = format!("\"{}-{status}\"", name.to_ascii_lowercase());
                        let full = Reply {
                            status,
                            headers: vec![
                                ("content-type", content_type.to_string()),
                                ("cache-control", "max-age=1".to_string()),
                                ("etag", tag.clone()),
                            ],
                            body: text.into_bytes(),
                        };
                        let not_modified = Reply {
                            status: 304,
                            headers: vec![
                                ("cache-control", "max-age=1".to_string()),
                                ("etag", tag.clone()),
                            ],
                            body: Vec::new(),
                        };
                        let lb_served = (audience == Lb && waiting.is_none()).then_some(status);
                        let weak = format!("\"x\", W/{tag}");
                        for (inm, matches) in [
                            (None, false),
                            (Some("\"x\""), false),
                            (Some(tag.as_str()), true),
                            (Some(weak.as_str()), true),
                            (Some("*"), true),
                        ] {
                            let i = Inputs {
                                audience,
                                state: Some(state),
                                traffic_seen,
                                placeholders,
                                draining_lb_status,
                                if_none_match: inm,
                            };
                            let reply = if matches && status == 200 {
                                not_modified.clone()
                            } else {
                                full.clone()
                            };
                            assert_eq!(answer(&i), Answer { reply, lb_served }, "{i:?}");
                            // The record cannot be read: every audience fails closed.
                            let unread = Inputs { state: None, ..i };
                            let got = answer(&unread).reply;
                            assert_eq!(
                                (got.status, header(&got, "etag")),
                                (503, None),
                                "{unread:?}"
                            );
                            assert_eq!(body(&got)["error"], "state_unavailable");
                            assert_eq!(answer(&unread).lb_served, None);
                            seen += 2;
                        }
                    }
                }
            }
        }
        assert_eq!(seen, 5 * 6 * 2 * 3 * 5 * 2, "every combination");
    }

    #[test]
    fn the_status_document_reports_the_answers() {
        for &state in State::ALL {
            for traffic_seen in [false, true] {
                for placeholders in [Action::None, Action::KeepOut, Action::Drain] {
                    for draining_lb_status in [200, 404] {
                        let v = verdict(state, traffic_seen, placeholders, draining_lb_status);
                        let status = |audience| {
                            answer(&Inputs {
                                audience,
                                state: Some(state),
                                traffic_seen,
                                placeholders,
                                draining_lb_status,
                                if_none_match: None,
                            })
                            .reply
                            .status
                        };
                        assert_eq!(v.lb_status, status(Lb));
                        assert_eq!(v.ready, status(Readiness) == 200);
                        assert_eq!(v.live, status(Liveness) == 200);
                        let waits = match (traffic_seen, placeholders) {
                            (false, _) => Some(WAITING_FOR_TRAFFIC),
                            (true, Action::KeepOut) => Some(WAITING_FOR_FILTER),
                            (true, _) => None,
                        };
                        assert_eq!(v.waiting_for, waits, "whatever the state");
                    }
                }
            }
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
    fn waiting_answers_503_to_lb_and_readiness_naming_what_it_waits_for() {
        let c = cfg();
        for what in [WAITING_FOR_TRAFFIC, WAITING_FOR_FILTER] {
            let lb = answer(&Inputs {
                if_none_match: Some("\"open-200\""),
                ..inputs(Audience::Lb, State::Open, what)
            })
            .reply;
            assert_eq!((lb.status, lb.body.as_slice()), (503, b"WAIT\n".as_slice()));
            assert_ne!(header(&lb, "etag"), Some("\"open-200\""));
            let ready = answer(&inputs(Audience::Readiness, State::Open, what)).reply;
            assert_eq!(ready.status, 503);
            assert_eq!(
                body(&ready),
                serde_json::json!({"state":"OPEN","ready":false,"waiting_for":what})
            );
            let live = answer(&inputs(Audience::Liveness, State::Open, what)).reply;
            assert_eq!(live, check(Audience::Liveness, State::Open, &c, None));
        }
    }

    fn waiting_for(traffic_seen: bool, placeholders: Action) -> Option<&'static str> {
        verdict(State::Open, traffic_seen, placeholders, 200).waiting_for
    }

    #[test]
    fn the_traffic_role_comes_first_then_a_placeholder_on_a_gateway_not_announced() {
        assert_eq!(waiting_for(false, Action::None), Some(WAITING_FOR_TRAFFIC));
        assert_eq!(
            waiting_for(false, Action::KeepOut),
            Some(WAITING_FOR_TRAFFIC)
        );
        assert_eq!(waiting_for(true, Action::KeepOut), Some(WAITING_FOR_FILTER));
        assert_eq!(
            waiting_for(true, Action::Drain),
            None,
            "an announced gateway drains"
        );
        assert_eq!(waiting_for(true, Action::None), None);
    }

    #[test]
    fn soft_drain_answers_404_to_the_lb() {
        let c = Health {
            draining_lb_status: 404,
            ..cfg()
        };
        assert_eq!(check(Audience::Lb, State::Draining, &c, None).status, 404);
        assert_eq!(
            check(Audience::Readiness, State::Draining, &c, None).status,
            200
        );
    }
}
