//! The traffic role's tests that need a whole gateway (a health root beside it):
//! how streams end during a drain, what the LB cut, and refusing new requests.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use crate::host::health::tests::*;

#[test]
fn ends_during_a_drain_are_sorted_and_the_lb_s_cuts_attributed() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
    let outside = TrafficStream::new(Rc::clone(&t));
    end_with(&sim, outside, How::Flags(0x4000)); // a client abort while OPEN: not a drain's
    let streams: Vec<_> = (0..6).map(|_| TrafficStream::new(Rc::clone(&t))).collect();
    let held = TrafficStream::new(Rc::clone(&t));
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(&sim, &h, &t, 1, 100);
    let mut it = streams.into_iter();
    end_with(&sim, it.next().unwrap(), How::Completed);
    end_with(&sim, it.next().unwrap(), How::Flags(0x10)); // upstream reset
    end_with(&sim, it.next().unwrap(), How::Local("response_timeout")); // 504 UT
    end_with(
        &sim,
        it.next().unwrap(),
        How::Local("upstream_reset_before_response_started{remote_connection_failure}"),
    ); // 503 UF
    end_with(&sim, it.next().unwrap(), How::Flags(0x4000)); // a client that gave up
    assert_eq!(receipt_after_tick(&h, &t)["cut"], 1);
    // The LB is served 503 twice (lb_fall 2) after the flip: DOWN, and it
    // resets what it still carries.
    call(&h, "POST", "/close-lb", 3).unwrap();
    for _ in 0..2 {
        assert_eq!(
            call(&h, "GET", "/health_check.html", 4).unwrap().status,
            503
        );
        sim.advance(500);
    }
    end_with(&sim, it.next().unwrap(), How::Flags(0x1000_0000)); // RST_STREAM at DOWN
    sim.advance(3_000);
    end_with(&sim, held, How::Flags(0x4000)); // long after the DOWN: not the LB's
    let r = receipt_after_tick(&h, &t);
    assert_eq!(
        (
            r["cut"].as_u64(),
            r["cut_lb"].as_u64(),
            r["cut_other"].as_u64()
        ),
        (Some(3), Some(1), Some(2))
    );
    assert_eq!(
        (r["completed"].as_u64(), r["ended_upstream"].as_u64()),
        (Some(1), Some(3)),
        "Envoy's 504 and 503 are not completed: {r}"
    );
    assert_eq!(
        sim.metric(crate::metric_names::CUT),
        3,
        "the OPEN abort is not counted"
    );
    assert_eq!(sim.metric(crate::metric_names::CUT_LB), 1);
    assert_eq!(sim.metric(crate::metric_names::DRAIN_ENDED_UPSTREAM), 3);
}

