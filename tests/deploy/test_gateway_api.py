"""envoyfilter/gateway-api/: drain-gate on a gateway that istiod deploys from a
Kubernetes Gateway API Gateway, checked offline with the real tools.

- The Gateway validates against the v1.5.1 `gateways` CRD (a copy in
  tests/fixtures/gateway-api/): its schema, strict like the API server, and
  its CEL rules (cel-python); the Istio objects against the Istio CRDs, CEL
  rules included.
- The ConfigMap's patches go through `kubectl patch --local --type strategic`
  (the strategic merge istiod applies) onto the Deployment, Service and
  PodDisruptionBudget that Istio 1.30.3's kube-gateway template renders for
  that Gateway (a fixture, checked against the template), and the results
  validate against the Kubernetes schemas and carry what drain-gate needs.
- The EnvoyFilters and the WasmPlugin reach exactly the patched pods.
The same patches run in real Envoy in tests/deploy/test_istio_envoy.py (Gateway API
section); the commands of envoyfilter/docs/forms.md's Gateway API section run in
tests/deploy/test_gateway_api_docs.py.
"""
from __future__ import annotations

import copy
import re

import pytest
import yaml

from tests.harness import istio

FIXTURES = istio.GATEWAY_API_FIXTURES
CRD = FIXTURES / "gateways.crd.yaml"
TEMPLATE = FIXTURES / "kube-gateway.yaml"
OPTIONS = ("options.yaml", "options-distroless.yaml")
OVERLAY_KEYS = istio.OVERLAY_KEYS
WASM_MOUNT = "/etc/drain-gate/drain_gate.wasm"
DEDICATED_LABEL = {"drain-gate.io/enabled": "true"}


def load(rel: str) -> dict:
    return istio.load_one(istio.GATEWAY_API / rel)


rendered = istio.gateway_api_rendered
patched = istio.gateway_api_patched
proxy_container = istio.proxy_container
k8s_errors = istio.k8s_errors


@pytest.fixture(scope="module")
def gateway_crd():
    return istio.crd_validators([CRD])


@pytest.fixture(scope="module")
def gateway_cel():
    return istio.crd_schemas([CRD])


# -- the Gateway -----------------------------------------------------------------------
def test_the_crd_copy_is_the_v1_5_1_gateways_crd():
    first = CRD.read_text().splitlines()[0]
    assert first.startswith("# source:") and "v1.5.1" in first and "Apache-2.0" in first
    assert (FIXTURES / "LICENSE").read_text().lstrip().startswith("Apache License")
    crd = istio.load_one(CRD)
    assert crd["metadata"]["name"] == "gateways.gateway.networking.k8s.io"
    assert crd["metadata"]["annotations"]["gateway.networking.k8s.io/bundle-version"] == "v1.5.1"


def test_the_crd_copy_matches_the_shared_bundle():
    bundle = istio.SHARED / "istio-gateway-api" / "gateway-api-crds-v1.5.1-experimental.yaml"
    if not bundle.exists():
        pytest.skip(f"{bundle} not present (no ../shared beside the repository): the copy is checked by the test above")
    # Every line but the source line, verbatim, one whole document of the bundle.
    copy_text = CRD.read_text().split("\n", 1)[1]
    assert f"---\n{copy_text}---\n" in bundle.read_text()


def test_gateway_is_valid_against_the_crd(gateway_crd, gateway_cel):
    assert set(gateway_crd) == {("gateway.networking.k8s.io/v1", "Gateway"),
                                ("gateway.networking.k8s.io/v1beta1", "Gateway")}
    assert istio.crd_errors(load("gateway.yaml"), gateway_crd) == []
    assert istio.cel_errors(load("gateway.yaml"), gateway_cel) == []


