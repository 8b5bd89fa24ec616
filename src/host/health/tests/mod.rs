//! The health role's tests, and the stand-in gateway (a health root and a
//! traffic root in one simulated process) that the traffic role's tests use too.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

#[path = "../../../instruments/receipt/keeper_tests.rs"]
mod receipt;

use super::*;
pub(crate) use crate::api::{self, Reply};
use crate::config;
pub(crate) use crate::config::Config;
pub(crate) use crate::gate::count::Part;
pub(crate) use crate::gate::fsm::{self, State};
pub(crate) use crate::host::logs;
pub(crate) use crate::host::metrics::Metrics;
pub(crate) use crate::host::sim::Sim;
pub(crate) use crate::host::traffic::{Traffic, TrafficStream};
pub(crate) use proxy_wasm::types::Action;
pub(crate) use std::rc::Rc;

pub(crate) const T0: u64 = 1_764_000_000_000;

/// A gateway in one simulated process: a health root and a traffic root
/// (registered by its first tick), both with `extra` configuration.
pub(crate) fn gateway<'a>(sim: &'a Sim, extra: &str) -> (Health<&'a Sim>, Rc<Traffic<&'a Sim>>) {
    let parse = |role: &str| {
        let mut raw: serde_json::Value = serde_json::from_str(extra).unwrap();
        raw["role"] = role.into();
        Config::parse(raw.to_string().as_bytes()).unwrap()
    };
    let (Config::Traffic(shared), Config::Health(config)) = (parse("traffic"), parse("health"))
    else {
        panic!("a traffic and a health role");
    };
    let traffic = Rc::new(Traffic::new(Part::Streams, Metrics::define(sim), &shared));
    crate::gate::liveness::host::ensure_registry(&sim);
    crate::gate::count::announce_traffic(&sim);
    traffic.tick();
    let health = Health::new(config, Metrics::define(sim));
    health.tick();
    (health, traffic)
}

pub(crate) fn call(h: &Health<&Sim>, method: &str, path: &str, ctx: u32) -> Option<Reply> {
    let req = api::Request {
        method,
        path,
        source: Some("127.0.0.1".parse().unwrap()),
        ..api::Request::default()
    };
    h.handle(&req, ctx)
}

pub(crate) fn json(r: &Reply) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap()
}

pub(crate) fn state(h: &Health<&Sim>) -> State {
    h.store.load().unwrap().state
}

/// Both roots tick, `n` times, `ms` apart.
pub(crate) fn ticks(sim: &Sim, h: &Health<&Sim>, t: &Traffic<&Sim>, n: usize, ms: u64) {
    for _ in 0..n {
        sim.advance(ms);
        t.tick();
        h.tick();
    }
}

