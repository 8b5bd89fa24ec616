"""Every install route of envoyfilter/docs/, rendered from the real charts
and templates, yields a gateway pod that verify.py --pod-spec passes with its
Service, the PodDisruptionBudget over it and the cluster's Nodes: a pod the
EnvoyFilters and WasmPlugins select, with the module mounted where they load
it, pinned to exactly the LB's nodes, one per replica.

- the istio/gateway chart of Istio 1.30.3 (../shared/istio-gateway-chart;
  these routes skip where it is absent) with envoyfilter/kubernetes/gateway-values.yaml,
  and with the distroless values on top;
- the kubectl patch route: the chart's Deployment without drain-gate's values,
  patched with gateway-deployment-patch*.yaml (`kubectl patch --local --type
  strategic`), and kubernetes/service.yaml;
- the Gateway API route: the Deployment, Service and PodDisruptionBudget that
  Istio 1.30.3's kube-gateway template renders (tests/fixtures/gateway-api),
  patched with the ConfigMap's keys as istiod does;
- the migration from the sidecar design: tests/fixtures/sidecar-design's
  Deployment and Service patched with migrate-from-sidecar-design*.yaml;
- the canary gateway of the go-live checklist (gateway-values-canary.yaml):
  one pod on one LB node, behind node ports of its own.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.harness import istio, k8s

VERIFY = istio.ENVOYFILTER / "tools" / "verify.py"
RELEASE = "istio-ingressgateway"
TOKEN = "a3f1c2d4e5b60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8"
SIDECAR_DESIGN = istio.REPO / "tests" / "fixtures" / "sidecar-design" / "gateway.yaml"
# The LB's servers (haproxy/haproxy.cfg) and the cluster's nodes: those three
# labelled drain-gate.io/lb-node=true, and one more the LB does not send to.
LB_SERVERS = ("203.0.113.212", "203.0.113.213", "203.0.113.214")
needs_chart = pytest.mark.skipif(not k8s.GATEWAY_CHART.is_dir(), reason=(
    f"the istio/gateway chart is not at {k8s.GATEWAY_CHART} (../shared is absent): this route is not rendered"))


def nodes() -> list[dict]:
    def node(i: int, lb: bool) -> dict:
        name, address = f"worker{i}", f"203.0.113.{212 + i}"
        labels = {"kubernetes.io/hostname": name, **({"drain-gate.io/lb-node": "true"} if lb else {})}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "status": {"addresses": [{"type": "InternalIP", "address": address}]}}
    return [node(i, True) for i in range(len(LB_SERVERS))] + [node(len(LB_SERVERS), False)]


def gateway_chart(*args: str, release: str = RELEASE) -> dict:
    return k8s.by_kind(k8s.template(*args, chart=k8s.GATEWAY_CHART, release=release))


def drain_gate_pdb() -> dict:
    (pdb,) = k8s.template("--set", "wasm.configMap.create=false", "--show-only", "templates/poddisruptionbudget.yaml")
    return pdb


def chart_route(*extra: str) -> list[dict]:
    objs = gateway_chart("-f", str(istio.KUBERNETES / "gateway-values.yaml"), *extra)
    return [objs[("Deployment", RELEASE)], objs[("Service", RELEASE)], drain_gate_pdb()]


def patch_route(patch: str, workdir) -> list[dict]:
    """The chart's own Deployment (no drain-gate values) patched; the Service of kubernetes/service.yaml."""
    plain = gateway_chart()[("Deployment", RELEASE)]
    text = (istio.KUBERNETES / patch).read_text().replace("<drain-gate-admin-token>", TOKEN)
    return [istio.strategic_patch(plain, text, workdir), istio.load_one(istio.KUBERNETES / "service.yaml"),
            drain_gate_pdb()]


def gateway_api_route(options: str, workdir) -> list[dict]:
    return [istio.gateway_api_patched(options, kind, workdir)
            for kind in ("Deployment", "Service", "PodDisruptionBudget")]


def migration_route(workdir) -> list[dict]:
    objs = {d["kind"]: d for d in istio.load_docs(SIDECAR_DESIGN)}
    return [istio.strategic_patch(objs[kind], (istio.KUBERNETES / patch).read_text(), workdir)
            for kind, patch in (("Deployment", "migrate-from-sidecar-design.yaml"),
                                ("Service", "migrate-from-sidecar-design-service.yaml"))] + [drain_gate_pdb()]


ROUTES = {
    "chart values": pytest.param(lambda tmp: chart_route(), marks=needs_chart),
    "chart values, distroless": pytest.param(lambda tmp: chart_route(
        "-f", str(istio.KUBERNETES / "gateway-values-distroless.yaml"),
        "--set-string", f"lifecycle.preStop.httpGet.httpHeaders[0].value=Bearer {TOKEN}"), marks=needs_chart),
    "kubectl patch": pytest.param(lambda tmp: patch_route("gateway-deployment-patch.yaml", tmp), marks=needs_chart),
    "kubectl patch, distroless": pytest.param(
        lambda tmp: patch_route("gateway-deployment-patch-distroless.yaml", tmp), marks=needs_chart),
    "gateway api": pytest.param(lambda tmp: gateway_api_route("options.yaml", tmp)),
    "gateway api, distroless": pytest.param(lambda tmp: gateway_api_route("options-distroless.yaml", tmp)),
    "migration from the sidecar design": pytest.param(migration_route),
}


