//! The status document (`GET /drain/status`, the answer to a transition) and
//! the final answer of a held `wait=closed`. Pure.

use serde::Serialize;

use crate::api::reply::Reply;
use crate::config;
use crate::gate::clock::{rfc3339, Now, Steps};
use crate::gate::count::CountReading;
use crate::gate::fsm::{Record, State};
use crate::gate::lb::{Checkers, Detection, Gate, Wait};
use crate::gate::liveness::{Judging, Registry};
use crate::gate::refusal::NewRequests;
use crate::gate::rotation;
use crate::gate::{answer, placeholder};
use crate::instruments::in_flight::InFlight;
use crate::instruments::receipt::Tally;
use crate::instruments::sizing::{self, Durations};
use crate::json::object;

/// Everything a status answer shows.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub rec: &'a Record,
    /// The time, and which clock the timers run on (`Now::timers`).
    pub now: Now,
    /// The wall-clock steps seen so far.
    pub steps: Steps,
    /// Every worker's streams in flight by age, as of their last tick, set
    /// beside the count (`InFlight::beside_count`).
    pub in_flight: InFlight,
    /// The active count, and how it is kept: `gauge` (a live Envoy gauge)
    /// or `shared_data` (the stats configuration dropped the gauge, so the
    /// count lives in shared data).
    pub count: CountReading,
    pub count_source: &'static str,
    /// The traffic roles of this `vm_id` (`crate::gate::liveness`): the
    /// registry of traffic roots, and how the health role's judging ran.
    pub registry: &'a Registry,
    pub watch: Judging,
    /// The placeholders: traffic filters without their own configuration
    /// (`crate::gate::placeholder`).
    pub placeholders: &'a placeholder::Placeholders,
    /// The health role's configuration: how the LB is answered and watched,
    /// where connections are rotated, how new requests are refused, and the
    /// advice's grace period.
    pub config: &'a config::Health,
    pub checkers: &'a Checkers,
    /// Checks answered from sources outside `lb_checkers` (the counter).
    pub ignored_checks: u64,
    /// The last drain's connection rotation, if one was called.
    pub rotation: Option<&'a rotation::Record>,
    /// What drain-gate keeps in the process, for an operator to see it
    /// bounded: the metric definitions of the VM that answered (one set per
    /// VM), and the shared-data keys created in this process.
    pub metric_definitions: u64,
    pub shared_keys: u64,
    /// What the current (or last) drain counted, as the traffic roots added
    /// it at their ticks (`crate::instruments::receipt`).
    pub receipt: Tally,
    /// How long streams lasted since the process started (`crate::instruments::sizing`).
    pub durations: Durations,
}

