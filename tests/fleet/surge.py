"""`make surge`: the Gateway API form's surge onto the node it replaces (envoyfilter/docs/forms.md,
"Gateway API": `maxSurge: 1` with a topology spread), one node behind real HAProxy.

    clients ──▶ HAProxy 2.6 (haproxy.cfg, one server: the node) ──▶ node:traffic ─┬─▶ old pod
                                        └─ check ──────────────▶ node:check ───┘   new pod

The node's two ports are kube-proxy's NodePorts with `externalTrafficPolicy: Local` and
KEP-1669 (tests/harness/nodeport.py): each new connection goes to a ready pod of the node,
else to a terminating one that still serves. The surge as the Deployment controller runs it:
the new pod starts on the old pod's node and becomes ready, `minReadySeconds` later the old
pod is deleted (kubelet: preStop, SIGTERM, pilot-agent's drain, exit: tests/fleet/fleet.py).
From the deletion on, kube-proxy gives every new connection of the node to the new pod —
the LB's checks included: the old pod's drain answers an LB that no longer asks it.

Measured per variant, under traffic that never stops (short GETs on keep-alive connections,
HTTP/1.1 and HTTP/2 streams, websockets, every one accounted by tests/fleet/traffic.py):
what the clients lost, the old pod's drain (flip reason, how CLOSING ended, how long it held
the preStop), its receipt (`cut_lb`, `cut_other`), the LB checks and new connections that
reached the old pod after its deletion, and whether HAProxy ever marked the node DOWN.
The control is Istio's default (no preStop): the same surge loses what runs on the old pod at
its exit.

    PYTHONPATH=. .venv/bin/python -m tests.fleet.surge [--quick]
Writes out/surge/result.json and out/surge/results.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import time
from pathlib import Path

from tests.fleet import fleet
from tests.fleet.traffic import Profile, Traffic
from tests.harness.envoy import REPO, wait_for
from tests.harness.nodeport import Endpoint, NodePort
from tests.harness.process import stop_on_signals
from tests.harness.rig import Backend
from tests.harness.timeline import parse_time

OUT = REPO / "out" / "surge"
INTER = "1s"  # HAProxy inter 1s rise 2 fall 2: the LB would see a 503 within 2 s
MIN_READY_S = 10.0  # envoyfilter/gateway-api/options.yaml's minReadySeconds
PROFILE = Profile(short_rate=40, short_workers=2, stream_seconds=(4, 8), h1_period=1.0, h2_period=2.0,
                  ws_period=2.0)

VARIANTS = {
    # The Gateway API ConfigMap's configuration: the chart's defaults (close_after lb_buffer, 10 s).
    "drain-gate": fleet.Strategy("drain-gate", check="health", prestop="drain-gate", config={}),
    "drain-gate, lb_observed_down": fleet.Strategy(
        "drain-gate, lb_observed_down", check="health", prestop="drain-gate",
        config={"close_after": "lb_observed_down", "lb_fall": 2}),
    "istio-default (control)": fleet.Strategy("istio-default", check="agent", prestop=None),
}
QUICK = ("drain-gate", "istio-default (control)")
# The pinned requests run this long past minReadySeconds: the new pod's start, and then
# beyond the old pod's terminationDrainDuration (5 s) after its deletion.
PIN_S = 12


def readiness_url(pod: fleet.Pod) -> str:
    """What the kubelet probes: drain-gate's /health with drain-gate's values, pilot-agent's otherwise."""
    if pod.strategy.check == "health":
        return pod.envoy.health("/health")
    return f"http://127.0.0.1:{pod.agent_port}/healthz/ready"


def endpoint(pod: fleet.Pod) -> Endpoint:
    return Endpoint(pod.name, {"traffic": pod.ports.traffic, "check": pod.check_port}, readiness_url(pod),
                    terminating=lambda: pod.deleted_at is not None)


def run(name: str, strategy: fleet.Strategy, workdir: Path, min_ready_s: float) -> dict:
    with contextlib.ExitStack() as stack:
        backend = Backend(workdir).start()
        stack.callback(backend.stop)
        old, new = (fleet.Pod(n, backend.port, strategy, workdir) for n in ("old", "new"))
        for pod in (old, new):
            stack.callback(pod.stop)
        node = NodePort(probe_period=0.5)
        stack.callback(node.stop)
        node.start()
        old.start()
        node.add(endpoint(old))
        haproxy = fleet.FleetHAProxy(workdir / "haproxy", [("node1", node.port["traffic"], node.port["check"])],
                                     strategy=strategy, inter=INTER)
        stack.callback(haproxy.stop)
        haproxy.start()
        haproxy.wait_status("node1", lambda s: s.up and s.check_status == "L7OK", timeout=30)
        traffic = Traffic.through(haproxy, PROFILE)
        stack.callback(traffic.stop)
        traffic.start()
        traffic.flowing()
        time.sleep(PROFILE.stream_seconds[0])  # long requests of every kind in flight on the old pod
        # Three more on the old pod alone (the node's one endpoint), lasting past its deletion and
        # terminationDrainDuration: what a pod that exits at once cuts.
        traffic.pin(int(PIN_S + min_ready_s))
        # The surge: the new pod on the same node, ready, then minReadySeconds, then the old pod goes.
        new.start()
        new_endpoint = node.add(endpoint(new))
        wait_for(lambda: new_endpoint.ready, 30, 0.1, "the new pod ready")
        new.up_at = time.time()
        time.sleep(min_ready_s)
        old.delete()
        old.wait_exit(fleet.GRACE_S + 30)
        time.sleep(2)
        traffic.stop()
        traffic.drain(PIN_S + min_ready_s + 30)
        return summary(name, strategy, traffic, node, haproxy, old)


