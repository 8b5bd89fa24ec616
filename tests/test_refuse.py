"""`draining_new_requests: refuse` in a real Envoy: from DRAINING on every new
HTTP request is answered at once with 503, `connection: close`, the header
`x-drain-gate` and a small JSON body — never forwarded, so safe to resend
(POST included) — while the requests in flight when the drain began run to
their end; the health listener is untouched; `/reopen` ends it at once. The
LBs that resend those 503s (HAProxy `retry-on`, Envoy `retry_policy`, nginx
`proxy_next_upstream`) are measured in tests/test_refuse_lbs.py."""
from __future__ import annotations

import socket
import time

import pytest
import requests

from tests.harness import torture
from tests.harness.envoy import wait_for
from tests.harness.wire import fresh_get, post, read_head, status

REFUSE = {"draining_new_requests": "refuse", "lb_buffer": "60m", "drain_timeout": "60m"}


def refused(answer: requests.Response) -> bool:
    return (answer.status_code == 503 and answer.headers.get("x-drain-gate") == "refused; draining"
            and answer.json()["error"] == "draining")


def test_new_requests_are_refused_in_flight_ones_complete(gateway, stream):
    gw = gateway(REFUSE)
    assert requests.get(gw.traffic("/"), timeout=5).status_code == 200, "OPEN: served"
    s = stream(gw.traffic("/stream?seconds=3&interval_ms=200"))
    wait_for(lambda: status(gw)["active"] == 1, 5, what="the stream counted")
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    wait_for(lambda: refused(requests.get(gw.traffic("/"), timeout=5)), 2, interval=0.05,
             what="refusing within a tick of the drain")
    t0 = time.monotonic()
    for method, path in [("GET", "/slow?ms=2000"), ("POST", "/slow?ms=2000")]:
        r = requests.request(method, gw.traffic(path), data=b"x" * 100, timeout=5)
        assert refused(r), (r.status_code, r.headers, r.text)
        assert r.headers["connection"] == "close", "Envoy's drain sequence (the rotation) adds it"
    assert time.monotonic() - t0 < 1.0, "answered at once: never forwarded to the slow backend"
    assert fresh_get(gw.ports.health, "/health_check.html")[0] == 200, "the health listener is untouched"
    assert s.wait(10) == 0 and s.chunks == 15, "the request in flight ran to its end"
    st = wait_for(lambda: (st := status(gw))["state"] == "CLOSING" and st, 5, what="the flip on its end")
    assert st["progress"]["forced"] is False
    assert st["refusing"]["active"] is True and st["refusing"]["this_drain"] >= 3
    assert st["receipt"]["refused"] == st["refusing"]["this_drain"]
    assert gw.stat("wasmcustom.drain_gate_refused") == st["refusing"]["this_drain"]


@pytest.mark.parametrize("rotate", [True, False], ids=["rotation", "no-rotation"])
def test_a_refused_http1_answer_asks_to_close_only_once_envoy_drains(gateway, rotate):
    """Envoy strips the hop-by-hop headers of a filter's local reply and adds `connection:
    close` to every HTTP/1.1 response once its drain sequence runs: with the connection
    rotation (the default) a refusal carries it, without it the connection is kept alive."""
    gw = gateway({**REFUSE, "rotate_connections": rotate})
    assert post(gw, "/drain").json()["state"] == "CLOSING"
    if rotate:
        wait_for(lambda: ((status(gw)["connection_rotation"]["last"] or {}).get("outcome")) == "done", 5,
                 what="rotated")
    wait_for(lambda: refused(requests.get(gw.traffic("/"), timeout=5)), 2, interval=0.05, what="refusing")
    s = socket.create_connection(("127.0.0.1", gw.ports.traffic), timeout=5)
    s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    head = read_head(s).lower()
    assert head.startswith(b"http/1.1 503") and b"x-drain-gate: refused; draining" in head, head
    assert (b"connection: close" in head) == rotate, head
    s.close()


def test_reopen_ends_the_refusing_at_once(gateway):
    gw = gateway(REFUSE)
    assert post(gw, "/drain?hold=closing").json()["state"] == "CLOSING", "a maintenance drain refuses too"
    wait_for(lambda: refused(requests.get(gw.traffic("/"), timeout=5)), 2, interval=0.05, what="refusing")
    assert post(gw, "/reopen").json()["state"] == "OPEN"
    for _ in range(5):  # before any tick, from every worker
        assert requests.get(gw.traffic("/"), timeout=5).status_code == 200
    assert status(gw)["refusing"]["active"] is False


def test_serve_mode_serves_while_draining(gateway):
    gw = gateway({"lb_buffer": "60m"})
    held = torture.HeldStreams(gw.ports.traffic, 1)
    try:
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        time.sleep(0.3)
        for _ in range(3):
            assert requests.get(gw.traffic("/"), timeout=5).status_code == 200
        assert status(gw)["refusing"] == {"mode": "serve", "active": False, "this_drain": 0}
    finally:
        held.close()
