"""`make rollout` / `make rollout-quick`: the same rolling update of a gateway fleet behind real
HAProxy, once per strategy, under traffic that never stops.

The update replays a Deployment with `maxSurge: 1, maxUnavailable: 0` the way the Deployment
controller runs it: start one new gateway, wait until HAProxy has it UP (its stats socket),
delete one old gateway (kubelet: preStop, SIGTERM, pilot-agent's drain, exit — tests/fleet/fleet.py),
and start the next new gateway at once: a terminating pod no longer counts against maxSurge, so
drains overlap. The rollout ends when the last old gateway has exited.

Every request carries an id; the backend counts each one's executions with the shipped ledger
(envoyfilter/tools/ledger.py, its `GET /executions`): an id run more than once is a duplicate, a
request the LB sent again after the application had run it.

Writes out/rollout/result.json ({"strategies": {name: {"sent", "lost", "executions", "rollout_s",
"drain_s", …}}, "n": N}), results.md, out/rollout/timeline.svg (one row per gateway) and the logs
of every process.

    PYTHONPATH=. .venv/bin/python -m tests.fleet.driver [--quick] [--n 4] [--strategies a,b]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import statistics
import time
from pathlib import Path

import requests

from tests.fleet import fleet, picture
from tests.fleet.traffic import FULL, KINDS, QUICK, Profile, Traffic
from tests.harness.envoy import REPO
from tests.harness.process import stop_on_signals
from tests.harness.rig import Backend
from tests.harness.timeline import StatPoller, parse_time

OUT = REPO / "out" / "rollout"
INTER = "2s"  # haproxy.cfg's check timing: inter 2s rise 2 fall 2
INTER_S = 2.0
QUICK_STRATEGIES = ("istio-default", "drain-gate-404")
TICK_S = 0.1  # drain-gate's default tick: every worker sorts ends from its first tick in a drain on


def _up(server) -> bool:
    return server.up and server.check_status == "L7OK"


def start_fleet(stack: contextlib.ExitStack, strategy: fleet.Strategy, n: int, workdir: Path):
    """Backend, N running old gateways, N new ones not started yet, HAProxy in front of all:
    (old, new, haproxy, backend)."""
    backend = Backend(workdir).start()
    stack.callback(backend.stop)
    old = [fleet.Pod(f"old{i + 1}", backend.port, strategy, workdir) for i in range(n)]
    new = [fleet.Pod(f"new{i + 1}", backend.port, strategy, workdir) for i in range(n)]
    for pod in old + new:
        stack.callback(pod.stop)
    for pod in old:
        pod.start()
    servers = [(p.name, p.ports.traffic, p.check_port) for p in old + new]
    haproxy = fleet.FleetHAProxy(workdir / "haproxy", servers, strategy=strategy, inter=INTER)
    stack.callback(haproxy.stop)
    haproxy.start()
    for pod in old:
        haproxy.wait_status(pod.name, _up, timeout=30)
        pod.up_at = time.time()
    for pod in new:  # nothing listens there yet: HAProxy must see them DOWN before traffic starts
        haproxy.wait_status(pod.name, "DOWN", timeout=30)
    return old, new, haproxy, backend


def roll(old: list, new: list, haproxy, replacement: str = "TerminationStarted") -> None:
    """maxSurge 1, maxUnavailable 0: surge one, wait until HAProxy has it UP, delete one old.

    `replacement` is the Deployment's podReplacementPolicy (KEP-3973): TerminationStarted (the
    default) surges the next one at once, TerminationComplete once the deleted one has exited."""
    for fresh, stale in zip(new, old):
        fresh.start()
        haproxy.wait_status(fresh.name, _up, timeout=60)
        fresh.up_at = time.time()
        stale.delete()
        if replacement == "TerminationComplete":
            stale.wait_exit(fleet.GRACE_S + 30)
    for stale in old:
        stale.wait_exit(fleet.GRACE_S + 30)


def run_strategy(strategy: fleet.Strategy, n: int, profile: Profile, workdir: Path,
                 replacement: str = "TerminationStarted") -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        old, new, haproxy, backend = start_fleet(stack, strategy, n, workdir)
        stat = StatPoller(haproxy).start()
        stack.callback(stat.stop)
        traffic = Traffic.through(haproxy, profile)
        stack.callback(traffic.stop)
        traffic.start()
        # Long requests of every kind in flight on the old gateways before the first surge.
        traffic.flowing()
        time.sleep(profile.stream_seconds[0])
        t0 = time.time()
        roll(old, new, haproxy, replacement)
        end = max(p.exit_at for p in old)
        time.sleep(2)  # traffic goes on after the last exit, on the new gateways only
        traffic.stop()
        traffic.drain(profile.stream_seconds[1] + 60)
        ran = requests.get(f"http://127.0.0.1:{backend.port}/executions", timeout=10).json()["executions"]
        stat.stop()
        haproxy.stop()  # flushes its log
        traffic.attribute(haproxy.requests())
        return account(strategy, traffic, old, new, stat, haproxy, t0, end, ran)


def _when(o: dict, old: dict, downs: list) -> str:
    """Where a lost request falls in its gateway's drain: in flight when the LB check began to
    fail, or started between that flip and HAProxy's DOWN (the 200-mode window), or elsewhere."""
    pod = old.get(o["server"] or o["near_down"] or "")
    if not pod or not pod.flip_at:
        return "elsewhere"
    down = next((t for t, srv in downs if srv == pod.name and t >= pod.flip_at), None)
    if o["start"] < pod.flip_at:
        return "in flight at the flip"
    if down and o["start"] < down:
        return "between the flip and DOWN"
    return "elsewhere"


