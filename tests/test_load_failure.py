"""When the module cannot load: measured in real Envoy 1.40, for both shipped
forms, on a fresh start and on an update of a running Envoy.

The gateway's listeners come from a file-based LDS source (and the WasmPlugin's
filter from a file-based ECDS source), as istiod delivers them over xDS: one
update carries every listener. Each failure is applied to the listeners as
written in envoyfilter/istio/ (only ports and the wasm path substituted):

  module missing        the wasm file does not exist (mount or image absent)
  module corrupt        a file with the wasm header and a broken body
  traffic config        the traffic role's configuration refused by the plugin
  health config         the health role's configuration refused by the plugin

For each, what (a) the traffic listeners and (b) the health listener answer,
and what Envoy did with the update. The table is written to
out/load-failure/table.md and asserted: `make test` fails if Envoy's behaviour
changes. Run on its own:

  PYTHONPATH=. .venv/bin/python -m pytest tests/test_load_failure.py -v -p no:cacheprovider
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests
import yaml

from tests.harness import istio
from tests.harness.envoy import REPO, WASM, Envoy, free_port, wait_for
from tests.harness.variants import Lds
from tests.test_verify import _logical_ports

VERSION = istio.ENVOY_MATRIX[-1]
OUT = REPO / "out" / "load-failure"
BAD_CONFIG = "12x"  # drain_timeout "12x": refused at on_configure
FAILURES = ("module missing", "module corrupt", "traffic config", "health config")
FORMS = ("envoyfilter", "wasmplugin")


def load(rel: str) -> dict:
    return istio.load_one(istio.ISTIO / rel)


def _health_plugin(listener: dict) -> dict:
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return next(f for f in hcm["http_filters"] if f["name"] == "drain-gate")["typed_config"]["config"]


def _refuse(plugin: dict) -> None:
    config = json.loads(plugin["configuration"]["value"])
    config["drain_timeout"] = BAD_CONFIG
    plugin["configuration"]["value"] = json.dumps(config)


class Xds:
    """Files Envoy watches: LDS (every listener) and, for the WasmPlugin form,
    ECDS (the traffic filter). Updates are renamed into place."""

    def __init__(self, form: str, workdir: Path, ports: dict[int, int], admin: int, backend: int):
        self.form, self.workdir = form, workdir
        self.ecds_dir = workdir / "ecds"
        self.ecds_dir.mkdir(parents=True, exist_ok=True)
        self.ecds_path = self.ecds_dir / "ecds.yaml"
        self.wp = load("wasmplugin/traffic.yaml")
        listeners = self.listeners()
        doc = istio.gateway_bootstrap(listeners, ports, admin, backend, WASM)
        self.lds = Lds(doc, workdir)
        self.doc = self.lds.doc

    def listeners(self) -> list[dict]:
        base = [istio.gateway_listener(8080), istio.gateway_listener(8443)]
        if self.form == "envoyfilter":
            return istio.apply_envoyfilters(base, [load("traffic-filter.yaml"), load("health-listener.yaml")])
        with_plugin = istio.insert_wasmplugin(base, self.wp, self.ecds_path)
        for listener in with_plugin:
            for hcm in istio.hcms(listener, {}):
                for f in hcm["http_filters"]:
                    if "config_discovery" in f:
                        f["config_discovery"]["config_source"]["path_config_source"]["watched_directory"] = {
                            "path": str(self.ecds_dir)}
        return istio.apply_envoyfilters(with_plugin, [load("wasmplugin/health-listener.yaml")])

    def ecds(self, wasm: Path, refuse: bool = False) -> None:
        ext = istio.wasmplugin_extension_config(self.wp, wasm)
        if refuse:
            _refuse(ext["typed_config"]["config"])
        fd, tmp = tempfile.mkstemp(dir=self.workdir, suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump({"version_info": "1", "resources": [ext]}, sort_keys=False))
        os.rename(tmp, self.ecds_path)

    def broken(self, failure: str, bad_wasm: Path) -> list[dict]:
        """The LDS listeners with `failure` applied (the ECDS part is written by apply())."""
        listeners = copy.deepcopy(self.lds.listeners)
        health = next(lst for lst in listeners if lst["name"] == "drain-gate-health")
        if failure == "health config":
            _refuse(_health_plugin(health))
        for lst in listeners:
            for f in istio.wasm_filters(lst):
                plugin = f["typed_config"]["config"]
                role = json.loads(plugin["configuration"]["value"])["role"]
                if failure in ("module missing", "module corrupt") and self.form == "envoyfilter":
                    plugin["vm_config"]["code"]["local"]["filename"] = str(bad_wasm)
                if failure == "traffic config" and role == "traffic":
                    _refuse(plugin)
        return listeners

    def touches_ecds(self, failure: str | None) -> bool:
        return self.form == "wasmplugin" and failure in ("module missing", "module corrupt", "traffic config")

    def apply(self, failure: str | None, bad_wasm: Path, first: bool = False) -> None:
        """Writes ECDS (WasmPlugin form: the first time, or when the failure is
        in the traffic filter) and pushes LDS."""
        if self.form == "wasmplugin" and (first or self.touches_ecds(failure)):
            module = bad_wasm if failure in ("module missing", "module corrupt") else WASM
            self.ecds(module, refuse=failure == "traffic config")
        self.lds.push(self.broken(failure, bad_wasm) if failure else self.lds.listeners)


# -- observing ------------------------------------------------------------------------------
def stats(env: Envoy, prefix: str) -> dict[str, int]:
    text = requests.get(env.admin("/stats"), params={"filter": prefix}, timeout=5).text
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def counter(env: Envoy, suffix: str, prefix: str) -> int:
    return sum(v for k, v in stats(env, prefix).items() if k.endswith(suffix))


def answer(port: int, path: str) -> str:
    """The status code a fresh connection gets, or what happened instead."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(64)
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "no answer"
    return head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "closed"


