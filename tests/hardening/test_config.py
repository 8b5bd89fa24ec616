"""Bad configuration is refused with a log line naming the key, and never
corrupts the state or the count.

* Every key of `config::KEYS` (read from src/config.rs, so a new key needs a
  case here) refused at load with a log line naming it: Envoy does not start.
* Through Envoy's file-based LDS (a watched directory, the file renamed into
  place): every bad value of every key, for both roles, is rejected while the
  previous listeners keep serving — state and count untouched; and a good
  changed configuration pushed mid-drain takes effect while the FSM state and
  the count carry over (shared data and the gauge are process-wide).
"""
from __future__ import annotations

import copy
import json
import re

import pytest
import requests

from tests.harness import torture
from tests.harness.envoy import REPO, transitions, wait_for
from tests.harness.variants import Lds, set_plugin_config
from tests.harness.wire import fresh_get, post, status

KEYS = re.search(r"pub const KEYS: \[&str; \d+\] = \[(.*?)\];", (REPO / "src" / "config.rs").read_text(), re.S)[1]
KEYS = re.findall(r'"(\w+)"', KEYS)
# At least one refused value per key; the first is used for the start-up case.
BAD = {
    "role": ["both", 7, None],
    "drain_timeout": ["12x", "0s", 120, "2h"],
    "min_drain": ["-1s", "3m", 5],
    "lb_buffer": ["2h", "1.5s", True],
    "tick": ["1ms", "11s", "100"],
    "draining_lb_status": [503, "200"],
    "admin_allow": ["127.0.0.1", ["127.0.0.0/33"], ["localhost"], [8], ["10.0.0.1/8"]],
    "admin_token": ["short", "has spaces in the token", 7],
    "close_after": ["lb_down", 1],
    "lb_fall": [0, 11, 2.5, "2"],
    "lb_down_timeout": ["0s", "61m"],
    "rotate_connections": ["", 0],
    "lb_checkers": [[], ["10.0.0.300/32"], "10.0.0.0/8"],
    "soft_drain_gate": ["yes", 1],
    "draining_new_requests": ["drop", True],
    "refused_requests": ["any", "all", 1],
    "draining_grpc_requests": ["drop", "refuse"],
    "refuse_with": [503, "reset"],
    "termination_watch": ["", 1, "has space"],
    "scrape_interval": ["61s", "-1s", 5],
}
LISTENER = {"health": "drain-gate-health", "traffic": "traffic"}


def test_every_key_has_a_refusal_case():
    assert KEYS and set(BAD) == set(KEYS), f"keys without a case: {set(KEYS) - set(BAD)}"


def bad_config(role: str, key: str, value) -> str:
    cfg = {"role": role, key: value}
    if key == "role":
        cfg = {"role": value} if value is not None else {}
    return json.dumps(cfg)


@pytest.mark.parametrize("key", sorted(BAD))
def test_each_key_refused_at_start(gateway, key):
    gw = gateway(raw_config={"health": bad_config("health", key, BAD[key][0])}, wait_ready=False)
    wait_for(lambda: gw.proc.poll() is not None, 30, what="Envoy refusing to start")
    assert gw.proc.returncode != 0
    lines = [line for line in gw.log().splitlines() if "invalid configuration:" in line]
    assert len(lines) == 1 and f"invalid configuration: {key}: " in lines[0], lines


def stat(gw, name: str) -> int:
    return gw.stat(name) or 0


def push_and_wait(gw, lds: Lds, listeners: list, counter: str) -> None:
    before = stat(gw, counter)
    lds.push(listeners)
    wait_for(lambda: stat(gw, counter) > before, 10, what=counter)


def lds_gateway(custom_gateway, config: dict, **kw):
    box = {}

    def to_lds(doc, workdir):
        box["lds"] = Lds(doc, workdir)
        return box["lds"].doc

    gw = custom_gateway(config, transform=to_lds, **kw)
    return gw, box["lds"]


def with_health_config(lds: Lds, role: str, text: str) -> list:
    listeners = copy.deepcopy(lds.listeners)
    set_plugin_config({"static_resources": {"listeners": listeners}}, LISTENER[role], text)
    return listeners


def test_lds_rejects_every_bad_value_and_the_old_listeners_keep_serving(custom_gateway):
    gw, lds = lds_gateway(custom_gateway, {"drain_timeout": "60m", "lb_buffer": "60m"})
    held = torture.HeldStreams(gw.ports.traffic, 1)
    try:
        wait_for(lambda: status(gw)["active"] == 1, 10, what="held stream counted")
        cases = [(role, key, v) for key, values in BAD.items() for v in values for role in ("health", "traffic")]
        for role, key, value in cases:
            refusals = gw.log().count(f"invalid configuration: {key}: ")
            push_and_wait(gw, lds, with_health_config(lds, role, bad_config(role, key, value)),
                          "listener_manager.lds.update_rejected")
            assert gw.log().count(f"invalid configuration: {key}: ") == refusals + 1, (role, key, value)
            # The previous listeners serve on: plugin answers on fresh connections.
            code, _, body = fresh_get(gw.ports.health, "/live")
            assert code == 200 and json.loads(body) == {"state": "OPEN", "live": True}, (role, key, body)
            assert requests.get(gw.traffic("/"), timeout=5).status_code == 200
        assert stat(gw, "listener_manager.lds.update_rejected") >= len(cases)
        assert stat(gw, "listener_manager.listener_modified") == 0
        # Outside a drain the count may lead by a lease until the next tick: it
        # settles on exactly the one stream still held.
        wait_for(lambda: status(gw)["active"] == 1, 10, what="count settled on the held stream")
        st = status(gw)
        assert st["state"] == "OPEN" and st["count"]["reliable"] is True
        assert held.all_open()
    finally:
        held.close()
    wait_for(lambda: status(gw)["active"] == 0, 10, what="count back to 0")
    assert transitions(gw.log()) == []


def test_lds_good_change_mid_drain_keeps_state_and_count(custom_gateway):
    gw, lds = lds_gateway(custom_gateway, {"drain_timeout": "60m", "lb_buffer": "60m"})
    held = torture.HeldStreams(gw.ports.traffic, 2)
    try:
        wait_for(lambda: status(gw)["active"] == 2, 10, what="held streams counted")
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        before = status(gw)["progress"]
        assert fresh_get(gw.ports.health, "/health_check.html")[0] == 200
        # A changed, valid health configuration: soft drain, another lb_buffer.
        changed = json.dumps({"role": "health", "draining_lb_status": 404, "drain_timeout": "60m",
                              "lb_buffer": "59m"})
        push_and_wait(gw, lds, with_health_config(lds, "health", changed), "listener_manager.lds.update_success")
        wait_for(lambda: stat(gw, "listener_manager.listener_modified") == 1, 10, what="listener modified")
        # The new configuration answers (every worker), with the old state and count.
        wait_for(lambda: all(fresh_get(gw.ports.health, "/health_check.html")[0] == 404 for _ in range(10)), 10,
                 what="soft-drain answers from the new configuration")
        st = status(gw)
        assert st["state"] == "DRAINING" and st["active"] == 2 and st["count"]["reliable"] is True
        assert st["progress"]["drain_started_at"] == before["drain_started_at"]
        assert st["progress"]["transitions"] == before["transitions"]
        assert held.all_open()
    finally:
        held.close()
    # The count the reload carried over reaches 0 and flips the drain.
    wait_for(lambda: status(gw)["state"] == "CLOSING", 10, what="flip after the held streams ended")
    st = status(gw)
    assert st["progress"]["reason"] == "active_zero" and st["active"] == 0