/// How a stream of these tests ends (what `on_log` reads).
#[derive(Clone, Copy)]
pub(crate) enum How {
    /// Its response ended: the upstream's answer.
    Completed,
    /// Its response ended: Envoy's own answer, with these code details.
    Local(&'static str),
    /// Its response did not end: these response flags.
    Flags(u64),
}

pub(crate) fn end_with(sim: &Sim, mut stream: TrafficStream<&Sim>, how: How) {
    let details = match how {
        How::Completed => "via_upstream",
        How::Local(d) => d,
        How::Flags(flags) => {
            sim.set_flags(flags);
            "via_upstream"
        }
    };
    stream.response(!matches!(how, How::Flags(_)));
    sim.set_property("response.code_details", details.as_bytes());
    stream.log();
    drop(stream);
}

/// `/drain/status`'s receipt once the traffic root's tick added what it
/// sorted to the drain's tally.
pub(crate) fn receipt_after_tick(h: &Health<&Sim>, t: &Traffic<&Sim>) -> serde_json::Value {
    t.tick();
    json(&call(h, "GET", "/drain/status", 9).unwrap())["receipt"].clone()
}

/// The `event=drain_receipt` lines logged so far on this test's thread,
/// each as its fields.
pub(crate) fn receipt_lines() -> Vec<std::collections::HashMap<String, String>> {
    logs::taken()
        .iter()
        .filter(|l| l.starts_with("event=drain_receipt "))
        .map(|l| {
            l.split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn a_drain_with_nothing_in_flight_is_closing_at_once_then_closed_after_lb_buffer() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
    let r = call(&h, "POST", "/drain", 1).unwrap();
    assert_eq!(
        (r.status, json(&r)["state"].as_str()),
        (200, Some("CLOSING"))
    );
    ticks(&sim, &h, &t, 9, 100);
    assert_eq!(state(&h), State::Closing, "lb_buffer not over");
    ticks(&sim, &h, &t, 1, 100);
    assert_eq!(state(&h), State::Closed);
}

#[test]
fn a_stream_in_flight_holds_the_drain_and_its_end_flips_it() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{}"#);
    let stream = TrafficStream::new(Rc::clone(&t));
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(&sim, &h, &t, 3, 100);
    assert_eq!(state(&h), State::Draining);
    let lb = call(&h, "GET", "/health_check.html", 2).unwrap();
    assert_eq!(lb.status, 200, "the LB check stays 200 while it runs");
    drop(stream);
    assert_eq!(state(&h), State::Closing, "flipped by the stream's own end");
}

#[test]
fn a_status_right_after_the_flip_lists_nothing_and_dates_what_the_ticks_count() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{}"#);
    let stream = TrafficStream::new(Rc::clone(&t));
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(&sim, &h, &t, 3, 100);
    sim.advance(40);
    let status = || json(&call(&h, "GET", "/drain/status", 2).unwrap());
    let before = status();
    assert_eq!(before["in_flight"]["ages"]["lt_1s"], 1);
    assert_eq!(
        (
            &before["in_flight"]["age_ms"],
            &before["in_flight"]["older_than_count"]
        ),
        (&serde_json::json!(40), &serde_json::json!(false))
    );
    end_with(&sim, stream, How::Completed);
    sim.advance(5);
    let after = status();
    assert_eq!(after["state"], "CLOSING");
    assert_eq!(after["active"], 0);
    let f = &after["in_flight"];
    assert!(f["oldest_age_ms"].is_null(), "the count says none: {f}");
    assert_eq!(f["ages"]["lt_1s"], 0);
    assert_eq!(
        (&f["age_ms"], &f["older_than_count"]),
        (&serde_json::json!(0), &serde_json::json!(false))
    );
    let r = &after["receipt"];
    assert_eq!(r["completed"], 0, "counted at the traffic root's next tick");
    assert_eq!(
        r["completed_age_ms"], 45,
        "as of that root's last tick, before the flip"
    );
    assert!(r["completed_as_of"].as_str() < after["progress"]["closing_at"].as_str());
    ticks(&sim, &h, &t, 1, 100);
    let r = &status()["receipt"];
    assert_eq!(
        (&r["completed"], &r["completed_age_ms"]),
        (&serde_json::json!(1), &serde_json::json!(0))
    );
}

#[test]
fn without_a_traffic_role_the_gateway_waits_and_a_drain_never_trusts_zero() {
    let sim = Sim::at(T0);
    let Ok(Config::Health(config)) = Config::parse(br#"{"role":"health","drain_timeout":"2s"}"#)
    else {
        panic!("a health role");
    };
    let h = Health::new(config, Metrics::define(&sim));
    h.tick();
    let lb = call(&h, "GET", "/health_check.html", 1).unwrap();
    assert_eq!((lb.status, lb.body.as_slice()), (503, b"WAIT\n".as_slice()));
    let r = call(&h, "POST", "/drain", 2).unwrap();
    assert_eq!(
        json(&r)["state"],
        "DRAINING",
        "an unseen traffic role is not a 0"
    );
    assert_eq!(
        json(&r)["count"]["unreliable_reason"],
        "traffic_role_not_seen"
    );
    for _ in 0..21 {
        sim.advance(100);
        h.tick();
    }
    let rec = h.store.load().unwrap();
    assert_eq!(
        (rec.state, rec.reason),
        (State::Closing, fsm::Reason::DrainTimeout)
    );
}

#[test]
fn a_held_wait_answers_at_closed_on_its_own_stream() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"500ms"}"#);
    assert!(call(&h, "POST", "/drain?wait=closed", 7).is_none(), "held");
    assert!(sim.answers.borrow().is_empty());
    ticks(&sim, &h, &t, 5, 100);
    let answers = sim.answers.borrow();
    assert_eq!(answers.len(), 1);
    let a = &answers[0];
    assert_eq!((a.context_id, a.status), (Some(7), 200));
    assert_eq!(
        (a.json()["state"].as_str(), a.json()["wait"].as_str()),
        (Some("CLOSED"), Some("closed"))
    );
}

