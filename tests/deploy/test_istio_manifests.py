"""envoyfilter/: every YAML parses, every EnvoyFilter and WasmPlugin is valid
against the Istio 1.30 CRD schemas, and the files agree with each other and
with the canonical local bootstrap envoyfilter/envoy.yaml."""
from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from tests.harness import istio, k8s
from tests.harness.envoy import BOOTSTRAP, REPO, hcm
from tests.harness.variants import listener


@pytest.fixture(scope="module")
def validators():
    return istio.crd_validators()


def test_every_yaml_file_parses():
    files = istio.yaml_files()
    assert len(files) >= 8, files
    for path in files:
        docs = istio.load_docs(path)
        assert docs, f"{path} is empty"
        for doc in docs:
            assert isinstance(doc, dict), f"{path}: a document is not a mapping"


def test_the_crds_are_the_istio_1_30_ones(validators):
    assert set(validators) == {
        ("networking.istio.io/v1alpha3", "EnvoyFilter"),
        ("extensions.istio.io/v1alpha1", "WasmPlugin"),
    }


def test_the_kept_crds_are_istio_s_unchanged():
    """tests/fixtures/istio-crds is Istio's text below its one-line source note
    (compared with the copy in ../shared when it stands beside the repository)."""
    shared = REPO.parent / "shared" / "istio-crds"
    kept = sorted(istio.CRDS.glob("*.crd.yaml"))
    assert [p.name for p in kept] == ["envoyfilter.crd.yaml", "wasmplugin.crd.yaml"]
    for path in kept:
        note, _, body = path.read_text().partition("\n")
        assert note.startswith("# Istio 1.30.3 ") and "Apache-2.0" in note, note
        if shared.is_dir():
            assert body == (shared / path.name).read_text(), f"{path.name} differs from {shared}"
    if not shared.is_dir():
        pytest.skip(f"{shared} is absent: the copies' text is not compared with Istio's (their notes are checked)")


def test_every_envoyfilter_and_wasmplugin_is_schema_valid(validators):
    found = {**istio.objects("EnvoyFilter"), **istio.objects("WasmPlugin")}
    names = {p.relative_to(istio.ENVOYFILTER).as_posix() for p in found}
    assert names >= {
        "istio/health-listener.yaml",
        "istio/traffic-filter.yaml",
        "istio/tcp-filter.yaml",
        "istio/wasmplugin/health-listener.yaml",
        "istio/wasmplugin/traffic.yaml",
    }
    for path, obj in found.items():
        assert istio.crd_errors(obj, validators) == [], path


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda o: o["spec"]["configPatches"][0].__setitem__("applyTo", "LISTENERS"), "applyTo"),
        (lambda o: o["spec"]["configPatches"][0]["match"].__setitem__("contxt", "GATEWAY"), "contxt"),
        (lambda o: o["spec"]["configPatches"][0]["patch"].__setitem__("operation", "APPEND"), "operation"),
        (lambda o: o["spec"].__setitem__("workloadSelector", {"label": {"istio": "ingressgateway"}}), "label"),
    ],
)
def test_the_schema_check_catches_mistakes(validators, mutate, expected):
    obj = copy.deepcopy(istio.load_one(istio.ISTIO / "health-listener.yaml"))
    mutate(obj)
    errors = istio.crd_errors(obj, validators)
    assert errors and any(expected in e for e in errors), errors


def test_the_schema_check_catches_wasmplugin_mistakes(validators):
    obj = copy.deepcopy(istio.load_one(istio.ISTIO / "wasmplugin" / "traffic.yaml"))
    obj["spec"]["failStrategy"] = "FAIL_OPENED"
    obj["spec"]["phaze"] = "AUTHN"
    errors = istio.crd_errors(obj, validators)
    assert any("failStrategy" in e for e in errors) and any("phaze" in e for e in errors), errors


def test_everything_selects_only_the_pods_labelled_for_drain_gate():
    """The EnvoyFilters and the WasmPlugin select drain-gate's own label, which
    the gateway values set together with the wasm mount — not istio=ingressgateway,
    which every gateway in any namespace may carry, with or without the file."""
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    service = istio.load_one(istio.KUBERNETES / "service.yaml")
    assert service["spec"]["selector"] == istio.GATEWAY_LABELS
    assert values.get("labels", {}).get("istio") in (None, "ingressgateway")
    assert istio.DRAIN_GATE_LABEL.items() <= values["labels"].items()
    assert values["volumeMounts"], "the label comes with the mount"
    # envoyfilter/gateway-api/ selects its own Gateway's pods (tests/deploy/test_gateway_api.py).
    in_istio = lambda found: {p: o for p, o in found.items() if istio.ISTIO in p.parents}  # noqa: E731
    for path, ef in in_istio(istio.objects("EnvoyFilter")).items():
        assert ef["metadata"]["namespace"] == "istio-system", path
        assert ef["spec"]["workloadSelector"]["labels"] == istio.DRAIN_GATE_LABEL, path
    for path, wp in in_istio(istio.objects("WasmPlugin")).items():
        assert wp["metadata"]["namespace"] == "istio-system", path
        assert wp["spec"]["selector"]["matchLabels"] == istio.DRAIN_GATE_LABEL, path


