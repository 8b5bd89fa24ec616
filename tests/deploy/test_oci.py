"""`make oci`: an OCI image layout (and tarball) holding drain_gate.wasm in the
Wasm image spec's compat variant, the form istio-agent pulls for a WasmPlugin's
oci:// url. Layout, media types, digests and sizes are checked here; that
istio-agent's extraction gets the module back, and that Envoy runs it, is in
tests/deploy/test_istio_envoy.py."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.harness import istio
from tests.harness.envoy import WASM

TOOL = istio.ENVOYFILTER / "tools" / "oci_image.py"


def _blob(layout: Path, digest: str) -> bytes:
    algo, hexd = digest.split(":", 1)
    assert algo == "sha256"
    data = (layout / "blobs" / algo / hexd).read_bytes()
    assert hashlib.sha256(data).hexdigest() == hexd, f"blob {digest} does not hash to its name"
    return data


def _build(tmp: Path, wasm: bytes, tag: str = "0.1.0") -> tuple[Path, str]:
    src = tmp / "in.wasm"
    src.write_bytes(wasm)
    r = subprocess.run([sys.executable, str(TOOL), "--wasm", str(src), "--out", str(tmp / "out"), "--tag", tag],
                       capture_output=True, text=True, check=True)
    return tmp / "out", r.stdout


@pytest.fixture(scope="module")
def wasm() -> bytes:
    assert WASM.exists(), "run `make build`"
    return WASM.read_bytes()


@pytest.fixture(scope="module")
def built(tmp_path_factory, wasm):
    return _build(tmp_path_factory.mktemp("oci"), wasm)


def test_layout_media_types_and_digests(built, wasm):
    out, stdout = built
    layout = out / "drain-gate"
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    assert index["schemaVersion"] == 2
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    (desc,) = index["manifests"]
    assert desc["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == "0.1.0"
    raw_manifest = _blob(layout, desc["digest"])
    assert desc["size"] == len(raw_manifest)
    manifest = json.loads(raw_manifest)
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    raw_config = _blob(layout, manifest["config"]["digest"])
    assert manifest["config"]["size"] == len(raw_config)
    # compat variant: exactly one layer, a gzipped tar holding plugin.wasm
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    raw_layer = _blob(layout, layer["digest"])
    assert layer["size"] == len(raw_layer)
    tar_bytes = gzip.decompress(raw_layer)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        (member,) = tar.getmembers()
        assert member.name == "plugin.wasm" and member.isfile()
        assert tar.extractfile(member).read() == wasm
    config = json.loads(raw_config)
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar_bytes).hexdigest()]}
    assert config["architecture"] and config["os"]
    # every blob is referenced; nothing else is in the layout
    blobs = {p.name for p in (layout / "blobs" / "sha256").iterdir()}
    assert blobs == {d.split(":")[1] for d in (desc["digest"], manifest["config"]["digest"], layer["digest"])}
    # the digest a WasmPlugin pins (sha256 / @sha256:) is the manifest's, and the tool says so
    assert desc["digest"] in stdout


def test_tarball_is_the_same_layout(built):
    out, _ = built
    layout = out / "drain-gate"
    with tarfile.open(out / "drain-gate.oci.tar") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    on_disk = {p.relative_to(layout).as_posix(): p.read_bytes() for p in layout.rglob("*") if p.is_file()}
    assert files == on_disk
    assert set(files) >= {"oci-layout", "index.json"}


def test_istio_agent_extraction_returns_the_module(built, wasm):
    out, _ = built
    assert istio.istio_extract_compat(out / "drain-gate", "0.1.0") == wasm


def test_build_is_reproducible(tmp_path, wasm, built):
    out, _ = built
    again, _ = _build(tmp_path, wasm)
    assert (again / "drain-gate.oci.tar").read_bytes() == (out / "drain-gate.oci.tar").read_bytes()


def test_another_module_gives_another_manifest_digest(tmp_path, wasm, built):
    out, _ = built
    other, _ = _build(tmp_path, wasm + b"\0")
    a = json.loads((out / "drain-gate" / "index.json").read_text())["manifests"][0]["digest"]
    b = json.loads((other / "drain-gate" / "index.json").read_text())["manifests"][0]["digest"]
    assert a != b


def test_refuses_a_file_that_is_not_wasm(tmp_path):
    bad = tmp_path / "x.wasm"
    bad.write_bytes(b"#!/bin/sh\n")
    r = subprocess.run([sys.executable, str(TOOL), "--wasm", str(bad), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not a wasm module" in r.stderr
