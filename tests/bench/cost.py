"""`make cost`: wasm instructions and host calls per stream, for every path, counted on the shipped module.

The shipped `target/drain_gate.wasm` (after wasm-opt, as Envoy loads it) runs in the proxy-wasm host
stand-in of `tests/bench/proxy_host.py`: one Envoy process of `WORKERS` worker VMs and the main thread's VM,
each with the roles of `envoyfilter/envoy.yaml` (traffic and health; the TCP paths add `traffic_tcp`),
sharing one store of shared data and stats. Every path drives the real callbacks in Envoy's order and counts,
per stream (or check, or tick), the wasm instructions executed (wasmtime's fuel: about one unit per operator)
and every host call by its import name (`now()` is two: `proxy_get_current_time_nanoseconds` and WASI
`clock_time_get`). Nothing here measures time: two runs count the same. Beside the paths, the floors they are
compared with: the `open` stream in the no-op filter and in its counting twin, the LB check in a minimal health
answer, each a module built and optimized as the shipped one is.

  python -m tests.bench.cost             writes out/cost.json and prints the table
  python -m tests.bench.cost --baseline  also keeps the run as tests/bench/cost.json and writes its table into
                                         tests/docs/cost.md (`make cost-baseline`)

`tests/bench/test_cost.py` (in `make test`) fails when a path's instructions rise more than 5 % over the kept
baseline or fall more than 20 % under it (work gone missing, or a change to keep with `make cost-baseline`), or
when its host calls differ at all. Every path checks on the host that it did what it is named for (a stream
counted while in flight and given back, the state reached, the answer's status): a path that stopped doing its
work fails, whatever it costs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from tests.bench import readme
from tests.bench.proxy_host import PEER_LOCAL, PEER_REMOTE, Answer, HostError, Meter, Module, Process, Vm

REPO = Path(__file__).resolve().parents[2]
WASM = REPO / "target" / "drain_gate.wasm"
# A minimal proxy-wasm health answer, built the way the shipped module is (tests/bench/health_twin).
HEALTH_TWIN_WASM = REPO / "target" / "health_twin.wasm"
# The no-op filter (tests/bench/noop) and its counting twin (tests/bench/twin), optimized as the shipped module is
# (`make noop`).
NOOP_WASM = REPO / "target" / "noop_filter.wasm"
TWIN_WASM = REPO / "target" / "twin_filter.wasm"
OUT = REPO / "out" / "cost.json"
BASELINE = REPO / "tests" / "bench" / "cost.json"
CALIBRATION = REPO / "tests" / "bench" / "cost-calibration.json"
README = REPO / "tests" / "docs" / "cost.md"
BEGIN = "<!-- cost table: written by `make cost-baseline` from tests/bench/cost.json, never by hand -->"
END = "<!-- end of cost table -->"

WORKERS = 2
# Streams (checks, connections) measured per worker and path, one after another, between two ticks.
STREAMS = 32
TICK_MS = 100
TICKS = 4  # tick rounds measured for a tick path
ADMIN_CLUSTER = "drain_gate_envoy_admin"
# A stream the downstream reset before its response (Envoy's DownstreamConnectionTermination).
DOWNSTREAM_RESET = 0x4000
# A path's instructions may rise 5 % over the baseline, and fall 20 % under it: more is a cost to look at, less
# is work that went missing unless the change was meant (then `make cost-baseline` keeps it).
INSTRUCTIONS_TOLERANCE = 0.05
CHEAPER_TOLERANCE = 0.20
# Where the module keeps each part of its count (src/metric_names.rs, src/host/keys.rs): the part's gauge, or
# its shared-data key where the gauge is not live.
COUNTS = {"streams": ("drain_gate_active_requests", b"drain_gate.active.v1"),
          "connections": ("drain_gate_active_connections", b"drain_gate.active_connections.v1")}
# src/gate/count/mod.rs's LEASE: outside a drain a root context adds to the count this many at a time.
LEASE = 8

# What each path is, as the table says it.
PATHS = {
    "open": ("stream", "an HTTP stream in OPEN: request headers, response headers, the body's end, done, log, delete"),
    "draining": ("stream", "the same stream while DRAINING, one long stream held on each worker: counted exactly, "
                           "its end sorted for the receipt"),
    "ends_drain": ("stream", "the stream whose end brings the count to 0 and flips DRAINING → CLOSING"),
    "held": ("stream", "the same stream in a drain `min_drain` holds open, nothing else in flight: each end "
                       "brings the worker's count to 0"),
    "refusing": ("stream", "a new request while DRAINING with `draining_new_requests: refuse`: answered 503, "
                           "the answer's headers and body, done, log, delete"),
    "cut": ("stream", "a stream of a drain the downstream resets before its response: its flags read, the cut "
                      "counted and checked against the LB's DOWN"),
    "tcp_open": ("connection", "a `traffic_tcp` connection in OPEN: data both ways, the client's FIN, the "
                               "upstream's, both closes, done, log, delete"),
    "tcp_draining": ("connection", "the same connection while DRAINING, one long connection held on each worker"),
    "lb_check": ("check", "`GET /health_check.html` on the health role in OPEN, from the LB's address"),
    "status": ("check", "`GET /drain/status` on the health role in OPEN"),
    "tick_1": ("tick", "one tick of the traffic and the health role on one worker, 1 stream in flight on each"),
    "tick_8": ("tick", "the same with 8 streams in flight on each worker"),
    "tick_64": ("tick", "the same with 64 streams in flight on each worker"),
    "tick_ended": ("tick", "one tick of both roles on one worker that ended 32 streams since its last: their "
                           "durations added to the process's and to the bucket counters"),
}
# The floors beside the paths: the same stream (check) in another module, each built and optimized as the shipped
# one is. Per row: the path it is the floor of, what one is, what it is, the module and the `make` target building it.
BASELINES = {
    "open_noop": ("open", "stream", "the same stream in the no-op filter (tests/bench/noop): every callback returns "
                                    "at once, the SDK's dispatch alone", NOOP_WASM, "noop"),
    "open_twin": ("open", "stream", "the same stream in the counting twin (tests/bench/twin): the no-op plus "
                                    "drain-gate's per-stream structure, a boxed stream context holding an `Rc` to its "
                                    "root's state and an in-VM count raised at its creation and lowered at its "
                                    "drop, no host call", TWIN_WASM, "noop"),
    "lb_check_twin": ("lb_check", "check", "the minimal health answer (tests/bench/health_twin): reads `:path`, "
                                           "answers 200 with a 3-byte body", HEALTH_TWIN_WASM, "health-twin"),
}
# `open`'s goal over its counting twin, in instructions per stream.
OPEN_OVER_TWIN = 1.15


class Profile:
    """With `--profile PATH`: the meters of that path, whose timelines are printed."""
    on = False
    meters: list[Meter] = []


PROFILE = Profile()


class PathError(AssertionError):
    """A path did not do what it is named for: its numbers would mean nothing."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise PathError(what)


