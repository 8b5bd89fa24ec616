"""Soft drain without `min_drain`: does HAProxy see the 404 before the 503?

`draining_lb_status: 404`, `min_drain: 0s`, HAProxy with `http-check
disable-on-404` in front of two gateways, a loop of short GETs (`/slow?ms=50`,
no pause) through HAProxy. gw1 is drained again and again while idle — its
count is 0 at drain start — and the loop starts right after the drain began:

* gated (`soft_drain_gate: true`, the default): the 0 is acted on only once
  HAProxy's checker has been served a 404 since the drain began; HAProxy puts
  gw1 in NOLB (no new requests), what is in flight ends, the 503 follows, and
  DOWN finds nothing to cut;
* control (`soft_drain_gate: false`): the 0 flips at once, HAProxy goes from UP
  straight to DOWN `fall` checks later, and cuts what it sent meanwhile.

Each drain: `POST /drain` on the idle gw1, start the loop, wait for HAProxy's
DOWN, stop the loop (what was in flight finishes, or fails), `POST /reopen`
(from CLOSING; `lb_buffer` is long) and wait for UP again.

    PYTHONPATH=. .venv/bin/python -m tests.lb.soft_gate --drains 8
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tests.harness.clients import ShortLoop
from tests.harness.envoy import wait_for
from tests.harness.process import stop_on_signals
from tests.harness.rig import Rig, Timing
from tests.harness.timeline import parse_time

# Checks every 500 ms: a drain cycle takes a few seconds.
RACE = Timing("race", "500ms", 0.5, lb_buffer="60m")
WORKERS = 6
PATH = "/slow?ms=50"


def config(gated: bool) -> dict:
    return {"draining_lb_status": 404, "min_drain": "0s", "soft_drain_gate": gated, "drain_timeout": "60s"}


def one_drain(rig: Rig, name: str = "gw1") -> dict:
    gw = rig.gw(name)
    wait = 10 * RACE.inter_s + 5
    wait_for(lambda: gw.status()["active"] == 0, 10, 0.05, f"{name} idle")
    seen = len(rig.haproxy.state_events(name))
    trigger = time.time()
    r = gw.post("/drain")
    assert r.status_code == 200, r.text
    loop = ShortLoop(rig.url(PATH), duration=120, workers=WORKERS, pause=0.0).start()
    try:
        rig.haproxy.wait_status(name, "DOWN", wait)
    finally:
        loop.stop()
    s = loop.summary()
    # The gateway's own count of this drain, once it has seen what the clients lost.
    receipt = gw.receipt(at_least=s["connection_errors"])
    st = gw.status()
    # HAProxy's own log, in order: "stopping" (NOLB, the 404 seen) before "DOWN"?
    events = wait_for(lambda: (e := rig.haproxy.state_events(name)[seen:]) and "DOWN" in e and e, 5,
                      what="DOWN in HAProxy's log")
    cut_at_down = [n for srv, n in rig.haproxy.down_events() if srv == name]
    down = wait_for(lambda: rig.stat.first(name, "DOWN", trigger), 5, 0.05, what="DOWN in the stat poller")
    assert gw.post("/reopen").status_code == 200
    rig.haproxy.wait_status(name, "UP", wait)
    return {
        "requests": s["requests"],
        "cut": s["connection_errors"] + s["http_5xx"],
        "connection_errors": s["connection_errors"],
        "error_ends": [e.end for e in loop.connection_errors],
        "down": down,
        "gateway": {k: receipt[k] for k in ("cut", "cut_lb", "cut_other", "completed")},
        "sessions_cut_at_down": cut_at_down[-1] if cut_at_down else None,
        "lb_states": events,
        "nolb_before_down": "stopping" in events and events.index("stopping") < events.index("DOWN"),
        "flip_after_s": round(_closing_at(st) - trigger, 3) if _closing_at(st) else None,
        "reason": st["progress"]["reason"],
        "forced": st["progress"]["forced"],
    }


def _closing_at(st: dict) -> float | None:
    for t in reversed(st["progress"]["transitions"]):
        if t["to"] == "CLOSING":
            return parse_time(t["at"])
    return None


def run(drains: int, workdir: Path) -> dict[str, list[dict]]:
    """`drains` drains of gw1 per mode, gated then control, each in its own rig."""
    out: dict[str, list[dict]] = {}
    for mode, gated in (("gated", True), ("control", False)):
        with Rig(workdir / mode, gateways=2, timing=RACE, config=config(gated), soft_drain=True) as rig:
            out[mode] = [one_drain(rig) for _ in range(drains)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drains", type=int, default=8)
    ap.add_argument("--workdir", help="keep the logs of every process here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="soft-gate-") as wd:
        res = run(args.drains, Path(args.workdir or wd))
    for mode, runs in res.items():
        for r in runs:
            print(json.dumps({"mode": mode, **r}), flush=True)
    summary = {m: {"drains": len(r), "drains_with_a_cut": sum(1 for x in r if x["cut"]),
                   "requests_cut": sum(x["cut"] for x in r), "requests": sum(x["requests"] for x in r)}
               for m, r in res.items()}
    print(json.dumps({"summary": summary}, indent=2))
    return 1 if summary["gated"]["requests_cut"] or not summary["control"]["requests_cut"] else 0


if __name__ == "__main__":
    stop_on_signals()  # Ctrl-C and SIGTERM stop what the run started, in a background job too
    raise SystemExit(main())