@pytest.mark.parametrize("mutate, expected", [
    (lambda s: s["listeners"].append(copy.deepcopy(s["listeners"][0])), "Listener name must be unique"),
    (lambda s: s["listeners"][0].__setitem__("tls", {"mode": "Terminate"}), "tls must not be specified"),
    (lambda s: s["infrastructure"].__setitem__("labels", {"drain gate": "x"}), "Label keys must be"),
])
def test_the_cel_check_catches_mistakes(gateway_cel, mutate, expected):
    gw = copy.deepcopy(load("gateway.yaml"))
    mutate(gw["spec"])
    errors = istio.cel_errors(gw, gateway_cel)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize("mutate, expected", [
    (lambda s: s["infrastructure"]["parametersRef"].__setitem__("kindd", "ConfigMap"), "kindd"),
    (lambda s: s["infrastructure"]["parametersRef"].pop("group"), "group"),
    (lambda s: s["listeners"][0].__setitem__("port", 0), "port"),
    (lambda s: s["listeners"][0].__setitem__("protocol", "HTTP/1.1"), "protocol"),
    (lambda s: s.pop("gatewayClassName"), "gatewayClassName"),
])
def test_the_crd_check_catches_mistakes(gateway_crd, mutate, expected):
    gw = copy.deepcopy(load("gateway.yaml"))
    mutate(gw["spec"])
    errors = istio.crd_errors(gw, gateway_crd)
    assert errors and any(expected in e for e in errors), errors


def test_gateway_is_class_istio_with_parameters_in_its_namespace():
    gw = load("gateway.yaml")
    assert gw["spec"]["gatewayClassName"] == "istio"
    ref = gw["spec"]["infrastructure"]["parametersRef"]
    # istiod takes only a core ConfigMap, always from the Gateway's namespace.
    assert (ref["group"], ref["kind"]) == ("", "ConfigMap")
    for name in OPTIONS:
        options = load(name)
        assert options["kind"] == "ConfigMap" and options["metadata"]["name"] == ref["name"], name
        assert options["metadata"]["namespace"] == gw["metadata"]["namespace"], name
        assert set(options["data"]) <= set(OVERLAY_KEYS), name
        assert set(options["data"]) == {"deployment", "service", "podDisruptionBudget"}, name
        assert k8s_errors(options) == [], name


def test_the_two_options_differ_only_in_the_prestop_hook():
    a, b = (yaml.safe_load(load(n)["data"]["deployment"]) for n in OPTIONS)
    hooks = [proxy_container(d)["lifecycle"].pop("preStop") for d in (a, b)]
    assert a == b
    assert "exec" in hooks[0] and "httpGet" in hooks[1]
    assert load(OPTIONS[0])["data"]["service"] == load(OPTIONS[1])["data"]["service"]
    assert load(OPTIONS[0])["data"]["podDisruptionBudget"] == load(OPTIONS[1])["data"]["podDisruptionBudget"]