@needs_chart
def test_canary_route_yields_one_pod_on_its_node_behind_its_own_ports(tmp_path):
    """gateway-values-canary.yaml on top of the values: one pod on worker0's
    LB node (by its hostname label), node ports of its own, out of the fleet's
    Service, selected by the drain-gate chart; verify.py passes it with the
    LB's one canary server."""
    objs = gateway_chart("-f", str(istio.KUBERNETES / "gateway-values.yaml"),
                         "-f", str(istio.KUBERNETES / "gateway-values-canary.yaml"),
                         "--set", "nodeSelector.kubernetes\\.io/hostname=worker0", release="istio-ingressgateway-canary")
    deployment = k8s.without_nulls(objs[("Deployment", "istio-ingressgateway-canary")])
    service = objs[("Service", "istio-ingressgateway-canary")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selected_by_the_chart(labels, "istio-system", False) == []
    assert labels["istio"] == "ingressgateway", "the fleet's Gateways configure it"
    fleet = gateway_chart("-f", str(istio.KUBERNETES / "gateway-values.yaml"))
    assert not all(labels.get(k) == v for k, v in fleet[("Service", RELEASE)]["spec"]["selector"].items()), \
        "the fleet's Service does not send to the canary"
    assert {p["nodePort"] for p in service["spec"]["ports"]}.isdisjoint(
        {p["nodePort"] for p in fleet[("Service", RELEASE)]["spec"]["ports"]})
    stdin = "\n".join(json.dumps(o) for o in [deployment, service, drain_gate_pdb()] + nodes())
    r = subprocess.run([sys.executable, str(VERIFY), "--pod-spec", "-", "--lb-nodes", LB_SERVERS[0]],
                       input=stdin, capture_output=True, text=True, timeout=60)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and not r.stderr, lines
    assert "PASS LB nodes: Deployment istio-ingressgateway-canary: 1 of 4 nodes given fit (worker0), replicas 1" \
        in lines


def selected_by_the_chart(pod: dict, namespace: str, gateway_api: bool) -> list[str]:
    """The drain-gate objects of both forms that do NOT select the pod."""
    sets = ["--set", "wasm.configMap.create=false", "-n", namespace] + (
        ["--set", "gatewayAPI.enabled=true"] if gateway_api else [])
    missing = []
    for form in ((), ("--set", "form=wasmplugin", "--set", "tcp.ports={15443}")):
        r = k8s.run("helm", "template", "drain-gate", str(k8s.CHART), *sets, *form)
        for obj in k8s.docs(r.stdout):
            if obj["kind"] in ("EnvoyFilter", "WasmPlugin") and not istio.selects_workload(obj, namespace, pod):
                missing.append(f"{obj['kind']} {obj['metadata']['name']}")
    return missing


@pytest.mark.parametrize("route", list(ROUTES.values()), ids=list(ROUTES))
def test_route_yields_a_selected_mounted_pinned_pod_that_verify_passes(route, tmp_path):
    objects = [k8s.without_nulls(o) for o in route(tmp_path)]
    deployment = objects[0]
    template = deployment["spec"]["template"]
    namespace = deployment["metadata"]["namespace"]
    assert selected_by_the_chart(template["metadata"]["labels"], namespace,
                                 "gateway.networking.k8s.io/gateway-name" in template["metadata"]["labels"]) == []
    stdin = "\n".join(json.dumps(o) for o in objects + nodes())
    r = subprocess.run([sys.executable, str(VERIFY), "--pod-spec", "-", "--lb-nodes", ",".join(LB_SERVERS)],
                       input=stdin, capture_output=True, text=True, timeout=60)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and not r.stderr, lines
    name = f"Deployment {deployment['metadata']['name']}"
    for expected in (f"PASS drain-gate label: {name}: pods labelled drain-gate.io/enabled=true",
                     f"PASS wasm mount: {name}: /etc/drain-gate/drain_gate.wasm from configMap drain-gate-wasm, "
                     "key drain_gate.wasm",
                     f"PASS LB nodes: {name}: pinned by nodeSelector drain-gate.io/lb-node=true",
                     f"PASS LB nodes: {name}: 3 of 4 nodes given fit (worker0, worker1, worker2), replicas 3",
                     f"PASS LB nodes: {name}: the LB's servers {', '.join(LB_SERVERS)} are the nodes the pods fit",
                     f"PASS health port: {name}: only istio-proxy claims :18180",
                     f"PASS drain-gate preStop: {name}: the hook drains through drain-gate"):
        assert expected in lines, (expected, lines)
    assert sum(line.startswith("PASS service selector") for line in lines) == 1
    assert sum(line.startswith("PASS pdb selector") for line in lines) == 1


def test_gateway_api_distroless_patch_removes_a_mesh_wide_exec_prestop(tmp_path):
    """istiod's kube-gateway template renders the mesh's global.proxy.lifecycle on
    istio-proxy, then merges the ConfigMap's patch over it: the distroless
    ConfigMap's `exec: null` leaves the httpGet hook alone (without it, the
    Deployment would carry two handlers and the API server refuse it)."""
    deployment = istio.gateway_api_rendered()["Deployment"]
    proxy = istio.proxy_container(deployment)
    proxy["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 5"]}}}
    patch = istio.load_one(istio.GATEWAY_API / "options-distroless.yaml")["data"]["deployment"]
    merged = istio.strategic_patch(deployment, patch, tmp_path)
    assert set(istio.proxy_container(merged)["lifecycle"]["preStop"]) == {"httpGet"}
    without = yaml.safe_load(patch)
    del without["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]
    merged = istio.strategic_patch(deployment, yaml.safe_dump(without), tmp_path)
    assert set(istio.proxy_container(merged)["lifecycle"]["preStop"]) == {"exec", "httpGet"}, "the control"
