"""What an Istio ingress gateway does with the files in envoyfilter/, reproduced
for a real Envoy on loopback.

- CRD validation: every EnvoyFilter / WasmPlugin against the openAPIV3Schema of
  the Istio 1.30.3 CRDs kept in tests/fixtures/istio-crds, with `jsonschema`. Like the API
  server, unknown fields are errors (kubectl's strict field validation) except
  where the schema says x-kubernetes-preserve-unknown-fields.
- EnvoyFilter patches applied the way istiod's envoyfilter/listener_patch.go
  does for context GATEWAY: sub-resource patches (HTTP_FILTER ...) on the
  listeners istiod generated first, LISTENER ADD appended afterwards.
- WasmPlugin converted the way istiod (pilot/pkg/model/wasm.go buildPluginConfig)
  and istio-agent (pkg/wasm/convert.go: remote code rewritten to a local file)
  do, and delivered over ECDS (a file config source instead of ADS).
- A gateway-like bootstrap: node, admin, listeners named like istiod's
  (0.0.0.0_<port>, HCM with cors, fault, router), a backend cluster.

Patch values are used exactly as written; only ports and the wasm file path are
substituted when the bootstrap is written.
"""
from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import jsonschema
import yaml

from tests.harness.envoy import REPO, WASM, Ports

ENVOYFILTER = REPO / "envoyfilter"
ISTIO = ENVOYFILTER / "istio"
KUBERNETES = ENVOYFILTER / "kubernetes"
NETSCALER = ENVOYFILTER / "netscaler"
CRDS = REPO / "tests" / "fixtures" / "istio-crds"
VENVS = REPO / ".venvs"

# Envoy versions the Istio artifacts are run against (Istio 1.28-1.30 ship
# Envoy 1.36+). `make envoy-matrix` installs each into .venvs/envoy-<version>;
# a test checks the Makefile lists the same versions.
ENVOY_MATRIX = ("1.36.4", "1.38.2", "1.40.0")

GATEWAY_LABELS = {"istio": "ingressgateway", "app": "istio-ingressgateway"}
HEALTH_PORT = 18180
# Where istio-proxy serves Envoy's admin API (127.0.0.1 only).
ISTIO_ADMIN_PORT = 15000
WASM_HTTP = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
RBAC_HTTP = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
HCM_NAME = "envoy.filters.network.http_connection_manager"
HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)
# What HAProxy 2.6 writes for `option httpchk GET /health_check.html` (captured
# from a real haproxy in tests/test_istio_envoy.py; this constant is checked
# against that capture).
HAPROXY_HTTPCHK = b"GET /health_check.html HTTP/1.0\r\n\r\n"


# -- files -----------------------------------------------------------------
def yaml_files() -> list[Path]:
    return sorted(p for p in ENVOYFILTER.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


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


# -- CRD schemas ----------------------------------------------------------------
def _strict(schema: dict) -> dict:
    """Unknown fields are errors, as with `kubectl apply --validate=strict`:
    every object schema that lists properties gets additionalProperties: false,
    unless it preserves unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> validator for the whole object."""
    out = {}
    for path in sorted(CRDS.glob("*.crd.yaml")):
        for crd in load_docs(path):
            group = crd["spec"]["group"]
            kind = crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
                # The API server adds these to every CRD schema.
                schema["properties"].update(
                    {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "namespace": {"type": "string"},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                            },
                            "required": ["name"],
                        },
                    }
                )
                schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
                strict = _strict(schema)
                jsonschema.Draft7Validator.check_schema(strict)
                out[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(strict)
    return out


def crd_errors(obj: dict, validators) -> list[str]:
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in validators:
        return [f"no CRD schema for {key}"]
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validators[key].iter_errors(obj)
    ]


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


def _context_ok(match: dict) -> bool:
    return match.get("context", "ANY") in ("ANY", "GATEWAY")


def _listener_ok(listener: dict, match: dict) -> bool:
    lm = match.get("listener") or {}
    if "portNumber" in lm and listener["address"]["socket_address"]["port_value"] != lm["portNumber"]:
        return False
    if "name" in lm and listener["name"] != lm["name"]:
        return False
    return True


