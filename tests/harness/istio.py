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
import re
import subprocess
import tarfile
import urllib.parse
from pathlib import Path

import celpy
import jsonschema
import kubernetes_validate
import yaml

from tests.harness.envoy import REPO, WASM, Ports

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
# `make k8s-tools` installs it.
KUBECTL = REPO / ".tools" / "k8s" / "bin" / "kubectl"

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
# Where istio-proxy serves Envoy's admin API (127.0.0.1 only).
ISTIO_ADMIN_PORT = 15000
WASM_HTTP = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
WASM_NETWORK = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm"
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
    """Every YAML file under envoyfilter/ but the chart's templates (Go templates, not YAML)."""
    templates = ENVOYFILTER / "chart" / "templates"
    return sorted(p for p in ENVOYFILTER.rglob("*")
                  if p.suffix in (".yaml", ".yml") and p.is_file() and templates not in p.parents)


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


def crd_validators(paths: list[Path] | None = None) -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> validator for the whole object, for every version
    of the CRDs in `paths` (default: the Istio CRDs)."""
    out = {}
    for key, schema in crd_schemas(paths).items():
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
        out[key] = jsonschema.Draft7Validator(strict)
    return out


def crd_schemas(paths: list[Path] | None = None) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> a copy of the openAPIV3Schema, for every version
    of the CRDs in `paths` (default: the Istio CRDs)."""
    if paths is None:
        if not CRDS.is_dir():
            raise FileNotFoundError(
                f"Istio CRDs not found at {CRDS}: the tests expect a copy of shared/ beside the "
                "repository (REPO/../shared/istio-crds/{envoyfilter,wasmplugin}.crd.yaml)"
            )
        paths = sorted(CRDS.glob("*.crd.yaml"))
    out = {}
    for path in paths:
        # libyaml's loader: the Gateway API CRD has thousands of lines.
        for crd in (d for d in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader) if d):
            for version in crd["spec"]["versions"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                out[key] = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    return out


def _is_url(s) -> celpy.celtypes.BoolType:
    """Kubernetes' isURL: Go's url.ParseRequestURI accepts an absolute URL or path."""
    parsed = urllib.parse.urlparse(str(s))
    return celpy.celtypes.BoolType(bool(parsed.scheme) or str(s).startswith("/"))


# What the CRDs here call from Kubernetes' CEL libraries beyond standard CEL:
# the strings extension's split, and the URL library (a URL is kept as its string).
K8S_CEL_FUNCTIONS = {
    "split": lambda s, sep: celpy.celtypes.ListType([celpy.celtypes.StringType(x) for x in str(s).split(str(sep))]),
    "isURL": _is_url,
    "url": lambda s: celpy.celtypes.StringType(s),
    "getScheme": lambda u: celpy.celtypes.StringType(urllib.parse.urlparse(str(u)).scheme),
}


def cel_errors(obj: dict, schemas: dict[tuple[str, str], dict]) -> list[str]:
    """The CRD's CEL rules (x-kubernetes-validations) that `obj` breaks,
    evaluated with cel-python wherever the object has the field a rule sits
    on, as the API server does on create (rules on oldSelf only apply to
    updates: skipped). A rule that cannot be evaluated is an error too."""
    env = celpy.Environment()
    errors: list[str] = []

    def walk(schema: dict, value, path: str) -> None:
        for rule in schema.get("x-kubernetes-validations", []):
            if "oldSelf" in rule["rule"]:
                continue
            program = env.program(env.compile(rule["rule"]), functions=K8S_CEL_FUNCTIONS)
            try:
                result = program.evaluate({"self": celpy.json_to_cel(value)})
            except celpy.CELEvalError as e:
                result = e
            if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
                errors.append(f"{path or '(root)'}: {rule.get('message') or rule['rule']} ({result!r})")
        if isinstance(value, dict):
            for key, sub in value.items():
                child = (schema.get("properties") or {}).get(key) or schema.get("additionalProperties")
                if isinstance(child, dict):
                    walk(child, sub, f"{path}/{key}")
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                walk(schema["items"], item, f"{path}/{i}")

    walk(schemas[(obj["apiVersion"], obj["kind"])], obj, "")
    return errors


def crd_errors(obj: dict, validators) -> list[str]:
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in validators:
        return [f"no CRD schema for {key}"]
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validators[key].iter_errors(obj)
    ]


# -- Kubernetes schemas --------------------------------------------------------------
# The sidecar design's cluster (k8s 1.30) and the newest schema kubernetes-validate bundles.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())


def k8s_errors(obj: dict) -> list[str]:
    """Why `obj` is not a valid Kubernetes object (strict: unknown fields are
    errors) for each of K8S_VERSIONS; empty when it is."""
    errors = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"k8s {version}: {'/'.join(map(str, e.path))}: {e.message}")
    return errors