#[test]
fn a_held_wait_times_out_with_a_small_504_and_the_drain_goes_on() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{}"#);
    let _stream = TrafficStream::new(Rc::clone(&t));
    assert!(call(&h, "GET", "/prestop?timeout=1s", 3).is_none());
    ticks(&sim, &h, &t, 9, 100);
    assert!(sim.answers.borrow().is_empty(), "0.9 s: still held");
    ticks(&sim, &h, &t, 1, 100);
    let a = sim.answers.borrow()[0].clone();
    assert_eq!((a.context_id, a.status), (Some(3), 504));
    assert_eq!(a.json()["error"], "wait_timeout");
    assert_eq!(state(&h), State::Draining);
}

#[test]
fn a_held_wait_holds_reopen_until_its_lease_runs_out() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{}"#);
    let _stream = TrafficStream::new(Rc::clone(&t));
    assert!(call(&h, "POST", "/drain?wait=closed", 4).is_none());
    ticks(&sim, &h, &t, 30, 100); // renewed by every tick while held
    let r = call(&h, "POST", "/reopen", 5).unwrap();
    assert_eq!(
        (r.status, json(&r)["error"].as_str()),
        (409, Some("prestop_hold"))
    );
    // The caller hung up: nothing renews the hold, which expires after its lease.
    h.forget(4);
    ticks(&sim, &h, &t, 19, 100);
    assert_eq!(
        call(&h, "POST", "/reopen", 6).unwrap().status,
        409,
        "1.9 s: held"
    );
    ticks(&sim, &h, &t, 1, 100);
    assert_eq!(call(&h, "POST", "/reopen", 6).unwrap().status, 200);
}

#[test]
fn a_forced_reopen_aborts_the_held_wait() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{}"#);
    let _stream = TrafficStream::new(Rc::clone(&t));
    assert!(call(&h, "POST", "/drain?wait=closed", 4).is_none());
    let r = call(&h, "POST", "/reopen?force=true", 5).unwrap();
    assert_eq!((r.status, json(&r)["state"].as_str()), (200, Some("OPEN")));
    ticks(&sim, &h, &t, 1, 100);
    let a = sim.answers.borrow()[0].clone();
    assert_eq!((a.context_id, a.status), (Some(4), 409));
    assert_eq!(a.json()["error"], "drain_aborted");
}

#[test]
fn a_gated_soft_drain_flips_on_the_404_that_completes_it() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"draining_lb_status":404}"#);
    assert_eq!(
        call(&h, "GET", "/health_check.html", 1).unwrap().status,
        200
    );
    let r = call(&h, "POST", "/drain", 2).unwrap();
    assert_eq!(
        json(&r)["state"],
        "DRAINING",
        "the LB has not been served the 404"
    );
    ticks(&sim, &h, &t, 5, 100);
    assert_eq!(state(&h), State::Draining);
    let lb = call(&h, "GET", "/health_check.html", 3).unwrap();
    assert_eq!(lb.status, 404);
    assert_eq!(state(&h), State::Closing, "the 404 itself flipped it");
}

