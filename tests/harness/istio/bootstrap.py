"""A gateway-like bootstrap: node, admin, the listeners as istiod and the
patches left them, istio-proxy's prometheus_stats cluster and a backend
cluster; only ports and the wasm file path are substituted when the bootstrap
is written. What istiod serves over ECDS comes from files instead of ADS."""
from __future__ import annotations

import copy
import os
import re
import tempfile
from pathlib import Path

import yaml

from tests.harness.envoy import WASM, Ports
from tests.harness.istio.envoyfilter import WASM_HTTP, WASM_NETWORK, Xds, all_filters, asks_ads, hcms
from tests.harness.istio.files import HEALTH_PORT, ISTIO_ADMIN_PORT
from tests.harness.ports import free_port
from tests.harness.variants import static_cluster

# The cluster of a config source nobody answers: a filter asking istiod for a
# name it does not serve waits, as over ADS, for its initial_fetch_timeout.
UNANSWERED = "xds_unanswered"


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


def ecds_file(ecds_dir: Path, name: str) -> Path:
    """The file that stands in for istiod's ECDS resource `name`."""
    return Path(ecds_dir) / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".yaml")


def serve_extensions(ecds_dir: Path, extensions: list[dict], wasm: Path | None = WASM) -> None:
    """istiod serving `extensions` over ECDS: each resource in its own file
    (Envoy takes one resource per filter subscription), renamed into place in
    the watched directory so Envoy reads it whole; a wasm module's file is
    `wasm` (None: as written)."""
    for ext in extensions:
        ext = copy.deepcopy(ext)
        code = ((ext.get("typed_config") or {}).get("config") or {}).get("vm_config", {}).get("code", {})
        if wasm is not None and "local" in code:
            code["local"]["filename"] = str(wasm)
        fd, tmp = tempfile.mkstemp(dir=Path(ecds_dir).parent, prefix=".ecds-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump({"version_info": "1", "resources": [ext]}, sort_keys=False))
        os.rename(tmp, ecds_file(ecds_dir, ext["name"]))


def _ecds_from_files(listeners: list[dict], served: set[str], ecds_dir: Path) -> bool:
    """Points every filter that asks ADS for its configuration at its file in
    `ecds_dir` (its initial_fetch_timeout kept), or, for a name not `served`,
    at a source nobody answers. Whether any is."""
    unanswered = False
    for listener in listeners:
        for f in all_filters(listener):
            if not asks_ads(f):
                continue
            source = f["config_discovery"]["config_source"]
            del source["ads"]
            if f["name"] in served:
                source["path_config_source"] = {"path": str(ecds_file(ecds_dir, f["name"])),
                                                "watched_directory": {"path": str(ecds_dir)}}
            else:
                unanswered = True
                source["api_config_source"] = {"api_type": "GRPC", "transport_api_version": "V3",
                                               "grpc_services": [{"envoy_grpc": {"cluster_name": UNANSWERED}}]}
    return unanswered


def gateway_bootstrap(xds: Xds | list[dict], ports: dict[int, int], admin_port: int, backend_port: int,
                      wasm: Path = WASM, clusters: list[dict] = (), admin_address: str = "127.0.0.1",
                      ecds_dir: Path | None = None) -> dict:
    """A bootstrap holding what istiod sends (`xds`: the listeners, and the
    ECDS resources they ask for; or listeners alone) and added `clusters` as written, but for
    ports (logical -> actual, every listener port must be mapped; a cluster's
    ISTIO_ADMIN_PORT is the admin's actual port) and the mounted wasm file's
    path (inline filters and ECDS filters' default configurations).

    Like istio-proxy's (tools/packaging/common/envoy_bootstrap.json), the admin
    listens on the pod's loopback ({{ .localhost }}: 127.0.0.1, or ::1 in an
    IPv6-only pod) at proxyAdminPort, and the static cluster prometheus_stats
    dials that same address and port.

    A filter that asks istiod for its configuration over ADS reads it from a
    file in `ecds_dir` instead, written from the ECDS resources
    (`serve_extensions`; write them again to update); a name none has gets a
    source nobody answers."""
    xds = xds if isinstance(xds, Xds) else Xds(xds)
    listeners, extensions = copy.deepcopy(xds.listeners), xds.extensions
    clusters = copy.deepcopy(list(clusters))
    unanswered = False
    if any(asks_ads(f) for listener in listeners for f in all_filters(listener)):
        assert ecds_dir is not None, "filters ask for ECDS: give ecds_dir"
        Path(ecds_dir).mkdir(parents=True, exist_ok=True)
        serve_extensions(ecds_dir, list(extensions), wasm)
        unanswered = _ecds_from_files(listeners, {e["name"] for e in extensions}, Path(ecds_dir))
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
                *([_unanswered_cluster()] if unanswered else []),
            ],
        },
    }


def _unanswered_cluster() -> dict:
    """An HTTP/2 cluster to a loopback port nothing listens on."""
    return {
        "name": UNANSWERED, "type": "STATIC", "connect_timeout": "0.25s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": UNANSWERED, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": free_port()}}}}]}]},
    }


def harness_ports(ports: dict[int, int], admin_port: int, backend_port: int, traffic: int = 8080) -> Ports:
    """tests.harness.envoy.Ports for the Envoy class (health = :18180's actual port)."""
    return Ports(traffic=ports[traffic], health=ports[HEALTH_PORT], admin=admin_port, backend=backend_port)
