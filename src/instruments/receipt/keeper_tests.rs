//! The receipt keeper's tests.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;

/// The receipt's record, as it stands.
fn book(sim: &Sim) -> crate::instruments::receipt::Record {
    crate::host::shared::Seen::new(crate::host::keys::RECEIPT)
        .load(&sim)
        .unwrap()
}

#[test]
fn a_drain_s_receipt_is_logged_once_when_it_ends() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
    let s = TrafficStream::new(Rc::clone(&t));
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(&sim, &h, &t, 1, 100);
    end_with(&sim, s, How::Completed);
    ticks(&sim, &h, &t, 12, 100);
    let rec = h.store.load().unwrap();
    assert_eq!(rec.state, State::Closed);
    let b = book(&sim);
    // Its line written (the drain's own, `owed_drain`), its flip recorded, nothing owed.
    assert!(b.owed_drain == b.drain && b.flip_recorded && b.owed_line.is_none());
    let lines = receipt_lines();
    assert_eq!(lines.len(), 1, "once");
    assert_eq!(
        (lines[0]["ended"].as_str(), lines[0]["completed"].as_str()),
        ("CLOSED", "1")
    );
    ticks(&sim, &h, &t, 5, 100);
    assert!(receipt_lines().is_empty(), "once, whatever the ticks");
}

#[test]
fn a_drain_the_traffic_role_closes_itself_owes_its_receipt_at_once() {
    let sim = Sim::at(T0);
    // lb_buffer 0: the stream that brings the count to 0 moves DRAINING ->
    // CLOSING -> CLOSED in its own callback; no health tick runs after it.
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"0s"}"#);
    let s = TrafficStream::new(Rc::clone(&t));
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(&sim, &h, &t, 1, 100);
    end_with(&sim, s, How::Completed);
    assert_eq!(h.store.load().unwrap().state, State::Closed);
    let b = book(&sim);
    assert!(
        b.drain.is_some() && b.owed_drain == b.drain,
        "the traffic role's transition raised the receipt's line: {b:?}"
    );
    ticks(&sim, &h, &t, 2, 100); // the health role takes a line it saw owed a tick before

    let lines = receipt_lines();
    assert_eq!(
        (
            lines.len(),
            lines[0]["ended"].as_str(),
            lines[0]["completed"].as_str()
        ),
        (1, "CLOSED", "1")
    );
}

#[test]
fn what_completed_after_the_last_traffic_tick_is_in_the_receipt() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"1s"}"#);
    call(&h, "POST", "/drain", 1).unwrap(); // nothing in flight: CLOSING at once
    ticks(&sim, &h, &t, 1, 100);
    let late = TrafficStream::new(Rc::clone(&t)); // the LB still sends in CLOSING
    sim.advance(1_000);
    end_with(&sim, late, How::Completed); // completed after its traffic root's last tick
    h.tick();
    let rec = h.store.load().unwrap();
    assert_eq!(rec.state, State::Closed);
    assert!(
        book(&sim).owed_line.is_some(),
        "owed, but its traffic root has not counted it yet"
    );
    assert_eq!(sim.metric(crate::metric_names::DRAIN_COMPLETED), 0);
    ticks(&sim, &h, &t, 1, 100);
    assert!(book(&sim).owed_line.is_none(), "logged a tick later");
    assert_eq!(sim.metric(crate::metric_names::DRAIN_COMPLETED), 1);
    let lines = receipt_lines();
    assert_eq!((lines.len(), lines[0]["completed"].as_str()), (1, "1"));
}

