"""CRD validation: every EnvoyFilter / WasmPlugin against the openAPIV3Schema of
the Istio 1.30.3 CRDs kept in tests/fixtures/istio-crds, with `jsonschema`. Like the API
server, unknown fields are errors (kubectl's strict field validation) except
where the schema says x-kubernetes-preserve-unknown-fields. The CRDs' CEL rules
(x-kubernetes-validations) with cel-python, and built-in kinds against the
Kubernetes schemas kubernetes-validate bundles."""
from __future__ import annotations

import copy
import urllib.parse
from pathlib import Path

import celpy
import jsonschema
import kubernetes_validate

from tests.harness import k8s
from tests.harness.istio.files import CRDS


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
        for crd in k8s.docs(path.read_text()):
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


def k8s_errors(obj: dict, versions: tuple[str, ...] = K8S_VERSIONS) -> list[str]:
    """Why `obj` is not a valid Kubernetes object (strict: unknown fields are
    errors) for each of `versions`; empty when it is."""
    errors = []
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"k8s {version}: {'/'.join(map(str, e.path))}: {e.message}")
    return errors
