"""The health role knows whether a traffic role counts in its vm_id.

* A gateway whose traffic filter is not loaded is not announced: LB check and
  readiness 503, `/drain/status` says `"waiting_for": "traffic_role"`; once a
  listener with the traffic filter arrives through file-based LDS, 200/200.
* An LDS update that replaces the traffic filter mid-drain: the old roots say
  goodbye, the new ones register — nothing is marked unreliable, and the drain
  keeps its state and count and flips on the real 0.
* Every traffic root removed without a replacement (the filter taken off the
  listener): the count is marked unreliable (`traffic_role_gone`) and a drain
  closes at drain_timeout, forced.

(A traffic VM that dies: tests/hardening/test_failure.py.)
"""
from __future__ import annotations

import copy
import json
import time

from tests.harness import torture
from tests.harness.envoy import hcm, wait_for
from tests.harness.variants import Lds
from tests.harness.wire import fresh_get, post, status

HEALTH, TRAFFIC = "drain-gate-health", "traffic"


def lds_gateway(custom_gateway, config: dict, only: list[str] | None = None, **kw):
    """A gateway whose listeners come from file-based LDS; `only` names the ones loaded first."""
    box = {}

    def to_lds(doc, workdir):
        box["all"] = copy.deepcopy(doc["static_resources"]["listeners"])
        if only is not None:
            doc = copy.deepcopy(doc)
            doc["static_resources"]["listeners"] = [x for x in box["all"] if x["name"] in only]
        box["lds"] = Lds(doc, workdir)
        return box["lds"].doc

    gw = custom_gateway(config, transform=to_lds, **kw)
    return gw, box["lds"], box["all"]


def answer(gw, path: str) -> int:
    return fresh_get(gw.ports.health, path)[0]


def without_traffic_filter(listeners: list) -> list:
    out = copy.deepcopy(listeners)
    for lst in out:
        if lst["name"] == TRAFFIC:
            filters = hcm(lst)["http_filters"]
            filters[:] = [f for f in filters if f["name"] != "drain-gate"]
    return out


def with_traffic_config(listeners: list, **changes) -> list:
    out = copy.deepcopy(listeners)
    for lst in out:
        if lst["name"] == TRAFFIC:
            for f in hcm(lst)["http_filters"]:
                if f["name"] == "drain-gate":
                    value = f["typed_config"]["config"]["configuration"]
                    value["value"] = json.dumps({**json.loads(value["value"]), **changes})
    return out


def test_not_announced_until_a_traffic_role_registers(custom_gateway):
    gw, lds, listeners = lds_gateway(custom_gateway, {}, only=[HEALTH])
    wait_for(lambda: answer(gw, "/live") == 200, 10, what="health listener serving")
    # Watched for several ticks: never announced while nothing counts.
    for _ in range(10):
        assert answer(gw, "/health_check.html") == 503
        assert answer(gw, "/health") == 503
        time.sleep(0.05)
    code, _, body = fresh_get(gw.ports.health, "/health")
    assert json.loads(body) == {"state": "OPEN", "ready": False, "waiting_for": "traffic_role"}
    st = status(gw)
    assert st["waiting_for"] == "traffic_role" and st["ready"] is False and st["lb_status"] == 503
    assert {k: st["traffic"][k] for k in ("seen", "roots", "lost", "lost_total")} == \
        {"seen": False, "roots": 0, "lost": 0, "lost_total": 0}
    assert st["count"]["reliable"] is False
    # The traffic listener, with its filter, arrives through LDS.
    lds.push(listeners)
    wait_for(lambda: answer(gw, "/health_check.html") == 200 and answer(gw, "/health") == 200, 15,
             what="announced once the traffic role registered")
    st = status(gw)
    assert st["waiting_for"] is None and st["ready"] is True and st["traffic"]["seen"] is True
    assert st["traffic"]["roots"] >= 1 and st["count"]["reliable"] is True
    # Answers stay 200 from every worker.
    assert {answer(gw, "/health_check.html") for _ in range(10)} == {200}


