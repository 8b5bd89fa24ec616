"""Bootstrap variants for the hardening tests, built from the shipped envoy.yaml.

Each function takes the dict that `tests.harness.envoy.render` produced and
changes only what its name says; everything else stays as shipped. (Calls to a
running gateway are in tests.harness.wire, its log in tests.harness.envoy.)
"""
from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path

import yaml

from tests.harness.envoy import REPO, drain_gate_plugins, hcm

FAULT_HEADER = "x-fault-abort"
TRAP_HEADER = "x-drain-gate-trap"
FIXTURE_WASM = REPO / "target" / "fixtures" / "wasm32-wasip1" / "release" / "drain_gate_trap.wasm"


def listener(doc: dict, name: str) -> dict:
    for lst in doc["static_resources"]["listeners"]:
        if lst["name"] == name:
            return lst
    raise KeyError(name)


def plugin(doc: dict, listener_name: str) -> dict:
    """The wasm PluginConfig of the drain-gate filter of one listener."""
    for name, config in drain_gate_plugins(doc):
        if name == listener_name:
            return config
    raise KeyError(listener_name)


def plugin_config(doc: dict, listener_name: str) -> dict:
    return json.loads(plugin(doc, listener_name)["configuration"]["value"])


def set_plugin_config(doc: dict, listener_name: str, value: dict | str) -> None:
    text = value if isinstance(value, str) else json.dumps(value)
    plugin(doc, listener_name)["configuration"]["value"] = text


TCP_FILTER = REPO / "envoyfilter" / "istio" / "tcp-filter.yaml"


def tcp_listener(doc: dict, port: int, upstream_port: int, config: dict | None = None,
                 counted: bool = True) -> dict:
    """The bootstrap plus a TCP listener on `port` whose chain is drain-gate's
    network filter, as envoyfilter/istio/tcp-filter.yaml writes it (its
    configuration inline: the EXTENSION_CONFIG patch istiod serves it over
    ECDS), before tcp_proxy to 127.0.0.1:`upstream_port` (a TCP or
    TLS-passthrough chain). Its plugin configuration is the traffic
    listener's (`config` merged over it) with role traffic_tcp; the wasm file
    is the traffic listener's. `counted=False`: tcp_proxy alone (what a
    gateway without the TCP role has)."""
    doc = copy.deepcopy(doc)
    patches = yaml.safe_load(TCP_FILTER.read_text())["spec"]["configPatches"]
    (served,) = [p["patch"]["value"] for p in patches if p["applyTo"] == "EXTENSION_CONFIG"]
    wasm = copy.deepcopy(served)
    tcp = wasm["typed_config"]["config"]
    tcp["vm_config"]["code"] = copy.deepcopy(plugin(doc, "traffic")["vm_config"]["code"])
    value = {**plugin_config(doc, "traffic"), **(config or {}), "role": "traffic_tcp"}
    tcp["configuration"]["value"] = json.dumps(value)
    doc["static_resources"]["listeners"].append({
        "name": "tcp",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": ([wasm] if counted else []) + [{
            "name": "envoy.filters.network.tcp_proxy",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": "tcp", "cluster": "tcp_backend"},
        }]}],
    })
    doc["static_resources"]["clusters"].append(static_cluster("tcp_backend", upstream_port))
    return doc


def static_cluster(name: str, port: int, connect_timeout: str = "1s") -> dict:
    """A STATIC cluster `name` with one endpoint, 127.0.0.1:`port`."""
    return {
        "name": name, "type": "STATIC", "connect_timeout": connect_timeout,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
    }


def without_listener(doc: dict, name: str) -> dict:
    """The bootstrap without the listener `name` (say, a gateway that lost its health listener)."""
    doc = copy.deepcopy(doc)
    doc["static_resources"]["listeners"] = [
        lst for lst in doc["static_resources"]["listeners"] if lst["name"] != name]
    return doc


