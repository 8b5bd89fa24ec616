"""The gateway counts what a drain cut, in a real Envoy (`crate::instruments::receipt`).

During a drain (any state but OPEN) the traffic role sorts every stream that
ends by what Envoy says happened to it: completed (the upstream's answer),
ended by the upstream or Envoy (a reset, Envoy's own 504 or 503), refused, or
cut — ended by the downstream before it completed. A cut within 2 s after an
LB checker was served its `lb_fall`-th consecutive 503 is the LB's (it marked
the gateway DOWN and reset its sessions); from the checker's own address also
2 s after its next 503s. Any other is a client that gave up. Here the checker
is the test itself asking `/health_check.html` from 127.0.0.1, and a client in
the cluster is one on 127.0.0.2 — the LB's reset is what
tests/lb/test_scenarios.py measures behind a real HAProxy. Outside a drain no end
is sorted, so a client that aborts then is never a cut. Every drain logs one
receipt line, with its own ends, however soon the next begins.
"""
from __future__ import annotations

import re
import socket
import time

import h2.config
import h2.connection
import h2.errors
import pytest
import requests

from tests.harness import istio, torture, variants
from tests.harness.envoy import free_port, hcm, wait_for
from tests.harness.tcp import Echo
from tests.harness.wire import fresh_get, post, read_head, status

COUNTERS = ["drain_gate_cut", "drain_gate_cut_lb", "drain_gate_cut_tcp", "drain_gate_drain_completed",
            "drain_gate_drain_ended_upstream", "drain_gate_refused"]


def stream(port: int) -> socket.socket:
    """An HTTP/1.1 stream of an hour, its headers received."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /stream?seconds=3600&interval_ms=200 HTTP/1.1\r\nHost: t\r\n\r\n")
    assert read_head(s).startswith(b"HTTP/1.1 200")
    return s


def h2_stream(port: int) -> tuple[socket.socket, h2.connection.H2Connection, int]:
    """An HTTP/2 (h2c) stream of an hour, its headers received."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "GET"), (":path", "/stream?seconds=3600&interval_ms=200"),
                            (":scheme", "http"), (":authority", "t")], end_stream=True)
    s.sendall(conn.data_to_send())
    wait_for(lambda: any(type(e).__name__ == "ResponseReceived" for e in conn.receive_data(s.recv(65536))),
             10, interval=0, what="the h2 stream's headers")
    return s, conn, sid


def receipt(gw) -> dict:
    return status(gw)["receipt"]


def receipt_lines(gw) -> list[dict]:
    """The `event=drain_receipt` lines the gateway logged, each as its fields."""
    return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            for line in re.findall(r"event=drain_receipt .*", gw.log())]


def with_failing_routes(doc: dict, dead_port: int) -> dict:
    """The traffic listener with a route whose upstream times out (`/timeout` → the backend's
    /slow, 0.3 s) and one whose upstream refuses connections (`/dead` → a closed port)."""
    t = hcm(variants.listener(doc, "traffic"))
    t["route_config"]["virtual_hosts"][0]["routes"][:0] = [
        {"match": {"prefix": "/timeout"}, "route": {"cluster": "backend", "timeout": "0.3s",
                                                    "prefix_rewrite": "/slow"}},
        {"match": {"prefix": "/dead"}, "route": {"cluster": "dead"}},
    ]
    doc["static_resources"]["clusters"].append(variants.static_cluster("dead", dead_port))
    return doc