# -- the rendering istiod starts from ----------------------------------------------------------
def test_rendering_follows_the_template():
    """The fixture has the template's container ports, probes, volumes and
    labels, and the names and Service ports istiod derives from the Gateway."""
    assert "istio-proxy" in TEMPLATE.read_text() and TEMPLATE.read_text().splitlines()[0].startswith("# source:")
    assert "1.30.3" in TEMPLATE.read_text().splitlines()[0]
    assert (FIXTURES / "rendered.yaml").read_text().splitlines()[0].startswith("# Derived by hand from ./kube-gateway.yaml")
    text = TEMPLATE.read_text()
    gw = load("gateway.yaml")
    name = f"{gw['metadata']['name']}-{gw['spec']['gatewayClassName']}"
    objects = rendered()
    assert set(objects) == {"Deployment", "Service", "PodDisruptionBudget"}
    for obj in objects.values():
        assert (obj["metadata"]["name"], obj["metadata"]["namespace"]) == (name, gw["metadata"]["namespace"])
        assert obj["metadata"]["ownerReferences"][0]["name"] == gw["metadata"]["name"]
        assert obj["metadata"]["labels"]["gateway.networking.k8s.io/gateway-name"] == gw["metadata"]["name"]
        assert k8s_errors(obj) == [], obj["kind"]
    deployment = objects["Deployment"]
    proxy = proxy_container(deployment)
    assert sorted(p["containerPort"] for p in proxy["ports"]) == sorted(map(int, re.findall(r"containerPort: (\d+)", text)))
    assert proxy["readinessProbe"]["httpGet"]["port"] == 15021 and proxy["startupProbe"]["httpGet"]["port"] == 15021
    template_volumes = set(re.findall(r"^      - (?:emptyDir: .*\n        )?name: ([\w-]+)", text, re.M))
    template_volumes |= set(re.findall(r"^        name: ([\w-]+)\n      - ", text, re.M))
    volumes = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes == {"workload-socket", "credential-socket", "workload-certs", "istio-envoy", "istio-data",
                       "istio-podinfo", "istio-token", "istiod-ca-cert"}
    assert {"istio-podinfo", "istio-token", "istiod-ca-cert"} <= template_volumes
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for label in ("sidecar.istio.io/inject", "service.istio.io/canonical-name", "gateway.istio.io/managed",
                  "gateway.networking.k8s.io/gateway-class-name"):
        assert f'"{label}"' in text and label in pod_labels, label
    assert deployment["spec"]["selector"]["matchLabels"] == {"gateway.networking.k8s.io/gateway-name": gw["metadata"]["name"]}
    # extractServicePorts: status-port first, then one port per distinct listener port.
    service = objects["Service"]
    assert [(p["name"], p["port"], p["appProtocol"]) for p in service["spec"]["ports"]] == [
        ("status-port", 15021, "tcp"),
        *[(l["name"], l["port"], l["protocol"].lower()) for l in gw["spec"]["listeners"]],
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert objects["PodDisruptionBudget"]["spec"]["selector"] == deployment["spec"]["selector"]


# -- the patched objects -----------------------------------------------------------------
@pytest.mark.parametrize("options", OPTIONS)
def test_patched_deployment_is_valid_and_carries_drain_gate(options, tmp_path):
    before = rendered()["Deployment"]
    after = patched(options, "Deployment", tmp_path)
    assert k8s_errors(after) == []
    # istiod refuses a patch that changes these (applyOverlay: "illegal metadata change").
    for key in ("name", "namespace", "ownerReferences"):
        assert after["metadata"][key] == before["metadata"][key], key
    assert after["spec"]["selector"] == before["spec"]["selector"], "a Deployment's selector is immutable"
    pod = after["spec"]["template"]["spec"]
    proxy = proxy_container(after)
    assert {"containerPort": 18180, "name": "http-drain-gate", "protocol": "TCP"} in proxy["ports"]
    assert {p["containerPort"] for p in proxy_container(before)["ports"]} < {p["containerPort"] for p in proxy["ports"]}
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/health" and proxy["readinessProbe"]["httpGet"]["port"] == 18180
    assert "livenessProbe" not in proxy, "a missing health listener must not restart every pod"
    assert proxy["startupProbe"] == proxy_container(before)["startupProbe"], "Envoy's own startup check stays"
    (mount,) = [m for m in proxy["volumeMounts"] if m["mountPath"] == WASM_MOUNT]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "drain-gate-wasm" and mount["subPath"] == "drain_gate.wasm"
    assert len(proxy["volumeMounts"]) == len(proxy_container(before)["volumeMounts"]) + 1, "the template's mounts stay"
    istio.assert_prestop_drains(proxy["lifecycle"]["preStop"], distroless="distroless" in options)
    template = after["spec"]["template"]["metadata"]
    assert template["labels"].items() >= DEDICATED_LABEL.items()
    assert template["labels"].items() >= before["spec"]["template"]["metadata"]["labels"].items()
    assert re.search(r"terminationDrainDuration:\s*\d+s", template["annotations"]["proxy.istio.io/config"])
    assert pod["terminationGracePeriodSeconds"] == 150


@pytest.mark.parametrize("options", OPTIONS)
def test_patched_deployment_keeps_one_pod_per_node_without_a_rollout_deadlock(options, tmp_path):
    after = patched(options, "Deployment", tmp_path)
    spec = after["spec"]
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # The next old pod goes once the LB (HAProxy inter 2s rise 2) has seen the new one UP.
    assert spec["minReadySeconds"] >= 2 * 2
    pod = spec["template"]["spec"]
    # No required anti-affinity: with maxUnavailable 0 and replicas = nodes it
    # leaves the surge pod Pending for ever.
    assert "podAntiAffinity" not in (pod.get("affinity") or {})
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "DoNotSchedule" and spread["nodeTaintsPolicy"] == "Honor"
    # Counted per ReplicaSet: the new pods spread among themselves, whatever old pods remain.
    assert spread["matchLabelKeys"] == ["pod-template-hash"]
    assert spread["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("options", OPTIONS)
def test_patched_service_is_nodeport_local_with_the_check_port(options, tmp_path):
    before = rendered()["Service"]
    after = patched(options, "Service", tmp_path)
    assert k8s_errors(after) == []
    for key in ("name", "namespace", "ownerReferences"):
        assert after["metadata"][key] == before["metadata"][key], key
    spec = after["spec"]
    assert spec["type"] == "NodePort" and spec["externalTrafficPolicy"] == "Local"
    ports = {p["port"]: p for p in spec["ports"]}
    assert set(ports) == {15021, 80, 18180}, "the template's ports stay, 18180 is added"
    assert (ports[18180]["targetPort"], ports[18180]["nodePort"]) == (18180, 30180)
    assert ports[80]["nodePort"] == 30080 and ports[80]["name"] == "http"
    # The same node ports as the chart form's Service (the LB configurations use them).
    chart = {p["targetPort"]: p["nodePort"] for p in istio.load_one(istio.KUBERNETES / "service.yaml")["spec"]["ports"]}
    assert chart[18180] == ports[18180]["nodePort"] and chart[8080] == ports[80]["nodePort"]
    assert spec["selector"] == before["spec"]["selector"]


@pytest.mark.parametrize("options", OPTIONS)
def test_patched_pdb_evicts_one_pod_at_a_time(options, tmp_path):
    before = rendered()["PodDisruptionBudget"]
    after = patched(options, "PodDisruptionBudget", tmp_path)
    assert k8s_errors(after) == []
    assert after["spec"]["maxUnavailable"] == 1 and after["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert after["spec"]["selector"] == before["spec"]["selector"]


def test_the_kubernetes_check_catches_a_bad_patch(tmp_path):
    bad = load("options.yaml")["data"]["deployment"].replace("maxUnavailable: 0", "maxUnavailable: [0]")
    after = istio.strategic_patch(rendered()["Deployment"], bad, tmp_path)
    assert any("maxUnavailable" in e for e in k8s_errors(after))
    # kubectl merges without type checks (so does istiod): the schema check is what refuses this.
    after = istio.strategic_patch(rendered()["Deployment"], "spec: {replicas: three}", tmp_path)
    assert any("replicas" in e for e in k8s_errors(after))
    with pytest.raises(RuntimeError, match="kubectl patch"):
        istio.strategic_patch(rendered()["Deployment"], "spec: {replicas: [", tmp_path)


# -- the Istio objects -------------------------------------------------------------------------
def gateway_api_policies() -> dict[str, dict]:
    found = {**istio.objects("EnvoyFilter"), **istio.objects("WasmPlugin")}
    return {p.relative_to(istio.GATEWAY_API).as_posix(): o for p, o in found.items() if istio.GATEWAY_API in p.parents}


def test_istio_objects_are_schema_valid_and_in_the_gateway_namespace():
    validators = istio.crd_validators()
    cel = istio.crd_schemas()
    policies = gateway_api_policies()
    assert set(policies) == {"health-listener.yaml", "traffic-filter.yaml", "tcp-filter.yaml",
                             "wasmplugin/health-listener.yaml", "wasmplugin/traffic.yaml", "wasmplugin/tcp.yaml"}
    namespace = load("gateway.yaml")["metadata"]["namespace"]
    for rel, obj in policies.items():
        assert istio.crd_errors(obj, validators) == [], rel
        assert istio.cel_errors(obj, cel) == [], rel
        assert obj["metadata"]["namespace"] == namespace, rel
    # The control: the CRDs' rule that allows one kind of selector at most.
    both = copy.deepcopy(policies["wasmplugin/traffic.yaml"])
    both["spec"]["targetRefs"] = [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "ingress"}]
    assert any("only one of targetRefs or selector" in e for e in istio.cel_errors(both, cel))


def test_istio_objects_reach_exactly_the_patched_pods(tmp_path):
    """Pods rendered without the ConfigMap (no wasm mount) get no EnvoyFilter
    or WasmPlugin, whose file they lack; patched pods get them all."""
    gw = load("gateway.yaml")
    namespace = gw["metadata"]["namespace"]
    plain = rendered()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for options in OPTIONS:
        pod = patched(options, "Deployment", tmp_path)["spec"]["template"]["metadata"]["labels"]
        for rel, obj in gateway_api_policies().items():
            assert istio.selects_workload(obj, namespace, pod), (options, rel)
            assert not istio.selects_workload(obj, namespace, plain), rel
    other = {**plain, **DEDICATED_LABEL, "gateway.networking.k8s.io/gateway-name": "other"}
    for rel, obj in gateway_api_policies().items():
        assert not istio.selects_workload(obj, namespace, other), f"{rel} reaches another Gateway's pods"
        assert not istio.selects_workload(obj, "istio-system", {**plain, **DEDICATED_LABEL}), rel
    for rel in ("wasmplugin/traffic.yaml", "wasmplugin/tcp.yaml"):
        assert load(rel)["spec"]["selector"]["matchLabels"]["gateway.networking.k8s.io/gateway-name"] == \
            gw["metadata"]["name"], rel


@pytest.mark.parametrize("rel", ["health-listener.yaml", "traffic-filter.yaml", "tcp-filter.yaml",
                                 "wasmplugin/health-listener.yaml", "wasmplugin/traffic.yaml", "wasmplugin/tcp.yaml"])
def test_istio_objects_are_the_istio_folder_ones_but_for_namespace_and_selector(rel):
    ours = copy.deepcopy(load(rel))
    theirs = copy.deepcopy(istio.load_one(istio.ISTIO / rel))
    for obj in (ours, theirs):
        obj["metadata"].pop("namespace")
        for key in ("workloadSelector", "selector", "targetRefs"):
            obj["spec"].pop(key, None)
    assert ours == theirs


def test_envoyfilters_load_the_file_the_options_mount():
    (mount,) = [m for m in proxy_container(yaml.safe_load(load("options.yaml")["data"]["deployment"]))["volumeMounts"]]
    for rel in ("health-listener.yaml", "wasmplugin/health-listener.yaml", "traffic-filter.yaml", "tcp-filter.yaml"):
        plugin = istio.plugin_config(load(rel))
        assert plugin["vm_config"]["code"]["local"]["filename"] == mount["mountPath"] == WASM_MOUNT, rel
    for rel in ("wasmplugin/traffic.yaml", "wasmplugin/tcp.yaml"):
        assert load(rel)["spec"]["url"] == "file://" + mount["mountPath"], rel


# -- one pod per node through a rollout ---------------------------------------------------
# A model of what decides a rollout here (no scheduler runs on this machine):
# the Deployment controller's RollingUpdate (maxSurge / maxUnavailable, the
# scale-down that prefers an old pod sharing its node), and the scheduler's
# filters for a nodeSelector, a required pod anti-affinity and a DoNotSchedule
# topology spread (matchLabelKeys, nodeTaintsPolicy, and nodeAffinityPolicy's
# default Honor: only nodes the nodeSelector admits are domains). Pods are
# ready once placed. The LB's nodes ("worker<i>") carry drain-gate.io/lb-node;
# "master<i>" carry it too but are tainted (an LB node cordoned for maintenance);
# "outside<i>" are schedulable nodes the LB does not send to.
LB_NODE_LABELS = {"drain-gate.io/lb-node": "true"}


def _admits(pod_spec: dict, node: str) -> bool:
    labels = LB_NODE_LABELS if node.startswith(("worker", "master")) else {}
    return all(labels.get(k) == v for k, v in (pod_spec.get("nodeSelector") or {}).items())


def _feasible(pod_spec: dict, pods: list[tuple[str, str]], node: str, tainted: set[str], rs: str,
              nodes: list[str]) -> bool:
    if node in tainted or not _admits(pod_spec, node):
        return False
    anti = (pod_spec.get("affinity") or {}).get("podAntiAffinity", {})
    if anti.get("requiredDuringSchedulingIgnoredDuringExecution") and any(n == node for n, _ in pods):
        return False
    for c in pod_spec.get("topologySpreadConstraints", []):
        assert c["topologyKey"] == "kubernetes.io/hostname" and c["whenUnsatisfiable"] == "DoNotSchedule"
        same = [n for n, r in pods if r == rs or "pod-template-hash" not in c.get("matchLabelKeys", [])]
        domains = [n for n in nodes if (c.get("nodeTaintsPolicy", "Ignore") == "Ignore" or n not in tainted)
                   and _admits(pod_spec, n)]
        if same.count(node) + 1 - min(same.count(n) for n in domains) > c["maxSkew"]:
            return False
    return True


def _rollout(deployment: dict, workers: int, tainted_nodes: int = 1, outside: int = 0) -> tuple[bool, list[str]]:
    """(finished, nodes of the new pods) for a rollout that starts from one
    old pod per worker."""
    spec = deployment["spec"]
    replicas, strategy = spec["replicas"], spec["strategy"]["rollingUpdate"]
    pod_spec = spec["template"]["spec"]
    tainted = {f"master{i}" for i in range(tainted_nodes)}
    nodes = [f"worker{i}" for i in range(workers)] + [f"outside{i}" for i in range(outside)] + sorted(tainted)
    pods = [(f"worker{i}", "old") for i in range(min(replicas, workers))]
    for _ in range(4 * replicas + 4):
        old = [p for p in pods if p[1] == "old"]
        if not old and len(pods) == replicas:
            return True, [n for n, _ in pods]
        placed = False
        if len(pods) < replicas + strategy["maxSurge"] and len(pods) - len(old) < replicas:
            fits = [n for n in nodes if _feasible(pod_spec, pods, n, tainted, "new", nodes)]
            if fits:
                pods.append((min(fits, key=lambda n: ([p[0] for p in pods].count(n), n)), "new"))
                placed = True
        removable = len(pods) - (replicas - strategy["maxUnavailable"])
        if old and removable > 0:
            pods.remove(max(old, key=lambda p: [q[0] for q in pods].count(p[0])))
        elif not placed:
            return False, [n for n, r in pods if r == "new"]
    return False, []


def test_rollout_stays_on_the_lb_nodes(tmp_path):
    """A cluster with a node the LB does not send to: the patch's nodeSelector
    keeps every new pod on the LB's nodes; without it the surge pod takes the
    empty outside node and an LB node ends with no pod (its NodePort traffic dropped)."""
    deployment = patched("options.yaml", "Deployment", tmp_path)
    workers = deployment["spec"]["replicas"]
    finished, placed = _rollout(deployment, workers, outside=1)
    assert finished and sorted(placed) == [f"worker{i}" for i in range(workers)], placed
    unpinned = copy.deepcopy(deployment)
    del unpinned["spec"]["template"]["spec"]["nodeSelector"]
    finished, placed = _rollout(unpinned, workers, outside=1)
    assert finished and "outside0" in placed and len({n for n in placed if n.startswith("worker")}) < workers, placed


def test_rollout_keeps_one_pod_per_node_and_cannot_deadlock(tmp_path):
    deployment = patched("options.yaml", "Deployment", tmp_path)
    workers = deployment["spec"]["replicas"]
    finished, placed = _rollout(deployment, workers)
    assert finished and sorted(placed) == [f"worker{i}" for i in range(workers)], placed
    # A required pod anti-affinity instead: the surge pod never fits.
    anti_affinity = copy.deepcopy(deployment)
    pod = anti_affinity["spec"]["template"]["spec"]
    pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": pod.pop("topologySpreadConstraints")[0]["labelSelector"]}]}}
    assert _rollout(anti_affinity, workers) == (False, [])
    # More replicas than schedulable nodes, a tainted node beside them: Honor
    # finishes; the default (Ignore) counts the empty tainted node and stalls.
    more = copy.deepcopy(deployment)
    more["spec"]["replicas"] = workers + 1
    assert _rollout(more, workers)[0] is True
    more["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["nodeTaintsPolicy"] = "Ignore"
    assert _rollout(more, workers)[0] is False