class Gateway:
    """One Envoy in the stand-in: the main thread's VM and `workers` worker VMs, each with `roles`."""

    def __init__(self, module: Module, config: dict | None = None, roles=("traffic", "health"),
                 workers: int | None = None):
        workers = WORKERS if workers is None else workers
        self.p = Process(clusters=(ADMIN_CLUSTER,))
        self.roles = roles
        plugins = {r: json.dumps({**(config or {}), "role": r}).encode() for r in roles}
        # Envoy configures every plugin on the main thread first (its root never ticks), then on each worker.
        self.main = Vm(self.p, module, "main")
        for role, conf in plugins.items():
            self.main.start(role, conf)
        self.workers = [Vm(self.p, module, f"worker{i}") for i in range(workers)]
        for w in self.workers:
            for role, conf in plugins.items():
                w.start(role, conf)
        self.tick_rounds(2)

    def tick_rounds(self, n: int = 1) -> None:
        """`n` ticks of every root on every worker, `TICK_MS` apart; the admin API answers every call."""
        for _ in range(n):
            self.p.advance(TICK_MS)
            for w in self.workers:
                for role in self.roles:
                    w.tick(role)
            while self.p.calls:
                call = self.p.calls.pop(0)
                call.vm.answer_call(call, 200)

    @contextmanager
    def metered(self):
        """Counts what every callback makes while open; no error may be logged meanwhile."""
        meter, logs = Meter(timeline=PROFILE.on), len(self.p.logs)
        if PROFILE.on:
            PROFILE.meters.append(meter)
        self.p.meter = meter
        try:
            yield meter
        finally:
            self.p.meter = None
        errors = [m for level, m in self.p.logs[logs:] if level >= 4]
        expect(not errors, f"errors logged: {errors}")

    # -- the health role ---------------------------------------------------------------------------
    def ask(self, w: Vm, method: str, path: str) -> Answer:
        """One request of the health listener, answered locally, and its end."""
        c = w.http("health", [(":method", method), (":path", path), (":authority", "gateway:18180"),
                              ("user-agent", "cost")])
        expect(w.request_headers(c) == 1, f"{method} {path}: the health role forwarded it")
        expect(len(c.answers) == 1, f"{method} {path}: {len(c.answers)} answers")
        a = c.answers[0]
        w.response_headers(c, False, [(":status", str(a.status))])
        w.response_body(c, len(a.body), True)
        w.end(c)
        return a

    def status(self) -> dict:
        a = self.ask(self.workers[0], "GET", "/drain/status")
        expect(a.status == 200, f"/drain/status answered {a.status}")
        return json.loads(a.body)

    def post(self, path: str) -> dict:
        a = self.ask(self.workers[0], "POST", path)
        expect(a.status == 200, f"POST {path} answered {a.status}: {a.body[:200]!r}")
        return json.loads(a.body)

    def state(self) -> str:
        return self.status()["state"]

    # -- the count, read off the host ------------------------------------------------------------------
    def counted(self, part: str = "streams") -> int:
        """The part's count across the process as the module keeps it: its gauge plus its shared-data key
        (one of them is 0). Read off the stand-in, not through the module: no host call, nothing metered."""
        gauge, key = COUNTS[part]
        stat = self.p.stats.get(gauge.encode())
        shared = self.p.shared.get(key)
        return (stat.value if stat else 0) + (int.from_bytes(shared[0], "little") if shared else 0)

    def counting(self, part: str, start, finish, exact: int | None = None):
        """`fn(worker)`: one stream (connection) from `start` to `finish`, checking that the module counted it
        while in flight: the count at least 1 (outside a drain the lease leads the truth), or exactly `exact`
        + 1 where the count is exact (in a drain, `exact` streams held)."""
        def one(w: Vm) -> None:
            c = start(w)
            got = self.counted(part)
            if exact is None:
                expect(got >= 1, f"a {part[:-1]} in flight, the count reads {got}: not counted")
            else:
                expect(got == exact + 1, f"{exact} held and one more {part[:-1]} in flight, the count reads {got}")
            finish(w, c)
        return one

    def given_back(self, part: str, start, finish) -> None:
        """After a path's metered streams: more than two leases of streams in flight on every worker raise the
        count to at least as many, and their ends and a tick bring it back to 0 — the count follows the
        streams, not just the first of a lease."""
        n = 2 * LEASE + 1
        held = [(w, start(w)) for w in self.workers for _ in range(n)]
        got = self.counted(part)
        expect(got >= len(held), f"{len(held)} {part} in flight, the count reads {got}: not every one counted")
        for w, c in held:
            finish(w, c)
        self.tick_rounds()
        got = self.counted(part)
        expect(got == 0, f"every {part[:-1]} ended and a tick passed, the count still reads {got}: not given back")

    # -- the traffic roles -------------------------------------------------------------------------
    def start_stream(self, w: Vm):
        c = w.http("traffic", [(":method", "GET"), (":path", "/"), (":authority", "gateway"),
                               ("user-agent", "cost")])
        expect(w.request_headers(c) == 0, "a stream was not forwarded")
        return c

    @staticmethod
    def finish(w: Vm, c) -> None:
        w.response_headers(c, False)
        w.response_body(c, 3, True)
        w.end(c)

    def stream(self, w: Vm) -> None:
        self.finish(w, self.start_stream(w))

    def start_connection(self, w: Vm):
        c = w.connection("traffic_tcp")
        w.downstream_data(c, 512, False)
        w.upstream_data(c, 1024, False)
        return c

    @staticmethod
    def close(w: Vm, c) -> None:
        w.downstream_data(c, 0, True)
        w.upstream_data(c, 0, True)
        w.upstream_close(c, PEER_REMOTE)
        w.downstream_close(c, PEER_LOCAL)
        w.end(c)

    def each(self, fn) -> int:
        """`fn(worker)` `STREAMS` times on every worker, in turn; how many ran."""
        for _ in range(STREAMS):
            for w in self.workers:
                fn(w)
        return STREAMS * len(self.workers)


