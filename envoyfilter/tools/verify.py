#!/usr/bin/env python3
"""Preflight for drain-gate on an Istio gateway: reads what Envoy runs and what
the kubelet will do, prints one line per check, exits 1 if any check fails.

  # what the gateway's Envoy runs (admin /config_dump), pod by pod, through
  # pilot-agent (curl is not in -distroless images):
  kubectl -n istio-system exec POD -c istio-proxy -- pilot-agent request GET config_dump \\
    | python3 verify.py --config-dump -
  # also Envoy's stats (an ECDS filter whose configuration never loaded)
  kubectl -n istio-system exec POD -c istio-proxy -- pilot-agent request GET stats \\
    | python3 verify.py --stats -
  # the objects the kubelet and the API server act on (JSON only — standard
  # library — so convert YAML with kubectl): the workload, and optionally its
  # Service(s), PodDisruptionBudget(s), the Nodes and the injector's ConfigMap
  kubectl -n istio-system get deploy/istio-ingressgateway svc/istio-ingressgateway pdb/drain-gate -o json \\
    | python3 verify.py --pod-spec -
  helm template ... | kubectl annotate --local -f - -o json drain-gate.io/verify=render \\
    | python3 verify.py --pod-spec -

Envoy (--config-dump FILE|URL|-):
  * every HTTP listener but the health listener (and Istio's own 15021/15090)
    has the drain-gate traffic filter before its router, FAIL_OPEN, and as its
    first HTTP filter: a filter in front of it that can hold a request (an
    authorization call, a JWKS fetch, a delay) is named as a failure, one that
    never does (Istio's metadata exchange, ALPN and stats filters, RBAC, gRPC
    stats, CORS) as a pass;
  * every TCP or TLS-passthrough filter chain (tcp_proxy) has the drain-gate
    TCP filter (role traffic_tcp) before tcp_proxy, FAIL_OPEN, the health vm_id;
    no HTTP chain has one (it would count idle keep-alive connections);
  * each filter's configuration is read where Envoy has it: inline, or over
    ECDS (the EnvoyFilter form's EXTENSION_CONFIG patches, a WasmPlugin); a
    drain-gate ECDS filter that received none is named (it runs its
    default_config, which counts nothing);
  * a WasmPlugin's ECDS filter that istio-agent replaced by an RBAC stand-in (a
    module it could not fetch, or whose sha256 differs) is named as the cause;
  * the health listener on --health-port exists, its drain-gate filter is
    FAIL_CLOSED, falls back (no configuration loaded) to nothing that answers
    200, and its routes end in a catch-all 503;
  * traffic and health filters share one vm_id (shared data is per vm_id);
  * the cluster rotate_connections names exists and dials the address and port
    Envoy's admin listens on (the bootstrap's);
  * no listener update was rejected (a wasm that cannot load makes Envoy refuse
    the whole update, whatever the failure policy).
Envoy (--stats FILE|URL, admin /stats, optional): every ECDS filter has an
  accepted configuration. The config dump shows an ECDS filter as received
  even when Envoy refused it; a filter that never loaded one runs its
  default_config (the chart's: allow-all, counting nothing; the health
  listener's requests then meet its catch-all 503) or, without one, answers
  500 to every request of its listeners.
Pod (--pod-spec FILE|-), container istio-proxy:
  * the pods carry the label the EnvoyFilters select (--pod-selector) and
    istio-proxy mounts the module where they load it (--wasm-path);
  * a preStop hook that is drain-gate's (curl POST /drain?wait=closed, or
    httpGet /prestop), a readiness probe on --health-port, no liveness probe
    on it, and no other container claiming that port (the sidecar design's hc);
  * with the injector's ConfigMap (istio-sidecar-injector[-REV]) given: the
    mesh's global.proxy.lifecycle does not merge a second handler into a hook
    (the API server refuses such a pod);
  * a nodeSelector or required nodeAffinity pins the pods to the LB's nodes;
    with Nodes given, exactly one fitting node per replica, and with
    --lb-nodes, exactly the LB's servers;
  * terminationGracePeriodSeconds >= drain_timeout + the longest CLOSING
    + scrape_interval + 5 s hold margin + terminationDrainDuration + 5 s spare; curl's --max-time
    of an exec preStop between the hold and the grace period;
  * no rollout that deadlocks: one pod per node enforced by required
    anti-affinity with maxSurge > 0, maxUnavailable 0 needs a node the pods
    fit (labels, required node affinity, taints) beyond one per replica for
    the surge pod, judged from the Nodes given (none given: it fails); a
    DoNotSchedule topology spread on the hostname, the Gateway API form's, is
    one pod per node without that deadlock;
  * every Service and PodDisruptionBudget given selects the pods (a selector
    key the pod template lacks selects nothing), a Service reaches the health
    port, names only ports the pod has, and keeps externalTrafficPolicy Local;
    no pod is under two PodDisruptionBudgets.
Against the LB's fingerprint (--fingerprint FILE, what `prove.py --fingerprint
--json` wrote): the configuration's lb_fall is the LB's, lb_buffer (with
close_after lb_observed_down: lb_down_timeout) and drain_timeout at least the
advice's, draining_new_requests refuse only where the LB resends refusals and
nothing that ran, refused_requests no wider and refuse_with as measured, and
every workload's terminationGracePeriodSeconds at least the advice's; each
setting that falls short is named, with by how much.
The timings come from the health filter's configuration in the config dump,
else from --plugin-config JSON, else from the drain-gate chart's health
listener among the --pod-spec documents (helm template ... --show-only
templates/health-listener.yaml), else drain-gate's defaults.

Standard library only: run it with any python3 >= 3.8.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import urllib.request

WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
HCM_TYPE = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
            ".HttpConnectionManager")
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
NETWORK_WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm"
TCP_PROXY_TYPE = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
# What istio-agent hands Envoy instead of a WasmPlugin's module when it cannot
# fetch it or its sha256 does not match (pkg/wasm/convert.go): an allow-all
# RBAC filter under FAIL_OPEN, a deny-all one otherwise, under the same name.
RBAC_TYPES = ("type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
              "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC")
ISTIO_RBAC_STAND_INS = {"wasm-default-allow": "an allow-all", "wasm-default-deny": "a deny-all"}
ISTIO_OWN_PORTS = (15021, 15090)
DEFAULTS = {"drain_timeout": "120s", "lb_buffer": "10s", "close_after": "lb_buffer", "lb_down_timeout": "60s",
            "scrape_interval": "0s"}
# drain-gate's own default for rotate_connections (src/gate/rotation/mod.rs).
DEFAULT_ROTATION_CLUSTER = "drain_gate_envoy_admin"
# The drain-gate chart's podSelector and wasm.path (envoyfilter/chart/values.yaml).
DEFAULT_SELECTOR = ("drain-gate.io/enabled", "true")
WASM_PATH = "/etc/drain-gate/drain_gate.wasm"
HOLD_MARGIN_S = 5
SPARE_S = 5


class Report:
    """One line per check; remembers whether any failed."""

    def __init__(self, out=sys.stdout):
        self.out = out
        self.failed = 0

    def check(self, ok: bool, name: str, detail: str) -> bool:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", file=self.out)
        self.failed += 0 if ok else 1
        return ok

    def warn(self, name: str, detail: str) -> None:
        print(f"WARN {name}: {detail}", file=self.out)


# -- input ------------------------------------------------------------------------------
def read_source(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    if re.match(r"^https?://", source):
        with urllib.request.urlopen(source, timeout=10) as r:  # noqa: S310 (operator-given admin URL)
            return r.read().decode()
    with open(source, encoding="utf-8") as f:
        return f.read()


def json_documents(text: str) -> list:
    """One or more JSON documents, back to back (kubectl prints one per object)."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    text = text.strip()
    while at < len(text):
        try:
            doc, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as e:
            hint = " (YAML? convert it with `kubectl ... -o json`)" if at == 0 else ""
            raise SystemExit(f"verify.py: not JSON at character {e.pos}{hint}: {e.msg}") from None
        docs.append(doc)
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return docs