def with_fault_and_timeout(doc: dict, abort_percent: int = 20, route_timeout: str = "0.2s") -> dict:
    """Traffic listener with Envoy's fault filter after drain-gate, where istiod
    puts it (aborting `abort_percent` % of the requests that carry FAULT_HEADER
    with a local 503: counted, then answered before the router) and a second
    route, /timeout → the backend's /slow, with a route timeout."""
    doc = copy.deepcopy(doc)
    t = hcm(listener(doc, "traffic"))
    fault = {
        "name": "envoy.filters.http.fault",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
            "abort": {"http_status": 503, "percentage": {"numerator": abort_percent, "denominator": "HUNDRED"}},
            "headers": [{"name": FAULT_HEADER, "present_match": True}],
        },
    }
    filters = t["http_filters"]
    idx = next(i for i, f in enumerate(filters) if f["name"] == "drain-gate")
    filters.insert(idx + 1, fault)
    routes = t["route_config"]["virtual_hosts"][0]["routes"]
    routes.insert(0, {
        "match": {"prefix": "/timeout"},
        "route": {"cluster": "backend", "timeout": route_timeout, "prefix_rewrite": "/slow"},
    })
    return doc


def with_code(doc: dict, listener_name: str, wasm: Path, failure_policy: str | None = None) -> dict:
    """The drain-gate filter of one listener loads `wasm` instead (same vm_id)."""
    doc = copy.deepcopy(doc)
    p = plugin(doc, listener_name)
    p["vm_config"]["code"]["local"]["filename"] = str(wasm)
    if failure_policy:
        p["failure_policy"] = failure_policy
    return doc


class Lds:
    """Moves the bootstrap's listeners into a file-based LDS source in a watched
    directory. `push()` replaces the file atomically (rename into place)."""

    def __init__(self, doc: dict, workdir: Path):
        self.dir = Path(workdir) / "lds"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "listeners.yaml"
        self.listeners = copy.deepcopy(doc["static_resources"]["listeners"])
        self.doc = copy.deepcopy(doc)
        del self.doc["static_resources"]["listeners"]
        # File-based xDS needs a node identity.
        self.doc.setdefault("node", {"id": "drain-gate-test", "cluster": "drain-gate-test"})
        self.doc["dynamic_resources"] = {
            "lds_config": {
                "path_config_source": {"path": str(self.path), "watched_directory": {"path": str(self.dir)}},
                "resource_api_version": "V3",
            }
        }
        self.push(self.listeners)

    def listener(self, name: str, listeners: list | None = None) -> dict:
        return next(lst for lst in (listeners or self.listeners) if lst["name"] == name)

    def push(self, listeners: list) -> None:
        body = {"resources": [{"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", **lst}
                              for lst in listeners]}
        fd, tmp = tempfile.mkstemp(dir=self.dir.parent, prefix=".lds-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump(body, sort_keys=False))
        os.rename(tmp, self.path)


def quic_listener(doc: dict, port: int, workdir: Path, counted: bool = True) -> dict:
    """The bootstrap plus an HTTP/3 listener on UDP `port`: the traffic listener's
    connection manager (its routes and filters, drain-gate's traffic role included)
    with codec HTTP3, behind a QUIC transport socket with a self-signed certificate
    (made in `workdir`), as an Istio gateway's QUIC listener carries it.
    `counted=False`: the same without drain-gate's filter (the control)."""
    from tests.harness.haproxy import make_cert  # the one home of the test certificate

    doc = copy.deepcopy(doc)
    make_cert(Path(workdir))
    chain = copy.deepcopy(listener(doc, "traffic")["filter_chains"][0])
    manager = chain["filters"][0]["typed_config"]
    manager.update({"stat_prefix": "traffic_h3", "codec_type": "HTTP3", "http3_protocol_options": {}})
    manager.pop("upgrade_configs", None)  # an HTTP/3 websocket would be extended CONNECT, not an upgrade
    if not counted:
        manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] != "drain-gate"]
    tls = {"common_tls_context": {"tls_certificates": [{
        "certificate_chain": {"filename": str(Path(workdir) / "tls.crt")},
        "private_key": {"filename": str(Path(workdir) / "tls.key")}}]}}
    chain["transport_socket"] = {"name": "envoy.transport_sockets.quic", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport",
        "downstream_tls_context": tls}}
    doc["static_resources"]["listeners"].append({
        "name": "traffic_h3",
        "address": {"socket_address": {"protocol": "UDP", "address": "127.0.0.1", "port_value": port}},
        "udp_listener_config": {"quic_options": {}},
        "filter_chains": [chain],
    })
    return doc
