"""envoyfilter/tools/verify.py against what real Envoy 1.40 runs: config dumps
fetched from a gateway-like Envoy started with the shipped forms pass; a dump
with the traffic filter missing on one listener, one with the traffic and
health roles in different vm_ids, and a pod spec with a short grace period or
a rollout that deadlocks each fail with the line that names them."""
from __future__ import annotations

import contextlib
import copy
import functools
import http.server
import json
import subprocess
import sys
import threading

import pytest
import requests
import yaml

from tests.deploy.test_gateway_api import _rollout
from tests.deploy.test_istio_envoy import (  # noqa: F401
    _wasmplugin_gateway,
    _wasmplugin_listeners,
    load,
    passthrough,
    pulled_wasm,
    start_gateway,
)
from tests.deploy.test_istio_kubernetes import render_chart
from tests.harness import istio, k8s
from tests.harness.envoy import REPO, WASM
from tests.harness.process import accepts, wait_for

VERIFY = istio.ENVOYFILTER / "tools" / "verify.py"
VERSION = istio.ENVOY_MATRIX[-1]


def verify(*args: str, stdin: str | None = None) -> tuple[int, list[str]]:
    r = subprocess.run([sys.executable, str(VERIFY), *args], input=stdin, capture_output=True, text=True,
                       timeout=60)
    assert not r.stderr, r.stderr
    return r.returncode, r.stdout.splitlines()