# -- kubectl, offline -------------------------------------------------------------
def kubectl(*args: str, stdin: str | None = None) -> str:
    """kubectl's stdout; its stderr in the error when it fails. No cluster is
    configured (KUBECONFIG=/dev/null): only offline commands can succeed."""
    if not KUBECTL.exists():
        raise FileNotFoundError(f"{KUBECTL} is missing: run `make k8s-tools` (or `make test`)")
    r = subprocess.run([str(KUBECTL), *args], input=stdin, capture_output=True, text=True, timeout=60,
                       env={"KUBECONFIG": "/dev/null", "PATH": "/usr/bin:/bin"})
    if r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def strategic_patch(obj: dict, patch: str, workdir: Path) -> dict:
    """`obj` after `kubectl patch --local --type strategic` with the YAML
    `patch`: the strategic merge (k8s.io/apimachinery strategicpatch, with the
    kind's patch keys) that istiod applies to what its template renders."""
    src, patch_file = workdir / "object.yaml", workdir / "patch.yaml"
    src.write_text(yaml.safe_dump(obj, sort_keys=False))
    patch_file.write_text(patch)
    return yaml.safe_load(kubectl("patch", "--local", "--type", "strategic", "-f", str(src),
                                  "--patch-file", str(patch_file), "-o", "yaml"))


# -- the gateway istiod deploys for envoyfilter/gateway-api/gateway.yaml ------------------
# The keys istiod accepts in a parametersRef ConfigMap (Istio 1.30
# deploymentcontroller.go, supportedOverlays), and the kind each one patches.
OVERLAY_KEYS = {"deployment": "Deployment", "service": "Service", "serviceAccount": "ServiceAccount",
                "horizontalPodAutoscaler": "HorizontalPodAutoscaler", "podDisruptionBudget": "PodDisruptionBudget"}


def gateway_api_rendered() -> dict[str, dict]:
    """kind -> the object Istio 1.30.3's template renders for the Gateway
    (tests/fixtures/gateway-api/rendered.yaml), before the ConfigMap's patches."""
    return {d["kind"]: d for d in load_docs(GATEWAY_API_FIXTURES / "rendered.yaml")}


def gateway_api_patched(options: str, kind: str, workdir: Path) -> dict:
    """That object after istiod applied its key of the ConfigMap
    envoyfilter/gateway-api/`options`."""
    key = next(k for k, v in OVERLAY_KEYS.items() if v == kind)
    patch = load_one(GATEWAY_API / options)["data"][key]
    return strategic_patch(gateway_api_rendered()[kind], patch, workdir)


def proxy_container(deployment: dict) -> dict:
    (proxy,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "istio-proxy"]
    return proxy


def assert_prestop_drains(pre: dict, distroless: bool) -> None:
    """The preStop hook of a drain-gate patch: curl POST /drain?wait=closed
    from loopback, or (distroless) httpGet /prestop with a bearer header."""
    if distroless:
        assert pre["httpGet"]["path"] == "/prestop" and pre["httpGet"]["port"] == HEALTH_PORT
        (header,) = pre["httpGet"]["httpHeaders"]
        assert header["name"] == "Authorization" and header["value"].startswith("Bearer ")
    else:
        cmd = pre["exec"]["command"]
        assert cmd[0] == "curl" and cmd[-1] == f"http://127.0.0.1:{HEALTH_PORT}/drain?wait=closed"
        assert cmd[cmd.index("-X") + 1] == "POST"


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


def _hcms(listener: dict, match: dict):
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

    Implements what the files here use (HTTP_FILTER INSERT_BEFORE/ADD,
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


# -- istiod + istio-agent: a WasmPlugin ----------------------------------------------
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


def insert_wasmplugin(listeners: list[dict], wp: dict, ecds_path: Path) -> list[dict]:
    """istiod's gateway listeners with the WasmPlugin's ECDS filter (phase
    UNSPECIFIED_PHASE) on the listeners it built itself: HTTP, just before the
    router of every HCM; NETWORK, on the listeners of the ports its match names
    (every port without one), just before tcp_proxy on a TCP chain
    (buildCompleteNetworkFilters) and before the HCM on an HTTP chain
    (buildGatewayTCPBasedFilterChains: a network extension precedes the HCM)."""
    assert wp["spec"].get("phase", "UNSPECIFIED_PHASE") == "UNSPECIFIED_PHASE"
    out = copy.deepcopy(listeners)
    if wasmplugin_type(wp) == "HTTP":
        for listener in out:
            for hcm in _hcms(listener, {}):
                filters = hcm["http_filters"]
                at = next(i for i, f in enumerate(filters) if f["name"] == "envoy.filters.http.router")
                filters.insert(at, _ecds_filter(wp, ecds_path))
        return out
    ports = _wasmplugin_ports(wp)
    for listener in out:
        if ports is not None and listener["address"]["socket_address"]["port_value"] not in ports:
            continue
        for chain in listener.get("filter_chains", []):
            filters = chain["filters"]
            at = next(i for i, f in enumerate(filters) if f["name"] in (HCM_NAME, "envoy.filters.network.tcp_proxy"))
            filters.insert(at, _ecds_filter(wp, ecds_path))
    return out


def write_ecds(path: Path, extension_configs: list[dict]) -> None:
    path.write_text(yaml.safe_dump({"version_info": "1", "resources": extension_configs}, sort_keys=False))


# -- the bootstrap ---------------------------------------------------------------
def wasm_filters(listener: dict):
    """(filter entry) for every inline wasm HTTP or network filter of a listener."""
    for hcm in _hcms(listener, {}):
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
    ISTIO_ADMIN_PORT is the admin's actual port) and the wasm file path.

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
