"""envoyfilter/chart (the drain-gate Helm chart): `helm lint` passes, the
values schema and the render refuse bad values with a message naming them,
the render is what envoyfilter/istio/ holds, and every rendered object is a
valid Kubernetes / Istio object selecting only drain-gate's own pod label."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import math
import re
import subprocess

import kubernetes_validate
import pytest
import yaml

from tests.hardening import test_config as config_keys
from tests.harness import istio, k8s
from tests.harness.envoy import REPO, WASM

OCI = "oci://registry.example.com/drain-gate/drain-gate:0.1.0"
# The WasmPlugin form as shipped: the module the chart mounts (file://), TCP on an example port.
WASMPLUGIN = ("--set", "form=wasmplugin", "--set", "tcp.ports={15443}")
WASMPLUGIN_OCI = ("--set", "form=wasmplugin", "--set", f"wasmPlugin.url={OCI}")
GATEWAY_API = ("--set", "gatewayAPI.enabled=true")
# The static cluster of istio-proxy's bootstrap that dials the admin API.
ISTIO_ADMIN_CLUSTER = "prometheus_stats"
OBSERVABILITY = ("--set", "observability.prometheusRule=true", "--set", "observability.grafanaDashboard=true")


@pytest.fixture(scope="module")
def module(tmp_path_factory) -> tuple[bytes, str]:
    """One snapshot of the module (a concurrent build may rewrite WASM) and its base64 file."""
    wasm = WASM.read_bytes()
    path = k8s.wasm_base64_file(wasm, tmp_path_factory.mktemp("wasm"))
    return wasm, str(path)


def with_module(module, *args: str) -> tuple[str, ...]:
    return ("--set-file", f"wasm.base64={module[1]}", *args)


def refusal(*args: str) -> str:
    r = k8s.template(*args, check=False)
    assert r.returncode != 0, f"rendered with {args}"
    return r.stderr


@pytest.mark.parametrize("form", [(), WASMPLUGIN, WASMPLUGIN_OCI, (*GATEWAY_API, *WASMPLUGIN, *OBSERVABILITY)],
                         ids=["envoyfilter", "wasmplugin", "wasmplugin-oci", "gateway-api+observability"])
def test_helm_lint_passes(module, form):
    r = k8s.run("helm", "lint", "--strict", str(k8s.CHART), *with_module(module, *form))
    assert "1 chart(s) linted, 0 chart(s) failed" in r.stdout, r.stdout


def test_plain_files_are_the_chart_render(tmp_path):
    """envoyfilter/istio/*.yaml and envoyfilter/gateway-api/*.yaml are `make
    istio-manifests` output, byte for byte."""
    subprocess.run(["make", "-s", "istio-manifests", f"ISTIO_DIR={tmp_path / 'istio'}",
                    f"GATEWAY_API_DIR={tmp_path / 'gateway-api'}"], cwd=REPO, check=True, capture_output=True)
    policies = ["health-listener.yaml", "tcp-filter.yaml", "traffic-filter.yaml", "wasmplugin/health-listener.yaml",
                "wasmplugin/tcp.yaml", "wasmplugin/traffic.yaml"]
    expected = {istio.ISTIO: policies,
                istio.GATEWAY_API: sorted(["gateway.yaml", "options.yaml", "options-distroless.yaml", *policies])}
    for shipped, files in expected.items():
        out = tmp_path / shipped.name
        rendered = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.yaml"))
        assert rendered == files
        assert sorted(p.relative_to(shipped).as_posix() for p in shipped.rglob("*.yaml")) == files
        for rel in rendered:
            assert (shipped / rel).read_text() == (out / rel).read_text(), \
                f"envoyfilter/{shipped.name}/{rel} differs from the chart: run `make istio-manifests`"


def readme_config_table() -> dict:
    """`key` -> default, from the configuration table of envoyfilter/docs/configuration.md."""
    text = (REPO / "envoyfilter" / "docs" / "configuration.md").read_text()
    section = text.split("# Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \|", section, re.M)
    return {key: (None if default == "(required)" else json.loads(default.strip("`"))) for key, default in rows}


def test_values_are_every_key_of_the_configuration_table():
    table = readme_config_table()
    keys = config_keys.KEYS
    assert set(table) == set(keys), "README table and src/config.rs KEYS differ"
    values = istio.load_one(k8s.CHART / "values.yaml")["config"]
    assert "role" not in values, "the chart sets the role of each filter"
    # Two defaults differ, on purpose: in istio-proxy the admin API is reached
    # through the bootstrap's own cluster (it follows the admin's address and port),
    # and pilot-agent through its `agent` cluster (the termination watch).
    assert values.pop("rotate_connections") == ISTIO_ADMIN_CLUSTER
    assert table["rotate_connections"] == "drain_gate_envoy_admin"
    assert values.pop("termination_watch") == "agent" and table["termination_watch"] is False
    assert values == {k: v for k, v in table.items() if k not in ("role", "rotate_connections",
                                                                  "termination_watch")}, \
        "chart defaults are the plugin's defaults"
    schema = json.loads((k8s.CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["config"]["properties"]) == set(keys) - {"role"}


@pytest.mark.parametrize("args, named", [
    (("--set", "colour=blue"), "colour"),
    (("--set", "config.drain_timout=30s"), "drain_timout"),
    (("--set", "config.drain_timeout=12x"), "drain_timeout"),
    (("--set", "config.lb_buffer=1.5s"), "lb_buffer"),
    (("--set", "config.tick=100"), "tick"),
    (("--set", "config.draining_lb_status=503"), "draining_lb_status"),
    (("--set", "config.admin_token=short"), "admin_token"),
    (("--set", "config.close_after=lb_down"), "close_after"),
    (("--set", "config.refuse_with=503"), "refuse_with"),
    (("--set", "config.lb_fall=11"), "lb_fall"),
    (("--set", "form=both"), "form"),
    (("--set", "wasm.bas64=x"), "bas64"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_schema_refuses_unknown_keys_and_bad_values(module, args, named):
    err = refusal(*with_module(module, *args))
    assert "values don't meet the specifications of the schema" in err and named in err, err


@pytest.mark.parametrize("args, message", [
    (("--set", "config.drain_timeout=2h"), 'config.drain_timeout: "2h" is above the maximum 60m'),
    (("--set", "config.lb_down_timeout=0s"), 'config.lb_down_timeout: "0s" is below the minimum 1ms'),
    (("--set", "config.tick=5ms"), 'config.tick: "5ms" is outside 10ms..10s'),
    (("--set", "config.min_drain=3m"), "config.min_drain must not exceed config.drain_timeout"),
    (("--set", "config.refused_requests=all"),
     'config.refused_requests: "all" needs config.draining_new_requests: "refuse"'),
    (("--set", "config.draining_grpc_requests=refuse"),
     'config.draining_grpc_requests: "refuse" needs config.draining_new_requests: "refuse"'),
    (("--set", "config.refuse_with=reset"), 'config.refuse_with: "reset" needs config.draining_new_requests: "refuse"'),
    (("--set", f"wasmPlugin.url={OCI}"), "wasmPlugin.url and wasmPlugin.canary.url take effect with form wasmplugin"),
])
def test_render_refuses_values_the_plugin_would_refuse(module, args, message):
    assert message in refusal(*with_module(module, *args))


def test_render_refuses_a_missing_binary_or_oversized_module(tmp_path):
    assert "wasm.base64 is empty: pass the module with --set-file" in refusal()
    raw = tmp_path / "raw.wasm"
    raw.write_bytes(b"\0asm\x01\0\0\0\xff\xfe")
    assert "/wasm/base64" in refusal("--set-file", f"wasm.base64={raw}"), "the binary file is refused by the schema"
    text = tmp_path / "text.b64"
    text.write_text(base64.b64encode(b"not a module").decode())
    assert "is not a base64 WebAssembly module" in refusal("--set-file", f"wasm.base64={text}")
    big = tmp_path / "big.b64"
    big.write_text(base64.b64encode(b"\0asm" + b"\0" * (1024 * 1024)).decode())
    err = refusal("--set-file", f"wasm.base64={big}")
    assert "the module is 1048580 bytes: a ConfigMap holds at most 1 MiB" in err, err


def _validate_k8s(obj: dict) -> None:
    assert istio.k8s_errors(obj, ("1.28.0", kubernetes_validate.utils.latest_version())) == []


@pytest.mark.parametrize("form", [(), WASMPLUGIN], ids=["envoyfilter", "wasmplugin"])
def test_rendered_objects_select_drain_gate_pods_in_the_release_namespace(module, form):
    objs = k8s.run("helm", "template", "dg", str(k8s.CHART), "-n", "gateways", *with_module(module, *form)).stdout
    objs = k8s.by_kind(k8s.docs(objs))
    wasmplugin = bool(form)
    kind = "WasmPlugin" if wasmplugin else "EnvoyFilter"
    expected = {("PodDisruptionBudget", "drain-gate"), ("ConfigMap", "drain-gate-wasm"),
                ("EnvoyFilter", "drain-gate-health"), (kind, "drain-gate-traffic"), (kind, "drain-gate-tcp")}
    assert set(objs) == expected
    for obj in objs.values():
        assert obj["metadata"]["namespace"] == "gateways", obj["kind"]
    health = objs[("EnvoyFilter", "drain-gate-health")]
    assert health["spec"]["workloadSelector"] == {"labels": istio.DRAIN_GATE_LABEL}
    assert objs[("PodDisruptionBudget", "drain-gate")]["spec"]["selector"] == {"matchLabels": istio.DRAIN_GATE_LABEL}
    patches = list(health["spec"]["configPatches"])
    assert [p["applyTo"] for p in patches] == ["LISTENER", "EXTENSION_CONFIG"], \
        "no admin cluster added: the bootstrap has one"
    if wasmplugin:
        for name in ("drain-gate-traffic", "drain-gate-tcp"):
            wp = objs[("WasmPlugin", name)]
            assert wp["spec"]["selector"] == {"matchLabels": istio.DRAIN_GATE_LABEL}
            assert wp["spec"]["url"] == "file:///etc/drain-gate/drain_gate.wasm", "the mounted module"
    else:
        for name in ("drain-gate-traffic", "drain-gate-tcp"):
            traffic = objs[("EnvoyFilter", name)]
            assert traffic["spec"]["workloadSelector"] == {"labels": istio.DRAIN_GATE_LABEL}
            assert traffic["spec"]["priority"] > 0, "INSERT_BEFORE needs a priority (IST0151)"
            patches += traffic["spec"]["configPatches"]
    for p in patches:
        assert re.search(p["match"]["proxy"]["proxyVersion"], istio.PROXY_VERSION)
        assert not re.search(p["match"]["proxy"]["proxyVersion"], "1.31.0")
    cm = objs[("ConfigMap", "drain-gate-wasm")]
    wasm = base64.b64decode(cm["binaryData"]["drain_gate.wasm"])
    assert wasm == module[0]
    assert cm["metadata"]["annotations"]["drain-gate/wasm-sha256"] == hashlib.sha256(wasm).hexdigest()
    _validate_k8s(cm)
    _validate_k8s(objs[("PodDisruptionBudget", "drain-gate")])


def test_wasmplugin_form_loads_the_mounted_module_and_counts_tcp_on_its_ports(module):
    """form wasmplugin: both WasmPlugins load the file the ConfigMap mounts
    (file://: nothing to fetch), the TCP one (type NETWORK) matches only
    tcp.ports, each roles's pluginConfig is role + tick; an oci:// url is for
    both, with its sha256; without tcp.ports there is no TCP plugin."""
    objs = k8s.by_kind(k8s.template(*with_module(module, "--set", "form=wasmplugin",
                                                 "--set", "tcp.ports={15443,9443}")))
    traffic, tcp = objs[("WasmPlugin", "drain-gate-traffic")]["spec"], objs[("WasmPlugin", "drain-gate-tcp")]["spec"]
    cm = objs[("ConfigMap", "drain-gate-wasm")]
    mounted = "file://" + istio.load_one(k8s.CHART / "values.yaml")["wasm"]["path"]
    assert traffic["url"] == tcp["url"] == mounted and "sha256" not in traffic and "imagePullPolicy" not in traffic
    assert cm["binaryData"]["drain_gate.wasm"], "the ConfigMap the file comes from is part of the release"
    assert (traffic["type"], traffic["pluginName"], "match" in traffic) == ("HTTP", "drain_gate_traffic", False)
    assert (tcp["type"], tcp["pluginName"]) == ("NETWORK", "drain_gate_tcp")
    assert tcp["match"] == [{"ports": [{"number": 15443}, {"number": 9443}]}]
    assert traffic["pluginConfig"] == {"role": "traffic", "tick": "100ms", "draining_new_requests": "serve",
                                       "refused_requests": "idempotent", "draining_grpc_requests": "serve", "refuse_with": "response"}
    assert tcp["pluginConfig"] == {**traffic["pluginConfig"], "role": "traffic_tcp"}
    assert traffic["failStrategy"] == tcp["failStrategy"] == "FAIL_OPEN"
    digest = "a" * 64
    oci = k8s.by_kind(k8s.template(*with_module(module, *WASMPLUGIN, "--set", f"wasmPlugin.url={OCI}",
                                                "--set", f"wasmPlugin.sha256={digest}")))
    for name in ("drain-gate-traffic", "drain-gate-tcp"):
        spec = oci[("WasmPlugin", name)]["spec"]
        assert (spec["url"], spec["sha256"], spec["imagePullPolicy"]) == (OCI, digest, "IfNotPresent"), name
    assert ("WasmPlugin", "drain-gate-tcp") not in k8s.by_kind(k8s.template(*with_module(module, "--set", "form=wasmplugin")))
    assert "tcp.ports" in refusal(*with_module(module, *WASMPLUGIN, "--set", "tcp.ports={0}")).replace("/", ".")


def test_canary_value_adds_a_second_traffic_plugin_for_the_labelled_pod(module):
    """wasmPlugin.canary: a second traffic WasmPlugin from the new image, for
    the pods that also carry the canary label; the fleet's plugin stays."""
    digest = "b" * 64
    objs = k8s.by_kind(k8s.template(*with_module(module, *WASMPLUGIN, "--set", f"wasmPlugin.canary.url={OCI}",
                                                 "--set", f"wasmPlugin.canary.sha256={digest}")))
    fleet, canary = objs[("WasmPlugin", "drain-gate-traffic")]["spec"], objs[("WasmPlugin", "drain-gate-traffic-canary")]["spec"]
    assert fleet["url"].startswith("file://") and fleet["selector"] == {"matchLabels": istio.DRAIN_GATE_LABEL}
    assert (canary["url"], canary["sha256"]) == (OCI, digest)
    assert canary["selector"] == {"matchLabels": {**istio.DRAIN_GATE_LABEL, "drain-gate.io/canary": "true"}}
    assert {k: v for k, v in canary.items() if k not in ("url", "sha256", "selector", "imagePullPolicy")} == \
        {k: v for k, v in fleet.items() if k not in ("url", "sha256", "selector")}
    assert ("WasmPlugin", "drain-gate-traffic-canary") not in k8s.by_kind(k8s.template(*with_module(module, *WASMPLUGIN)))


def test_config_values_reach_the_health_role_and_traffic_gets_only_what_it_uses(module):
    """The traffic role's configuration is role + tick + draining_new_requests,
    each checked at render: no value can make Envoy refuse the traffic
    configuration alone, which on a fresh pod leaves its traffic filters on
    their fallback, counting nothing (tests/envoy/test_load_failure.py, "traffic
    config"). Every value reaches the roles over ECDS, in the EnvoyFilters'
    EXTENSION_CONFIG patches: the filters themselves carry none."""
    for form in ((), WASMPLUGIN):
        objs = k8s.by_kind(k8s.template(*with_module(module, "--set", "config.drain_timeout=30s",
                                                     "--set", "config.draining_lb_status=404",
                                                     "--set", "config.tick=50ms", *form)))
        health = objs[("EnvoyFilter", "drain-gate-health")]
        config = json.loads(istio.plugin_config(health, "drain-gate-health")["configuration"]["value"])
        assert config["role"] == "health"
        assert (config["drain_timeout"], config["draining_lb_status"], config["tick"]) == ("30s", 404, "50ms")
        assert "50ms" not in json.dumps(health["spec"]["configPatches"][0]), "not in the listener"
        if form:
            traffic = objs[("WasmPlugin", "drain-gate-traffic")]["spec"]["pluginConfig"]
        else:
            traffic = json.loads(istio.plugin_config(objs[("EnvoyFilter", "drain-gate-traffic")], "drain-gate")[
                "configuration"]["value"])
            tcp = json.loads(istio.plugin_config(objs[("EnvoyFilter", "drain-gate-tcp")], "drain-gate-tcp")[
                "configuration"]["value"])
            assert tcp == {"role": "traffic_tcp", "tick": "50ms", "draining_new_requests": "serve",
                           "refused_requests": "idempotent", "draining_grpc_requests": "serve", "refuse_with": "response"}
            for name in ("drain-gate-traffic", "drain-gate-tcp"):
                assert "50ms" not in json.dumps(objs[("EnvoyFilter", name)]["spec"]["configPatches"][0]), name
        assert traffic == {"role": "traffic", "tick": "50ms", "draining_new_requests": "serve",
                           "refused_requests": "idempotent", "draining_grpc_requests": "serve", "refuse_with": "response"}


def test_tcp_value_renders_or_leaves_out_the_tcp_filter(module):
    names = lambda *args: {o["metadata"]["name"] for o in k8s.template(*with_module(module, *args))}
    assert "drain-gate-tcp" in names()
    assert "drain-gate-tcp" not in names("--set", "tcp.enabled=false")
    assert "drain-gate-tcp" in names(*WASMPLUGIN)
    assert "drain-gate-tcp" not in names(*WASMPLUGIN, "--set", "tcp.enabled=false")
    assert "tcp.enabled" in refusal(*with_module(module, "--set", "tcp.enabled=yes")).replace("/", ".")


def test_rendered_istio_objects_are_valid_against_the_crds(module):
    validators = istio.crd_validators()
    for form in ((), WASMPLUGIN, (*WASMPLUGIN, "--set", f"wasmPlugin.canary.url={OCI}")):
        for obj in k8s.template(*with_module(module, *form)):
            if obj["kind"] in ("EnvoyFilter", "WasmPlugin"):
                assert istio.crd_errors(obj, validators) == [], (form, obj["kind"])


@pytest.mark.parametrize("config", [{}, {"drain_timeout": "300s", "lb_buffer": "1500ms"},
                                    {"close_after": "lb_observed_down", "lb_down_timeout": "90s"},
                                    {"scrape_interval": "5s"}])
def test_install_notes_give_the_grace_period_verify_checks(module, config):
    """`helm install` prints the minimum terminationGracePeriodSeconds; it is
    the one verify.py --pod-spec checks (with the values' 5 s drain duration)."""
    sets = [a for k, v in config.items() for a in ("--set", f"config.{k}={v}")]
    r = k8s.run("helm", "install", "--dry-run=client", "drain-gate", str(k8s.CHART), "-n", "istio-system",
                *with_module(module, *sets))
    printed = int(re.search(r"terminationGracePeriodSeconds must be at least (\d+)", r.stdout)[1])
    spec = importlib.util.spec_from_file_location("verify", istio.ENVOYFILTER / "tools" / "verify.py")
    verify = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verify)
    drain, closing, scrape = verify.timings(config)
    assert printed == math.ceil(drain + closing + scrape + verify.HOLD_MARGIN_S + 5 + verify.SPARE_S)


def test_the_chart_refuses_kubernetes_before_1_28(module):
    """KEP-1669 (terminating endpoints keep the LB's checks) is GA in 1.28."""
    err = refusal(*with_module(module, "--kube-version", "1.27.9"))
    assert "chart requires kubeVersion: >=1.28.0-0" in err, err
    k8s.template(*with_module(module, "--kube-version", "1.28.0"))



def test_gateway_api_value_renders_the_gateway_and_one_pdb(module):
    """gatewayAPI.enabled: the Gateway and its parametersRef ConfigMap, the
    EnvoyFilters also selecting the Gateway's pods, and one PodDisruptionBudget
    over them (istiod's, from the ConfigMap): never the chart's beside it."""
    plain = k8s.by_kind(k8s.template(*with_module(module)))
    assert ("PodDisruptionBudget", "drain-gate") in plain and ("Gateway", "ingress") not in plain
    objs = k8s.by_kind(k8s.template(*with_module(module, *GATEWAY_API)))
    assert set(objs) == {("ConfigMap", "drain-gate-wasm"), ("ConfigMap", "ingress-drain-gate"),
                         ("Gateway", "ingress"), ("EnvoyFilter", "drain-gate-health"),
                         ("EnvoyFilter", "drain-gate-traffic"), ("EnvoyFilter", "drain-gate-tcp")}
    gw, options = objs[("Gateway", "ingress")], objs[("ConfigMap", "ingress-drain-gate")]
    assert gw["spec"]["infrastructure"]["parametersRef"] == {"group": "", "kind": "ConfigMap", "name": "ingress-drain-gate"}
    assert set(options["data"]) == {"deployment", "service", "podDisruptionBudget"}
    for name in ("drain-gate-health", "drain-gate-traffic"):
        assert objs[("EnvoyFilter", name)]["spec"]["workloadSelector"]["labels"] == {
            **istio.DRAIN_GATE_LABEL, "gateway.networking.k8s.io/gateway-name": "ingress"}
    no_pdb = k8s.by_kind(k8s.template(*with_module(module, *GATEWAY_API, "--set", "podDisruptionBudget.enabled=false")))
    assert "podDisruptionBudget" not in no_pdb[("ConfigMap", "ingress-drain-gate")]["data"]
    assert not [k for k in no_pdb if k[0] == "PodDisruptionBudget"]
    wps = k8s.by_kind(k8s.template(*with_module(module, *GATEWAY_API, *WASMPLUGIN)))
    for name in ("drain-gate-traffic", "drain-gate-tcp"):
        # By label, as the EnvoyFilters: a Gateway pod without the mount has no file to load.
        wp = wps[("WasmPlugin", name)]
        assert wp["spec"]["selector"] == {"matchLabels": {
            **istio.DRAIN_GATE_LABEL, "gateway.networking.k8s.io/gateway-name": "ingress"}} and "targetRefs" not in wp["spec"]
    deployment = yaml.safe_load(options["data"]["deployment"])
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"drain-gate.io/lb-node": "true"}


def test_gateway_api_distroless_hook_presents_the_newest_token(module):
    old, new = "a" * 24, "b" * 24
    objs = k8s.by_kind(k8s.template(*with_module(module, *GATEWAY_API, "--set", "gatewayAPI.preStop=httpGet",
                                                 "--set", f"config.admin_token={{{old},{new}}}")))
    deployment = objs[("ConfigMap", "ingress-drain-gate")]["data"]["deployment"]
    assert f"value: Bearer {new}\n" in deployment and old not in deployment
    # exec: null deletes a mesh-wide exec preStop the template rendered (one handler per hook).
    hook = yaml.safe_load(deployment)["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]
    assert hook["exec"] is None and set(hook) == {"exec", "httpGet"}


@pytest.mark.parametrize("args, message", [
    (("--set", "gatewayAPI.preStop=httpGet"), "gatewayAPI.preStop httpGet needs config.admin_token"),
    (("--set", "config.drain_timeout=300s"),
     "gatewayAPI.terminationGracePeriodSeconds 150 is below 325 = the longest preStop hold 315 s"),
    (("--set", "gatewayAPI.nodePorts.80=80"), "nodePorts"),
])
def test_gateway_api_value_refuses_a_hook_without_token_or_a_short_grace_period(module, args, message):
    assert message in refusal(*with_module(module, *GATEWAY_API, *args))


def test_observability_value_installs_the_rule_and_the_dashboard(module, tmp_path):
    """observability.prometheusRule / grafanaDashboard render what
    envoyfilter/observability/ holds (the chart's files/ are generated from it,
    tests/observability/test_observability.py keeps them current): promtool accepts the
    rendered groups, the ConfigMap is a valid Kubernetes object for Grafana's sidecar."""
    default = k8s.by_kind(k8s.template(*with_module(module)))
    assert not {("PrometheusRule", "drain-gate"), ("ConfigMap", "drain-gate-dashboard")} & set(default), "off by default"
    objs = k8s.by_kind(k8s.template(*with_module(module, *OBSERVABILITY)))
    rule, board = objs[("PrometheusRule", "drain-gate")], objs[("ConfigMap", "drain-gate-dashboard")]
    observability = istio.ENVOYFILTER / "observability"
    shipped_rule = istio.load_one(observability / "drain-gate.prometheusrule.yaml")
    assert (rule["apiVersion"], rule["kind"]) == (shipped_rule["apiVersion"], shipped_rule["kind"])
    assert rule["spec"] == shipped_rule["spec"] == istio.load_one(observability / "drain-gate.rules.yaml")
    assert rule["metadata"]["namespace"] == k8s.NAMESPACE
    groups = tmp_path / "rules.yaml"
    groups.write_text(json.dumps(rule["spec"]))
    r = subprocess.run(["promtool", "check", "rules", str(groups)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    shipped_board = istio.load_one(observability / "drain-gate.dashboard.configmap.yaml")
    assert board["data"] == shipped_board["data"]
    assert board["data"]["drain-gate.json"] == (observability / "drain-gate.dashboard.json").read_text()
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    _validate_k8s(board)


def test_pod_monitor_scrapes_the_gateways_and_the_prestop_waits_its_interval(module):
    """observability.podMonitor renders a PodMonitor of the gateway pods' Envoy at its interval
    (off by default), and the health role's preStop answer then waits that interval after CLOSED:
    config.scrape_interval in its configuration, and in the hold the grace period must cover."""
    default = k8s.by_kind(k8s.template(*with_module(module)))
    assert ("PodMonitor", "drain-gate") not in default, "off by default"
    health = json.loads(_health_config(default))
    assert (health["scrape_interval"], health["termination_watch"]) == ("0s", "agent")
    objs = k8s.by_kind(k8s.template(*with_module(module, "--set", "observability.podMonitor=true")))
    monitor = objs[("PodMonitor", "drain-gate")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "http-envoy-prom", "path": "/stats/prometheus", "interval": "5s"}]
    values = istio.load_one(k8s.CHART / "values.yaml")
    assert monitor["spec"]["selector"]["matchLabels"] == values["podSelector"]
    assert json.loads(_health_config(objs))["scrape_interval"] == "5s"
    longer = k8s.by_kind(k8s.template(*with_module(module, "--set", "observability.podMonitor=true",
                                                   "--set", "config.scrape_interval=15s")))
    assert json.loads(_health_config(longer))["scrape_interval"] == "15s", "the longer of the two"
    assert "above the maximum 1m" in refusal(*with_module(module, "--set", "config.scrape_interval=61s"))


def _health_config(objs: dict) -> str:
    """The health role's plugin configuration in rendered objects."""
    return istio.plugin_config(objs[("EnvoyFilter", "drain-gate-health")], "drain-gate-health")["configuration"]["value"]
