"""Every command of the operator's pages (envoyfilter/docs/) but the Gateway API section
(tests/deploy/test_gateway_api_docs.py runs that one), block by block, as written,
offline (tests/harness/docs.py), so the install the pages describe cannot
drift from what works:

* `helm upgrade --install` runs as `helm template` with the same arguments
  (the istio/gateway chart is ../shared/istio-gateway-chart, pinned to
  --version 1.30.3; skipped where absent); helm's cluster commands (rollback,
  history, uninstall) must fail on the connection only;
* local commands (make, helm lint/template, kubectl --dry-run=client/--local,
  verify.py, openssl, haproxy -c) run as written;
* a kubectl that needs a cluster must fail on the connection, never on its
  arguments; what the cluster would return replaces it: a real Envoy's
  /config_dump and /stats for `exec … pilot-agent request GET …` (every pod
  of the pod list), the rendered gateway objects, the PDB, the injector's
  ConfigMap and three LB nodes plus one for `get … -o json`, the sidecar
  design's Deployment and Service for the migration;
* a curl to a node's :30180 (or the canary's :30181) asks a real gateway-like
  Envoy's health listener; the LB's configuration is the shipped haproxy.cfg;
* `envoyfilter/tools/prove.py` is left out here: it needs a real LB, and
  tests/lb/test_prove.py and tests/lb/test_prove_ledger.py run each of its
  commands behind one; the fingerprint it writes (out/preflight/fingerprint.json)
  is the one it measured behind haproxy.cfg with its shipped timings
  (tests/fixtures/fingerprint/haproxy.json, `python -m tests.lb.prove_ledger`).

And the wasm ConfigMap's client-side-apply annotation, as kubectl computes it,
measured against the 262,144-byte cap that the documented path never meets.
"""
from __future__ import annotations

import json
import re

import pytest
import requests

from tests.deploy.test_istio_envoy import start_gateway  # noqa: F401
from tests.deploy.test_istio_kubernetes import render_chart
from tests.deploy.test_verify import dump_of, envoyfilter_form
from tests.harness import docs, istio, k8s
from tests.harness.envoy import REPO

ANNOTATION_CAP = 262_144
BLOCKS = docs.sh_blocks(docs.OPERATOR_PAGES, exclude="Gateway API")
COMMANDS = [c for block in docs.sh_blocks(docs.OPERATOR_PAGES) for c in docs.commands(block)]


def stages(command: str) -> list[str]:
    return [s.strip() for s in re.split(r"\s\|\s", command)]


@pytest.fixture(scope="module")
def shell(tmp_path_factory) -> docs.OfflineShell:
    return docs.OfflineShell(tmp_path_factory.mktemp("docs"))


SIDECAR_DESIGN = REPO / "tests" / "fixtures" / "sidecar-design" / "gateway.yaml"
FINGERPRINT = REPO / "tests" / "fixtures" / "fingerprint" / "haproxy.json"
LB_NODES = {"worker1": "203.0.113.212", "worker2": "203.0.113.213", "worker3": "203.0.113.214"}


def gateway_objects(release: str = "istio-ingressgateway", *values: str) -> dict[str, dict]:
    """kind -> the Deployment and Service the istio/gateway chart renders with the values
    (its reproduction for the default release where ../shared is absent)."""
    files = [str(istio.KUBERNETES / "gateway-values.yaml"), *values]
    if k8s.GATEWAY_CHART.is_dir():
        objs = k8s.template(*[a for f in files for a in ("-f", f)], chart=k8s.GATEWAY_CHART, release=release)
    elif release == "istio-ingressgateway" and not values:
        objs = list(render_chart(istio.load_one(istio.KUBERNETES / "gateway-values.yaml")))
    else:
        pytest.skip(f"{release}: rendering needs the istio/gateway chart, absent at {k8s.GATEWAY_CHART}")
    return {o["kind"]: o for o in objs if o["kind"] in ("Deployment", "Service")}


def drain_gate_pdb() -> dict:
    (pdb,) = k8s.template("--set", "wasm.configMap.create=false", "--show-only", "templates/poddisruptionbudget.yaml")
    return pdb


