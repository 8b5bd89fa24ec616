"""envoyfilter/kubernetes/: the Helm values, the Deployment patches, the Service
and the generated ConfigMap are valid Kubernetes objects (kubernetes-validate's
bundled schemas, strict: unknown fields are errors), and say what the README says."""
from __future__ import annotations

import base64
import copy
import hashlib
import subprocess
import sys

import kubernetes_validate
import pytest

from tests.harness import istio
from tests.harness.envoy import REPO, WASM

PATCHES = ("gateway-deployment-patch.yaml", "gateway-deployment-patch-distroless.yaml")


def _validate(obj: dict) -> None:
    if errors := istio.k8s_errors(obj):
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']} invalid: {errors}")


def render_chart(values: dict) -> tuple[dict, dict]:
    """The Deployment and Service the istio/gateway chart renders from `values`
    for release istio-ingressgateway (templates/deployment.yaml and
    service.yaml: only the fields those templates take from values)."""
    labels = dict(istio.GATEWAY_LABELS)
    container = {
        "name": "istio-proxy",
        "image": "auto",
        "securityContext": {
            "capabilities": {"drop": ["ALL"]},
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsUser": 1337,
            "runAsGroup": 1337,
            "runAsNonRoot": True,
        },
        "env": [],
        "ports": [{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "2000m", "memory": "1024Mi"}},
    }
    for key in ("volumeMounts", "readinessProbe", "lifecycle"):
        if key in values:
            container[key] = copy.deepcopy(values[key])
    pod = {
        "serviceAccountName": "istio-ingressgateway",
        "securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
        "containers": [container],
        "terminationGracePeriodSeconds": values["terminationGracePeriodSeconds"],
    }
    for key in ("volumes", "nodeSelector", "affinity", "topologySpreadConstraints"):
        if key in values:
            pod[key] = copy.deepcopy(values[key])
    spec = {
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"annotations": copy.deepcopy(values.get("podAnnotations", {})),
                         "labels": {**labels, **values.get("labels", {}), "sidecar.istio.io/inject": "true"}},
            "spec": pod,
        },
    }
    if not values.get("autoscaling", {}).get("enabled", True):
        spec["replicas"] = values["replicaCount"]
    if "strategy" in values:
        spec["strategy"] = copy.deepcopy(values["strategy"])
    if values.get("minReadySeconds"):
        spec["minReadySeconds"] = values["minReadySeconds"]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "istio-ingressgateway", "namespace": "istio-system", "labels": labels},
                  "spec": spec}
    svc = values["service"]
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "istio-ingressgateway", "namespace": "istio-system", "labels": labels},
               "spec": {"type": svc["type"], "ports": copy.deepcopy(svc["ports"]), "selector": labels}}
    if svc.get("externalTrafficPolicy"):
        service["spec"]["externalTrafficPolicy"] = svc["externalTrafficPolicy"]
    return deployment, service


@pytest.fixture(scope="module")
def values():
    return istio.load_one(istio.KUBERNETES / "gateway-values.yaml")


def test_the_validator_is_strict(values):
    deployment, _ = render_chart(values)
    deployment["spec"]["template"]["spec"]["containers"][0]["lifecycle"] = {"preStopp": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, istio.K8S_VERSIONS[0], strict=True)


def test_chart_renders_valid_deployment_and_service(values):
    deployment, service = render_chart(values)
    _validate(deployment)
    _validate(service)


def test_chart_service_is_service_yaml(values):
    _, rendered = render_chart(values)
    written = istio.load_one(istio.KUBERNETES / "service.yaml")
    _validate(written)
    assert written["spec"] == rendered["spec"]


def test_service_maps_the_documented_node_ports(values):
    spec = istio.load_one(istio.KUBERNETES / "service.yaml")["spec"]
    assert spec["type"] == "NodePort"
    assert spec["externalTrafficPolicy"] == "Local"
    assert {p["nodePort"]: p["targetPort"] for p in spec["ports"]} == {
        30080: 8080, 30180: 18180, 31443: 8443, 32021: 15021}


@pytest.mark.parametrize("patch_file", PATCHES)
def test_patched_deployment_is_valid_and_complete(values, patch_file, tmp_path):
    """The patch through kubectl's own strategic merge onto a Deployment without
    drain-gate's values: everything the values give, the label the
    EnvoyFilters select and the module's mount included."""
    plain = {k: v for k, v in values.items() if k not in (
        "labels", "volumes", "volumeMounts", "lifecycle", "readinessProbe", "nodeSelector", "affinity", "strategy",
        "minReadySeconds")}
    deployment, _ = render_chart(plain)
    patched = istio.strategic_patch(deployment, (istio.KUBERNETES / patch_file).read_text(), tmp_path)
    _validate(patched)
    pod = patched["spec"]["template"]["spec"]
    (proxy,) = pod["containers"]
    assert {"containerPort": 18180, "name": "http-drain-gate", "protocol": "TCP"} in proxy["ports"]
    assert 15090 in [p["containerPort"] for p in proxy["ports"]], "the chart's port survives the merge"
    assert proxy["readinessProbe"] == values["readinessProbe"]
    assert "livenessProbe" not in proxy, "no kubelet liveness on :18180 by default"
    assert proxy["volumeMounts"] == values["volumeMounts"] and pod["volumes"] == values["volumes"]
    assert patched["spec"]["template"]["metadata"]["labels"].items() >= istio.DRAIN_GATE_LABEL.items()
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["terminationGracePeriodSeconds"] == values["terminationGracePeriodSeconds"]
    istio.assert_prestop_drains(proxy["lifecycle"]["preStop"], distroless="distroless" in patch_file)
    assert len(proxy["lifecycle"]["preStop"]) == 1, "one handler"


