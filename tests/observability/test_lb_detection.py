"""The LB as drain-gate sees it: its check interval measured, and an lb_buffer that does not cover
its detection, against a real HAProxy, real Envoys and a real Prometheus 2.42.

Two gateways behind one HAProxy (haproxy.cfg as written, `inter 500ms`, `fall 2`): `short` has
`lb_buffer: 500ms`, below the LB's detection of its flip (2 × 500 ms); `covered`, the control, has
`lb_buffer: 3s`. Each one's `/drain/status` shows its checker with no interval while it has fewer than 3
gaps, then ≈ 500 ms (within one tick and the jitter); `short` warns that lb_buffer falls ≈ 500 ms
short, `covered` does not; the gauges say the same; and DrainGateLbBufferBelowDetection, evaluated by a
real Prometheus on the rules file as written, fires for `short` and never for `covered`. Then the LB is
restarted with `inter 1s`: both read ≈ 1000 ms, `short` falls ≈ 1500 ms short, `covered` still covers it.
"""
from __future__ import annotations

import json
import time

from tests.harness import wire
from tests.harness.envoy import REPO, wait_for
from tests.harness.haproxy import HAProxy
from tests.harness.prometheus import NAMESPACE, Prometheus

ALERT = "DrainGateLbBufferBelowDetection"
TICK_MS = 100
# How far a measured interval may stray from HAProxy's `inter`: each check starts `inter` after the
# previous one ended (its own few ms), on a shared 2-core machine.
JITTER_MS = 50
CHECKER = "127.0.0.1"
# What each phase read, for the figures envoyfilter/docs/configuration.md quotes.
READ = REPO / "out" / "observability" / "lb_detection.json"


def _checker(gw) -> dict | None:
    found = [c for c in wire.status(gw)["lb"]["checkers"] if c["source"] == CHECKER]
    return found[0] if found else None


def _watch_first_checks(gw, timeout: float = 20) -> list[dict]:
    """The checker's `check_interval` as read from its first appearance until it has an interval."""
    seen: list[dict] = []

    def measured() -> bool:
        c = _checker(gw)
        if c is not None:
            seen.append(c["check_interval"])
        return bool(seen) and seen[-1]["ms"] is not None

    wait_for(measured, timeout, interval=0.05, what=f"{CHECKER}'s interval measured")
    return seen


def _near(ms: int | None, inter_ms: int) -> bool:
    return ms is not None and abs(ms - inter_ms) <= TICK_MS + JITTER_MS


def _interval_settles(gw, inter_ms: int, timeout: float) -> dict:
    """The checker once its 8 last gaps are all the LB's `inter_ms` (a new LB's first gaps mix with
    the last ones of the LB before it)."""
    def settled() -> dict | None:
        c = _checker(gw)
        i = c and c["check_interval"]
        ok = i and i["gaps"] == 8 and all(_near(i[k], inter_ms) for k in ("ms", "min_gap_ms", "max_gap_ms"))
        return c if ok else None

    return wait_for(settled, timeout, interval=0.2, what=f"{CHECKER}'s 8 last gaps ≈ {inter_ms} ms")


def _detection(gw) -> dict:
    return wire.status(gw)["lb"]["detection"]


def _assert_detection(d: dict, inter_ms: int, lb_buffer_ms: int) -> None:
    assert d["checker"] == CHECKER and _near(d["check_interval_ms"], inter_ms), d
    assert (d["lb_fall"], d["detection_ms"]) == (2, 2 * d["check_interval_ms"]), d
    assert (d["wait"], d["wait_ms"]) == ("lb_buffer", lb_buffer_ms), d
    assert d["short_ms"] == max(0, d["detection_ms"] - lb_buffer_ms), d
    if d["short_ms"]:
        assert d["warning"].startswith(f"lb_buffer ({lb_buffer_ms} ms) is {d['short_ms']} ms shorter"), d
        assert CHECKER in d["warning"], d
    else:
        assert d["warning"] is None, d


def _gauge(gw, name: str) -> int | None:
    return gw.stat(f"wasmcustom.{name}")