def injector() -> dict:
    """istio-sidecar-injector as a default Istio install has it: no mesh-wide lifecycle."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio-sidecar-injector",
                                                                  "namespace": "istio-system"},
            "data": {"values": json.dumps({"global": {"proxy": {"autoInject": "enabled"}}}), "config": ""}}


def nodes() -> dict:
    """The LB's three nodes, labelled by the docs' `kubectl label node`, and one more."""
    def node(name, address, lb):
        labels = {"kubernetes.io/hostname": name, **({"drain-gate.io/lb-node": "true"} if lb else {})}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "status": {"addresses": [{"type": "InternalIP", "address": address}]}}
    items = [node(n, a, True) for n, a in LB_NODES.items()] + [node("worker4", "203.0.113.215", False)]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def listed(*objects: dict) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})


def cluster_replies(block: str, shell: docs.OfflineShell, start_gateway) -> dict[str, str]:  # noqa: F811
    """Writes what the block's cluster commands read (a gateway-like Envoy 1.40
    with the shipped EnvoyFilter form, started only if the block reads it);
    the substitutions: a node's :30180/:30181 check to its health listener, the
    LB's configuration file to the shipped one."""
    reads_envoy = re.search(r"pilot-agent request GET|:3018[01]/", block)
    env = start_gateway(istio.ENVOY_MATRIX[-1], envoyfilter_form()) if reads_envoy else None
    if "pilot-agent request GET config_dump" in block:
        (shell.replies / "config_dump").write_text(dump_of(env))
    if "pilot-agent request GET stats" in block:
        (shell.replies / "stats").write_text(requests.get(env.admin("/stats"), timeout=10).text)
    shell.reply("get pods -l istio=ingressgateway -o name",
                "".join(f"pod/istio-ingressgateway-5d8f7-{n}\n" for n in ("a1", "b2", "c3")))
    shell.reply("get pods -l app=istio-ingressgateway-canary -o name", "pod/istio-ingressgateway-canary-7c9d4-d4\n")
    shell.reply("get configmap istio-sidecar-injector -o json", json.dumps(injector()))
    shell.reply("get nodes -o json", json.dumps(nodes()))
    if "get deploy/istio-ingressgateway service/" in block:
        gw = gateway_objects()
        shell.reply("get deploy/istio-ingressgateway service/istio-ingressgateway pdb/drain-gate "
                    "configmap/istio-sidecar-injector -o json",
                    listed(gw["Deployment"], gw["Service"], drain_gate_pdb(), injector()))
    if "get deploy/istio-ingressgateway-canary" in block:
        gw = gateway_objects("istio-ingressgateway-canary", str(istio.KUBERNETES / "gateway-values-canary.yaml"))
        shell.reply("get deploy/istio-ingressgateway-canary service/istio-ingressgateway-canary pdb/drain-gate "
                    "configmap/istio-sidecar-injector -o json",
                    listed(gw["Deployment"], gw["Service"], drain_gate_pdb(), injector()))
    if "helm get values drain-gate" in block:  # the canary: a fleet on the oci:// route
        from tests.deploy.test_canary import fleet_release
        values, manifest = fleet_release(shell.replies.parent)
        shell.reply("helm get values drain-gate -n istio-system -o yaml", values)
        shell.reply("helm get manifest drain-gate -n istio-system", manifest)
    sidecar = {d["kind"]: d for d in istio.load_docs(SIDECAR_DESIGN)}
    shell.reply("get deploy istio-ingressgateway -o json", json.dumps(sidecar["Deployment"]))
    shell.reply("get service istio-ingressgateway -o json", json.dumps(sidecar["Service"]))
    subs = {r"/etc/haproxy/haproxy\.cfg": "envoyfilter/haproxy/haproxy.cfg",
            r"out/preflight/fingerprint\.json": str(FINGERPRINT)}
    if env:
        subs[r"http://203\.0\.113\.\d+:3018[01]/"] = f"http://127.0.0.1:{env.ports.health}/"
    return subs


def test_the_readme_has_the_install_commands():
    joined = "\n".join(COMMANDS)
    for expected in ("make configmap", "helm upgrade --install drain-gate envoyfilter/chart",
                     "helm upgrade --install istio-ingressgateway istio/gateway --version 1.30.3",
                     "pilot-agent request GET config_dump", "verify.py --config-dump -", "verify.py --pod-spec -",
                     "--patch-file envoyfilter/kubernetes/migrate-from-sidecar-design.yaml",
                     "helm rollback istio-ingressgateway", "wasmPlugin.canary.url="):
        assert expected in joined, expected


def test_every_istio_gateway_command_pins_the_chart_version():
    for command in COMMANDS:
        for stage in stages(command):
            if re.search(r"(^|\s)istio/gateway(\s|$)", stage):
                assert "--version 1.30.3" in stage, stage


