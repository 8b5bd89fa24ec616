"""Long-lived gRPC and WebSocket streams through real HAProxy and drain-gate.

    gRPC (grpcio)   a server-streaming and a bidirectional RPC, h2c from the client to HAProxy
                    (HTTP mode) and from HAProxy to the gateway (`proto h2` on the server line),
                    h2 from the gateway to a grpc server
    WebSocket       the `websockets` library on both ends, through HAProxy (haproxy.cfg as written)

For each: the stream is counted, the drain waits for it (DRAINING while it runs), and what the
client sees when the drain ends

    clean    the stream ends by itself before drain_timeout     -> gRPC OK, WebSocket 1000
    forced   it outlives drain_timeout: the forced flip to 503,
             HAProxy's DOWN and its shutdown-sessions            -> the cut: gRPC UNKNOWN (server-
                                                                    streaming), CANCELLED (bidirectional);
                                                                    WebSocket 1006

The clean run is the control of the forced one (same rig, same streams, only drain_timeout
differs). Behind HAProxy `mode tcp` (L4) the gRPC cut is UNAVAILABLE, the WebSocket's 1006. `make test`
runs HAProxy checks every 1 s; `make scenarios` (`pytest -m full`) the shipped timings. And the connection
rotation, direct to the gateway (what an L4 LB passes on): Envoy's GOAWAY comes with the next
response on the connection (not with the end of a stream begun before the rotation), the gRPC
stream in flight runs to its end with OK, the RPC after the
GOAWAY takes a new connection; an upgraded websocket is left alone (no close frame) and runs on.

envoyfilter/docs/observability.md, "Long-lived gRPC and WebSocket streams", quotes what these tests measure.
"""
from __future__ import annotations

import contextlib
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import grpc
import pytest
import websockets.exceptions
import websockets.sync.client
import websockets.sync.server

from tests.harness import forms
from tests.harness.envoy import wait_for
from tests.harness.grpc_app import ECHO, TICKS, grpc_backend, h2_backend
from tests.harness.haproxy import CFG, HAProxy, h2_cfg
from tests.harness.ports import free_port
from tests.harness.rig import QUICK, SHIPPED, Gateway

INTERVAL = 0.2  # seconds between two messages of a stream
# `make test`: HAProxy checks every 1 s; `make scenarios` (`pytest -m full`): the shipped
# timings (inter 2s, lb_buffer 10s), the same assertions.
pytestmark = pytest.mark.full  # has a full form: `pytest -m full` (`make scenarios`)
TIMING = SHIPPED if forms.FULL else QUICK

# The forced run: the drain gives up at drain_timeout with the streams still running.
FORCED = {"drain_timeout": "2s", "lb_buffer": TIMING.lb_buffer}
# The clean run (the control): the streams end long before drain_timeout.
CLEAN = {"drain_timeout": "60s", "lb_buffer": TIMING.lb_buffer}


# -- backends --------------------------------------------------------------------------------
@contextlib.contextmanager
def ws_backend():
    """A websockets server: /ticks?n=N sends N messages, INTERVAL apart, then closes with 1000."""

    def handler(ws):
        n = int(re.search(r"n=(\d+)", ws.request.path)[1])
        for i in range(n):
            ws.send(f"tick {i}")
            time.sleep(INTERVAL)
        ws.close(1000, "done")

    port = free_port()
    server = websockets.sync.server.serve(handler, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield port
    finally:
        server.shutdown()


@contextlib.contextmanager
def lb_rig(tmp_path: Path, backend_port: int, config: dict, *, h2: bool, lb: str = "http"):
    """One gateway (real Envoy + drain-gate, its backend `backend_port`) behind real HAProxy:
    `lb="http"` haproxy.cfg (with `proto h2` to the gateway when `h2`), `lb="tcp"` haproxy-tcp.cfg."""
    with contextlib.ExitStack() as stack:
        gw = Gateway("gw1", backend_port, config, tmp_path)
        if h2:
            h2_backend(gw.envoy.doc)
        stack.callback(gw.stop)
        gw.start()
        hap = HAProxy(tmp_path / "haproxy", [(gw.ports.traffic, gw.ports.health)], inter=TIMING.inter, tls=False,
                      tcp=lb == "tcp", cfg=h2_cfg(CFG, tmp_path) if h2 and lb == "http" else None)
        stack.callback(hap.stop)
        hap.start()
        hap.wait_status("gw1", lambda s: s.up and s.check_status == "L7OK", timeout=5 * TIMING.inter_s + 5)
        yield gw, hap


# -- clients ---------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one client saw of its stream: messages, the end (gRPC status / WebSocket close code)."""

    kind: str
    messages: int = 0
    code: str | int | None = None  # grpc.StatusCode name, or the WebSocket close code
    details: str = ""
    times: list[float] = field(default_factory=list)  # when each message arrived
    ended: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float) -> "Outcome":
        assert self.done.wait(timeout), f"{self.kind} still running after {timeout}s"
        return self


