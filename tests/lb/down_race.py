"""How often does HAProxy's DOWN cut a *short* request, 200 vs 404 draining?

With the default `draining_lb_status: 200`, HAProxy keeps sending new requests
to the gateway after drain-gate's 503 flip until it marks the server DOWN
(the detection window); a request that happens to be in flight at that
instant is cut by `on-marked-down shutdown-sessions`. With 404 (soft drain,
`http-check disable-on-404`) the server is in NOLB before the 503, so
nothing new reaches it.

Two gateways, a loop of short GETs with no pause, N drains of gw1 per mode:

    PYTHONPATH=. .venv/bin/python -m tests.lb.down_race --drains 10

Prints one JSON line per drain and a summary; exits 1 if the 404 mode cut
anything.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tests.harness.clients import ShortLoop
from tests.harness.process import stop_on_signals
from tests.harness.rig import QUICK, PreStop, Rig


def one_drain(lb_status: int, workers: int, seconds: float) -> dict:
    soft = lb_status == 404
    # Soft drain as shipped: no min_drain, the flip waits for the LB's 404 (soft_drain_gate).
    config = {"draining_lb_status": 404} if soft else {}
    with tempfile.TemporaryDirectory(prefix="down-race-") as wd:
        with Rig(Path(wd), gateways=2, timing=QUICK, config=config, soft_drain=soft) as rig:
            loop = ShortLoop(rig.url("/"), duration=seconds, workers=workers, pause=0.0).start()
            time.sleep(2)
            ps = PreStop(rig.gw("gw1"))
            ps.wait(60)
            down = rig.stat.first("gw1", "DOWN", ps.trigger)
            loop.join(seconds + 30)
            cut = [n for s, n in rig.haproxy.down_events() if s == "gw1"]
            s = loop.summary()
            on_gw1 = sum(1 for r in rig.haproxy.requests() if r.server == "gw1" and r.accept >= ps.trigger)
    return {
        "lb_status": lb_status,
        "requests": s["requests"],
        "p50_ms": s["p50_ms"],
        "requests_on_gw1_after_drain_start": on_gw1,
        "connection_errors": s["connection_errors"],
        "http_5xx": s["http_5xx"],
        "sessions_cut_at_down": cut[0] if cut else None,
        "down_after_trigger_s": round(down - ps.trigger, 2) if down else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drains", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8)
    args = ap.parse_args()
    summary = {}
    for lb_status in (200, 404):
        runs = []
        for _ in range(args.drains):
            r = one_drain(lb_status, args.workers, args.seconds)
            print(json.dumps(r), flush=True)
            runs.append(r)
        summary[lb_status] = {
            "drains": len(runs),
            "drains_with_a_cut": sum(1 for r in runs if r["connection_errors"]),
            "requests_cut": sum(r["connection_errors"] for r in runs),
            "http_5xx": sum(r["http_5xx"] for r in runs),
            "requests": sum(r["requests"] for r in runs),
            "p50_ms": sorted(r["p50_ms"] for r in runs)[len(runs) // 2],
        }
    print(json.dumps({"summary": summary}, indent=2))
    return 1 if summary[404]["requests_cut"] or summary[404]["http_5xx"] else 0


if __name__ == "__main__":
    stop_on_signals()  # Ctrl-C and SIGTERM stop what the run started, in a background job too
    raise SystemExit(main())
