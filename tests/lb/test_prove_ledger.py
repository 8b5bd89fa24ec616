"""prove.py with the ledger (`--ledger`): the command of envoyfilter/docs/lb.md ("Does your LB run a
request twice?") run as an operator runs it, behind real HAProxy 2.6, three gateways behind it
(tests/lb/prove_ledger.py: one ledger behind them all, as kubernetes/prove-ledger.yaml runs it), the
gateways refusing idempotent requests while they drain (`draining_new_requests: refuse`,
`refused_requests: idempotent`, `lb_buffer: 2s`), HAProxy checking every 500 ms, fall 2:

- the shipped refuse recipe (envoyfilter/haproxy/haproxy-refuse.cfg), the control on gw1 then the
  proof on gw2 (gw3 serves what they refuse, and everything once they are out): in both drains
  every request to the ledger answered, none lost, none ran twice; the drained gateway refused
  requests and none of those refusals reached its client (HAProxy resent them). The control cut
  nothing (the recipe has no `on-marked-down shutdown-sessions`): exit 3, proved nothing, for that
  reason alone;
- its control, the recipe before (tests/lb/controls/haproxy-refuse-resends-503.cfg: `retry-on
  conn-failure empty-response 503`, no disable-l7-retry), `--control` on gw1: the POSTs the
  application answered 503 ran 4 times (`retries 3`): exit 1, RAN TWICE.

Each run's output goes to out/prove/.
"""
from __future__ import annotations

import re

import pytest

from tests.harness.envoy import REPO
from tests.harness.haproxy import CFG_REFUSE
from tests.lb.prove_ledger import LedgerRig, Run, prove
from tests.lb.test_prove import as_run_here, readme_command

CONTROLS = REPO / "tests" / "lb" / "controls"
REFUSING = {"draining_new_requests": "refuse", "refused_requests": "idempotent", "lb_buffer": "2s",
            "drain_timeout": "30s"}
SECONDS = "4"  # the streams and the held requests: they outlast HAProxy's DOWN (about 1 s after the flip)
LEDGER = re.compile(r"^(control|proof): ledger: sent (\d+) \(POST (\d+), (\d+) of them answered 503 by the "
                    r"application; GET (\d+); (\d+) held [\d.]+ s, (\d+) on the gateway\), answered (\d+), lost (\d+), "
                    r"ran twice (\d+)$", re.M)
REFUSALS = re.compile(r"^(control|proof): ledger: the gateway refused (\d+) \(refused_requests: (\w+), refuse_with: "
                      r"(\w+)\); (\d+) refusal\(s\) of this run reached a client$", re.M)


def ledger(run: Run, role: str) -> dict[str, int]:
    (m,) = [m for m in LEDGER.finditer(run.text) if m[1] == role] or [None]
    assert m, run.text
    keys = ("sent", "posts", "app_503", "gets", "held", "held_on_gw", "answered", "lost", "ran_twice")
    return dict(zip(keys, map(int, m.groups()[1:])))


def refusals(run: Run, role: str) -> dict[str, int | str]:
    (m,) = [m for m in REFUSALS.finditer(run.text) if m[1] == role] or [None]
    assert m, run.text
    return {"refused": int(m[2]), "requests": m[3], "refuse_with": m[4], "reached": int(m[5])}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    with LedgerRig(tmp_path_factory.mktemp("prove-ledger"), REFUSING, n=3) as rig:
        rig.use("haproxy", CFG_REFUSE)
        url = rig.url()
        shipped = prove(*as_run_here(readme_command("--ledger"), ["--through", url], rig.gw("gw1").url(""),
                                     rig.gw("gw2").url(""), "--streams", "9", "--seconds", SECONDS),
                        name="haproxy-refuse-ledger")
        rig.replace("gw1")
        rig.replace("gw2")
        rig.use("haproxy", CONTROLS / "haproxy-refuse-resends-503.cfg")
        url = rig.url()
        old = prove("--through", url, "--ledger", url, "--control", "--health", rig.gw("gw1").url(""),
                    "--streams", "6", "--kinds", "http1,ws", "--seconds", SECONDS, name="haproxy-refuse-resends-503-ledger")
    return {"shipped": shipped, "old": old}


def test_the_readme_ledger_command_runs_the_control_then_the_proof():
    argv = readme_command("--ledger").split()
    assert "--control-health" in argv and "--health" in argv and "--ledger" in argv, argv


def test_behind_the_refuse_recipe_nothing_ran_twice_and_nothing_was_lost(runs):
    run = runs["shipped"]
    assert run.code == 3, run.text
    assert run.verdict.startswith("prove: proved nothing (exit 3): the control cut nothing: the LB marked the "
                                  "gateway down"), run.text
    assert ";" not in run.verdict.partition(": the control cut nothing")[2], "proved nothing for that reason alone"
    for role in ("control", "proof"):
        got = ledger(run, role)
        assert (got["lost"], got["ran_twice"]) == (0, 0) and got["answered"] == got["sent"], got
        assert got["sent"] >= 50 and got["posts"] >= 20 and got["app_503"] >= 3 and got["held"] == 4, got
        assert run.line(f"{role}: lost ") == f"{role}: lost 0 of 9, gateway cut 0, forced 0"
    control, proof = refusals(run, "control"), refusals(run, "proof")
    assert proof["refused"] >= 1 and control["reached"] == proof["reached"] == 0, (control, proof)
    assert (proof["requests"], proof["refuse_with"]) == ("idempotent", "response")


def test_the_recipe_before_ran_the_applications_503_to_a_post_four_times(runs):
    run = runs["old"]
    assert run.code == 1, run.text
    assert run.verdict.startswith("prove: RAN TWICE (exit 1): "), run.text
    got = ledger(run, "control")
    assert got["ran_twice"] >= got["app_503"] >= 1, got
    assert re.search(r"control-\d+-post503 \(POST\) 4x", run.line("control: ledger: ran twice: ")), run.text