def _run(outcome: Outcome, body) -> Outcome:
    def target():
        try:
            body(outcome)
        finally:
            outcome.ended = time.time()
            outcome.done.set()

    threading.Thread(target=target, daemon=True).start()
    return outcome


def _read_rpc(o: Outcome, call) -> None:
    """Reads a streaming RPC's messages into `o` until it ends: its status code, or the error's."""
    try:
        for _ in call:
            o.messages += 1
            o.times.append(time.time())
        o.code = call.code().name
    except grpc.RpcError as e:
        o.code, o.details = e.code().name, e.details() or ""


def grpc_ticks(channel: grpc.Channel, n: int) -> Outcome:
    """The server-streaming RPC: n messages, INTERVAL apart."""

    def body(o: Outcome):
        _read_rpc(o, channel.unary_stream(TICKS)(b"%d %d" % (n, INTERVAL * 1000)))

    return _run(Outcome("grpc server-streaming"), body)


def grpc_echo(channel: grpc.Channel, n: int) -> Outcome:
    """The bidirectional RPC: the client sends n messages, INTERVAL apart, and reads the echoes."""

    def requests():
        for i in range(n):
            yield b"ping %d" % i
            time.sleep(INTERVAL)

    def body(o: Outcome):
        _read_rpc(o, channel.stream_stream(ECHO)(requests()))

    return _run(Outcome("grpc bidirectional"), body)


def ws_ticks(url: str, n: int) -> Outcome:
    def body(o: Outcome):
        with websockets.sync.client.connect(url, open_timeout=10, close_timeout=5) as ws:
            try:
                for _ in ws:
                    o.messages += 1
                    o.times.append(time.time())
            except websockets.exceptions.ConnectionClosed as e:
                o.details = repr(e)
            o.code = ws.protocol.close_code

    return _run(Outcome("websocket"), body)


def active(gw: Gateway) -> int:
    return gw.status()["active"]


# -- the drains -------------------------------------------------------------------------------
def drain_with(gw: Gateway, hap: HAProxy | None, streams: list[Outcome], n: int) -> dict:
    """Streams counted and flowing, then POST /drain; until CLOSING and every stream's end."""
    counted = wait_for(lambda: (a := active(gw)) >= len(streams) and a, 10, 0.05, "every stream counted")
    wait_for(lambda: all(s.messages >= 2 for s in streams), 10, 0.05, "messages flowing")
    assert gw.post("/drain").status_code == 200
    draining = gw.status()
    closing = gw.wait_state("CLOSING", 30)
    # The flip as the gateway stamped it (the same clock as the clients', on loopback).
    flip = datetime.fromisoformat(closing["progress"]["closing_at"].replace("Z", "+00:00")).timestamp()
    for s in streams:
        s.wait(30)
    # The receipt counts a cut once Envoy has processed the reset: wait for it when the drain was
    # forced with streams in flight (their cut is what the forced runs assert).
    forced = closing["progress"]["forced"]
    receipt = gw.receipt(at_least=len(streams) if forced else 0, timeout=5)
    status = gw.status()
    return {"counted": counted, "draining": draining, "closing": closing, "flip": flip, "streams": streams,
            "down": hap.down_events() if hap else [], "status": status, "receipt": receipt, "n": n}


def grpc_drain(tmp_path: Path, config: dict, n: int, lb: str = "http") -> dict:
    """Both gRPC streams through HAProxy, a drain started while they run."""
    with grpc_backend() as port, lb_rig(tmp_path, port, config, h2=True, lb=lb) as (gw, hap), \
            grpc.insecure_channel(f"127.0.0.1:{hap.http_port}") as channel:
        return drain_with(gw, hap, [grpc_ticks(channel, n), grpc_echo(channel, n)], n)


def ws_drain(tmp_path: Path, config: dict, n: int, lb: str = "http") -> dict:
    with ws_backend() as port, lb_rig(tmp_path, port, config, h2=False, lb=lb) as (gw, hap):
        return drain_with(gw, hap, [ws_ticks(f"ws://127.0.0.1:{hap.http_port}/ticks?n={n}", n)], n)


