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
from tests.harness.wire import fresh_get, status

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


MINUTE_MS = 60_000


class Checker(threading.Thread):
    """An LB checker: `GET /health_check.html` every 200 ms from 127.0.0.1 (HAProxy's
    HTTP/1.0 check), pausable; `served` is every answer it got, in order."""

    def __init__(self, gw):
        super().__init__(daemon=True)
        self.gw, self.served, self.stop = gw, [], threading.Event()
        self.paused = threading.Event()
        # Held while a check is in flight, until its answer is in `served`.
        self.checking = threading.Lock()

    def run(self):
        while not self.stop.is_set():
            with self.checking:
                if not self.paused.is_set():
                    self.served.append(fresh_get(self.gw.ports.health, "/health_check.html")[0])
            time.sleep(0.2)

    def pause(self):
        """Until `paused` is cleared: the check in flight, if any, has been answered and
        recorded when this returns."""
        self.paused.set()
        with self.checking:
            pass


@pytest.fixture
def checker():
    started = []

    def start(gw) -> Checker:
        c = Checker(gw)
        c.start()
        started.append(c)
        wait_for(lambda: len(c.served) >= 2, 5, what="the checker recorded")
        return c

    yield start
    for c in started:
        c.stop.set()
        c.join(2)


@pytest.mark.parametrize("step", [MINUTE_MS, -MINUTE_MS], ids=["forward", "back"])
def test_a_step_neither_opens_nor_shuts_the_soft_drain_gate(stepped, checker, step):
    """The gate waits for the LB to be served a 404 since the drain began. The checker record
    runs on the monotonic clock: a minute forward does not age the checker out (which would
    open the gate with the LB never served the 404: UP straight to DOWN), a minute back does
    not date the 404 before the drain (which would hold the gate to drain_timeout)."""
    gw, clock = stepped({"draining_lb_status": 404, "drain_timeout": "60s", "lb_buffer": "60m"})
    lb = checker(gw)
    lb.pause()
    assert requests.post(gw.health("/drain"), timeout=5).json()["state"] == "DRAINING"
    clock.step(step)
    step_seen(gw, 1)
    for _ in range(10):  # a second of health ticks without a check
        st = status(gw)
        assert (st["state"], st["lb"]["gate"], st["lb"]["saw_drain"]) == ("DRAINING", "waiting", False), st["lb"]
        time.sleep(0.1)
    lb.paused.clear()
    st = wait_for(lambda: (s := status(gw))["state"] == "CLOSING" and s, 5, what="the flip at the 404")
    # The checker records its answer after the gateway flipped on it.
    wait_for(lambda: 404 in lb.served, 5, what="the checker served its 404")
    assert st["progress"]["reason"] == "active_zero"
    assert st["progress"]["drain_duration_ms"] < 5_000, "not held to drain_timeout"


@pytest.mark.parametrize("step", [MINUTE_MS, -MINUTE_MS], ids=["forward", "back"])
def test_a_step_moves_neither_the_observed_down_nor_the_buffer_after_it(stepped, checker, step):
    """close_after lb_observed_down: CLOSED lb_buffer after the LB's lb_fall-th 503, on the
    monotonic clock — a minute forward does not shorten the buffer, a minute back does not
    make the DOWN look older than CLOSING (which would wait for lb_down_timeout)."""
    buffer_s = 3
    gw, clock = stepped({"close_after": "lb_observed_down", "lb_fall": 2, "lb_buffer": f"{buffer_s}s",
                         "lb_down_timeout": "60s"})
    lb = checker(gw)
    assert requests.post(gw.health("/drain"), timeout=5).json()["state"] == "CLOSING"
    down = wait_for(lambda: status(gw)["lb"]["observed_down"] and time.monotonic(), 5,
                    interval=0.02, what="the LB observed DOWN")
    clock.step(step)
    step_seen(gw, 1)
    closed = wait_for(lambda: (s := status(gw))["state"] == "CLOSED" and s, 20, interval=0.05,
                      what="CLOSED after the buffer")
    waited = time.monotonic() - down
    assert buffer_s - 0.3 <= waited <= buffer_s + 2, waited
    assert closed["progress"]["reason"] == "lb_observed_down"
    assert lb.served.count(503) >= 2
