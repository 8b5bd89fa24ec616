"""`make rollout-quick`: the rolling update of 2 gateways behind HAProxy (shipped timings: inter 2s
rise 2 fall 2, on-marked-down shutdown-sessions), under short requests (GETs, 1 in 4 a POST),
HTTP/1.1 and HTTP/2 streams and websockets, with Istio's default termination and with drain-gate's
404 soft drain.

What it proves: with drain-gate-404 no request of any kind is lost while every gateway is
replaced; with Istio's default, in the same rig and traffic, HAProxy's DOWN cuts long streams —
the control that shows the rig sees a cut. Neither runs a request twice: the backend's ledger
(envoyfilter/tools/ledger.py) counts every execution per request id. Writes out/rollout/result.json
and timeline.svg.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from tests.fleet import driver
from tests.fleet.traffic import KINDS
from tests.harness.envoy import REPO


@pytest.fixture(scope="module")
def result() -> dict:
    return driver.run(quick=True)


def test_result_shape(result):
    on_disk = json.loads((driver.OUT / "result.json").read_text())
    assert on_disk["n"] == 2
    assert set(on_disk["strategies"]) == {"istio-default", "drain-gate-404"}
    for r in on_disk["strategies"].values():
        assert set(r["sent"]) == set(r["lost"]) == set(KINDS)
        assert all(r["sent"][k] > 0 for k in KINDS), r["sent"]
        assert len(r["drain_s"]) == 2 and all(d is not None for d in r["drain_s"])
        assert r["rollout_s"] > 0
        x = r["executions"]
        assert x["posts"] > 0 and x["app_503_posts"] > 0, x
        assert x["total"] >= sum(r["sent"][k] - r["lost"][k] for k in KINDS), x
    assert (driver.OUT / "timeline.svg").read_text().startswith("<?xml")


def test_no_request_runs_twice(result):
    """The ledger ran every request the clients got the application's answer to (none uncounted),
    and none twice: haproxy.cfg resends a request only when its connection failed, before it was
    sent — the POSTs the application answered 503 included, which reached their clients once."""
    for name, r in result["strategies"].items():
        x = r["executions"]
        assert x["not_counted"] == 0 and x["duplicates"] == 0 and x["max_runs"] == 1, (name, x)
        lost_503 = sum(1 for o in r["timeline"]["lost"] if o["want_status"] == 503)
        assert x["app_503_once"] >= x["app_503_posts"] - lost_503, (name, x)


def test_a_request_run_twice_fails_the_rollout(result):
    """`make rollout` fails when a strategy runs a request twice, and when its control (the refuse
    mode's recipe before, every 503 resent) runs none: the check, fed this run's figures with one
    duplicate more, or with a control that shows none."""
    fake = copy.deepcopy(result)
    ok = fake["strategies"]["drain-gate-404"]
    assert driver.duplicated(fake) == []
    refuse = fake["strategies"]["drain-gate-200-refuse"] = copy.deepcopy(ok)
    refuse["executions"].update(duplicates=1, by_kind={**refuse["executions"]["by_kind"], "short": 1})
    control = fake["strategies"][driver.DUPLICATES_CONTROL] = copy.deepcopy(ok)
    got = driver.failures(fake)
    assert any(f.startswith("drain-gate-200-refuse: ran 1 requests twice") for f in got), got
    assert any(f.startswith(f"{driver.DUPLICATES_CONTROL}: the control ran no request twice") for f in got), got
    control["executions"].update(duplicates=3, app_503=3)
    refuse["executions"].update(duplicates=0)
    assert driver.duplicated(fake) == []
    assert "| 3 (3) |" in driver.table(fake)


def test_a_refuse_loss_fails_the_rollout(result):
    """`make rollout` fails when drain-gate-200-refuse loses any request, a short one HAProxy killed at a
    DOWN instant included (haproxy-refuse.cfg has no shutdown-sessions to kill it); the variant with
    shutdown-sessions is reported, not failed: the check, fed this run's drain-gate-404 figures as
    theirs, with one such loss each."""
    fake = copy.deepcopy(result)
    ok = fake["strategies"]["drain-gate-404"]
    refuse = fake["strategies"]["drain-gate-200-refuse"] = copy.deepcopy(ok)
    assert driver.failures(fake) == []
    refuse["lost"]["short"] += 1
    refuse["lost_how"]["killed before the gateway"] += 1
    fake["strategies"]["drain-gate-200-refuse-shutdown-sessions"] = copy.deepcopy(refuse)
    got = driver.failures(fake)
    assert [f.split(":")[0] for f in got] == ["drain-gate-200-refuse"], got


def test_every_request_is_attributed_to_a_gateway(result):
    """HAProxy's log names the gateway of every request that reached one."""
    for name, r in result["strategies"].items():
        served = r["timeline"]["lost"]
        assert all(o["server"] for o in served if o["status"] not in (0, 503)), (name, served[:3])


def test_drain_gate_404_loses_nothing(result):
    r = result["strategies"]["drain-gate-404"]
    assert r["lost"] == {k: 0 for k in KINDS}, r["timeline"]["lost"][:5]
    assert all(v.endswith("CLOSED active_zero") for v in r["prestop"].values()), r["prestop"]
    assert all(cut == 0 for _, cut in r["cut_at_down"]), r["cut_at_down"]


def test_istio_default_cuts_long_streams(result):
    """The control: the LB check fails at SIGTERM, HAProxy marks the gateway DOWN 2-4 s later
    and shutdown-sessions cuts what is on it."""
    r = result["strategies"]["istio-default"]
    assert r["lost"]["h1_stream"] + r["lost"]["h2_stream"] > 0, r["lost"]
    cut = [o for o in r["timeline"]["lost"] if o["kind"] in ("h1_stream", "h2_stream")]
    assert all(o["server"] and o["server"].startswith("old") for o in cut), cut[:3]
    assert sum(n for _, n in r["cut_at_down"]) > 0, r["cut_at_down"]


def test_the_gateways_own_account_agrees_with_the_clients(result):
    """Each old gateway's drain receipt, read before it exited, summed over the fleet: drain-gate-404
    cut nothing the LB could cut, as its clients lost nothing; Istio's default runs no drain-gate
    drain (its gateways stay OPEN), so the gateways count nothing of what its clients lost — and
    say so (`drain_started_at` null on every one), rather than a 0 that would read as "no cut"."""
    assert driver.disagreements(result) == [], driver.disagreements(result)
    assert driver.failures(result) == [], driver.failures(result)
    r404 = result["strategies"]["drain-gate-404"]["gateway"]
    assert r404["drains"] == 2 and r404["cut_lb"] == 0 and r404["refused"] == 0, r404
    default = result["strategies"]["istio-default"]
    assert default["gateway"]["drains"] == 0 and driver.lost_total(default) > 0, default["gateway"]
    assert "no drain ran" in driver.table(result)


def test_summarize_prints_the_tables_of_the_readme(result):
    """`python -m tests.fleet.driver --summarize <result.json>…`, as tests/docs/rollout.md runs it."""
    out = subprocess.run([sys.executable, "-m", "tests.fleet.driver", "--summarize", str(driver.OUT / "result.json")],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "| istio-default |" in out and "| drain-gate-404 |" in out
    assert "T_up (start -> HAProxy UP)" in out and "N=200 surge 25%" in out