def assert_clean(r: dict, ok) -> None:
    """The control: the drain waited (DRAINING while the streams ran, the flip at their end,
    not forced), every stream ended by itself with `ok`, HAProxy cut nothing."""
    assert r["counted"] >= len(r["streams"])
    assert r["draining"]["state"] == "DRAINING"
    assert r["closing"]["progress"]["forced"] is False, r["closing"]["progress"]
    for s in r["streams"]:
        assert (s.code, s.messages) == (ok, r["n"]), vars(s)
        # The flip came when the stream ended: after its last message, before the next would have come.
        assert s.times[-1] - 0.1 <= r["flip"] <= s.times[-1] + INTERVAL + 2, (s.times[-1], r["flip"])
    assert r["receipt"]["cut"] == 0, r["receipt"]
    assert all(sessions == 0 for _, sessions in r["down"]), r["down"]


def assert_cut(r: dict) -> None:
    """The forced flip at drain_timeout with every stream still in flight, the rotation done
    (its GOAWAY / connection: close did not end them: they kept flowing after it), and HAProxy's
    DOWN cut them: short of their messages, counted cut by the gateway."""
    progress = r["closing"]["progress"]
    assert (progress["forced"], progress["active_at_closing"]) == (True, len(r["streams"])), progress
    assert r["status"]["connection_rotation"]["last"]["outcome"] == "done"
    for s in r["streams"]:
        assert s.messages < r["n"], vars(s)
        assert sum(t > r["flip"] for t in s.times) >= 2, "the stream stopped at the flip, not at the LB's cut"
    # HAProxy marked the gateway DOWN, and the gateway counts every stream as cut by the LB (the
    # number of sessions in HAProxy's DOWN message is not used: behind `mode tcp` it read 0 in some
    # runs while the client was cut at that instant).
    assert r["down"] and r["down"][0][0] == "gw1", r["down"]
    assert r["receipt"]["cut_lb"] == len(r["streams"]), (
        r["receipt"], r["flip"], [(s.kind, s.code, s.details, s.messages, s.ended - r["flip"]) for s in r["streams"]])


# -- gRPC through HAProxy ----------------------------------------------------------------------
def test_grpc_clean_drain_waits_for_the_streams_and_they_end_ok(tmp_path):
    r = grpc_drain(tmp_path, CLEAN, n=15)  # 3 s of messages, the drain starts after 0.4 s
    assert_clean(r, "OK")


def test_grpc_forced_flip_then_haproxy_cut(tmp_path):
    """HAProxy (HTTP mode, h2 both sides) ends a stream it cuts with an empty DATA frame carrying
    END_STREAM and no trailers: grpcio reports UNKNOWN; the bidirectional call, whose client still
    sends, also gets RST_STREAM(CANCEL): CANCELLED."""
    r = grpc_drain(tmp_path, FORCED, n=100)  # 20 s of messages: outlives drain_timeout 2 s
    assert_cut(r)
    codes = {s.kind: s.code for s in r["streams"]}
    assert codes == {"grpc server-streaming": "UNKNOWN", "grpc bidirectional": "CANCELLED"}, \
        [vars(s) for s in r["streams"]]


def test_grpc_forced_flip_then_l4_cut(tmp_path):
    """Behind HAProxy `mode tcp` the cut is the connection's: grpcio reports UNAVAILABLE."""
    r = grpc_drain(tmp_path, FORCED, n=100, lb="tcp")
    assert_cut(r)
    assert {s.code for s in r["streams"]} == {"UNAVAILABLE"}, [vars(s) for s in r["streams"]]


# -- WebSocket through HAProxy -----------------------------------------------------------------
def test_websocket_clean_drain_waits_and_closes_1000(tmp_path):
    assert_clean(ws_drain(tmp_path, CLEAN, n=15), 1000)


@pytest.mark.parametrize("lb", ["http", "tcp"])
def test_websocket_forced_flip_then_lb_cut_is_1006(tmp_path, lb):
    r = ws_drain(tmp_path, FORCED, n=100, lb=lb)
    assert_cut(r)
    (s,) = r["streams"]
    assert s.code == 1006, vars(s)