def _value(path):
    return istio.load_one(path)["spec"]["configPatches"]


def _wasm(filters):
    (w,) = [f for f in filters if f.get("typed_config", {}).get("@type") == istio.WASM_HTTP]
    return copy.deepcopy(w["typed_config"]["config"])


def _plugin(rel: str) -> dict:
    """The wasm PluginConfig an envoyfilter/istio/ EnvoyFilter serves over ECDS."""
    return copy.deepcopy(istio.plugin_config(istio.load_one(istio.ISTIO / rel)))


def _bootstrap_listener(name):
    return listener(yaml.safe_load(BOOTSTRAP.read_text()), name)


def _without_path(config):
    """The plugin config but the wasm path and the configuration JSON, whose
    role is returned in its place (the chart spells out every default)."""
    config["vm_config"]["code"]["local"].pop("filename")
    config["configuration"] = json.loads(config["configuration"]["value"])["role"]
    return config


def _asks_istiod(f: dict, kind: str) -> None:
    """A filter whose configuration comes over ADS by its name, with the
    chart's fallback: an allow-all RBAC filter of the same kind (http/network)."""
    assert set(f) == {"name", "config_discovery"}, f
    source = f["config_discovery"]["config_source"]
    assert source == {"ads": {}, "resource_api_version": "V3", "initial_fetch_timeout": "10s"}
    wasm, rbac = (f"type.googleapis.com/envoy.extensions.filters.{kind}.{x}.v3.{y}" for x, y in (("wasm", "Wasm"),
                                                                                                ("rbac", "RBAC")))
    assert f["config_discovery"]["type_urls"] == [wasm, rbac]
    default = f["config_discovery"]["default_config"]
    assert default["@type"] == rbac and "rules" not in default, "allow-all: no rules"


def _served(rel: str, name: str) -> dict:
    """The EXTENSION_CONFIG patch of an EnvoyFilter, checked to be what istiod
    serves to its filter: ADD, the filter patch's proxy match, `name`."""
    ef = istio.load_one(istio.ISTIO / rel)
    (patch,) = [p for p in ef["spec"]["configPatches"] if p["applyTo"] == "EXTENSION_CONFIG"]
    (other,) = [p for p in ef["spec"]["configPatches"] if p["applyTo"] != "EXTENSION_CONFIG"]
    assert patch["patch"]["operation"] == "ADD" and patch["patch"]["value"]["name"] == name
    assert patch["match"] == {"context": "GATEWAY", "proxy": other["match"]["proxy"]}
    return patch["patch"]["value"]


