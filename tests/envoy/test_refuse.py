"""`draining_new_requests: refuse` in a real Envoy: from DRAINING on a new HTTP
request that `refused_requests` names is answered at once with 503, `connection:
close`, the header `x-drain-gate` and a small JSON body — never forwarded, so
safe to resend — while the requests in flight when the drain began run to their
end; the health listener is untouched; `/reopen` ends it at once. Which requests
are refused: `idempotent` (the default) the RFC 9110 idempotent methods (GET,
HEAD, OPTIONS, TRACE, PUT, DELETE), `idempotent_or_key` those and a request with
an `Idempotency-Key`, `all` every one; every other request (a POST, a PATCH) is
served through the drain, forwarded as outside it. The LBs that resend the
refusals (HAProxy `retry-on`, Envoy `retry_policy`, nginx
`proxy_next_upstream`) are measured in tests/lb/test_refuse_lbs.py.

gRPC requests are served while the others are refused, unless
`draining_grpc_requests: refuse`, whatever `refused_requests`: then answered
HTTP 503 (Envoy would make a filter's local reply to gRPC `200` +
`grpc-status: 14`, which no LB resends) with `grpc-status: 14`. `refuse_with:
reset` resets the stream instead of answering: HTTP/1.1 the connection closed
with no answer, HTTP/2 `RST_STREAM` (INTERNAL_ERROR; NO_ERROR from Envoy 1.36)."""
from __future__ import annotations

import re
import socket
import time

import grpc
import pytest
import requests