# -- the rotation's GOAWAY, seen by the client (direct to the gateway, as through an L4 LB) ---------
def test_rotation_goaway_lets_the_grpc_stream_finish_and_the_next_rpc_reconnect(tmp_path):
    """After the rotation Envoy sends its GOAWAY with a connection's next response, not at once and
    not at the end of a stream that began before it. Two channels, each its own connection:

    A  a 10 s stream; right after the rotation two short RPCs on the same channel: the first still
       runs on the old connection and carries the GOAWAY back, the second takes a new connection
       (whose response carries a GOAWAY too: while Envoy drains, every response does);
       the long stream runs to its end with OK, more than the connection manager's default 5 s
       drain_timeout after that GOAWAY.
    B  a 4 s stream that ends after the rotation with no other RPC on its connection: its end
       carries no GOAWAY, so the next RPC still runs on that connection (and brings it back), and
       only the one after takes a new connection."""
    n_a, n_b = 50, 20  # 10 s and 4 s; the forced flip (and its rotation) at 2 s, CLOSED at 12 s
    own = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    with grpc_backend() as port, contextlib.ExitStack() as stack:
        gw = Gateway("gw1", port, {**FORCED, "lb_buffer": "10s"}, tmp_path)
        h2_backend(gw.envoy.doc)
        stack.callback(gw.stop)
        gw.start()
        target = f"127.0.0.1:{gw.ports.traffic}"
        ch_a = stack.enter_context(grpc.insecure_channel(target, options=own))
        ch_b = stack.enter_context(grpc.insecure_channel(target, options=own))

        def cx():  # (connections opened, connections Envoy closed for its drain: a GOAWAY each)
            return (gw.envoy.stat("http.traffic.downstream_cx_total"),
                    gw.envoy.stat("http.traffic.downstream_cx_drain_close"))

        long_a, long_b = grpc_ticks(ch_a, n_a), grpc_ticks(ch_b, n_b)
        wait_for(lambda: active(gw) == 2 and long_a.messages >= 2 and long_b.messages >= 2, 10, 0.05,
                 "both streams counted and flowing")
        assert cx() == (2, 0)
        assert gw.post("/drain").status_code == 200
        gw.wait_state("CLOSING", 10)
        wait_for(lambda: gw.status()["connection_rotation"]["last"]["outcome"] == "done", 5, 0.05, "rotation done")
        assert not long_b.done.is_set(), "B ended before the rotation"
        first = grpc_ticks(ch_a, 2).wait(10)
        goaway = first.ended
        after_first = cx()
        second = grpc_ticks(ch_a, 2).wait(10)
        after_second = cx()
        long_b.wait(10)
        after_b = cx()
        b_next = grpc_ticks(ch_b, 2).wait(10)
        after_b_next = cx()
        b_then = grpc_ticks(ch_b, 2).wait(10)
        after_b_then = cx()
        assert not long_a.done.is_set(), vars(long_a)
        long_a.wait(20)
        assert [(r.code, r.messages) for r in (first, second, b_next, b_then)] == [("OK", 2)] * 4
        assert after_first == (2, 1), "A's first RPC after the rotation: its old connection, and the GOAWAY"
        # A new connection, whose response carries a GOAWAY too: while Envoy drains (strategy
        # immediate, as istio-proxy) every response does.
        assert after_second == (3, 2), "A's RPC after the GOAWAY did not take a new connection"
        assert (long_b.code, long_b.messages) == ("OK", n_b), vars(long_b)
        assert after_b == (3, 2), "B's stream, ended after the rotation, brought a GOAWAY"
        assert after_b_next == (3, 3), "B's next RPC: its old connection, and the GOAWAY"
        assert after_b_then == (4, 4), "B's RPC after the GOAWAY did not take a new connection"
        assert (long_a.code, long_a.messages) == ("OK", n_a), vars(long_a)
        assert long_a.times[-1] - goaway > 5, "the long stream outlived the connection manager's 5 s drain_timeout"


def test_rotation_leaves_an_upgraded_websocket_alone(tmp_path):
    """Envoy's drain sequence sends nothing on an upgraded connection (no GOAWAY, no close frame:
    it does not speak WebSocket framing): direct to the gateway, the websocket runs through the
    forced flip and its rotation to its own end, 1000."""
    n = 25  # 5 s; the forced flip at 2 s
    with ws_backend() as port, contextlib.ExitStack() as stack:
        gw = Gateway("gw1", port, {**FORCED, "lb_buffer": "10s"}, tmp_path)
        stack.callback(gw.stop)
        gw.start()
        ws = ws_ticks(f"ws://127.0.0.1:{gw.ports.traffic}/ticks?n={n}", n)
        wait_for(lambda: active(gw) == 1 and ws.messages >= 2, 10, 0.05, "the websocket counted and flowing")
        assert gw.post("/drain").status_code == 200
        gw.wait_state("CLOSING", 10)
        rotated = time.time()
        wait_for(lambda: gw.status()["connection_rotation"]["last"]["outcome"] == "done", 5, 0.05, "rotation done")
        ws.wait(20)
        assert (ws.code, ws.messages) == (1000, n), vars(ws)
        assert sum(t > rotated for t in ws.times) >= 5, ws.times
        assert gw.envoy.stat("http.traffic.downstream_cx_upgrades_total") == 1
