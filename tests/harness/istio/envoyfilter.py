"""EnvoyFilter patches applied the way istiod's envoyfilter/listener_patch.go
does for context GATEWAY: sub-resource patches (HTTP_FILTER ...) on the
listeners istiod generated first (shaped like its own: 0.0.0.0_<port>, HCM with
cors, fault, router), LISTENER ADD appended afterwards; and which gateway pods
an EnvoyFilter or WasmPlugin applies to. Patch values are used exactly as written."""
from __future__ import annotations

import copy
import re

from tests.harness.istio.files import POD_LABELS, PROXY_VERSION

WASM_HTTP = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
WASM_NETWORK = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm"
RBAC_HTTP = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
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


# -- istiod: EnvoyFilter patches for a gateway --------------------------------------
def gateway_listener(port: int, *, tcp: bool = False) -> dict:
    """A listener shaped like the ones istiod builds for a Gateway server on `port`."""
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
                    "http_filters": [
                        {"name": "envoy.filters.http.cors", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}},
                        {"name": "envoy.filters.http.fault", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}},
                        {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                    ],
                },
            }
        ]
    return {
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": filters}],
    }


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


def apply_envoyfilters(listeners: list[dict], envoyfilters: list[dict], labels: dict = POD_LABELS,
                       proxy_version: str = PROXY_VERSION) -> list[dict]:
    """The listeners after istiod applied `envoyfilters` for a gateway with `labels`
    running Istio `proxy_version`, in order of spec.priority as istiod sorts them.

    Implements what the files here use (HTTP_FILTER INSERT_BEFORE/ADD/REPLACE,
    LISTENER ADD, and CLUSTER ADD: see `added_clusters`) and refuses anything
    else, so a change of operation cannot pass unnoticed.
    """
    out = copy.deepcopy(listeners)
    ordered = sorted(envoyfilters, key=lambda ef: ef["spec"].get("priority", 0))
    patches = [p for ef in ordered if _selected(ef, labels) for p in ef["spec"]["configPatches"]
               if _context_ok(p.get("match", {}), proxy_version)]
    for p in patches:
        op = p["patch"]["operation"]
        if p["applyTo"] in ("LISTENER", "CLUSTER"):
            if op != "ADD":
                raise NotImplementedError(f"{p['applyTo']} {op}")
            continue
        if p["applyTo"] == "NETWORK_FILTER":
            _patch_network_filters(out, p)
            continue
        if p["applyTo"] != "HTTP_FILTER":
            raise NotImplementedError(p["applyTo"])
        sub = ((((p["match"].get("listener") or {}).get("filterChain") or {}).get("filter") or {}).get("subFilter") or {}).get("name")
        for listener in out:
            if not _listener_ok(listener, p["match"]):
                continue
            for hcm in hcms(listener, p["match"]):
                filters = hcm["http_filters"]
                value = copy.deepcopy(p["patch"]["value"])
                if op == "ADD":
                    filters.append(value)
                elif op == "INSERT_BEFORE":
                    at = next((i for i, f in enumerate(filters) if f["name"] == sub), None) if sub else 0
                    if at is not None:
                        filters.insert(at, value)
                elif op == "REPLACE":
                    # istiod replaces the filter the match names (none named: no-op, listener_patch.go).
                    filters[:] = [copy.deepcopy(value) if sub and f["name"] == sub else f for f in filters]
                else:
                    raise NotImplementedError(f"HTTP_FILTER {op}")
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