def executions(outcomes, ran: dict[str, int]) -> dict:
    """What the application ran, from the ledger's executions per id (`ran`): `duplicates`, the
    requests it ran more than once (`by_kind`; `app_503`: of them, POSTs it was asked to answer
    503), and the runs beyond each one's first (`extra_runs`); `posts` and `app_503_posts` sent,
    `app_503_once` of those run exactly once;
    `not_counted`: requests answered as the application answers them (ok) that the ledger has no
    execution of — 0, or the count itself is broken."""
    dup = [o for o in outcomes if ran.get(o.id, 0) > 1]
    return {
        "duplicates": len(dup),
        "by_kind": {k: sum(1 for o in dup if o.kind == k) for k in KINDS},
        "app_503": sum(1 for o in dup if o.want_status == 503),
        "extra_runs": sum(ran[o.id] - 1 for o in dup),
        "max_runs": max((ran.get(o.id, 0) for o in outcomes), default=0),
        "posts": sum(1 for o in outcomes if o.method == "POST"),
        "app_503_posts": sum(1 for o in outcomes if o.want_status == 503),
        "app_503_once": sum(1 for o in outcomes if o.want_status == 503 and ran.get(o.id) == 1),
        "not_counted": sum(1 for o in outcomes if o.ok and not ran.get(o.id)),
        "total": sum(ran.get(o.id, 0) for o in outcomes),
        "duplicate_ids": {o.id: ran[o.id] for o in dup[:50]},
    }


