"""gRPC calls through each LB recipe while a gateway drains refusing new requests, beside the
same drain serving them: does refusing lose a call that serving completes?

    client (grpcio) ─▶ front LB ─┬─▶ gw1 Envoy (drain-gate) ─HTTP/2─▶ gRPC server
                                  └─▶ gw2 Envoy (drain-gate) ─HTTP/2─▶

The front LB is one of the shipped recipes, run as written, with what gRPC needs:

    haproxy   envoyfilter/haproxy/haproxy-refuse.cfg, `proto h2 check-proto h1` on the server lines
              (gRPC needs HTTP/2 to the gateway), inter 500ms rise 2 fall 2; to refuse gRPC, with
              the one line its comment gives (GRPC_LINE: a gRPC call may be resent on a 503)
    envoy     envoyfilter/lb/envoy-front.yaml (HTTP/2 to the gateways for an HTTP/2 client), its
              check every 500 ms
    nginx     envoyfilter/lb/nginx-drain-gate.conf's gRPC server (grpc_pass), no check

Each run: three clients, each making one kind of call after another, `period` apart — unary,
server-streaming (3 messages) and bidirectional (2 messages, the second 20 ms after the first: a
call whose request is still being sent when it reaches the gateway) — and gw1 drained (its preStop
call, `POST /drain?wait=closed`) after `drain_at`. The calls go on until gw1 is CLOSED: its pod's
exit comes after it and is the same in every mode (tests/lb/test_refuse_lbs.py measures it).

The modes: `serve` (the default, the control beside), `refuse` (gRPC served, the default of
`draining_grpc_requests`: behind HAProxy's file as shipped and nginx), `refuse-grpc` (gRPC refused
too: behind Envoy; behind HAProxy with GRPC_LINE added; behind nginx the control, which nginx cannot
resend) and, behind HAProxy, `refuse-grpc-without-the-line`: gRPC refused behind the file as
shipped, which resends no POST on a 503 (the control of GRPC_LINE). `refuse_with: reset` behind
nginx.

    PYTHONPATH=. .venv/bin/python -m tests.lb.refuse_grpc [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from tests.harness.envoy import wait_for
from tests.harness.grpc_app import ECHO, TICKS, UNARY, grpc_backend
from tests.harness.haproxy import CFG_REFUSE, HAProxy, cuts_at_down
from tests.harness.process import stop_on_signals
from tests.harness.rig import PreStop
from tests.harness.timeline import parse_time
from tests.harness.wire import read_head
from tests.lb.refuse_lbs import FrontRig, _closing

KINDS = ("unary", "server-streaming", "bidirectional")
# How each LB's gateways refuse.
REFUSE_WITH = {"haproxy": "response", "envoy": "response", "nginx": "reset"}
# drain-gate's gRPC setting in each mode.
GRPC = {"refuse": "serve", "refuse-grpc": "refuse", "refuse-grpc-without-the-line": "refuse"}
RUNS = [("haproxy", "serve"), ("haproxy", "refuse"), ("haproxy", "refuse-grpc"),
        ("haproxy", "refuse-grpc-without-the-line"), ("envoy", "serve"), ("envoy", "refuse-grpc"),
        ("nginx", "serve"), ("nginx", "refuse"), ("nginx", "refuse-grpc")]
# The line haproxy-refuse.cfg's comment gives to refuse gRPC too: a gRPC call, a POST, is then
# resent on a 503 as an idempotent request is.
GRPC_LINE = r"acl drain_gate_resendable req.hdr(content-type) -m reg ^application/grpc(\+|$)"


def haproxy_grpc_cfg(workdir: Path, base: Path = CFG_REFUSE) -> Path:
    """haproxy-refuse.cfg with GRPC_LINE added after its own `acl drain_gate_resendable` lines,
    as its comment says. The comment must give that very line: the file and this rig cannot
    drift apart."""
    lines = base.read_text().splitlines()
    given = [i for i, line in enumerate(lines) if line.lstrip().startswith("#") and line.lstrip("# ") == GRPC_LINE]
    if len(given) != 1:
        raise ValueError(f"{base.name}: its comment no longer gives the line {GRPC_LINE!r}")
    acls = [i for i, line in enumerate(lines) if line.strip().startswith("acl drain_gate_resendable ")]
    if not acls:
        raise ValueError(f"{base.name}: no `acl drain_gate_resendable` line")
    last = lines[acls[-1]]
    indent = last[: len(last) - len(last.lstrip())]
    path = Path(workdir) / f"{base.stem}-grpc.cfg"
    path.write_text("\n".join([*lines[: acls[-1] + 1], indent + GRPC_LINE, *lines[acls[-1] + 1:]]) + "\n")
    return path


@dataclass(frozen=True)
class Workload:
    period: float = 0.05  # each client: a new call this long after the last one ended
    drain_at: float = 0.5  # gw1's preStop call, this long after the first calls
    lb_buffer: str = "2s"
    drain_timeout: str = "5s"
    call_timeout: float = 5.0


RIG = Workload()


def gateway_config(front: str, mode: str, w: Workload = RIG) -> dict:
    base = {"drain_timeout": w.drain_timeout, "lb_buffer": w.lb_buffer}
    if mode == "serve":
        return base
    return {**base, "draining_new_requests": "refuse", "draining_grpc_requests": GRPC[mode],
            "refuse_with": REFUSE_WITH[front]}


@dataclass
class Calls:
    """One client's calls of one kind: the outcome of each (a grpc.StatusCode name) and when."""

    kind: str
    outcomes: list[tuple[float, str]] = field(default_factory=list)

    @property
    def failed(self) -> list[tuple[float, str]]:
        return [o for o in self.outcomes if o[1] != "OK"]