def refusals(env: Envoy) -> tuple[int, int]:
    """(LDS updates rejected, ECDS updates failed) so far."""
    return counter(env, "update_rejected", "listener_manager.lds"), counter(env, "config_fail",
                                                                            "extension_config_discovery")


def verify_says(env: Envoy, at: dict[int, int], tmp: Path) -> str:
    """What envoyfilter/tools/verify.py makes of Envoy's config dump (ports as
    written) and stats: the checks that failed, or "passes"."""
    dump = requests.get(env.admin("/config_dump"), timeout=10).json()
    (tmp / "dump.json").write_text(json.dumps(_logical_ports(dump, {a: l for l, a in at.items()})))
    (tmp / "stats.txt").write_text(requests.get(env.admin("/stats"), timeout=10).text)
    r = subprocess.run([sys.executable, str(istio.ENVOYFILTER / "tools" / "verify.py"), "--config-dump",
                        str(tmp / "dump.json"), "--stats", str(tmp / "stats.txt")],
                       capture_output=True, text=True, timeout=60)
    def checks(kind: str) -> list[str]:
        return sorted({line[5:].split(":")[0] for line in r.stdout.splitlines() if line.startswith(kind + " ")})
    failed, warned = checks("FAIL"), checks("WARN")
    assert (r.returncode == 1) == bool(failed), r.stdout
    said = f"fails: {', '.join(failed)}" if failed else "passes"
    return said + (f"; warns: {', '.join(warned)}" if warned else "")


def observe(env: Envoy, at: dict[int, int], tmp: Path, since: tuple[int, int] = (0, 0)) -> dict:
    """What each port answers, the listeners up, the refusals since `since`,
    and what verify.py says about it."""
    rejected, failed = refusals(env)
    listeners = requests.get(env.admin("/listeners"), params={"format": "json"}, timeout=5).json()
    return {
        "traffic": {p: answer(at[p], "/") for p in (8080, 8443)},
        "health": answer(at[istio.HEALTH_PORT], "/health_check.html"),
        "listeners": sorted(l["name"] for l in listeners.get("listener_statuses", [])),
        "lds_rejected": rejected - since[0],
        "ecds_failed": failed - since[1],
        "server_state": stats(env, "^server.state$").get("server.state"),
        "verify": verify_says(env, at, tmp),
    }


def progress(env: Envoy) -> tuple[int, int]:
    """(LDS updates, ECDS updates) Envoy processed, accepted or not."""
    lds = sum(counter(env, s, "listener_manager.lds") for s in ("update_success", "update_rejected"))
    ecds = sum(counter(env, s, "extension_config_discovery") for s in ("config_reload", "config_fail"))
    return lds, ecds


def settled(env: Envoy, before: tuple[int, int], ecds: bool) -> bool:
    """The LDS update (and the ECDS one, when there is one) was processed and
    no listener is still warming (waiting for its ECDS filter)."""
    lds_now, ecds_now = progress(env)
    warming = stats(env, "^listener_manager.total_listeners_warming$").get(
        "listener_manager.total_listeners_warming", 0)
    return lds_now > before[0] and (not ecds or ecds_now > before[1]) and warming == 0


