"""A stall of the whole Envoy process never disarms the drain.

CPU throttling under a container CPU limit, a long xDS push, a big
`/config_dump` or a node under memory pressure stop istio-proxy for a few
seconds. Here the real thing: SIGSTOP for 3.5 s — longer than the 2 s after
which a silent traffic root counts as lost — then SIGCONT. The health role
sees that it did not run either (`traffic.stalls`), judges silence afresh, and
nothing is lost: an idle drain then flips at once, unforced, and a drain with
a stream in flight holds 200 until the stream ends and flips then.

The control, in the same rig: a traffic VM that really dies (the trap fixture)
after the same stall is lost for good, and the drain waits for drain_timeout
instead of trusting a 0 (tests/hardening/test_failure.py has it under both
fail policies).
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import requests

from tests.harness import torture
from tests.harness.envoy import wait_for
from tests.harness.variants import FIXTURE_WASM, TRAP_HEADER, with_code
from tests.harness.wire import fresh_get, post, status

STALL_S = 3.5


def stall(gw, seconds: float = STALL_S) -> None:
    """Stops the whole Envoy process for `seconds` (every worker, the main thread)."""
    before = status(gw)["traffic"]["stalls"]
    os.kill(gw.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the stall itself: nothing in Envoy runs meanwhile
    finally:
        os.kill(gw.proc.pid, signal.SIGCONT)
    wait_for(lambda: status(gw)["traffic"]["stalls"] > before, 5, what="the health role saw the stall")


def settled(gw) -> dict:
    """The status once every root beat again after a stall (a few ticks)."""
    return wait_for(lambda: (s := status(gw))["traffic"]["roots"] >= 3 and s["count"]["reliable"] and s,
                    5, what="every traffic root beating, the count trusted")


def lb(gw) -> int:
    return fresh_get(gw.ports.health, "/health_check.html")[0]


def test_after_a_stall_an_idle_drain_flips_at_once_unforced(gateway):
    gw = gateway({"lb_buffer": "60m"})
    wait_for(lambda: status(gw)["traffic"]["roots"] >= 3, 10, what="every traffic root registered")
    stall(gw)
    time.sleep(3)  # as an operator would: the drain comes some time after the stall
    st = settled(gw)
    assert st["traffic"]["lost"] == 0 and st["traffic"]["lost_total"] == 0, st["traffic"]
    assert "event=traffic_role_lost" not in gw.log() and "event=stall late_ms=" in gw.log()
    t0 = time.monotonic()
    moved = post(gw, "/drain").json()
    assert moved["state"] == "CLOSING", moved["progress"]
    assert time.monotonic() - t0 < 1.0
    p = status(gw)["progress"]
    assert (p["reason"], p["forced"]) == ("active_zero", False)


def test_after_a_stall_a_drain_holds_for_its_stream_and_flips_when_it_ends(gateway):
    gw = gateway({"lb_buffer": "60m", "drain_timeout": "60s"})
    wait_for(lambda: status(gw)["traffic"]["roots"] >= 3, 10, what="every traffic root registered")
    held = torture.HeldStreams(gw.ports.traffic, 1)
    try:
        wait_for(lambda: status(gw)["active"] >= 1, 5, what="the stream counted")
        stall(gw)  # the stream stays in flight through it
        assert held.all_open()
        st = settled(gw)
        assert st["active"] == 1 and st["traffic"]["lost_total"] == 0, st
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        for _ in range(10):
            assert (lb(gw), status(gw)["state"]) == (200, "DRAINING"), "held while the stream runs"
            time.sleep(0.1)
        assert held.all_open()
    finally:
        held.close()
    st = wait_for(lambda: (s := status(gw))["state"] == "CLOSING" and s, 2, interval=0.02,
                  what="the flip when the stream ended")
    assert (st["progress"]["reason"], st["progress"]["forced"]) == ("active_zero", False)
    assert lb(gw) == 503


def test_control_a_vm_that_really_dies_after_the_stall_is_lost_and_the_drain_waits(custom_gateway):
    """The same stall, then a traffic VM traps for real: its root never beats again, the
    count is not trusted, and an idle drain waits for drain_timeout."""
    drain_timeout = 6
    gw = custom_gateway({"drain_timeout": f"{drain_timeout}s", "lb_buffer": "60m"}, concurrency=1,
                        transform=lambda d, _: with_code(d, "traffic", FIXTURE_WASM, "FAIL_OPEN"))
    wait_for(lambda: status(gw)["traffic"]["roots"] == 2, 10, what="both traffic roots registered")
    stall(gw)
    wait_for(lambda: status(gw)["count"]["reliable"], 5, what="trusted after the stall")
    assert fresh_get(gw.ports.traffic, "/", headers={TRAP_HEADER: "1"})[0] == 503
    wait_for(lambda: status(gw)["count"]["unreliable_reason"] == "traffic_role_lost", 6, interval=0.1,
             what="the dead VM's root lost")
    assert requests.get(gw.traffic("/"), timeout=5).status_code == 200, "traffic fails open"
    started = time.monotonic()
    assert post(gw, "/drain").json()["state"] == "DRAINING", "no 0 is trusted"
    while time.monotonic() - started < drain_timeout - 1.0:
        assert status(gw)["state"] == "DRAINING"
        time.sleep(0.2)
    wait_for(lambda: status(gw)["state"] == "CLOSING", 5, what="CLOSING at drain_timeout")
    assert status(gw)["progress"]["reason"] == "drain_timeout"
    assert status(gw)["traffic"]["lost"] >= 1, "a dead VM never comes back"


@pytest.fixture(scope="module", autouse=True)
def _fixture_built():
    if not FIXTURE_WASM.exists():
        pytest.fail(f"{FIXTURE_WASM} is missing: run `make fixtures` (part of `make test`)")