def test_distroless_patch_replaces_an_exec_hook(values, tmp_path):
    """A Deployment that has an exec preStop (the values' curl) patched with the
    distroless patch: `exec: null` deletes it, the hook is the httpGet alone."""
    deployment, _ = render_chart(values)
    patch = (istio.KUBERNETES / "gateway-deployment-patch-distroless.yaml").read_text()
    (proxy,) = istio.strategic_patch(deployment, patch, tmp_path)["spec"]["template"]["spec"]["containers"]
    assert set(proxy["lifecycle"]["preStop"]) == {"httpGet"}
    (proxy,) = istio.strategic_patch(deployment, patch.replace("exec: null", "exec: {}"), tmp_path)[
        "spec"]["template"]["spec"]["containers"]
    assert set(proxy["lifecycle"]["preStop"]) == {"exec", "httpGet"}, "the control: without it both stay"


def test_patches_are_the_values_for_gateways_without_the_chart(values):
    """The patches (for a gateway without the istio/gateway chart, said in their
    first line) carry the values' probe and preStop, and no liveness probe."""
    a, b = (istio.load_one(istio.KUBERNETES / f)["spec"]["template"]["spec"]["containers"][0] for f in PATCHES)
    assert a["readinessProbe"] == b["readinessProbe"] == values["readinessProbe"]
    assert "livenessProbe" not in a and "livenessProbe" not in b
    assert a["lifecycle"] == values["lifecycle"]
    assert a["ports"] == b["ports"]
    assert a["volumeMounts"] == b["volumeMounts"] == values["volumeMounts"]
    for f in PATCHES:
        spec = istio.load_one(istio.KUBERNETES / f)["spec"]
        assert (spec["replicas"], spec["minReadySeconds"], spec["strategy"]) == (
            values["replicaCount"], values["minReadySeconds"], values["strategy"]), f
        assert spec["template"]["spec"]["affinity"] == values["affinity"], f
        template = spec["template"]
        assert template["metadata"]["labels"] == values["labels"], f
        assert template["spec"]["volumes"] == values["volumes"], f
        assert template["spec"]["nodeSelector"] == values["nodeSelector"], f
    for f in PATCHES:
        first = (istio.KUBERNETES / f).read_text().splitlines()[0]
        assert "not installed with the istio/gateway chart" in first, f


def test_configmap_carries_the_wasm_under_1_mib(tmp_path, values):
    assert WASM.exists(), "run `make build`"
    wasm = WASM.read_bytes()  # one snapshot: a concurrent `cargo build` may rewrite WASM
    (tmp_path / "in.wasm").write_bytes(wasm)
    out = tmp_path / "cm.yaml"
    subprocess.run([sys.executable, str(istio.ENVOYFILTER / "tools" / "configmap.py"),
                    "--wasm", str(tmp_path / "in.wasm"), "--out", str(out)], check=True, capture_output=True)
    cm = istio.load_one(out)
    _validate(cm)
    assert len(wasm) < 1024 * 1024, f"{len(wasm)} bytes: too big for a ConfigMap"
    data = base64.b64decode(cm["binaryData"]["drain_gate.wasm"])
    assert data == wasm
    assert cm["metadata"]["annotations"]["drain-gate/wasm-sha256"] == hashlib.sha256(wasm).hexdigest()
    (volume,) = values["volumes"]
    (mount,) = values["volumeMounts"]
    assert cm["metadata"]["name"] == volume["configMap"]["name"]
    assert mount["subPath"] in cm["binaryData"]


def test_configmap_refuses_a_module_over_1_mib(tmp_path):
    big = tmp_path / "big.wasm"
    big.write_bytes(b"\0asm" + b"\0" * (1024 * 1024))
    r = subprocess.run([sys.executable, str(istio.ENVOYFILTER / "tools" / "configmap.py"),
                        "--wasm", str(big), "--out", str(tmp_path / "cm.yaml")], capture_output=True, text=True)
    assert r.returncode == 1 and "1 MiB" in r.stderr
    assert not (tmp_path / "cm.yaml").exists()


def test_make_configmap_target_uses_the_same_tool():
    text = (REPO / "Makefile").read_text()
    assert "envoyfilter/tools/configmap.py" in text and "envoyfilter/tools/oci_image.py" in text
