"""When the module cannot load: measured in real Envoy 1.40, for both shipped
forms, on a fresh start and on an update of a running Envoy.

The gateway's listeners come from a file-based LDS source and every
drain-gate filter's configuration from a file-based ECDS source (the
EnvoyFilters' EXTENSION_CONFIG resources, the WasmPlugin's), as istiod
delivers them over xDS: one update carries every listener, and a
configuration change is an ECDS update with the same listeners pushed again.
Each failure is applied to the resources as written in envoyfilter/istio/
(only ports and the wasm path substituted):

  module missing        the wasm file does not exist (mount or image absent)
  module corrupt        a file with the wasm header and a broken body
  traffic config        the traffic role's configuration refused by the plugin
  health config         the health role's configuration refused by the plugin
  not served            istiod serves none of the EnvoyFilters' ECDS resources
                        (their EXTENSION_CONFIG patches missing): Envoy waits
                        for them initial_fetch_timeout (a fresh start only)

In the WasmPlugin form a module failure is the WasmPlugin's (the image); the
health listener loads the mounted file. For each, what (a) the traffic
listeners and (b) the health listener answer, and what Envoy did with the
update. The table is written to out/load-failure/table.md and asserted:
`make test` fails if Envoy's behaviour changes. Run on its own:

  PYTHONPATH=. .venv/bin/python -m pytest tests/envoy/test_load_failure.py -v -p no:cacheprovider
"""
from __future__ import annotations

import contextlib
import copy
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.deploy.test_verify import _logical_ports
from tests.harness import ci, istio
from tests.harness.envoy import REPO, WASM, Envoy, free_port, wait_for
from tests.harness.variants import Lds

VERSION = istio.ENVOY_MATRIX[-1]
OUT = REPO / "out" / "load-failure"
BAD_CONFIG = "12x"  # drain_timeout "12x": refused at on_configure
FAILURES = ("module missing", "module corrupt", "traffic config", "health config", "not served")
FORMS = ("envoyfilter", "wasmplugin")
MODULE = ("module missing", "module corrupt")


def load(rel: str) -> dict:
    return istio.load_one(istio.ISTIO / rel)


def _role(ext: dict) -> str:
    return json.loads(ext["typed_config"]["config"]["configuration"]["value"])["role"]


def _refuse(plugin: dict) -> None:
    config = json.loads(plugin["configuration"]["value"])
    config["drain_timeout"] = BAD_CONFIG
    plugin["configuration"]["value"] = json.dumps(config)


class Xds:
    """Files Envoy watches: LDS (every listener) and ECDS (one file per filter
    configuration). Updates are renamed into place."""

    def __init__(self, form: str, workdir: Path, ports: dict[int, int], admin: int, backend: int, served: bool):
        self.form, self.workdir = form, workdir
        self.ecds_dir = workdir / "ecds"
        self.wp = load("wasmplugin/traffic.yaml")
        base = [istio.gateway_listener(8080), istio.gateway_listener(8443)]
        if form == "envoyfilter":
            xds = istio.gateway_xds(base, [load("traffic-filter.yaml"), load("health-listener.yaml")])
        else:
            with_plugin = istio.insert_wasmplugin(base, self.wp, istio.ecds_file(
                self.ecds_dir, istio.wasmplugin_resource_name(self.wp)))
            for listener in with_plugin:
                for f in istio.all_filters(listener):
                    if "config_discovery" in f:
                        f["config_discovery"]["config_source"]["path_config_source"]["watched_directory"] = {
                            "path": str(self.ecds_dir)}
            xds = istio.gateway_xds(with_plugin, [load("wasmplugin/health-listener.yaml")])
            xds.extensions.append(istio.wasmplugin_extension_config(self.wp, WASM))
        self.extensions = xds.extensions
        served_xds = istio.Xds(xds.listeners, xds.extensions if served else [])
        self.lds = Lds(istio.gateway_bootstrap(served_xds, ports, admin, backend, WASM, ecds_dir=self.ecds_dir),
                       workdir)
        self.doc = self.lds.doc

    def broken(self, failure: str | None, bad_wasm: Path) -> list[tuple[dict, Path]]:
        """Each ECDS resource with `failure` applied, and the module it loads."""
        out = []
        for ext in copy.deepcopy(self.extensions):
            role, wasm = _role(ext), WASM
            if failure in MODULE and (self.form == "envoyfilter" or role == "traffic"):
                wasm = bad_wasm
            if failure == f"{role} config":
                _refuse(ext["typed_config"]["config"])
            out.append((ext, wasm))
        return out

    def apply(self, failure: str | None, bad_wasm: Path) -> None:
        """istiod pushing the EnvoyFilters with `failure`: each ECDS resource,
        then the listeners (unchanged) once more."""
        for ext, wasm in self.broken(failure, bad_wasm):
            istio.serve_extensions(self.ecds_dir, [ext], wasm)
        self.lds.push(self.lds.listeners)


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


