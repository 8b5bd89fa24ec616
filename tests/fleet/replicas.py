"""`make replicas`: how many gateways a fleet needs so that, when one drains, the others carry its
share — measured on the rollout rig's pieces (tests/fleet/fleet.py) behind a real HAProxy.

    open-loop client: GET / at a fixed total rate (the same for every N), each request tagged
      │               `id=`, its latency taken from the instant it was due (not when it was sent)
      └─▶ HAProxy 2.6   envoyfilter/haproxy/haproxy-soft-drain.cfg, one `server` line per gateway
            ├─ traffic ─▶ gw1 … gwN   Envoy --concurrency 1, envoyfilter/envoy.yaml ─▶ demo backend
            └─ check ───▶ drain-gate's /health_check.html (404 while draining: NOLB)

For N gateways, rounds of three phases, interleaved (each round: before, drain, rolling):

  before    every gateway OPEN; the others (every gateway but the one the next phase drains) each
            carry load/N
  drain     one gateway deleted as a Kubernetes pod (drain-gate's preStop, DRAINING → CLOSED, exit):
            the N−1 others carry load/(N−1); afterwards it is replaced (outside the phase)
  rolling   maxUnavailable 1, maxSurge 0: delete one, start its replacement at once, wait until
            HAProxy has it UP, delete the next; the others are the gateways not draining at each
            instant

"The others" of a phase are measured over the intervals in which each one serves (from HAProxy's
UP, or the phase's start, to its deletion, or the phase's end):

  p99        the client's latency of the requests HAProxy's log says they served
  CPU        their Envoy worker thread (`/proc/<pid>/task/<tid>/schedstat`) and whole process
             (`/proc/<pid>/stat` utime + stime), per request they served and as % of a core
  lost       every request due in the phase that did not get its 200 and body, and every line of
             HAProxy's log in the phase that is not a 200 ending `----`; a request to a drained
             gateway accepted after its CLOSED. An answered request missing from HAProxy's log is
             no loss: HAProxy's log writes do not block, and it counts the lines it drops
             (`show info` DroppedLogs), which must cover them

Writes out/replicas/results.md and results.json.

    PYTHONPATH=. .venv/bin/python -m tests.fleet.replicas [--n 2,4,8] [--rate 400] [--seconds 20] [--rounds 2]
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
import signal
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.bench.cpu import worker_ns, worker_tid
from tests.fleet import fleet
from tests.harness.envoy import REPO, wait_for
from tests.harness.haproxy import LogLine
from tests.harness.process import stop_on_signals
from tests.harness.rig import Backend

OUT = REPO / "out" / "replicas"
INTER = "1s"  # HAProxy's check interval here (rise 2 fall 2 as shipped): a replacement is UP in ~3 s
INTER_S = 1.0
STRATEGY = "drain-gate-404"  # drain-gate's soft drain: NOLB at the first 404
BODY = b"hello\n"  # the demo backend's answer to GET /
PHASES = ("before", "drain", "rolling", "kill")  # kill: the control, once per N, last
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _up(server) -> bool:
    return server.up and server.check_status == "L7OK"


# -- the load ---------------------------------------------------------------------------------

@dataclass
class Shot:
    id: str
    due: float  # when the schedule said to send it (epoch s)
    end: float | None = None
    status: int = 0
    ok: bool = False
    error: str = ""
    server: str | None = None  # from HAProxy's log

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.due


class OpenLoop:
    """GET / through HAProxy at a fixed rate, open loop: a schedule thread queues each request at
    its due instant whatever the earlier ones are doing, `workers` threads send them on their own
    keep-alive connection (http.client). A request's latency runs from its due instant, so a
    stall shows in the latencies of every request queued behind it."""

    def __init__(self, port: int, rate: float, workers: int = 16, prefix: str = "r"):
        self.port, self.rate, self.workers, self.prefix = port, rate, workers, prefix
        self.shots: list[Shot] = []
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> "OpenLoop":
        for _ in range(self.workers):
            self._threads.append(threading.Thread(target=self._worker, daemon=True))
        self._threads.append(threading.Thread(target=self._schedule, daemon=True))
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout: float = 15) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        for _ in range(self.workers):
            self._q.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def _schedule(self) -> None:
        period = 1.0 / self.rate
        wall0, mono0 = time.time(), time.monotonic()
        i = 0
        while not self._stop.is_set():
            due = mono0 + i * period
            delay = due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            shot = Shot(f"{self.prefix}{i}", wall0 + i * period)
            self.shots.append(shot)
            self._q.put(shot)
            i += 1

    def one(self, path: str, rid: str) -> Shot:
        """One request outside the schedule (the control's slow requests), accounted as the others."""
        shot = Shot(rid, time.time())
        self.shots.append(shot)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", f"{path}&id={rid}", headers={"Host": "replicas"})
            r = conn.getresponse()
            r.read()
            shot.status, shot.ok = r.status, r.status == 200
        except (OSError, http.client.HTTPException) as e:
            shot.error = f"{type(e).__name__}: {str(e)[:120]}"
        finally:
            conn.close()
        shot.end = time.time()
        return shot

    def _worker(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while True:
            shot = self._q.get()
            if shot is None:
                break
            try:
                conn.request("GET", f"/?id={shot.id}", headers={"Host": "replicas"})
                r = conn.getresponse()
                body = r.read()
                shot.status, shot.ok = r.status, r.status == 200 and body == BODY
            except (OSError, http.client.HTTPException) as e:
                shot.error = f"{type(e).__name__}: {str(e)[:120]}"
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            shot.end = time.time()
        conn.close()


# -- CPU --------------------------------------------------------------------------------------

@dataclass
class Cpu:
    t: float
    worker_ns: int
    proc_ns: int


def cpu_of(pod: fleet.Pod) -> Cpu:
    pid = pod.envoy.proc.pid
    tid = getattr(pod, "_worker_tid", None) or worker_tid(pid)
    pod._worker_tid = tid
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return Cpu(time.time(), worker_ns(pid, tid), ticks * 1_000_000_000 // CLK_TCK)


@dataclass
class Segment:
    """One gateway serving as one of "the others" of a phase, from a to b."""

    pod: str
    a: Cpu
    b: Cpu | None = None


@dataclass
class Phase:
    n: int
    round: int
    name: str
    start: float = 0.0
    end: float = 0.0
    segments: list[Segment] = field(default_factory=list)
    drained: list[dict] = field(default_factory=list)  # {pod, deleted_at, closed_at, prestop}
    _open: dict = field(default_factory=dict)

    def open(self, pod: fleet.Pod) -> None:
        seg = Segment(pod.name, cpu_of(pod))
        self.segments.append(seg)
        self._open[pod.name] = (seg, pod)

    def close(self, pod: fleet.Pod) -> None:
        seg, _ = self._open.pop(pod.name)
        seg.b = cpu_of(pod)

    def begin(self, pods: list[fleet.Pod]) -> None:
        self.start = time.time()
        for p in pods:
            self.open(p)

    def finish(self) -> None:
        for seg, pod in list(self._open.values()):
            self.close(pod)
        self.end = time.time()


# -- the fleet --------------------------------------------------------------------------------

class Fleet:
    """Backend, HAProxy with `capacity` server lines, the first `n` gateways running."""

    def __init__(self, stack: contextlib.ExitStack, n: int, capacity: int, workdir: Path):
        self.strategy = fleet.strategies(INTER_S)[STRATEGY]
        backend = Backend(workdir).start()
        stack.callback(backend.stop)
        self.pods = [fleet.Pod(f"gw{i + 1}", backend.port, self.strategy, workdir) for i in range(capacity)]
        for pod in self.pods:
            stack.callback(pod.stop)
        self._next = 0
        self.serving: list[fleet.Pod] = []
        for _ in range(n):
            self.serving.append(self.fresh().start())
        servers = [(p.name, p.ports.traffic, p.check_port) for p in self.pods]
        self.haproxy = fleet.FleetHAProxy(workdir / "haproxy", servers, strategy=self.strategy, inter=INTER)
        stack.callback(self.haproxy.stop)
        self.haproxy.start()
        for pod in self.serving:
            self.wait_up(pod)
        for pod in self.pods[n:]:  # nothing listens there yet
            self.haproxy.wait_status(pod.name, "DOWN", timeout=30)
        self.deleted: list[fleet.Pod] = []
        self.killed: list[fleet.Pod] = []

    def fresh(self) -> fleet.Pod:
        pod = self.pods[self._next]
        self._next += 1
        return pod

    def wait_up(self, pod: fleet.Pod) -> None:
        self.haproxy.wait_status(pod.name, _up, timeout=60)
        pod.up_at = time.time()

    def delete(self, pod: fleet.Pod, phase: Phase | None) -> None:
        if phase and pod.name in phase._open:
            phase.close(pod)
        self.serving.remove(pod)
        self.deleted.append(pod)
        pod.delete()
        if phase:
            phase.drained.append({"pod": pod.name})

    def replace(self, pod: fleet.Pod, phase: Phase | None) -> fleet.Pod:
        """maxUnavailable 1, maxSurge 0: delete `pod`, start its replacement at once, wait until
        HAProxy has the replacement UP (it joins the phase's others from then on)."""
        self.delete(pod, phase)
        new = self.fresh().start()
        self.serving.append(new)
        self.wait_up(new)
        if phase:
            phase.open(new)
        return new

    def settle(self, timeout: float = fleet.GRACE_S + 30) -> None:
        """Every deleted gateway has exited."""
        for pod in self.deleted:
            pod.wait_exit(timeout)


def run_before(f: Fleet, ph: Phase, seconds: float) -> None:
    ph.begin(f.serving[1:])  # the others: all but the gateway the drain phase deletes
    time.sleep(seconds)
    ph.finish()


def run_drain(f: Fleet, ph: Phase, seconds: float) -> None:
    victim = f.serving[0]
    ph.begin(f.serving[1:])
    f.delete(victim, ph)
    time.sleep(seconds)
    ph.finish()
    f.settle()
    new = f.fresh().start()
    f.serving.insert(0, new)
    f.wait_up(new)


def run_rolling(f: Fleet, ph: Phase, seconds: float) -> None:
    ph.begin(list(f.serving))
    for old in list(f.serving):
        f.replace(old, ph)
    ph.finish()
    f.settle()


def run_kill(f: Fleet, ph: Phase, seconds: float, load: "OpenLoop") -> None:
    """The control, in the same rig and load: a gateway killed (SIGKILL) without a drain while
    slow requests are on it. The same accounting must count them lost."""
    victim = f.serving[0]
    ph.begin(f.serving[1:])
    held: list[threading.Thread] = []

    def holds_slow() -> bool:
        # The load's requests last milliseconds, a slow one the whole time: a session on the victim
        # at three polls 0.2 s apart, half a second after the batch went out, is a slow request.
        return all(f.haproxy.servers()[victim.name].scur > 0 and not time.sleep(0.2) for _ in range(3))

    for batch in range(3):  # HAProxy's round robin puts 2 of each batch on each gateway, about
        for i in range(2 * len(f.serving)):
            t = threading.Thread(target=load.one, args=(f"/slow?ms={int(seconds * 1000)}", f"ctl{batch}-{i}"),
                                 daemon=True)
            t.start()
            held.append(t)
        time.sleep(0.5)
        if holds_slow():
            break
    else:
        raise RuntimeError(f"no slow request reached {victim.name}")
    f.serving.remove(victim)
    f.killed.append(victim)
    os.killpg(victim.envoy.proc.pid, signal.SIGKILL)
    victim.envoy.proc.wait(10)
    ph.drained.append({"pod": victim.name, "killed": True})
    for t in held:
        t.join(seconds + 15)
    ph.finish()


RUNNERS = {"before": run_before, "drain": run_drain, "rolling": run_rolling}
CONTROL = "kill"


def capacity(n: int, rounds: int, phases: tuple[str, ...]) -> int:
    per_round = ("drain" in phases) + (n if "rolling" in phases else 0)
    return n + rounds * per_round


@contextlib.contextmanager
def fleet_of(n: int, rounds: int, phases: tuple[str, ...], workdir: Path):
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        yield Fleet(stack, n, capacity(n, rounds, phases), workdir)


def measure(n: int, *, rate: float, seconds: float, rounds: int, phases: tuple[str, ...], workdir: Path,
            warmup: float = 2.0) -> dict:
    """One fleet of N: `rounds` rounds of `phases` under one open-loop load; the accounted phases."""
    with fleet_of(n, rounds, phases, workdir) as f:
        load = OpenLoop(f.haproxy.http_port, rate)
        done: list[Phase] = []
        with load:
            wait_for(lambda: sum(s.ok for s in load.shots) >= min(20, rate), 30, 0.1, "requests flowing")
            time.sleep(warmup)
            for r in range(rounds):
                for name in phases:
                    if name != CONTROL:
                        ph = Phase(n, r, name)
                        RUNNERS[name](f, ph, seconds)
                        done.append(ph)
            if CONTROL in phases:
                ph = Phase(n, 0, CONTROL)
                run_kill(f, ph, min(seconds, 3.0), load)
                done.append(ph)
            time.sleep(1)
        f.settle()
        for ph in done:
            for d in ph.drained:
                if d.get("killed"):
                    continue
                pod = next(p for p in f.pods if p.name == d["pod"])
                d.update(deleted_at=pod.deleted_at, closed_at=pod.prestop_end, prestop=pod.prestop_result,
                         exit_at=pod.exit_at)
        dropped = dropped_logs(f.haproxy)
        f.haproxy.stop()  # flushes its log
        logged = f.haproxy.requests()
        return {**account(n, rate, load.shots, logged, done), "haproxy_dropped_logs": dropped}


def dropped_logs(haproxy) -> int:
    """HAProxy's count of log lines it could not write (`show info` DroppedLogs): its log writes do
    not block, so under load a few lines go missing while the request itself was served."""
    for line in haproxy.command("show info").splitlines():
        if line.startswith("DroppedLogs:"):
            return int(line.split(":", 1)[1])
    raise RuntimeError("HAProxy's show info has no DroppedLogs")


# -- accounting -------------------------------------------------------------------------------

def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def account(n: int, rate: float, shots: list[Shot], logged: list[LogLine], phases: list[Phase]) -> dict:
    by_id = {}
    for line in logged:
        rid = line.request.split("id=", 1)[1].split()[0] if "id=" in line.request else None
        if rid:
            by_id[rid] = line
    for s in shots:
        line = by_id.get(s.id)
        s.server = line.server if line else None
    by_server: dict[str, list[LogLine]] = {}
    for line in logged:
        by_server.setdefault(line.server, []).append(line)
    shots_by_server: dict[str, list[Shot]] = {}
    for s in shots:
        if s.server:
            shots_by_server.setdefault(s.server, []).append(s)
    out = []
    for ph in phases:
        due = [s for s in shots if ph.start <= s.due < ph.end]
        lost = [s for s in due if not s.ok]
        in_log = [line for line in logged if ph.start <= line.accept < ph.end]
        bad_log = [line for line in in_log if line.status != 200 or line.termination != "----"]
        unlogged = [s for s in due if s.ok and s.id not in by_id]
        served = 0
        worker = proc = span = 0.0
        lat = []
        for seg in ph.segments:
            a, b = seg.a.t, seg.b.t
            served += sum(1 for line in by_server.get(seg.pod, []) if a <= line.accept < b)
            worker += seg.b.worker_ns - seg.a.worker_ns
            proc += seg.b.proc_ns - seg.a.proc_ns
            span += b - a
            lat += [s.latency for s in shots_by_server.get(seg.pod, [])
                    if a <= s.due < b and s.ok and not s.id.startswith("ctl")]  # not the control's slow ones
        after_closed = 0
        for d in ph.drained:
            closed = d.get("closed_at")
            after_closed += sum(1 for line in by_server.get(d["pod"], []) if closed and line.accept > closed)
        dur = ph.end - ph.start
        out.append({
            "n": n, "round": ph.round, "phase": ph.name, "start": ph.start, "seconds": round(dur, 3),
            "rate_req_s": round(len(due) / dur, 1) if dur else 0.0,
            "others": sorted({seg.pod for seg in ph.segments}),
            "others_served": served,
            "others_req_s_per_gw": round(served / span, 1) if span else None,
            "others_p50_ms": _ms(_p(lat, 0.50)), "others_p99_ms": _ms(_p(lat, 0.99)),
            "others_worker_us_per_req": round(worker / 1000 / served, 1) if served else None,
            "others_proc_us_per_req": round(proc / 1000 / served, 1) if served else None,
            "others_worker_core_pct": round(100 * worker / 1e9 / span, 2) if span else None,
            "others_proc_core_pct": round(100 * proc / 1e9 / span, 2) if span else None,
            "lost": len(lost), "haproxy_not_ok": len(bad_log), "unlogged": len(unlogged),
            "after_closed": after_closed, "drained": ph.drained,
            "lost_examples": [asdict(s) for s in lost[:5]],
        })
    return {"n": n, "rate": rate, "sent": len(shots), "phases": out}


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 2)


# -- the report -------------------------------------------------------------------------------

METRICS = ("rate_req_s", "others_req_s_per_gw", "others_p99_ms", "others_worker_us_per_req", "others_proc_us_per_req",
           "others_worker_core_pct")


def summarize(results: list[dict]) -> list[dict]:
    """Per N and phase: the median over rounds of each metric, and of its ratio to the same round's
    `before`; losses summed over rounds."""
    rows = []
    for res in results:
        phases = res["phases"]
        before = {p["round"]: p for p in phases if p["phase"] == "before"}
        for name in dict.fromkeys(p["phase"] for p in phases):
            ps = [p for p in phases if p["phase"] == name]
            row = {"n": res["n"], "phase": name, "rounds": len(ps)}
            for m in METRICS:
                vals = [p[m] for p in ps if p[m] is not None]
                row[m] = round(statistics.median(vals), 2) if vals else None
                ratios = [p[m] / before[p["round"]][m] for p in ps
                          if p[m] is not None and p["round"] in before and before[p["round"]][m]]
                row[m + "_ratio"] = round(statistics.median(ratios), 2) if ratios else None
            for k in ("lost", "haproxy_not_ok", "unlogged", "after_closed"):
                row[k] = sum(p[k] for p in ps)
            row["share"] = f"1/{res['n'] - (name != 'before')}"
            rows.append(row)
    return rows


def _cell(v, ratio=None) -> str:
    if v is None:
        return "-"
    return f"{v:g}" if ratio is None else f"{v:g} ({ratio:.2f}×)"


def table(rows: list[dict]) -> str:
    lines = ["| N | phase | each other's share | total req/s | req/s per other gateway (× before) "
             "| others' p99 ms (× before) "
             "| others' worker CPU µs/req (× before) | others' Envoy CPU µs/req | % of a core per other "
             "gateway, worker (× before) | lost (client / HAProxy log / after CLOSED) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        before = r["phase"] == "before"
        ratio = (lambda m: None) if before else (lambda m: r[m + "_ratio"])
        lines.append(
            f"| {r['n']} | {r['phase'] + (' (control)' if r['phase'] == CONTROL else '')} | {r['share']} | {_cell(r['rate_req_s'])} | "
            f"{_cell(r['others_req_s_per_gw'], ratio('others_req_s_per_gw'))} | "
            f"{_cell(r['others_p99_ms'], ratio('others_p99_ms'))} | "
            f"{_cell(r['others_worker_us_per_req'], ratio('others_worker_us_per_req'))} | "
            f"{_cell(r['others_proc_us_per_req'])} | "
            f"{_cell(r['others_worker_core_pct'], ratio('others_worker_core_pct'))} | "
            f"{r['lost']} / {r['haproxy_not_ok']} / {r['after_closed']} |")
    return "\n".join(lines)


def failures(results: list[dict]) -> list[str]:
    """What makes `make replicas` fail: a lost request, a non-200 in HAProxy's log, a request
    served by a drained gateway after its CLOSED, a drain that did not end CLOSED, more answered
    requests missing from HAProxy's log than the lines it says it dropped, a phase
    in which the others served nothing or have no p99 / CPU figure."""
    bad = []
    for res in results:
        unlogged = sum(p["unlogged"] for p in res["phases"])
        if unlogged > res.get("haproxy_dropped_logs", 0):
            bad.append(f"N={res['n']}: {unlogged} answered requests missing from HAProxy's log, "
                       f"more than the {res.get('haproxy_dropped_logs', 0)} lines it dropped")
        for p in res["phases"]:
            where = f"N={res['n']} round {p['round']} {p['phase']}"
            if p["phase"] == CONTROL:
                if not (p["lost"] and p["haproxy_not_ok"]):
                    bad.append(f"{where}: the control lost nothing (client {p['lost']}, HAProxy {p['haproxy_not_ok']})")
                continue
            for k in ("lost", "haproxy_not_ok", "after_closed"):
                if p[k]:
                    bad.append(f"{where}: {k} {p[k]} {p['lost_examples'][:2]}")
            for d in p["drained"]:
                if not str(d.get("prestop", "")).startswith("200 CLOSED"):
                    bad.append(f"{where}: {d['pod']} preStop {d.get('prestop')!r}")
            if not p["others_served"] or not p["others_p99_ms"] or not p["others_worker_us_per_req"]:
                bad.append(f"{where}: no measurement of the others ({p['others_served']} served)")
    return bad


def write(results: list[dict], out: Path, meta: dict) -> list[dict]:
    rows = summarize(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({**meta, "summary": rows, "runs": results}, indent=1))
    head = (f"{meta['date']}, `{meta['command']}`: total {meta['rate']:g} req/s open loop, phases of "
            f"{meta['seconds']:g} s, {meta['rounds']} rounds interleaved (medians; × before: the median of "
            f"each round's ratio to its own before), HAProxy inter {INTER} rise 2 fall 2, {STRATEGY}.\n\n")
    unlogged = ", ".join(f"N={res['n']}: {sum(p['unlogged'] for p in res['phases'])} answered requests not in "
                         f"HAProxy's log, {res.get('haproxy_dropped_logs', 0)} lines it dropped"
                         for res in results)
    (out / "results.md").write_text(head + table(rows) + f"\n\n{unlogged}.\n")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="2,4,8", help="fleet sizes, comma-separated")
    ap.add_argument("--rate", type=float, default=400, help="total requests per second, every N")
    ap.add_argument("--seconds", type=float, default=20, help="length of the before and drain phases")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    phases = tuple(args.phases.split(","))
    run_dir = args.out.resolve() / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "rate": args.rate, "seconds": args.seconds,
            "rounds": args.rounds, "phases": phases, "inter": INTER, "strategy": STRATEGY,
            "command": "make replicas"}
    results = []
    t0 = time.monotonic()
    for n in (int(x) for x in args.n.split(",")):
        results.append(measure(n, rate=args.rate, seconds=args.seconds, rounds=args.rounds, phases=phases,
                               workdir=run_dir / f"n{n}"))
        rows = write(results, args.out, {**meta, "elapsed_s": round(time.monotonic() - t0, 1)})
    print(table(rows))
    bad = failures(results)
    print("\n".join(f"FAIL: {b}" for b in bad) or "0 lost in every phase at every N")
    return 1 if bad else 0


if __name__ == "__main__":
    stop_on_signals()  # Ctrl-C and SIGTERM stop what the run started, in a background job too
    raise SystemExit(main())