def _hcms(listener: dict, match: dict):
    """The HCM configs of the listener that the filterChain.filter match selects."""
    fm = ((match.get("listener") or {}).get("filterChain") or {}).get("filter") or {}
    for chain in listener.get("filter_chains", []):
        for f in chain.get("filters", []):
            if "name" in fm and f["name"] != fm["name"]:
                continue
            if f.get("typed_config", {}).get("@type") == HCM_TYPE:
                yield f["typed_config"]


def apply_envoyfilters(listeners: list[dict], envoyfilters: list[dict], labels: dict = GATEWAY_LABELS) -> list[dict]:
    """The listeners after istiod applied `envoyfilters` for a gateway with `labels`.

    Implements what the files here use (HTTP_FILTER INSERT_BEFORE/ADD,
    LISTENER ADD, and CLUSTER ADD: see `added_clusters`) and refuses anything
    else, so a change of operation cannot pass unnoticed.
    """
    out = copy.deepcopy(listeners)
    patches = [p for ef in envoyfilters if _selected(ef, labels) for p in ef["spec"]["configPatches"]]
    for p in patches:
        if not _context_ok(p.get("match", {})):
            continue
        op = p["patch"]["operation"]
        if p["applyTo"] in ("LISTENER", "CLUSTER"):
            if op != "ADD":
                raise NotImplementedError(f"{p['applyTo']} {op}")
            continue
        if p["applyTo"] != "HTTP_FILTER":
            raise NotImplementedError(p["applyTo"])
        sub = ((((p["match"].get("listener") or {}).get("filterChain") or {}).get("filter") or {}).get("subFilter") or {}).get("name")
        for listener in out:
            if not _listener_ok(listener, p["match"]):
                continue
            for hcm in _hcms(listener, p["match"]):
                filters = hcm["http_filters"]
                value = copy.deepcopy(p["patch"]["value"])
                if op == "ADD":
                    filters.append(value)
                elif op == "INSERT_BEFORE":
                    at = next((i for i, f in enumerate(filters) if f["name"] == sub), None) if sub else 0
                    if at is not None:
                        filters.insert(at, value)
                else:
                    raise NotImplementedError(f"HTTP_FILTER {op}")
    # istiod appends added listeners after patching its own (listener_patch.go).
    for p in patches:
        if p["applyTo"] == "LISTENER" and p["patch"]["operation"] == "ADD" and _context_ok(p.get("match", {})):
            out.append(copy.deepcopy(p["patch"]["value"]))
    return out


def added_clusters(envoyfilters: list[dict], labels: dict = GATEWAY_LABELS) -> list[dict]:
    """The clusters the CLUSTER ADD patches of `envoyfilters` add to a gateway."""
    return [
        copy.deepcopy(p["patch"]["value"])
        for ef in envoyfilters if _selected(ef, labels)
        for p in ef["spec"]["configPatches"]
        if p["applyTo"] == "CLUSTER" and p["patch"]["operation"] == "ADD" and _context_ok(p.get("match", {}))
    ]


# -- istiod + istio-agent: a WasmPlugin ----------------------------------------------
def wasmplugin_resource_name(wp: dict) -> str:
    return f"extensions.istio.io/wasmplugin/{wp['metadata']['namespace']}.{wp['metadata']['name']}"


def wasmplugin_extension_config(wp: dict, local_file: Path, resource_version: str = "1") -> dict:
    """The ECDS TypedExtensionConfig Envoy receives for a HTTP WasmPlugin: as istiod
    builds it (buildPluginConfig/buildVMConfig: no vm_id, runtime v8, the
    resource-version environment variable, failStrategy -> failure_policy) after
    istio-agent fetched the module and rewrote the code to a local file."""
    spec = wp["spec"]
    assert spec.get("type", "HTTP") in ("HTTP", "UNSPECIFIED_PLUGIN_TYPE"), spec.get("type")
    env = {"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": resource_version}
    if spec.get("imagePullPolicy", "UNSPECIFIED_POLICY") != "UNSPECIFIED_POLICY":
        env["ISTIO_META_WASM_IMAGE_PULL_POLICY"] = spec["imagePullPolicy"]
    config = {
        "name": f"{wp['metadata']['namespace']}.{wp['metadata']['name']}",
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
        "typed_config": {"@type": WASM_HTTP, "config": config},
    }


