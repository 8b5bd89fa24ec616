"""`make run`: the demo backend and a real Envoy with drain-gate, in the foreground.

Environment: ENVOY_CONCURRENCY (default 2), DRAIN_GATE_CONFIG (JSON merged over
the plugin configuration in envoyfilter/envoy.yaml).
"""
import json
import os
import signal
import sys

from tests.harness import backend
from tests.harness.envoy import REPO, Envoy, Ports, render

HELLO = """
drain-gate is running (Envoy {version}, concurrency {concurrency}).
  traffic  http://127.0.0.1:18080   (demo backend on :18081)
  health   http://127.0.0.1:18180
  admin    http://127.0.0.1:15000

Try:
  curl -s localhost:18180/drain/status
  curl -si localhost:18180/health_check.html
  curl -sN 'localhost:18080/stream?seconds=20' &        # a long request in flight
  curl -s -X POST localhost:18180/drain                  # DRAINING: the LB check stays 200
  curl -si localhost:18180/health_check.html             # 200 while the stream runs, 503 once it ends
  curl -s -X POST 'localhost:18180/drain?wait=closed'    # what a preStop hook runs: returns at CLOSED
  curl -s -X POST localhost:18180/reopen                 # back to OPEN (from DRAINING or CLOSING)

Ctrl-C stops it. Envoy log: {log}
"""


def main() -> int:
    # SIGTERM ends the run like Ctrl-C does: Envoy runs in its own session and is stopped below.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    config = json.loads(os.environ.get("DRAIN_GATE_CONFIG") or "{}")
    concurrency = int(os.environ.get("ENVOY_CONCURRENCY") or 2)
    ports = Ports.defaults()
    workdir = REPO / "out" / "run"
    backend.serve(ports.backend)
    envoy = Envoy(render(ports, config), ports, concurrency=concurrency, workdir=workdir)
    try:
        envoy.start()
        import requests

        version = requests.get(envoy.admin("/server_info"), timeout=5).json().get("version", "?")
        print(HELLO.format(version=version.split("/")[1] if "/" in version else version,
                           concurrency=concurrency, log=envoy.log_path), flush=True)
        envoy.proc.wait()
        print(envoy.log_tail(), file=sys.stderr)
        return envoy.proc.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        envoy.stop()


if __name__ == "__main__":
    sys.exit(main())