def duration_s(text: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", str(text))
    if not m:
        raise SystemExit(f"verify.py: {text!r} is not a drain-gate duration")
    return int(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m[2]]


# -- Envoy's /config_dump -----------------------------------------------------------------
def listeners(dump: dict) -> list[tuple[dict, str | None]]:
    """(listener, error of its last rejected update or None) for every listener
    (Envoy lists a rejected listener twice, once without a name: one entry each)."""
    out, seen = [], set()
    for config in dump.get("configs", []):
        if not config.get("@type", "").endswith("ListenersConfigDump"):
            continue
        out += [(s["listener"], None) for s in config.get("static_listeners", [])]
        for d in config.get("dynamic_listeners", []):
            state = d.get("active_state") or d.get("warming_state")
            failed = d.get("error_state") or {}
            name = d.get("name") or (failed.get("failed_configuration") or {}).get("name", "?")
            if name in seen:
                continue
            seen.add(name)
            error = failed.get("details")
            if state:
                out.append((state["listener"], error))
            elif error:
                out.append(({"name": name}, error))
    return out


def ecds_configs(dump: dict) -> tuple[dict[str, dict], dict[str, str]]:
    """(ECDS filter name -> its typed_config, name -> error of its last refused
    update): how a WasmPlugin reaches Envoy."""
    configs, errors = {}, {}
    for config in dump.get("configs", []):
        if config.get("@type", "").endswith("EcdsConfigDump"):
            for f in config.get("ecds_filters", []):
                ext = f.get("ecds_filter", {})
                failed = f.get("error_state") or {}
                name = ext.get("name") or (failed.get("failed_configuration") or {}).get("name", "?")
                if ext:
                    configs[name] = ext.get("typed_config", {})
                if failed.get("details"):
                    errors[name] = failed["details"]
    return configs, errors


def route_configs(dump: dict) -> dict[str, dict]:
    out = {}
    for config in dump.get("configs", []):
        if config.get("@type", "").endswith("RoutesConfigDump"):
            for r in config.get("static_route_configs", []) + config.get("dynamic_route_configs", []):
                rc = r.get("route_config", {})
                out[rc.get("name")] = rc
    return out


def port_of(listener: dict) -> int | None:
    return ((listener.get("address") or {}).get("socket_address") or {}).get("port_value")


def filter_chains(listener: dict) -> list[dict]:
    chains = list(listener.get("filter_chains", []))
    if listener.get("default_filter_chain"):
        chains.append(listener["default_filter_chain"])
    return chains


def hcms(listener: dict):
    for chain in filter_chains(listener):
        for f in chain.get("filters", []):
            if (f.get("typed_config") or {}).get("@type") == HCM_TYPE:
                yield f["typed_config"]


def typed_config(f: dict, ecds: dict) -> dict:
    """A filter's configuration: inline, or (ECDS) the one Envoy received by the filter's name."""
    return f.get("typed_config") or (ecds.get(f.get("name")) if "config_discovery" in f else None) or {}


def from_wasmplugin(f: dict) -> bool:
    """A WasmPlugin's ECDS filter: istiod names it after the TrafficExtension it
    translates the WasmPlugin into (extensions.istio.io/trafficextension/...)."""
    return "config_discovery" in f and str(f.get("name", "")).startswith("extensions.istio.io/")


# drain-gate's ECDS filters: the chart's (drain-gate, drain-gate-tcp,
# drain-gate-health) and its WasmPlugins' (<namespace>.drain-gate-...).
DRAIN_GATE_NAME = re.compile(r"(^|[./])drain-gate")


def all_filters(listener: dict):
    """Every network filter of a listener, and every HTTP filter of its connection managers."""
    for chain in filter_chains(listener):
        for f in chain.get("filters", []):
            yield f
            if (f.get("typed_config") or {}).get("@type") == HCM_TYPE:
                yield from f["typed_config"].get("http_filters", [])


def check_ecds_received(report: Report, all_listeners, ecds: dict) -> None:
    """A drain-gate filter that asks for its configuration over ECDS and has
    received none: istiod does not serve that name (the EnvoyFilter's
    EXTENSION_CONFIG patch is missing, or not for this proxy's version)."""
    missing = sorted({f.get("name") for listener, _ in all_listeners for f in all_filters(listener)
                      if "config_discovery" in f and f.get("name") not in ecds
                      and DRAIN_GATE_NAME.search(str(f.get("name")))})
    for name in missing:
        report.check(False, "filter update", f"ECDS filter {name}: no configuration received: it runs its "
                     "default_config, which counts nothing (istiod serves it from the EnvoyFilter's "
                     "EXTENSION_CONFIG patch of that name: is it applied, for this proxy's version?)")


def check_health_fallback(report: Report, name: str, hcm: dict, ecds: dict) -> None:
    """Without a configuration it loaded, an ECDS health filter runs its
    default_config: it must never answer 200 itself (RBAC lets the request on
    to the catch-all 503, or refuses it; none: Envoy answers 500)."""
    for f in hcm.get("http_filters", []):
        plugin = typed_config(f, ecds).get("config", {})
        if "config_discovery" not in f or role_of(plugin) != "health":
            continue
        default = f["config_discovery"].get("default_config")
        kind = (default or {}).get("@type", "")
        ok = default is None or kind in RBAC_TYPES
        report.check(ok, "health fallback", f"listener {name}: without a configuration loaded, " + (
            "Envoy answers 500" if default is None else f"{kind.rsplit('.', 1)[-1]} lets requests on to the "
            "catch-all 503 (or refuses them)" if ok else
            f"its default_config {kind} answers in drain-gate's place: the LB could read 200 from a gateway "
            "that does not run drain-gate"))


def check_stand_ins(report: Report, where: str, filters: list[dict], ecds: dict) -> None:
    """A WasmPlugin's ECDS filter that holds istio-agent's RBAC stand-in instead of the module."""
    for f in filters:
        typed = typed_config(f, ecds)
        prefix = typed.get("rules_stat_prefix") or typed.get("stat_prefix")
        if "config_discovery" in f and typed.get("@type") in RBAC_TYPES and prefix in ISTIO_RBAC_STAND_INS:
            report.check(False, "wasmplugin module", f"{where}: ECDS filter {f.get('name')} is "
                         f"{ISTIO_RBAC_STAND_INS[prefix]} RBAC filter: istio-agent could not fetch the module or its "
                         "sha256 did not match, and put this in its place (it counts nothing)")


def drain_gate_filters(hcm: dict, ecds: dict) -> list[tuple[int, dict, str]]:
    """(position, wasm PluginConfig, role) of each drain-gate filter of an HCM."""
    found = []
    for i, f in enumerate(hcm.get("http_filters", [])):
        typed = typed_config(f, ecds)
        if typed.get("@type") != WASM_TYPE:
            continue
        plugin = typed.get("config", {})
        role = role_of(plugin)
        if role in ("traffic", "health"):
            found.append((i, plugin, role))
    return found


def role_of(plugin: dict) -> str | None:
    """The `role` of a wasm PluginConfig's drain-gate configuration, if any."""
    try:
        return json.loads((plugin.get("configuration") or {}).get("value", "{}")).get("role")
    except (json.JSONDecodeError, AttributeError):
        return None


def router_position(hcm: dict) -> int | None:
    for i, f in enumerate(hcm.get("http_filters", [])):
        if (f.get("typed_config") or {}).get("@type") == ROUTER_TYPE:
            return i
    return None


def has_catch_all_503(hcm: dict, routes: dict) -> bool:
    rc = hcm.get("route_config") or routes.get((hcm.get("rds") or {}).get("route_config_name"), {})
    for vh in rc.get("virtual_hosts", []):
        if "*" not in vh.get("domains", []):
            continue
        last = (vh.get("routes") or [{}])[-1]
        if last.get("match") == {"prefix": "/"} and (last.get("direct_response") or {}).get("status") == 503:
            return True
    return False


def policy(plugin: dict) -> str:
    # Envoy's default (UNSPECIFIED) is fail closed.
    return plugin.get("failure_policy") or "FAIL_CLOSED"


def check_health(report: Report, all_listeners, health_port: int, ecds: dict, routes: dict) -> dict | None:
    """The health listener's drain-gate PluginConfig, or None."""
    found = [lst for lst, _ in all_listeners if port_of(lst) == health_port]
    if not report.check(bool(found), "health listener", f"a listener on :{health_port}" if found else
                        f"no listener on :{health_port} (the health EnvoyFilter is missing or was rejected)"):
        return None
    listener = found[0]
    name = listener.get("name")
    plugins = [(p, role) for hcm in hcms(listener) for _, p, role in drain_gate_filters(hcm, ecds)]
    health = [p for p, role in plugins if role == "health"]
    if not report.check(len(health) == 1, "health filter", f"listener {name}: "
                        f"{'one drain-gate health filter' if len(health) == 1 else f'{len(health)} health filters'}"):
        return None
    report.check(policy(health[0]) == "FAIL_CLOSED", "health failure_policy",
                 f"listener {name}: {policy(health[0])} (want FAIL_CLOSED)")
    for hcm in hcms(listener):
        check_health_fallback(report, name, hcm, ecds)
    catch_all = all(has_catch_all_503(h, routes) for h in hcms(listener))
    report.check(catch_all, "health catch-all 503", f"listener {name}: " + (
        "routes end in a catch-all direct 503" if catch_all else "no catch-all 503 route"))
    report.check(not any(role == "traffic" for _, role in plugins), "health has no traffic role",
                 f"listener {name}")
    return health[0]


def check_traffic(report: Report, all_listeners, health_port: int, ecds: dict, vm_id) -> int:
    """Checks every HTTP listener but the health one; returns how many."""
    seen = 0
    for listener, _ in all_listeners:
        port, name = port_of(listener), listener.get("name")
        if port == health_port or port in ISTIO_OWN_PORTS:
            continue
        for hcm in hcms(listener):
            seen += 1
            router = router_position(hcm)
            traffic = [(i, p) for i, p, role in drain_gate_filters(hcm, ecds) if role == "traffic"]
            before = [p for i, p in traffic if router is not None and i < router]
            check_counting_filter(report, before, f"listener {name}", ("traffic", "traffic", "the router"), vm_id)
            check_first_filter(report, f"listener {name}", hcm, ecds)
            check_stand_ins(report, f"listener {name}", hcm.get("http_filters", []), ecds)
    return seen


# HTTP filters that never hold a request: they decide from its headers at once,
# then continue or answer it themselves. In front of drain-gate they cost a
# stream nothing: it reaches drain-gate in the same dispatch.
NEVER_HOLD = {
    # istio-proxy's metadata exchange (Istio's istio.metadata_exchange, first in
    # every chain istiod builds): source/extensions/filters/http/peer_metadata,
    # decodeHeaders reads and writes headers and continues.
    "type.googleapis.com/io.istio.http.peer_metadata.Config": "reads and writes headers, then continues",
    # Its ALPN override and its stats filter (istio.alpn, istio.stats: alpn_filter.cc, istio_stats.cc).
    "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig": "sets the upstream ALPN",
    "type.googleapis.com/stats.PluginConfig": "counts the request",
    # Envoy's RBAC filter (a CUSTOM AuthorizationPolicy's shadow RBAC only marks the
    # requests its ext_authz checks), gRPC stats and CORS filters.
    RBAC_TYPES[0]: "decides at once: continues, or answers 403 itself",
    "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig": "counts gRPC messages",
    "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors": "continues, or answers a preflight itself",
}


def filter_type(f: dict, ecds: dict) -> str:
    """A filter's type: its typed_config's, a TypedStruct's inner one (Istio's own filters)."""
    typed = typed_config(f, ecds)
    return typed.get("type_url") or typed.get("@type") or ""


def check_first_filter(report: Report, where: str, hcm: dict, ecds: dict) -> None:
    """drain-gate is the first HTTP filter of a traffic connection manager.
    Envoy creates a wasm filter's stream when the request reaches that filter:
    a request an earlier filter holds (an authorization call, a JWKS fetch, a
    rate-limit call, an injected delay, a buffered body) is not counted while
    it is held, and a drain begun meanwhile flips with it in flight."""
    filters = hcm.get("http_filters", [])
    traffic = [i for i, _, role in drain_gate_filters(hcm, ecds) if role == "traffic"]
    if not traffic:
        return  # the traffic filter check fails it
    front = filters[:traffic[0]]
    names = ", ".join(f.get("name", "?") for f in front)
    holding = [f.get("name", "?") for f in front if filter_type(f, ecds) not in NEVER_HOLD]
    if not front:
        report.check(True, "first filter", f"{where}: drain-gate is the first HTTP filter")
    elif not holding:
        why = "; ".join(f"{f.get('name')} {NEVER_HOLD[filter_type(f, ecds)]}" for f in front)
        report.check(True, "first filter", f"{where}: before drain-gate only {names}, which never hold a "
                     f"request ({why})")
    else:
        wasmplugin = from_wasmplugin(filters[traffic[0]])
        remedy = ("the WasmPlugin form cannot come first: a CUSTOM AuthorizationPolicy's filters and every "
                  "EnvoyFilter patch stand before the earliest WasmPlugin phase (AUTHN); use the EnvoyFilter "
                  "form (form: envoyfilter)" if wasmplugin else
                  "the drain-gate chart inserts the traffic filter first (INSERT_FIRST at priority 2147483647): "
                  "an older chart, or another EnvoyFilter of that priority applied after it, put these in front")
        report.check(False, "first filter", f"{where}: before drain-gate: {names}; {', '.join(holding)} can hold "
                     "a request, which is not counted until it is let go, and a drain begun meanwhile flips with "
                     f"it in flight ({remedy})")


def check_counting_filter(report: Report, found: list[dict], where: str, kind: tuple[str, str, str], vm_id) -> None:
    """At least one drain-gate counting filter (`found`) before its anchor, each
    FAIL_OPEN, in the health role's vm_id. `kind`: (check name, what the filter
    is called, the anchor). More than one (a canary WasmPlugin beside the
    fleet's) counts each stream that many times: the flip still comes at zero."""
    check, called, anchor = kind
    if not report.check(bool(found), f"{check} filter", f"{where}: " + (
            f"drain-gate {called} filter before {anchor}" if len(found) == 1 else
            f"{len(found)} drain-gate {called} filters before {anchor}" if found else
            f"0 drain-gate {called} filters before {anchor} (want 1)")):
        return
    if len(found) > 1:
        report.warn(f"{check} filter", f"{where}: {len(found)} drain-gate {called} filters count each one "
                    "that many times (a canary WasmPlugin beside the fleet's?)")
    for plugin in found:
        report.check(policy(plugin) == "FAIL_OPEN", f"{check} failure_policy",
                     f"{where}: {policy(plugin)} (want FAIL_OPEN)")
        got = (plugin.get("vm_config") or {}).get("vm_id", "")
        if vm_id is not None:
            report.check(got == vm_id, "vm_id", f"{where}: {check} vm_id {got!r}"
                         + (" = health" if got == vm_id else f" != health vm_id {vm_id!r}"))


def tcp_roles(filters: list[dict], ecds: dict) -> list[dict]:
    """The drain-gate TCP (traffic_tcp) PluginConfigs among network filters, inline or ECDS."""
    return [typed_config(f, ecds).get("config", {}) for f in filters
            if typed_config(f, ecds).get("@type") == NETWORK_WASM_TYPE
            and role_of(typed_config(f, ecds).get("config", {})) == "traffic_tcp"]


def check_tcp(report: Report, all_listeners, health_port: int, ecds: dict, vm_id) -> None:
    """Checks every filter chain that ends in tcp_proxy (TCP and TLS-passthrough
    servers), and that no HTTP chain counts its connections."""
    for listener, _ in all_listeners:
        port, name = port_of(listener), listener.get("name")
        if port == health_port or port in ISTIO_OWN_PORTS:
            continue
        for chain in filter_chains(listener):
            filters = chain.get("filters", [])
            types = [typed_config(f, ecds).get("@type") for f in filters]
            where = f"listener {name}" + (f" chain {chain['name']}" if chain.get("name") else "")
            if HCM_TYPE in types:
                if tcp_roles(filters[:types.index(HCM_TYPE)], ecds):
                    report.check(False, "tcp filter placement", f"{where}: a drain-gate TCP filter before the "
                                 "HTTP connection manager: each keep-alive connection counts as in flight until it "
                                 "closes, so a drain waits for idle connections (a WasmPlugin of type NETWORK "
                                 "needs match.ports: the TCP and passthrough ports only)")
            if TCP_PROXY_TYPE not in types:
                continue
            at = types.index(TCP_PROXY_TYPE)
            check_counting_filter(report, tcp_roles(filters[:at], ecds), where, ("tcp", "TCP", "tcp_proxy"), vm_id)
            check_stand_ins(report, where, filters[:at], ecds)


def verify_config_dump(report: Report, dump: dict, health_port: int) -> dict | None:
    """All Envoy checks; returns the health role's plugin configuration (for the timings)."""
    all_listeners = listeners(dump)
    (ecds, ecds_errors), routes = ecds_configs(dump), route_configs(dump)
    for listener, error in all_listeners:
        if error:
            report.check(False, "listener update", f"listener {listener.get('name')}: last update rejected: "
                         f"{error.splitlines()[0][:300]}")
    for name, error in ecds_errors.items():
        report.check(False, "filter update", f"ECDS filter {name}: last update rejected: "
                     f"{error.splitlines()[0][:300]}")
    check_ecds_received(report, all_listeners, ecds)
    health = check_health(report, all_listeners, health_port, ecds, routes)
    vm_id = (health.get("vm_config") or {}).get("vm_id", "") if health else None
    seen = check_traffic(report, all_listeners, health_port, ecds, vm_id)
    check_tcp(report, all_listeners, health_port, ecds, vm_id)
    report.check(seen > 0, "traffic listeners", f"{seen} HTTP listener(s) besides the health listener")
    if not health:
        return None
    try:
        config = json.loads(health["configuration"]["value"])
    except (KeyError, json.JSONDecodeError):
        config = {}
    check_rotation(report, dump, config)
    return config


def clusters(dump: dict) -> dict[str, dict]:
    out = {}
    for config in dump.get("configs", []):
        if config.get("@type", "").endswith("ClustersConfigDump"):
            for c in config.get("static_clusters", []) + config.get("dynamic_active_clusters", []):
                out[c["cluster"]["name"]] = c["cluster"]
    return out


def bootstrap_admin(dump: dict) -> tuple[str, int] | None:
    for config in dump.get("configs", []):
        if config.get("@type", "").endswith("BootstrapConfigDump"):
            addr = ((config.get("bootstrap", {}).get("admin") or {}).get("address") or {}).get("socket_address")
            if addr:
                return addr.get("address"), addr.get("port_value")
    return None


def host_port(address: str, port) -> str:
    return f"[{address}]:{port}" if ":" in str(address) else f"{address}:{port}"


def check_rotation(report: Report, dump: dict, config: dict) -> None:
    """The cluster the health role rotates connections through (rotate_connections)
    dials the address and port Envoy's admin listens on (Istio binds it to ::1 in
    IPv6-only pods and lets proxyAdminPort move it)."""
    name = config.get("rotate_connections", DEFAULT_ROTATION_CLUSTER)
    if name is False:
        return
    name = DEFAULT_ROTATION_CLUSTER if name is True else name
    admin, cluster = bootstrap_admin(dump), clusters(dump).get(name)
    if cluster is None:
        report.check(False, "rotation cluster", f"rotate_connections names cluster {name!r}, which Envoy does not "
                     "have: a drain starts without rotating the keep-alive connections")
        return
    dials = [host_port(a["address"], a.get("port_value")) for group in
             (cluster.get("load_assignment") or {}).get("endpoints", []) for ep in group.get("lb_endpoints", [])
             for a in [(ep.get("endpoint") or {}).get("address", {}).get("socket_address") or {}] if a]
    if admin is None:
        report.warn("rotation cluster", f"cluster {name} dials {', '.join(dials)}; the dump has no bootstrap to "
                    "compare Envoy's admin address with")
        return
    want = host_port(*admin)
    report.check(dials == [want], "rotation cluster", f"cluster {name} dials {', '.join(dials) or 'nothing'}"
                 + (" = Envoy's admin" if dials == [want] else f", Envoy's admin listens on {want}: the rotation "
                    "of a drain fails (rotate_connections: prometheus_stats, the bootstrap's own cluster to "
                    "the admin, follows its address and port)"))


def verify_stats(report: Report, text: str) -> None:
    """ECDS filters with no accepted configuration; refused updates since start."""
    stats = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    prefix = "extension_config_discovery."
    for key, value in sorted(stats.items()):
        if not (key.startswith(prefix) and key.endswith(".version_text")):
            continue
        name = key[len(prefix):-len(".version_text")].split(".", 1)[-1]
        fails = int(stats.get(key[:-len("version_text")] + "config_fail", "0"))
        accepted = value.strip('"') != ""
        report.check(accepted, "filter update", f"ECDS filter {name}: " + (
            f"configuration version {value} accepted" if accepted else
            "no configuration accepted (every request on its listeners gets 500)"))
        if accepted and fails:
            report.warn("filter update", f"ECDS filter {name}: {fails} update(s) refused since start; "
                        "it runs the last accepted one")
    rejected = int(stats.get("listener_manager.lds.update_rejected", "0"))
    if rejected:
        report.warn("listener update", f"{rejected} LDS update(s) rejected since start")


# -- the pod spec -----------------------------------------------------------------------------
WORKLOAD_KINDS = ("Pod", "Deployment", "DaemonSet", "StatefulSet")
INJECTOR = "istio-sidecar-injector"
HANDLERS = ("exec", "httpGet", "tcpSocket", "sleep")


def kinds(docs: list, wanted: tuple[str, ...]) -> list[dict]:
    """Every object of the `wanted` kinds in the documents (Lists opened)."""
    out = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind", "").endswith("List"):
            out += kinds(doc.get("items", []), wanted)
        elif doc.get("kind") in wanted:
            out.append(doc)
    return out


def workloads(docs: list) -> list[dict]:
    """Every Pod / Deployment / DaemonSet / StatefulSet in the documents (Lists opened)."""
    return kinds(docs, WORKLOAD_KINDS)


def pod_spec(workload: dict) -> dict:
    spec = workload.get("spec", {})
    return spec if workload["kind"] == "Pod" else spec.get("template", {}).get("spec", {})


def pod_meta(workload: dict) -> dict:
    return workload.get("metadata", {}) if workload["kind"] == "Pod" else \
        workload.get("spec", {}).get("template", {}).get("metadata", {})


def pod_annotations(workload: dict) -> dict:
    return pod_meta(workload).get("annotations") or {}


def pod_labels(workload: dict) -> dict:
    return pod_meta(workload).get("labels") or {}


def name_of(obj: dict) -> str:
    return f"{obj['kind']} {obj.get('metadata', {}).get('name')}"


def labels_text(labels: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"


def probe_port(probe: dict, container: dict):
    port = ((probe or {}).get("httpGet") or {}).get("port")
    for p in container.get("ports") or []:
        if port == p.get("name"):
            return p.get("containerPort")
    return port


def drain_duration_s(workload: dict) -> float:
    """terminationDrainDuration from proxy.istio.io/config (Istio's default 5s)."""
    m = re.search(r"terminationDrainDuration:\s*\"?(\d+(?:\.\d+)?)s", pod_annotations(workload).get(
        "proxy.istio.io/config", ""))
    return float(m[1]) if m else 5.0


def timings(config: dict) -> tuple[float, float, float]:
    """(drain_timeout, longest CLOSING, scrape_interval: the preStop answer's wait after CLOSED) in seconds."""
    c = {**DEFAULTS, **(config or {})}
    closing = duration_s(c["lb_buffer"])
    if c["close_after"] == "lb_observed_down":
        closing = max(closing, duration_s(c["lb_down_timeout"]))
    return duration_s(c["drain_timeout"]), closing, duration_s(c["scrape_interval"])


def handlers(hook: dict | None) -> list[str]:
    """The handler types a lifecycle hook sets (the API server accepts exactly one)."""
    return [h for h in HANDLERS if (hook or {}).get(h) is not None]


def is_drain_gate_prestop(pre: dict, health_port: int) -> bool:
    """curl POST :<health>/drain?wait=closed (exec) or GET /prestop on the health port (httpGet)."""
    command = " ".join(str(a) for a in ((pre.get("exec") or {}).get("command") or []))
    get = pre.get("httpGet") or {}
    return bool(re.search(rf":{health_port}/drain\?wait=closed\b", command)) or (
        get.get("path") == "/prestop" and get.get("port") == health_port)


def hook_text(pre: dict) -> str:
    if pre.get("exec"):
        return "exec " + " ".join(str(a) for a in pre["exec"].get("command") or [])
    return ", ".join(f"{h} {json.dumps(pre[h], sort_keys=True)}" for h in handlers(pre)) or "empty"


def check_hook_and_probes(report: Report, name: str, proxy: dict, health_port: int) -> None:
    pre = (proxy.get("lifecycle") or {}).get("preStop")
    if report.check(bool(pre), "preStop", f"{name}: " + (f"{', '.join(handlers(pre))} hook" if pre else
                                                         "container istio-proxy has no lifecycle.preStop")):
        ours = is_drain_gate_prestop(pre, health_port)
        report.check(ours, "drain-gate preStop", f"{name}: " + (
            "the hook drains through drain-gate" if ours else
            f"istio-proxy's preStop is {hook_text(pre)!r}, not drain-gate's (curl POST "
            f":{health_port}/drain?wait=closed, or httpGet /prestop): an old drain script (the sidecar "
            "design's drain.sh) still runs instead of drain-gate's drain"))
    ready = probe_port(proxy.get("readinessProbe"), proxy)
    report.check(ready == health_port, "readiness", f"{name}: readinessProbe port {ready} "
                 f"(want httpGet :{health_port})")
    if probe_port(proxy.get("livenessProbe"), proxy) == health_port:
        report.warn("liveness", f"{name}: a liveness probe on :{health_port} restarts every gateway pod "
                    "whose health listener is missing or rejected (envoyfilter/docs/counting.md, \"No liveness probe\")")


def check_health_port_owner(report: Report, name: str, spec: dict, health_port: int) -> None:
    """No container but istio-proxy claims the health port (a port, a host port, a probe)."""
    others = []
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if c.get("name") == "istio-proxy":
            continue
        claims = [f"containerPort {health_port}" for p in c.get("ports") or []
                  if health_port in (p.get("containerPort"), p.get("hostPort"))]
        claims += [f"{probe} on :{health_port}" for probe in ("readinessProbe", "livenessProbe", "startupProbe")
                   if probe_port(c.get(probe), c) == health_port]
        if claims:
            others.append(f"container {c.get('name')} ({', '.join(claims)})")
    report.check(not others, "health port", f"{name}: " + (
        f"only istio-proxy claims :{health_port}" if not others else
        f"{'; '.join(others)} also claims :{health_port}: drain-gate's health listener cannot bind it, or "
        "the other container answers the LB and the kubelet instead of drain-gate (remove it: "
        "envoyfilter/kubernetes/migrate-from-sidecar-design.yaml)"))


def check_selected(report: Report, name: str, workload: dict, selector: dict) -> None:
    labels = pod_labels(workload)
    missing = {k: v for k, v in selector.items() if labels.get(k) != v}
    report.check(not missing, "drain-gate label", f"{name}: " + (
        f"pods labelled {labels_text(selector)}" if not missing else
        f"pods lack {labels_text(missing)}, the label the EnvoyFilters select: no :18180 listener is added, "
        "the :18180 readiness probe never passes and the rollout stops"))


def check_mount(report: Report, name: str, spec: dict, proxy: dict, wasm_path: str) -> None:
    mount = next((m for m in proxy.get("volumeMounts") or [] if m.get("mountPath") == wasm_path), None)
    volume = mount and next((v for v in spec.get("volumes") or [] if v.get("name") == mount.get("name")), None)
    if mount is None:
        detail = (f"istio-proxy mounts nothing at {wasm_path}: every drain-gate filter there fails to load, and "
                  "Envoy refuses the listener update that carries it")
    elif volume is None:
        detail = f"istio-proxy mounts volume {mount.get('name')!r} at {wasm_path}, and the pod has no such volume"
    else:
        source = next((k for k in volume if k != "name"), "?")
        ref = (volume.get("configMap") or {}).get("name")
        detail = f"{wasm_path} from {source}{' ' + ref if ref else ''}" + (
            f", key {mount['subPath']}" if mount.get("subPath") else "")
    report.check(bool(mount and volume), "wasm mount", f"{name}: {detail}")
    if mount and volume and not mount.get("subPath"):
        report.warn("wasm mount", f"{name}: no subPath: a ConfigMap update changes the file under running "
                    "Envoys, so the roles of one pod may load two builds")


def node_terms(spec: dict) -> list[dict]:
    return ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])


