"""Every command in envoyfilter/README.md, extracted from its code blocks, run
in an offline form, so the install the README describes cannot drift from
what works:

* `helm upgrade --install` runs as `helm template` with the same arguments
  (the istio/gateway chart is ../shared/istio-gateway-chart; skipped where absent);
* local commands (make, helm lint/template, kubectl --dry-run=client/--local,
  verify.py, openssl) run as written;
* a kubectl stage that needs a cluster and feeds verify.py is replaced by what
  the cluster would return: a real Envoy's /config_dump and /stats for `exec …
  curl localhost:15000/…`, the rendered Deployment for `get deploy -o json`;
* any other kubectl that needs a cluster runs against an address where nothing
  listens: it must fail on the connection, never on its arguments;
* a curl to a node's :30180 asks a real gateway-like Envoy's health listener.

And the wasm ConfigMap's client-side-apply annotation, as kubectl computes it,
measured against the 262,144-byte cap that the documented path never meets.
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import requests

from tests.harness import istio, k8s
from tests.harness.envoy import REPO
from tests.test_istio_envoy import start_gateway  # noqa: F401
from tests.test_istio_kubernetes import render_chart
from tests.test_verify import dump_of, envoyfilter_form

README = istio.ENVOYFILTER / "README.md"
UNREACHABLE = "--server=http://127.0.0.1:1 --request-timeout=5s"
ANNOTATION_CAP = 262_144
ENV: dict[str, str] = {}


def readme_commands() -> list[str]:
    """The commands of the ```sh blocks: continuation lines joined, comments dropped."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        out += [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return out


COMMANDS = readme_commands()


def stages(command: str) -> list[str]:
    return [s.strip() for s in re.split(r"\s\|\s", command)]


def needs_cluster(stage: str) -> bool:
    return stage.startswith("kubectl ") and "--dry-run=client" not in stage and "--local" not in stage


def offline(command: str, gateway) -> tuple[str, bool]:
    """(the offline form of `command`, whether it must fail on the connection)."""
    if "istio/gateway" in command and not k8s.GATEWAY_CHART.is_dir():
        pytest.skip(f"the istio/gateway chart is not at {k8s.GATEWAY_CHART} (../shared is absent)")
    command = command.replace("helm upgrade --install", "helm template")
    command = command.replace(" istio/gateway ", f" {k8s.GATEWAY_CHART} ")
    out, unreachable = [], False
    for stage in stages(command):
        if needs_cluster(stage) and "localhost:15000/config_dump" in stage:
            stage = f"cat {gateway('dump')}"
        elif needs_cluster(stage) and "localhost:15000/stats" in stage:
            stage = f"cat {gateway('stats')}"
        elif needs_cluster(stage) and re.search(r"\bget deploy\S* \S+ -o json$", stage):
            stage = f"cat {gateway('deployment')}"
        elif needs_cluster(stage):
            stage = stage.replace("kubectl ", f"kubectl {UNREACHABLE} ", 1)
            unreachable = True
        stage = re.sub(r"http://203\.0\.113\.\d+:30180/", lambda _: f"http://127.0.0.1:{gateway('health')}/", stage)
        out.append(stage)
    return " | ".join(out), unreachable


def run(command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **ENV, "PATH": f"{k8s.K8S_BIN}:{os.environ['PATH']}", "KUBECONFIG": "/dev/null"}
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def gateway(start_gateway, tmp_path):  # noqa: F811
    """What the cluster commands would return, made on first use: a gateway-like
    Envoy 1.40 with the shipped EnvoyFilter form, its config dump, the rendered
    Deployment."""
    made = {}

    def get(what: str):
        if what != "deployment" and "env" not in made:
            made["env"] = start_gateway(istio.ENVOY_MATRIX[-1], envoyfilter_form())
        if what == "dump":
            path = tmp_path / "config_dump.json"
            path.write_text(dump_of(made["env"]))
            return path
        if what == "health":
            return made["env"].ports.health
        if what == "stats":
            path = tmp_path / "stats.txt"
            path.write_text(requests.get(made["env"].admin("/stats"), timeout=10).text)
            return path
        path = tmp_path / "deployment.json"
        values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
        objs = (k8s.template("-f", str(istio.KUBERNETES / "gateway-values.yaml"), chart=k8s.GATEWAY_CHART,
                             release="istio-ingressgateway") if k8s.GATEWAY_CHART.is_dir() else render_chart(values))
        (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
        path.write_text(json.dumps(deployment))
        return path

    return get


def test_the_readme_has_the_install_commands():
    joined = "\n".join(COMMANDS)
    for expected in ("make configmap", "helm upgrade --install drain-gate envoyfilter/chart",
                     "helm upgrade --install istio-ingressgateway istio/gateway", "verify.py --config-dump -",
                     "verify.py --pod-spec -"):
        assert expected in joined, expected


@pytest.mark.parametrize("command", COMMANDS, ids=[c[:70] for c in COMMANDS])
def test_readme_command_runs_offline(command, gateway):
    assignment = re.fullmatch(r"(\w+)=\$\((.*)\)", command)
    if assignment:
        r = run(assignment[2])
        assert r.returncode == 0 and r.stdout.strip(), r.stderr
        ENV[assignment[1]] = r.stdout.strip()
        return
    text, unreachable = offline(command, gateway)
    r = run(text)
    if unreachable:
        assert r.returncode != 0 and "127.0.0.1:1" in r.stderr and "refused" in r.stderr, (text, r.stderr)
        assert not re.search(r"unknown (flag|command|shorthand)|Usage:|error: (?!.*refused)", r.stderr), r.stderr
        return
    assert r.returncode == 0, (text, r.stderr[-2000:])
    if "verify.py" in command:
        assert r.stdout.splitlines()[-1] == "OK: 0 check(s) failed", r.stdout
    if "30180/health_check.html" in command:
        assert r.stdout.strip() == "200"


def test_a_cluster_command_with_a_bad_flag_fails_on_its_arguments():
    """The check above can fail: kubectl refuses bad arguments before it connects."""
    r = run(f"kubectl {UNREACHABLE} -n istio-system rollout status deploy/x --timeoutt=30m")
    assert r.returncode != 0 and "unknown flag: --timeoutt" in r.stderr


def test_client_side_apply_annotation_is_over_the_cap_and_never_used(tmp_path):
    """kubectl's own last-applied-configuration for the wasm ConfigMap (--save-config
    writes what client-side apply would) is over the annotation cap; no README
    command applies anything client-side."""
    wasm = (REPO / "target" / "drain_gate.wasm").read_bytes()
    (tmp_path / "drain_gate.wasm").write_bytes(wasm)
    r = k8s.run("kubectl", "-n", "istio-system", "create", "configmap", "drain-gate-wasm",
                f"--from-file=drain_gate.wasm={tmp_path / 'drain_gate.wasm'}", "--save-config",
                "--dry-run=client", "-o", "json")
    annotation = json.loads(r.stdout)["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    assert len(annotation) > ANNOTATION_CAP, f"{len(annotation)} bytes"
    print(f"last-applied-configuration of the wasm ConfigMap: {len(annotation)} bytes, cap {ANNOTATION_CAP}")
    for command in COMMANDS:
        for stage in stages(command):
            if re.match(r"kubectl\b.*\bapply\b", stage):
                assert "--server-side" in stage, f"client-side apply in the README: {stage}"
    # The chart's ConfigMap carries no such annotation (Helm does not write it).
    b64 = k8s.wasm_base64_file(wasm, tmp_path)
    (cm,) = [o for o in k8s.template("--set-file", f"wasm.base64={b64}") if o["kind"] == "ConfigMap"]
    assert "kubectl.kubernetes.io/last-applied-configuration" not in cm["metadata"].get("annotations", {})
