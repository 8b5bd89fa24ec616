"""HTTP/3 (QUIC) in a real Envoy 1.40, with a real HTTP/3 client (aioquic): a QUIC
listener carrying the traffic listener's HTTP connection manager (drain-gate's
traffic role included, as an Istio gateway's QUIC listener carries the traffic
EnvoyFilter's patch) counts each HTTP/3 request stream, and a drain waits for it.
The connection rotation at the flip reaches a QUIC connection as Envoy's HTTP/3
drain: nothing while the connection is idle, a GOAWAY with the first response after
it, a final GOAWAY and a clean CONNECTION_CLOSE once the connection manager's drain
timeout has passed. The control is the same listener without the filter: its stream
is not counted, the drain flips (and rotates) with it in flight, the stream still
completes with no GOAWAY, and verify.py --config-dump names the listener."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests

from tests.harness import variants
from tests.harness.envoy import REPO, free_port, wait_for
from tests.harness.quic import H3Client
from tests.harness.wire import post, state, status

STREAM = "/stream?seconds=3&interval_ms=200"  # 15 chunks, 3 s
CHUNKS = 15
HELD = {"lb_buffer": "60m", "drain_timeout": "60m"}
# The first GOAWAY of a graceful HTTP/3 drain carries the largest client stream id
# Envoy's QUIC stack (QUICHE) announces: no stream is refused by it (RFC 9114 section 5.2).
FIRST_GOAWAY_ID = 0xFFFFFFFC


@pytest.fixture
def h3_gateway(gateway):
    """Factory: h3_gateway(config, counted=True) -> (Envoy, its HTTP/3 listener's UDP port)."""
    def start(config: dict | None = None, counted: bool = True):
        port = free_port()
        gw = gateway(config, transform=lambda doc, wd: variants.quic_listener(doc, port, wd, counted=counted))
        return gw, port
    return start


def http_streams(gw) -> int:
    return status(gw)["count"]["http_streams"]


def verify_lines(gw) -> list[str]:
    """envoyfilter/tools/verify.py --config-dump on the running Envoy: its lines about the QUIC listener."""
    dump = requests.get(gw.admin("/config_dump"), timeout=10).text
    r = subprocess.run([sys.executable, str(REPO / "envoyfilter" / "tools" / "verify.py"), "--config-dump", "-"],
                       input=dump, capture_output=True, text=True, timeout=60)
    return [line for line in r.stdout.splitlines() if "listener traffic_h3:" in line]


def rotation_done(gw) -> dict | None:
    """The drain's rotation record once Envoy's admin answered it, else None."""
    last = status(gw)["connection_rotation"]["last"]
    return last if last and last["outcome"] == "done" else None


def lb(gw) -> int:
    return requests.get(gw.health("/health_check.html"), timeout=5).status_code


def test_an_http3_stream_is_counted_a_drain_waits_for_it_and_the_rotation_sends_goaway(h3_gateway):
    gw, port = h3_gateway(HELD)
    assert "PASS traffic filter: listener traffic_h3: drain-gate traffic filter before the router" in verify_lines(gw)
    with H3Client(port) as client:
        hello = client.get("/")
        client.wait(lambda: client.snapshot(hello).ended, 10, what="a first HTTP/3 answer")
        assert client.snapshot(hello).status == 200

        s = client.get(STREAM)
        client.wait(lambda: client.snapshot(s).chunks >= 1, 10, what="the stream's first chunk")
        # Outside a drain the count may lead by a lease (8) per worker; a drain makes it exact.
        assert http_streams(gw) >= 1, "the HTTP/3 stream is counted"
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        wait_for(lambda: (status(gw)["active"], http_streams(gw)) == (1, 1), 5, what="the exact count: 1")
        assert gw.stat("wasmcustom.drain_gate_active_requests") == 1
        # The drain holds while the stream runs. Each reading is kept only if the client had
        # not yet received the last chunk after it: the stream was in flight in Envoy then.
        held, deadline = 0, time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "the stream did not end"
            seen = (lb(gw), state(gw), http_streams(gw))
            if client.snapshot(s).chunks >= CHUNKS:
                break
            assert seen == (200, "DRAINING", 1)
            held += 1
        assert held >= 5, f"only {held} checks while the stream ran"
        client.wait(lambda: client.snapshot(s).ended, 5, what="the stream's end")
        done = client.snapshot(s)
        assert (done.status, done.chunks, done.reset) == (200, CHUNKS, None), "the stream completed"

        wait_for(lambda: state(gw) == "CLOSING", 5, what="the flip once the HTTP/3 stream ended")
        st = status(gw)
        assert st["progress"]["reason"] == "active_zero" and st["progress"]["forced"] is False
        assert st["progress"]["active_at_closing"] == 0 and st["active"] == 0
        assert st["progress"]["transitions"][0]["active"] >= 1, "the drain began with the stream counted"
        assert gw.stat("wasmcustom.drain_gate_active_requests") == 0
        assert gw.stat("wasmcustom.drain_gate_count_errors") == 0
        # Made by the traffic role in the callback that ended the stream, not by a timer.
        flip = [line for line in gw.log().splitlines() if "to=CLOSING" in line]
        assert len(flip) == 1 and "drain_gate_traffic" in flip[0], flip

        # The rotation at the flip: Envoy's drain sequence, which reaches this idle
        # QUIC connection only with its next response.
        last = wait_for(lambda: rotation_done(gw), 5, what="the rotation")
        assert (last["trigger"], last["admin_status"]) == ("flip", 200)
        rotated = time.monotonic()
        while time.monotonic() < rotated + 3.0:  # 3 s after the rotation: nothing sent unasked
            assert client.goaways() == [] and client.terminated() is None
            time.sleep(0.1)
        after = client.get("/")
        client.wait(lambda: client.goaways(), 5, what="a GOAWAY with the next response")
        first = time.monotonic()
        assert client.goaways() == [FIRST_GOAWAY_ID]
        assert client.snapshot(after).status == 200, "the request that brought the GOAWAY is served"
        # After the connection manager's drain_timeout (5 s by default): the final GOAWAY (the
        # next stream id: no stream was in flight) and a clean close.
        closed = client.wait(lambda: client.terminated(), 12, what="Envoy closes the drained connection")
        assert 4.0 <= time.monotonic() - first <= 9.0, time.monotonic() - first
        assert client.goaways() == [FIRST_GOAWAY_ID, after.stream_id + 4]
        assert closed.error_code == 0, closed  # NO_ERROR: a close, not a reset
        assert client.snapshot(after).ended

    # New QUIC connections are still accepted: a reconnect after the GOAWAY is served.
    with H3Client(port) as again:
        r = again.get("/")
        again.wait(lambda: again.snapshot(r).ended, 10, what="an answer on a new connection")
        assert again.snapshot(r).status == 200
    assert state(gw) == "CLOSING"


def test_control_without_the_filter_the_http3_stream_is_not_counted_and_the_drain_flips(h3_gateway):
    gw, port = h3_gateway(HELD, counted=False)
    # The preflight names the QUIC listener the filter is missing on.
    assert ("FAIL traffic filter: listener traffic_h3: 0 drain-gate traffic filters before the router (want 1)"
            in verify_lines(gw))
    with H3Client(port) as client:
        s = client.get(STREAM)
        client.wait(lambda: client.snapshot(s).chunks >= 1, 10, what="the stream's first chunk")
        assert (status(gw)["active"], http_streams(gw)) == (0, 0), "the count does not see it"
        post(gw, "/drain")
        wait_for(lambda: state(gw) == "CLOSING", 5, what="the flip")
        assert not client.snapshot(s).ended, "the drain flipped with the HTTP/3 stream in flight"
        assert lb(gw) == 503, "the LB is told to take the gateway out under the stream"
        progress = status(gw)["progress"]
        assert progress["active_at_closing"] == 0 and progress["transitions"][0]["active"] == 0
        last = wait_for(lambda: rotation_done(gw), 5, what="the rotation at the flip")
        assert last["trigger"] == "flip"
        assert not client.snapshot(s).ended, "the rotation came while the stream ran"
        client.wait(lambda: client.snapshot(s).ended, 10, what="the stream's end")
        done = client.snapshot(s)
        assert (done.chunks, done.reset) == (CHUNKS, None), "Envoy does not cut it: only the LB's DOWN would"
        # The rotation came while it ran: its response had begun before, and brought no GOAWAY.
        ended = time.monotonic()
        while time.monotonic() < ended + 1.0:
            assert client.goaways() == [] and client.terminated() is None
            time.sleep(0.1)
