"""prove.py with the ledger (`--ledger`) and the LB's fingerprint (`--fingerprint`), run as an
operator runs them, behind real LBs: HAProxy 2.6, Envoy as the front LB (envoyfilter/lb/envoy-front.yaml)
and nginx (envoyfilter/lb/nginx-drain-gate.conf), each checking every 500 ms (HAProxy and Envoy fall 2;
nginx has no active check), one ledger behind the gateways (tests/lb/prove_ledger.py, as
kubernetes/prove-ledger.yaml runs it in staging). Four rigs at the same time:

- HAProxy, three gateways refusing idempotent requests (`draining_new_requests: refuse`,
  `refused_requests: idempotent`, `lb_buffer: 2s`): the ledger's command of envoyfilter/docs/lb.md
  behind the shipped refuse recipe (haproxy-refuse.cfg), the control on gw1 then the proof on gw2
  (gw3 serves what they refuse): in both drains every request to the ledger answered, none ran
  twice, no refusal reached its client; the control cut nothing (no `shutdown-sessions` in the
  recipe): exit 3 for that reason alone. Then the fingerprint (the docs' command: `--control` on
  gw1) behind the same file, and behind its control, the recipe before
  (tests/lb/controls/haproxy-refuse-resends-503.cfg): the application's 503 to a POST ran 4 times,
  exit 1, RAN TWICE;
- HAProxy, two such gateways: the fingerprint behind haproxy.cfg (`retries 3` alone) with and
  without `on-marked-down shutdown-sessions`, and behind haproxy-refuse.cfg with it;
- Envoy, gateways refusing every request (`refused_requests: all`), then serving (the default);
- nginx, gateways refusing idempotent requests with a reset (`refuse_with: reset`).

Each fingerprint: the detection within one check interval of fall x inter, fall as the LB applies it
to a 503 (HAProxy 2, its `fall`; Envoy 1: its HTTP check takes a host out at the first status that is
neither expected nor in `retriable_statuses`, whatever `unhealthy_threshold`), and that fall measured;
"no active check" behind nginx;
cuts_at_down, resends_refused and resends_after_application_503 as each file does it; the advice
that follows, which `verify.py --pod-spec --fingerprint` passes with the shipped gateway values and
the drain-gate chart set to it, and fails, naming the setting and the 1 s, with the grace period or
`lb_buffer` 1 s short. Each run's output goes to out/prove/.
"""
from __future__ import annotations

import json
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.deploy.test_verify import deployment, verify
from tests.harness import istio, k8s
from tests.harness.envoy import REPO
from tests.harness.haproxy import CFG, CFG_REFUSE
from tests.lb.prove_ledger import INTER_S, LedgerRig, Run, prove
from tests.lb.test_prove import as_run_here, readme_command

CONTROLS = REPO / "tests" / "lb" / "controls"
OLD = CONTROLS / "haproxy-refuse-resends-503.cfg"
REFUSING = {"draining_new_requests": "refuse", "refused_requests": "idempotent", "lb_buffer": "2s",
            "drain_timeout": "30s"}
SECONDS = 4  # the streams and the held requests: they outlast each LB's DOWN (at most 1.1 s after the flip)
# The fingerprint's: its control flips 1 s after its drain's start.
FP_SECONDS = SECONDS + 1
LEDGER = re.compile(r"^(control|proof): ledger: sent (\d+) \(POST (\d+), (\d+) of them answered 503 by the "
                    r"application; GET (\d+); (\d+) held [\d.]+ s, (\d+) on the gateway\), answered (\d+), lost (\d+), "
                    r"ran twice (\d+)$", re.M)
REFUSALS = re.compile(r"^(control|proof): ledger: the gateway refused (\d+) \(refused_requests: (\w+), refuse_with: "
                      r"(\w+)\); (\d+) refusal\(s\) of this run reached a client$", re.M)


def fingerprint_command(rig: LedgerRig, name: str, *extra: str) -> Run:
    """The docs' fingerprint command with the rig's addresses (its output redirect left out), the
    control on gw1; gw1 replaced after."""
    command = readme_command("--ledger", "--fingerprint", "--json")
    argv = shlex.split(command)
    argv = argv[:argv.index(">")] if ">" in argv else argv
    run = prove(*as_run_here(shlex.join(argv), ["--through", rig.url()], "", rig.gw("gw1").url(""), "--streams", "6",
                             "--kinds", "http1,ws", "--seconds", str(FP_SECONDS), *extra), name=f"fingerprint-{name}")
    rig.replace("gw1")
    return run


