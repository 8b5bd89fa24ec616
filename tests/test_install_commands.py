"""Every command in envoyfilter/README.md but its Gateway API section
(tests/test_gateway_api_docs.py runs that one), block by block, as written,
offline (tests/harness/docs.py), so the install the README describes cannot
drift from what works:

* `helm upgrade --install` runs as `helm template` with the same arguments
  (the istio/gateway chart is ../shared/istio-gateway-chart; skipped where absent);
* local commands (make, helm lint/template, kubectl --dry-run=client/--local,
  verify.py, openssl) run as written;
* a kubectl that needs a cluster must fail on the connection, never on its
  arguments; where it feeds verify.py, what the cluster would return replaces
  it: a real Envoy's /config_dump and /stats for `exec … curl localhost:15000/…`,
  the rendered Deployment for `get deploy -o json`;
* a curl to a node's :30180 asks a real gateway-like Envoy's health listener.

And the wasm ConfigMap's client-side-apply annotation, as kubectl computes it,
measured against the 262,144-byte cap that the documented path never meets.
"""
from __future__ import annotations

import json
import re

import pytest
import requests

from tests.harness import docs, istio, k8s
from tests.harness.envoy import REPO
from tests.test_istio_envoy import start_gateway  # noqa: F401
from tests.test_istio_kubernetes import render_chart
from tests.test_verify import dump_of, envoyfilter_form

README = istio.ENVOYFILTER / "README.md"
ANNOTATION_CAP = 262_144
BLOCKS = docs.sh_blocks(README, exclude="Gateway API")
COMMANDS = [c for block in docs.sh_blocks(README) for c in docs.commands(block)]


def stages(command: str) -> list[str]:
    return [s.strip() for s in re.split(r"\s\|\s", command)]


@pytest.fixture(scope="module")
def shell(tmp_path_factory) -> docs.OfflineShell:
    return docs.OfflineShell(tmp_path_factory.mktemp("docs"))


def gateway_deployment() -> str:
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    objs = (k8s.template("-f", str(istio.KUBERNETES / "gateway-values.yaml"), chart=k8s.GATEWAY_CHART,
                         release="istio-ingressgateway") if k8s.GATEWAY_CHART.is_dir() else render_chart(values))
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    return json.dumps(deployment)


def cluster_replies(block: str, shell: docs.OfflineShell, start_gateway) -> dict[str, str]:  # noqa: F811
    """Writes what the block's cluster commands read (a gateway-like Envoy 1.40
    with the shipped EnvoyFilter form, started only if the block reads it);
    the substitution that sends a node's :30180 check to its health listener."""
    reads_envoy = re.search(r"localhost:15000/|:30180/", block)
    env = start_gateway(istio.ENVOY_MATRIX[-1], envoyfilter_form()) if reads_envoy else None
    if "localhost:15000/config_dump" in block:
        (shell.replies / "config_dump").write_text(dump_of(env))
    if "localhost:15000/stats" in block:
        (shell.replies / "stats").write_text(requests.get(env.admin("/stats"), timeout=10).text)
    if re.search(r"get deploy\S* \S+ -o json", block):
        (shell.replies / "deployment").write_text(gateway_deployment())
    return {r"http://203\.0\.113\.\d+:30180/": f"http://127.0.0.1:{env.ports.health}/"} if env else {}


def test_the_readme_has_the_install_commands():
    joined = "\n".join(COMMANDS)
    for expected in ("make configmap", "helm upgrade --install drain-gate envoyfilter/chart",
                     "helm upgrade --install istio-ingressgateway istio/gateway", "verify.py --config-dump -",
                     "verify.py --pod-spec -"):
        assert expected in joined, expected


@pytest.mark.parametrize("block", BLOCKS, ids=[b.strip().splitlines()[0][:60] for b in BLOCKS])
def test_readme_block_runs_offline(block, shell, start_gateway):  # noqa: F811
    r = shell.run(block, cluster_replies(block, shell, start_gateway))
    assert r.returncode == 0, (block, r.stdout[-2000:], r.stderr[-2000:])
    verdicts = [line for line in r.stdout.splitlines() if re.match(r"(OK|FAILED): \d+ check", line)]
    ran = "\n".join(docs.runnable(block))
    assert verdicts == ["OK: 0 check(s) failed"] * ran.count("verify.py"), r.stdout
    if "30180/health_check.html" in block:
        assert "200" in r.stdout.splitlines()


def test_a_cluster_command_with_a_bad_flag_fails_on_its_arguments(tmp_path):
    """The check above can fail: kubectl refuses bad arguments before it connects."""
    r = docs.OfflineShell(tmp_path).run("kubectl -n istio-system rollout status deploy/x --timeoutt=30m")
    assert r.returncode != 0 and "unknown flag: --timeoutt" in r.stderr, r.stderr


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
