//! Health-check answers: the LB check, readiness and liveness for a state,
//! with their caching headers and `If-None-Match`. Pure.

use serde::Serialize;

use super::reply::{Reply, TEXT};
use crate::config::Health;
use crate::fsm::State;
use crate::placeholder::Action;

const HEALTH_CACHE: &str = "max-age=1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// `/health_check.html`: the external load balancer.
    Lb,
    /// `/health`: Kubernetes readiness.
    Readiness,
    /// `/live`: Kubernetes liveness.
    Liveness,
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
pub fn check(audience: Audience, state: State, cfg: &Health, if_none_match: Option<&str>) -> Reply {
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

/// `/drain/status` names what the gateway waits for before it is announced:
/// a traffic role to register in this `vm_id`, ...
pub const WAITING_FOR_TRAFFIC: &str = "traffic_role";
/// ... or a traffic filter's own configuration (a placeholder runs in its place).
pub const WAITING_FOR_FILTER: &str = "filter_config";

/// What the gateway waits for before it is announced, if anything (the
/// placeholders' `action`: see `crate::placeholder`).
pub fn waiting_for(traffic_seen: bool, placeholders: Action) -> Option<&'static str> {
    if !traffic_seen {
        Some(WAITING_FOR_TRAFFIC)
    } else if placeholders == Action::KeepOut {
        Some(WAITING_FOR_FILTER)
    } else {
        None
    }
}

#[derive(Serialize)]
struct Waiting {
    state: State,
    ready: bool,
    waiting_for: &'static str,
}

/// A health check while the gateway waits for `waiting_for` (see
/// [`waiting_for`]): it does not count its streams yet, or a filter of its
/// listeners runs without its configuration, so neither the LB nor
/// Kubernetes may send it any (LB check and readiness 503; liveness as
/// usual, so that the pod is not restarted for it).
pub fn check_waiting(
    audience: Audience,
    state: State,
    cfg: &Health,
    if_none_match: Option<&str>,
    waiting_for: &'static str,
) -> Reply {
    let reply = match audience {
        Audience::Liveness => return check(audience, state, cfg, if_none_match),
        Audience::Lb => Reply::new(WAITING_STATUS, TEXT, b"WAIT\n".to_vec()),
        Audience::Readiness => Reply::json(
            WAITING_STATUS,
            &Waiting {
                state,
                ready: false,
                waiting_for,
            },
        ),
    };
    reply
        .with("cache-control", HEALTH_CACHE)
        .with("etag", etag(state, WAITING_STATUS))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::api::reply::tests::{body, header};
    use crate::api::tests::cfg;

    #[test]
    fn health_answers_follow_the_state_table() {
        let c = cfg();
        for &s in State::ALL {
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
    fn waiting_answers_503_to_lb_and_readiness_naming_what_it_waits_for() {
        let c = cfg();
        for what in [WAITING_FOR_TRAFFIC, WAITING_FOR_FILTER] {
            let lb = check_waiting(Audience::Lb, State::Open, &c, Some("\"open-200\""), what);
            assert_eq!((lb.status, lb.body.as_slice()), (503, b"WAIT\n".as_slice()));
            assert_ne!(header(&lb, "etag"), Some("\"open-200\""));
            let ready = check_waiting(Audience::Readiness, State::Open, &c, None, what);
            assert_eq!(ready.status, 503);
            assert_eq!(
                body(&ready),
                serde_json::json!({"state":"OPEN","ready":false,"waiting_for":what})
            );
            let live = check_waiting(Audience::Liveness, State::Open, &c, None, what);
            assert_eq!(live, check(Audience::Liveness, State::Open, &c, None));
        }
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