#[test]
fn a_connection_the_downstream_ended_first_is_a_cut_when_reset_or_at_the_lb_s_down() {
    use proxy_wasm::types::PeerType;
    let sim = Sim::at(T0);
    let (h, _t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
    let tcp = Rc::new(Traffic::new(
        Part::Connections,
        Metrics::define(&sim),
        &crate::config::Shared::default(),
    ));
    let conn = || TrafficStream::new(Rc::clone(&tcp));
    let (mut reset, mut upstream_first, mut done) = (conn(), conn(), conn());
    let (mut at_down, mut client_in_window, mut lb_in_window, mut late) =
        (conn(), conn(), conn(), conn());
    call(&h, "POST", "/drain", 1).unwrap();
    tcp.tick();
    reset.side_ended(true, Some(PeerType::Remote)); // a reset from the client side
    drop(reset);
    upstream_first.side_ended(false, None); // the upstream's FIN first ...
    upstream_first.side_ended(true, None);
    upstream_first.side_ended(false, Some(PeerType::Unknown));
    upstream_first.side_ended(true, Some(PeerType::Local)); // ... then Envoy closed the client side
    drop(upstream_first);
    done.side_ended(true, None); // a client done with its connection: its FIN first ...
    done.side_ended(false, None); // ... answered by the upstream's
    done.side_ended(false, Some(PeerType::Unknown));
    done.side_ended(true, Some(PeerType::Local));
    drop(done);
    let r = receipt_after_tick(&h, &tcp);
    assert_eq!(
        (r["cut_tcp"].as_u64(), r["completed"].as_u64()),
        (Some(1), Some(2))
    );
    // The LB's DOWN (lb_fall 2, the checker at 127.0.0.1): HAProxy's
    // shutdown-sessions in mode tcp sends the gateway a FIN from its own
    // address, and its reset may follow before the upstream answers.
    call(&h, "POST", "/close-lb", 3).unwrap();
    for _ in 0..2 {
        assert_eq!(
            call(&h, "GET", "/health_check.html", 4).unwrap().status,
            503
        );
    }
    sim.advance(5);
    sim.set_property("source.address", b"127.0.0.1:40100");
    at_down.side_ended(true, None);
    at_down.side_ended(true, Some(PeerType::Remote));
    drop(at_down);
    // Its 3rd and 4th 503 (a second backend's DOWN may come then) hold the
    // window open for its own address, 2 s past the 4th.
    for _ in 0..2 {
        sim.advance(1_000);
        call(&h, "GET", "/health_check.html", 4).unwrap();
    }
    sim.advance(1_500); // 3.5 s after the DOWN
    sim.set_property("source.address", b"10.1.2.3:51000");
    client_in_window.side_ended(true, None); // a client in the cluster done with it
    client_in_window.side_ended(false, None);
    drop(client_in_window);
    sim.set_property("source.address", b"127.0.0.1:40101");
    lb_in_window.side_ended(true, None); // the checker's own address: its FIN is the LB's
    drop(lb_in_window);
    sim.advance(6_500); // 10 s after the DOWN: a FIN is a client's again
    late.side_ended(true, None);
    late.side_ended(false, None);
    late.side_ended(true, Some(PeerType::Local));
    drop(late);
    let r = receipt_after_tick(&h, &tcp);
    assert_eq!(
        (
            r["cut_tcp"].as_u64(),
            r["cut_lb"].as_u64(),
            r["completed"].as_u64()
        ),
        (Some(3), Some(2), Some(4)),
        "{r}"
    );
}

#[test]
fn refuse_mode_answers_new_requests_503_while_draining_and_stops_at_reopen() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(
        &sim,
        r#"{"draining_new_requests":"refuse","lb_buffer":"60m"}"#,
    );
    sim.request_headers
        .borrow_mut()
        .insert(":method".into(), "GET".into());
    let mut before = TrafficStream::new(Rc::clone(&t));
    assert_eq!(before.request_headers(), Action::Continue, "OPEN: served");
    call(&h, "POST", "/drain?hold=closing", 1).unwrap();
    ticks(&sim, &h, &t, 1, 100);
    let mut new = TrafficStream::new(Rc::clone(&t));
    assert_eq!(new.request_headers(), Action::Pause);
    let a = sim.answers.borrow().last().cloned().unwrap();
    assert_eq!(
        (a.context_id, a.status, a.json()["error"].as_str()),
        (None, 503, Some("draining"))
    );
    assert!(a
        .headers
        .contains(&("x-drain-gate".to_string(), "refused; draining".to_string())));
    new.log();
    drop(new);
    t.tick(); // the drain's ends are in its tally from the root's tick
    let st = json(&call(&h, "GET", "/drain/status", 2).unwrap());
    assert_eq!(
        st["refusing"],
        serde_json::json!({"mode": "refuse", "requests": "idempotent", "grpc": "serve", "refuse_with": "response",
                           "active": true, "this_drain": 1})
    );
    assert_eq!(sim.metric(crate::metric_names::REFUSED), 1);
    assert_eq!(call(&h, "POST", "/reopen", 3).unwrap().status, 200);
    let mut after = TrafficStream::new(Rc::clone(&t));
    assert_eq!(
        after.request_headers(),
        Action::Continue,
        "reopened: served at once, before a tick"
    );
    drop((before, after));
}

/// A refusing drain, and `n` new GET requests with `content_type`: what each met.
fn refusing(config: &str, content_type: &str, n: usize) -> (Sim, Vec<Action>) {
    refusing_method(config, "GET", content_type, n)
}

/// A refusing drain, and `n` new `method` requests with `content_type`: what each met.
fn refusing_method(config: &str, method: &str, content_type: &str, n: usize) -> (Sim, Vec<Action>) {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, config);
    call(&h, "POST", "/drain?hold=closing", 1).unwrap();
    ticks(&sim, &h, &t, 1, 100);
    let mut headers = sim.request_headers.borrow_mut();
    headers.insert(":method".into(), method.into());
    headers.insert("content-type".into(), content_type.into());
    drop(headers);
    let mut met = Vec::new();
    for _ in 0..n {
        let mut s = TrafficStream::new(Rc::clone(&t));
        met.push(s.request_headers());
        s.response_headers(true);
        s.log();
    }
    let st = json(&call(&h, "GET", "/drain/status", 2).unwrap());
    assert_eq!(
        st["receipt"]["refused"],
        sim.metric(crate::metric_names::REFUSED)
    );
    drop((h, t));
    (sim, met)
}