def failures(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL ")]


def _logical_ports(node, actual_to_logical: dict):
    if isinstance(node, dict):
        return {k: (actual_to_logical.get(v, v) if k == "port_value" else _logical_ports(v, actual_to_logical))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_logical_ports(v, actual_to_logical) for v in node]
    return node


def dump_of(env) -> str:
    """The config dump as the gateway would show it: the harness binds each
    listener to a free port; those are mapped back to the ports written."""
    dump = requests.get(env.admin("/config_dump"), timeout=10).json()
    return json.dumps(_logical_ports(dump, {actual: logical for logical, actual in env.at.items()}))


def envoyfilter_form(traffic: dict | None = None, tcp: bool = True, health: dict | None = None) -> istio.Xds:
    return istio.gateway_xds(
        [istio.gateway_listener(8080), istio.gateway_listener(8443), istio.gateway_listener(15443, tcp=True)],
        [traffic or load("traffic-filter.yaml"), health or load("health-listener.yaml")]
        + ([load("tcp-filter.yaml")] if tcp else []))


@contextlib.contextmanager
def serve_directory(directory):
    """A URL for --config-dump: the dump (ports as written) served over HTTP."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def deployment(**changes) -> str:
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    values.update(changes)
    return json.dumps(render_chart(values)[0])


def test_shipped_envoyfilter_form_passes_from_a_url_and_stdin(start_gateway, tmp_path):
    env = start_gateway(VERSION, envoyfilter_form())
    served = tmp_path / "served"
    served.mkdir()
    (served / "config_dump").write_text(dump_of(env))
    with serve_directory(served) as base:
        code, lines = verify("--config-dump", f"{base}/config_dump")
    assert code == 0, lines
    assert "PASS traffic filter: listener 0.0.0.0_8080: drain-gate traffic filter before the router" in lines
    assert "PASS traffic filter: listener 0.0.0.0_8443: drain-gate traffic filter before the router" in lines
    assert "PASS vm_id: listener 0.0.0.0_8443: traffic vm_id 'drain-gate' = health" in lines
    assert "PASS health catch-all 503: listener drain-gate-health: routes end in a catch-all direct 503" in lines
    assert "PASS tcp filter: listener 0.0.0.0_15443: drain-gate TCP filter before tcp_proxy" in lines
    assert "PASS vm_id: listener 0.0.0.0_15443: tcp vm_id 'drain-gate' = health" in lines
    assert "PASS health failure_policy: listener drain-gate-health: FAIL_CLOSED (want FAIL_CLOSED)" in lines
    assert "PASS health fallback: listener drain-gate-health: without a configuration loaded, RBAC lets requests " \
        "on to the catch-all 503 (or refuses them)" in lines
    (tmp_path / "pod.json").write_text(deployment())
    code, lines = verify("--config-dump", "-", "--pod-spec", str(tmp_path / "pod.json"), stdin=dump_of(env))
    assert code == 0, lines
    assert lines[-1] == "OK: 0 check(s) failed"


def test_a_tcp_chain_without_the_tcp_filter_fails_naming_the_listener(start_gateway):
    env = start_gateway(VERSION, envoyfilter_form(tcp=False))
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == ["FAIL tcp filter: listener 0.0.0.0_15443: 0 drain-gate TCP filters before tcp_proxy "
                               "(want 1)"]


def test_shipped_wasmplugin_form_passes(start_gateway, tmp_path):  # noqa: F811
    env = start_gateway(VERSION, _wasmplugin_listeners(tmp_path, load("wasmplugin/health-listener.yaml")))
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 0, lines
    assert "PASS vm_id: listener 0.0.0.0_8080: traffic vm_id '' = health" in lines


def test_filter_missing_on_one_listener_fails_naming_it(start_gateway):
    traffic = copy.deepcopy(load("traffic-filter.yaml"))
    traffic["spec"]["configPatches"][0]["match"]["listener"]["portNumber"] = 8080
    env = start_gateway(VERSION, envoyfilter_form(traffic))
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == [
        "FAIL traffic filter: listener 0.0.0.0_8443: 0 drain-gate traffic filters before the router (want 1)"]


def test_vm_id_mismatch_fails_naming_the_listener(start_gateway, tmp_path):  # noqa: F811
    """The WasmPlugin (vm_id "") beside the EnvoyFilter-form health listener.
    The health role never sees the traffic role across vm_ids, so the gateway
    is not announced (`waiting_for`): the harness waits for the admin only."""
    env = start_gateway(VERSION, _wasmplugin_listeners(tmp_path, load("health-listener.yaml")), ready_path=None)
    wait_for(lambda: accepts(env.ports.health), 30, what="health listener serving")
    assert requests.get(env.health("/drain/status"), timeout=5).json()["waiting_for"] == "traffic_role"
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == ["FAIL vm_id: listener 0.0.0.0_8080: traffic vm_id '' != health vm_id 'drain-gate'"]


def test_short_grace_period_fails_with_the_arithmetic(start_gateway, tmp_path):
    """The timings come from the health filter Envoy runs (drain_timeout 300s here)."""
    health = load("health-listener.yaml")
    plugin = istio.plugin_config(health)
    plugin["configuration"]["value"] = json.dumps({**json.loads(plugin["configuration"]["value"]),
                                                   "drain_timeout": "300s"})
    env = start_gateway(VERSION, istio.gateway_xds([istio.gateway_listener(8080)], [load("traffic-filter.yaml"), health]))
    (tmp_path / "pod.json").write_text(deployment())
    code, lines = verify("--config-dump", "-", "--pod-spec", str(tmp_path / "pod.json"), stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == [
        "FAIL terminationGracePeriodSeconds: Deployment istio-ingressgateway: 150 s; needs >= 325 s = "
        "drain_timeout 300 + longest CLOSING 10 + scrape_interval 0 + hold margin 5 + terminationDrainDuration 5 + "
        "spare 5",
        "FAIL preStop --max-time: Deployment istio-ingressgateway: 140 s; between the hold 315 s and grace - "
        "terminationDrainDuration 145 s"]


@pytest.mark.parametrize("changes, expected", [
    ({"terminationGracePeriodSeconds": 60},
     "FAIL terminationGracePeriodSeconds: Deployment istio-ingressgateway: 60 s; needs >= 145 s"),
    ({"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
     "FAIL rollout: Deployment istio-ingressgateway: required anti-affinity per node, maxSurge 1, maxUnavailable 0"),
    ({"strategy": {}},  # Kubernetes' default 25%/25% of 3 replicas: surge 1, unavailable 0
     "FAIL rollout: Deployment istio-ingressgateway: required anti-affinity per node, maxSurge 1, maxUnavailable 0"),
    ({"lifecycle": {}}, "FAIL preStop: Deployment istio-ingressgateway: container istio-proxy has no lifecycle.preStop"),
    ({"readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}}},
     "FAIL readiness: Deployment istio-ingressgateway: readinessProbe port 15021 (want httpGet :18180)"),
])
def test_pod_spec_mistakes_fail_naming_the_field(changes, expected):
    code, lines = verify("--pod-spec", "-", stdin=deployment(**changes))
    assert code == 1
    assert any(line.startswith(expected) for line in failures(lines)), lines
    assert all(line.split(":")[0] in ("FAIL terminationGracePeriodSeconds", "FAIL preStop --max-time")
               for line in failures(lines) if not line.startswith(expected)), lines


@pytest.mark.parametrize("options", ["options.yaml", "options-distroless.yaml"])
def test_gateway_api_patched_deployment_passes(options, tmp_path):
    """The Deployment istiod renders for the Gateway with the ConfigMap's
    patch (kubectl's strategic merge): one pod per node by topology spread."""
    deployment = istio.gateway_api_patched(options, "Deployment", tmp_path)
    code, lines = verify("--pod-spec", "-", stdin=json.dumps(deployment))
    assert code == 0, lines
    assert "PASS one pod per node: Deployment ingress-istio: topology spread on kubernetes.io/hostname, maxSkew 1" \
        in lines
    assert not [line for line in lines if line.startswith("WARN")], lines
    # The control: the rendering without the patch fails (no preStop, readiness on 15021, grace 30 s).
    code, lines = verify("--pod-spec", "-", stdin=json.dumps(istio.gateway_api_rendered()["Deployment"]))
    assert code == 1 and {line.split(":")[0] for line in failures(lines)} >= {
        "FAIL preStop", "FAIL readiness", "FAIL terminationGracePeriodSeconds"}, lines


def test_yaml_input_is_refused_with_the_conversion_hint():
    r = subprocess.run([sys.executable, str(VERIFY), "--pod-spec", "-"], input="kind: Deployment\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "convert it with `kubectl ... -o json`" in r.stderr


def test_standard_library_only():
    imports = {line.split()[1].split(".")[0] for line in VERIFY.read_text().splitlines()
               if line.startswith(("import ", "from ")) and "__future__" not in line}
    assert imports <= set(sys.stdlib_module_names), imports - set(sys.stdlib_module_names)


LUA = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"


def test_health_listener_failing_open_fails_naming_both_fields(start_gateway):
    """A health filter set to FAIL_OPEN whose last route answers 200, and whose
    fallback (no configuration loaded) answers 200 itself: a dead VM, or a
    module that never loaded, would tell the LB the gateway is fine."""
    health = copy.deepcopy(load("health-listener.yaml"))
    hcm = health["spec"]["configPatches"][0]["patch"]["value"]["filter_chains"][0]["filters"][0]["typed_config"]
    istio.plugin_config(health)["failure_policy"] = "FAIL_OPEN"
    hcm["route_config"]["virtual_hosts"][0]["routes"][-1]["direct_response"]["status"] = 200
    discovery = hcm["http_filters"][0]["config_discovery"]
    discovery["default_config"] = {"@type": LUA, "default_source_code": {"inline_string": (
        'function envoy_on_request(h) h:respond({[":status"] = "200"}, "OK") end')}}
    discovery["type_urls"].append(LUA)
    env = start_gateway(VERSION, istio.gateway_xds([istio.gateway_listener(8080)], [load("traffic-filter.yaml"), health]))
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == [
        "FAIL health failure_policy: listener drain-gate-health: FAIL_OPEN (want FAIL_CLOSED)",
        f"FAIL health fallback: listener drain-gate-health: without a configuration loaded, its default_config {LUA} "
        "answers in drain-gate's place: the LB could read 200 from a gateway that does not run drain-gate",
        "FAIL health catch-all 503: listener drain-gate-health: no catch-all 503 route"]


# -- the install routes' broken variants: each one fails, naming its cause ---------------------
SIDECAR_DESIGN = istio.REPO / "tests" / "fixtures" / "sidecar-design" / "gateway.yaml"
MIGRATION = istio.KUBERNETES / "migrate-from-sidecar-design.yaml"


def pod_verdict(*objects: dict, args: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    return verify("--pod-spec", "-", *args, stdin="\n".join(json.dumps(o) for o in objects))


def values_without_drain_gate() -> dict:
    """The istio/gateway values with nothing of drain-gate's in the pod: what the
    kubectl patch route starts from."""
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    return {k: v for k, v in values.items()
            if k not in ("labels", "volumes", "volumeMounts", "lifecycle", "readinessProbe", "nodeSelector")}


def sidecar_design(kind: str) -> dict:
    (obj,) = [d for d in istio.load_docs(SIDECAR_DESIGN) if d["kind"] == kind]
    return obj


def test_patch_route_without_the_label_and_the_mount_fails_naming_both(tmp_path):
    """The Deployment patch as it was (preStop, readiness, port, grace period,
    no label, no mount) on a gateway without drain-gate's values: no EnvoyFilter
    selects its pods and there is no module to load."""
    patch = istio.load_one(istio.KUBERNETES / "gateway-deployment-patch.yaml")
    del patch["spec"]["template"]["metadata"]
    del patch["spec"]["template"]["spec"]["volumes"]
    del patch["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    base, _ = render_chart({**values_without_drain_gate(), "nodeSelector": {"drain-gate.io/lb-node": "true"}})
    code, lines = pod_verdict(istio.strategic_patch(base, yaml.safe_dump(patch), tmp_path))
    assert code == 1
    assert failures(lines) == [
        "FAIL drain-gate label: Deployment istio-ingressgateway: pods lack drain-gate.io/enabled=true, the label the "
        "EnvoyFilters select: no :18180 listener is added, the :18180 readiness probe never passes and the rollout "
        "stops",
        "FAIL wasm mount: Deployment istio-ingressgateway: istio-proxy mounts nothing at "
        "/etc/drain-gate/drain_gate.wasm: every drain-gate filter there fails to load, and Envoy refuses the "
        "listener update that carries it"]
    # The shipped patch: both there.
    shipped = (istio.KUBERNETES / "gateway-deployment-patch.yaml").read_text()
    code, lines = pod_verdict(istio.strategic_patch(base, shipped, tmp_path))
    assert code == 0, lines


def test_pods_not_pinned_to_the_lb_nodes_fail():
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    del values["nodeSelector"]
    code, lines = pod_verdict(render_chart(values)[0])
    assert code == 1
    assert failures(lines) == [
        "FAIL LB nodes: Deployment istio-ingressgateway: no nodeSelector or required nodeAffinity: a pod (a "
        "replacement in a rollout or a node drain included) can land on a node the LB does not send to, and with "
        "externalTrafficPolicy Local the LB node left without a pod drops its NodePort traffic"]


def node(name: str, address: str, lb: bool) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"kubernetes.io/hostname": name, **({"drain-gate.io/lb-node": "true"} if lb else {})}},
        "status": {"addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}]}}


def test_the_nodes_that_fit_are_one_per_replica_and_the_lb_servers():
    """With the Nodes (kubectl get nodes -o json) and the LB's servers given:
    exactly the LB's nodes fit the pods, one per replica."""
    deployment = render_chart(istio.load_one(istio.KUBERNETES / "gateway-values.yaml"))[0]
    lb = [node(f"worker{i}", f"203.0.113.{212 + i}", True) for i in range(3)]
    servers = ("--lb-nodes", "203.0.113.212,203.0.113.213,203.0.113.214")
    code, lines = pod_verdict(deployment, *lb, node("worker3", "203.0.113.215", False), args=servers)
    assert code == 0, lines
    assert "PASS LB nodes: Deployment istio-ingressgateway: 3 of 4 nodes given fit (worker0, worker1, worker2), " \
           "replicas 3" in lines
    # A fourth labelled node, with the one-pod-per-node anti-affinity: room for a surge pod, not a failure;
    # it must be one of the LB's servers too.
    code, lines = pod_verdict(deployment, *lb, node("worker3", "203.0.113.215", True),
                              args=("--lb-nodes", servers[1] + ",203.0.113.215"))
    assert code == 0, lines
    assert "PASS LB nodes: Deployment istio-ingressgateway: 4 of 4 nodes given fit (worker0, worker1, worker2, " \
           "worker3), replicas 3; 1 fitting node(s) without a pod fail the LB's check (DOWN): room for a surge pod" \
           in lines
    unspread = copy.deepcopy(deployment)
    del unspread["spec"]["template"]["spec"]["affinity"]
    code, lines = pod_verdict(unspread, *lb, node("worker3", "203.0.113.215", True))
    assert code == 1 and "FAIL LB nodes: Deployment istio-ingressgateway: 4 of 4 nodes given fit (worker0, worker1, " \
        "worker2, worker3), replicas 3: a fitting node may be left without a pod while another gets two" in lines
    code, lines = pod_verdict(deployment, *lb[:2], node("worker2", "203.0.113.214", False), args=servers)
    assert code == 1
    assert failures(lines) == [
        "FAIL LB nodes: Deployment istio-ingressgateway: 2 of 3 nodes given fit (worker0, worker1), replicas 3: a "
        "pod finds no node and stays Pending, and the LB node it should serve has none",
        "FAIL LB nodes: Deployment istio-ingressgateway: the LB's servers 203.0.113.212,203.0.113.213,203.0.113.214"
        .replace(",", ", ") + "; no fitting node has 203.0.113.214 (the LB sends there, no gateway pod can run there)"]


SPARE_NODE = istio.REPO / "tests" / "fixtures" / "sidecar-design" / "spare-node.yaml"
FOUR_SERVERS = ("--lb-nodes", "203.0.113.212,203.0.113.213,203.0.113.214,203.0.113.215")


def sidecar_design_with_its_strategy(tmp_path) -> tuple[list[dict], list[dict]]:
    """The sidecar design's gateway with its own rollout strategy (maxSurge 1,
    maxUnavailable 0), migrated to drain-gate, with its Service and the chart's
    PDB; and the cluster's nodes (four LB nodes for three replicas)."""
    strategy, *nodes = istio.load_docs(SPARE_NODE)
    deployment = istio.strategic_patch(sidecar_design("Deployment"), yaml.safe_dump(strategy), tmp_path)
    migrated = istio.strategic_patch(deployment, MIGRATION.read_text(), tmp_path)
    service = istio.strategic_patch(sidecar_design("Service"),
                                    (istio.KUBERNETES / "migrate-from-sidecar-design-service.yaml").read_text(),
                                    tmp_path)
    (pdb,) = k8s.template("--set", "wasm.configMap.create=false", "--show-only", "templates/poddisruptionbudget.yaml")
    return [migrated, service, pdb], nodes


def rollout_line(lines: list[str]) -> str:
    (line,) = [x for x in lines if x.split(":")[0].endswith(" rollout")]
    return line


def test_the_sidecar_design_s_surge_onto_a_spare_node_passes(tmp_path):
    """maxSurge 1, maxUnavailable 0 with one pod per node is judged by the nodes
    the pods fit: with a spare LB node the surge pod has a node, and the whole
    migrated gateway passes; the rollout model (the Deployment controller and the
    scheduler's filters, tests/deploy/test_gateway_api.py) finishes the same rollout."""
    objects, nodes = sidecar_design_with_its_strategy(tmp_path)
    code, lines = pod_verdict(*objects, *nodes, args=FOUR_SERVERS)
    assert code == 0, failures(lines)
    assert rollout_line(lines) == (
        "PASS rollout: Deployment istio-ingressgateway: required anti-affinity per node, maxSurge 1, "
        "maxUnavailable 0; 4 node(s) fit (worker1, worker2, worker3, worker4) for 3 replica(s): the surge pod "
        "takes a node without a gateway pod, then an old pod drains (the LB must check every fitting node: the "
        "one without a pod answers DOWN)")
    assert _rollout(objects[0], workers=4, tainted_nodes=0)[0] is True


def test_a_surge_with_no_node_to_spare_fails_whatever_keeps_the_node_away(tmp_path):
    """The same strategy where the surge pod finds no node: three LB nodes for
    three replicas, the spare node tainted or cordoned, or no Nodes given at all.
    A toleration of the taint gives the node back. The model agrees on each."""
    objects, nodes = sidecar_design_with_its_strategy(tmp_path)
    deployment, others = objects[0], objects[1:]
    three = [n for n in nodes if n["metadata"]["name"] != "worker4"]
    servers = ("--lb-nodes", FOUR_SERVERS[1].rsplit(",", 1)[0])
    code, lines = pod_verdict(deployment, *others, *three, args=servers)
    assert code == 1 and failures(lines) == [
        "FAIL rollout: Deployment istio-ingressgateway: required anti-affinity per node, maxSurge 1, "
        "maxUnavailable 0; 3 node(s) fit (worker1, worker2, worker3) for 3 replica(s): the surge pod finds no node "
        "without a gateway pod and stays Pending, and no old pod may go before it is ready: the rollout hangs (add "
        "a node the pods fit, or use maxSurge 0, maxUnavailable 1)"], lines
    assert _rollout(deployment, workers=3, tainted_nodes=0) == (False, [])

    tainted = copy.deepcopy(nodes)
    spare = next(n for n in tainted if n["metadata"]["name"] == "worker4")
    spare["spec"] = {"taints": [{"key": "maintenance", "value": "disk", "effect": "NoSchedule"}]}
    code, lines = pod_verdict(deployment, *others, *tainted, args=FOUR_SERVERS)
    assert code == 1 and rollout_line(lines) == (
        "FAIL rollout: Deployment istio-ingressgateway: required anti-affinity per node, maxSurge 1, "
        "maxUnavailable 0; 3 node(s) fit (worker1, worker2, worker3) for 3 replica(s) (worker4 has "
        "maintenance=disk:NoSchedule, which the pods do not tolerate): the surge pod finds no node without a "
        "gateway pod and stays Pending, and no old pod may go before it is ready: the rollout hangs (add a node the "
        "pods fit, or use maxSurge 0, maxUnavailable 1)"), lines
    assert _rollout(deployment, workers=3, tainted_nodes=1) == (False, [])
    spare["spec"] = {"taints": [{"key": "maintenance", "value": "disk", "effect": "PreferNoSchedule"}]}
    assert rollout_line(pod_verdict(deployment, *others, *tainted, args=FOUR_SERVERS)[1]).startswith("PASS ")

    spare["spec"] = {"unschedulable": True}
    assert "(worker4 has node.kubernetes.io/unschedulable:NoSchedule, which the pods do not tolerate)" in \
        rollout_line(pod_verdict(deployment, *others, *tainted, args=FOUR_SERVERS)[1])

    spare["spec"] = {"taints": [{"key": "maintenance", "value": "disk", "effect": "NoSchedule"}]}
    tolerant = copy.deepcopy(deployment)
    tolerant["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "maintenance", "operator": "Equal", "value": "disk", "effect": "NoSchedule"}]
    code, lines = pod_verdict(tolerant, *others, *tainted, args=FOUR_SERVERS)
    assert code == 0 and rollout_line(lines).startswith("PASS rollout: "), failures(lines)
    tolerant["spec"]["template"]["spec"]["tolerations"][0]["value"] = "network"
    assert pod_verdict(tolerant, *others, *tainted, args=FOUR_SERVERS)[0] == 1

    code, lines = pod_verdict(deployment, *others)
    assert code == 1 and failures(lines) == [
        "FAIL rollout: Deployment istio-ingressgateway: required anti-affinity per node, maxSurge 1, "
        "maxUnavailable 0; no Nodes given to judge it by: the surge pod needs a node the pods fit that has no "
        "gateway pod (give `kubectl get nodes -o json`, or use maxSurge 0, maxUnavailable 1)"], lines


def injector(lifecycle: dict, name: str = "istio-sidecar-injector") -> dict:
    """The ConfigMap istiod's injector reads (istio-discovery's templates/istiod-injector-configmap.yaml):
    `values` is JSON, global.proxy.lifecycle what the gateway template puts on istio-proxy."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "istio-system"},
            "data": {"values": json.dumps({"global": {"proxy": {"lifecycle": lifecycle}}}), "config": "policy: enabled"}}


MESH_PRESTOP = {"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 5"]}}}


def test_distroless_hook_under_a_mesh_wide_exec_prestop_fails(tmp_path):
    """global.proxy.lifecycle sets an exec preStop mesh-wide. The gateway
    injection template renders it on istio-proxy and the injector merges the
    pod's own container over it (strategic merge, kubectl's here): the
    distroless httpGet hook then carries both handlers, which the API server
    refuses. The curl (exec) hook replaces the mesh's command instead."""
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    distroless = {**values, "lifecycle": istio.load_one(istio.KUBERNETES / "gateway-values-distroless.yaml")["lifecycle"]}
    distroless["lifecycle"]["preStop"].pop("exec")  # null in the values file: Helm drops the key
    deployment = render_chart(distroless)[0]
    (proxy,) = deployment["spec"]["template"]["spec"]["containers"]
    template = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "injected"},
                "spec": {"containers": [{"name": "istio-proxy", "image": "proxyv2", "lifecycle": MESH_PRESTOP}]}}
    merged = istio.strategic_patch(template, yaml.safe_dump({"spec": {"containers": [
        {"name": "istio-proxy", "lifecycle": proxy["lifecycle"]}]}}), tmp_path)
    assert set(merged["spec"]["containers"][0]["lifecycle"]["preStop"]) == {"exec", "httpGet"}
    code, lines = pod_verdict(deployment, injector(MESH_PRESTOP))
    assert code == 1
    assert failures(lines) == [
        "FAIL mesh lifecycle: Deployment istio-ingressgateway: ConfigMap istio-sidecar-injector sets "
        "global.proxy.lifecycle.preStop (exec) and the pod's preStop is httpGet: the injector merges them into one "
        "hook with exec and httpGet and the API server refuses the pod (\"may not specify more than 1 handler "
        "type\"); remove the hook from the mesh's global.proxy.lifecycle, or inject the gateway from a revision "
        "without it"]
    code, lines = pod_verdict(render_chart(values)[0], injector(MESH_PRESTOP))
    assert code == 0 and "PASS mesh lifecycle: Deployment istio-ingressgateway: ConfigMap istio-sidecar-injector " \
                          "sets global.proxy.lifecycle.preStop (exec); the pod's exec replaces it" in lines
    # A revisioned gateway is injected by its revision's ConfigMap only.
    revisioned = copy.deepcopy(deployment)
    revisioned["spec"]["template"]["metadata"]["labels"]["istio.io/rev"] = "canary"
    assert pod_verdict(revisioned, injector(MESH_PRESTOP))[0] == 0
    assert pod_verdict(revisioned, injector(MESH_PRESTOP, "istio-sidecar-injector-canary"))[0] == 1


def test_standard_patch_on_the_sidecar_design_fails_naming_the_hc_container(tmp_path):
    """A strategic merge keeps every container it does not name: hc still holds :18180."""
    patched = istio.strategic_patch(sidecar_design("Deployment"),
                                    (istio.KUBERNETES / "gateway-deployment-patch.yaml").read_text(), tmp_path)
    code, lines = pod_verdict(patched)
    assert code == 1
    assert failures(lines) == [
        "FAIL health port: Deployment istio-ingressgateway: container hc (containerPort 18180, readinessProbe on "
        ":18180) also claims :18180: drain-gate's health listener cannot bind it, or the other container answers the "
        "LB and the kubelet instead of drain-gate (remove it: envoyfilter/kubernetes/migrate-from-sidecar-design.yaml)"]


def test_migration_that_keeps_the_old_prestop_fails_naming_drain_sh(tmp_path):
    patch = istio.load_one(MIGRATION)
    (proxy,) = [c for c in patch["spec"]["template"]["spec"]["containers"] if c["name"] == "istio-proxy"]
    del proxy["lifecycle"]
    code, lines = pod_verdict(istio.strategic_patch(sidecar_design("Deployment"), yaml.safe_dump(patch), tmp_path))
    assert code == 1
    assert failures(lines) == [
        "FAIL drain-gate preStop: Deployment istio-ingressgateway: istio-proxy's preStop is 'exec /bin/bash "
        "/etc/hc/drain.sh', not drain-gate's (curl POST :18180/drain?wait=closed, or httpGet /prestop): an old "
        "drain script (the sidecar design's drain.sh) still runs instead of drain-gate's drain"]


def test_service_and_pdb_selecting_keys_the_pods_lack_fail():
    """The label-key trap: the shipped Service (app/istio = istio-ingressgateway)
    in front of a gateway released under another name, and a PDB selecting a
    label the pods do not carry; two PDBs over the pods."""
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    deployment = render_chart(values)[0]
    renamed = copy.deepcopy(deployment)
    renamed["spec"]["template"]["metadata"]["labels"].update({"app": "gateway", "istio": "gateway"})
    service = istio.load_one(istio.KUBERNETES / "service.yaml")
    (pdb,) = k8s.template("--set", "wasm.configMap.create=false", "--show-only", "templates/poddisruptionbudget.yaml")
    assert pod_verdict(deployment, service, pdb)[0] == 0
    code, lines = pod_verdict(renamed, service, pdb)
    assert code == 1
    assert failures(lines) == [
        "FAIL service selector: Service istio-ingressgateway: selects app=istio-ingressgateway, istio=ingressgateway, "
        "which no pod given carries (Deployment istio-ingressgateway (app=gateway, drain-gate.io/enabled=true, "
        "istio=gateway, sidecar.istio.io/inject=true)): no endpoints, every LB check and request to its NodePorts "
        "fails"]
    other = copy.deepcopy(pdb)
    other["metadata"]["name"] = "istio-ingressgateway"
    other["spec"]["selector"]["matchLabels"] = {"app": "istio-ingressgateway"}
    stray = copy.deepcopy(pdb)
    stray["metadata"]["name"] = "stray"
    stray["spec"]["selector"]["matchLabels"] = {"drain-gate.io/gateway": "ingress"}
    code, lines = pod_verdict(deployment, pdb, other, stray)
    assert code == 1
    assert failures(lines) == [
        "FAIL pdb selector: PodDisruptionBudget stray: selects drain-gate.io/gateway=ingress, which no pod given "
        "carries (Deployment istio-ingressgateway (app=istio-ingressgateway, drain-gate.io/enabled=true, "
        "istio=ingressgateway, sidecar.istio.io/inject=true)): node drains evict every gateway pod at once",
        "FAIL pdb selector: Deployment istio-ingressgateway: 2 PodDisruptionBudgets cover its pods "
        "(PodDisruptionBudget drain-gate, PodDisruptionBudget istio-ingressgateway): the eviction API refuses a pod "
        "under two, every node drain stalls"]


def test_service_naming_a_port_the_pod_lost_fails():
    """The sidecar design's Service (targetPort: hc) in front of a migrated pod."""
    code, lines = pod_verdict(render_chart(istio.load_one(istio.KUBERNETES / "gateway-values.yaml"))[0],
                              sidecar_design("Service"))
    assert code == 1
    assert failures(lines) == [
        "FAIL service ports: Service istio-ingressgateway: no port reaches :18180 (the LB's check port); targetPort "
        "hc -> 'hc' names no container port of the pod"]


# -- the WasmPlugin form in real Envoy: what verify.py says of it ---------------------------------
def wasmplugin_form(tmp_path, tcp: dict | None = None, fetched: bool = True, base=None) -> list[dict]:
    """The WasmPlugin form (file://) on an HTTP and a TCP listener; `fetched`
    False: istio-agent's stand-in for the HTTP plugin."""
    wp, tcp = load("wasmplugin/traffic.yaml"), tcp or load("wasmplugin/tcp.yaml")
    plugins = [(wp, istio.wasmplugin_extension_config(wp, WASM) if fetched else istio.wasmplugin_fetch_failed(wp)),
               (tcp, istio.wasmplugin_extension_config(tcp, WASM))]
    listener, server_ports = passthrough()
    base = base or [istio.gateway_listener(8080), listener]
    return _wasmplugin_gateway(tmp_path, load("wasmplugin/health-listener.yaml"), base, plugins,
                               server_ports=server_ports)


def test_shipped_wasmplugin_form_with_tcp_passes(start_gateway, tmp_path):
    env = start_gateway(VERSION, wasmplugin_form(tmp_path))
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 0, lines
    assert "PASS tcp filter: listener 0.0.0.0_8443: drain-gate TCP filter before tcp_proxy" in lines
    assert "PASS vm_id: listener 0.0.0.0_8443: tcp vm_id '' = health" in lines


def test_a_module_istio_agent_could_not_fetch_fails_naming_the_rbac_stand_in(start_gateway, tmp_path):
    env = start_gateway(VERSION, wasmplugin_form(tmp_path, fetched=False), ready_path=None)
    wait_for(lambda: accepts(env.ports.health), 30, what="health listener serving")
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    name = istio.wasmplugin_resource_name(load("wasmplugin/traffic.yaml"))
    assert code == 1
    assert failures(lines) == [
        "FAIL traffic filter: listener 0.0.0.0_8080: 0 drain-gate traffic filters before the router (want 1)",
        f"FAIL wasmplugin module: listener 0.0.0.0_8080: ECDS filter {name} is an allow-all RBAC filter: istio-agent "
        "could not fetch the module or its sha256 did not match, and put this in its place (it counts nothing)"]


def test_network_wasmplugin_without_ports_fails_naming_the_http_chain(start_gateway, tmp_path):
    unmatched = copy.deepcopy(load("wasmplugin/tcp.yaml"))
    del unmatched["spec"]["match"]
    env = start_gateway(VERSION, wasmplugin_form(tmp_path, unmatched))
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == [
        "FAIL tcp filter placement: listener 0.0.0.0_8080: a drain-gate TCP filter before the HTTP connection "
        "manager: each keep-alive connection counts as in flight until it closes, so a drain waits for idle "
        "connections (a WasmPlugin of type NETWORK needs match.ports: the TCP and passthrough ports only)"]


def test_rotation_cluster_away_from_an_ipv6_admin_fails(start_gateway):
    """Envoy's admin on ::1 only (an IPv6-only pod): the shipped health listener
    passes through prometheus_stats; the cluster fixed at 127.0.0.1 fails, and
    so does a name no cluster has."""
    from tests.deploy.test_istio_envoy import FIXED_ADMIN_CLUSTER, patched
    health = load("health-listener.yaml")
    env = start_gateway(VERSION, envoyfilter_form(), clusters=[FIXED_ADMIN_CLUSTER], admin_address="::1")
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 0, lines
    assert f"PASS rotation cluster: cluster prometheus_stats dials [::1]:{env.ports.admin} = Envoy's admin" in lines
    for name, expected in (
            ("drain_gate_envoy_admin", "FAIL rotation cluster: cluster drain_gate_envoy_admin dials "
             "127.0.0.1:{port}, Envoy's admin listens on [::1]:{port}: the rotation of a drain fails "
             "(rotate_connections: prometheus_stats, the bootstrap's own cluster to the admin, follows its address "
             "and port)"),
            ("no_such_cluster", "FAIL rotation cluster: rotate_connections names cluster 'no_such_cluster', which "
             "Envoy does not have: a drain starts without rotating the keep-alive connections")):
        listeners = istio.gateway_xds([istio.gateway_listener(8080)], [
            load("traffic-filter.yaml"), patched(health, rotate_connections=name)])
        env = start_gateway(VERSION, listeners, clusters=[FIXED_ADMIN_CLUSTER], admin_address="::1")
        code, lines = verify("--config-dump", "-", stdin=dump_of(env))
        assert code == 1 and failures(lines) == [expected.format(port=env.ports.admin)], lines


@pytest.mark.parametrize("fetched", [True, False], ids=["canary-fetched", "canary-fetch-failed"])
def test_canary_pod_counts_twice_or_fails_naming_the_canary_stand_in(fetched, start_gateway, tmp_path, pulled_wasm):
    """The canary pod: the fleet's filter and the canary's count each stream
    (a warning, not a failure); if the canary's image was replaced by
    istio-agent's stand-in, verify.py names it, though the pod still counts."""
    from tests.deploy.test_istio_envoy import _canary_plugins, canary_pod
    env = start_gateway(VERSION, canary_pod(tmp_path, _canary_plugins(pulled_wasm, fetched)))
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    if fetched:
        assert code == 0, lines
        assert "WARN traffic filter: listener 0.0.0.0_8080: 2 drain-gate traffic filters count each one that many " \
               "times (a canary WasmPlugin beside the fleet's?)" in lines
    else:
        name = "extensions.istio.io/trafficextension/istio-system.drain-gate-traffic-canary~istio-translated-wasmplugin"
        assert code == 1 and failures(lines) == [
            f"FAIL wasmplugin module: listener 0.0.0.0_8080: ECDS filter {name} is an allow-all RBAC filter: "
            "istio-agent could not fetch the module or its sha256 did not match, and put this in its place (it "
            "counts nothing)"], lines


# -- the LB's fingerprint (prove.py --fingerprint --json) ---------------------------------------
FINGERPRINT = REPO / "tests" / "fixtures" / "fingerprint" / "haproxy.json"


def chart_health_listener(*sets: str) -> dict:
    """The drain-gate chart's health listener (its configuration) with `--set config.K=V`s."""
    args = [a for kv in sets for a in ("--set", f"config.{kv}")]
    (health,) = k8s.template("--set", "wasm.configMap.create=false", "--show-only", "templates/health-listener.yaml",
                             *args)
    return health


def test_the_fingerprint_names_each_setting_that_falls_short_and_by_how_much():
    """The fingerprint measured behind haproxy.cfg (inter 2s fall 2: lb_fall 2, lb_buffer 7s,
    drain_timeout 120s, serve, grace 145 s) against a chart and a gateway set below it."""
    stdin = "\n".join([deployment(terminationGracePeriodSeconds=140),
                       json.dumps(chart_health_listener("lb_fall=3", "lb_buffer=5s", "drain_timeout=100s",
                                                        "draining_new_requests=refuse"))])
    code, lines = verify("--pod-spec", "-", "--fingerprint", str(FINGERPRINT), stdin=stdin)
    assert code == 1
    got = [x for x in failures(lines) if x.startswith("FAIL fingerprint")]
    assert got[0].startswith("FAIL fingerprint lb_fall: 3; the LB takes a gateway out after 2 503s in a row (measured: ")
    assert got[0].endswith(": over by 1, set lb_fall 2"), got
    assert got[1].startswith("FAIL fingerprint lb_buffer: lb_buffer 5 s, 2 s short of the fingerprint's 7 s;"), got
    assert got[2] == "FAIL fingerprint drain_timeout: 100 s, 20 s short of the fingerprint's 120 s (the longest " \
                     "stream measured, and 30 s)", got
    assert got[3].startswith("FAIL fingerprint draining_new_requests: refuse, where the fingerprint advises serve: "
                             "this LB does not resend a refusal (the gateway refused "), got
    assert got[4] == ("FAIL fingerprint terminationGracePeriodSeconds: Deployment istio-ingressgateway: 140 s, 5 s "
                      "short of the fingerprint's 145 s (drain_timeout + lb_buffer + scrape_interval + 15 s, of the "
                      "advice)"), got
    assert len(got) == 5, got


def test_a_wider_refusal_than_the_fingerprint_measured_fails(tmp_path):
    """An advice of refuse with refused_requests idempotent: `all` refuses POSTs this LB was not seen
    to resend; a reset where a 503 was measured is not what was measured."""
    fp = tmp_path / "fingerprint.json"
    fp.write_text(json.dumps({"advice": {"lb_fall": 2, "lb_buffer_s": 8, "draining_new_requests": "refuse",
                                         "refused_requests": "idempotent", "refuse_with": "response",
                                         "drain_timeout_s": 120, "termination_grace_period_s": 145}}))
    stdin = "\n".join([deployment(), json.dumps(chart_health_listener(
        "draining_new_requests=refuse", "refused_requests=all", "refuse_with=reset"))])
    code, lines = verify("--pod-spec", "-", "--fingerprint", str(fp), stdin=stdin)
    assert code == 1
    assert failures(lines) == [
        "FAIL fingerprint refused_requests: all; the LB resends what the gateways refuse of idempotent (measured): "
        "all refuses requests this LB was not seen to resend",
        "FAIL fingerprint refuse_with: reset; measured with response"], lines


@pytest.mark.parametrize("content, cause", [
    ('{"lb": {}}', "not a fingerprint (prove.py --fingerprint --json) nor its advice"),
    ('{"advice": {"lb_buffer_s": "8s"}}', "advice.lb_buffer_s is '8s', not a int"),
    ("lb_fall: 2\n", "not JSON at character 0 (YAML?"),
    ('{"advice": {"refused_requests": "post"}}', "advice.refused_requests is 'post', not one of idempotent, "
                                                 "idempotent_or_key, all"),
])
def test_a_file_that_is_no_fingerprint_is_refused_with_the_cause(tmp_path, content, cause):
    fp = tmp_path / "fingerprint.json"
    fp.write_text(content)
    r = subprocess.run([sys.executable, str(VERIFY), "--pod-spec", "-", "--fingerprint", str(fp)],
                       input=deployment(), capture_output=True, text=True)
    assert r.returncode != 0 and cause in r.stderr, r.stderr


def test_a_fingerprint_needs_a_pod_spec():
    r = subprocess.run([sys.executable, str(VERIFY), "--config-dump", "-", "--fingerprint", str(FINGERPRINT)],
                       input="{}", capture_output=True, text=True)
    assert r.returncode == 2 and "--fingerprint checks a pod spec and its configuration: add --pod-spec" in r.stderr
