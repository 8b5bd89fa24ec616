"""Where the Istio artifacts of envoyfilter/ and their fixtures are, the Envoy
versions they are run against, the labels and ports they name, and their YAML."""
from __future__ import annotations

from pathlib import Path

from tests.harness import k8s
from tests.harness.envoy import REPO

ENVOYFILTER = REPO / "envoyfilter"
ISTIO = ENVOYFILTER / "istio"
KUBERNETES = ENVOYFILTER / "kubernetes"
NETSCALER = ENVOYFILTER / "netscaler"
CRDS = REPO / "tests" / "fixtures" / "istio-crds"
GATEWAY_API = ENVOYFILTER / "gateway-api"
SHARED = REPO.parent / "shared"
VENVS = REPO / ".venvs"
# The gateways CRD of Gateway API v1.5.1 and the Deployment/Service/PDB that
# Istio 1.30.3's kube-gateway template renders for envoyfilter/gateway-api/.
GATEWAY_API_FIXTURES = REPO / "tests" / "fixtures" / "gateway-api"

# Envoy versions the Istio artifacts are run against (Istio 1.28-1.30 ship
# Envoy 1.36+). `make envoy-matrix` installs each into .venvs/envoy-<version>;
# a test checks the Makefile lists the same versions.
ENVOY_MATRIX = ("1.36.4", "1.38.2", "1.40.0")

GATEWAY_LABELS = {"istio": "ingressgateway", "app": "istio-ingressgateway"}
# The dedicated label the gateway values give the pods that mount the wasm;
# the chart's EnvoyFilters, WasmPlugin and PDB select it.
DRAIN_GATE_LABEL = {"drain-gate.io/enabled": "true"}
POD_LABELS = {**GATEWAY_LABELS, **DRAIN_GATE_LABEL}
# The Istio version istiod matches match.proxy.proxyVersion against (the
# version of the gateway chart in ../shared).
PROXY_VERSION = "1.30.3"
HEALTH_PORT = 18180
# The example Gateway's TLS-passthrough server: port 443, which
# envoyfilter/kubernetes/service.yaml maps to the listener port 8443 (NodePort
# 31443); the WasmPlugin form's tcp.yaml matches the server's port.
PASSTHROUGH_SERVER_PORT, PASSTHROUGH_LISTENER_PORT = 443, 8443
# Where istio-proxy serves Envoy's admin API (127.0.0.1 only).
ISTIO_ADMIN_PORT = 15000
# What HAProxy 2.6 writes for `option httpchk GET /health_check.html` (captured
# from a real haproxy in tests/deploy/test_istio_envoy.py; this constant is checked
# against that capture).
HAPROXY_HTTPCHK = b"GET /health_check.html HTTP/1.0\r\n\r\n"


def yaml_files() -> list[Path]:
    """Every YAML file under envoyfilter/ but the chart's templates (Go templates, not YAML)."""
    templates = ENVOYFILTER / "chart" / "templates"
    return sorted(p for p in ENVOYFILTER.rglob("*")
                  if p.suffix in (".yaml", ".yml") and p.is_file() and templates not in p.parents)


def load_docs(path: Path) -> list:
    """The documents of a YAML file (tests.harness.k8s.docs)."""
    return k8s.docs(path.read_text())


def load_one(path: Path) -> dict:
    docs = load_docs(path)
    assert len(docs) == 1, f"{path}: expected one document, found {len(docs)}"
    return docs[0]


def objects(kind: str) -> dict[Path, dict]:
    """Every object of `kind` in envoyfilter/, by file."""
    out = {}
    for path in yaml_files():
        for doc in load_docs(path):
            if isinstance(doc, dict) and doc.get("kind") == kind:
                out[path] = doc
    return out


def envoy_bin(version: str) -> str:
    """The envoy binary of the cached venv for `version`."""
    found = sorted((VENVS / f"envoy-{version}").glob("lib/python*/site-packages/envoy/_bin/envoy"))
    if not found:
        raise FileNotFoundError(
            f"{VENVS}/envoy-{version} has no envoy binary: run `make envoy-matrix` (or `make test`)"
        )
    return str(found[0])