/// The status document; `wait` names how a held wait ended (`closed`), and
/// is left out of `GET /drain/status`.
fn document<'a>(v: &'a View<'a>, wait: Option<&'static str>) -> impl Serialize + 'a {
    let (r, c) = (v.rec, v.config);
    let lb_wait = c.lb_wait();
    let now = v.now.timer_ms();
    // How long ago a time of the timers' clock was, and that time on the wall clock.
    let age = |t: u64| now.saturating_sub(t);
    let shown = |t: u64| rfc3339(v.now.wall_ms.saturating_sub(age(t)));
    let announced = v.checkers.announced_ms.is_some();
    let (n, serving) = (v.placeholders.present(), v.placeholders.serving());
    let placeholders = placeholder::action(n, serving, announced, r.state);
    let answers = answer::verdict(r.state, v.registry.seen, placeholders, c.draining_lb_status);
    let draining = r.state == State::Draining;
    let started = r.drain_started_timer_ms();
    let since = started.unwrap_or(0);
    let (f, t) = (&v.in_flight, &v.receipt);
    object!(Status {
        state: r.state,
        ready: answers.ready,
        live: answers.live,
        lb_status: answers.lb_status,
        active: v.count.active,
        count: object!(Count {
            source: v.count_source,
            // False once a stream could not be counted, a traffic VM was lost
            // or the traffic filter went away: the drain then waits for
            // `drain_timeout` instead of trusting a zero.
            reliable: v.count.reliable,
            // The two parts of `active`: HTTP streams (`traffic` role) and
            // TCP connections (`traffic_tcp` role).
            http_streams: v.count.streams,
            tcp_connections: v.count.connections,
            // Why it is not reliable (`crate::gate::liveness::Unreliable`),
            // `null` when it is.
            unreliable_reason: v.count.why.map(|w| w.name()),
        }),
        waiting_for: answers.waiting_for,
        traffic: object!(Traffic {
            // A traffic root has registered at least once.
            seen: v.registry.seen,
            // Traffic root contexts registered now (one per worker VM, and
            // one in the main thread's, per filter configuration).
            roots: v.registry.roots.len(),
            // Traffic root contexts silent without a goodbye now (not back).
            lost: (v.registry.lost.len() as u64).saturating_add(v.registry.dropped_lost),
            // Ever declared lost, and of those, back (they beat again: late, not dead).
            lost_total: v.registry.lost_total,
            back_total: v.registry.back_total,
            // Registrations refused (more traffic roots than drain-gate watches).
            refused: v.registry.refused,
            // Times the health role itself did not run for long (the process
            // stalled), and the longest such gap.
            stalls: v.watch.stalls,
            longest_stall_ms: v.watch.longest_stall_ms,
            // Placeholders running now, and of those, the ones that passed a
            // request on.
            placeholders: n,
            placeholders_serving: serving,
        }),
        // Every worker's streams in flight by age, and how old that list is.
        in_flight: object!(InFlight {
            oldest_age_ms: f.oldest_age_ms,
            ages: f.ages,
            // When the list was true (`null`: no worker's summary, and no count of 0).
            as_of: f.as_of_ms.map(shown),
            age_ms: f.as_of_ms.map(age),
            // Some listed streams have ended since `as_of`: the count is below the list.
            older_than_count: f.older_than_count,
        }),
        // The drain's timeline: reason, timestamps, the plan it runs and its
        // last transitions.
        progress: object!(Progress {
            reason: r.reason.name(),
            forced: r.forced,
            since: rfc3339(r.since_ms),
            drain_started_at: r.drain_started_ms.map(rfc3339),
            closing_at: r.closing_ms.map(rfc3339),
            closed_at: r.closed_ms.map(rfc3339),
            drain_duration_ms: r.drain_duration_ms(v.now),
            active_at_closing: r.active_at_closing,
            min_drain_ms: r.plan.map(|p| p.min_drain_ms),
            drain_timeout_ms: r.plan.map(|p| p.drain_timeout_ms),
            lb_buffer_ms: r.plan.map(|p| p.lb_buffer_ms),
            // A maintenance drain: CLOSING lasts until `/reopen` or `/close`.
            hold_closing: r.holds_closing(),
            // Until when an active preStop hold refuses `/reopen` (renewed while held).
            prestop_hold_until: r.active_hold(v.now).map(|h| rfc3339(h.until_ms())),
            transitions: r
                .history
                .iter()
                .map(|s| object!(Step {
                    from: s.from,
                    to: s.to,
                    reason: s.reason.name(),
                    at: rfc3339(s.at_ms),
                    active: s.active,
                }))
                .collect::<Vec<_>>(),
        }),
        // What each LB checker has been answered, and whether the LB saw the
        // drain. The record keeps timer-clock times; they are shown on the
        // wall clock.
        lb: object!(Lb {
            close_after: c.close_after,
            lb_fall: c.lb_fall,
            observed_down: v.checkers.all_down(now, c.lb_fall),
            observed_down_at: v.checkers.down_since(now, c.lb_fall).map(shown),
            // DRAINING: at least one live checker, and every one has been
            // served a 404 since the drain began. Never true when no checker asked.
            saw_drain: draining && v.checkers.gate(since, now, false) == Gate::Open,
            // A gated soft drain: what its active = 0 flip waits for (`null`
            // when no gated drain is running).
            gate: r
                .plan
                .filter(|p| p.lb_gate && draining)
                .map(|p| v.checkers.gate(since, now, p.lb_gate_needs_checker)),
            // Checkers that asked within the last 30 s.
            live_checkers: v.checkers.live(now).count(),
            // Since the drain began (`null`: no drain yet), has any LB check
            // reached this gateway? False longer than a check interval: the
            // LB's checks of its node reach another pod, and never see this
            // one's 503.
            checked_in_drain: started.map(|t| v.checkers.checked_since(t)),
            checkers: v
                .checkers
                .list
                .iter()
                .map(|c| object!(Checker {
                    source: &c.source,
                    consecutive_non_200: c.consecutive_non_200,
                    consecutive_503: c.consecutive_503,
                    last_seen: shown(c.last_seen_ms),
                    last_404: c.last_404_ms.map(shown),
                    // Its check interval, measured from the gaps between its checks.
                    check_interval: c.interval(),
                }))
                .collect::<Vec<_>>(),
            // `null` until a live checker's interval is measured.
            detection: v.checkers.detection(now, c.lb_fall, lb_wait).map(detection),
            // Checks from sources outside `lb_checkers`; `count`: answered but
            // not recorded, since the process started.
            ignored_checks: object!(Ignored {
                count: v.ignored_checks,
                last_source: v.checkers.ignored.as_ref().map(|i| i.source.as_str()),
                last_source_since: v.checkers.ignored.as_ref().map(|i| shown(i.since_ms)),
            }),
        }),
        connection_rotation: object!(Rotation {
            enabled: c.rotate_connections.is_some(),
            cluster: c.rotate_connections.as_deref(),
            admin_path: rotation::ADMIN_PATH,
            last: v.rotation.map(|r| {
                object!(RotationLast {
                    drain_started_at: rfc3339(r.drain_started_ms),
                    // What made it due: `soft_drain_gate` (the LB stopped
                    // sending here), `flip` or `refusing`.
                    trigger: r.trigger,
                    outcome: r.outcome,
                    requested_at: r.requested_ms.map(rfc3339),
                    answered_at: r.answered_ms.map(rfc3339),
                    admin_status: r.admin_status,
                    error: r.error.as_deref(),
                })
            }),
        }),
        clock: object!(Clock {
            timers: v.now.timers(),
            steps: v.steps.count,
            last_step_ms: v.steps.last_step_ms,
            last_step_at: v.steps.last_step_wall_ms.map(rfc3339),
        }),
        // What drain-gate keeps in the process, for an operator to see it bounded.
        footprint: object!(Footprint {
            metric_definitions: v.metric_definitions,
            shared_keys: v.shared_keys,
        }),
        // Streams and connections the current (or last) drain cut (`receipt` has the rest).
        cut: t.cut,
        // The current (or last) drain's receipt.
        receipt: object!(Receipt {
            // The drain these count (`null` before the first).
            drain_started_at: r.drain_started_ms.map(rfc3339),
            cut: t.cut,
            cut_http: t.cut.saturating_sub(t.cut_tcp),
            cut_tcp: t.cut_tcp,
            // Cut by the LB at its DOWN (`crate::gate::lb::Checkers::cut_by_lb`).
            cut_lb: t.cut_lb,
            // Every other cut: a client that gave up by itself (or an LB whose
            // checks drain-gate does not see).
            cut_other: t.cut.saturating_sub(t.cut_lb),
            completed: t.completed,
            // `completed` counts the completed ends up to this moment: the
            // oldest of the workers' last ticks (each counts its own at its tick).
            completed_as_of: f.ticked_ms.map(shown),
            completed_age_ms: f.ticked_ms.map(age),
            ended_upstream: t.ended_upstream,
            refused: t.refused,
        }),
        refusing: object!(Refusing {
            // `draining_new_requests`: `serve` or `refuse`.
            mode: c.shared.draining_new_requests.name(),
            // `refused_requests`: which requests (gRPC apart) are refused.
            requests: c.shared.refusal.requests.name(),
            // `draining_grpc_requests`: gRPC requests `serve`d or `refuse`d too.
            grpc: c.shared.refusal.grpc.name(),
            // `refuse_with`: `response` (the 503) or `reset`.
            refuse_with: c.shared.refusal.with.name(),
            // New requests are being refused now (refuse mode, and a drain running).
            active: c.shared.draining_new_requests == NewRequests::Refuse && r.state != State::Open,
            // Requests refused in the current (or last) drain.
            this_drain: t.refused,
        }),
        durations: v.durations,
        advice: sizing::advise(&v.durations, c.max_closing_ms(), c.scrape_interval_ms),
        #[serde(
            skip_serializing_if = "crate::json::Absent::absent",
            bound = "wait: Serialize + crate::json::Absent"
        )]
        wait: wait,
    })
}