def test_health_listener_agrees_with_envoy_yaml():
    """The EnvoyFilter's listener is envoy.yaml's drain-gate-health apart from
    the port, the wasm path, the filter's configuration coming over ECDS, and
    what a gateway needs on top."""
    listener_patch = _value(istio.ISTIO / "health-listener.yaml")[0]
    assert (listener_patch["applyTo"], listener_patch["match"]["context"], listener_patch["patch"]["operation"]) == (
        "LISTENER", "GATEWAY", "ADD")
    ours = listener_patch["patch"]["value"]
    local = _bootstrap_listener("drain-gate-health")
    assert ours["name"] == local["name"]
    assert ours["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 18180}
    assert ours["per_connection_buffer_limit_bytes"] == local["per_connection_buffer_limit_bytes"]
    served = _served("health-listener.yaml", "drain-gate-health")
    assert served["typed_config"]["@type"] == istio.WASM_HTTP
    assert _without_path(copy.deepcopy(served["typed_config"]["config"])) == _without_path(
        _wasm(hcm(local)["http_filters"]))
    for key in ("stat_prefix", "codec_type", "stream_idle_timeout", "request_headers_timeout", "route_config",
                "local_reply_config", "http_protocol_options"):
        assert hcm(ours)[key] == hcm(local)[key], key
    # A held wait=closed answer is idle for up to drain_timeout + the longest CLOSING + scrape_interval + 5 s
    # (<= 2 h 1 min 5 s).
    assert hcm(ours)["stream_idle_timeout"] == "7300s"
    (route,) = hcm(ours)["route_config"]["virtual_hosts"][0]["routes"]
    assert route["match"] == {"prefix": "/"} and route["direct_response"]["status"] == 503
    # Gateway additions: HAProxy's HTTP/1.0 check without Host, and a router no
    # patch relative to envoy.filters.http.router matches.
    assert hcm(ours)["http_protocol_options"] == {"accept_http_10": True, "default_host_for_http_10": "drain-gate",
                                                  "allow_custom_methods": True}
    names = [f["name"] for f in hcm(ours)["http_filters"]]
    assert names == ["drain-gate-health", "drain-gate-health.router"]
    assert hcm(ours)["http_filters"][-1]["typed_config"]["@type"].endswith("router.v3.Router")
    # Its configuration comes from istiod by name; without one, every request meets the catch-all 503.
    _asks_istiod(hcm(ours)["http_filters"][0], "http")
    assert served["typed_config"]["config"]["failure_policy"] == "FAIL_CLOSED"


def test_admin_cluster_is_the_bootstrap_one_where_envoy_yaml_adds_its_own():
    """The connection rotation calls Envoy's admin through a cluster: envoy.yaml
    adds drain_gate_envoy_admin (drain-gate's default) at its admin address;
    in istio-proxy the health role names prometheus_stats, the bootstrap's
    static cluster at the admin's own address and port (::1 or 127.0.0.1,
    proxyAdminPort), and the EnvoyFilter adds no cluster."""
    config = json.loads(_plugin("health-listener.yaml")["configuration"]["value"])
    assert config["rotate_connections"] == "prometheus_stats"
    doc = yaml.safe_load(BOOTSTRAP.read_text())
    (local,) = [c for c in doc["static_resources"]["clusters"] if c["name"] == "drain_gate_envoy_admin"]
    assert local["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == doc["admin"]["address"]
    # The harness's istio-proxy bootstrap dials the admin wherever it listens.
    for address in ("127.0.0.1", "::1"):
        boot = istio.gateway_bootstrap([], {}, 15999, 1, admin_address=address)
        (stats,) = [c for c in boot["static_resources"]["clusters"] if c["name"] == "prometheus_stats"]
        dial = stats["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        assert (dial["address"], dial["port_value"]) == (address, 15999) and boot["admin"]["address"] == {
            "socket_address": {"address": address, "port_value": 15999}}


def test_traffic_filter_agrees_with_envoy_yaml():
    """The first HTTP filter in both: INSERT_FIRST at the highest priority there
    is, and envoy.yaml's traffic listener starts with it."""
    patch = _value(istio.ISTIO / "traffic-filter.yaml")[0]
    assert patch["applyTo"] == "HTTP_FILTER" and patch["patch"]["operation"] == "INSERT_FIRST"
    assert istio.load_one(istio.ISTIO / "traffic-filter.yaml")["spec"]["priority"] == 2 ** 31 - 1
    assert patch["match"]["context"] == "GATEWAY"
    fm = patch["match"]["listener"]["filterChain"]["filter"]
    assert fm == {"name": istio.HCM_NAME}, "INSERT_FIRST ignores a subFilter: none, not a misleading one"
    assert hcm(_bootstrap_listener("traffic"))["http_filters"][0]["name"] == "drain-gate"
    assert patch["patch"]["value"]["name"] == "drain-gate"
    _asks_istiod(patch["patch"]["value"], "http")
    served = _served("traffic-filter.yaml", "drain-gate")
    local = _wasm(hcm(_bootstrap_listener("traffic"))["http_filters"])
    assert _without_path(copy.deepcopy(served["typed_config"]["config"])) == _without_path(local)
    assert served["typed_config"]["config"]["failure_policy"] == "FAIL_OPEN"


def test_tcp_filter_is_the_traffic_filter_as_a_network_filter_before_tcp_proxy():
    ef = istio.load_one(istio.ISTIO / "tcp-filter.yaml")
    patch = ef["spec"]["configPatches"][0]
    assert patch["applyTo"] == "NETWORK_FILTER" and patch["patch"]["operation"] == "INSERT_BEFORE"
    traffic_ef = istio.load_one(istio.ISTIO / "traffic-filter.yaml")
    assert patch["match"] == {"context": "GATEWAY", "proxy": traffic_ef["spec"]["configPatches"][0]["match"]["proxy"],
                              "listener": {"filterChain": {"filter": {"name": "envoy.filters.network.tcp_proxy"}}}}
    assert ef["spec"]["workloadSelector"] == traffic_ef["spec"]["workloadSelector"]
    assert ef["spec"]["priority"] == istio.load_one(k8s.CHART / "values.yaml")["priority"]
    assert ef["metadata"]["namespace"] == traffic_ef["metadata"]["namespace"]
    assert patch["patch"]["value"]["name"] == "drain-gate-tcp"
    _asks_istiod(patch["patch"]["value"], "network")
    value = _served("tcp-filter.yaml", "drain-gate-tcp")
    assert value["typed_config"]["@type"] == istio.WASM_NETWORK
    tcp = value["typed_config"]["config"]
    traffic = _plugin("traffic-filter.yaml")
    assert json.loads(tcp["configuration"]["value"]) == {
        **json.loads(traffic["configuration"]["value"]), "role": "traffic_tcp"}
    # Same module, vm_id and fail policy as the HTTP traffic role; only names and role differ.
    for key in ("name", "root_id", "configuration"):
        tcp, traffic = {**tcp, key: None}, {**traffic, key: None}
    assert tcp == traffic


def test_both_roles_share_one_vm_id_and_one_file():
    health, traffic = _plugin("health-listener.yaml"), _plugin("traffic-filter.yaml")
    assert health["vm_config"]["vm_id"] == traffic["vm_config"]["vm_id"] == "drain-gate"
    assert health["vm_config"]["code"] == traffic["vm_config"]["code"]
    assert json.loads(health["configuration"]["value"])["role"] == "health"
    assert json.loads(traffic["configuration"]["value"])["role"] == "traffic"


def test_wasmplugin_health_listener_differs_only_in_vm_id():
    a = istio.load_one(istio.ISTIO / "health-listener.yaml")
    b = istio.load_one(istio.ISTIO / "wasmplugin" / "health-listener.yaml")
    assert a["metadata"] == b["metadata"], "same name: applying one replaces the other"
    wb = istio.plugin_config(b)
    assert wb["vm_config"]["vm_id"] == ""
    wb["vm_config"]["vm_id"] = "drain-gate"
    assert a == b


def test_wasmplugins_are_the_traffic_roles_on_the_mounted_file():
    wp = istio.load_one(istio.ISTIO / "wasmplugin" / "traffic.yaml")
    tcp = istio.load_one(istio.ISTIO / "wasmplugin" / "tcp.yaml")
    health = _plugin("wasmplugin/health-listener.yaml")
    for obj, role, kind in ((wp, "traffic", "HTTP"), (tcp, "traffic_tcp", "NETWORK")):
        spec = obj["spec"]
        assert spec["pluginConfig"]["role"] == role
        assert spec["failStrategy"] == "FAIL_OPEN"
        # The earliest a WasmPlugin gets: first in phase AUTHN.
        assert (spec["phase"], spec["priority"], spec["type"]) == ("AUTHN", 2 ** 31 - 1, kind)
        # The file the health listener loads: one module, nothing to fetch.
        assert spec["url"] == "file://" + health["vm_config"]["code"]["local"]["filename"]
        # The Envoy config istiod generates from it has no vm_id at all: the health listener's "".
        ec = istio.wasmplugin_extension_config(obj, REPO / "x.wasm")
        assert "vm_id" not in ec["typed_config"]["config"]["vm_config"] and health["vm_config"]["vm_id"] == ""
        assert ec["name"].startswith("extensions.istio.io/trafficextension/")
    assert "match" not in wp["spec"], "every HTTP listener istiod builds for the gateway is counted"
    assert tcp["spec"]["match"] == [{"ports": [{"number": istio.PASSTHROUGH_SERVER_PORT}]}], \
        "a NETWORK plugin lands on HTTP chains too"


def test_wasm_path_is_where_the_chart_mounts_the_configmap():
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    (volume,) = values["volumes"]
    (mount,) = values["volumeMounts"]
    assert volume["configMap"]["name"] == "drain-gate-wasm" and mount["name"] == volume["name"]
    assert mount["subPath"] == "drain_gate.wasm" and mount["readOnly"] is True
    for rel in ("health-listener.yaml", "wasmplugin/health-listener.yaml", "traffic-filter.yaml", "tcp-filter.yaml"):
        assert _plugin(rel)["vm_config"]["code"]["local"]["filename"] == mount["mountPath"], rel


def test_makefile_installs_the_envoy_versions_the_tests_run():
    text = (REPO / "Makefile").read_text()
    m = re.search(r"^ENVOY_MATRIX\s*:=\s*(.+)$", text, re.M)
    assert m, "ENVOY_MATRIX missing from the Makefile"
    assert tuple(m.group(1).split()) == istio.ENVOY_MATRIX
    assert re.search(r"^test:.*\benvoy-matrix\b", text, re.M), "make test must install the matrix"
