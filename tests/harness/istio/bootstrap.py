"""A gateway-like bootstrap: node, admin, the listeners as istiod and the
patches left them, istio-proxy's prometheus_stats cluster and a backend
cluster; only ports and the wasm file path are substituted when the bootstrap
is written."""
from __future__ import annotations

import copy
from pathlib import Path

from tests.harness.envoy import WASM, Ports
from tests.harness.ports import free_port
from tests.harness.variants import static_cluster
from tests.harness.istio.envoyfilter import WASM_HTTP, WASM_NETWORK, hcms
from tests.harness.istio.files import HEALTH_PORT, ISTIO_ADMIN_PORT


def wasm_filters(listener: dict):
    """(filter entry) for every inline wasm HTTP or network filter of a listener."""
    for hcm in hcms(listener, {}):
        for f in hcm["http_filters"]:
            if f.get("typed_config", {}).get("@type") == WASM_HTTP:
                yield f
    for chain in listener.get("filter_chains", []):
        for f in chain["filters"]:
            if f.get("typed_config", {}).get("@type") == WASM_NETWORK:
                yield f


def gateway_bootstrap(listeners: list[dict], ports: dict[int, int], admin_port: int, backend_port: int,
                      wasm: Path = WASM, clusters: list[dict] = (), admin_address: str = "127.0.0.1") -> dict:
    """A bootstrap holding `listeners` and added `clusters` as written, but for
    ports (logical -> actual, every listener port must be mapped; a cluster's
    ISTIO_ADMIN_PORT is the admin's actual port) and the mounted wasm file's
    path (inline filters and ECDS filters' default configurations).

    Like istio-proxy's (tools/packaging/common/envoy_bootstrap.json), the admin
    listens on the pod's loopback ({{ .localhost }}: 127.0.0.1, or ::1 in an
    IPv6-only pod) at proxyAdminPort, and the static cluster prometheus_stats
    dials that same address and port."""
    listeners = copy.deepcopy(listeners)
    clusters = copy.deepcopy(list(clusters))
    for cluster in clusters:
        for group in cluster["load_assignment"]["endpoints"]:
            for ep in group["lb_endpoints"]:
                addr = ep["endpoint"]["address"]["socket_address"]
                assert addr["port_value"] == ISTIO_ADMIN_PORT, addr
                addr["port_value"] = admin_port
    for listener in listeners:
        addr = listener["address"]["socket_address"]
        addr["port_value"] = ports[addr["port_value"]]
        for f in wasm_filters(listener):
            f["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = str(wasm)
        for hcm in hcms(listener, {}):
            for f in hcm["http_filters"]:  # an ECDS filter's default (the canary's placeholder)
                default = (f.get("config_discovery") or {}).get("default_config") or {}
                if default.get("@type") == WASM_HTTP:
                    default["config"]["vm_config"]["code"]["local"]["filename"] = str(wasm)
    admin = {"socket_address": {"address": admin_address, "port_value": admin_port}}
    return {
        "node": {
            "id": "router~127.0.0.1~istio-ingressgateway-0.istio-system~istio-system.svc.cluster.local",
            "cluster": "istio-ingressgateway.istio-system",
        },
        "admin": {"address": admin},
        "static_resources": {
            "listeners": listeners,
            "clusters": [
                {
                    "name": "prometheus_stats",
                    "type": "STATIC",
                    "connect_timeout": "0.250s",
                    "lb_policy": "ROUND_ROBIN",
                    "load_assignment": {
                        "cluster_name": "prometheus_stats",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                            "socket_address": {"protocol": "TCP", **admin["socket_address"]}}}}]}],
                    },
                },
                {
                    "name": "backend",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "backend",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": backend_port}}}}]}],
                    },
                },
                # istio-proxy's cluster to pilot-agent's status port (drain-gate's termination_watch):
                # nothing listens on it here, so a readiness call gets no answer, which says nothing.
                static_cluster("agent", free_port(), "0.250s"),
                *clusters,
            ],
        },
    }


def harness_ports(ports: dict[int, int], admin_port: int, backend_port: int, traffic: int = 8080) -> Ports:
    """tests.harness.envoy.Ports for the Envoy class (health = :18180's actual port)."""
    return Ports(traffic=ports[traffic], health=ports[HEALTH_PORT], admin=admin_port, backend=backend_port)