def test_no_command_runs_curl_inside_the_proxy_container():
    """-distroless istio-proxy images have no curl: the docs ask Envoy through pilot-agent."""
    for command in COMMANDS:
        for stage in stages(command):
            if re.search(r"kubectl\b.*\bexec\b", stage):
                assert "curl" not in stage and "pilot-agent request GET" in stage, stage


def test_the_stand_ins_refuse_an_unpinned_chart_and_curl_in_the_pod(tmp_path):
    """The checks above can fail: the helm stand-in refuses istio/gateway without
    the version, the kubectl one an exec of curl."""
    if not k8s.GATEWAY_CHART.is_dir():
        pytest.skip(f"the istio/gateway chart is absent at {k8s.GATEWAY_CHART}")
    shell = docs.OfflineShell(tmp_path)
    r = shell.run("helm template gw istio/gateway -n istio-system")
    assert r.returncode != 0 and "without --version 1.30.3" in r.stderr, r.stderr
    r = shell.run("kubectl -n istio-system exec deploy/istio-ingressgateway -c istio-proxy -- curl -s "
                  "localhost:15000/config_dump")
    assert r.returncode != 0 and "use pilot-agent request" in r.stderr, r.stderr


# prove.py needs a real LB in front of real gateways: tests/lb/test_prove.py runs these commands there.
PROVE = "envoyfilter/tools/prove.py"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.strip().splitlines()[0][:60] for b in BLOCKS])
def test_readme_block_runs_offline(block, shell, start_gateway):  # noqa: F811
    offline = "\n".join(c for c in docs.commands(block) if PROVE not in c)
    r = shell.run(offline, cluster_replies(block, shell, start_gateway))
    assert r.returncode == 0, (block, r.stdout[-2000:], r.stderr[-2000:])
    verdicts = [line for line in r.stdout.splitlines() if re.match(r"(OK|FAILED): \d+ check", line)]
    ran = "\n".join(docs.runnable(block))
    # A loop runs verify.py once per pod: at least once per mention, and never a failure.
    runs = ran.count("python3 envoyfilter/tools/verify.py")
    # The loop's two verify.py run for each of the three pods the pod list names.
    assert set(verdicts) <= {"OK: 0 check(s) failed"}, r.stdout
    assert len(verdicts) == runs + (2 * 3 - 2 if "for pod in" in ran else 0), r.stdout
    if re.search(r"3018[01]/health_check.html", block):
        assert "200" in r.stdout.splitlines()
    if "helm get values drain-gate" in block:  # the canary's upgrade adds its two objects, changes none
        from tests.deploy.test_canary import CANARY_OBJECTS, changed
        upgrade = [e for e in shell.recorded() if e["verb"] == "helm install"][-1]
        running = (shell.replies / "helm get manifest drain-gate -n istio-system").read_text()
        assert changed(k8s.by_kind(k8s.docs(running)), k8s.by_kind(k8s.docs(upgrade["manifest"]))) == CANARY_OBJECTS
    if "grep -nE" in block:  # the LB team's lines, in the shipped haproxy.cfg
        for line in ("option httpchk GET /health_check.html", "retries 3", "check port", "inter",
                     "rise 2 fall 2 on-marked-down shutdown-sessions"):
            assert line in r.stdout, line


def test_a_cluster_command_with_a_bad_flag_fails_on_its_arguments(tmp_path):
    """The check above can fail: kubectl refuses bad arguments before it connects."""
    r = docs.OfflineShell(tmp_path).run("kubectl -n istio-system rollout status deploy/x --timeoutt=30m")
    assert r.returncode != 0 and "unknown flag: --timeoutt" in r.stderr, r.stderr


def test_client_side_apply_annotation_is_over_the_cap_and_never_used(tmp_path):
    """kubectl's own last-applied-configuration for the wasm ConfigMap (--save-config
    writes what client-side apply would) is over the annotation cap; no page
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
                assert "--server-side" in stage, f"client-side apply in the docs: {stage}"
    # The chart's ConfigMap carries no such annotation (Helm does not write it).
    b64 = k8s.wasm_base64_file(wasm, tmp_path)
    (cm,) = [o for o in k8s.template("--set-file", f"wasm.base64={b64}") if o["kind"] == "ConfigMap"]
    assert "kubectl.kubernetes.io/last-applied-configuration" not in cm["metadata"].get("annotations", {})