def insert_wasmplugin(listeners: list[dict], wp: dict, ecds_path: Path) -> list[dict]:
    """istiod's gateway listeners with the WasmPlugin's ECDS filter just before
    the router (phase UNSPECIFIED_PHASE), on every HCM it built itself."""
    assert wp["spec"].get("phase", "UNSPECIFIED_PHASE") == "UNSPECIFIED_PHASE"
    out = copy.deepcopy(listeners)
    for listener in out:
        for hcm in _hcms(listener, {}):
            filters = hcm["http_filters"]
            at = next(i for i, f in enumerate(filters) if f["name"] == "envoy.filters.http.router")
            filters.insert(
                at,
                {
                    "name": wasmplugin_resource_name(wp),
                    "config_discovery": {
                        # istiod: ADS with initial_fetch_timeout 0 (wait for it).
                        "config_source": {
                            "path_config_source": {"path": str(ecds_path)},
                            "resource_api_version": "V3",
                            "initial_fetch_timeout": "0s",
                        },
                        "type_urls": [WASM_HTTP, RBAC_HTTP],
                    },
                },
            )
    return out


def write_ecds(path: Path, extension_configs: list[dict]) -> None:
    path.write_text(yaml.safe_dump({"version_info": "1", "resources": extension_configs}, sort_keys=False))


# -- the bootstrap ---------------------------------------------------------------
def wasm_filters(listener: dict):
    """(hcm filter entry) for every inline wasm HTTP filter of a listener."""
    for hcm in _hcms(listener, {}):
        for f in hcm["http_filters"]:
            if f.get("typed_config", {}).get("@type") == WASM_HTTP:
                yield f


def gateway_bootstrap(listeners: list[dict], ports: dict[int, int], admin_port: int, backend_port: int,
                      wasm: Path = WASM, clusters: list[dict] = ()) -> dict:
    """A bootstrap holding `listeners` and added `clusters` as written, but for
    ports (logical -> actual, every listener port must be mapped; a cluster's
    ISTIO_ADMIN_PORT is the admin's actual port) and the wasm file path."""
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
    return {
        "node": {
            "id": "router~127.0.0.1~istio-ingressgateway-0.istio-system~istio-system.svc.cluster.local",
            "cluster": "istio-ingressgateway.istio-system",
        },
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": listeners,
            "clusters": [
                {
                    "name": "backend",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "backend",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": backend_port}}}}]}],
                    },
                },
                *clusters,
            ],
        },
    }


def harness_ports(ports: dict[int, int], admin_port: int, backend_port: int, traffic: int = 8080) -> Ports:
    """tests.harness.envoy.Ports for the Envoy class (health = :18180's actual port)."""
    return Ports(traffic=ports[traffic], health=ports[HEALTH_PORT], admin=admin_port, backend=backend_port)


# -- OCI image (envoyfilter/tools/oci_image.py writes it) ---------------------------------
def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def istio_extract_compat(layout: Path, ref: str | None = None) -> bytes:
    """The wasm istio-agent takes out of an image in this OCI layout, following
    pkg/wasm/imagefetcher.go for the "compat" variant: the (last) layer must be
    application/vnd.oci.image.layer.v1.tar+gzip and hold a file named plugin.wasm."""
    index = json.loads((layout / "index.json").read_text())
    manifests = index["manifests"]
    if ref is not None:
        manifests = [m for m in manifests if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref]
    assert len(manifests) == 1, manifests
    blob = lambda d: (layout / "blobs" / d.split(":", 1)[0] / d.split(":", 1)[1]).read_bytes()  # noqa: E731
    manifest = json.loads(blob(manifests[0]["digest"]))
    layer = manifest["layers"][-1]
    if layer["mediaType"] != "application/vnd.oci.image.layer.v1.tar+gzip":
        raise ValueError(f"invalid media type {layer['mediaType']}")
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))) as tar:
        for member in tar.getmembers():
            if Path(member.name).name == "plugin.wasm":
                return tar.extractfile(member).read()
    raise ValueError("plugin.wasm not found in the archive")
