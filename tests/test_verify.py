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

from tests.harness import istio
from tests.test_istio_envoy import _wasmplugin_listeners, load, pulled_wasm, start_gateway  # noqa: F401
from tests.test_istio_kubernetes import render_chart

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


def envoyfilter_form(traffic: dict | None = None) -> list[dict]:
    return istio.apply_envoyfilters(
        [istio.gateway_listener(8080), istio.gateway_listener(8443), istio.gateway_listener(15443, tcp=True)],
        [traffic or load("traffic-filter.yaml"), load("health-listener.yaml")])


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
    assert "PASS health failure_policy: listener drain-gate-health: FAIL_CLOSED (want FAIL_CLOSED)" in lines
    (tmp_path / "pod.json").write_text(deployment())
    code, lines = verify("--config-dump", "-", "--pod-spec", str(tmp_path / "pod.json"), stdin=dump_of(env))
    assert code == 0, lines
    assert lines[-1] == "OK: 0 check(s) failed"


def test_shipped_wasmplugin_form_passes(start_gateway, tmp_path, pulled_wasm):  # noqa: F811
    env = start_gateway(VERSION, _wasmplugin_listeners(tmp_path, load("wasmplugin/health-listener.yaml"),
                                                       pulled_wasm))
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


def test_vm_id_mismatch_fails_naming_the_listener(start_gateway, tmp_path, pulled_wasm):  # noqa: F811
    """The WasmPlugin (vm_id "") beside the EnvoyFilter-form health listener. The health
    role never sees a traffic role in its vm_id, so it never answers ready: wait for
    Envoy's admin only."""
    env = start_gateway(VERSION, _wasmplugin_listeners(tmp_path, load("health-listener.yaml"), pulled_wasm),
                        ready_path=None)
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == ["FAIL vm_id: listener 0.0.0.0_8080: traffic vm_id '' != health vm_id 'drain-gate'"]


def test_short_grace_period_fails_with_the_arithmetic(start_gateway, tmp_path):
    """The timings come from the health filter Envoy runs (drain_timeout 300s here)."""
    health = load("health-listener.yaml")
    hcm = health["spec"]["configPatches"][0]["patch"]["value"]["filter_chains"][0]["filters"][0]["typed_config"]
    plugin = hcm["http_filters"][0]["typed_config"]["config"]
    plugin["configuration"]["value"] = json.dumps({**json.loads(plugin["configuration"]["value"]),
                                                   "drain_timeout": "300s"})
    env = start_gateway(VERSION, istio.apply_envoyfilters([istio.gateway_listener(8080)],
                                                          [load("traffic-filter.yaml"), health]))
    (tmp_path / "pod.json").write_text(deployment())
    code, lines = verify("--config-dump", "-", "--pod-spec", str(tmp_path / "pod.json"), stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == [
        "FAIL terminationGracePeriodSeconds: Deployment istio-ingressgateway: 150 s; needs >= 325 s = "
        "drain_timeout 300 + longest CLOSING 10 + hold margin 5 + terminationDrainDuration 5 + spare 5",
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


def test_health_listener_failing_open_fails_naming_both_fields(start_gateway):
    """A health filter set to FAIL_OPEN whose last route answers 200: a dead VM
    would tell the LB the gateway is fine."""
    health = copy.deepcopy(load("health-listener.yaml"))
    hcm = health["spec"]["configPatches"][0]["patch"]["value"]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"][0]["typed_config"]["config"]["failure_policy"] = "FAIL_OPEN"
    hcm["route_config"]["virtual_hosts"][0]["routes"][-1]["direct_response"]["status"] = 200
    env = start_gateway(VERSION, istio.apply_envoyfilters([istio.gateway_listener(8080)],
                                                          [load("traffic-filter.yaml"), health]))
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 1
    assert failures(lines) == [
        "FAIL health failure_policy: listener drain-gate-health: FAIL_OPEN (want FAIL_CLOSED)",
        "FAIL health catch-all 503: listener drain-gate-health: no catch-all 503 route"]