def summary(name: str, strategy: fleet.Strategy, traffic: Traffic, node: NodePort, haproxy, old: fleet.Pod) -> dict:
    sent, lost = traffic.counts()
    st = old.final_status or {}
    progress = st.get("progress") or {}
    steps = progress.get("transitions") or []
    closed = next((t for t in reversed(steps) if t.get("to") == "CLOSED"), {})
    last_check = max((parse_time(c["last_seen"]) for c in (st.get("lb") or {}).get("checkers", [])), default=None)
    after = node.connections("check", since=old.deleted_at)
    return {
        "variant": name,
        "config": strategy.config,
        "sent": sent,
        "lost": lost,
        "lost_requests": traffic.lost(),
        "old_pod": {
            "drain_s": old.drain_s,
            "prestop": old.prestop_result,
            "closing_reason": next((t.get("reason") for t in reversed(steps) if t.get("to") == "CLOSING"), None),
            "closed_reason": closed.get("reason"),
            "closing_s": (round(parse_time(progress["closed_at"]) - parse_time(progress["closing_at"]), 1)
                          if progress.get("closed_at") and progress.get("closing_at") else None),
            "receipt": old.receipt,
            "draining_s": (round(parse_time(progress["closing_at"]) - parse_time(progress["drain_started_at"]), 1)
                           if progress.get("closing_at") and progress.get("drain_started_at") else None),
            "lb_observed_down": (st.get("lb") or {}).get("observed_down"),
            "checked_in_drain": (st.get("lb") or {}).get("checked_in_drain"),
            "last_lb_check_before_deletion_s": (round(old.deleted_at - last_check, 1) if last_check else None),
        },
        "checks_after_deletion": after,
        "traffic_after_deletion": node.connections("traffic", since=old.deleted_at),
        "haproxy_down_events": haproxy.down_events(),
    }


def table(results: list[dict]) -> str:
    rows = ["| variant | lost (short / h1 / h2 / ws) of sent | old pod: DRAINING (s), CLOSING by, ended by (s) "
            "| deletion to exit (s) | receipt cut_lb / cut_other / completed | LB checks of the node after deletion: "
            "old / new | `lb.checked_in_drain` | HAProxy DOWN |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        o = r["old_pod"]
        lost = " / ".join(f"{r['lost'][k]}" for k in ("short", "h1_stream", "h2_stream", "websocket"))
        sent = sum(r["sent"].values())
        rc = o["receipt"] or {}
        closing = (f"{o['draining_s']:g}, " if o["draining_s"] is not None else "") + (
            f"{o['closing_reason'] or '–'}, {o['closed_reason'] or '–'}") + (
            f" ({o['closing_s']:g})" if o["closing_s"] is not None else "")
        checked = "–" if o["checked_in_drain"] is None else str(o["checked_in_drain"]).lower()
        rows.append(f"| {r['variant']} | {lost} of {sent} | {closing} | {o['drain_s']:.1f} "
                    f"| {rc.get('cut_lb', '–')} / {rc.get('cut_other', '–')} / {rc.get('completed', '–')} "
                    f"| {r['checks_after_deletion'].get('old', 0)} / {r['checks_after_deletion'].get('new', 0)} "
                    f"| {checked} | {len(r['haproxy_down_events'])} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="drain-gate and the control only")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    names = QUICK if args.quick else tuple(VARIANTS)
    results = []
    for n in names:
        workdir = OUT / re.sub(r"[^a-z0-9]+", "-", n).strip("-")
        workdir.mkdir(parents=True, exist_ok=True)
        results.append(run(n, VARIANTS[n], workdir, MIN_READY_S))
    (OUT / "result.json").write_text(json.dumps(results, indent=2))
    (OUT / "results.md").write_text(table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    stop_on_signals()  # Ctrl-C and SIGTERM stop what the run started, in a background job too
    raise SystemExit(main())
