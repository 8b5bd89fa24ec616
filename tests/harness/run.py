"""`make run`: the demo backend and a real Envoy with drain-gate, in the foreground.

Environment: ENVOY_CONCURRENCY (default 2), DRAIN_GATE_CONFIG (JSON object merged
over the plugin configuration in envoyfilter/envoy.yaml; `role` is set per
listener there and is refused here). `--free-ports` picks free ports instead of
18080/18180/15000/18081 (the tests use it).

Bad input ends the run with the cause in the last line, naming the variable,
port or key, and the path of the Envoy log when Envoy said it: no traceback.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import socket
import sys
from pathlib import Path

import requests

from tests.harness import backend
from tests.harness.envoy import REPO, Envoy, Ports, render
from tests.harness.process import signals_to_the_main_thread, stop_on_signals

HELLO = """
drain-gate is running (Envoy {version}, concurrency {concurrency}).
  traffic  http://127.0.0.1:{p.traffic}   (demo backend on :{p.backend})
  health   http://127.0.0.1:{p.health}
  admin    http://127.0.0.1:{p.admin}

Try:
  curl -s localhost:{p.health}/drain/status
  curl -si localhost:{p.health}/health_check.html
  curl -sN 'localhost:{p.traffic}/stream?seconds=20' &        # a long request in flight
  curl -s -X POST localhost:{p.health}/drain                  # DRAINING: the LB check stays 200
  curl -si localhost:{p.health}/health_check.html             # 200 while the stream runs, 503 once it ends
  curl -s -X POST 'localhost:{p.health}/drain?wait=closed'    # what a preStop hook runs: returns at CLOSED

With nothing in flight, POST /drain answers CLOSING at once (the LB check is 503 from then on).
POST /reopen goes back to OPEN from DRAINING or CLOSING; CLOSED is final, as for a pod
that is about to stop: to start over, stop this run (Ctrl-C) and `make run` again.
To try /reopen, call it before CLOSED, e.g. with DRAIN_GATE_CONFIG='{{"lb_buffer":"60s"}}'.

Ctrl-C stops it. Envoy log (fresh for this run): {log}
"""

# Envoy's log lines: "[time][thread][level][logger] [source:line] message".
LOG_LINE = re.compile(r"^\[[^]]*\]\[\d+\]\[(?P<level>\w+)\]\[\w+\] \[[^]]*\] (?P<msg>.*)$")
REFUSED = re.compile(r"invalid configuration: (?P<cause>.*)$")
NAMES = {"traffic": "traffic listener", "health": "health listener", "admin": "Envoy admin",
         "backend": "demo backend"}


class Refused(Exception):
    """Bad input: the message is the cause, printed as the run's last line."""


def plugin_config(raw: str | None) -> dict:
    """DRAIN_GATE_CONFIG: a JSON object, without `role`."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as e:
        raise Refused(f"DRAIN_GATE_CONFIG is not valid JSON: {e.msg} at column {e.colno}: {raw}") from None
    if not isinstance(value, dict):
        raise Refused(f"DRAIN_GATE_CONFIG must be a JSON object (key: value), got {raw}")
    if "role" in value:
        raise Refused("DRAIN_GATE_CONFIG sets `role`, which envoyfilter/envoy.yaml sets per listener "
                      "(traffic on :18080, health on :18180): remove it")
    return value


# Each worker starts its own wasm VM (a few seconds of compiling on a small machine), and
# every traffic root a worker holds is watched by the health role (at most 512 at once).
MAX_WORKERS = 64


def concurrency(raw: str | None) -> int:
    """ENVOY_CONCURRENCY: Envoy's worker count, a whole number from 1 to MAX_WORKERS."""
    text = (raw or "2").strip()
    if not text.isdigit() or int(text) < 1:
        raise Refused(f"ENVOY_CONCURRENCY must be a whole number of workers, 1 or more, got {raw!r}")
    if int(text) > MAX_WORKERS:
        raise Refused(f"ENVOY_CONCURRENCY={text}: at most {MAX_WORKERS} workers (this machine has "
                      f"{os.cpu_count()} cores; every worker starts its own wasm VM, and drain-gate watches at "
                      "most 512 traffic roots)")
    return int(text)


def busy(port: int) -> str | None:
    """Why `port` cannot be listened on at 127.0.0.1, or None when it can."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return "in use" if e.errno == errno.EADDRINUSE else e.strerror
    return None


def check_ports(ports: Ports) -> None:
    problems = [f"port {port} ({NAMES[name]}) is {why}" for name, port in vars(ports).items()
                if (why := busy(port))]
    if problems:
        raise Refused("; ".join(problems) + ": stop what listens there (`ss -ltnp` shows it) and run again")


def envoy_cause(log: str, log_path: Path, code: int | None) -> list[str]:
    """What Envoy said when it stopped: its error lines, then the log path,
    then the cause itself as the last line."""
    said = [m["msg"] for m in map(LOG_LINE.match, log.splitlines())
            if m and m["level"] in ("error", "critical")]
    lines = [f"Envoy exited with code {code}. Its errors:"] + [f"  {msg}" for msg in said[-8:]]
    lines.append(f"Full Envoy log: {log_path}")
    refused = [m["cause"] for m in map(REFUSED.search, said) if m]
    if refused:
        lines.append(f"drain-gate refused its configuration (DRAIN_GATE_CONFIG or envoyfilter/envoy.yaml): "
                     f"{refused[-1]}")
    elif said:
        lines.append(f"cause: {said[-1]}")
    return lines


def serve(args: argparse.Namespace) -> int:
    config = plugin_config(os.environ.get("DRAIN_GATE_CONFIG"))
    workers = concurrency(os.environ.get("ENVOY_CONCURRENCY"))
    ports = Ports() if args.free_ports else Ports.defaults()
    check_ports(ports)
    workdir = REPO / "out" / "run"
    envoy = Envoy(render(ports, config), ports, concurrency=workers, workdir=workdir)
    envoy.log_path.unlink(missing_ok=True)
    try:
        with signals_to_the_main_thread():  # which waits on Envoy: Ctrl-C must reach it there
            backend.serve(ports.backend)
    except OSError as e:
        raise Refused(f"port {ports.backend} (demo backend) is busy: {e.strerror}") from None
    try:
        try:
            envoy.start()
        except (RuntimeError, TimeoutError):
            envoy.stop()
            raise Refused("\n".join(envoy_cause(envoy.log(), envoy.log_path, envoy.proc.poll()))) from None
        version = requests.get(envoy.admin("/server_info"), timeout=5).json().get("version", "?")
        print(HELLO.format(version=version.split("/")[1] if "/" in version else version,
                           concurrency=workers, p=ports, log=envoy.log_path), flush=True)
        envoy.proc.wait()
        raise Refused("\n".join(envoy_cause(envoy.log(), envoy.log_path, envoy.proc.returncode)))
    finally:
        envoy.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make run", description=__doc__.splitlines()[0])
    ap.add_argument("--free-ports", action="store_true", help="free ports instead of the defaults")
    args = ap.parse_args(argv)
    # Ctrl-C and SIGTERM end the run, started from a script's background job too (SIGINT ignored
    # on entry): Envoy runs in its own session and is stopped, the demo backend is this process's.
    stop_on_signals()
    try:
        return serve(args)
    except KeyboardInterrupt:
        return 0
    except Refused as e:
        print(f"\nmake run: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