def expression_holds(expr: dict, values: dict) -> bool:
    key, op, want = expr.get("key"), expr.get("operator"), expr.get("values") or []
    have = values.get(key)
    if op == "In":
        return have in want
    if op == "NotIn":
        return have not in want
    if op == "Exists":
        return key in values
    if op == "DoesNotExist":
        return key not in values
    if op in ("Gt", "Lt") and have is not None and want:
        try:
            return int(have) > int(want[0]) if op == "Gt" else int(have) < int(want[0])
        except ValueError:
            return False
    return False


def node_fits(node: dict, spec: dict) -> bool:
    """The scheduler's nodeSelector and required nodeAffinity filters (taints aside)."""
    labels = node.get("metadata", {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = node_terms(spec)
    fields = {"metadata.name": node.get("metadata", {}).get("name")}
    return not terms or any(
        all(expression_holds(e, labels) for e in t.get("matchExpressions") or []) and
        all(expression_holds(e, fields) for e in t.get("matchFields") or []) for t in terms)


def node_addresses(node: dict) -> set[str]:
    return {a.get("address") for a in (node.get("status") or {}).get("addresses") or []} | \
        {node.get("metadata", {}).get("name")}


def check_lb_nodes(report: Report, workload: dict, docs: list, lb_nodes: list[str]) -> None:
    """The pods are pinned to the nodes the LB sends to; with the Nodes given,
    exactly those nodes match, one per replica."""
    name, spec = name_of(workload), pod_spec(workload)
    selector, terms = spec.get("nodeSelector") or {}, node_terms(spec)
    how = (f"nodeSelector {labels_text(selector)}" if selector else
           f"required nodeAffinity ({len(terms)} term(s))" if terms else "")
    if not report.check(bool(how), "LB nodes", f"{name}: " + (f"pinned by {how}" if how else
                        "no nodeSelector or required nodeAffinity: a pod (a replacement in a rollout or a node "
                        "drain included) can land on a node the LB does not send to, and with "
                        "externalTrafficPolicy Local the LB node left without a pod drops its NodePort traffic")):
        return
    nodes = kinds(docs, ("Node",))
    if not nodes:
        return
    fit = [n for n in nodes if node_fits(n, spec)]
    names = ", ".join(sorted(n["metadata"]["name"] for n in fit)) or "none"
    replicas = workload.get("spec", {}).get("replicas", 1) if workload["kind"] in ("Deployment", "StatefulSet") \
        else len(fit)
    spare = len(fit) > replicas and one_per_node(workload)
    report.check(len(fit) == replicas or spare, "LB nodes", f"{name}: {len(fit)} of {len(nodes)} nodes given fit "
                 f"({names}), replicas {replicas}" + ("" if len(fit) == replicas else (
                     ": a pod finds no node and stays Pending, and the LB node it should serve has none"
                     if len(fit) < replicas else
                     f"; {len(fit) - replicas} fitting node(s) without a pod fail the LB's check (DOWN): room for "
                     "a surge pod" if spare else
                     ": a fitting node may be left without a pod while another gets two")))
    if lb_nodes:
        unknown = [a for a in lb_nodes if not any(a in node_addresses(n) for n in fit)]
        extra = [n["metadata"]["name"] for n in fit if not node_addresses(n) & set(lb_nodes)]
        report.check(not unknown and not extra, "LB nodes", f"{name}: the LB's servers {', '.join(lb_nodes)}" + (
            " are the nodes the pods fit" if not unknown and not extra else
            "".join([f"; no fitting node has {', '.join(unknown)} (the LB sends there, no gateway pod can run "
                     "there)" if unknown else "",
                     f"; {', '.join(extra)} fit but the LB does not send to them" if extra else ""])))


def injectors(docs: list) -> list[dict]:
    return [cm for cm in kinds(docs, ("ConfigMap",))
            if cm.get("metadata", {}).get("name", "").startswith(INJECTOR) and "values" in (cm.get("data") or {})]


def check_mesh_lifecycle(report: Report, name: str, workload: dict, proxy: dict, docs: list) -> None:
    """What the injector does to istio-proxy's hooks: the gateway template sets
    global.proxy.lifecycle, and the pod's container is merged onto it (strategic
    merge: a hook's handler types add up; the API server takes exactly one)."""
    if "false" in (pod_labels(workload).get("sidecar.istio.io/inject"), pod_annotations(workload).get(
            "sidecar.istio.io/inject")):
        return  # not injected (a Gateway API pod: istiod renders istio-proxy, the ConfigMap's patch merges at render)
    rev = pod_labels(workload).get("istio.io/rev", "default")
    wanted = INJECTOR if rev == "default" else f"{INJECTOR}-{rev}"
    for cm in injectors(docs):
        if cm["metadata"]["name"] != wanted:
            continue
        try:
            values = json.loads(cm["data"]["values"])
        except json.JSONDecodeError:
            report.warn("mesh lifecycle", f"ConfigMap {wanted}: data.values is not JSON")
            continue
        mesh = (((values.get("global") or {}).get("proxy") or {}).get("lifecycle")) or {}
        ours = proxy.get("lifecycle") or {}
        for hook in ("preStop", "postStart"):
            theirs, mine = handlers(mesh.get(hook)), handlers(ours.get(hook))
            merged = sorted(set(theirs) | set(mine), key=HANDLERS.index)
            if not theirs:
                continue
            report.check(len(merged) <= 1, "mesh lifecycle", f"{name}: ConfigMap {wanted} sets "
                         f"global.proxy.lifecycle.{hook} ({', '.join(theirs)})" + (
                             f"; the pod's {', '.join(mine) or 'none'} replaces it" if len(merged) <= 1 else
                             f" and the pod's {hook} is {', '.join(mine)}: the injector merges them into one hook "
                             f"with {' and '.join(merged)} and the API server refuses the pod (\"may not specify "
                             "more than 1 handler type\"); remove the hook from the mesh's global.proxy.lifecycle, "
                             "or inject the gateway from a revision without it"))


def selects(selector: dict, workload: dict, namespace: str | None) -> bool:
    ns = workload.get("metadata", {}).get("namespace")
    same_ns = namespace is None or ns is None or ns == namespace
    labels = pod_labels(workload)
    return same_ns and bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def service_ports(service: dict, workload: dict, health_port: int) -> tuple[bool, list[str]]:
    """(a port reaches the health port, named targetPorts no container port has)."""
    named = {p.get("name"): p.get("containerPort") for c in pod_spec(workload).get("containers") or []
             for p in c.get("ports") or [] if p.get("name")}
    reaches, unresolved = False, []
    for p in service.get("spec", {}).get("ports") or []:
        target = p.get("targetPort", p.get("port"))
        if isinstance(target, str) and target not in named:
            unresolved.append(f"{p.get('name') or p.get('port')} -> {target!r}")
        elif named.get(target, target) == health_port:
            reaches = True
    return reaches, unresolved


def check_selectors(report: Report, docs: list, found: list[dict], health_port: int) -> None:
    """The Services and PodDisruptionBudgets given select the gateway's pods
    (the label-key trap: a selector key the pod template does not carry)."""
    pods = ", ".join(f"{name_of(w)} ({labels_text(pod_labels(w))})" for w in found)
    for svc in kinds(docs, ("Service",)):
        selector = svc.get("spec", {}).get("selector") or {}
        hits = [w for w in found if selects(selector, w, svc.get("metadata", {}).get("namespace"))]
        if not report.check(bool(hits), "service selector", f"{name_of(svc)}: " + (
                f"selects {', '.join(name_of(w) for w in hits)} ({labels_text(selector)})" if hits else
                f"selects {labels_text(selector)}, which no pod given carries ({pods}): no endpoints, every LB "
                "check and request to its NodePorts fails")):
            continue
        reaches, unresolved = service_ports(svc, hits[0], health_port)
        spec = svc["spec"]
        report.check(reaches and not unresolved, "service ports", f"{name_of(svc)}: " + (
            f"a port reaches :{health_port}" if reaches and not unresolved else "; ".join(
                ([f"no port reaches :{health_port} (the LB's check port)"] if not reaches else []) +
                [f"targetPort {u} names no container port of the pod" for u in unresolved])))
        if spec.get("type") in ("NodePort", "LoadBalancer"):
            local = spec.get("externalTrafficPolicy") == "Local"
            report.check(local, "externalTrafficPolicy", f"{name_of(svc)}: {spec.get('externalTrafficPolicy', 'Cluster')}"
                         + ("" if local else ": kube-proxy forwards a node's checks and traffic to pods on other "
                            "nodes; the LB reads the wrong pod's drain state (want Local)"))
    pdbs = kinds(docs, ("PodDisruptionBudget",))
    for pdb in pdbs:
        selector = ((pdb.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        hits = [w for w in found if selects(selector, w, pdb.get("metadata", {}).get("namespace"))]
        report.check(bool(hits), "pdb selector", f"{name_of(pdb)}: " + (
            f"covers {', '.join(name_of(w) for w in hits)} ({labels_text(selector)})" if hits else
            f"selects {labels_text(selector)}, which no pod given carries ({pods}): node drains evict every "
            "gateway pod at once"))
    for w in found:
        over = [name_of(p) for p in pdbs if selects(((p.get("spec") or {}).get("selector") or {}).get(
            "matchLabels") or {}, w, p.get("metadata", {}).get("namespace"))]
        if len(over) > 1:
            report.check(False, "pdb selector", f"{name_of(w)}: {len(over)} PodDisruptionBudgets cover its pods "
                         f"({', '.join(over)}): the eviction API refuses a pod under two, every node drain stalls")


# -- the LB's fingerprint ----------------------------------------------------------------------
ADVICE = {"lb_fall": int, "lb_buffer_s": int, "draining_new_requests": str, "refused_requests": str,
          "refuse_with": str, "drain_timeout_s": int, "termination_grace_period_s": int}
REFUSED_WIDTH = {"idempotent": 0, "idempotent_or_key": 1, "all": 2}
CONFIG_DEFAULTS = {"lb_fall": 2, "draining_new_requests": "serve", "refused_requests": "idempotent",
                   "refuse_with": "response"}


def read_fingerprint(source: str) -> dict:
    """prove.py's fingerprint (its `advice` and `lb`), or an advice object alone."""
    docs = json_documents(read_source(source))
    doc = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else None
    advice = doc.get("advice", doc) if doc else None
    if not isinstance(advice, dict) or not set(ADVICE) & set(advice):
        raise SystemExit(f"verify.py: --fingerprint {source}: not a fingerprint (prove.py --fingerprint --json) "
                         f"nor its advice: want an object with {', '.join(ADVICE)}")
    for key, kind in ADVICE.items():
        value = advice.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise SystemExit(f"verify.py: --fingerprint {source}: advice.{key} is {value!r}, not a {kind.__name__}")
    for key, allowed in (("draining_new_requests", ("serve", "refuse")), ("refused_requests", tuple(REFUSED_WIDTH)),
                         ("refuse_with", ("response", "reset"))):
        if advice.get(key) is not None and advice[key] not in allowed:
            raise SystemExit(f"verify.py: --fingerprint {source}: advice.{key} is {advice[key]!r}, not one of "
                             f"{', '.join(allowed)}")
    return {"advice": advice, "lb": (doc or {}).get("lb") or {}}


def chart_config(docs: list) -> tuple[dict, str] | None:
    """The health role's configuration in a rendered drain-gate chart (its health listener's
    EnvoyFilter, the EXTENSION_CONFIG patch): every `config` value of the chart."""
    for ef in kinds(docs, ("EnvoyFilter",)):
        for patch in (ef.get("spec") or {}).get("configPatches") or []:
            value = ((patch.get("patch") or {}).get("value") or {})
            plugin = ((value.get("typed_config") or {}).get("config") or {})
            text = ((plugin.get("configuration") or {}).get("value"))
            try:
                config = json.loads(text) if isinstance(text, str) else None
            except ValueError:
                config = None
            if patch.get("applyTo") == "EXTENSION_CONFIG" and isinstance(config, dict) and config.get("role") == "health":
                return config, f"the drain-gate chart's EnvoyFilter {ef.get('metadata', {}).get('name')}"
    return None


def short(have: float, want: float, unit: str = " s") -> str:
    return f"{want - have:g}{unit} short of the fingerprint's {want:g}{unit}"


def check_fingerprint(report: Report, fp: dict, config: dict, found: list[dict]) -> None:
    """The configuration and each workload against the LB's measured fingerprint."""
    a, lb = fp["advice"], fp["lb"]
    c = {**DEFAULTS, **CONFIG_DEFAULTS, **(config or {})}
    measured = f" (measured: {lb['detection']})" if lb.get("detection") else ""
    if a.get("lb_fall") is not None:
        have = int(c["lb_fall"])
        report.check(have == a["lb_fall"], "fingerprint lb_fall",
                     f"{have}; the LB takes a gateway out after {a['lb_fall']} 503s in a row{measured}"
                     + ("" if have == a["lb_fall"] else f": {'short' if have < a['lb_fall'] else 'over'} by "
                                                         f"{abs(have - a['lb_fall'])}, set lb_fall {a['lb_fall']}"))
    if a.get("lb_buffer_s") is not None:
        if c["close_after"] == "lb_observed_down":
            have = duration_s(c["lb_down_timeout"])
            name = "lb_down_timeout (close_after lb_observed_down)"
        else:
            have, name = duration_s(c["lb_buffer"]), "lb_buffer"
        report.check(have >= a["lb_buffer_s"], f"fingerprint {name.split()[0]}",
                     f"{name} {have:g} s" + ("" if have >= a["lb_buffer_s"] else f", {short(have, a['lb_buffer_s'])}")
                     + f"; CLOSING must outlast the LB's detection and a check{measured}")
    if a.get("drain_timeout_s") is not None:
        have = duration_s(c["drain_timeout"])
        report.check(have >= a["drain_timeout_s"], "fingerprint drain_timeout",
                     f"{have:g} s" + ("" if have >= a["drain_timeout_s"] else f", {short(have, a['drain_timeout_s'])}")
                     + " (the longest stream measured, and 30 s)")
    mode, want = c["draining_new_requests"], a.get("draining_new_requests")
    if want == "serve" and mode == "refuse":
        why = lb.get("resends_refused_why") or "measured"
        report.check(False, "fingerprint draining_new_requests",
                     "refuse, where the fingerprint advises serve: "
                     + ("this LB resends a POST the application answered 503: it would run it twice"
                        if lb.get("resends_after_application_503") else f"this LB does not resend a refusal ({why})"))
    elif want:
        report.check(True, "fingerprint draining_new_requests", f"{mode} (the fingerprint advises {want})")
    if mode == "refuse" and a.get("refused_requests"):
        have, wide = c["refused_requests"], a["refused_requests"]
        report.check(REFUSED_WIDTH.get(have, 3) <= REFUSED_WIDTH[wide], "fingerprint refused_requests",
                     f"{have}; the LB resends what the gateways refuse of {wide} (measured)"
                     + ("" if REFUSED_WIDTH.get(have, 3) <= REFUSED_WIDTH[wide] else
                        f": {have} refuses requests this LB was not seen to resend"))
    if mode == "refuse" and a.get("refuse_with"):
        report.check(c["refuse_with"] == a["refuse_with"], "fingerprint refuse_with",
                     f"{c['refuse_with']}; measured with {a['refuse_with']}")
    if a.get("termination_grace_period_s") is not None:
        for workload in found:
            grace = pod_spec(workload).get("terminationGracePeriodSeconds", 30)
            want = a["termination_grace_period_s"]
            report.check(grace >= want, "fingerprint terminationGracePeriodSeconds",
                         f"{name_of(workload)}: {grace} s" + ("" if grace >= want else f", {short(grace, want)}")
                         + " (drain_timeout + lb_buffer + scrape_interval + 15 s, of the advice)")


def check_grace(report: Report, workload: dict, config: dict) -> None:
    name = name_of(workload)
    spec = pod_spec(workload)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain, closing, scrape = timings(config)
    hold = drain + closing + scrape + HOLD_MARGIN_S
    need = hold + drain_duration_s(workload) + SPARE_S
    report.check(grace >= need, "terminationGracePeriodSeconds",
                 f"{name}: {grace} s; needs >= {need:g} s = drain_timeout {drain:g} + longest CLOSING "
                 f"{closing:g} + scrape_interval {scrape:g} + hold margin {HOLD_MARGIN_S} + terminationDrainDuration "
                 f"{drain_duration_s(workload):g} + spare {SPARE_S}")
    proxy = next((c for c in spec.get("containers", []) if c.get("name") == "istio-proxy"), {})
    command = (((proxy.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command") or []
    if "--max-time" in command[:-1]:
        max_time = float(command[command.index("--max-time") + 1])
        report.check(hold <= max_time <= grace - drain_duration_s(workload), "preStop --max-time",
                     f"{name}: {max_time:g} s; between the hold {hold:g} s and grace - "
                     f"terminationDrainDuration {grace - drain_duration_s(workload):g} s")


def resolve(value, replicas: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        exact = int(value[:-1]) * replicas / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value)


def one_per_node(workload: dict) -> bool:
    """A required pod anti-affinity on the hostname, or a DoNotSchedule spread on it with maxSkew 1."""
    pod = pod_spec(workload)
    required = ((pod.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    return any(t.get("topologyKey") == "kubernetes.io/hostname" for t in required) or any(
        t.get("topologyKey") == "kubernetes.io/hostname" and t.get("whenUnsatisfiable") == "DoNotSchedule"
        and t.get("maxSkew") == 1 for t in pod.get("topologySpreadConstraints") or [])


# The taint effects that keep a pod off a node (PreferNoSchedule only prefers).
BLOCKING_TAINTS = ("NoSchedule", "NoExecute")
# What `kubectl cordon` (spec.unschedulable) amounts to for the scheduler.
CORDON_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def tolerates(tolerations: list, taint: dict) -> bool:
    """The scheduler's TaintToleration filter for one taint."""
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        exists = t.get("operator", "Equal") == "Exists"
        if not t.get("key"):
            if exists:
                return True
            continue
        if t["key"] == taint.get("key") and (exists or t.get("value", "") == taint.get("value", "")):
            return True
    return False


def untolerated(node: dict, spec: dict) -> list[str]:
    """The taints (and a cordon) of `node` that keep these pods off it."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append(CORDON_TAINT)
    return [f"{t.get('key')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect')}"
            for t in taints if t.get("effect") in BLOCKING_TAINTS
            and not tolerates(spec.get("tolerations") or [], t)]


def surge_room(workload: dict, docs: list) -> tuple[bool, str]:
    """Whether a surge pod finds a node while every old pod still runs: the nodes
    the pods fit (nodeSelector, required node affinity, taints) less one per
    replica (the required anti-affinity keeps the surge pod off a node with a
    gateway pod). Returns (room, why)."""
    nodes = kinds(docs, ("Node",))
    if not nodes:
        return False, ("no Nodes given to judge it by: the surge pod needs a node the pods fit that has no "
                       "gateway pod (give `kubectl get nodes -o json`, or use maxSurge 0, maxUnavailable 1)")
    spec = pod_spec(workload)
    replicas = workload.get("spec", {}).get("replicas", 1)
    labelled = [n for n in nodes if node_fits(n, spec)]
    tainted = {n["metadata"]["name"]: untolerated(n, spec) for n in labelled}
    fit = sorted(n["metadata"]["name"] for n in labelled if not tainted[n["metadata"]["name"]])
    kept_off = "; ".join(f"{name} has {', '.join(t)}, which the pods do not tolerate"
                         for name, t in sorted(tainted.items()) if t)
    counted = f"{len(fit)} node(s) fit ({', '.join(fit) or 'none'}) for {replicas} replica(s)" + (
        f" ({kept_off})" if kept_off else "")
    if len(fit) > replicas:
        return True, (f"{counted}: the surge pod takes a node without a gateway pod, then an old pod drains "
                      "(the LB must check every fitting node: the one without a pod answers DOWN)")
    return False, (f"{counted}: the surge pod finds no node without a gateway pod and stays Pending, and no old "
                   "pod may go before it is ready: the rollout hangs (add a node the pods fit, or use maxSurge 0, "
                   "maxUnavailable 1)")


def check_rollout(report: Report, workload: dict, docs: list) -> None:
    if workload["kind"] != "Deployment":
        return
    name = name_of(workload)
    spec = workload.get("spec", {})
    pod = pod_spec(workload)
    required = ((pod.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    per_node = any(t.get("topologyKey") == "kubernetes.io/hostname" for t in required)
    spread = [t for t in pod.get("topologySpreadConstraints") or [] if t.get("topologyKey") ==
              "kubernetes.io/hostname" and t.get("whenUnsatisfiable") == "DoNotSchedule" and t.get("maxSkew") == 1]
    if not per_node:
        if spread:
            report.check(True, "one pod per node", f"{name}: topology spread on kubernetes.io/hostname, maxSkew 1")
        else:
            report.warn("one pod per node", f"{name}: no required pod anti-affinity or DoNotSchedule topology "
                        "spread on kubernetes.io/hostname")
        return
    replicas = spec.get("replicas", 1)
    rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
    surge = resolve(rolling.get("maxSurge", "25%"), replicas, round_up=True)
    unavailable = resolve(rolling.get("maxUnavailable", "25%"), replicas, round_up=False)
    what = f"{name}: required anti-affinity per node, maxSurge {surge}, maxUnavailable {unavailable}"
    if surge > 0 and unavailable == 0:
        room, why = surge_room(workload, docs)
        report.check(room, "rollout", f"{what}; {why}")
    else:
        report.check(True, "rollout", what)


def verify_pod_spec(report: Report, docs: list, config: dict, health_port: int, selector: dict,
                    wasm_path: str, lb_nodes: list[str] = (), fingerprint: dict | None = None) -> None:
    found = workloads(docs)
    if not report.check(bool(found), "pod spec", f"{len(found)} Pod/Deployment/DaemonSet/StatefulSet"):
        return
    if fingerprint:
        check_fingerprint(report, fingerprint, config, found)
    for workload in found:
        name, spec = name_of(workload), pod_spec(workload)
        proxy = next((c for c in spec.get("containers", []) if c.get("name") == "istio-proxy"), None)
        if not report.check(proxy is not None, "istio-proxy", f"{name}: " + (
                "container istio-proxy" if proxy else "no container istio-proxy")):
            continue
        check_selected(report, name, workload, selector)
        check_mount(report, name, spec, proxy, wasm_path)
        check_hook_and_probes(report, name, proxy, health_port)
        check_health_port_owner(report, name, spec, health_port)
        check_mesh_lifecycle(report, name, workload, proxy, docs)
        check_lb_nodes(report, workload, docs, lb_nodes)
        check_grace(report, workload, config)
        check_rollout(report, workload, docs)
    check_selectors(report, docs, found, health_port)


def label_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--config-dump", metavar="FILE|URL|-", help="Envoy admin /config_dump (JSON)")
    ap.add_argument("--stats", metavar="FILE|URL", help="Envoy admin /stats (text), for the ECDS filters")
    ap.add_argument("--pod-spec", metavar="FILE|-", help="Pod, Deployment, List or several JSON documents")
    ap.add_argument("--plugin-config", metavar="JSON",
                    help="drain-gate configuration for the timings when no config dump is given")
    ap.add_argument("--fingerprint", metavar="FILE",
                    help="the LB's fingerprint (prove.py --fingerprint --json): the pod spec and the configuration "
                         "against its advice (with --pod-spec)")
    ap.add_argument("--health-port", type=int, default=18180)
    ap.add_argument("--pod-selector", metavar="KEY=VALUE", type=label_pair, action="append",
                    help=f"the label the EnvoyFilters select (repeatable; default {DEFAULT_SELECTOR[0]}="
                         f"{DEFAULT_SELECTOR[1]}, the drain-gate chart's podSelector)")
    ap.add_argument("--wasm-path", default=WASM_PATH, help=f"where the module is mounted (default {WASM_PATH})")
    ap.add_argument("--lb-nodes", metavar="ADDR,ADDR", type=lambda t: [a for a in t.split(",") if a],
                    help="the LB's servers (node addresses or names): with Nodes in --pod-spec, exactly the "
                         "nodes the pods fit")
    args = ap.parse_args(argv)
    if not args.config_dump and not args.pod_spec and not args.stats:
        ap.error("give --config-dump, --stats, --pod-spec, or several")
    if [args.config_dump, args.pod_spec, args.stats].count("-") > 1:
        ap.error("only one of --config-dump, --stats and --pod-spec can read stdin")
    if args.fingerprint and not args.pod_spec:
        ap.error("--fingerprint checks a pod spec and its configuration: add --pod-spec")
    fingerprint = read_fingerprint(args.fingerprint) if args.fingerprint else None
    report = Report()
    config = json.loads(args.plugin_config) if args.plugin_config else {}
    source = "--plugin-config" if args.plugin_config else "drain-gate's defaults"
    if args.config_dump:
        (dump,) = json_documents(read_source(args.config_dump))[:1] or [{}]
        dumped = verify_config_dump(report, dump, args.health_port)
        config, source = (dumped, "the config dump") if dumped else (config, source)
    if args.stats:
        verify_stats(report, read_source(args.stats))
    if args.pod_spec:
        docs = json_documents(read_source(args.pod_spec))
        chart = chart_config(docs) if not args.config_dump and not args.plugin_config else None
        if chart:
            config, source = chart
        if fingerprint:
            report.check(True, "fingerprint", f"{args.fingerprint} against the configuration of {source}")
        verify_pod_spec(report, docs, config, args.health_port, dict(args.pod_selector or [DEFAULT_SELECTOR]),
                        args.wasm_path, args.lb_nodes or [], fingerprint)
    print(f"{'FAILED' if report.failed else 'OK'}: {report.failed} check(s) failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
