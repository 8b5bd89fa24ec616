"""Who counts as an LB checker: the eviction attack, with and without `lb_checkers`.

The health role remembers at most 32 checkers (`gate::lb::MAX_CHECKERS`), the longest
unseen evicted first. Anyone who reaches :18180 (a NodePort on every node) can
ask `/health_check.html` from 32 addresses — here 127.0.0.2 … 127.0.0.33 on
loopback — and push the real LB (127.0.0.1) out of the table. In a gated soft
drain that makes "every checker was served the 404" true before the LB saw
it: the gateway flips to 503 and the LB goes from UP straight to DOWN.

* default (`lb_checkers` absent: every source counts): the attack evicts the
  LB and flips the drain — what the key exists for;
* `lb_checkers: ["127.0.0.1/32"]`: the spoofed sources are answered but not
  recorded; the drain waits for the LB's own 404, and flips on it.
"""
from __future__ import annotations

import time

from tests.harness.envoy import wait_for
from tests.harness.wire import fresh_get, post, status

LB = "127.0.0.1"
SPOOFED = [f"127.0.0.{i}" for i in range(2, 34)]
SOFT = {"draining_lb_status": 404, "min_drain": "0s", "drain_timeout": "60s", "lb_buffer": "60m"}


def check_from(gw, source: str) -> int:
    return fresh_get(gw.ports.health, "/health_check.html", source=source)[0]


def drain_then_spoof(gw) -> dict:
    assert check_from(gw, LB) == 200  # the LB is a checker, served 200 before the drain
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    st = status(gw)
    assert st["state"] == "DRAINING" and st["active"] == 0 and st["lb"]["saw_drain"] is False, st["lb"]
    for src in SPOOFED:
        assert check_from(gw, src) == 404
    return status(gw)


def test_spoofed_checkers_evict_the_lb_when_every_source_counts(gateway):
    gw = gateway(SOFT)
    st = drain_then_spoof(gw)
    sources = {c["source"] for c in st["lb"]["checkers"]}
    assert LB not in sources and len(sources) == 32, "the LB was evicted"
    # Every checker left was served a 404: the gate opened without the LB seeing one.
    assert st["state"] == "CLOSING" and st["progress"]["reason"] == "active_zero", st["progress"]


def test_lb_checkers_keeps_spoofed_sources_out(gateway):
    gw = gateway({**SOFT, "lb_checkers": [f"{LB}/32"]})
    st = drain_then_spoof(gw)
    assert [c["source"] for c in st["lb"]["checkers"]] == [LB]
    # Several ticks: the drain still waits for the LB's own 404.
    for _ in range(10):
        assert status(gw)["state"] == "DRAINING"
        time.sleep(0.05)
    assert check_from(gw, LB) == 404
    st = wait_for(lambda: (s := status(gw))["state"] == "CLOSING" and s, 5, what="flip on the LB's 404")
    assert st["progress"]["reason"] == "active_zero"
    assert st["lb"]["checkers"][0]["last_404"] is not None


def test_an_lb_outside_lb_checkers_is_seen_and_the_gate_holds(gateway):
    """`lb_checkers` names an address the LB's checks do not come from (SNAT, a wrong CIDR):
    nothing the LB is served is recorded. The gate does not open on the vacuum — nobody it
    waits for was seen — and says so: `lb.gate: no_checker`, the ignored checks counted
    (status, metric) and one log line naming the source. The drain closes at drain_timeout,
    unforced (nothing was in flight)."""
    drain_timeout = 4
    gw = gateway({**SOFT, "drain_timeout": f"{drain_timeout}s", "lb_checkers": ["127.0.0.9/32"]})
    for _ in range(3):
        assert check_from(gw, LB) == 200
    st = status(gw)
    assert st["lb"]["checkers"] == [] and st["lb"]["live_checkers"] == 0
    assert st["lb"]["ignored_checks"]["count"] == 3 and st["lb"]["ignored_checks"]["last_source"] == LB
    assert gw.stat("wasmcustom.drain_gate_lb_checks_ignored") == 3
    assert gw.log().count(f"event=lb_check_ignored source={LB}") == 1, "logged once per source"
    started = time.monotonic()
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    while time.monotonic() - started < drain_timeout - 1:
        assert check_from(gw, LB) == 404, "the LB is served the soft drain all the same"
        st = status(gw)
        assert (st["state"], st["lb"]["gate"], st["lb"]["saw_drain"]) == ("DRAINING", "no_checker", False)
        time.sleep(0.2)
    st = wait_for(lambda: (s := status(gw))["state"] == "CLOSING" and s, 5, what="CLOSING at drain_timeout")
    assert (st["progress"]["reason"], st["progress"]["forced"]) == ("drain_timeout", False)