#[test]
fn grpc_is_served_while_refusing_unless_refused_too_then_answered_503() {
    let refuse = r#""draining_new_requests":"refuse","lb_buffer":"60m""#;
    let (sim, met) = refusing(&format!("{{{refuse}}}"), "application/grpc", 2);
    assert_eq!(met, [Action::Continue; 2], "gRPC served by default");
    assert!(sim.answers.borrow().is_empty());
    assert_eq!(sim.metric(crate::metric_names::REFUSED), 0);
    let (sim, met) = refusing(&format!("{{{refuse}}}"), "application/json", 1);
    assert_eq!(met, [Action::Pause]);
    assert!(
        sim.response_headers.borrow().is_empty(),
        "not gRPC: the 503 as sent"
    );
    let grpc_too = format!(r#"{{{refuse},"draining_grpc_requests":"refuse"}}"#);
    let (sim, met) = refusing(&grpc_too, "application/grpc+proto", 2);
    assert_eq!(met, [Action::Pause; 2]);
    assert_eq!(sim.answers.borrow().len(), 2);
    assert_eq!(sim.answers.borrow()[0].status, 503);
    // Envoy made the answer 200 + grpc-status 14: each gets its 503 back, once.
    let restored = (":status".to_string(), "503".to_string());
    assert_eq!(*sim.response_headers.borrow(), [restored.clone(), restored]);
    assert_eq!(sim.metric(crate::metric_names::REFUSED), 2);
}

#[test]
fn refuse_with_reset_resets_with_no_answer_and_counts_it_refused() {
    let reset = r#"{"draining_new_requests":"refuse","refuse_with":"reset","lb_buffer":"60m""#;
    let (sim, met) = refusing(&format!("{reset}}}"), "text/plain", 3);
    assert_eq!(met, [Action::Pause; 3]);
    assert_eq!(sim.resets.get(), 3);
    assert!(sim.answers.borrow().is_empty() && sim.response_headers.borrow().is_empty());
    assert_eq!(sim.metric(crate::metric_names::REFUSED), 3);
    let (sim, met) = refusing(&format!("{reset}}}"), "application/grpc", 1);
    assert_eq!(
        (met, sim.resets.get()),
        (vec![Action::Continue], 0),
        "gRPC served"
    );
    let all = format!(r#"{reset},"draining_grpc_requests":"refuse"}}"#);
    let (sim, met) = refusing(&all, "application/grpc", 1);
    assert_eq!((met, sim.resets.get()), (vec![Action::Pause], 1));
}

#[test]
fn a_post_is_served_through_a_refusing_drain_unless_every_request_is_refused() {
    let refuse = r#""draining_new_requests":"refuse","lb_buffer":"60m""#;
    let (sim, met) = refusing_method(&format!("{{{refuse}}}"), "POST", "application/json", 2);
    assert_eq!(
        met,
        [Action::Continue; 2],
        "a POST may not be resent: served"
    );
    assert_eq!(sim.metric(crate::metric_names::REFUSED), 0);
    let (sim, met) = refusing_method(&format!("{{{refuse}}}"), "DELETE", "text/plain", 1);
    assert_eq!(
        (met, sim.metric(crate::metric_names::REFUSED)),
        (vec![Action::Pause], 1)
    );
    let all = format!(r#"{{{refuse},"refused_requests":"all"}}"#);
    let (sim, met) = refusing_method(&all, "POST", "application/json", 2);
    assert_eq!(met, [Action::Pause; 2], "all: a POST refused too");
    assert_eq!(sim.answers.borrow().len(), 2);
}

/// A root whose streams did not change writes no summary of them: readers
/// keep reading the one it wrote, as fresh as its beat, and age it.
#[test]
fn an_unchanged_in_flight_summary_is_not_written_again_and_stays_fresh_by_its_beat() {
    use crate::host::wasm_host::Host;
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, "{}");
    let stream = TrafficStream::new(Rc::clone(&t));
    ticks(&sim, &h, &t, 1, 100);
    let key = crate::host::keys::in_flight(t.heartbeat.id().unwrap());
    let version = || (&sim).get(&key).unwrap().1.unwrap();
    let in_flight = || json(&call(&h, "GET", "/drain/status", 9).unwrap())["in_flight"].clone();
    let written = version();
    ticks(&sim, &h, &t, 5, 100);
    assert_eq!(version(), written, "nothing changed");
    assert_eq!(in_flight()["ages"]["lt_1s"], 1);
    ticks(&sim, &h, &t, 30, 100);
    let moved = version();
    assert_ne!(moved, written, "a second old: its age class moved");
    ticks(&sim, &h, &t, 20, 100);
    assert_eq!(version(), moved);
    let f = in_flight();
    assert_eq!(
        (f["ages"]["lt_10s"].as_u64(), f["oldest_age_ms"].as_u64()),
        (Some(1), Some(5_600)),
        "fresh by its beat: {f}"
    );
    for _ in 0..20 {
        sim.advance(100);
        h.tick(); // the traffic root stopped ticking
    }
    assert_eq!(
        in_flight()["oldest_age_ms"],
        serde_json::Value::Null,
        "stale"
    );
    drop(stream);
}
