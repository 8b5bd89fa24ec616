#!/usr/bin/env python3
"""Preflight for drain-gate on an Istio gateway: reads what Envoy runs and what
the kubelet will do, prints one line per check, exits 1 if any check fails.

  # what the gateway's Envoy runs (admin /config_dump), from inside the pod:
  kubectl -n istio-system exec deploy/istio-ingressgateway -c istio-proxy -- \\
    curl -s localhost:15000/config_dump | python3 verify.py --config-dump -
  # the WasmPlugin form: also Envoy's stats (an ECDS filter that never loaded)
  kubectl -n istio-system exec deploy/istio-ingressgateway -c istio-proxy -- \\
    curl -s localhost:15000/stats | python3 verify.py --stats -
  # the pod spec the kubelet runs (a Pod, a Deployment, a List, or several
  # JSON documents; JSON only — standard library — so convert YAML with kubectl):
  kubectl -n istio-system get deploy istio-ingressgateway -o json | python3 verify.py --pod-spec -
  helm template ... | kubectl annotate --local -f - -o json drain-gate.io/verify=render \\
    | python3 verify.py --pod-spec -

Envoy (--config-dump FILE|URL|-):
  * every HTTP listener but the health listener (and Istio's own 15021/15090)
    has the drain-gate traffic filter before its router, FAIL_OPEN;
  * the health listener on --health-port exists, its drain-gate filter is
    FAIL_CLOSED and its routes end in a catch-all 503;
  * traffic and health filters share one vm_id (shared data is per vm_id);
  * no listener update was rejected (a wasm that cannot load makes Envoy refuse
    the whole update, whatever the failure policy).
Envoy (--stats FILE|URL, admin /stats, optional): every ECDS filter (the
  WasmPlugin form) has an accepted configuration. The config dump shows an
  ECDS filter as received even when Envoy refused it; a filter that never
  loaded answers 500 to every request of its listeners.
Pod (--pod-spec FILE|-), container istio-proxy:
  * a preStop hook; a readiness probe on --health-port; no liveness probe on it;
  * terminationGracePeriodSeconds >= drain_timeout + the longest CLOSING
    + 5 s hold margin + terminationDrainDuration + 5 s spare; curl's --max-time
    of an exec preStop between the hold and the grace period;
  * no rollout that deadlocks: one pod per node enforced by required
    anti-affinity with maxUnavailable 0 leaves the surge pod no node (a
    DoNotSchedule topology spread on the hostname, the Gateway API form's, is
    one pod per node without that deadlock).
The timings come from the health filter's configuration in the config dump,
else from --plugin-config JSON, else drain-gate's defaults.

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
ISTIO_OWN_PORTS = (15021, 15090)
DEFAULTS = {"drain_timeout": "120s", "lb_buffer": "10s", "close_after": "lb_buffer", "lb_down_timeout": "60s"}
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


def hcms(listener: dict):
    chains = list(listener.get("filter_chains", []))
    if listener.get("default_filter_chain"):
        chains.append(listener["default_filter_chain"])
    for chain in chains:
        for f in chain.get("filters", []):
            if (f.get("typed_config") or {}).get("@type") == HCM_TYPE:
                yield f["typed_config"]


def drain_gate_filters(hcm: dict, ecds: dict) -> list[tuple[int, dict, str]]:
    """(position, wasm PluginConfig, role) of each drain-gate filter of an HCM."""
    found = []
    for i, f in enumerate(hcm.get("http_filters", [])):
        typed = f.get("typed_config") or (ecds.get(f.get("name")) if "config_discovery" in f else None) or {}
        if typed.get("@type") != WASM_TYPE:
            continue
        plugin = typed.get("config", {})
        try:
            role = json.loads((plugin.get("configuration") or {}).get("value", "{}")).get("role")
        except (json.JSONDecodeError, AttributeError):
            role = None
        if role in ("traffic", "health"):
            found.append((i, plugin, role))
    return found


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
            if not report.check(len(before) == 1, "traffic filter", f"listener {name}: " + (
                    "drain-gate traffic filter before the router" if len(before) == 1 else
                    f"{len(before)} drain-gate traffic filters before the router (want 1)")):
                continue
            report.check(policy(before[0]) == "FAIL_OPEN", "traffic failure_policy",
                         f"listener {name}: {policy(before[0])} (want FAIL_OPEN)")
            got = (before[0].get("vm_config") or {}).get("vm_id", "")
            if vm_id is not None:
                report.check(got == vm_id, "vm_id", f"listener {name}: traffic vm_id {got!r}"
                             + (" = health" if got == vm_id else f" != health vm_id {vm_id!r}"))
    return seen


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
    health = check_health(report, all_listeners, health_port, ecds, routes)
    vm_id = (health.get("vm_config") or {}).get("vm_id", "") if health else None
    seen = check_traffic(report, all_listeners, health_port, ecds, vm_id)
    report.check(seen > 0, "traffic listeners", f"{seen} HTTP listener(s) besides the health listener")
    if not health:
        return None
    try:
        return json.loads(health["configuration"]["value"])
    except (KeyError, json.JSONDecodeError):
        return {}


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
def workloads(docs: list) -> list[dict]:
    """Every Pod / Deployment / DaemonSet / StatefulSet in the documents (Lists opened)."""
    out = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind", "").endswith("List"):
            out += workloads(doc.get("items", []))
        elif doc.get("kind") in ("Pod", "Deployment", "DaemonSet", "StatefulSet"):
            out.append(doc)
    return out


def pod_spec(workload: dict) -> dict:
    spec = workload.get("spec", {})
    return spec if workload["kind"] == "Pod" else spec.get("template", {}).get("spec", {})


def pod_annotations(workload: dict) -> dict:
    meta = workload.get("metadata", {}) if workload["kind"] == "Pod" else \
        workload.get("spec", {}).get("template", {}).get("metadata", {})
    return meta.get("annotations") or {}


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


def timings(config: dict) -> tuple[float, float]:
    """(drain_timeout, longest CLOSING) in seconds."""
    c = {**DEFAULTS, **(config or {})}
    closing = duration_s(c["lb_buffer"])
    if c["close_after"] == "lb_observed_down":
        closing = max(closing, duration_s(c["lb_down_timeout"]))
    return duration_s(c["drain_timeout"]), closing


def check_hook_and_probes(report: Report, name: str, proxy: dict, health_port: int) -> None:
    pre = (proxy.get("lifecycle") or {}).get("preStop")
    report.check(bool(pre), "preStop", f"{name}: " + (f"{', '.join(sorted(pre))} hook" if pre else
                                                      "container istio-proxy has no lifecycle.preStop"))
    ready = probe_port(proxy.get("readinessProbe"), proxy)
    report.check(ready == health_port, "readiness", f"{name}: readinessProbe port {ready} "
                 f"(want httpGet :{health_port})")
    if probe_port(proxy.get("livenessProbe"), proxy) == health_port:
        report.warn("liveness", f"{name}: a liveness probe on :{health_port} restarts every gateway pod "
                    "whose health listener is missing or rejected (envoyfilter/README.md)")


def check_grace(report: Report, workload: dict, config: dict) -> None:
    name = f"{workload['kind']} {workload.get('metadata', {}).get('name')}"
    spec = pod_spec(workload)
    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain, closing = timings(config)
    hold = drain + closing + HOLD_MARGIN_S
    need = hold + drain_duration_s(workload) + SPARE_S
    report.check(grace >= need, "terminationGracePeriodSeconds",
                 f"{name}: {grace} s; needs >= {need:g} s = drain_timeout {drain:g} + longest CLOSING "
                 f"{closing:g} + hold margin {HOLD_MARGIN_S} + terminationDrainDuration "
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


def check_rollout(report: Report, workload: dict) -> None:
    if workload["kind"] != "Deployment":
        return
    name = f"Deployment {workload.get('metadata', {}).get('name')}"
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
    report.check(not (surge > 0 and unavailable == 0), "rollout", f"{name}: required anti-affinity per node, "
                 f"maxSurge {surge}, maxUnavailable {unavailable}" + (
                     ": the surge pod finds no free node when replicas = nodes, the rollout hangs "
                     "(use maxSurge 0, maxUnavailable 1)" if surge > 0 and unavailable == 0 else ""))


def verify_pod_spec(report: Report, docs: list, config: dict, health_port: int) -> None:
    found = workloads(docs)
    if not report.check(bool(found), "pod spec", f"{len(found)} Pod/Deployment/DaemonSet/StatefulSet"):
        return
    for workload in found:
        name = f"{workload['kind']} {workload.get('metadata', {}).get('name')}"
        proxy = next((c for c in pod_spec(workload).get("containers", []) if c.get("name") == "istio-proxy"), None)
        if not report.check(proxy is not None, "istio-proxy", f"{name}: " + (
                "container istio-proxy" if proxy else "no container istio-proxy")):
            continue
        check_hook_and_probes(report, name, proxy, health_port)
        check_grace(report, workload, config)
        check_rollout(report, workload)


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--config-dump", metavar="FILE|URL|-", help="Envoy admin /config_dump (JSON)")
    ap.add_argument("--stats", metavar="FILE|URL", help="Envoy admin /stats (text), for the ECDS filters")
    ap.add_argument("--pod-spec", metavar="FILE|-", help="Pod, Deployment, List or several JSON documents")
    ap.add_argument("--plugin-config", metavar="JSON",
                    help="drain-gate configuration for the timings when no config dump is given")
    ap.add_argument("--health-port", type=int, default=18180)
    args = ap.parse_args(argv)
    if not args.config_dump and not args.pod_spec and not args.stats:
        ap.error("give --config-dump, --stats, --pod-spec, or several")
    if [args.config_dump, args.pod_spec, args.stats].count("-") > 1:
        ap.error("only one of --config-dump, --stats and --pod-spec can read stdin")
    report = Report()
    config = json.loads(args.plugin_config) if args.plugin_config else {}
    if args.config_dump:
        (dump,) = json_documents(read_source(args.config_dump))[:1] or [{}]
        config = verify_config_dump(report, dump, args.health_port) or config
    if args.stats:
        verify_stats(report, read_source(args.stats))
    if args.pod_spec:
        verify_pod_spec(report, json_documents(read_source(args.pod_spec)), config, args.health_port)
    print(f"{'FAILED' if report.failed else 'OK'}: {report.failed} check(s) failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
