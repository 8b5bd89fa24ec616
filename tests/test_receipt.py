"""The gateway counts what a drain cut, in a real Envoy (`crate::receipt`).

During a drain (any state but OPEN) the traffic role sorts every stream that
ends: completed, ended by the upstream or Envoy, refused, or cut — ended by
the downstream before it completed. A cut within 2 s after an LB checker was
served its `lb_fall`-th consecutive 503 is the LB's (it marked the gateway
DOWN and reset its sessions); any other is a client that gave up. Here the
checker is the test itself asking `/health_check.html` from 127.0.0.1 — the
LB's reset is what tests/test_scenarios.py measures behind a real HAProxy.
Outside a drain no end is sorted, so a client that aborts then is never a cut.
"""
from __future__ import annotations

import re
import socket
import time

import h2.config
import h2.connection
import h2.errors
import pytest

from tests.harness import istio, torture
from tests.harness.envoy import wait_for
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


def test_every_counter_exists_from_the_start_at_0(gateway):
    gw = gateway({})
    for name in COUNTERS:
        assert gw.stat(f"wasmcustom.{name}") == 0, name
    st = status(gw)
    assert st["cut"] == 0 and st["receipt"]["drain_started_at"] is None
    assert st["refusing"] == {"mode": "serve", "grpc": "serve", "refuse_with": "response", "active": False,
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
