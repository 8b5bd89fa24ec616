"""Worker CPU per request: what the traffic role costs, at a resolution throughput rounds cannot reach.

Each variant is its own Envoy with one worker (`--concurrency 1`) and a direct_response route. A
round loads every variant once, in an order that rotates from round to round; per load, the CPU
time Envoy's worker thread used (`/proc/<pid>/task/<tid>/schedstat`, first field, nanoseconds, the
thread whose comm starts with `wrk:worker`) is divided by the requests the load generator
completed. Time the worker spends waiting for a core is not in that figure, so the load on the
machine moves it much less than it moves req/s. Every variant is compared with the no-op filter and
with the twin as the median of per-round paired differences, with a bootstrap 95% interval.

Variants:
  none                 no wasm filter on the traffic listener
  noop                 a Rust proxy-wasm filter that returns Continue everywhere (tests/bench/noop)
  twin                 the no-op plus exactly drain-gate's per-stream structure (tests/bench/twin)
  drain-gate           the shipped module, state OPEN
  drain-gate-draining  the shipped module during a drain (one long stream held, state DRAINING):
                       every stream is counted exactly
  dg-min-drain         the shipped module during a drain held open by min_drain (no stream held):
                       each time the worker's count reaches 0 the traffic role asks whether to flip
  dg-draining-no-rotation  (bisection) drain-gate-draining with `rotate_connections: false`: the
                       drain without Envoy's drain sequence (every response asking its client to
                       close, so that every request of the drain comes on a new connection)
  dg-no-count          (bisection) the real module, root, tick and health role, traffic streams
                       with the twin's structure instead of counted ones (tests/bench/bisect)
  dg-no-wasm-opt       (bisection) the shipped source as cargo builds it, before wasm-opt -Oz

Every variant's traffic listener has a TLS-terminating twin (the same filters behind a
DownstreamTlsContext, ALPN h2 and http/1.1), as the chart's gateways terminate TLS: the TLS loads
run against it, so a drain that made every request reconnect would pay a handshake per request.
"""
from __future__ import annotations

import copy
import random
import socket
import statistics
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.bench.bench import _open_stream, h2load, variant, wrk
from tests.harness.envoy import REPO, Envoy, Ports, free_port, wait_for
from tests.harness.haproxy import make_cert
from tests.harness.variants import with_code

TARGET = REPO / "target"
TWIN_WASM = TARGET / "noop" / "wasm32-wasip1" / "release" / "twin_filter.wasm"
BISECT_WASM = TARGET / "bench-fixtures" / "wasm32-wasip1" / "release" / "drain_gate_bisect.wasm"
CARGO_WASM = TARGET / "wasm32-wasip1" / "release" / "drain_gate.wasm"
VARIANTS = ["none", "noop", "twin", "drain-gate", "drain-gate-draining"]
BISECT = ["dg-min-drain", "dg-draining-no-rotation", "dg-no-count", "dg-no-wasm-opt"]
# The variants held in a drain by one long stream.
HELD = ("drain-gate-draining", "dg-draining-no-rotation")
# The drain must outlast the run: only the held stream keeps it open, and nothing may end it.
CONFIG = {"drain_timeout": "60m", "lb_buffer": "60m"}
# load -> (over TLS, run(url, seconds))
LOADS = {
    "wrk -c16 (HTTP/1.1)": (False, lambda url, s: wrk(url, s, 16)),
    "h2load -c4 -m16 (HTTP/2)": (False, lambda url, s: h2load(url, s, 4, 16)),
    "wrk -c16 (HTTPS/1.1)": (True, lambda url, s: wrk(url, s, 16)),
    "h2load -c4 -m16 (HTTP/2 over TLS)": (True, lambda url, s: h2load(url, s, 4, 16)),
}
REFERENCES = ("noop", "twin", "drain-gate")
RESAMPLES = 2000


def doc(kind: str, ports: Ports, tls_port: int, pem: Path) -> dict:
    """The bootstrap of one variant, its traffic listener beside a TLS-terminating twin."""
    d = plain_doc(kind, ports)
    listeners = d["static_resources"]["listeners"]
    plain = next(l for l in listeners if l["name"] == "traffic")
    tls = copy.deepcopy(plain)
    tls["name"] = "traffic-tls"
    tls["address"]["socket_address"]["port_value"] = tls_port
    pem_path = str(pem)
    tls["filter_chains"][0]["transport_socket"] = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {
                "alpn_protocols": ["h2", "http/1.1"],
                "tls_certificates": [{"certificate_chain": {"filename": pem_path},
                                      "private_key": {"filename": pem_path}}],
            },
        },
    }
    listeners.append(tls)
    return d


