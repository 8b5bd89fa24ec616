"""A WasmPlugin converted the way istiod (pilot/pkg/model/wasm.go buildPluginConfig)
and istio-agent (pkg/wasm/convert.go: remote code rewritten to a local file)
do, and delivered over ECDS (a file config source instead of ADS)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from tests.harness.istio.envoyfilter import (
    EXT_AUTHZ_SHADOW_PREFIX,
    HCM_NAME,
    RBAC_HTTP,
    WASM_HTTP,
    WASM_NETWORK,
    hcms,
)

# Istio 1.30 translates every WasmPlugin into a synthetic TrafficExtension named
# <name>~istio-translated-wasmplugin (pilot/pkg/config/kube/extensions/translate.go);
# its ECDS resource is extensions.istio.io/trafficextension/<namespace>.<that name>
# (pilot/pkg/model/extensions.go) and its plugin config's name <namespace>.<that name>.
TRANSLATED = "~istio-translated-wasmplugin"
RBAC_NETWORK = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC"


def wasmplugin_resource_name(wp: dict) -> str:
    return f"extensions.istio.io/trafficextension/{wp['metadata']['namespace']}.{wp['metadata']['name']}{TRANSLATED}"


def wasmplugin_type(wp: dict) -> str:
    return {"UNSPECIFIED_PLUGIN_TYPE": "HTTP"}.get(wp["spec"].get("type", "HTTP"), wp["spec"].get("type", "HTTP"))


def wasmplugin_extension_config(wp: dict, local_file: Path, resource_version: str = "1") -> dict:
    """The ECDS TypedExtensionConfig Envoy receives for a WasmPlugin (HTTP or
    NETWORK): as istiod builds it (buildWasmConfig/buildVMConfig: no vm_id,
    runtime v8, the resource-version environment variable, failStrategy ->
    failure_policy) after istio-agent fetched an oci:// module into
    `local_file`; for a file:// url Envoy loads the url's path, which the
    harness substitutes by `local_file` (as it substitutes the EnvoyFilters'
    mounted path)."""
    spec = wp["spec"]
    kind = wasmplugin_type(wp)
    assert kind in ("HTTP", "NETWORK"), kind
    env = {"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": resource_version}
    if spec.get("imagePullPolicy", "UNSPECIFIED_POLICY") != "UNSPECIFIED_POLICY":
        env["ISTIO_META_WASM_IMAGE_PULL_POLICY"] = spec["imagePullPolicy"]
    config = {
        "name": f"{wp['metadata']['namespace']}.{wp['metadata']['name']}{TRANSLATED}",
        "root_id": spec.get("pluginName", ""),
        "vm_config": {
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": str(local_file)}},
            "environment_variables": {"key_values": env},
        },
        "failure_policy": {
            "FAIL_OPEN": "FAIL_OPEN",
            "FAIL_CLOSE": "FAIL_CLOSED",
            "FAIL_RELOAD": "FAIL_RELOAD",
        }[spec.get("failStrategy", "FAIL_CLOSE")],
    }
    if spec.get("pluginConfig"):
        config["configuration"] = {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": json.dumps(spec["pluginConfig"], separators=(",", ":")),
        }
    return {
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": wasmplugin_resource_name(wp),
        "typed_config": {"@type": WASM_HTTP if kind == "HTTP" else WASM_NETWORK, "config": config},
    }


def wasmplugin_fetch_failed(wp: dict) -> dict:
    """What istio-agent puts in the ECDS resource's place when it cannot fetch the
    module or its sha256 differs (pkg/wasm/convert.go): an RBAC filter of the same
    name, allow-all under FAIL_OPEN, deny-all otherwise."""
    allow = wp["spec"].get("failStrategy") == "FAIL_OPEN"
    prefix = "wasm-default-allow" if allow else "wasm-default-deny"
    if wasmplugin_type(wp) == "HTTP":
        typed = {"@type": RBAC_HTTP, "rules_stat_prefix": prefix, **({} if allow else {"rules": {}})}
    else:
        typed = {"@type": RBAC_NETWORK, "stat_prefix": prefix, **({} if allow else {"rules": {}})}
    return {"@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
            "name": wasmplugin_resource_name(wp), "typed_config": typed}


def _ecds_filter(wp: dict, ecds_path: Path) -> dict:
    network = wasmplugin_type(wp) == "NETWORK"
    return {
        "name": wasmplugin_resource_name(wp),
        "config_discovery": {
            # istiod: ADS with initial_fetch_timeout 0 (wait for it).
            "config_source": {
                "path_config_source": {"path": str(ecds_path)},
                "resource_api_version": "V3",
                "initial_fetch_timeout": "0s",
            },
            "type_urls": [WASM_NETWORK, RBAC_NETWORK] if network else [WASM_HTTP, RBAC_HTTP],
        },
    }


def _wasmplugin_ports(wp: dict) -> set[int] | None:
    """The ports a WasmPlugin's match names (None: every port), as istiod's matchPorts reads them."""
    ports = {p["number"] for m in wp["spec"].get("match") or [] for p in m.get("ports") or []}
    return ports or None


# Where a WasmPlugin's phase lands in a gateway's HTTP filters, between
# istiod's own (envoyfilter.gateway_http_filters): the rank of each phase and
# of the filters around it; a plugin goes after every filter of a lower rank.
PHASES = {"AUTHN": 1, "AUTHZ": 3, "STATS": 5, "UNSPECIFIED_PHASE": 6}


def _rank(f: dict) -> int:
    """Where one of istiod's filters stands among the phases."""
    typed = f.get("typed_config") or {}
    custom_rbac = typed.get("shadow_rules_stat_prefix") == EXT_AUTHZ_SHADOW_PREFIX
    if f["name"] in ("istio.metadata_exchange", "envoy.filters.http.ext_authz") or (
            f["name"] == "envoy.filters.http.rbac" and custom_rbac):
        return 0  # before every phase: the CUSTOM policy's pair
    if f["name"] == "envoy.filters.http.jwt_authn":
        return 2
    if f["name"] == "envoy.filters.http.rbac":
        return 4
    if f["name"] in ("envoy.filters.http.grpc_web", "envoy.filters.http.grpc_stats", "istio.alpn",
                     "envoy.filters.http.fault", "envoy.filters.http.cors", "istio.stats",
                     "envoy.filters.http.router"):
        return 7
    raise AssertionError(f"{f['name']}: not one of istiod's filters (insert the WasmPlugins before the EnvoyFilters)")