def watch_reliable(gw, seconds: float, **expect) -> dict:
    """Polls the status for `seconds`: the count stays reliable and `expect` holds throughout."""
    until = time.monotonic() + seconds
    while True:
        st = status(gw)
        assert st["count"]["reliable"] is True, st["count"]
        assert {k: st[k] for k in expect} == expect, st
        if time.monotonic() >= until:
            return st
        time.sleep(0.1)


def test_lds_replacing_the_traffic_filter_mid_drain_marks_nothing(custom_gateway):
    # Envoy keeps the replaced filter chain (and its root contexts) for the listener
    # drain time: the held streams stay on it until they end or it runs out.
    gw, lds, _ = lds_gateway(custom_gateway, {"drain_timeout": "60m", "lb_buffer": "60m"}, drain_time_s=6)
    wait_for(lambda: status(gw)["traffic"]["roots"] >= 2, 10, what="traffic roots registered")
    held = torture.HeldStreams(gw.ports.traffic, 2)
    try:
        wait_for(lambda: status(gw)["active"] == 2, 10, what="held streams counted")
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        before = status(gw)
        # A changed traffic configuration: a new filter (new root contexts) on the listener.
        lds.push(with_traffic_config(lds.listeners, tick="50ms"))
        wait_for(lambda: (gw.stat("listener_manager.listener_modified") or 0) == 1, 10, what="listener modified")
        wait_for(lambda: status(gw)["traffic"]["roots"] > before["traffic"]["roots"], 10,
                 what="the new filter's roots registered")
        # Longer than a lost root takes to be noticed (liveness::STALE_MIN_MS).
        st = watch_reliable(gw, 3.0, state="DRAINING", active=2)
        assert st["progress"]["drain_started_at"] == before["progress"]["drain_started_at"]
        assert held.all_open()
    finally:
        held.close()
    wait_for(lambda: status(gw)["state"] == "CLOSING", 10, what="flip on the real 0")
    p = status(gw)["progress"]
    assert p["reason"] == "active_zero" and p["forced"] is False
    # The old filter chain goes at the end of the listener drain: its roots say goodbye.
    wait_for(lambda: "why=goodbye" in gw.log(), 15, what="the replaced roots said goodbye")
    st = watch_reliable(gw, 3.0, state="CLOSING")
    assert st["traffic"]["lost"] == 0 and st["traffic"]["roots"] == before["traffic"]["roots"]
    assert "event=traffic_role_lost" not in gw.log()


def test_traffic_filter_removed_marks_the_count_unreliable(custom_gateway):
    drain_timeout = 6.0
    gw, lds, _ = lds_gateway(custom_gateway, {"drain_timeout": f"{int(drain_timeout)}s", "lb_buffer": "60m"})
    wait_for(lambda: status(gw)["traffic"]["roots"] >= 2, 10, what="traffic roots registered")
    lds.push(without_traffic_filter(lds.listeners))
    st = wait_for(lambda: (s := status(gw))["count"]["reliable"] is False and s, 15, interval=0.1,
                  what="count marked unreliable")
    assert st["count"]["unreliable_reason"] == "traffic_role_gone" and st["traffic"]["roots"] == 0
    assert st["traffic"]["lost"] == 0, "a goodbye is not a failure"
    assert "event=count_unreliable why=traffic_role_gone" in gw.log()
    # Still announced (a flip would cut what is in flight) ...
    assert answer(gw, "/health_check.html") == 200
    # ... but a drain with uncounted streams in flight cannot trust the 0.
    held = torture.HeldStreams(gw.ports.traffic, 1)
    try:
        assert status(gw)["active"] == 0, "the stream runs uncounted"
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        started = time.monotonic()
        while time.monotonic() - started < drain_timeout - 1.0:
            assert status(gw)["state"] == "DRAINING", "flipped on an untrusted 0"
            time.sleep(0.1)
        wait_for(lambda: status(gw)["state"] == "CLOSING", 10, what="CLOSING at drain_timeout")
        p = status(gw)["progress"]
        assert p["reason"] == "drain_timeout" and p["forced"] is True
    finally:
        held.close()
