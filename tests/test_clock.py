"""Timed transitions in a real Envoy whose wall clock is stepped mid-drain:
the timers run on the monotonic clock, so a step forward cannot force the
close early and a step back cannot hold it; the step is logged, counted and
shown in /drain/status."""
from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest
import requests

from tests.harness import istio
from tests.harness.envoy import wait_for
from tests.harness.wallclock import WallClock
from tests.harness.wire import status

HOUR_MS = 3_600_000


def at_ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp() * 1000


@pytest.fixture
def stepped(gateway, tmp_path, monkeypatch):
    """Factory: (Envoy, WallClock) with the wall clock of that Envoy alone steppable."""

    def start(config: dict, envoy_version: str | None = None):
        clock = WallClock(tmp_path / "wallclock")
        with monkeypatch.context() as m:
            for k, v in clock.env().items():
                m.setenv(k, v)
            if envoy_version:
                m.setenv("ENVOY_BIN", istio.envoy_bin(envoy_version))
            gw = gateway(config)
        return gw, clock

    return start


def step_seen(gw, count: int) -> dict:
    return wait_for(lambda: (s := status(gw))["clock"]["steps"] >= count and s, 10,
                    what=f"{count} clock step(s) in /drain/status")


def test_a_forward_step_does_not_force_the_close(stepped, stream):
    timeout_ms = 6_000
    gw, clock = stepped({"min_drain": "0s", "drain_timeout": f"{timeout_ms}ms", "lb_buffer": "60m"})
    assert status(gw)["clock"] == {"timers": "monotonic", "steps": 0, "last_step_ms": None, "last_step_at": None}
    s = stream(gw.traffic("/stream?seconds=60&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    before = time.monotonic()
    assert requests.post(gw.health("/drain"), timeout=5).json()["state"] == "DRAINING"
    clock.step(HOUR_MS)
    seen = step_seen(gw, 1)
    # The filter read a wall clock an hour past the drain's deadline...
    started = at_ms(seen["progress"]["drain_started_at"])
    assert at_ms(seen["clock"]["last_step_at"]) - started > HOUR_MS
    assert abs(seen["clock"]["last_step_ms"] - HOUR_MS) < 1_000, seen["clock"]
    # ...and kept draining: on the monotonic clock the deadline is still ahead.
    assert seen["state"] == "DRAINING", seen["progress"]
    assert seen["progress"]["drain_duration_ms"] < timeout_ms
    assert s.running() and seen["active"] == 1
    assert gw.stat("wasmcustom.drain_gate_clock_steps") == 1, "counted once across workers"
    assert gw.log().count("event=clock_step") == 1, gw.log_tail()
    # The timer still fires, when its time has passed by the test's own clock.
    closing = wait_for(lambda: (st := status(gw))["state"] == "CLOSING" and st, 30, what="forced close")
    assert time.monotonic() - before >= timeout_ms / 1000
    assert closing["progress"]["reason"] == "drain_timeout" and closing["progress"]["forced"]
    assert closing["progress"]["drain_duration_ms"] >= timeout_ms


def test_a_backward_step_does_not_hold_the_timers(stepped, stream):
    gw, clock = stepped({"min_drain": "0s", "drain_timeout": "2s", "lb_buffer": "2s"})
    stream(gw.traffic("/stream?seconds=60&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    before = time.monotonic()
    assert requests.post(gw.health("/drain"), timeout=5).json()["state"] == "DRAINING"
    clock.step(-HOUR_MS)
    seen = step_seen(gw, 1)
    assert abs(seen["clock"]["last_step_ms"] + HOUR_MS) < 1_000, seen["clock"]
    # On the wall clock the drain would now end an hour from now; on the monotonic clock in 4 s.
    closed = wait_for(lambda: (st := status(gw))["state"] == "CLOSED" and st, 30, what="CLOSED despite the step")
    assert time.monotonic() - before >= 4
    steps = [(t["to"], t["reason"]) for t in closed["progress"]["transitions"]]
    assert steps[-2:] == [("CLOSING", "drain_timeout"), ("CLOSED", "lb_buffer_elapsed")]
    assert closed["progress"]["drain_duration_ms"] >= 2_000
    assert gw.stat("wasmcustom.drain_gate_clock_steps") == 1


def test_a_forward_step_does_not_end_a_held_wait(stepped, stream):
    gw, clock = stepped({"min_drain": "0s", "drain_timeout": "60m", "lb_buffer": "60m"})
    stream(gw.traffic("/stream?seconds=60&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    answer: dict = {}

    def hold():
        t = time.monotonic()
        r = requests.post(gw.health("/drain?wait=closed&timeout=3s"), timeout=30)
        answer.update(code=r.status_code, body=r.json(), held=time.monotonic() - t)

    held = threading.Thread(target=hold)
    held.start()
    wait_for(lambda: status(gw)["state"] == "DRAINING", 10, what="the held call started the drain")
    clock.step(HOUR_MS)
    step_seen(gw, 1)
    held.join(30)
    assert answer["code"] == 504 and answer["body"]["wait"] == "timeout", answer
    assert answer["held"] >= 3, "held for its timeout on the monotonic clock, not cut short by the step"


@pytest.mark.parametrize("version", istio.ENVOY_MATRIX)
def test_every_envoy_of_the_matrix_gives_the_monotonic_clock(stepped, version):
    gw, clock = stepped({"min_drain": "30m", "drain_timeout": "60m"}, envoy_version=version)
    assert f"/{version}/" in requests.get(gw.admin("/server_info"), timeout=5).json()["version"]
    assert requests.post(gw.health("/drain"), timeout=5).json()["clock"]["timers"] == "monotonic"
    clock.step(HOUR_MS)
    seen = step_seen(gw, 1)
    assert seen["clock"]["timers"] == "monotonic" and seen["state"] == "DRAINING"
    assert seen["progress"]["drain_duration_ms"] < 60_000, "measured on the monotonic clock"


def test_a_step_moves_no_in_flight_age(stepped, stream):
    """The ages in /drain/status are stamped and read on the monotonic clock:
    across a step of an hour forward and then two back they grow as real time does."""
    gw, clock = stepped({"tick": "100ms"})
    stream(gw.traffic("/stream?seconds=60&interval_ms=500"))

    def oldest() -> tuple[int, float]:
        return status(gw)["in_flight"]["oldest_age_ms"] or 0, time.monotonic()

    wait_for(lambda: oldest()[0] >= 500, 10, what="the stream 0.5 s old")
    age, at = oldest()
    for count, step in ((1, HOUR_MS), (2, -2 * HOUR_MS)):
        clock.step(step)
        step_seen(gw, count)
        later, later_at = oldest()
        assert age <= later <= age + (later_at - at) * 1000 + 100, (step, age, later)
        age, at = later, later_at
