"""The smallest form of `make replicas` (tests/fleet/replicas.py): 3 gateways behind HAProxy
under a fixed-rate open-loop load, one round of `before` (all OPEN) and `drain` (one gateway
deleted: drain-gate's preStop, DRAINING → CLOSED, exit), then the control in the same rig and
load: a gateway SIGKILLed with slow requests on it.

What it proves: the harness measures something real — the others served requests in both
phases and have a positive p99 and CPU per request; their share grew when one drained; the drain
lost nothing (client and HAProxy's log) and HAProxy sent the drained gateway no request after its
CLOSED; the control's kill is counted lost by the same accounting, so a loss would show."""
from __future__ import annotations

import pytest

from tests.fleet import replicas


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    return replicas.measure(3, rate=100, seconds=4, rounds=1, phases=("before", "drain", "kill"),
                            workdir=tmp_path_factory.mktemp("replicas"), warmup=0.5)


def phase(result: dict, name: str) -> dict:
    return next(p for p in result["phases"] if p["phase"] == name)


def test_the_others_served_and_are_measured(result):
    for name in ("before", "drain"):
        p = phase(result, name)
        assert len(p["others"]) == 2 and p["others_served"] >= 0.5 * 100 * p["seconds"], p
        for k in ("others_p99_ms", "others_worker_us_per_req", "others_proc_us_per_req", "others_worker_core_pct"):
            assert p[k] and p[k] > 0, (name, k, p)
        assert 80 <= p["rate_req_s"] <= 110, p


def test_the_others_take_the_drained_gateways_share(result):
    """Before, each of the two others carries 1/3 of the load; once one of three drains, 1/2."""
    before, drain = phase(result, "before"), phase(result, "drain")
    per_gw = {name: p["others_served"] / p["seconds"] / len(p["others"]) for name, p in
              (("before", before), ("drain", drain))}
    assert per_gw["drain"] > 1.2 * per_gw["before"], per_gw


def test_the_drain_loses_nothing_and_the_drained_gateway_gets_nothing_after_closed(result):
    for name in ("before", "drain"):
        p = phase(result, name)
        assert (p["lost"], p["haproxy_not_ok"], p["after_closed"]) == (0, 0, 0), p
        assert p["unlogged"] <= result["haproxy_dropped_logs"], (p, result["haproxy_dropped_logs"])
    [d] = phase(result, "drain")["drained"]
    assert d["prestop"].startswith("200 CLOSED"), d
    assert d["deleted_at"] < d["closed_at"] < d["exit_at"], d
    assert replicas.failures([result]) == [], replicas.failures([result])


def test_the_control_kill_is_counted_lost(result):
    p = phase(result, "kill")
    assert p["lost"] > 0 and p["haproxy_not_ok"] > 0, p


def test_the_report(result, tmp_path):
    rows = replicas.write([result], tmp_path, {"date": "today", "command": "test", "rate": 100, "seconds": 4,
                                               "rounds": 1})
    assert [r["phase"] for r in rows] == ["before", "drain", "kill"]
    text = (tmp_path / "results.md").read_text()
    assert "| 3 | drain | 1/2 |" in text and "kill (control)" in text
    assert (tmp_path / "results.json").exists()
    make = (replicas.REPO / "Makefile").read_text()
    assert "PYTHONPATH=. $(PY) -m tests.fleet.replicas $(REPLICAS_ARGS)" in make.split("\nreplicas:", 1)[1]