def haproxy_three(wd: Path) -> dict[str, Run]:
    out = {}
    with LedgerRig(wd, REFUSING, n=3) as rig:
        rig.use("haproxy", CFG_REFUSE)
        out["ledger"] = prove(*as_run_here(readme_command("--ledger"), ["--through", rig.url()], rig.gw("gw1").url(""),
                                           rig.gw("gw2").url(""), "--streams", "9", "--seconds", str(SECONDS)),
                              name="haproxy-refuse-ledger")
        rig.replace("gw1")
        rig.replace("gw2")
        out["haproxy-refuse"] = fingerprint_command(rig, "haproxy-refuse")
        rig.use("haproxy", OLD)
        out["haproxy-refuse-resends-503"] = rig.fingerprint("haproxy-refuse-resends-503", seconds=FP_SECONDS)
    return out


def haproxy_two(wd: Path) -> dict[str, Run]:
    out = {}
    with LedgerRig(wd, REFUSING) as rig:
        for name, cfg, sds in (("haproxy", CFG, None), ("haproxy-no-sds", CFG, False),
                               ("haproxy-refuse-sds", CFG_REFUSE, True)):
            rig.use("haproxy", cfg, shutdown_sessions=sds)
            out[name] = rig.fingerprint(name, seconds=FP_SECONDS)
    return out


def envoy(wd: Path) -> dict[str, Run]:
    out = {}
    with LedgerRig(wd, {**REFUSING, "refused_requests": "all"}) as rig:
        rig.use("envoy")
        out["envoy"] = rig.fingerprint("envoy", kinds="http1,http2,ws", seconds=FP_SECONDS)
        rig.reconfigure({"lb_buffer": "2s", "drain_timeout": "30s"})
        rig.use("envoy")
        # A serving gateway's new requests are read from its ends, before the streams end by themselves.
        out["envoy-serve"] = rig.fingerprint("envoy-serve", seconds=FP_SECONDS + 2)
    return out


def nginx(wd: Path) -> dict[str, Run]:
    with LedgerRig(wd, {**REFUSING, "refuse_with": "reset"}) as rig:
        rig.use("nginx")
        return {"nginx": rig.fingerprint("nginx", seconds=FP_SECONDS)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    wd = tmp_path_factory.mktemp("prove-ledger")
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(family, wd / family.__name__) for family in (haproxy_three, haproxy_two, envoy, nginx)]
        return {k: v for f in futures for k, v in f.result().items()}


def ledger(run: Run, role: str) -> dict[str, int]:
    (m,) = [m for m in LEDGER.finditer(run.text) if m[1] == role] or [None]
    assert m, run.text
    keys = ("sent", "posts", "app_503", "gets", "held", "held_on_gw", "answered", "lost", "ran_twice")
    return dict(zip(keys, map(int, m.groups()[1:])))


def refusals(run: Run, role: str) -> dict[str, int | str]:
    (m,) = [m for m in REFUSALS.finditer(run.text) if m[1] == role] or [None]
    assert m, run.text
    return {"refused": int(m[2]), "requests": m[3], "refuse_with": m[4], "reached": int(m[5])}


# -- the ledger ------------------------------------------------------------------------------------
def test_the_docs_ledger_and_fingerprint_commands():
    argv = shlex.split(readme_command("--ledger"))
    assert "--control-health" in argv and "--health" in argv and "--ledger" in argv, argv
    argv = shlex.split(readme_command("--ledger", "--fingerprint", "--json"))
    assert "--control" in argv and "--control-health" not in argv and argv[-2] == ">", argv


def test_behind_the_refuse_recipe_nothing_ran_twice_and_nothing_was_lost(runs):
    run = runs["ledger"]
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
    run = runs["haproxy-refuse-resends-503"]
    assert run.code == 1, run.text
    assert run.verdict.startswith("prove: RAN TWICE (exit 1): "), run.text
    assert re.search(r"control-\d+-post503 \(POST\) 4x", run.line("control: ledger: ran twice: ")), run.text
    assert run.json["lb"]["resends_after_application_503"] is True


# -- the fingerprint -------------------------------------------------------------------------------
# Per run: (the fall it applies to a 503, or None: no active check; cuts_at_down; resends_refused;
# resends_after_application_503; exit). HAProxy's is its `fall 2`; Envoy's is 1 where its file says
# `unhealthy_threshold: 2` (which counts only timeouts and failed connections for an HTTP check).
EXPECTED = {
    "haproxy": (2, True, False, False, 0),
    "haproxy-no-sds": (2, False, False, False, 0),
    "haproxy-refuse": (2, False, True, False, 0),
    "haproxy-refuse-sds": (2, True, True, False, 0),
    "haproxy-refuse-resends-503": (2, True, True, True, 1),
    "envoy": (1, False, True, False, 0),
    "envoy-serve": (1, False, None, False, 0),
    "nginx": (None, False, True, False, 0),
}