@pytest.fixture(scope="module")
def rig(backend_port, tmp_path_factory):
    """rig(form, failure, phase) -> the observation. A fresh start gets its own
    Envoy; the updates of one form are pushed, one after the other, to one
    running Envoy (each is refused, so each meets the same good configuration).
    Every Envoy is stopped when the module ends, whatever happens."""
    tmp = tmp_path_factory.mktemp("load-failure")
    bad = {"module missing": tmp / "absent" / "drain_gate.wasm", "module corrupt": tmp / "corrupt.wasm"}
    bad["module corrupt"].write_bytes(b"\0asm\x01\0\0\0" + bytes(range(256)) * 16)
    running: dict[str, tuple] = {}

    def start(stack, form: str, failure: str | None) -> tuple:
        at = {8080: free_port(), 8443: free_port(), istio.HEALTH_PORT: free_port()}
        admin = free_port()
        xds = Xds(form, tmp / f"{form}-{admin}", at, admin, backend_port)
        xds.apply(failure, bad.get(failure, WASM), first=True)
        env = Envoy(xds.doc, istio.harness_ports(at, admin, backend_port), concurrency=2, workdir=xds.workdir)
        stack.callback(env.stop)
        env.start(wait_ready=False)
        wait_for(env.admin_ready, 60, interval=0.05, what="envoy admin /ready")
        wait_for(lambda: settled(env, (0, 0), form == "wasmplugin"), 30, interval=0.05,
                 what="first xDS update processed")
        return env, xds, at

    def run(stack, form: str, failure: str, phase: str) -> dict:
        if phase == "fresh start":
            env, _, at = start(stack, form, failure)
            return observe(env, at, tmp)
        if form not in running:
            running[form] = start(stack, form, None)
            env, _, at = running[form]
            wait_for(lambda: answer(at[istio.HEALTH_PORT], "/health_check.html") == "200", 30,
                     what="good gateway serving")
        env, xds, at = running[form]
        assert answer(at[8080], "/") == answer(at[8443], "/") == "200", "the good configuration serves"
        before, refused = progress(env), refusals(env)
        xds.apply(failure, bad[failure] if failure in bad else WASM)
        wait_for(lambda: settled(env, before, xds.touches_ecds(failure)), 30, interval=0.05,
                 what="update processed")
        return observe(env, at, tmp, since=refused)

    with pytest.MonkeyPatch.context() as mp, contextlib.ExitStack() as stack:
        mp.setenv("ENVOY_BIN", istio.envoy_bin(VERSION))
        yield lambda form, failure, phase: run(stack, form, failure, phase)


# What Envoy 1.40 does, as measured: (traffic :8080, traffic :8443, health :18180).
# "refused": no listener on the port (Envoy rejected it); "500": the listener
# exists but its ECDS filter has no configuration, so every request gets 500.
REFUSED_ALL = ("refused", "refused", "refused")
SERVING = ("200", "200", "200")
EXPECTED = {
    ("envoyfilter", "module missing", "fresh start"): REFUSED_ALL,
    ("envoyfilter", "module corrupt", "fresh start"): REFUSED_ALL,
    # A health listener up without any traffic role that loaded: the health role
    # waits for one (LB check 503), so the gateway is not announced.
    ("envoyfilter", "traffic config", "fresh start"): ("refused", "refused", "503"),
    ("envoyfilter", "health config", "fresh start"): ("200", "200", "refused"),
    ("wasmplugin", "module missing", "fresh start"): ("500", "refused", "503"),
    ("wasmplugin", "module corrupt", "fresh start"): ("500", "refused", "503"),
    ("wasmplugin", "traffic config", "fresh start"): ("500", "refused", "503"),
    ("wasmplugin", "health config", "fresh start"): ("200", "200", "refused"),
    **{(form, failure, "update"): SERVING for form in FORMS for failure in FAILURES},
}


def row(form: str, failure: str, phase: str, seen: dict) -> str:
    if phase == "update":
        what = ("ECDS update refused" if seen["ecds_failed"] else "LDS update rejected") + \
            "; the previous listeners serve on"
    else:
        what = f"listeners up: {', '.join(seen['listeners']) or 'none'}"
        what += "; ECDS config failed" if seen["ecds_failed"] else ""
    return (f"| {form} | {failure} | {phase} | {seen['traffic'][8080]} | {seen['traffic'][8443]} "
            f"| {seen['health']} | {what} | {seen['verify']} |")


@pytest.fixture(scope="module")
def table():
    """Collects each case's row; writes out/load-failure/table.md (the table
    envoyfilter/README.md shows) when the module ends."""
    rows: dict[tuple[str, str, str], str] = {}
    yield rows
    OUT.mkdir(parents=True, exist_ok=True)
    lines = [f"Envoy {VERSION}, `PYTHONPATH=. .venv/bin/python -m pytest tests/test_load_failure.py -v`", "",
             "| form | failure | when | traffic :8080 | traffic :8443 | health :18180 | Envoy | verify.py |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [rows[key] for key in EXPECTED if key in rows]
    (OUT / "table.md").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("phase", ["fresh start", "update"])
@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("form", FORMS)
def test_load_failure(rig, table, form, failure, phase):
    seen = rig(form, failure, phase)
    table[(form, failure, phase)] = row(form, failure, phase, seen)
    got = (seen["traffic"][8080], seen["traffic"][8443], seen["health"])
    assert got == EXPECTED[(form, failure, phase)], seen
    if phase == "update":
        assert seen["lds_rejected"] + seen["ecds_failed"] == 1, "the broken update was refused"
        assert seen["listeners"] == ["0.0.0.0_8080", "0.0.0.0_8443", "drain-gate-health"]


def test_readme_shows_the_measured_table(table):
    """envoyfilter/README.md's table is the one measured here, row for row."""
    if not table:
        pytest.skip("no load-failure case ran in this session")
    readme = (istio.ENVOYFILTER / "README.md").read_text()
    shown = [line for line in readme.splitlines() if re.match(r"\| (envoyfilter|wasmplugin) \|", line)]
    assert len(shown) == len(EXPECTED)
    for key, line in table.items():
        assert line in shown, f"README row for {key} differs from the measurement: {line}"