def tcp_closed(port: int, source: str) -> None:
    """One connection from `source` through the TCP chain: a line echoed, then the client's
    normal close (its FIN first, answered by the upstream's)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
        s.sendall(b"ping\n")
        assert s.recv(5) == b"ping\n"
        s.shutdown(socket.SHUT_WR)
        assert s.recv(1) == b"", "the upstream answered the FIN"


def test_every_counter_exists_from_the_start_at_0(gateway):
    gw = gateway({})
    for name in COUNTERS:
        assert gw.stat(f"wasmcustom.{name}") == 0, name
    st = status(gw)
    assert st["cut"] == 0 and st["receipt"]["drain_started_at"] is None
    assert st["refusing"] == {"mode": "serve", "requests": "idempotent", "grpc": "serve", "refuse_with": "response", "active": False,
                              "this_drain": 0}


def test_a_drain_counts_its_cuts_and_attributes_the_lb_s(gateway):
    gw = gateway({"lb_buffer": "60m", "drain_timeout": "60m"})
    p = gw.ports.traffic
    torture._abort(stream(p))  # a client that gives up outside a drain: never a cut
    wait_for(lambda: status(gw)["active"] == 0, 5, what="the aborted stream gone")
    gave_up, at_down, h2s, tail = stream(p), stream(p), h2_stream(p), stream(p)
    wait_for(lambda: status(gw)["active"] == 4, 5, what="four streams counted")
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    time.sleep(0.3)  # a few ticks: every worker sorts ends from its next tick on
    for _ in range(3):
        assert fresh_get(p, "/")[0] == 200  # completed during the drain
    torture._abort(gave_up)  # a client that gives up during the drain
    wait_for(lambda: receipt(gw)["cut"] == 1, 5, what="the client's abort counted")
    assert post(gw, "/close-lb").json()["state"] == "CLOSING"
    for _ in range(2):  # lb_fall 2: the second 503 is the LB's DOWN
        assert fresh_get(gw.ports.health, "/health_check.html")[0] == 503
    torture._abort(at_down)  # the LB's reset, right after its DOWN
    s, conn, sid = h2s
    conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)  # an HTTP/2 RST_STREAM at DOWN
    s.sendall(conn.data_to_send())
    r = wait_for(lambda: (r := receipt(gw))["cut"] == 3 and r, 5, what="the resets at DOWN counted")
    assert (r["cut_lb"], r["cut_other"], r["cut_http"], r["cut_tcp"]) == (2, 1, 3, 0), r
    # Completed ends are counted at their worker's next tick.
    r = wait_for(lambda: (r := receipt(gw))["completed"] >= 3 and r, 2, what="the completed ends counted")
    assert r["ended_upstream"] == 0, r
    assert gw.stat("wasmcustom.drain_gate_cut") == 3 and gw.stat("wasmcustom.drain_gate_cut_lb") == 2
    time.sleep(2.5)  # past the window after the DOWN
    torture._abort(tail)
    r = wait_for(lambda: (r := receipt(gw))["cut"] == 4 and r, 5, what="a late abort counted")
    assert (r["cut_lb"], r["cut_other"]) == (2, 2), "not the LB's: after its window"
    s.close()


def test_envoy_s_own_504_and_503_during_a_drain_end_upstream_not_completed(gateway, tmp_path):
    """A route timeout (504 `UT`) and a connect failure (503 `UF`) reach the client as whole
    responses: their response ended, but Envoy answered them, not the upstream."""
    gw = gateway({"lb_buffer": "60m"}, transform=lambda doc, _: with_failing_routes(doc, free_port()))
    p = gw.ports.traffic
    assert post(gw, "/drain").json()["state"] == "CLOSING"  # nothing in flight: the flip at once
    time.sleep(0.3)  # a few ticks: every worker sorts ends from its next tick on
    assert fresh_get(p, "/")[0] == 200
    assert fresh_get(p, "/timeout?ms=3000")[0] == 504
    assert fresh_get(p, "/dead/x")[0] == 503
    r = wait_for(lambda: (r := receipt(gw))["completed"] + r["ended_upstream"] == 3 and r, 5,
                 what="the three ends in the drain's tally")
    assert (r["completed"], r["ended_upstream"], r["cut"]) == (1, 2, 0), r
    assert gw.stat("wasmcustom.drain_gate_drain_ended_upstream") == 2


def test_a_normal_tcp_close_is_the_lb_s_cut_only_from_its_address_and_near_its_down(gateway, tmp_path):
    """HAProxy's shutdown-sessions in `mode tcp` ends a session with a FIN — the packet a client done
    with its connection sends. A FIN is the LB's only near the DOWN: from the checker's address within
    2 s of its DOWN or of its next 503s (a second backend's DOWN), from any other within 2 s of the
    DOWN. Ten seconds after it, a FIN from the checker's own address is a completed connection."""
    echo = Echo(tmp_path).start()
    try:
        port = free_port()
        gw = gateway({"lb_buffer": "60m"}, concurrency=1,
                     transform=lambda doc, _: variants.tcp_listener(doc, port, echo.port))
        assert post(gw, "/drain").json()["state"] == "CLOSING"
        time.sleep(0.3)  # the worker's next tick: it sorts ends from then on
        check = lambda: fresh_get(gw.ports.health, "/health_check.html")[0]  # noqa: E731 - the checker, 127.0.0.1
        assert check() == 503
        assert check() == 503  # lb_fall 2: DOWN
        down = time.monotonic()
        tcp_closed(port, "127.0.0.2")  # a client in the cluster, at the DOWN: the LB's, by time alone
        tcp_closed(port, "127.0.0.1")  # the checker's address at its DOWN: shutdown-sessions
        wait_for(lambda: receipt(gw)["cut"] == 2, 5, what="the two FINs at the DOWN sorted")
        while time.monotonic() < down + 1.5:
            time.sleep(0.05)
        assert check() == 503 and check() == 503  # its 3rd and 4th 503: the window stays open for its address
        while time.monotonic() < down + 2.8:
            time.sleep(0.05)
        tcp_closed(port, "127.0.0.2")  # 2.8 s after the DOWN, not the checker's address: completed
        tcp_closed(port, "127.0.0.1")  # the checker's: within 2 s of its 4th 503
        r = wait_for(lambda: (r := receipt(gw))["cut"] + r["completed"] >= 4 and r, 5,
                     what="the FINs 2.8 s after the DOWN sorted")
        assert (r["cut_lb"], r["cut_tcp"], r["completed"]) == (3, 3, 1), r
        while time.monotonic() < down + 10.0:
            time.sleep(0.1)
        tcp_closed(port, "127.0.0.1")  # 10 s after the DOWN: a client done with its connection
        r = wait_for(lambda: (r := receipt(gw))["completed"] == 2 and r, 5, what="the late FIN sorted")
        assert (r["cut"], r["cut_lb"]) == (3, 3), r
    finally:
        echo.stop()


def test_a_reopen_and_a_drain_within_a_tick_log_two_receipts_each_with_its_own_ends(gateway):
    gw = gateway({"lb_buffer": "60m", "drain_timeout": "60m"},
                 transform=lambda doc, _: with_failing_routes(doc, free_port()))
    p = gw.ports.traffic
    first = stream(p)
    wait_for(lambda: status(gw)["active"] == 1, 5, what="the stream counted")
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    time.sleep(0.3)  # a few ticks: every worker sorts ends from its next tick on
    assert fresh_get(p, "/")[0] == 200  # the first drain: one completed ...
    torture._abort(first)  # ... one cut
    wait_for(lambda: receipt(gw)["cut"] == 1, 5, what="the first drain's cut in its tally")
    s = requests.Session()
    t0 = time.monotonic()
    assert post(gw, "/reopen", session=s).json()["state"] == "OPEN"
    assert post(gw, "/drain", session=s).json()["state"] == "CLOSING"
    within = time.monotonic() - t0
    assert within < 0.1, f"/reopen and /drain took {within:.3f} s: more than a tick"
    time.sleep(0.3)  # the workers' next ticks: the second drain's ends from then on
    assert fresh_get(p, "/timeout?ms=3000")[0] == 504  # the second drain: one ended upstream
    wait_for(lambda: receipt(gw)["ended_upstream"] == 1, 5, what="the second drain's 504 in its tally")
    assert post(gw, "/reopen").json()["state"] == "OPEN"
    lines = wait_for(lambda: len(ls := receipt_lines(gw)) == 2 and ls, 5, what="two receipt lines")
    counts = [{k: int(line[k]) for k in ("completed", "cut", "ended_upstream")} for line in lines]
    assert counts == [{"completed": 1, "cut": 1, "ended_upstream": 0},
                      {"completed": 0, "cut": 0, "ended_upstream": 1}], lines
    assert lines[0]["started"] != lines[1]["started"] and [x["ended"] for x in lines] == ["OPEN", "OPEN"]
    time.sleep(0.3)
    assert len(receipt_lines(gw)) == 2, "one line per drain"


def test_the_receipt_is_logged_once_when_the_drain_ends(gateway):
    gw = gateway({"lb_buffer": "1s"})
    held = torture.HeldStreams(gw.ports.traffic, 1)
    wait_for(lambda: status(gw)["active"] == 1, 5, what="the stream counted")
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    time.sleep(0.3)
    held.close()
    wait_for(lambda: status(gw)["state"] == "CLOSED", 10, what="CLOSED")
    line = wait_for(lambda: re.findall(r"event=drain_receipt .*", gw.log()), 5, what="the receipt line")
    assert len(line) == 1, line
    fields = dict(kv.split("=", 1) for kv in line[0].split() if "=" in kv)
    assert fields["ended"] == "CLOSED" and fields["forced"] == "false" and fields["cut"] == "1", fields
    assert fields["cut_lb"] == "0" and fields["active_at_flip"] == "0", fields
    assert fields["started"] == status(gw)["progress"]["drain_started_at"]
    time.sleep(0.5)
    assert gw.log().count("event=drain_receipt") == 1, "one line per drain, whatever the workers"


@pytest.mark.parametrize("version", istio.ENVOY_MATRIX)
def test_every_envoy_of_the_matrix_flags_a_downstream_end_the_same(gateway, monkeypatch, version):
    """`response.flags` DC (the client's connection went away) and DR (an HTTP/2 reset) are what
    the sort reads: the same bits in Envoy 1.36, 1.38 and 1.40."""
    monkeypatch.setenv("ENVOY_BIN", istio.envoy_bin(version))
    gw = gateway({"lb_buffer": "60m"}, concurrency=1)
    p = gw.ports.traffic
    one, (s, conn, sid) = stream(p), h2_stream(p)
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    time.sleep(0.3)
    assert fresh_get(p, "/")[0] == 200
    torture._abort(one)
    conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
    s.sendall(conn.data_to_send())
    wait_for(lambda: receipt(gw)["cut"] == 2, 5, what=f"both cuts seen by Envoy {version}")
    r = wait_for(lambda: (r := receipt(gw))["completed"] >= 1 and r, 2, what="the completed end counted at a tick")
    assert r["ended_upstream"] == 0, r
    s.close()