def plain_doc(kind: str, ports: Ports) -> dict:
    if kind in ("none", "noop"):
        return variant(kind, ports, "direct", config=CONFIG)
    if kind == "twin":
        return variant("noop", ports, "direct", config=CONFIG, baseline=TWIN_WASM)
    if kind == "dg-min-drain":
        return variant("drain-gate", ports, "direct", config={**CONFIG, "min_drain": "60m"})
    if kind == "dg-draining-no-rotation":
        return variant("drain-gate", ports, "direct", config={**CONFIG, "rotate_connections": False})
    shipped = variant("drain-gate", ports, "direct", config=CONFIG)
    if kind == "dg-no-count":
        return with_code(shipped, "traffic", BISECT_WASM)
    if kind == "dg-no-wasm-opt":
        return with_code(shipped, "traffic", CARGO_WASM)
    return shipped


def worker_tid(pid: int) -> int:
    """The one worker thread of an Envoy started with --concurrency 1."""
    def find():
        for task in Path(f"/proc/{pid}/task").iterdir():
            if (task / "comm").read_text().startswith("wrk:worker"):
                return int(task.name)
        return None

    return wait_for(find, 10, what="Envoy worker thread")


def worker_ns(pid: int, tid: int) -> int:
    """CPU time the thread has run, nanoseconds (schedstat: run time, wait time, timeslices)."""
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def enter_drain(e: Envoy) -> socket.socket:
    """Holds one long stream and starts a drain; returns once the count is exactly that stream."""
    held = _open_stream(e.ports.traffic, "/stream?seconds=3600&interval_ms=10000")
    assert requests.post(e.health("/drain"), timeout=5).json()["state"] == "DRAINING"
    wait_for(lambda: requests.get(e.health("/drain/status"), timeout=5).json()["active"] == 1, 10,
             what="the drain counts exactly the held stream")
    return held


def run_rounds(envoys: dict, rounds: range, seconds: float, warmup: bool, samples: dict) -> int:
    """Appends every round's worker µs per request to samples[load][kind]; returns the load
    generators' errors. Round numbers set the order, which rotates from round to round."""
    kinds = list(envoys)
    tids = {k: worker_tid(e.proc.pid) for k, e in envoys.items()}
    errors = 0
    for r in ([None] if warmup else []) + list(rounds):  # None warms every VM up and is not kept
        shift = (r or 0) % len(kinds)
        for load, (tls, run) in LOADS.items():
            for kind in kinds[shift:] + kinds[:shift]:
                e = envoys[kind]
                url = f"https://127.0.0.1:{e.tls_port}/" if tls else e.traffic("/")
                before = worker_ns(e.proc.pid, tids[kind])
                result = run(url, seconds)
                used = worker_ns(e.proc.pid, tids[kind]) - before
                if r is not None:
                    samples[load][kind].append(used / 1000 / max(result.requests, 1))
                    errors += result.errors
    return errors


@contextmanager
def running(kinds: list[str], workdir: Path, backend_port: int):
    """One Envoy per variant, the draining one in its drain; stopped on every exit path."""
    envoys: dict = {}
    held = []
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        pem = make_cert(workdir)
        for kind in kinds:
            ports = Ports(backend=backend_port)
            tls_port = free_port()
            envoys[kind] = Envoy(doc(kind, ports, tls_port, pem), ports, concurrency=1,
                                 workdir=workdir / kind).start(wait_ready=False)
            envoys[kind].tls_port = tls_port
        for e in envoys.values():
            e.wait_ready()
        held = [enter_drain(envoys[k]) for k in HELD if k in envoys]
        if "dg-min-drain" in envoys:
            assert requests.post(envoys["dg-min-drain"].health("/drain"), timeout=5).json()["state"] == "DRAINING"
        yield envoys
    finally:
        for h in held:
            h.close()
        for e in envoys.values():
            e.stop()


def paired(xs: list[float], ys: list[float], rng_seed: int = 1, ratio: bool = False) -> dict:
    """Median of the per-round differences xs − ys (or ratios xs / ys), and a bootstrap 95%
    interval of that median."""
    d = [x / y if ratio else x - y for x, y in zip(xs, ys)]
    rng = random.Random(rng_seed)
    boots = sorted(statistics.median(rng.choices(d, k=len(d))) for _ in range(RESAMPLES))
    return {"median": statistics.median(d), "ci95": [boots[int(0.025 * RESAMPLES)], boots[int(0.975 * RESAMPLES) - 1]]}


