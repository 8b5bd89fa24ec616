"""`make run` (tests/harness/run.py) as a user meets it: each bad input ends the
run with its cause in the last line — naming the variable, port or key, with
the Envoy log's path when Envoy said it — and no Python traceback; each run
starts a fresh Envoy log; a good run prints the banner and stops cleanly, on
SIGTERM, and on SIGINT when it started with SIGINT ignored (a script's
background job), leaving nothing it started running."""
from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.harness.envoy import REPO
from tests.harness.process import accepts, stop_group, wait_for

RUN = [sys.executable, "-m", "tests.harness.run"]
LOG = REPO / "out" / "run" / "envoy.log"


def run(env: dict, *args: str, timeout: float = 90) -> tuple[int, list[str]]:
    """The run's exit code and its output lines (stdout and stderr)."""
    p = subprocess.run([*RUN, *args], env={**os.environ, "PYTHONPATH": str(REPO), **env}, cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    out = (p.stdout + p.stderr).strip().splitlines()
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p.returncode, out


@pytest.mark.parametrize("env,cause", [
    ({"DRAIN_GATE_CONFIG": '{"lb_buffer": "3s",}'}, "DRAIN_GATE_CONFIG is not valid JSON"),
    ({"DRAIN_GATE_CONFIG": '["lb_buffer"]'}, "DRAIN_GATE_CONFIG must be a JSON object"),
    ({"DRAIN_GATE_CONFIG": '{"role": "health"}'}, "DRAIN_GATE_CONFIG sets `role`"),
    ({"ENVOY_CONCURRENCY": "abc"}, "ENVOY_CONCURRENCY must be a whole number"),
    ({"ENVOY_CONCURRENCY": "0"}, "ENVOY_CONCURRENCY must be a whole number"),
    ({"ENVOY_CONCURRENCY": "999"}, "ENVOY_CONCURRENCY=999: at most 64 workers"),
])
def test_bad_environment_is_named_in_the_last_line(env, cause):
    code, out = run(env, "--free-ports")
    assert code == 2 and out and cause in out[-1], out


def test_a_busy_backend_port_is_named():
    """The demo backend's default port held by someone else."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", 18081))
        holder.listen()
    except OSError as e:  # already held by another process: busy all the same
        assert e.errno == errno.EADDRINUSE, e
    try:
        code, out = run({})
    finally:
        holder.close()
    assert code == 2 and "port 18081 (demo backend) is in use" in out[-1], out


def test_a_refused_plugin_configuration_ends_with_its_key_and_a_fresh_log():
    first, _ = run({"DRAIN_GATE_CONFIG": '{"lb_buffer": "2h"}'}, "--free-ports")
    assert first == 2 and "lb_buffer" in LOG.read_text()
    code, out = run({"DRAIN_GATE_CONFIG": '{"drain_timeout": "12x"}'}, "--free-ports")
    assert code == 2, out
    assert out[-1].endswith('drain_timeout: "12x" is not a duration (use e.g. 500ms, 30s, 2m)'), out
    assert f"Full Envoy log: {LOG}" in out[-3:], out
    # Envoy's errors only: not its 40-line list of extensions.
    assert len(out) <= 15, out
    # Each run starts its own log: the first run's refusal is gone.
    log = LOG.read_text()
    assert "drain_timeout" in log and "lb_buffer" not in log


def test_a_good_run_prints_the_banner_and_stops_on_sigterm():
    p = subprocess.Popen([*RUN, "--free-ports"], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True).start()
    try:
        wait_for(lambda: any("Ctrl-C stops it" in line for line in lines), 90, what="the banner")
        banner = "".join(lines)
        assert "CLOSED is final" in banner and "`make run` again" in banner, banner
        assert "answers CLOSING at once" in banner, banner
        health = next(line.split()[1] for line in lines if line.strip().startswith("health "))
        assert requests.get(f"{health}/live", timeout=5).json() == {"state": "OPEN", "live": True}
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(30) == 0
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{health}/live", timeout=5)
    finally:
        stop_group(p)


def descendants(pid: int) -> set[int]:
    """Every process `pid` started, and what they started (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        this = todo.pop()
        children = {c for c, parent in parents.items() if parent == this}
        todo += children - found
        found |= children
    return found


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, awaiting its reaper, runs no more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_sigint_stops_a_run_started_with_sigint_ignored_and_leaves_nothing_running():
    """A script's background job starts with SIGINT ignored: SIGINT still ends the run (exit 0),
    Envoy is stopped (its pid, and every other process the run started, gone) and the demo
    backend with it (it runs in the run's own process: its port refuses)."""
    ignored = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    p = subprocess.Popen([*RUN, "--free-ports"], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         preexec_fn=ignored)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True).start()
    try:
        wait_for(lambda: any("Ctrl-C stops it" in line for line in lines), 90, what="the banner")
        banner = "".join(lines)
        backend = int(re.search(r"\(demo backend on :(\d+)\)", banner)[1])
        health = next(line.split()[1] for line in lines if line.strip().startswith("health "))
        started = descendants(p.pid)
        envoys = [pid for pid in started if "envoy" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
        assert envoys and accepts(backend), (started, banner)
        os.kill(p.pid, signal.SIGINT)
        assert p.wait(30) == 0, "".join(lines)
        assert not [pid for pid in started if running(pid)], "a process the run started outlived it"
        assert not accepts(backend), "the demo backend outlived the run"
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{health}/live", timeout=5)
    finally:
        stop_group(p)