#[test]
fn the_rotation_goes_out_once_at_the_flip_not_at_the_drain_start() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
    let stream = TrafficStream::new(Rc::clone(&t));
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(&sim, &h, &t, 5, 100);
    assert!(
        sim.calls.borrow().is_empty(),
        "200 while draining: connections kept"
    );
    drop(stream); // the flip
    assert!(
        sim.calls.borrow().is_empty(),
        "not from a stream's callback"
    );
    ticks(&sim, &h, &t, 3, 100);
    let calls = sim.calls.borrow().clone();
    assert_eq!(calls.len(), 1, "once per drain");
    assert_eq!(calls[0].cluster, crate::gate::rotation::DEFAULT_CLUSTER);
    assert!(calls[0].headers.contains(&(
        ":path".to_string(),
        crate::gate::rotation::ADMIN_PATH.to_string()
    )));
    sim.call_status.set(Some(200));
    h.rotator.answered(calls[0].token, 3);
    let status = json(&call(&h, "GET", "/drain/status", 2).unwrap());
    let last = &status["connection_rotation"]["last"];
    assert_eq!(
        (last["outcome"].as_str(), last["trigger"].as_str()),
        (Some("done"), Some("flip"))
    );
    // A second health root (another worker) finds the drain's rotation claimed.
    let other = Health::new(h.config.clone(), Metrics::define(&sim));
    other.tick();
    assert_eq!(sim.calls.borrow().len(), 1);
}

#[test]
fn a_soft_drain_rotates_once_the_lb_was_served_its_404() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"draining_lb_status":404,"lb_buffer":"60m"}"#);
    let _stream = TrafficStream::new(Rc::clone(&t));
    assert_eq!(
        call(&h, "GET", "/health_check.html", 1).unwrap().status,
        200
    );
    call(&h, "POST", "/drain", 2).unwrap();
    ticks(&sim, &h, &t, 3, 100);
    assert!(
        sim.calls.borrow().is_empty(),
        "the LB still sends new connections here"
    );
    assert_eq!(
        call(&h, "GET", "/health_check.html", 3).unwrap().status,
        404
    );
    ticks(&sim, &h, &t, 1, 100);
    assert_eq!(
        sim.calls.borrow().len(),
        1,
        "NOLB: a reconnect goes elsewhere now"
    );
    assert_eq!(state(&h), State::Draining, "the stream still runs");
}

#[test]
fn a_maintenance_drain_neither_rotates_nor_closes() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
    let r = call(&h, "POST", "/drain?hold=closing", 1).unwrap();
    assert_eq!(json(&r)["state"], "CLOSING");
    ticks(&sim, &h, &t, 30, 100);
    assert_eq!(state(&h), State::Closing);
    assert!(sim.calls.borrow().is_empty());
    assert_eq!(call(&h, "POST", "/reopen", 2).unwrap().status, 200);
}

fn placeholder(sim: &Sim) -> crate::gate::placeholder::host::Stand<&Sim> {
    crate::gate::placeholder::host::ensure(&sim);
    let p = crate::gate::placeholder::host::Stand::new(sim);
    p.tick();
    p
}

#[test]
fn a_placeholder_keeps_a_gateway_no_lb_check_saw_out_until_it_goes() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{}"#);
    let p = placeholder(&sim);
    ticks(&sim, &h, &t, 1, 100);
    let lb = call(&h, "GET", "/health_check.html", 1).unwrap();
    assert_eq!((lb.status, lb.body.as_slice()), (503, b"WAIT\n".as_slice()));
    let ready = call(&h, "GET", "/health", 2).unwrap();
    assert_eq!(
        (ready.status, json(&ready)["waiting_for"].as_str()),
        (503, Some("filter_config"))
    );
    let st = json(&call(&h, "GET", "/drain/status", 3).unwrap());
    assert_eq!(
        (
            st["waiting_for"].as_str(),
            st["traffic"]["placeholders"].as_u64()
        ),
        (Some("filter_config"), Some(1))
    );
    // Its request (a new pod's listener warm without the filter's configuration): still out, not drained.
    p.serve();
    ticks(&sim, &h, &t, 3, 100);
    assert_eq!(
        call(&h, "GET", "/health_check.html", 4).unwrap().status,
        503
    );
    assert_eq!(state(&h), State::Open);
    // The filter got its own configuration: Envoy removes the placeholder.
    drop(p);
    ticks(&sim, &h, &t, 1, 100);
    assert_eq!(
        call(&h, "GET", "/health_check.html", 5).unwrap().status,
        200
    );
    assert_eq!(call(&h, "GET", "/health", 6).unwrap().status, 200);
}

