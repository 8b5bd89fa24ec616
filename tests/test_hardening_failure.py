"""Failure direction: a dead VM fails each role the safe way.

The VM really fails: tests/fixtures/trap is the real filter with one injected
fault (a request carrying `x-drain-gate-trap` executes `unreachable`), loaded
in place of drain_gate.wasm for one role, same vm_id, everything else as
shipped. One worker, so every request meets the failed VM.

* health listener (FAIL_CLOSED as shipped): every answer becomes 503 — the LB
  takes the gateway out. With FAIL_OPEN the catch-all route answers 503 just
  the same; with FAIL_RELOAD the VM comes back with the state it had.
* traffic listener (FAIL_OPEN as shipped): traffic keeps flowing; what the dead
  VM had counted is never given back, so the count can only over-count and a
  drain waits for drain_timeout instead of flipping early.
"""
from __future__ import annotations

import json
import time

import pytest
import requests

from tests.harness import torture
from tests.harness.envoy import wait_for
from tests.harness.variants import FIXTURE_WASM, TRAP_HEADER, plugin, with_code
from tests.harness.wire import fresh_get, post, status

TRAPPED = "Function: proxy_on_request_headers failed: Uncaught RuntimeError: unreachable"


@pytest.fixture(scope="module", autouse=True)
def _fixture_built():
    if not FIXTURE_WASM.exists():
        pytest.fail(f"{FIXTURE_WASM} is missing: run `make fixtures` (part of `make test`)")


def trap(port: int, path: str) -> int:
    code, _, _ = fresh_get(port, path, headers={TRAP_HEADER: "1"})
    return code


def answers(gw, n: int = 10) -> set:
    seen = set()
    for _ in range(n):
        for path in ["/health_check.html", "/health", "/live", "/drain/status"]:
            code, _, body = fresh_get(gw.ports.health, path)
            seen.add((code, body))
        code, _, body = fresh_get(gw.ports.health, "/drain", method="POST")
        seen.add((code, body))
    return seen


def test_shipped_failure_policies():
    """What the tests below assume of envoyfilter/envoy.yaml."""
    from tests.harness.envoy import Ports, render

    doc = render(Ports())
    assert plugin(doc, "drain-gate-health")["failure_policy"] == "FAIL_CLOSED"
    assert plugin(doc, "traffic")["failure_policy"] == "FAIL_OPEN"


def test_health_vm_failure_fails_closed(custom_gateway):
    gw = custom_gateway({"lb_buffer": "60m"}, concurrency=1,
                        transform=lambda d, _: with_code(d, "drain-gate-health", FIXTURE_WASM))
    assert fresh_get(gw.ports.health, "/health_check.html")[:3:2] == (200, b"OK\n")
    assert trap(gw.ports.health, "/live") == 503
    assert TRAPPED in gw.log()
    # Every answer, for every audience, is now 503: the LB takes the gateway out.
    assert {code for code, _ in answers(gw)} == {503}
    # Traffic is not affected (its VM is another one).
    assert requests.get(gw.traffic("/"), timeout=5).status_code == 200


def test_health_vm_failure_with_fail_open_reaches_the_catch_all_503(custom_gateway):
    """Defence in depth: even a health filter that failed open cannot answer 200."""
    gw = custom_gateway({"lb_buffer": "60m"}, concurrency=1,
                        transform=lambda d, _: with_code(d, "drain-gate-health", FIXTURE_WASM, "FAIL_OPEN"))
    assert trap(gw.ports.health, "/live") == 503
    assert answers(gw) == {(503, b"drain-gate unavailable\n")}


def test_health_vm_failure_with_fail_reload_comes_back_with_its_state(custom_gateway):
    gw = custom_gateway({"min_drain": "30m", "drain_timeout": "60m", "lb_buffer": "60m"}, concurrency=1,
                        transform=lambda d, _: with_code(d, "drain-gate-health", FIXTURE_WASM, "FAIL_RELOAD"))
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    before = status(gw)["progress"]
    assert trap(gw.ports.health, "/live") == 503
    # Closed until the VM is reloaded (Envoy's backoff, 1 s by default), then
    # the reloaded VM reads the state from shared data: nothing was lost.
    seen = []

    def back():
        code, _, body = fresh_get(gw.ports.health, "/drain/status")
        seen.append(code)
        return code == 200 and json.loads(body)
    st = wait_for(back, 15, interval=0.05, what="the reloaded VM answering")
    assert set(seen) == {503, 200} and seen[0] == 503, seen
    assert st["state"] == "DRAINING" and st["progress"]["drain_started_at"] == before["drain_started_at"]
    assert st["progress"]["transitions"] == before["transitions"]


def test_traffic_vm_failure_fails_open_and_only_over_counts(custom_gateway):
    drain_timeout = 4.0
    gw = custom_gateway({"drain_timeout": f"{int(drain_timeout)}s", "lb_buffer": "60m"}, concurrency=1,
                        transform=lambda d, _: with_code(d, "traffic", FIXTURE_WASM))
    held = torture.HeldStreams(gw.ports.traffic, 1)
    try:
        wait_for(lambda: status(gw)["active"] >= 1, 10, what="held stream counted")
        # The VM dies in the middle of a request.
        assert trap(gw.ports.traffic, "/") == 503
        assert TRAPPED in gw.log()
        # Envoy cuts what was in flight on the dead VM ...
        wait_for(lambda: not held.all_open(), 10, what="the in-flight stream cut by the failed VM")
    finally:
        held.close()
    # ... and lets all new traffic through, uncounted (fail open).
    for _ in range(20):
        code, _, body = fresh_get(gw.ports.traffic, "/")
        assert (code, body) == (200, b"hello\n")
    # Nothing is in flight now, but the dead VM never gave back what it counted.
    # Watched over ten ticks: nothing settles it back to 0.
    watch = time.monotonic()
    while time.monotonic() - watch < 1.0:
        assert status(gw)["active"] >= 1, "a dead VM's count was given back: it could under-count"
        time.sleep(0.05)
    assert status(gw)["count"]["reliable"] is True
    # So a drain cannot flip on "active = 0": it waits for drain_timeout.
    r = post(gw, "/drain")
    assert r.status_code == 200 and r.json()["state"] == "DRAINING"
    started = time.monotonic()
    while time.monotonic() - started < drain_timeout - 1.0:
        st = status(gw)
        assert st["state"] == "DRAINING", f"flipped early with nothing really in flight: {st['progress']}"
        assert st["active"] >= 1
        time.sleep(0.1)
    wait_for(lambda: status(gw)["state"] == "CLOSING", drain_timeout + 5, what="CLOSING at drain_timeout")
    p = status(gw)["progress"]
    assert p["reason"] == "drain_timeout" and p["forced"] is True and p["active_at_closing"] >= 1
