"""The OCI image envoyfilter/tools/oci_image.py writes, read the way istio-agent reads it."""
from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path


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