def result(meter: Meter, n: int) -> dict:
    return {
        "instructions": round(meter.fuel / n, 1),
        "host_calls": round(meter.host_calls / n, 3),
        "by_call": {k: round(v / n, 3) for k, v in sorted(meter.calls.items())},
        "n": n,
    }


# -- the paths ---------------------------------------------------------------------------------------

def path_open(module: Module, roles=("traffic", "health"), workers: int | None = None, counts: bool = True) -> dict:
    """`counts=False`: a module that counts no stream (the calibration's no-op, twin and bisection builds)."""
    g = Gateway(module, roles=roles, workers=workers)
    stream = g.counting("streams", g.start_stream, g.finish) if counts else g.stream
    g.each(stream)  # warm: every root has counted a stream and ticked since
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(stream)
    if counts:
        g.tick_rounds()
        expect(g.counted() == 0, f"the streams ended and a tick passed, the count reads {g.counted()}")
        g.given_back("streams", g.start_stream, g.finish)
    if "health" in roles:
        expect(g.state() == "OPEN", "not OPEN")
    return result(m, n)


def _draining(module: Module, config: dict | None = None, roles=("traffic", "health"), tcp: bool = False,
              workers: int | None = None):
    """A gateway DRAINING that stays so: one long stream (or connection) held on each worker."""
    g = Gateway(module, {"drain_timeout": "60m", "lb_buffer": "60m", **(config or {})}, roles, workers)
    held = [(w, g.start_connection(w) if tcp else g.start_stream(w)) for w in g.workers]
    g.post("/drain")
    g.tick_rounds()
    expect(g.state() == "DRAINING", "not DRAINING")
    return g, held