def _priority(wp: dict) -> int:
    return wp["spec"].get("priority", -(2 ** 31))  # unset: lowest (sortByPriority)


def _http_chain(filters: list[dict], plugins: list[tuple[dict, Path]]) -> list[dict]:
    """istiod's HTTP filters with the plugins in place: by phase, then by
    descending priority (a stable sort: equal priorities keep their order)."""
    order = sorted(range(len(plugins)), key=lambda i: (PHASES[plugins[i][0]["spec"].get(
        "phase", "UNSPECIFIED_PHASE")], -_priority(plugins[i][0])))
    ranked = [(_rank(f), f) for f in filters] + [
        (PHASES[plugins[i][0]["spec"].get("phase", "UNSPECIFIED_PHASE")], _ecds_filter(*plugins[i])) for i in order]
    return [f for _, f in sorted(ranked, key=lambda rf: rf[0])]


def insert_wasmplugins(listeners: list[dict], plugins: list[tuple[dict, Path]],
                       server_ports: dict[str, int] | None = None) -> list[dict]:
    """istiod's gateway listeners with the WasmPlugins' ECDS filters
    (`plugins`: each WasmPlugin and its ECDS file) on the listeners it built
    itself, before any EnvoyFilter patch. HTTP: in their phase among istiod's
    filters (`PHASES`; AUTHN right after a CUSTOM policy's pair), by
    descending priority within one. NETWORK: on the listeners of the ports its
    match names (every port without one), before tcp_proxy on a TCP chain
    (buildCompleteNetworkFilters) and before the HCM on an HTTP chain
    (buildGatewayTCPBasedFilterChains: a network extension precedes the HCM).

    The port a NETWORK plugin's match is compared with differs by chain
    (pilot/pkg/networking/core/gateway.go, Istio 1.30.3): on an HTTP chain the
    listener's own port, the Gateway server's port as the Service translated it
    to its targetPort (`opts.port`, resolvePorts in pilot/pkg/model/gateway.go);
    on a TCP or passthrough chain the Gateway server's port as written
    (buildGatewayNetworkFiltersFromTCPRoutes / FromTLSRoutes: server.Port.Number).
    `server_ports`: listener name -> that server port, for a TCP listener whose
    Service maps another port to it (absent: the listener's port)."""
    out = copy.deepcopy(listeners)
    http = [(wp, ecds) for wp, ecds in plugins if wasmplugin_type(wp) == "HTTP"]
    for listener in out:
        for hcm in hcms(listener, {}):
            hcm["http_filters"] = _http_chain(hcm["http_filters"], http)
    for wp, ecds_path in plugins:
        if wasmplugin_type(wp) == "HTTP":
            continue
        ports = _wasmplugin_ports(wp)
        for listener in out:
            own = listener["address"]["socket_address"]["port_value"]
            for chain in listener.get("filter_chains", []):
                filters = chain["filters"]
                at = next(i for i, f in enumerate(filters) if f["name"] in (HCM_NAME, "envoy.filters.network.tcp_proxy"))
                matched = own if filters[at]["name"] == HCM_NAME else (server_ports or {}).get(listener["name"], own)
                if ports is None or matched in ports:
                    filters.insert(at, _ecds_filter(wp, ecds_path))
    return out


def ecds_over_files(listeners: list[dict], paths: dict[str, Path]) -> list[dict]:
    """The listeners with every ECDS filter that names ADS as its config source
    (an EnvoyFilter REPLACE copies istiod's own entry: `ads: {}`) reading its
    resource from the file `paths` gives for its name instead: the harness
    has no ADS server, and file-based ECDS stands in for it (as `_ecds_filter`).
    Other filters that ask ADS (the EnvoyFilter form's) are left to
    `gateway_bootstrap`, which serves the EnvoyFilters' resources."""
    out = copy.deepcopy(listeners)
    for listener in out:
        for hcm in hcms(listener, {}):
            for f in hcm["http_filters"]:
                source = (f.get("config_discovery") or {}).get("config_source") or {}
                if "ads" in source and f["name"] in paths:
                    del source["ads"]
                    source["path_config_source"] = {"path": str(paths[f["name"]])}
    return out


def insert_wasmplugin(listeners: list[dict], wp: dict, ecds_path: Path,
                      server_ports: dict[str, int] | None = None) -> list[dict]:
    """`insert_wasmplugins` with one WasmPlugin."""
    return insert_wasmplugins(listeners, [(wp, ecds_path)], server_ports)


def write_ecds(path: Path, extension_configs: list[dict]) -> None:
    path.write_text(yaml.safe_dump({"version_info": "1", "resources": extension_configs}, sort_keys=False))