#[test]
fn a_reopen_and_a_new_drain_within_a_tick_log_one_receipt_each_with_its_own_ends() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
    let first: Vec<_> = (0..4).map(|_| TrafficStream::new(Rc::clone(&t))).collect();
    let second: Vec<_> = (0..3).map(|_| TrafficStream::new(Rc::clone(&t))).collect();
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(&sim, &h, &t, 1, 100);
    let mut it = first.into_iter();
    end_with(&sim, it.next().unwrap(), How::Completed);
    end_with(&sim, it.next().unwrap(), How::Flags(0x4000)); // a client gave up
    end_with(&sim, it.next().unwrap(), How::Local("response_timeout"));
    // Reopened and drained again before any tick: the first drain's line
    // is still owed when the second begins.
    assert_eq!(call(&h, "POST", "/reopen", 2).unwrap().status, 200);
    assert_eq!(call(&h, "POST", "/drain", 3).unwrap().status, 200);
    let rec = h.store.load().unwrap();
    assert_eq!(
        (rec.state, book(&sim).owed_line.is_some()),
        (State::Draining, true)
    );
    end_with(&sim, it.next().unwrap(), How::Completed); // the traffic root still sees drain 1
    ticks(&sim, &h, &t, 1, 100); // ... until its tick: from here on, drain 2
    for s in second {
        end_with(&sim, s, How::Flags(0x1000_0000));
    }
    assert_eq!(call(&h, "POST", "/reopen", 4).unwrap().status, 200);
    ticks(&sim, &h, &t, 3, 100);
    let lines = receipt_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let counts = |l: &std::collections::HashMap<String, String>| {
        ["ended", "completed", "cut", "ended_upstream"].map(|k| l[k].clone())
    };
    assert_eq!(counts(&lines[0]), ["OPEN", "2", "1", "1"]);
    assert_eq!(counts(&lines[1]), ["OPEN", "0", "3", "0"]);
    assert_ne!(lines[0]["started"], lines[1]["started"]);
    assert!(book(&sim).owed_line.is_none());
}

/// pilot-agent's readiness answer (an upstream's: Envoy's router marked it,
/// no body) with `status`, or Envoy's own reply (`upstream` false, a body).
fn readiness(sim: &Sim, status: u16, upstream: bool) -> usize {
    sim.call_status.set(Some(status));
    *sim.call_headers.borrow_mut() = if upstream {
        vec![crate::instruments::termination::UPSTREAM_MARK.to_string()]
    } else {
        vec!["content-type".to_string()]
    };
    if upstream {
        0
    } else {
        98
    }
}

/// The token of the last readiness call sent.
fn last_call(sim: &Sim) -> u32 {
    sim.calls.borrow().last().unwrap().token
}

fn unavailable_lines() -> Vec<String> {
    logs::taken()
        .into_iter()
        .filter(|l| l.starts_with("event=termination_watch_unavailable "))
        .collect()
}

#[test]
fn a_sigterm_before_closed_while_the_prestop_is_held_is_in_the_receipt() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"termination_watch":"agent","lb_buffer":"60m"}"#);
    let s = TrafficStream::new(Rc::clone(&t));
    call(&h, "POST", "/drain", 1).unwrap();
    ticks(&sim, &h, &t, 2, 100);
    assert!(
        sim.calls.borrow().is_empty(),
        "no preStop held: nothing watched"
    );
    assert!(
        call(&h, "POST", "/drain?wait=closed", 2).is_none(),
        "the preStop, held"
    );
    ticks(&sim, &h, &t, 3, 100);
    let calls = sim.calls.borrow().clone();
    assert_eq!(calls.len(), 1, "one call at a time");
    assert_eq!(calls[0].cluster, "agent");
    assert!(calls[0]
        .headers
        .contains(&(":path".to_string(), termination::READY_PATH.to_string())));
    let body = readiness(&sim, 200, true);
    assert!(
        !h.termination.answered(calls[0].token, 3, body, &h.metrics),
        "ready: no SIGTERM yet"
    );
    ticks(&sim, &h, &t, 1, 100);
    let body = readiness(&sim, 503, true); // pilot-agent: "server is terminated"
    assert!(h.termination.answered(last_call(&sim), 3, body, &h.metrics));
    let asked = sim.calls.borrow().len();
    ticks(&sim, &h, &t, 3, 100);
    assert_eq!(sim.calls.borrow().len(), asked, "nothing more to ask");
    h.sigterm();
    h.sigterm(); // another worker's answer: once per drain
    assert_eq!(sim.metric(crate::metric_names::DRAINS_CUT_SHORT), 1);
    end_with(&sim, s, How::Flags(0x4000)); // Envoy ends with the pod
    ticks(&sim, &h, &t, 2, 100);
    let lines = receipt_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (lines[0]["ended"].as_str(), lines[0]["closed"].as_str()),
        ("SIGTERM", "-")
    );
    call(&h, "POST", "/close", 3).unwrap();
    ticks(&sim, &h, &t, 3, 100);
    assert!(
        receipt_lines().is_empty(),
        "one line per drain: CLOSED adds none"
    );
    assert_eq!(
        sim.metric(crate::metric_names::TERMINATION_WATCH_UNAVAILABLE),
        0
    );
}