def path_draining(module: Module, config: dict | None = None, workers: int | None = None) -> dict:
    g, held = _draining(module, config, workers=workers)
    stream = g.counting("streams", g.start_stream, g.finish, exact=len(held))
    g.each(stream)
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(stream)
    expect(g.counted() == len(held), f"{len(held)} streams held, the count reads {g.counted()}")
    st = g.status()
    expect(st["state"] == "DRAINING" and st["active"] == len(held), f"the count is not exact: {st['active']}")
    return result(m, n)


def path_ends_drain(module: Module) -> dict:
    g, held = _draining(module)
    w = g.workers[0]
    with g.metered() as m:
        last = g.start_stream(w)
    for hw, c in held:
        g.finish(hw, c)
    expect(g.state() == "DRAINING", "flipped before the last stream ended")
    with g.metered() as m2:
        g.finish(w, last)
    expect(g.state() == "CLOSING", "the last stream's end did not flip")
    m.fuel += m2.fuel
    m.calls.update(m2.calls)
    return result(m, 1)


def path_held(module: Module, workers: int | None = None) -> dict:
    g = Gateway(module, {"min_drain": "60m", "drain_timeout": "60m", "lb_buffer": "60m"}, workers=workers)
    g.post("/drain")
    g.tick_rounds()
    stream = g.counting("streams", g.start_stream, g.finish)
    g.each(stream)
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(stream)
    g.tick_rounds()
    expect(g.counted() == 0, f"the streams ended and a tick passed, the count reads {g.counted()}")
    g.given_back("streams", g.start_stream, g.finish)
    expect(g.state() == "DRAINING", "min_drain did not hold the drain")
    return result(m, n)


def path_refusing(module: Module) -> dict:
    g, _ = _draining(module, {"draining_new_requests": "refuse"})

    def refused(w: Vm) -> None:
        c = w.http("traffic", [(":method", "GET"), (":path", "/"), (":authority", "gateway")])
        expect(w.request_headers(c) == 1 and [a.status for a in c.answers] == [503], "not refused")
        a = c.answers[0]
        w.response_headers(c, False, [(":status", "503")])
        w.response_body(c, len(a.body), True)
        w.end(c)

    g.each(refused)
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(refused)
    expect(g.status()["refusing"]["this_drain"] == 2 * n, "refusals not counted")
    return result(m, n)


def path_cut(module: Module) -> dict:
    g, _ = _draining(module)

    def cut(w: Vm) -> None:
        c = g.start_stream(w)
        c.properties["response.flags"] = DOWNSTREAM_RESET.to_bytes(8, "little")
        w.end(c)

    g.each(cut)
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(cut)
    expect(g.status()["cut"] == 2 * n, "cuts not counted")
    return result(m, n)


TCP_ROLES = ("traffic", "traffic_tcp", "health")


def path_tcp_open(module: Module) -> dict:
    g = Gateway(module, roles=TCP_ROLES)
    conn = g.counting("connections", g.start_connection, g.close)
    g.each(conn)
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(conn)
    g.tick_rounds()
    expect(g.counted("connections") == 0, f"the connections ended, the count reads {g.counted('connections')}")
    g.given_back("connections", g.start_connection, g.close)
    expect(g.state() == "OPEN", "not OPEN")
    return result(m, n)


def path_tcp_draining(module: Module) -> dict:
    g, held = _draining(module, roles=TCP_ROLES, tcp=True)
    conn = g.counting("connections", g.start_connection, g.close, exact=len(held))
    g.each(conn)
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(conn)
    g.tick_rounds()  # what completed is counted at the tick
    st = g.status()
    expect(st["state"] == "DRAINING" and st["active"] == len(held), f"the count is not exact: {st['active']}")
    expect(st["receipt"]["completed"] == 2 * n, f"ends not sorted: {st['receipt']}")
    return result(m, n)


def _checks(module: Module, path: str, want: int, roles=("traffic", "health"), plugin_check=None) -> dict:
    g = Gateway(module, roles=roles)
    ask = lambda w: expect(g.ask(w, "GET", path).status == want, f"{path} did not answer {want}")
    g.each(ask)
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(ask)
    return result(m, n)