def one_call(channel: grpc.Channel, kind: str, timeout: float) -> str:
    try:
        if kind == "unary":
            ok = channel.unary_unary(UNARY)(b"x", timeout=timeout) == b"ok x"
        elif kind == "server-streaming":
            ok = len(list(channel.unary_stream(TICKS)(b"3 5", timeout=timeout))) == 3
        else:
            def messages():
                yield b"a"
                time.sleep(0.02)
                yield b"b"
            ok = list(channel.stream_stream(ECHO)(messages(), timeout=timeout)) == [b"a", b"b"]
        return "OK" if ok else "WRONG_ANSWER"
    except grpc.RpcError as e:
        return e.code().name


def client(target: str, kind: str, w: Workload, stop: threading.Event, calls: Calls) -> None:
    with grpc.insecure_channel(target) as channel:
        while not stop.is_set():
            calls.outcomes.append((time.time(), one_call(channel, kind, w.call_timeout)))
            stop.wait(w.period)


def direct_get(port: int) -> bytes:
    """A GET straight to a gateway's traffic port: the head of its answer (b"": none, the
    connection closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: direct\r\nConnection: close\r\n\r\n")
        try:
            return read_head(s)
        except ConnectionError:
            return b""


def run_once(front: str, mode: str, workdir: Path, w: Workload = RIG) -> dict:
    """One drain of gw1 under the gRPC clients; their outcomes and gw1's account."""
    with grpc_backend() as grpc_port, FrontRig(workdir, gateway_config(front, mode, w), backend_port=grpc_port,
                                               h2=True, concurrency=1) as rig:
        cfg = haproxy_grpc_cfg(workdir) if (front, mode) == ("haproxy", "refuse-grpc") else None
        rig.use(front, h2=True, haproxy_cfg=cfg)
        gw1 = rig.gw("gw1")
        stop = threading.Event()
        calls = [Calls(k) for k in KINDS]
        threads = [threading.Thread(target=client, args=(rig.grpc_target, c.kind, w, stop, c), daemon=True)
                   for c in calls]
        rig.stack.callback(lambda: (stop.set(), [t.join(10) for t in threads]))
        t0 = time.time()
        for t in threads:
            t.start()
        time.sleep(w.drain_at)
        ps = PreStop(gw1, via="drain", timeout=60)
        time.sleep(0.2)  # a tick: every worker refuses
        # What a request of another kind meets now (served: forwarded to the gRPC server).
        direct = direct_get(gw1.ports.traffic) if mode != "serve" else None
        ps.wait(60)
        stop.set()
        for t in threads:
            t.join(w.call_timeout + 5)
        final = gw1.status()
        made = sum(len(c.outcomes) for c in calls)

        def grpc_logged():
            return [x for x in rig.served() if "/drain_gate.test." in x.path]

        # Behind HAProxy with `on-marked-down shutdown-sessions` (haproxy.cfg's; haproxy-refuse.cfg
        # goes without): the calls its DOWN cut, the sessions its own DOWN message says gw1 still
        # had. A call it cut before the call reached gw1 (the DOWN-instant race: gw1 counts no cut)
        # may get no log line at all (HAProxy 2.6, an HTTP/2 client: seen here), so the log is
        # waited for up to those. Without it the DOWN cuts nothing.
        cuts = isinstance(rig.lb, HAProxy) and cuts_at_down(rig.lb.cfg)
        killed = next((n for srv, n in rig.lb.down_events() if srv == "gw1"), 0) if cuts else 0
        logged = wait_for(lambda: (v := grpc_logged()) and len(v) >= made - killed and v, 10, 0.1,
                          f"{front} {mode}: the front LB logged every call of {made} "
                          f"(failed: {[c.failed for c in calls]})")
    closing, reason = _closing(final)
    started = parse_time(final["progress"]["drain_started_at"])
    return {
        "front": front,
        "mode": mode,
        "grpc_requests": final["refusing"]["grpc"],
        "refuse_with": final["refusing"]["refuse_with"],
        "calls": {c.kind: len(c.outcomes) for c in calls},
        "failed": {c.kind: [o for _, o in c.failed] for c in calls},
        "failed_at_s": {c.kind: [round(t - t0, 2) for t, _ in c.failed] for c in calls},
        "refused": final["refusing"]["this_drain"],
        "resent": sum(1 for x in logged if x.resent),
        "killed_by_lb_down": killed,
        "unlogged": max(0, made - len(logged)),
        "direct_get": ("–" if direct is None else direct.split(b"\r\n", 1)[0].decode(errors="replace")
                       if direct else "no answer (reset)"),
        "closing_reason": reason,
        "forced": final["progress"]["forced"],
        "draining_s": round(closing - started, 2) if closing and started else None,
        "drain_at_s": round(ps.trigger - t0, 2),
    }


