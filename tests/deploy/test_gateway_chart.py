"""envoyfilter/kubernetes/gateway-values.yaml rendered by the real istio/gateway
chart of Istio 1.30.3 (../shared/istio-gateway-chart) with `helm template`: the
istio-proxy container carries drain-gate's preStop, readiness on :18180 and
the wasm mount; the pods carry drain-gate's label and one-per-node placement
that cannot deadlock a rollout; the Service maps 18180; every object is a
valid Kubernetes object; and the drain-gate chart selects and feeds exactly
these pods."""
from __future__ import annotations

import kubernetes_validate
import pytest

from tests.harness import istio, k8s

if not k8s.GATEWAY_CHART.is_dir():
    pytest.skip(f"the istio/gateway chart is not at {k8s.GATEWAY_CHART} (../shared is absent): "
                "rendering it is skipped", allow_module_level=True)

VALUES = istio.KUBERNETES / "gateway-values.yaml"
DISTROLESS = istio.KUBERNETES / "gateway-values-distroless.yaml"
RELEASE = "istio-ingressgateway"


def render(*args: str) -> dict:
    return k8s.by_kind(k8s.template("-f", str(VALUES), *args, chart=k8s.GATEWAY_CHART, release=RELEASE))


def validate(obj: dict) -> None:
    if errors := istio.k8s_errors(k8s.without_nulls(obj), ("1.28.0", kubernetes_validate.utils.latest_version())):
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']} invalid: {errors}")


@pytest.fixture(scope="module")
def rendered() -> dict:
    return render()


def proxy_of(deployment: dict) -> dict:
    (proxy,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "istio-proxy"]
    return proxy


def test_the_chart_is_istio_1_30_3():
    chart = istio.load_one(k8s.GATEWAY_CHART / "Chart.yaml")
    assert chart["name"] == "gateway"
    assert "1.30.3" in (k8s.GATEWAY_CHART / "SOURCE.md").read_text()


def test_every_rendered_object_is_valid(rendered):
    assert {kind for kind, _ in rendered} >= {"Deployment", "Service", "ServiceAccount"}
    for obj in rendered.values():
        validate(obj)


def test_istio_proxy_carries_prestop_readiness_and_the_wasm_mount(rendered):
    deployment = rendered[("Deployment", RELEASE)]
    proxy = proxy_of(deployment)
    command = proxy["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "curl" and command[-1] == "http://127.0.0.1:18180/drain?wait=closed"
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/health", "port": istio.HEALTH_PORT}
    assert "livenessProbe" not in proxy
    (mount,) = proxy["volumeMounts"]
    assert mount["mountPath"] == "/etc/drain-gate/drain_gate.wasm" and mount["subPath"] == "drain_gate.wasm"
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"] and volume["configMap"]["name"] == "drain-gate-wasm"
    assert pod["terminationGracePeriodSeconds"] == 150


def test_pods_carry_the_label_and_one_per_node_placement(rendered):
    deployment = rendered[("Deployment", RELEASE)]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert istio.POD_LABELS.items() <= labels.items()
    # Only on the LB's nodes: a replacement pod cannot land elsewhere.
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"drain-gate.io/lb-node": "true"}
    (term,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    # Hard anti-affinity + replicas = nodes: a surge pod would find no node.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # The LB (HAProxy inter 2s rise 2: <= 2 s + 2 x 2 s) sees the new pod UP
    # before the next one is taken out.
    assert deployment["spec"]["minReadySeconds"] >= 2 + 2 * 2
    assert ("PodDisruptionBudget", RELEASE) not in rendered, "the drain-gate chart's PDB is the only one"


def test_service_maps_18180_on_local_node_ports(rendered):
    service = rendered[("Service", RELEASE)]
    assert service["spec"]["externalTrafficPolicy"] == "Local"
    ports = {p["targetPort"]: p["nodePort"] for p in service["spec"]["ports"]}
    assert ports[istio.HEALTH_PORT] == 30180
    written = istio.load_one(istio.KUBERNETES / "service.yaml")
    assert sorted(service["spec"]["ports"], key=lambda p: p["port"]) == \
        sorted(written["spec"]["ports"], key=lambda p: p["port"])
    assert service["spec"]["selector"] == written["spec"]["selector"]


def test_distroless_values_replace_the_exec_hook():
    token = "a3f1c2d4e5b60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8"
    objs = render("-f", str(DISTROLESS), "--set-string", f"lifecycle.preStop.httpGet.httpHeaders[0].value=Bearer {token}")
    deployment = objs[("Deployment", RELEASE)]
    validate(deployment)
    hook = k8s.without_nulls(proxy_of(deployment)["lifecycle"]["preStop"])
    assert set(hook) == {"httpGet"}
    assert hook["httpGet"]["path"] == "/prestop" and hook["httpGet"]["port"] == istio.HEALTH_PORT
    assert hook["httpGet"]["httpHeaders"] == [{"name": "Authorization", "value": f"Bearer {token}"}]


def test_the_drain_gate_chart_selects_and_feeds_these_pods(rendered, tmp_path):
    deployment = rendered[("Deployment", RELEASE)]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    b64 = k8s.wasm_base64_file(b"\0asm\x01\0\0\0", tmp_path)
    objs = k8s.by_kind(k8s.template("--set-file", f"wasm.base64={b64}"))
    for (kind, _), obj in objs.items():
        if kind == "ConfigMap":
            continue
        selector = (obj["spec"].get("workloadSelector", {}).get("labels")
                    or obj["spec"].get("selector", {}).get("matchLabels") or {})
        assert selector and selector.items() <= labels.items(), kind
    cm = objs[("ConfigMap", "drain-gate-wasm")]
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = pod["volumes"]
    (mount,) = proxy_of(deployment)["volumeMounts"]
    assert volume["configMap"]["name"] == cm["metadata"]["name"] and mount["subPath"] in cm["binaryData"]
    chart_values = istio.load_one(k8s.CHART / "values.yaml")
    assert mount["mountPath"] == chart_values["wasm"]["path"]
    # Another gateway in the namespace without the values is not selected.
    assert not istio.DRAIN_GATE_LABEL.items() <= istio.GATEWAY_LABELS.items()


def test_the_chart_has_no_way_to_set_a_startup_probe(rendered):
    """envoyfilter/docs/counting.md, Readiness: on the chart route a startupProbe has no
    way in. The chart's schema refuses the key, and nothing renders one."""
    r = k8s.template("-f", str(VALUES), "--set", "startupProbe.httpGet.port=15021", chart=k8s.GATEWAY_CHART,
                     release=RELEASE, check=False)
    assert r.returncode != 0 and "additional properties 'startupProbe' not allowed" in r.stderr, r.stderr
    assert "startupProbe" not in proxy_of(rendered[("Deployment", RELEASE)])
