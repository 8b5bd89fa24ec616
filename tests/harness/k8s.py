"""helm and kubectl, as `make k8s-tools` installs them into .tools/k8s/bin, run
offline (`helm template`/`lint`, `kubectl ... --dry-run=client`), and the
drain-gate chart rendered with them."""
from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import yaml

from tests.harness.envoy import REPO

K8S_BIN = REPO / ".tools" / "k8s" / "bin"
CHART = REPO / "envoyfilter" / "chart"
GATEWAY_CHART = REPO.parent / "shared" / "istio-gateway-chart"
NAMESPACE = "istio-system"


def tool(name: str) -> str:
    path = K8S_BIN / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `make k8s-tools` (part of `make test`)")
    return str(path)


def run(name: str, *args: str, check: bool = True, cwd: Path = REPO, **kw) -> subprocess.CompletedProcess:
    """`helm`/`kubectl` with `args` (keywords go to subprocess.run, e.g. input=);
    check=True raises with its stderr. No cluster is configured
    (KUBECONFIG=/dev/null): only offline commands can succeed."""
    r = subprocess.run([tool(name), *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                       env={**os.environ, "KUBECONFIG": "/dev/null"}, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r


def docs(text: str) -> list:
    """The documents of a YAML stream, empty ones left out (libyaml's safe loader)."""
    return [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d is not None]


def without_nulls(obj):
    """What the API server stores: a null field is an unset field."""
    if isinstance(obj, dict):
        return {k: without_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [without_nulls(v) for v in obj]
    return obj


def wasm_base64_file(wasm: bytes, directory: Path) -> Path:
    """What `make configmap` writes for --set-file wasm.base64=..."""
    path = directory / "drain_gate.wasm.b64"
    path.write_text(base64.b64encode(wasm).decode())
    return path


def template(*args: str, chart: Path = CHART, release: str = "drain-gate", check: bool = True):
    """`helm template` of a chart: the objects, or the CompletedProcess when check=False."""
    r = run("helm", "template", release, str(chart), "-n", NAMESPACE, *args, check=check)
    return docs(r.stdout) if check else r


def by_kind(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}
