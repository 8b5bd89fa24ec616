"""Bootstrap variants for the hardening tests, built from the shipped envoy.yaml.

Each function takes the dict that `tests.harness.envoy.render` produced and
changes only what its name says; everything else stays as shipped.
"""
from __future__ import annotations

import copy
import json
import os
import re
import socket
import tempfile
from pathlib import Path

import requests
import yaml

from tests.harness.envoy import REPO

FAULT_HEADER = "x-fault-abort"
TRAP_HEADER = "x-drain-gate-trap"
FIXTURE_WASM = REPO / "target" / "fixtures" / "wasm32-wasip1" / "release" / "drain_gate_trap.wasm"
TRANSITION = re.compile(r"event=transition from=(\w+) to=(\w+) reason=(\w+) active=(\d+) forced=(\w+)")
# What a wasm VM in trouble prints (Rust panic, V8 trap, Envoy's own verdicts).
VM_TROUBLE = re.compile(r"panicked|wasm trap|Function: .* failed|\]\[critical\]|VM failed|Wasm VM failed|"
                        r"failed to call|unreachable", re.IGNORECASE)


def listener(doc: dict, name: str) -> dict:
    for lst in doc["static_resources"]["listeners"]:
        if lst["name"] == name:
            return lst
    raise KeyError(name)


def hcm(lst: dict) -> dict:
    return lst["filter_chains"][0]["filters"][0]["typed_config"]


def plugin(doc: dict, listener_name: str) -> dict:
    """The wasm PluginConfig of the drain-gate filter of one listener."""
    for f in hcm(listener(doc, listener_name))["http_filters"]:
        if f["name"] == "drain-gate":
            return f["typed_config"]["config"]
    raise KeyError(listener_name)


def plugin_config(doc: dict, listener_name: str) -> dict:
    return json.loads(plugin(doc, listener_name)["configuration"]["value"])


def set_plugin_config(doc: dict, listener_name: str, value: dict | str) -> None:
    text = value if isinstance(value, str) else json.dumps(value)
    plugin(doc, listener_name)["configuration"]["value"] = text


def with_fault_and_timeout(doc: dict, abort_percent: int = 20, route_timeout: str = "0.2s") -> dict:
    """Traffic listener with Envoy's fault filter BEFORE drain-gate (aborting
    `abort_percent` % of the requests that carry FAULT_HEADER with a local 503)
    and a second route, /timeout → the backend's /slow, with a route timeout."""
    doc = copy.deepcopy(doc)
    t = hcm(listener(doc, "traffic"))
    fault = {
        "name": "envoy.filters.http.fault",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
            "abort": {"http_status": 503, "percentage": {"numerator": abort_percent, "denominator": "HUNDRED"}},
            "headers": [{"name": FAULT_HEADER, "present_match": True}],
        },
    }
    filters = t["http_filters"]
    idx = next(i for i, f in enumerate(filters) if f["name"] == "drain-gate")
    filters.insert(idx, fault)
    routes = t["route_config"]["virtual_hosts"][0]["routes"]
    routes.insert(0, {
        "match": {"prefix": "/timeout"},
        "route": {"cluster": "backend", "timeout": route_timeout, "prefix_rewrite": "/slow"},
    })
    return doc


def with_code(doc: dict, listener_name: str, wasm: Path, failure_policy: str | None = None) -> dict:
    """The drain-gate filter of one listener loads `wasm` instead (same vm_id)."""
    doc = copy.deepcopy(doc)
    p = plugin(doc, listener_name)
    p["vm_config"]["code"]["local"]["filename"] = str(wasm)
    if failure_policy:
        p["failure_policy"] = failure_policy
    return doc


class Lds:
    """Moves the bootstrap's listeners into a file-based LDS source in a watched
    directory. `push()` replaces the file atomically (rename into place)."""

    def __init__(self, doc: dict, workdir: Path):
        self.dir = Path(workdir) / "lds"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "listeners.yaml"
        self.listeners = copy.deepcopy(doc["static_resources"]["listeners"])
        self.doc = copy.deepcopy(doc)
        del self.doc["static_resources"]["listeners"]
        # File-based xDS needs a node identity.
        self.doc.setdefault("node", {"id": "drain-gate-test", "cluster": "drain-gate-test"})
        self.doc["dynamic_resources"] = {
            "lds_config": {
                "path_config_source": {"path": str(self.path), "watched_directory": {"path": str(self.dir)}},
                "resource_api_version": "V3",
            }
        }
        self.push(self.listeners)

    def listener(self, name: str, listeners: list | None = None) -> dict:
        return next(lst for lst in (listeners or self.listeners) if lst["name"] == name)

    def push(self, listeners: list) -> None:
        body = {"resources": [{"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", **lst}
                              for lst in listeners]}
        fd, tmp = tempfile.mkstemp(dir=self.dir.parent, prefix=".lds-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump(body, sort_keys=False))
        os.rename(tmp, self.path)


def transitions(log: str) -> list[tuple[str, str, str]]:
    """Every logged transition, in log order: (from, to, reason)."""
    return [(m[1], m[2], m[3]) for m in TRANSITION.finditer(log)]


def status(gw, **kw) -> dict:
    r = requests.get(gw.health("/drain/status"), timeout=kw.pop("timeout", 5), **kw)
    assert r.status_code == 200, r.text
    return r.json()


def state(gw) -> str:
    return status(gw)["state"]


def post(gw, path: str, **kw) -> requests.Response:
    return requests.post(gw.health(path), timeout=kw.pop("timeout", 10), **kw)


def fresh_get(port: int, path: str, host: str = "127.0.0.1", source: str | None = None,
              headers: dict | None = None, method: str = "GET", timeout: float = 5) -> tuple[int, dict, bytes]:
    """One request on a new connection (so it may land on any worker)."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request(method, path, headers={"connection": "close", **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def recv_until_close(sock: socket.socket, limit: int = 1 << 22) -> bytes:
    out = b""
    while len(out) < limit:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not data:
            break
        out += data
    return out


STATUS_LINE = re.compile(rb"HTTP/1\.1 (\d{3}) ")


def statuses(raw: bytes) -> list[int]:
    """Status codes of every response in a raw HTTP/1.1 byte stream (no 1xx here)."""
    return [int(m[1]) for m in STATUS_LINE.finditer(raw)]


def gateway_factory(backend_port: int, tmp_path: Path, stack):
    """Like conftest's `gateway`, but `transform(doc) -> doc` may rewrite the
    rendered bootstrap first. Every Envoy it starts is stopped by `stack`."""
    from tests.harness.envoy import Envoy, Ports, render

    def start(config: dict | None = None, *, transform=None, concurrency: int = 2,
              wait_ready: bool = True, drain_time_s: int = 1, **kw) -> Envoy:
        ports = Ports(backend=backend_port)
        workdir = tmp_path / f"envoy-{ports.health}"
        workdir.mkdir(parents=True, exist_ok=True)
        doc = render(ports, config, **kw)
        if transform is not None:
            doc = transform(doc, workdir)
        envoy = Envoy(doc, ports, concurrency=concurrency, workdir=workdir, drain_time_s=drain_time_s)
        stack.callback(envoy.stop)
        return envoy.start(wait_ready=wait_ready)

    return start