@pytest.mark.parametrize("name", EXPECTED)
def test_the_fingerprint_matches_each_configuration(runs, name):
    fall, cuts, resends, post_503, code = EXPECTED[name]
    run = runs[name]
    assert run.code == code and run.json is not None, run.out + run.err
    lb, advice = run.json["lb"], run.json["advice"]
    assert (lb["cuts_at_down"], lb["resends_refused"], lb["resends_after_application_503"]) == (cuts, resends, post_503), lb
    if fall is None:
        assert not lb["active_check"] and lb["detection_s"] is None and lb["detection"].startswith("no active check"), lb
        assert advice["lb_fall"] is None and advice["lb_buffer_s"] is None, advice
    else:
        assert lb["active_check"] and abs(lb["check_interval_s"] - INTER_S) <= 0.05, lb
        assert abs(lb["detection_s"] - fall * INTER_S) <= INTER_S, lb
        assert lb["fall"] == advice["lb_fall"] == fall, lb
        assert advice["lb_buffer_s"] >= lb["detection_s"] + INTER_S, (lb, advice)
    refuse = resends is True and not post_503
    assert advice["draining_new_requests"] == ("refuse" if refuse else "serve"), advice
    if refuse:
        assert advice["refused_requests"] == ("all" if name == "envoy" else "idempotent"), advice
        assert advice["refuse_with"] == ("reset" if name == "nginx" else "response"), advice
    assert advice["drain_timeout_s"] == 120 and advice["termination_grace_period_s"] >= 137, advice
    assert run.json["verdict"] == run.verdict


def pod_spec(advice: dict, grace: int | None = None, **config) -> str:
    """The shipped gateway values and the drain-gate chart's health listener, set to `advice`
    (`grace`, `config`: what differs)."""
    # No advice for lb_buffer (no active check): the measuring gateways' own, which the grace counts.
    closing = config.get("lb_buffer_s", advice["lb_buffer_s"] or 2)
    grace = advice["termination_grace_period_s"] if grace is None else grace
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    command = values["lifecycle"]["preStop"]["exec"]["command"]
    command[command.index("--max-time") + 1] = str(advice["drain_timeout_s"] + closing + 5)
    settings = {"lb_fall": advice["lb_fall"] or 2, "lb_buffer": f"{closing}s",
                "drain_timeout": f"{advice['drain_timeout_s']}s",
                "draining_new_requests": advice["draining_new_requests"]}
    if advice["draining_new_requests"] == "refuse":
        settings.update(refused_requests=advice["refused_requests"], refuse_with=advice["refuse_with"])
    sets = [a for k, v in settings.items() for a in ("--set", f"config.{k}={v}")]
    (health,) = k8s.template("--set", "wasm.configMap.create=false", "--show-only", "templates/health-listener.yaml",
                             *sets)
    return deployment(terminationGracePeriodSeconds=grace, lifecycle=values["lifecycle"]) + "\n" + json.dumps(health)


@pytest.mark.parametrize("name", EXPECTED)
def test_the_advice_passes_verify_and_a_second_short_fails(runs, name, tmp_path):
    fp = tmp_path / "fingerprint.json"
    fp.write_text(runs[name].out)
    advice = runs[name].json["advice"]
    code, lines = verify("--pod-spec", "-", "--fingerprint", str(fp), stdin=pod_spec(advice))
    assert code == 0 and lines[-1] == "OK: 0 check(s) failed", lines
    assert any(x.startswith("PASS fingerprint: ") and "the drain-gate chart's EnvoyFilter" in x for x in lines), lines
    grace = advice["termination_grace_period_s"]
    code, lines = verify("--pod-spec", "-", "--fingerprint", str(fp), stdin=pod_spec(advice, grace=grace - 1))
    assert code == 1 and (f"FAIL fingerprint terminationGracePeriodSeconds: Deployment istio-ingressgateway: "
                          f"{grace - 1} s, 1 s short of the fingerprint's {grace} s") in "\n".join(lines), lines
    if advice["lb_buffer_s"] is not None:
        short = advice["lb_buffer_s"] - 1
        code, lines = verify("--pod-spec", "-", "--fingerprint", str(fp), stdin=pod_spec(advice, lb_buffer_s=short))
        assert code == 1 and (f"FAIL fingerprint lb_buffer: lb_buffer {short} s, 1 s short of the fingerprint's "
                              f"{advice['lb_buffer_s']} s") in "\n".join(lines), lines