/// The LB's detection of the flip as measured, beside what CLOSING waits.
fn detection(d: Detection<'_>) -> impl Serialize + '_ {
    let (checker, interval_ms, lb_fall) = (d.checker, d.interval_ms, d.lb_fall);
    let (detection_ms, short_ms, Wait { name, ms }) = (d.detection_ms, d.short_ms, d.wait);
    object!(Detection {
        // The live checker with the longest measured interval.
        checker: d.checker,
        check_interval_ms: d.interval_ms,
        lb_fall: d.lb_fall,
        // `lb_fall` × `check_interval_ms`: the LB's DOWN after the flip, at the latest.
        detection_ms: d.detection_ms,
        // `lb_buffer`, or `lb_down_timeout` with `close_after: lb_observed_down`.
        wait: d.wait.name,
        wait_ms: d.wait.ms,
        // How much `wait_ms` falls short of `detection_ms` (0: it covers it).
        short_ms: d.short_ms,
        // Set when it falls short: what that means.
        warning: (d.short_ms > 0).then(|| {
            format!(
                "{name} ({ms} ms) is {short_ms} ms shorter than the LB's detection: lb_fall \
                 {lb_fall} × the {interval_ms} ms between checks measured from {checker} = \
                 {detection_ms} ms; CLOSED, and the pod's exit, may come before the LB marks the \
                 gateway DOWN: raise {name} above {detection_ms} ms"
            )
        }),
    })
}

/// How a held `wait=closed` ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    Closed,
    /// The drain was abandoned (reopen or fault) while waiting.
    Aborted,
    /// The gateway was in FAULT when the wait was asked for: there is no
    /// drain to wait for, and none can start.
    InFault,
    TimedOut,
}