#[test]
fn a_placeholder_that_serves_on_an_announced_gateway_drains_it_and_cuts_nothing() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
    assert_eq!(
        call(&h, "GET", "/health_check.html", 1).unwrap().status,
        200,
        "announced"
    );
    let p = placeholder(&sim);
    ticks(&sim, &h, &t, 5, 100);
    assert_eq!(
        (
            call(&h, "GET", "/health_check.html", 2).unwrap().status,
            state(&h)
        ),
        (200, State::Open),
        "present only: a listener still warming, the previous one serves"
    );
    // The listener went live without the filter's configuration: a request passes the placeholder.
    let stream = TrafficStream::new(Rc::clone(&t));
    p.serve();
    ticks(&sim, &h, &t, 1, 100);
    let st = json(&call(&h, "GET", "/drain/status", 3).unwrap());
    assert_eq!(
        (st["state"].as_str(), st["progress"]["reason"].as_str()),
        (Some("DRAINING"), Some("filter_not_loaded"))
    );
    assert_eq!(st["waiting_for"], serde_json::Value::Null);
    assert_eq!(
        call(&h, "GET", "/health_check.html", 4).unwrap().status,
        200,
        "its stream runs"
    );
    drop(stream);
    ticks(&sim, &h, &t, 1, 100);
    assert_eq!(
        call(&h, "GET", "/health_check.html", 5).unwrap().status,
        503,
        "flipped at its end"
    );
    ticks(&sim, &h, &t, 30, 100);
    assert_eq!(
        state(&h),
        State::Closing,
        "held, as a maintenance drain: no lb_buffer close"
    );
    // Reopened while the placeholder still serves: out again at the next tick.
    assert_eq!(call(&h, "POST", "/reopen", 6).unwrap().status, 200);
    ticks(&sim, &h, &t, 1, 100);
    assert_eq!(state(&h), State::Closing);
    // Once the filter loaded (the placeholder gone), a reopen stays.
    drop(p);
    assert_eq!(call(&h, "POST", "/reopen", 7).unwrap().status, 200);
    ticks(&sim, &h, &t, 5, 100);
    assert_eq!(state(&h), State::Open);
    assert!(
        sim.calls.borrow().is_empty(),
        "it never rotated connections"
    );
}

#[test]
fn a_wait_asked_for_in_fault_says_so_and_one_aborted_by_a_fault_says_that() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{}"#);
    let _stream = TrafficStream::new(Rc::clone(&t));
    assert!(call(&h, "GET", "/prestop", 1).is_none());
    assert_eq!(call(&h, "POST", "/fault", 2).unwrap().status, 200);
    ticks(&sim, &h, &t, 1, 100);
    let aborted = sim.answers.borrow()[0].clone();
    assert_eq!(
        (aborted.status, aborted.json()["error"].as_str()),
        (409, Some("drain_aborted"))
    );
    for (method, path) in [("GET", "/prestop"), ("POST", "/drain?wait=closed")] {
        let r = call(&h, method, path, 3).unwrap();
        assert_eq!(
            (r.status, json(&r)["error"].as_str()),
            (409, Some("in_fault")),
            "{path}"
        );
        assert_eq!(json(&r)["wait"], "fault");
    }
}