def test_the_lb_s_interval_is_measured_and_a_short_lb_buffer_warns_and_pages(gateway, tmp_path):
    short = gateway({"lb_buffer": "500ms", "tick": f"{TICK_MS}ms"})
    covered = gateway({"lb_buffer": "3s", "tick": f"{TICK_MS}ms"})
    gws = {"short": short, "covered": covered}
    read: dict[str, dict] = {}

    def keep(phase: str) -> None:
        read[phase] = {name: {"checker": _checker(gw)["check_interval"], "detection": _detection(gw)}
                       for name, gw in gws.items()}
        READ.parent.mkdir(parents=True, exist_ok=True)
        READ.write_text(json.dumps(read, indent=1))

    backends = [(gw.ports.traffic, gw.ports.health) for gw in gws.values()]
    for gw in gws.values():
        assert wire.status(gw)["lb"]["detection"] is None, "no LB yet"

    with Prometheus({name: gw.ports.admin for name, gw in gws.items()}, tmp_path / "prometheus") as prom:
        with HAProxy(tmp_path / "haproxy-500ms", backends, inter="500ms", tls=False) as lb:
            first = _watch_first_checks(short)
            # A checker that just appeared: gaps, but no interval until there are 3.
            assert any(i["ms"] is None and i["gaps"] < 3 for i in first), first
            assert all((i["ms"] is None) == (i["gaps"] < 3) for i in first), first
            for name, gw in gws.items():
                c = _interval_settles(gw, 500, 20)
                assert c["check_interval"]["min_gap_ms"] <= c["check_interval"]["ms"], c
                assert c["check_interval"]["ms"] <= c["check_interval"]["max_gap_ms"], c
                lb.wait_status("gw1" if name == "short" else "gw2", "UP", 10)
            _assert_detection(_detection(short), 500, 500)
            assert _detection(short)["short_ms"] >= 500 - 2 * (TICK_MS + JITTER_MS)
            _assert_detection(_detection(covered), 500, 3000)
            assert _detection(covered)["short_ms"] == 0
            keep("inter 500ms")

            # The gauges: set by the health role's tick, once a second.
            wait_for(lambda: _near(_gauge(short, "drain_gate_lb_check_interval_ms"), 500)
                     and (_gauge(short, "drain_gate_lb_buffer_short_ms") or 0) >= 300, 5, interval=0.1,
                     what="short's gauges")
            wait_for(lambda: _near(_gauge(covered, "drain_gate_lb_check_interval_ms"), 500), 5, interval=0.1,
                     what="covered's interval gauge")
            assert _gauge(covered, "drain_gate_lb_buffer_short_ms") == 0

            # The alert, on the rules file as written (`for: 1m`): short's pod, and only it.
            firing = wait_for(lambda: prom.alerts(ALERT, "firing"), 100, interval=0.5, what=f"{ALERT} firing")
            assert [(a["namespace"], a["pod"], a["severity"]) for a in firing] == [(NAMESPACE, "short", "warning")]
            value = prom.value('drain_gate_lb_buffer_short_ms{pod="short"}')
            assert value is not None and 300 <= value <= 700, value
            seen = time.time()
            wait_for(lambda: prom.evaluated_since(ALERT, seen), 10, interval=0.2, what=f"{ALERT} evaluated again")
            assert [a["pod"] for a in prom.alerts(ALERT, "firing")] == ["short"]
            assert [a["pod"] for a in prom.alerts(ALERT, "pending")] == [], "covered never"
            assert prom.value('drain_gate_lb_buffer_short_ms{pod="covered"}') == 0

        # The LB checks every second now: the same checkers, their interval follows.
        with HAProxy(tmp_path / "haproxy-1s", backends, inter="1s", tls=False):
            for gw in gws.values():
                _interval_settles(gw, 1000, 30)
            _assert_detection(_detection(short), 1000, 500)
            assert _detection(short)["short_ms"] >= 1500 - 2 * (TICK_MS + JITTER_MS)
            _assert_detection(_detection(covered), 1000, 3000)
            keep("inter 1s")
            wait_for(lambda: _near(_gauge(short, "drain_gate_lb_check_interval_ms"), 1000)
                     and (_gauge(short, "drain_gate_lb_buffer_short_ms") or 0) >= 1300, 5, interval=0.1,
                     what="short's gauges at inter 1s")
            assert _gauge(covered, "drain_gate_lb_buffer_short_ms") == 0