def refusals(env: Envoy) -> tuple[int, int, int, int]:
    """(LDS updates rejected, ECDS updates failed, ECDS initial fetches timed
    out, listeners modified) so far."""
    return (counter(env, "update_rejected", "listener_manager.lds"),
            counter(env, "config_fail", "extension_config_discovery"),
            counter(env, "init_fetch_timeout", "extension_config_discovery"),
            counter(env, "listener_modified", "^listener_manager.listener_modified$"))


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


def observe(env: Envoy, at: dict[int, int], tmp: Path, since: tuple[int, ...] = (0, 0, 0, 0)) -> dict:
    """What each port answers, the listeners up, the refusals since `since`,
    and what verify.py says about it."""
    rejected, failed, timed_out, modified = (now - then for now, then in zip(refusals(env), since))
    listeners = requests.get(env.admin("/listeners"), params={"format": "json"}, timeout=5).json()
    return {
        "traffic": {p: answer(at[p], "/") for p in (8080, 8443)},
        "health": answer(at[istio.HEALTH_PORT], "/health_check.html"),
        "listeners": sorted(l["name"] for l in listeners.get("listener_statuses", [])),
        "lds_rejected": rejected, "ecds_failed": failed, "ecds_timed_out": timed_out, "modified": modified,
        "server_state": stats(env, "^server.state$").get("server.state"),
        "verify": verify_says(env, at, tmp),
    }


def progress(env: Envoy) -> tuple[int, int]:
    """(LDS updates, ECDS updates) Envoy processed, accepted or not (an ECDS
    resource never received: once its initial fetch timed out)."""
    lds = sum(counter(env, s, "listener_manager.lds") for s in ("update_success", "update_rejected"))
    ecds = sum(counter(env, s, "extension_config_discovery") for s in ("config_reload", "config_fail",
                                                                       "init_fetch_timeout"))
    return lds, ecds


def settled(env: Envoy, before: tuple[int, int]) -> bool:
    """The LDS update and an ECDS one were processed and no listener is still
    warming (waiting for its ECDS filters)."""
    lds_now, ecds_now = progress(env)
    warming = stats(env, "^listener_manager.total_listeners_warming$").get(
        "listener_manager.total_listeners_warming", 0)
    return lds_now > before[0] and ecds_now > before[1] and warming == 0


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
        xds = Xds(form, tmp / f"{form}-{admin}", at, admin, backend_port, served=failure != "not served")
        if failure in FAILURES[:4]:
            xds.apply(failure, bad.get(failure, WASM))
        env = Envoy(xds.doc, istio.harness_ports(at, admin, backend_port), concurrency=2, workdir=xds.workdir)
        stack.callback(env.stop)
        env.start(wait_ready=False)
        wait_for(env.admin_ready, 60, interval=0.05, what="envoy admin /ready")
        wait_for(lambda: settled(env, (0, 0)), 30, interval=0.05, what="first xDS update processed")
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
        xds.apply(failure, bad.get(failure, WASM))
        wait_for(lambda: settled(env, before), 30, interval=0.05, what="update processed")
        return observe(env, at, tmp, since=refused)

    with pytest.MonkeyPatch.context() as mp, contextlib.ExitStack() as stack:
        mp.setenv("ENVOY_BIN", istio.envoy_bin(VERSION))
        yield lambda form, failure, phase: run(stack, form, failure, phase)