def summary(per_kind: dict) -> dict:
    out = {}
    for kind, xs in per_kind.items():
        q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else xs * 3
        row = {"median": statistics.median(xs), "iqr": [q[0], q[2]], "rounds": [round(x, 2) for x in xs]}
        for ref in REFERENCES:
            if ref == "drain-gate" and not kind.startswith(("drain-gate-", "dg-")):
                continue  # drain-gate is the reference of its own variants only
            if ref in per_kind and ref != kind:
                row[f"vs_{ref}"] = paired(xs, per_kind[ref])
        if kind.startswith(("drain-gate-", "dg-")) and "drain-gate" in per_kind:
            row["x_drain-gate"] = paired(xs, per_kind["drain-gate"], ratio=True)
        out[kind] = row
    return out


def worker_cpu(rounds: int, seconds: float, workdir: Path, backend_port: int, bisect: bool,
               blocks: int = 1, warmup: bool = True) -> dict:
    """`rounds` rounds per load in `blocks` blocks, each with freshly started Envoys: what one
    process happens to cost more or less (memory layout, code placement) varies between blocks
    and so lands in the interval instead of in the difference."""
    kinds = VARIANTS + (BISECT if bisect else [])
    samples = {load: {k: [] for k in kinds} for load in LOADS}
    errors, checks = 0, []
    per_block = -(-rounds // blocks)
    for b in range(blocks):
        with running(kinds, workdir / f"cpu-{b}", backend_port) as envoys:
            done = range(b * per_block, min(rounds, (b + 1) * per_block))
            errors += run_rounds(envoys, done, seconds, warmup, samples)
            checks.append(count_checks(envoys))
    return {"rounds": rounds, "blocks": blocks, "seconds": seconds, "errors": errors, "checks": checks,
            "loads": {load: summary(per_kind) for load, per_kind in samples.items()}}


def count_checks(envoys: dict) -> dict:
    """After all the load the count is exact: 0 outside the drain (once the tick gave back the
    unused lease), exactly the held stream during it, and the drain still running."""
    out = {}
    for kind in ("drain-gate", *HELD, "dg-min-drain"):
        e = envoys.get(kind)
        if e is None:
            continue
        want = 1 if kind in HELD else 0
        try:
            wait_for(lambda: requests.get(e.health("/drain/status"), timeout=5).json()["active"] == want, 5)
        except TimeoutError:
            pass
        st = requests.get(e.health("/drain/status"), timeout=5).json()
        out[kind] = {"active": st["active"], "state": st["state"], "want_active": want}
    return out


def checks_failed(res: dict) -> list[str]:
    bad = [f"{k}: active {v['active']} (want {v['want_active']}), state {v['state']}"
           for block in res["checks"] for k, v in block.items()
           if v["active"] != v["want_active"] or (k != "drain-gate") != (v["state"] == "DRAINING")]
    if res["errors"]:
        bad.append(f"{res['errors']} load generator errors")
    return bad


def _ci(p: dict) -> str:
    return f"{p['median']:+.1f} [{p['ci95'][0]:+.1f}, {p['ci95'][1]:+.1f}]"


def markdown(res: dict) -> list[str]:
    lines = [f"Worker CPU per request: {res['rounds']} interleaved rounds of {res['seconds']:g} s per load "
             f"({res['blocks']} blocks of fresh Envoys); median [IQR]; differences are medians of per-round "
             "paired differences [bootstrap 95% interval], µs.",
             "", "| load | variant | µs/req | − no-op | − twin | − drain-gate | × drain-gate |",
             "|---|---|---|---|---|---|---|"]
    for load, rows in res["loads"].items():
        for kind, r in rows.items():
            diffs = [_ci(r[f"vs_{ref}"]) if f"vs_{ref}" in r else "" for ref in REFERENCES]
            x = r.get("x_drain-gate")
            ratio = f"{x['median']:.3f} [{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}]" if x else ""
            lines.append(f"| {load} | {kind} | {r['median']:.1f} [{r['iqr'][0]:.1f}, {r['iqr'][1]:.1f}] | "
                         f"{' | '.join(diffs)} | {ratio} |")
    lines.append("")
    return lines


def goals(res: dict) -> list[tuple[str, str, bool]]:
    """(goal, what was measured, met) for the cost of a drain: a drain costs a request at most
    10% more than outside one. What a drain min_drain holds open costs a stream is below what a
    run resolves here: `make cost` counts it and keeps its goal (tests/bench/cost.py)."""
    out = []
    for load, rows in res["loads"].items():
        if "drain-gate-draining" in rows:
            x = rows["drain-gate-draining"]["x_drain-gate"]["median"]
            out.append((f"{load}: during a drain ≤ 1.10 × outside", f"{x:.3f} ×", x <= 1.10))
    return out
