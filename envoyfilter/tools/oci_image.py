#!/usr/bin/env python3
"""Package drain_gate.wasm as an OCI image that Istio's WasmPlugin pulls (oci://).

Writes, without docker (Python stdlib only):
  OUT/drain-gate/          an OCI image layout (oci-layout, index.json, blobs/sha256/…)
  OUT/drain-gate.oci.tar   the same layout as one tarball (skopeo's oci-archive:)

The image is the *compat* variant of the Wasm image spec that istio-agent reads
(istio/istio pkg/wasm/imagefetcher.go, extractOCIStandardImage): a plain OCI
image manifest whose only layer is application/vnd.oci.image.layer.v1.tar+gzip
holding a file named plugin.wasm. Not the artifact variant
(application/vnd.module.wasm.content.layer.v1+wasm): istio-agent accepts that
one only with exactly two layers (extractOCIArtifactImage), and a one-layer
push of the bare .wasm fails with "number of layers must be 2 but got 1".

Everything is deterministic (no timestamps, fixed owners and modes), so one
wasm gives one manifest digest: the value for the WasmPlugin's sha256 field.

usage: oci_image.py --wasm PATH --out DIR [--tag 0.1.0]
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
NAME = "drain-gate"


def _tar_member(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info, data


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build(wasm: bytes, out: Path, tag: str) -> dict:
    """Writes the layout and the tarball; returns the digests."""
    layer_tar = _tar([_tar_member("plugin.wasm", wasm)])
    layer = gzip.compress(layer_tar, compresslevel=9, mtime=0)
    config = _json(
        {
            "architecture": "wasm",
            "os": "wasip1",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer_tar)]},
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [
                {
                    "mediaType": LAYER,
                    "digest": _digest(layer),
                    "size": len(layer),
                    "annotations": {"org.opencontainers.image.title": "plugin.wasm"},
                }
            ],
            "annotations": {
                "org.opencontainers.image.title": NAME,
                "org.opencontainers.image.version": tag,
                "org.opencontainers.image.description": "drain-gate proxy-wasm module (Wasm image spec, compat variant)",
            },
        }
    )
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {"org.opencontainers.image.ref.name": tag},
                }
            ],
        }
    )
    files = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": index}
    for blob in (layer, config, manifest):
        files["blobs/sha256/" + hashlib.sha256(blob).hexdigest()] = blob

    layout = out / NAME
    if layout.exists():
        shutil.rmtree(layout)
    for rel, data in files.items():
        path = layout / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    dirs = ["blobs/", "blobs/sha256/"]
    members = [(_dir_member(d), None) for d in dirs]
    members += [_tar_member(rel, files[rel]) for rel in sorted(files)]
    (out / f"{NAME}.oci.tar").write_bytes(_tar(members))
    return {
        "manifest": _digest(manifest),
        "config": _digest(config),
        "layer": _digest(layer),
        "wasm": _digest(wasm),
    }


def _dir_member(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wasm", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", default="0.1.0")
    args = ap.parse_args(argv)
    wasm = args.wasm.read_bytes()
    if wasm[:4] != b"\0asm":
        print(f"{args.wasm} is not a wasm module", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    d = build(wasm, args.out, args.tag)
    print(f"OCI layout   {args.out / NAME}  (tag {args.tag})")
    print(f"OCI archive  {args.out / (NAME + '.oci.tar')}")
    print(f"manifest     {d['manifest']}   <- WasmPlugin sha256 (without 'sha256:') or url …@{d['manifest']}")
    print(f"wasm         {d['wasm']}  ({len(wasm)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