# What Envoy 1.40 does, as measured: (traffic :8080, traffic :8443, health :18180).
# The chart's filters fall back to an allow-all RBAC filter while they have no
# configuration: traffic passes uncounted (200), the health listener's
# catch-all answers 503, or, with a health role loaded and no traffic role,
# the health role's 503 WAIT. "500": a WasmPlugin's ECDS filter without a
# configuration (istiod gives it no fallback). "refused": no listener on the
# port: Envoy hands a listener created after it refused that filter's
# configuration the refused one, and rejects the listener (the file source
# delivers it as the first listener is created; applyLastOrDefaultConfig in
# source/common/filter/config_discovery_impl.cc).
SERVING = ("200", "200", "200")
FALLBACK = ("200", "200", "503")
EXPECTED = {
    ("envoyfilter", "module missing", "fresh start"): ("200", "refused", "503"),
    ("envoyfilter", "module corrupt", "fresh start"): ("200", "refused", "503"),
    ("envoyfilter", "traffic config", "fresh start"): ("200", "refused", "503"),
    ("envoyfilter", "health config", "fresh start"): FALLBACK,
    ("envoyfilter", "not served", "fresh start"): FALLBACK,
    ("wasmplugin", "module missing", "fresh start"): ("500", "refused", "503"),
    ("wasmplugin", "module corrupt", "fresh start"): ("500", "refused", "503"),
    ("wasmplugin", "traffic config", "fresh start"): ("500", "refused", "503"),
    ("wasmplugin", "health config", "fresh start"): ("200", "200", "503"),
    **{(form, failure, "update"): SERVING for form in FORMS for failure in FAILURES[:4]},
}


def row(form: str, failure: str, phase: str, seen: dict) -> str:
    if phase == "update":
        what = ("ECDS update refused" if seen["ecds_failed"] else "LDS update rejected") + \
            "; the previous listeners serve on"
    else:
        what = f"listeners up: {', '.join(seen['listeners']) or 'none'}"
        what += "; ECDS config never received" if seen["ecds_timed_out"] else \
            "; ECDS config failed" if seen["ecds_failed"] else ""
    return (f"| {form} | {failure} | {phase} | {seen['traffic'][8080]} | {seen['traffic'][8443]} "
            f"| {seen['health']} | {what} | {seen['verify']} |")


@pytest.fixture(scope="module")
def table():
    """Collects each case's row; writes out/load-failure/table.md (the table
    envoyfilter/docs/forms.md shows) when the module ends."""
    rows: dict[tuple[str, str, str], str] = {}
    yield rows
    OUT.mkdir(parents=True, exist_ok=True)
    lines = [f"Envoy {VERSION}, `PYTHONPATH=. .venv/bin/python -m pytest tests/envoy/test_load_failure.py -v`", "",
             "| form | failure | when | traffic :8080 | traffic :8443 | health :18180 | Envoy | verify.py |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [rows[key] for key in EXPECTED if key in rows]
    (OUT / "table.md").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("form, failure, phase", list(EXPECTED))
def test_load_failure(rig, table, form, failure, phase):
    seen = rig(form, failure, phase)
    table[(form, failure, phase)] = row(form, failure, phase, seen)
    got = (seen["traffic"][8080], seen["traffic"][8443], seen["health"])
    assert got == EXPECTED[(form, failure, phase)], seen
    assert "drain-gate-health" in seen["listeners"], "the health listener is up, answering no 200"
    if phase == "update":
        assert seen["listeners"] == ["0.0.0.0_8080", "0.0.0.0_8443", "drain-gate-health"]
        assert seen["ecds_failed"] >= 1 and seen["lds_rejected"] == seen["modified"] == 0, \
            "the broken configuration was refused, in place: no listener replaced"
    if failure == "not served":
        # One subscription per name: drain-gate (both traffic listeners) and drain-gate-health.
        assert seen["ecds_timed_out"] == 2 and seen["lds_rejected"] == 0, seen


def test_readme_shows_the_measured_table(table):
    """envoyfilter/docs/forms.md's table is the one measured here, row for row."""
    if not table:
        ci.cannot_run("no load-failure case ran in this session: the table is checked after the cases that measure it")
    readme = (istio.ENVOYFILTER / "docs" / "forms.md").read_text()
    shown = [line for line in readme.splitlines() if re.match(r"\| (envoyfilter|wasmplugin) \|", line)]
    assert len(shown) == len(EXPECTED)
    for key, line in table.items():
        assert line in shown, f"README row for {key} differs from the measurement: {line}"