/// Whether a held wait is over: CLOSED ends it (once `lingering` is over:
/// `scrape_interval` after CLOSED, or at its deadline), leaving the drain
/// aborts it, the deadline times it out.
pub fn wait_end(state: State, timed_out: bool, lingering: bool) -> Option<WaitEnd> {
    match state {
        State::Closed if lingering && !timed_out => None,
        State::Closed => Some(WaitEnd::Closed),
        State::Open | State::Fault => Some(WaitEnd::Aborted),
        State::Draining | State::Closing if timed_out => Some(WaitEnd::TimedOut),
        State::Draining | State::Closing => None,
    }
}

/// `GET /drain/status` and the answer to a successful transition (`end`:
/// `None`), or the final answer of a held wait: at CLOSED the status with
/// `wait: "closed"`; an abort or a timeout a small error (whatever the number
/// of LB checkers) naming the state it ended in — `GET /drain/status` has the
/// rest.
pub fn status(v: &View, end: Option<WaitEnd>) -> Reply {
    let (code, error, wait, message) = match end {
        Some(WaitEnd::Aborted) => (409, "drain_aborted", "aborted", ABORTED),
        Some(WaitEnd::InFault) => (409, "in_fault", "fault", IN_FAULT),
        Some(WaitEnd::TimedOut) => (504, "wait_timeout", "timeout", TIMED_OUT),
        // `None` (the status) or `Closed` (the status with `wait: "closed"`).
        _ => return Reply::json(200, &document(v, end.map(|_| "closed"))),
    };
    let body = object!(WaitError {
        error: error,
        message: message,
        state: v.rec.state,
        active: v.count.active,
        wait: wait,
    });
    Reply::json(code, &body)
}