#[test]
fn envoy_s_own_reply_or_a_503_before_any_200_is_no_sigterm_and_said_once() {
    for (status, upstream, reason) in [
        (503, false, "reason=local_reply status=503"),
        (504, false, "reason=local_reply status=504"),
        (503, true, "reason=not_ready status=503"),
    ] {
        let sim = Sim::at(T0);
        let (h, t) = gateway(&sim, r#"{"termination_watch":"agent","lb_buffer":"1s"}"#);
        let s = TrafficStream::new(Rc::clone(&t));
        logs::taken();
        assert!(call(&h, "POST", "/drain?wait=closed", 2).is_none());
        for _ in 0..3 {
            ticks(&sim, &h, &t, 1, 100);
            let body = readiness(&sim, status, upstream);
            assert!(!h.termination.answered(last_call(&sim), 3, body, &h.metrics));
        }
        assert_eq!(sim.calls.borrow().len(), 3, "asked at every tick");
        let said = unavailable_lines();
        assert_eq!(said.len(), 1, "once: {said:?}");
        assert!(
            said[0].starts_with(&format!(
                "event=termination_watch_unavailable cluster=agent {reason} detail="
            )),
            "{said:?}"
        );
        assert_eq!(
            sim.metric(crate::metric_names::TERMINATION_WATCH_UNAVAILABLE),
            1
        );
        end_with(&sim, s, How::Completed);
        ticks(&sim, &h, &t, 13, 100);
        assert_eq!(h.store.load().unwrap().state, State::Closed);
        let lines = receipt_lines();
        assert_eq!(
            lines
                .iter()
                .map(|l| l["ended"].as_str())
                .collect::<Vec<_>>(),
            ["CLOSED"],
            "{reason}"
        );
        assert_eq!(sim.metric(crate::metric_names::DRAINS_CUT_SHORT), 0);
    }
}

#[test]
fn without_the_watch_or_a_call_answered_nothing_is_cut_short() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"60m"}"#);
    let _s = TrafficStream::new(Rc::clone(&t));
    assert!(call(&h, "POST", "/drain?wait=closed", 1).is_none());
    ticks(&sim, &h, &t, 5, 100);
    assert!(
        sim.calls.borrow().is_empty(),
        "termination_watch is off by default"
    );
    let (h, t) = gateway(&sim, r#"{"termination_watch":true,"lb_buffer":"60m"}"#);
    let _s = TrafficStream::new(Rc::clone(&t));
    assert!(call(&h, "POST", "/drain?wait=closed", 2).is_none());
    ticks(&sim, &h, &t, 1, 100);
    let token = last_call(&sim);
    assert_eq!(
        sim.calls.borrow().last().unwrap().cluster,
        config::AGENT_CLUSTER
    );
    let body = readiness(&sim, 503, true);
    assert!(
        !h.termination.answered(token + 100, 3, body, &h.metrics),
        "not its call"
    );
    assert!(
        !h.termination.answered(token, 0, 0, &h.metrics),
        "no answer: no SIGTERM"
    );
    assert!(unavailable_lines()[0].contains(" reason=no_answer "));
}

#[test]
fn a_cluster_envoy_does_not_know_is_said_once() {
    let sim = Sim::at(T0);
    sim.call_refused.set(true);
    let (h, t) = gateway(&sim, r#"{"termination_watch":"pilot","lb_buffer":"60m"}"#);
    let _s = TrafficStream::new(Rc::clone(&t));
    logs::taken();
    assert!(call(&h, "POST", "/drain?wait=closed", 1).is_none());
    ticks(&sim, &h, &t, 5, 100);
    let said = unavailable_lines();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("event=termination_watch_unavailable cluster=pilot host_status=BadArgument reason=call_refused detail="),
        "{said:?}"
    );
    assert_eq!(
        sim.metric(crate::metric_names::TERMINATION_WATCH_UNAVAILABLE),
        1
    );
}

#[test]
fn a_held_prestop_answer_comes_a_scrape_interval_after_closed() {
    let sim = Sim::at(T0);
    let (h, t) = gateway(&sim, r#"{"lb_buffer":"500ms","scrape_interval":"2s"}"#);
    assert!(call(&h, "POST", "/drain?wait=closed", 7).is_none());
    while state(&h) != State::Closed {
        ticks(&sim, &h, &t, 1, 100);
    }
    ticks(&sim, &h, &t, 19, 100);
    assert!(
        sim.answers.borrow().is_empty(),
        "1.9 s after CLOSED: still held"
    );
    ticks(&sim, &h, &t, 1, 100);
    let a = sim.answers.borrow()[0].clone();
    assert_eq!(
        (a.context_id, a.status, a.json()["wait"].as_str()),
        (Some(7), 200, Some("closed"))
    );
}