def run_round(workdir: Path, runs: list[tuple[str, str]] = RUNS, w: Workload = RIG) -> list[dict]:
    """Every (front, mode) of `runs` at the same time, each in its own rig."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(run_once, front, mode, workdir / f"{front}-{mode}", w) for front, mode in runs]
        return [f.result() for f in futures]


def table(rows: list[dict]) -> str:
    head = ("| front LB | mode | gRPC while refusing | " + " | ".join(f"{k}: failed / calls" for k in KINDS) +
            " | gw1 refused | resent by the LB | a GET straight to gw1 |\n|---|---|---|" + "---|" * len(KINDS) +
            "---|---|---|\n")
    lines = []
    for r in rows:
        cells = " | ".join(f"{len(r['failed'][k])} / {r['calls'][k]}" +
                           (f" ({', '.join(sorted(set(r['failed'][k])))})" if r["failed"][k] else "") for k in KINDS)
        grpc_cell = "–" if r["mode"] == "serve" else f"{r['grpc_requests']} ({r['refuse_with']})"
        lines.append(f"| {r['front']} | {r['mode']} | {grpc_cell} | {cells} | {r['refused']} | {r['resent']} | "
                     f"{r['direct_get']} |")
    return head + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="refuse-grpc-") as wd:
        for i in range(args.runs):
            for row in run_round(Path(wd) / f"round-{i}"):
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    stop_on_signals()  # Ctrl-C and SIGTERM stop what the run started, in a background job too
    raise SystemExit(main())
