#!/usr/bin/env python3
"""Write what carries drain_gate.wasm into the gateway pods.

--base64-out: the module as base64 text, for the drain-gate chart
(`--set-file wasm.base64=FILE`), which renders the ConfigMap.
--out: the ConfigMap itself, for an install without the chart's ConfigMap
(wasm.configMap.create=false): `kubectl create -f` or `kubectl apply
--server-side -f` it, never plain `kubectl apply` (client-side apply copies
the object into an annotation capped at 262,144 bytes; this one is larger).

The gateway Helm values (../kubernetes/gateway-values.yaml) mount its key
drain_gate.wasm at /etc/drain-gate/drain_gate.wasm, the path both roles
load. A ConfigMap holds at most 1 MiB: the module must stay below that (it is
checked here, by the chart, and in tests/deploy/test_istio_kubernetes.py).

usage: configmap.py --wasm PATH --out FILE [--base64-out FILE] [--namespace istio-system]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import os
import sys
import tempfile
from pathlib import Path

NAME = "drain-gate-wasm"
KEY = "drain_gate.wasm"
# Kubernetes refuses a ConfigMap whose data exceeds 1 MiB (MaxSecretSize/
# ConfigMap validation: 1048576 bytes for data + binaryData).
LIMIT = 1024 * 1024


def configmap(wasm: bytes, namespace: str) -> str:
    """The ConfigMap as YAML (plain scalars only: no YAML library needed)."""
    return (
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        f"  name: {NAME}\n"
        f"  namespace: {namespace}\n"
        "  labels:\n"
        "    app.kubernetes.io/name: drain-gate\n"
        "  annotations:\n"
        f"    drain-gate/wasm-sha256: \"{hashlib.sha256(wasm).hexdigest()}\"\n"
        "binaryData:\n"
        f"  {KEY}: {base64.b64encode(wasm).decode()}\n"
    )


def write_whole(path: Path, text: str) -> None:
    """Writes `path` by renaming a written file onto it: a reader sees the old file or the new one,
    never a part (two `make configmap` at once write the same files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wasm", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base64-out", type=Path, help="the module as base64 text, for the chart")
    ap.add_argument("--namespace", default="istio-system")
    args = ap.parse_args(argv)
    wasm = args.wasm.read_bytes()
    if len(wasm) >= LIMIT:
        print(f"{args.wasm}: {len(wasm)} bytes; a ConfigMap holds at most 1 MiB ({LIMIT} bytes)", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(args.out, configmap(wasm, args.namespace))
    if args.base64_out:
        write_whole(args.base64_out, base64.b64encode(wasm).decode())
    print(f"{args.out}: ConfigMap {args.namespace}/{NAME}, {len(wasm)} bytes of wasm "
          f"({100 * len(wasm) // LIMIT}% of the 1 MiB limit)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