const ABORTED: &str =
    "the drain was abandoned (reopen or fault) before CLOSED; see GET /drain/status";
const IN_FAULT: &str = "the gateway is in FAULT: no drain was started and none can be; FAULT ends \
    only with a restart of istio-proxy";
const TIMED_OUT: &str = "not CLOSED within the timeout; the drain goes on; see GET /drain/status";

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::api::reply::tests::body;
    use crate::instruments::in_flight::Histogram;

    fn status(v: &View) -> Reply {
        super::status(v, None)
    }

    fn wait_reply(end: WaitEnd, v: &View) -> Reply {
        super::status(v, Some(end))
    }

    /// Calls `f` with a status view of an OPEN gateway: 3 in flight, a clock step seen.
    fn sample<R>(f: impl FnOnce(View) -> R) -> R {
        let checkers = Checkers::default();
        let rec = Record::new(1_764_000_000_000);
        let config = config::Health {
            rotate_connections: None,
            ..config::Health::default()
        };
        let mut registry = Registry::default();
        for _ in 0..2 {
            registry.announce(100, 1_764_000_000_000);
        }
        let v = View {
            rec: &rec,
            now: Now {
                wall_ms: 1_764_000_000_500,
                mono_ms: Some(1_764_000_000_500),
            },
            steps: Steps {
                offset_ms: Some(5),
                count: 2,
                last_step_ms: Some(-3_600_000),
                last_step_wall_ms: Some(1_764_000_000_000),
            },
            in_flight: InFlight {
                oldest_age_ms: Some(2_300),
                ages: Histogram {
                    lt_1s: 2,
                    lt_10s: 1,
                    ..Histogram::default()
                },
                as_of_ms: Some(1_764_000_000_420),
                older_than_count: false,
                ticked_ms: Some(1_764_000_000_400),
            },
            count: CountReading {
                active: 3,
                streams: 2,
                connections: 1,
                reliable: true,
                why: None,
            },
            count_source: "gauge",
            registry: &registry,
            watch: Judging::default(),
            placeholders: &placeholder::Placeholders::default(),
            config: &config,
            checkers: &checkers,
            ignored_checks: 0,
            rotation: None,
            metric_definitions: 0,
            shared_keys: 0,
            receipt: Tally::default(),
            durations: Durations::default(),
        };
        f(v)
    }

    #[test]
    fn status_and_wait_bodies() {
        sample(|v| {
            let s = body(&status(&v));
            assert_eq!(s["state"], "OPEN");
            assert_eq!(s["active"], 3);
            assert_eq!(s["count"]["http_streams"], 2);
            assert_eq!(s["count"]["tcp_connections"], 1);
            assert_eq!(s["ready"], true);
            assert_eq!(s["progress"]["reason"], "start");
            assert_eq!(s["in_flight"]["oldest_age_ms"], 2_300);
            assert_eq!(s["in_flight"]["ages"]["lt_1s"], 2);
            assert_eq!(s["in_flight"]["ages"]["ge_60s"], 0);
            assert_eq!(
                s["clock"],
                serde_json::json!({"timers": "monotonic", "steps": 2, "last_step_ms": -3_600_000,
                                   "last_step_at": "2025-11-24T16:00:00.000Z"})
            );
            assert_eq!(s["progress"]["since"], "2025-11-24T16:00:00.000Z");
            let w = wait_reply(WaitEnd::Closed, &v);
            assert_eq!(
                (w.status, &body(&w)["wait"]),
                (200, &serde_json::json!("closed"))
            );
            assert_eq!(body(&w)["progress"]["reason"], "start");
        })
    }

    #[test]
    fn status_says_how_old_the_in_flight_list_and_the_completed_count_are() {
        sample(|v| {
            let s = body(&status(&v));
            assert_eq!(
                s["in_flight"],
                serde_json::json!({"oldest_age_ms": 2_300, "ages": {"lt_1s": 2, "lt_10s": 1, "lt_60s": 0,
                                   "ge_60s": 0}, "as_of": "2025-11-24T16:00:00.420Z", "age_ms": 80,
                                   "older_than_count": false})
            );
            let r = &s["receipt"];
            assert_eq!(
                (&r["completed_as_of"], &r["completed_age_ms"]),
                (
                    &serde_json::json!("2025-11-24T16:00:00.400Z"),
                    &serde_json::json!(100)
                )
            );
            // The last stream ended after the workers' ticks: the count reads 0.
            let ended = View {
                count: CountReading {
                    active: 0,
                    ..v.count
                },
                in_flight: v.in_flight.beside_count(0, true, v.now.timer_ms()),
                ..v
            };
            let s = body(&status(&ended));
            assert_eq!(
                s["in_flight"],
                serde_json::json!({"oldest_age_ms": null, "ages": {"lt_1s": 0, "lt_10s": 0, "lt_60s": 0,
                                   "ge_60s": 0}, "as_of": "2025-11-24T16:00:00.500Z", "age_ms": 0,
                                   "older_than_count": false})
            );
            assert_eq!(
                s["receipt"]["completed_age_ms"], 100,
                "still as of the ticks"
            );
            let behind = View {
                count: CountReading {
                    active: 2,
                    ..v.count
                },
                in_flight: v.in_flight.beside_count(2, true, v.now.timer_ms()),
                ..v
            };
            let f = &body(&status(&behind))["in_flight"];
            assert_eq!(
                (&f["older_than_count"], &f["age_ms"], &f["ages"]["lt_10s"]),
                (
                    &serde_json::json!(true),
                    &serde_json::json!(80),
                    &serde_json::json!(1)
                )
            );
            let none = body(&status(&View {
                in_flight: InFlight::default(),
                ..v
            }));
            assert!(none["in_flight"]["as_of"].is_null() && none["in_flight"]["age_ms"].is_null());
            assert!(none["receipt"]["completed_as_of"].is_null());
        })
    }

    #[test]
    fn status_shows_the_durations_and_the_advice_they_call_for() {
        sample(|v| {
            let s = body(&status(&v));
            assert_eq!(s["durations"]["http"]["count"], 0);
            assert!(s["durations"]["tcp"]["p99_ms"].is_null());
            assert!(s["advice"]["drain_timeout_s"].is_null());
            assert!(s["advice"]["based_on_ms"].is_null());
            assert_eq!(
                s["advice"]["based_on"],
                "not enough data: 0 HTTP streams measured, 20 needed"
            );
            let mut durations = Durations::default();
            for ms in [250; 20].into_iter().chain([2_000; 4]) {
                durations.record(crate::instruments::sizing::Kind::Http, ms);
            }
            let s = body(&status(&View { durations, ..v }));
            let http = &s["durations"]["http"];
            assert_eq!(
                (http["count"].as_u64(), http["p50_ms"].as_u64()),
                (Some(24), Some(250))
            );
            assert_eq!(
                (http["p99_ms"].as_u64(), http["max_ms"].as_u64()),
                (Some(2_000), Some(2_000))
            );
            assert_eq!(s["advice"]["drain_timeout_s"], 120);
            assert_eq!(s["advice"]["termination_grace_period_s"], 145);
            assert_eq!(s["advice"]["based_on_ms"], 2_000);
            assert_eq!(
                s["advice"]["based_on"],
                "longest of 24 HTTP streams: 2000 ms"
            );
        });
    }

    #[test]
    fn status_shows_the_connection_rotation() {
        sample(|v| {
            let s = body(&status(&v));
            assert_eq!(s["connection_rotation"]["enabled"], false);
            assert!(s["connection_rotation"]["last"].is_null());
            let failed = rotation::Record::pending(
                1_764_000_000_100,
                rotation::Trigger::Flip,
                1_764_000_000_200,
            )
            .answered(Some(404), 1_764_000_000_300);
            let config = config::Health {
                rotate_connections: Some("admin".into()),
                ..v.config.clone()
            };
            let with = View {
                config: &config,
                rotation: Some(&failed),
                ..v
            };
            let r = &body(&status(&with))["connection_rotation"];
            assert_eq!(r["enabled"], true);
            assert_eq!(r["cluster"], "admin");
            assert_eq!(r["last"]["outcome"], "failed");
            assert_eq!(r["last"]["admin_status"], 404);
            assert_eq!(r["last"]["requested_at"], "2025-11-24T16:00:00.200Z");
            assert_eq!(r["last"]["error"], "Envoy admin answered 404");
        })
    }

    #[test]
    fn status_says_it_waits_for_the_traffic_role() {
        sample(|v| {
            let s = body(&status(&v));
            assert_eq!(s["waiting_for"], serde_json::Value::Null);
            let waiting = View {
                registry: &Registry::default(),
                ..v
            };
            let s = body(&status(&waiting));
            assert_eq!(
                (&s["waiting_for"], &s["ready"], &s["lb_status"]),
                (
                    &serde_json::json!("traffic_role"),
                    &serde_json::json!(false),
                    &serde_json::json!(503)
                )
            );
        })
    }

    #[test]
    fn status_says_whether_an_lb_check_reached_the_gateway_in_its_drain() {
        let mut checkers = Checkers::default();
        checkers.observe("10.0.0.1", 200, 1_000, 2);
        let mut rec = Record::new(1_764_000_000_000);
        sample(|v| {
            let lb = |rec: &Record, c: &Checkers| {
                body(&status(&View {
                    rec,
                    checkers: c,
                    ..v
                }))["lb"]["checked_in_drain"]
                    .clone()
            };
            assert_eq!(lb(&rec, &checkers), serde_json::Value::Null, "no drain yet");
            rec.drain_started_ms = Some(1_764_000_000_000);
            rec.drain_started_mono_ms = Some(2_000);
            assert_eq!(
                lb(&rec, &checkers),
                serde_json::json!(false),
                "the node's checks go elsewhere"
            );
            let mut after = checkers.clone();
            after.observe("10.0.0.1", 200, 2_100, 2);
            assert_eq!(lb(&rec, &after), serde_json::json!(true));
        })
    }

    #[test]
    fn status_shows_each_checker_s_interval_and_warns_when_lb_buffer_falls_short() {
        let now = 1_764_000_000_500;
        let mut checkers = Checkers::default();
        for k in (0..=4).rev() {
            checkers.observe("10.0.0.1", 200, now - k * 500, 2);
        }
        checkers.observe("10.0.0.2", 200, now - 1_000, 2);
        checkers.observe("10.0.0.2", 200, now, 2);
        sample(|v| {
            let lb = |lb_buffer_ms| {
                let config = config::Health {
                    lb_buffer_ms,
                    ..v.config.clone()
                };
                body(&status(&View {
                    checkers: &checkers,
                    config: &config,
                    ..v
                }))["lb"]
                    .clone()
            };
            let short = lb(500);
            assert_eq!(
                short["checkers"][0]["check_interval"],
                serde_json::json!({"ms": 500, "gaps": 4, "min_gap_ms": 500, "max_gap_ms": 500})
            );
            assert_eq!(
                short["checkers"][1]["check_interval"],
                serde_json::json!({"ms": null, "gaps": 1, "min_gap_ms": 1_000, "max_gap_ms": 1_000}),
                "one gap: no interval yet"
            );
            let d = &short["detection"];
            assert_eq!(
                (&d["checker"], &d["check_interval_ms"], &d["detection_ms"]),
                (
                    &serde_json::json!("10.0.0.1"),
                    &serde_json::json!(500),
                    &serde_json::json!(1_000)
                )
            );
            assert_eq!(
                (&d["wait"], &d["wait_ms"], &d["short_ms"]),
                (
                    &serde_json::json!("lb_buffer"),
                    &serde_json::json!(500),
                    &serde_json::json!(500)
                )
            );
            assert_eq!(
                d["warning"],
                "lb_buffer (500 ms) is 500 ms shorter than the LB's detection: lb_fall 2 × the \
                 500 ms between checks measured from 10.0.0.1 = 1000 ms; CLOSED, and the pod's \
                 exit, may come before the LB marks the gateway DOWN: raise lb_buffer above 1000 ms"
            );
            let covered = lb(1_000);
            assert_eq!(
                (
                    &covered["detection"]["short_ms"],
                    &covered["detection"]["warning"]
                ),
                (&serde_json::json!(0), &serde_json::Value::Null)
            );
            let none = body(&status(&v))["lb"].clone();
            assert_eq!(none["detection"], serde_json::Value::Null, "no checker");
        })
    }

    #[test]
    fn status_says_a_placeholder_keeps_a_new_gateway_out_and_not_an_announced_one() {
        let mut placeholders = placeholder::Placeholders::default();
        for _ in 0..3 {
            placeholders.register(1_764_000_000_000);
        }
        placeholders.serve(0);
        let mut announced = Checkers::default();
        announced.observe("10.0.0.1", 200, 1_764_000_000_000, 2);
        sample(|v| {
            let new = body(&status(&View {
                placeholders: &placeholders,
                ..v
            }));
            assert_eq!(
                (&new["waiting_for"], &new["ready"], &new["lb_status"]),
                (
                    &serde_json::json!("filter_config"),
                    &serde_json::json!(false),
                    &serde_json::json!(503)
                )
            );
            assert_eq!(
                (
                    &new["traffic"]["placeholders"],
                    &new["traffic"]["placeholders_serving"]
                ),
                (&serde_json::json!(3), &serde_json::json!(1))
            );
            let old = body(&status(&View {
                placeholders: &placeholders,
                checkers: &announced,
                ..v
            }));
            assert_eq!(old["waiting_for"], serde_json::Value::Null);
        })
    }

    #[test]
    fn a_wait_that_ends_without_closed_answers_a_small_error() {
        let mut checkers = Checkers::default();
        for i in 0..32 {
            checkers.observe(&format!("10.0.0.{i}"), 503, 1_764_000_000_000, 2);
        }
        sample(|v| {
            let v = View {
                checkers: &checkers,
                ..v
            };
            assert!(
                status(&v).body.len() > 3_000,
                "the status carries the checkers"
            );
            for (end, code, error, wait) in [
                (WaitEnd::TimedOut, 504, "wait_timeout", "timeout"),
                (WaitEnd::Aborted, 409, "drain_aborted", "aborted"),
                (WaitEnd::InFault, 409, "in_fault", "fault"),
            ] {
                let w = wait_reply(end, &v);
                assert_eq!(w.status, code);
                assert!(w.body.len() < 200, "{}", w.body.len());
                let b = body(&w);
                assert_eq!(
                    (b["error"].as_str(), b["wait"].as_str()),
                    (Some(error), Some(wait))
                );
                assert_eq!(
                    (b["state"].as_str(), b["active"].as_u64()),
                    (Some("OPEN"), Some(3))
                );
                assert_eq!(b.as_object().unwrap().len(), 5);
            }
        })
    }

    #[test]
    fn wait_outcomes() {
        assert_eq!(wait_end(State::Draining, false, false), None);
        assert_eq!(
            wait_end(State::Closing, true, false),
            Some(WaitEnd::TimedOut)
        );
        assert_eq!(wait_end(State::Closed, true, false), Some(WaitEnd::Closed));
        assert_eq!(wait_end(State::Closed, false, true), None, "scraped first");
        assert_eq!(wait_end(State::Closed, true, true), Some(WaitEnd::Closed));
        assert_eq!(wait_end(State::Open, false, false), Some(WaitEnd::Aborted));
        assert_eq!(wait_end(State::Fault, false, false), Some(WaitEnd::Aborted));
    }
}