def account(strategy, traffic: Traffic, old, new, stat, haproxy, t0: float, end: float, ran: dict) -> dict:
    sent, lost = traffic.counts()
    lost_by_gateway: dict[str, int] = {}
    downs = [(t, srv) for t, srv, st, _ in stat.changes if st == "DOWN"]
    lost_list = traffic.lost()
    how = how_haproxy_ended(haproxy.log())
    for o in lost_list:
        o["haproxy"] = lost_class(how.get(o["id"]))
        o["ran"] = ran.get(o["id"], 0)  # how often the application ran it all the same
    for o in lost_list:
        key = o["server"] or "(none)"
        lost_by_gateway[key] = lost_by_gateway.get(key, 0) + 1
        # A request HAProxy never logged (closed before it was read): was it at a DOWN instant?
        near = [srv for t, srv in downs if o["end"] and abs(t - o["end"]) <= 1.0]
        o["near_down"] = near[0] if near else None
        o["when"] = _when(o, {p.name: p for p in old}, downs)
    ready = [round(p.up_at - p.created_at, 3) for p in new]
    shorts = [o for o in traffic.outcomes if o.kind == "short"]
    return {
        "sent": sent,
        "lost": lost,
        "executions": executions(traffic.outcomes, ran),
        "gateway": gateway_account(old, haproxy.requests()),
        "rollout_s": round(end - t0, 3),
        "drain_s": [p.drain_s for p in old],
        "ready_s": ready,
        "short_rate": round(len(shorts) / max(1e-9, traffic.stopped - traffic.started), 1),
        "lost_by_gateway": lost_by_gateway,
        "lost_how": {c: sum(1 for o in lost_list if o["haproxy"] == c) for c in LOST_CLASSES},
        "lost_when": {w: sum(1 for o in lost_list if o["when"] == w)
                      for w in ("in flight at the flip", "between the flip and DOWN", "elsewhere")},
        "cut_at_down": haproxy.down_events(),
        "tries": tries(haproxy.log()),
        "prestop": {p.name: p.prestop_result for p in old},
        "config": {"check": strategy.check_path, "soft_drain": strategy.soft_drain,
                   "prestop": strategy.prestop, "drain_gate": strategy.config,
                   "haproxy": str(strategy.haproxy_cfg.relative_to(REPO)), "retries": strategy.retries or 3},
        "timeline": {
            "t0": t0,
            "pods": [p.summary() for p in old + new],
            "haproxy": [{"t": t, "server": s, "status": st, "check": c} for t, s, st, c in stat.changes],
            "lost": lost_list,
        },
    }


# One httplog line: [date] fe be/srv TR/Tw/Tc/Tr/Ta status bytes - - TERM ... "METHOD uri".
_ENDED = re.compile(r"\] \S+ [^/\s]+/(\S+) -?\d+/-?\d+/(-?\d+)/-?\d+/\+?-?\d+ (-?\d+) \S+ \S+ \S+ (\S{4}) "
                    r".*?(?:[?&]id=|/ledger/)([a-z0-9_-]+)")
# How HAProxy ended a lost request, from its log line:
#   cut at DOWN          termination D with the connection to the gateway up: on-marked-down
#                        shutdown-sessions reset it; the gateway saw the reset
#   killed before the gateway   termination D, no connection to the gateway yet (Tc -1): assigned to
#                        the gateway at the instant HAProxy marked it DOWN; the gateway never saw it
#   refused, not resent  drain-gate's 503 passed on (its last try refused)
#   ended by the gateway termination S: the gateway's side closed it (the gateway sorts that end as
#                        its own, not a cut)
#   not logged           HAProxy wrote no line (closed at a DOWN instant before it was read)
LOST_CLASSES = ("cut at DOWN", "killed before the gateway", "refused, not resent", "ended by the gateway",
                "not logged", "other")


def how_haproxy_ended(log: str) -> dict[str, tuple[str, int, int, str]]:
    """Request id -> (server, Tc, status, termination) from HAProxy's log."""
    out = {}
    for m in map(_ENDED.search, log.splitlines()):
        if m:
            out[m[5]] = (m[1], int(m[2]), int(m[3]), m[4])
    return out


def lost_class(ended: tuple[str, int, int, str] | None) -> str:
    if ended is None:
        return "not logged"
    _, tc, status, term = ended
    if term.startswith("D"):
        return "cut at DOWN" if tc >= 0 else "killed before the gateway"
    if term.startswith("S"):
        return "ended by the gateway"
    if status == 503 and term == "----":
        return "refused, not resent"
    return "other"


_TRIES = re.compile(r" \S{4} \d+/\d+/\d+/\d+/\+?(\d+) ")