from tests.harness import torture
from tests.harness.envoy import wait_for
from tests.harness.wire import fresh_get, h2_exchange, post, read_head, recv_until_close, status

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
    for method, path in [("GET", "/slow?ms=2000"), ("PUT", "/slow?ms=2000")]:
        r = requests.request(method, gw.traffic(path), data=b"x" * 100 if method == "PUT" else None, timeout=5)
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

    def raw_get() -> bytes:
        with socket.create_connection(("127.0.0.1", gw.ports.traffic), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            return read_head(s).lower()

    # Each worker starts refusing at its own tick: wait until this connection's worker refuses.
    head = wait_for(lambda: (h := raw_get()).startswith(b"http/1.1 503") and h, 2, interval=0.05, what="refusing")
    assert b"x-drain-gate: refused; draining" in head, head
    assert (b"connection: close" in head) == rotate, head


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
        assert status(gw)["refusing"] == {"mode": "serve", "requests": "idempotent", "grpc": "serve", "refuse_with": "response",
                                          "active": False, "this_drain": 0}
    finally:
        held.close()


# Each kind of request: (method, its headers), and the `refused_requests` values that refuse it.
KEY = {"idempotency-key": "k-1"}
KINDS = {
    "GET": ("GET", {}), "HEAD": ("HEAD", {}), "OPTIONS": ("OPTIONS", {}), "PUT": ("PUT", {}),
    "DELETE": ("DELETE", {}), "POST": ("POST", {}), "PATCH": ("PATCH", {}),
    "POST with Idempotency-Key": ("POST", KEY), "PATCH with Idempotency-Key": ("PATCH", KEY),
}
IDEMPOTENT = {"GET", "HEAD", "OPTIONS", "PUT", "DELETE"}
REFUSED = {"idempotent": IDEMPOTENT,
           "idempotent_or_key": IDEMPOTENT | {"POST with Idempotency-Key", "PATCH with Idempotency-Key"},
           "all": set(KINDS)}


@pytest.mark.parametrize("which", ["idempotent", "idempotent_or_key", "all"])
def test_refused_requests_names_what_is_refused_and_every_other_request_is_served(gateway, backend_port, which):
    """Through a refusing drain, each kind of request once: the ones `refused_requests` names are
    refused (503, the backend never saw them), every other one is served — forwarded, answered by
    the backend, once. `idempotent` is the default (not set). gRPC, a POST, is served in each:
    `draining_grpc_requests` decides it. One worker: once it refused a GET, it refuses."""
    config = {**REFUSE, "rotate_connections": False} | ({} if which == "idempotent" else {"refused_requests": which})
    gw = gateway(config, concurrency=1)
    assert post(gw, "/drain?hold=closing").json()["state"] == "CLOSING"
    wait_for(lambda: refused(requests.get(gw.traffic("/"), timeout=5)), 2, interval=0.05, what="refusing")
    before = status(gw)["refusing"]["this_drain"]
    run = time.monotonic_ns()
    for kind, (method, headers) in KINDS.items():
        rid = f"{which}-{kind.replace(' ', '-')}-{run}"
        body = b"x" * 100 if method in ("PUT", "POST", "PATCH") else None
        r = requests.request(method, gw.traffic(f"/status?code=200&id={rid}"), data=body, headers=headers, timeout=5)
        # How often the backend processed it, this look included: 1 = never before.
        seen = requests.get(f"http://127.0.0.1:{backend_port}/status?id={rid}", timeout=5).text
        if kind in REFUSED[which]:
            assert (r.status_code, r.headers.get("x-drain-gate")) == (503, "refused; draining"), (kind, r.headers)
            assert seen == "processed 1\n", f"{kind}: refused, yet forwarded"
        else:
            assert r.status_code == 200 and "x-drain-gate" not in r.headers, (kind, r.status_code, r.headers)
            assert r.text == "processed 1\n" and seen == "processed 2\n", f"{kind}: served once"
    assert h2_exchange(gw.ports.traffic, GRPC_CALL).status == 200, "gRPC served"
    st = status(gw)
    assert st["refusing"]["requests"] == which and st["refusing"]["grpc"] == "serve"
    assert st["refusing"]["this_drain"] == before + len(REFUSED[which]), st["refusing"]
    assert gw.stat("wasmcustom.drain_gate_refused") == st["refusing"]["this_drain"]


# A gRPC request as a client sends it (HTTP/2, prior knowledge); Envoy tells gRPC by the content-type.
GRPC_CALL = [(":method", "POST"), (":scheme", "http"), (":authority", "gw"), (":path", "/drain_gate.test.Long/Ticks"),
             ("content-type", "application/grpc"), ("te", "trailers")]
# RFC 9113 §7: the code of Envoy's RST_STREAM for a filter's reset, measured: NO_ERROR on Envoy 1.36,
# INTERNAL_ERROR on 1.38 and 1.40.
RESET_CODES = {"1.36": 0, "1.38": 2, "1.40": 2}


def test_a_refused_grpc_request_is_answered_503_that_an_lb_resends(gateway):
    """With `draining_grpc_requests: refuse` (served by default: `test_refuse_with_reset_answers_nothing`),
    whatever `refused_requests` (here the default, which serves a POST)."""
    gw = gateway({**REFUSE, "rotate_connections": False, "draining_grpc_requests": "refuse"})
    assert post(gw, "/drain?hold=closing").json()["state"] == "CLOSING"
    wait_for(lambda: refused(requests.get(gw.traffic("/"), timeout=5)), 2, interval=0.05, what="refusing")
    time.sleep(0.3)  # a tick: every worker refuses
    before = status(gw)["refusing"]["this_drain"]
    a = h2_exchange(gw.ports.traffic, GRPC_CALL)
    # The answer of a refusal, HTTP 503 (not the 200 Envoy makes of a local reply to gRPC) with
    # the gRPC status a client reads: UNAVAILABLE, which a gRPC client may retry.
    assert (a.outcome, a.status) == ("ended", 503), vars(a)
    assert a.headers["grpc-status"] == "14" and a.headers["x-drain-gate"] == "refused; draining", a.headers
    assert a.headers["content-type"] == "application/grpc"
    with grpc.insecure_channel(f"127.0.0.1:{gw.ports.traffic}") as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary("/drain_gate.test.Long/Unary")(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    # gRPC is decided by draining_grpc_requests alone: a POST of another kind is served (idempotent).
    r = requests.post(gw.traffic("/"), data=b"{}", headers={"content-type": "application/json"}, timeout=5)
    assert r.status_code == 200 and "x-drain-gate" not in r.headers, r.headers
    assert status(gw)["refusing"] == {"mode": "refuse", "requests": "idempotent", "grpc": "refuse", "refuse_with": "response", "active": True,
                                      "this_drain": before + 2}


def test_refuse_with_reset_answers_nothing(gateway):
    """HTTP/1.1: the connection closed with no answer; HTTP/2: RST_STREAM. gRPC is
    served (the default), an HTTP/2 GET reset, an HTTP/2 POST served (`refused_requests:
    idempotent`, the default)."""
    gw = gateway({**REFUSE, "rotate_connections": False, "refuse_with": "reset"})
    assert post(gw, "/drain?hold=closing").json()["state"] == "CLOSING"

    def h1_answer() -> bytes:
        with socket.create_connection(("127.0.0.1", gw.ports.traffic), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            return recv_until_close(s)

    wait_for(lambda: h1_answer() == b"", 2, interval=0.05, what="reset: closed with no answer")
    time.sleep(0.3)  # a tick: every worker refuses
    assert h1_answer() == b""
    get = [(k, "GET" if k == ":method" else v) for k, v in GRPC_CALL if k not in ("content-type", "te")]
    a = h2_exchange(gw.ports.traffic, get)
    version = re.search(r"/(\d+\.\d+)\.\d+/", requests.get(gw.admin("/server_info"), timeout=5).json()["version"])[1]
    assert (a.outcome, a.status, a.error_code) == ("reset", None, RESET_CODES[version]), vars(a)
    assert h2_exchange(gw.ports.traffic, GRPC_CALL).status == 200, "gRPC served"
    json_post = [(k, v) for k, v in GRPC_CALL if k not in ("content-type", "te")] + [("content-type", "application/json")]
    assert h2_exchange(gw.ports.traffic, json_post).status == 200, "a POST served"
    st = status(gw)
    assert st["refusing"]["refuse_with"] == "reset" and st["refusing"]["this_drain"] >= 3
    assert st["receipt"]["refused"] == st["refusing"]["this_drain"]
