"""Failure direction: a dead VM fails each role the safe way.

The VM really fails: tests/fixtures/trap is the real filter with one injected
fault (a request carrying `x-drain-gate-trap` executes `unreachable`), loaded
in place of drain_gate.wasm for one role, same vm_id, everything else as
shipped. One worker, so every request meets the failed VM.

* health listener (FAIL_CLOSED as shipped): every answer becomes 503 — the LB
  takes the gateway out. With FAIL_OPEN the catch-all route answers 503 just
  the same; with FAIL_RELOAD the VM comes back with the state it had.
* traffic listener (FAIL_OPEN as shipped, and FAIL_RELOAD): traffic keeps
  flowing; the dead VM's root stops beating without a goodbye, the health role
  marks the count unreliable, and a drain waits for drain_timeout (forced)
  instead of trusting a 0.
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


def traffic_roles(gw) -> dict:
    return status(gw)["traffic"]


@pytest.mark.parametrize("policy", ["FAIL_OPEN", "FAIL_RELOAD"])
def test_traffic_vm_trapped_mid_drain_closes_forced_at_drain_timeout(custom_gateway, policy):
    """A traffic VM that dies mid-drain: the health role sees its root stop beating
    without a goodbye, marks the count unreliable (log line, metric, status), and
    the drain closes at drain_timeout (forced), never on a 0 it cannot trust."""
    drain_timeout = 8.0
    gw = custom_gateway({"drain_timeout": f"{int(drain_timeout)}s", "lb_buffer": "60m"}, concurrency=1,
                        transform=lambda d, _: with_code(d, "traffic", FIXTURE_WASM, policy))
    # One traffic root per worker VM and one in the main thread's, each registered
    # on its first tick (a VM that fails before that is not seen: envoyfilter/docs/limits.md, Limits).
    roots = wait_for(lambda: (t := traffic_roles(gw))["roots"] == 2 and t, 10, what="both traffic roots registered")
    assert roots["seen"] and roots["lost"] == 0, roots
    held = torture.HeldStreams(gw.ports.traffic, 1)
    try:
        wait_for(lambda: status(gw)["active"] >= 1, 10, what="held stream counted")
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        started = time.monotonic()
        # The VM dies in the middle of a request; Envoy cuts what was in flight on it.
        assert trap(gw.ports.traffic, "/") == 503
        wait_for(lambda: not held.all_open(), 10, what="the in-flight stream cut by the failed VM")
    finally:
        held.close()
    st = wait_for(lambda: (s := status(gw))["count"]["reliable"] is False and s, drain_timeout - 2,
                  interval=0.1, what="count marked unreliable")
    assert st["count"]["unreliable_reason"] == "traffic_role_lost" and st["traffic"]["lost"] >= 1
    assert "event=traffic_role_lost" in gw.log() and "event=count_unreliable why=traffic_role_lost" in gw.log()
    assert gw.stat("wasmcustom.drain_gate_traffic_roles_lost") >= 1
    assert gw.stat("wasmcustom.drain_gate_count_unreliable") == 1
    # The LB answer does not change for it: flipping would cut what is in flight.
    assert fresh_get(gw.ports.health, "/health_check.html")[0] == 200
    if policy == "FAIL_RELOAD":
        # Envoy reloads the VM on the next request after its backoff; the new root
        # registers and counts again. The lost one stays lost: the count stays unreliable.
        wait_for(lambda: fresh_get(gw.ports.traffic, "/")[:3:2] == (200, b"hello\n")
                 and traffic_roles(gw)["roots"] == roots["roots"], 15, interval=0.2,
                 what="the reloaded VM registered")
        assert status(gw)["count"]["reliable"] is False
    else:
        for _ in range(5):
            assert fresh_get(gw.ports.traffic, "/")[:3:2] == (200, b"hello\n"), "fails open"
    while time.monotonic() - started < drain_timeout - 1.0:
        st = status(gw)
        assert st["state"] == "DRAINING", f"flipped before drain_timeout: {st['progress']}"
        time.sleep(0.1)
    wait_for(lambda: status(gw)["state"] == "CLOSING", 10, what="CLOSING at drain_timeout")
    p = status(gw)["progress"]
    assert p["reason"] == "drain_timeout" and p["forced"] is True