def tries(log: str) -> dict[str, int]:
    """Requests by how many tries HAProxy took to answer them (its log's retries field, plus 1):
    2 or more, a request it resent (after a failed connection, or a refusal with retry-on)."""
    counts: dict[str, int] = {}
    for m in map(_TRIES.search, log.splitlines()):
        if m:
            k = str(1 + int(m[1]))
            counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def gateway_account(old: list, logged) -> dict:
    """The fleet's own account: each old gateway's drain receipt, read before it exited, summed.
    `drains`: gateways that ran a drain-gate drain (istio-default and fail-then-wait run none:
    their gateways stay OPEN, and drain-gate sorts no end outside a drain).

    `ws_closed_by_client`: websockets that ran to their end on a gateway during its drain (HAProxy
    logged them `----`): the client closes a websocket when it is done, Envoy flags that end as
    the downstream's, and the receipt sorts it as a cut (`cut_other`), as it sorts a client that
    gave up. Each worker sorts ends from its first tick in the drain on: one that ended within a
    tick of the drain's start may or may not be sorted (`ws_at_drain_start`)."""
    receipts = {p.name: p.receipt for p in old}
    drained = [r for r in receipts.values() if r and r.get("drain_started_at")]
    ws = at_start = 0
    for p in old:
        r = receipts[p.name]
        if r and r.get("drain_started_at") and p.receipt_at:
            began = parse_time(r["drain_started_at"])
            ends = [x.end for x in logged if x.server == p.name and x.request.startswith("GET /ws")
                    and x.termination == "----" and began <= x.end <= p.receipt_at]
            ws += sum(1 for t in ends if t > began + TICK_S)
            at_start += sum(1 for t in ends if t <= began + TICK_S)
    return {"drains": len(drained), "unread": sorted(n for n, r in receipts.items() if r is None),
            **{k: sum(r[k] for r in drained) for k in ("cut", "cut_lb", "refused")},
            "ws_closed_by_client": ws, "ws_at_drain_start": at_start, "per_gateway": receipts}


def lost_total(r: dict) -> int:
    return sum(r["lost"].values())


def gateway_cell(r: dict) -> str:
    """The gateway's own figure beside the clients': cut (cut_lb), or why there is none."""
    g = r.get("gateway")
    if not g:
        return "-"
    if not g["drains"]:
        return "no drain ran"
    refused = f", refused {g['refused']}" if g["refused"] else ""
    return f"{g['cut']} ({g['cut_lb']}){refused}"


def ws_cell(r: dict) -> str:
    g = r.get("gateway")
    return str(g["ws_closed_by_client"]) if g and g["drains"] else "-"


def disagreements(result: dict) -> list[str]:
    """Where the fleet's own account and the clients' losses disagree. A strategy whose gateways
    ran a drain-gate drain must have counted as the LB's cut (HAProxy's DOWN, within 2 s of the
    lb_fall-th 503 it was served) every lost request HAProxy cut at DOWN — and nothing more than
    those plus the ones HAProxy did not log —, no other cut than websockets their clients closed
    (most of those are sorted as cuts, a few as completed), and as refused at least every refusal
    that reached a client; one whose gateways ran
    none must say so for every gateway (it could count nothing). Every receipt must have been
    read, and every loss must fall in a class of LOST_CLASSES but "other"."""
    out = []
    for name, r in result["strategies"].items():
        g, lost = r["gateway"], lost_total(r)
        if g["unread"]:
            out.append(f"{name}: no receipt from {g['unread']}")
        elif g["drains"] == 0:
            if any(v and v.get("drain_started_at") for v in g["per_gateway"].values()):
                out.append(f"{name}: some drains, not all")
        elif g["drains"] != len(g["per_gateway"]):
            out.append(f"{name}: {g['drains']} of {len(g['per_gateway'])} gateways drained")
        else:
            how = r["lost_how"]
            if not (how["cut at DOWN"] <= g["cut_lb"] <= how["cut at DOWN"] + how["not logged"]) \
                    or g["cut"] - g["cut_lb"] > g["ws_closed_by_client"] + g["ws_at_drain_start"] \
                    or g["refused"] < how["refused, not resent"]:
                out.append(f"{name}: clients lost {lost} ({how}), gateways counted cut {g['cut']} "
                           f"(cut_lb {g['cut_lb']}), refused {g['refused']}; {g['ws_closed_by_client']} "
                           f"websockets closed by their clients during the drains")
        if r["lost_how"]["other"]:
            out.append(f"{name}: {r['lost_how']['other']} lost requests HAProxy ended otherwise")
        if r["executions"]["not_counted"]:
            out.append(f"{name}: {r['executions']['not_counted']} requests answered by the application that its "
                       "ledger did not count")
    return out