/// A gateway DRAINING with nothing in flight, its `min_drain` `min`, ticked
/// once since the drain began.
fn draining_with_min_drain<'a>(sim: &'a Sim, min: &str) -> (Health<&'a Sim>, Rc<Traffic<&'a Sim>>) {
    let config = format!(r#"{{"min_drain":"{min}","drain_timeout":"60m","lb_buffer":"60m"}}"#);
    let (h, t) = gateway(sim, &config);
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(sim, &h, &t, 1, 100);
    (h, t)
}

#[test]
fn a_drain_held_open_costs_a_stream_next_to_nothing() {
    let sim = Sim::at(T0);
    let (h, t) = draining_with_min_drain(&sim, "60m");
    let before = sim.host_calls.get();
    for _ in 0..100 {
        end_with(&sim, TrafficStream::new(Rc::clone(&t)), How::Completed); // each brings the count to 0
    }
    // The lease counts the streams while the minimum holds, the receipt
    // reads how each ended (one property) and adds it up for the tick, and
    // nothing reads the state, the count or the record.
    let calls = sim.host_calls.get() - before;
    let per_stream = calls as f64 / 100.0;
    assert!(per_stream <= 1.2, "{per_stream} host calls per stream");
    assert_eq!(state(&h), State::Draining);
}

#[test]
fn a_drain_held_by_min_drain_never_reads_below_its_stream_and_flips_at_its_end() {
    let sim = Sim::at(T0);
    let (h, t) = draining_with_min_drain(&sim, "1s");
    let s = TrafficStream::new(Rc::clone(&t));
    for _ in 0..12 {
        assert!(sim.metric(crate::metric_names::ACTIVE_REQUESTS) >= 1);
        ticks(&sim, &h, &t, 1, 100);
    }
    assert_eq!(
        state(&h),
        State::Draining,
        "its stream holds it past min_drain"
    );
    assert_eq!(
        sim.metric(crate::metric_names::ACTIVE_REQUESTS),
        1,
        "exact once it ended"
    );
    end_with(&sim, s, How::Completed);
    assert_eq!(state(&h), State::Closing, "flipped by the stream's own end");
    assert_ne!(
        h.store.load().unwrap().reason,
        crate::gate::fsm::Reason::DrainTimeout
    );
}

#[test]
fn streams_that_ended_while_min_drain_held_leave_the_flip_to_its_end() {
    let sim = Sim::at(T0);
    let (h, t) = draining_with_min_drain(&sim, "1s");
    for _ in 0..20 {
        end_with(&sim, TrafficStream::new(Rc::clone(&t)), How::Completed);
    }
    ticks(&sim, &h, &t, 8, 100);
    assert_eq!(state(&h), State::Draining, "min_drain not over");
    ticks(&sim, &h, &t, 3, 100);
    assert_eq!(
        state(&h),
        State::Closing,
        "within a tick of min_drain's end"
    );
    assert_eq!(sim.metric(crate::metric_names::ACTIVE_REQUESTS), 0);
}

#[test]
fn an_unreadable_record_fails_closed_with_503() {
    let sim = Sim::at(T0);
    let (h, _t) = gateway(&sim, r#"{}"#);
    sim.put(crate::host::keys::FSM, b"{not json");
    // Checks answer from the state gauge until a tick finds the record
    // unreadable; the status document reads the record at once.
    assert_eq!(call(&h, "GET", "/drain/status", 1).unwrap().status, 503);
    h.tick();
    for path in ["/health_check.html", "/health", "/drain/status"] {
        let r = call(&h, "GET", path, 1).unwrap();
        assert_eq!(
            (r.status, json(&r)["error"].as_str()),
            (503, Some("state_unavailable"))
        );
    }
}

#[test]
fn a_check_that_changes_nothing_reads_two_values_and_writes_none() {
    let sim = Sim::at(T0);
    let (h, _t) = gateway(&sim, r#"{}"#);
    assert_eq!(
        call(&h, "GET", "/health_check.html", 1).unwrap().status,
        200
    );
    let lb = sim.value(crate::host::keys::LB);
    let before = sim.host_calls.get();
    for _ in 0..10 {
        assert_eq!(
            call(&h, "GET", "/health_check.html", 1).unwrap().status,
            200
        );
    }
    // Per check: the state gauge, the clock (two calls: wall and
    // monotonic), the LB record (remembered by version, so not parsed) —
    // and no write. (Reading the request's headers and source, and the
    // answer, are the stream's own calls, outside the `Host` trait: `make
    // cost` counts those too.)
    assert_eq!((sim.host_calls.get() - before) / 10, 4);
    assert_eq!(sim.value(crate::host::keys::LB), lb);
    // What does change is written: the 404 of a soft drain.
    let (h, _t) = gateway(&sim, r#"{"draining_lb_status": 404}"#);
    call(&h, "POST", "/drain", 2).unwrap();
    assert_eq!(
        call(&h, "GET", "/health_check.html", 3).unwrap().status,
        404
    );
    assert_ne!(sim.value(crate::host::keys::LB), lb);
}

#[test]
fn a_check_a_gap_later_reads_and_writes_the_lb_record_once() {
    let sim = Sim::at(T0);
    let (h, _t) = gateway(&sim, r#"{}"#);
    call(&h, "GET", "/health_check.html", 1).unwrap();
    for _ in 0..10 {
        sim.advance(500);
        let before = sim.host_calls.get();
        assert_eq!(
            call(&h, "GET", "/health_check.html", 1).unwrap().status,
            200
        );
        // The state gauge, the clock (wall and monotonic), the LB record read
        // and written with the version read.
        assert_eq!(sim.host_calls.get() - before, 5);
    }
    let c: crate::gate::lb::Checkers =
        crate::json::from_slice(&sim.value(crate::host::keys::LB).unwrap()).unwrap();
    assert_eq!(c.list[0].gaps_ms, [500; crate::gate::lb::MAX_GAPS]);
}

#[test]
fn the_lb_s_interval_is_measured_shown_and_set_as_gauges_each_second() {
    use crate::metric_names::{LB_BUFFER_SHORT, LB_CHECK_INTERVAL};
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"500ms"}"#);
    let check = |n: usize, gap: u64| {
        for _ in 0..n {
            sim.advance(gap);
            assert_eq!(
                call(&h, "GET", "/health_check.html", 1).unwrap().status,
                200
            );
        }
    };
    check(3, 500);
    let st = json(&call(&h, "GET", "/drain/status", 2).unwrap());
    assert_eq!(
        (
            &st["lb"]["checkers"][0]["check_interval"]["gaps"],
            &st["lb"]["detection"]
        ),
        (&serde_json::json!(2), &serde_json::Value::Null),
        "a new checker, two gaps: nothing measured yet"
    );
    ticks(&sim, &h, &t, 10, 100);
    assert_eq!(sim.metric(LB_CHECK_INTERVAL), 0);
    check(1, 500);
    let st = json(&call(&h, "GET", "/drain/status", 2).unwrap());
    assert_eq!(st["lb"]["checkers"][0]["check_interval"]["ms"], 500);
    let d = &st["lb"]["detection"];
    assert_eq!(
        (&d["checker"], &d["detection_ms"], &d["short_ms"]),
        (
            &serde_json::json!("127.0.0.1"),
            &serde_json::json!(1_000),
            &serde_json::json!(500)
        )
    );
    // The gauges move at the first tick a second after they were last set.
    ticks(&sim, &h, &t, 10, 100);
    assert_eq!(
        (sim.metric(LB_CHECK_INTERVAL), sim.metric(LB_BUFFER_SHORT)),
        (500, 500)
    );
    // The LB stops checking: once its checker is gone, nothing is measured.
    ticks(&sim, &h, &t, 1, crate::gate::lb::CHECKER_TTL_MS + 1_000);
    assert_eq!(
        (sim.metric(LB_CHECK_INTERVAL), sim.metric(LB_BUFFER_SHORT)),
        (0, 0)
    );
}