def path_lb_check(module: Module) -> dict:
    return _checks(module, "/health_check.html", 200)


def path_status(module: Module) -> dict:
    return _checks(module, "/drain/status", 200)


def path_tick(module: Module, streams: int) -> dict:
    g = Gateway(module)
    # The streams in flight started over the last 8 ticks, so the ages book holds several starts.
    for i in range(streams):
        for w in g.workers:
            g.start_stream(w)
        if i % max(1, streams // 8) == 0:
            g.tick_rounds()
    g.tick_rounds(2)
    with g.metered() as m:
        g.tick_rounds(TICKS)
    expect(g.status()["active"] == streams * len(g.workers), "the streams are not in flight")
    return result(m, TICKS * len(g.workers))


def path_tick_ended(module: Module) -> dict:
    g = Gateway(module)
    g.each(g.stream)
    g.tick_rounds(2)
    with g.metered() as m:
        for _ in range(TICKS):
            g.p.meter = None  # the streams are the open path's; only the tick after them is metered
            g.each(g.stream)
            g.p.meter = m
            g.tick_rounds()
    ended = STREAMS * len(g.workers) * (TICKS + 1)
    expect(g.status()["durations"]["http"]["count"] == ended, "the streams' durations were not added up")
    return result(m, TICKS * len(g.workers))


def twin_lb_check(module: Module) -> dict:
    return _checks(module, "/health_check.html", 200, roles=("health",))


# The callbacks of `open`'s stream: a module that does not export one is skipped there (as Envoy skips it).
OPEN_CALLBACKS = ("proxy_on_context_create", "proxy_on_request_headers", "proxy_on_response_headers",
                  "proxy_on_response_body", "proxy_on_done", "proxy_on_log", "proxy_on_delete")


def floor_open(module: Module) -> dict:
    """`open`'s stream in a floor (the no-op filter, the counting twin): the same process, roles, callbacks and
    streams. Neither module counts anything the host can see (the twin's count is a variable in its own memory,
    read by no host call), so what is checked is what the host sees: every callback exported, the headers and
    the body let through, no error logged."""
    missing = [cb for cb in OPEN_CALLBACKS if cb not in module.exports]
    expect(not missing, f"{module.path.name} does not export {', '.join(missing)}: the stream skips it")
    g = Gateway(module)

    def stream(w: Vm) -> None:
        c = g.start_stream(w)
        expect(w.response_headers(c, False) == 0, "the response headers were not let through")
        expect(w.response_body(c, 3, True) == 0, "the response body was not let through")
        w.end(c)

    g.each(stream)
    g.tick_rounds()
    with g.metered() as m:
        n = g.each(stream)
    return result(m, n)


def measure_baselines(wasms: dict[str, Path]) -> dict:
    """The floors of `BASELINES` whose module is in `wasms` (name → module), each checked; the counting twin,
    when both open floors are counted, must cost more than the no-op (its structure ran)."""
    runs = {"open_noop": floor_open, "open_twin": floor_open, "lb_check_twin": twin_lb_check}
    rows = {}
    for name, wasm in wasms.items():
        try:
            rows[name] = {"per": BASELINES[name][1], **runs[name](Module(wasm))}
        except (PathError, HostError) as e:
            raise PathError(f"floor {name}: {e}") from e
    if "open_noop" in rows and "open_twin" in rows:
        noop, twin = rows["open_noop"]["instructions"], rows["open_twin"]["instructions"]
        expect(twin > noop, f"open_twin costs {twin:,.1f} instructions, the no-op {noop:,.1f}: the twin's "
                            f"per-stream structure did not run")
    return rows


def measure(wasm: Path = WASM, baselines: dict[str, Path] | None = None) -> dict:
    """Every path on `wasm`, and the floors of `baselines` (by default every one of `BASELINES` that is built)."""
    module = Module(wasm)
    runs = {
        "open": path_open, "draining": path_draining, "ends_drain": path_ends_drain, "held": path_held,
        "refusing": path_refusing, "cut": path_cut, "tcp_open": path_tcp_open, "tcp_draining": path_tcp_draining,
        "lb_check": path_lb_check, "status": path_status,
        "tick_1": lambda m: path_tick(m, 1), "tick_8": lambda m: path_tick(m, 8),
        "tick_64": lambda m: path_tick(m, 64), "tick_ended": path_tick_ended,
    }
    paths = {}
    for name, run in runs.items():
        try:
            paths[name] = {"per": PATHS[name][0], **run(module)}
        except (PathError, HostError) as e:
            raise PathError(f"path {name}: {e}") from e
    if baselines is None:
        baselines = {name: b[3] for name, b in BASELINES.items() if b[3].exists()}
    res = {"meta": meta(wasm), "paths": paths, "baselines": measure_baselines(baselines)}
    res["goals"] = goals(res)
    return res


def meta(wasm: Path) -> dict:
    data = wasm.read_bytes()
    return {
        "module": str(wasm.relative_to(REPO)) if wasm.is_relative_to(REPO) else str(wasm),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest()[:16],
        "wasmtime": metadata.version("wasmtime"),
        "workers": WORKERS,
        "streams_per_worker": STREAMS,
        "tick_ms": TICK_MS,
    }


def goals(res: dict) -> list[dict]:
    p = res["paths"]
    out = []

    def goal(what: str, measured: str, met: bool, miss: str = "") -> None:
        out.append({"goal": what, "measured": measured, "met": met, **({"miss": miss} if not met else {})})

    o, h, d = p["open"], p["held"], p["draining"]
    r = h["instructions"] / o["instructions"]
    goal("held ≤ 1.05 × open instructions", f"{r:.3f} ×", r <= 1.05,
         f"+{h['instructions'] - 1.05 * o['instructions']:.0f} instructions per stream over the goal")
    dh = h["host_calls"] - o["host_calls"]
    goal("held ≤ open + 0.2 host calls per stream", f"{dh:+.3f}", dh <= 0.2 + 1e-9,
         f"{dh - 0.2:+.3f} host calls per stream over the goal")
    r = d["instructions"] / o["instructions"]
    goal("draining ≤ 1.10 × open instructions", f"{r:.3f} ×", r <= 1.10,
         f"+{d['instructions'] - 1.10 * o['instructions']:.0f} instructions per stream over the goal")
    twin = res["baselines"].get("open_twin")
    if twin:
        r = o["instructions"] / twin["instructions"]
        goal(f"open ≤ {OPEN_OVER_TWIN:.2f} × the counting twin's open instructions", f"{r:.3f} ×",
             r <= OPEN_OVER_TWIN,
             f"+{o['instructions'] - OPEN_OVER_TWIN * twin['instructions']:,.0f} instructions per stream over the goal")
    twin = res["baselines"].get("lb_check_twin")
    if twin:
        lb = p["lb_check"]
        r = lb["instructions"] / twin["instructions"]
        over = {"instructions": lb["instructions"] - 1.2 * twin["instructions"],
                "by_call": {k: v - twin["by_call"].get(k, 0) for k, v in lb["by_call"].items()}}
        cal = calibration()
        us = f" ({us_range(over, cal)} µs by the calibration)" if cal else ""
        goal("lb_check ≤ 1.2 × the minimal health answer's instructions", f"{r:.2f} ×", r <= 1.2,
             f"+{over['instructions']:,.0f} instructions and {lb['host_calls'] - twin['host_calls']:+g} host "
             f"calls per check over the goal{us}")
    return out


# -- calibration, report ------------------------------------------------------------------------------

def calibration() -> dict | None:
    return json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else None


def estimate_us(row: dict, cal: dict) -> tuple[float, float]:
    """The µs `row` costs on the bench's Envoy, as the calibration can bound it (tests/bench/cost-calibration.json):
    its instructions and host calls at the low ends of the calibration's two 95 % intervals, and at their high
    ends; never below 0. Where an interval includes 0 the calibration cannot tell the row from nothing, and the
    low end is 0: no point estimate is given, only the range."""
    calls = sum(row["by_call"].values())
    ends = [row["instructions"] * i + calls * h
            for i in cal["ns_per_instruction_ci95"] for h in cal["ns_per_host_call_ci95"]]
    return max(0.0, min(ends) / 1000), max(0.0, max(ends) / 1000)


def two_figures(x: float) -> str:
    """`x` to two significant figures, with thousands separators: 6.09 → 6.1, 669.4 → 670."""
    if x == 0:
        return "0"
    digits = 1 - math.floor(math.log10(abs(x)))
    return f"{round(x, digits):,.{max(0, digits)}f}"


def us_range(row: dict, cal: dict) -> str:
    lo, hi = estimate_us(row, cal)
    return f"{two_figures(lo)}–{two_figures(hi)}"


def table(res: dict) -> str:
    cal = calibration()
    m = res["meta"]
    lines = [f"`{m['module']}` ({m['bytes']:,} bytes, sha256 {m['sha256']}…), wasmtime {m['wasmtime']}, "
             f"{m['workers']} worker VMs and the main thread's, {m['streams_per_worker']} streams per worker and "
             f"path, ticks {m['tick_ms']} ms apart.", ""]
    head = "| path | per | wasm instructions | host calls | µs, the calibration's range | host calls by name |"
    lines += [head, "|---|---|---|---|---|---|"]
    floors = {path: [(k, v) for k, v in res["baselines"].items() if BASELINES[k][0] == path] for path in PATHS}
    rows = [r for name, row in res["paths"].items() for r in [(name, row), *floors.get(name, [])]]
    for name, row in rows:
        calls = ", ".join(f"{k.removeprefix('proxy_')} {v:g}" for k, v in row["by_call"].items()) or "–"
        us = us_range(row, cal) if cal else "–"
        lines.append(f"| `{name}` | {row['per']} | {row['instructions']:,.0f} | {row['host_calls']:g} | {us} | "
                     f"{calls} |")
    lines += ["", "| path | what one stream (check, connection, tick) of it is |", "|---|---|"]
    lines += [f"| `{name}` | {PATHS[name][1] if name in PATHS else BASELINES[name][2]} |" for name, _ in rows]
    lines += ["", "| goal | measured | met |", "|---|---|---|"]
    for g in res["goals"]:
        met = "yes" if g["met"] else f"**no**: {g['miss']}"
        lines.append(f"| {g['goal']} | {g['measured']} | {met} |")
    lines += over_floors(res, cal)
    if cal:
        lines += ["", f"µs: the module's part of a stream's worker CPU (its instructions and host calls, not "
                      f"Envoy's dispatch into the VM) as the calibration bounds it: the counts at the low ends of "
                      f"its two 95 % intervals and at their high ends, never below 0 (an interval that includes "
                      f"0 cannot tell a path from nothing, so no point estimate is given); {cal['summary']}"]
    return "\n".join(lines)


def over(a: dict, b: dict) -> dict:
    """What row `a` costs over row `b`."""
    return {"instructions": a["instructions"] - b["instructions"], "host_calls": a["host_calls"] - b["host_calls"],
            "by_call": {k: a["by_call"].get(k, 0) - b["by_call"].get(k, 0) for k in set(a["by_call"]) | set(b["by_call"])}}


def over_floors(res: dict, cal: dict | None) -> list[str]:
    """What drain-gate's `open` costs a stream over its floors, as table lines (none without both floors)."""
    o, b = res["paths"]["open"], res["baselines"]
    if "open_noop" not in b or "open_twin" not in b:
        return []
    noop, twin = b["open_noop"], b["open_twin"]
    rows = [("`open` − `open_noop`: what drain-gate does for a stream beyond being a filter", over(o, noop)),
            ("`open_twin` − `open_noop`: of that, the per-stream structure alone (the twin's)", over(twin, noop)),
            ("`open` − `open_twin`: of that, drain-gate's own work", over(o, twin))]
    lines = ["", "| `open` over its floors, per stream | wasm instructions | host calls | µs, the calibration's range |",
             "|---|---|---|---|"]
    for what, d in rows:
        us = us_range(d, cal) if cal else "–"
        lines.append(f"| {what} | {d['instructions']:+,.0f} | {d['host_calls']:+g} | {us} |")
    return lines


def readme_block(text: str) -> str | None:
    return readme.block(text, BEGIN, END)


def write_readme(res: dict) -> None:
    readme.write(README, BEGIN, END, table(res))


def dump(res: dict) -> str:
    return json.dumps(res, indent=2, ensure_ascii=False) + "\n"


def compare(base: dict, now: dict) -> list[str]:
    """What moved: instructions over `INSTRUCTIONS_TOLERANCE` or under `CHEAPER_TOLERANCE`, any host call (total
    or by name, more or fewer). The floors beside the paths (`BASELINES`) are compared where `now` has them."""
    problems = []
    rows = [(name, b, now["paths"].get(name)) for name, b in base["paths"].items()]
    rows += [(name, b, now.get("baselines", {})[name]) for name, b in base.get("baselines", {}).items()
             if name in now.get("baselines", {})]
    for name, b, n in rows:
        if n is None:
            problems.append(f"{name}: no longer measured")
            continue
        change = n["instructions"] / b["instructions"] - 1
        if change > INSTRUCTIONS_TOLERANCE:
            problems.append(f"{name}: instructions {b['instructions']:,.1f} → {n['instructions']:,.1f} "
                            f"({change:+.1%}, over +{INSTRUCTIONS_TOLERANCE * 100:.0f} %)")
        if change < -CHEAPER_TOLERANCE:
            problems.append(f"{name}: instructions {b['instructions']:,.1f} → {n['instructions']:,.1f} "
                            f"({change:+.1%}, under -{CHEAPER_TOLERANCE * 100:.0f} %: work gone missing, or a change to "
                            f"keep with `make cost-baseline`)")
        if abs(n["host_calls"] - b["host_calls"]) > 1e-9:
            fewer = " (fewer: a call no longer made, or a change to keep with `make cost-baseline`)" \
                if n["host_calls"] < b["host_calls"] else ""
            problems.append(f"{name}: host calls {b['host_calls']:g} → {n['host_calls']:g}{fewer}")
        for call in sorted(set(b["by_call"]) | set(n["by_call"])):
            was, got = b["by_call"].get(call, 0), n["by_call"].get(call, 0)
            if abs(got - was) > 1e-9:
                problems.append(f"{name}:   {call} {was:g} → {got:g}")
    for name in sorted(set(now["paths"]) - set(base["paths"])) + sorted(
            set(now.get("baselines", {})) - set(base.get("baselines", {}))):
        problems.append(f"{name}: not in the baseline (refresh it: make cost-baseline)")
    return problems


def not_optimized(wasm: Path) -> str | None:
    """Why `wasm` is not the module as the Makefile ships it (after wasm-opt), or None: the build's mark of a
    module copied without wasm-opt, or an export of a callback wasm-opt strips (the Makefile's
    `UNUSED_CALLBACKS`)."""
    if wasm.with_name(wasm.name + ".unoptimized").exists():
        return f"{wasm.name} is cargo's module, copied without wasm-opt ({wasm.name}.unoptimized marks it)"
    line = next(l for l in (REPO / "Makefile").read_text().splitlines() if l.startswith("UNUSED_CALLBACKS := "))
    stripped = [c.strip().rstrip("*") for c in line.split(":=", 1)[1].split(",")]
    kept = sorted(e for e in Module(wasm).exports if any(e.startswith(c) for c in stripped))
    if kept:
        more = f" and {len(kept) - 1} more" if len(kept) > 1 else ""
        return (f"{wasm.name} exports {kept[0]}{more} of the callbacks wasm-opt strips (the Makefile's "
                f"UNUSED_CALLBACKS): cargo's module, not the optimized one")
    return None


def profile(wasm: Path, name: str) -> int:
    """Prints one unit of `name`: each event and the instructions since the one before. A floor of `BASELINES`
    runs on its own module, not on `wasm`."""
    runs = {"tick_1": lambda m: path_tick(m, 1), "tick_8": lambda m: path_tick(m, 8),
            "tick_64": lambda m: path_tick(m, 64), "open_noop": floor_open, "open_twin": floor_open,
            "lb_check_twin": twin_lb_check}
    run = runs.get(name) or globals()[f"path_{name}"]
    if name in BASELINES:
        wasm = BASELINES[name][3]
        if not wasm.exists():
            print(f"{wasm.relative_to(REPO)} does not exist: run `make {BASELINES[name][4]}` first", file=sys.stderr)
            return 2
    PROFILE.on, PROFILE.meters = True, []
    try:
        run(Module(wasm))
    finally:
        PROFILE.on = False
    timeline = [e for m in PROFILE.meters for e in m.timeline]
    vm = timeline[0][0].split()[0]
    per = PATHS[name][0] if name in PATHS else BASELINES[name][1]
    ends = 2 if per == "tick" else 1
    end = "< proxy_on_tick" if per == "tick" else "< proxy_on_delete"
    total = 0
    for event, n in timeline:
        if not event.startswith(vm + " "):
            continue
        total += n
        print(f"{n:>9,}  {event}")
        if event.endswith(end):
            ends -= 1
            if ends == 0:
                break
    print(f"{total:>9,}  in all")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", action="store_true",
                    help="keep this run as tests/bench/cost.json and write its table into tests/docs/cost.md")
    ap.add_argument("--wasm", type=Path, default=WASM)
    ap.add_argument("--profile", choices=sorted([*PATHS, *BASELINES]), metavar="PATH",
                    help="print where one stream (check, tick) of PATH spends its instructions: the instructions "
                         "before each host call and callback return, then exit")
    args = ap.parse_args(argv)
    if not args.wasm.exists():
        print(f"{args.wasm} does not exist: run `make build` first", file=sys.stderr)
        return 2
    if args.profile:
        return profile(args.wasm, args.profile)
    res = measure(args.wasm)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(dump(res))
    print(table(res))
    print(f"\nwritten: {OUT.relative_to(REPO)}")
    if args.baseline:
        BASELINE.write_text(dump(res))
        write_readme(res)
        print(f"kept as {BASELINE.relative_to(REPO)}; table written into {README.relative_to(REPO)}")
    elif BASELINE.exists():
        problems = compare(json.loads(BASELINE.read_text()), res)
        print("\nagainst the baseline: " + ("every path within its bounds" if not problems
                                            else "\n  " + "\n  ".join(problems)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