# The strategies that must lose nothing of any kind. Not drain-gate-200-refuse-shutdown-sessions: its
# DOWN cuts what a 200-mode drain still has at that instant (a POST served in CLOSING, a request just
# assigned), as measured in tests/docs/rollout.md.
LOSSLESS = ("drain-gate-404", "drain-gate-200-refuse")
# The control of the duplicates: the refuse mode's recipe before, which resent every 503. It must
# show what every other strategy must not: a request run twice.
DUPLICATES_CONTROL = "drain-gate-200-refuse-resends-503"


def duplicated(result: dict) -> list[str]:
    """No strategy may run a request twice but the control, which must (else the rig could not
    see a duplicate): the refuse strategies resend only what no gateway forwarded, the others
    only a connection that failed."""
    out = []
    for name, r in result["strategies"].items():
        x = r["executions"]
        if name == DUPLICATES_CONTROL:
            if not x["duplicates"]:
                out.append(f"{name}: the control ran no request twice ({x['app_503_posts']} POSTs answered 503)")
        elif x["duplicates"]:
            out.append(f"{name}: ran {x['duplicates']} requests twice or more ({x['by_kind']}; "
                       f"{x['app_503']} POSTs answered 503; {x['duplicate_ids']})")
    return out


def failures(result: dict) -> list[str]:
    """What makes `make rollout` fail: the gateways' account and the clients' losses disagree, or a
    lossless strategy lost a request of any kind (drain-gate-404: NOLB, nothing left at DOWN;
    drain-gate-200-refuse: haproxy-refuse.cfg has no shutdown-sessions, so its DOWN cuts neither a
    POST served in CLOSING nor a request assigned at that instant, which the gateway refuses and
    HAProxy resends), or a strategy but the control ran a request twice, or the control none
    (`duplicated`)."""
    lossy = [f"{name}: lost {r['lost']} ({r['lost_how']})"
             for name, r in result["strategies"].items() if name in LOSSLESS and lost_total(r)]
    return disagreements(result) + lossy + duplicated(result)


def verdict(result: dict) -> list[str]:
    bad = failures(result)
    lines = [f"{name}: lost {lost_total(r)}: " + ", ".join(f"{v} {k}" for k, v in r["lost_how"].items() if v)
             + f"; of them {sum(o['method'] == 'POST' for o in r['timeline']['lost'])} POSTs, "
             f"{sum(o['ran'] > 0 for o in r['timeline']['lost'])} run by the application all the same"
             for name, r in result["strategies"].items() if lost_total(r)]
    lines += [f"{name}: ran {r['executions']['duplicates']} requests twice or more, "
              f"{r['executions']['app_503']} of them POSTs the application answered 503 "
              f"(at most {r['executions']['max_runs']} runs of one)"
              for name, r in result["strategies"].items() if r["executions"]["duplicates"]]
    if not bad:
        clean = [name for name in LOSSLESS if name in result["strategies"]]
        lines.append("gateways and clients agree on every loss; "
                     + (f"{' and '.join(clean)} lost nothing; " if clean else "")
                     + "no strategy ran a request twice but the control")
    return lines + [f"FAIL: {b}" for b in bad]


def duplicates_cell(r: dict) -> str:
    """Requests the application ran twice or more, and how many of those were POSTs it answered
    503 ("-": a result from before the ledger)."""
    x = r.get("executions")
    if not x:
        return "-"
    return f"{x['duplicates']} ({x['app_503']})" if x["app_503"] else str(x["duplicates"])


DUPLICATES_HEAD = "run twice or more (of them POSTs the application answered 503)"


def table(result: dict) -> str:
    """tests/docs/rollout.md's table: lost / sent per kind, the gateways' own count, rollout time,
    drain time per gateway."""
    lines = ["| strategy | short lost/sent | HTTP/1.1 streams | HTTP/2 streams | websockets | lost, all kinds "
             f"| {DUPLICATES_HEAD} | gateways: cut (cut_lb) | of which websockets closed by their clients | rollout s "
             "| drain s per gateway (median, max) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["strategies"].items():
        cells = [f"{r['lost'][k]}/{r['sent'][k]}" for k in ("short", "h1_stream", "h2_stream", "websocket")]
        d = drains(r)
        drain = f"{statistics.median(d):.1f}, {max(d):.1f}" if d else "-"
        lines.append(f"| {name} | {' | '.join(cells)} | {lost_total(r)} | {duplicates_cell(r)} | {gateway_cell(r)} "
                     f"| {ws_cell(r)} | {r['rollout_s']:.1f} | {drain} |")
    return "\n".join(lines)


def drains(r: dict) -> list[float]:
    return [d for d in r["drain_s"] if d is not None]


def on_paper(r: dict, n: int, surge: int, replacement: str) -> float:
    """A rollout's length from the measured medians: waves of `surge` new gateways, each T_up
    (start -> HAProxy UP); the deleted gateways drain (T_drain: deletion -> exit) while the next
    wave comes up (TerminationStarted), or before it (TerminationComplete)."""
    t_up = statistics.median(r["ready_s"])
    t_drain = statistics.median(drains(r))
    waves = math.ceil(n / surge)
    return waves * (t_up + t_drain) if replacement == "TerminationComplete" else waves * t_up + t_drain


def paper_table(result: dict) -> str:
    """The formula beside the measurement (N of this run), then N = 10, 50, 200 in minutes, each
    as TerminationStarted / TerminationComplete."""
    n, rep = result["n"], result.get("replacement", "TerminationStarted")
    sizes = (10, 50, 200)
    head = " | ".join(f"N={m} surge {s}" for m in sizes for s in ("1", "25%"))
    lines = [f"| strategy | T_up s | T_drain s (max) | N={n} formula s | N={n} measured s | {head} |",
             "|---|---|---|---|---|" + "---|" * (2 * len(sizes))]
    for name, r in result["strategies"].items():
        cells = [" / ".join(f"{on_paper(r, m, s, p) / 60:.1f}" for p in ("TerminationStarted", "TerminationComplete"))
                 for m in sizes for s in (1, math.ceil(m / 4))]
        lines.append(f"| {name} | {statistics.median(r['ready_s']):.1f} | "
                     f"{statistics.median(drains(r)):.1f} ({max(drains(r)):.1f}) | {on_paper(r, n, 1, rep):.1f} | "
                     f"{r['rollout_s']:.1f} | {' | '.join(cells)} |")
    return "\n".join(lines)


def run(*, quick: bool, n: int | None = None, names: list[str] | None = None, out: Path = OUT,
        replacement: str = "TerminationStarted") -> dict:
    profile = QUICK if quick else FULL
    n = n or (2 if quick else 4)
    all_strategies = fleet.strategies(INTER_S)
    names = names or (list(QUICK_STRATEGIES) if quick else [n for n in all_strategies if n not in fleet.OPTIONAL])
    run_dir = out.resolve() / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    result = {"n": n, "quick": quick, "inter": INTER, "replacement": replacement, "profile": vars(profile),
              "strategies": {}}
    for name in names:
        result["strategies"][name] = run_strategy(all_strategies[name], n, profile, run_dir / name, replacement)
        write(result, out, run_dir)  # a partial result survives a failure
    print(table(result) + "\n\n" + paper_table(result))
    print("\n".join(verdict(result)))
    return result


def write(result: dict, out: Path, run_dir: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1)
    (run_dir / "result.json").write_text(text)
    (out / "result.json").write_text(text)
    (out / "results.md").write_text(table(result) + "\n\n" + paper_table(result) + "\n")
    picture.render(result, out / "timeline.svg")


def runs_table(results: list[dict]) -> str:
    """Several runs side by side: lost/sent per kind and rollout seconds, one cell per run."""
    kinds = ("short", "h1_stream", "h2_stream", "websocket")
    lines = ["| strategy | short lost/sent | HTTP/1.1 streams | HTTP/2 streams | websockets | lost, all kinds "
             f"| {DUPLICATES_HEAD} | gateways: cut (cut_lb) | of which websockets closed by their clients | rollout s "
             "| drain s per gateway, median (range) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    names = list(dict.fromkeys(n for res in results for n in res["strategies"]))
    for name in names:
        rs = [res["strategies"][name] for res in results if name in res["strategies"]]
        cells = [", ".join(f"{r['lost'][k]}/{r['sent'][k]}" for r in rs) for k in kinds]
        d = [x for r in rs for x in drains(r)]
        times = ", ".join(f"{r['rollout_s']:.1f}" for r in rs)
        lost = ", ".join(str(lost_total(r)) for r in rs)
        dup = ", ".join(duplicates_cell(r) for r in rs)
        gw = "; ".join(gateway_cell(r) for r in rs)
        ws = ", ".join(ws_cell(r) for r in rs)
        lines.append(f"| {name} | {' | '.join(cells)} | {lost} | {dup} | {gw} | {ws} | {times} | "
                     f"{statistics.median(d):.1f} ({min(d):.1f}–{max(d):.1f}) |")
    return "\n".join(lines)


def pooled_table(results: list[dict]) -> str:
    """Scale on paper from several runs: T_up pooled over every strategy (the same start + rise x
    inter for all), T_drain per strategy; and how far the formula, fed each run's own medians,
    falls from each measured rollout."""
    t_up = statistics.median(x for res in results for r in res["strategies"].values() for x in r["ready_s"])
    sizes = (10, 50, 200)
    head = " | ".join(f"N={m} surge {s}" for m in sizes for s in ("1", "25%"))
    lines = [f"| strategy | T_drain s, median (max) | formula − measured, N={results[0]['n']} (s) | {head} |",
             "|---|---|---|" + "---|" * (2 * len(sizes))]
    for name in results[0]["strategies"]:
        rs = [res["strategies"][name] for res in results if name in res["strategies"]]
        d = [x for r in rs for x in drains(r)]
        pooled = {"ready_s": [t_up], "drain_s": d}
        cells = [" / ".join(f"{on_paper(pooled, m, s, p) / 60:.1f}" for p in ("TerminationStarted", "TerminationComplete"))
                 for m in sizes for s in (1, math.ceil(m / 4))]
        errors = ", ".join(f"{on_paper(r, res['n'], 1, res.get('replacement', 'TerminationStarted')) - r['rollout_s']:+.1f}"
                           for res, r in zip(results, rs))
        lines.append(f"| {name} | {statistics.median(d):.1f} ({max(d):.1f}) | {errors} | {' | '.join(cells)} |")
    return f"T_up (start -> HAProxy UP), every new gateway of every run: median {t_up:.1f} s\n\n" + "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 gateways, istio-default and drain-gate-404")
    ap.add_argument("--n", type=int, help="gateways in the fleet (default 4; quick: 2)")
    ap.add_argument("--strategies", help="comma-separated subset")
    ap.add_argument("--replacement", choices=("TerminationStarted", "TerminationComplete"),
                    default="TerminationStarted", help="the Deployment's podReplacementPolicy")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--summarize", nargs="+", type=Path, metavar="RESULT_JSON",
                    help="print the table of several runs' result.json instead of running")
    args = ap.parse_args()
    if args.summarize:
        results = [json.loads(p.read_text()) for p in args.summarize]
        print(runs_table(results) + "\n\n" + pooled_table(results))
        return 0
    result = run(quick=args.quick, n=args.n, names=args.strategies.split(",") if args.strategies else None,
                 out=args.out, replacement=args.replacement)
    return 1 if failures(result) else 0


if __name__ == "__main__":
    stop_on_signals()  # Ctrl-C and SIGTERM stop what the run started, in a background job too
    raise SystemExit(main())
