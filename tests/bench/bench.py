"""`make bench` / `make bench-quick`: drain-gate's cost and speed beside its baselines.

Sections (each a ratio measured in one run, A/B interleaved over rounds, medians):
  overhead  traffic path: no wasm filter / no-op Rust filter / drain-gate, wrk (HTTP/1.1) and
            h2load (HTTP/2), to a direct_response route and to a real upstream (another Envoy)
  cpu       Envoy worker-thread CPU per request (tests/bench/cpu.py): no filter, no-op, twin,
            drain-gate outside and during a drain, bisection builds; paired differences
  flip      last response byte at the client -> first 503 on /health_check.html (client polling
            back to back), drain-gate vs the sidecar design's admin /stats poll (2 s) + POST /close-lb
  scale     count accuracy and throughput at concurrency 1, 2, 4; health p99 at ~1k req/s under load
  footprint .wasm sizes; Envoy RSS with and without the plugin
  tcp       a TCP chain (tcp_proxy to another Envoy answering 200): no wasm filter / no-op network
            filter / drain-gate role traffic_tcp, wrk keep-alive (bytes: the host's per-read calls)
            and wrk with `Connection: close` (a connection per request: open and close)

Writes out/bench/results.json, out/bench/results.md and out/bench/overhead.svg.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.bench import readme
from tests.harness import backend as demo_backend
from tests.harness import variants
from tests.harness.envoy import REPO, WASM, Envoy, Ports, free_port, hcm, render, wait_for
from tests.harness.process import stop_on_signals
from tests.harness.variants import listener

NOOP_WASM = REPO / "target" / "noop" / "wasm32-wasip1" / "release" / "noop_filter.wasm"
OUT = REPO / "out" / "bench"
# A whole `make bench` run is kept here and written into tests/docs/bench.md between these lines.
COMMITTED = REPO / "tests" / "bench" / "results.json"
README = REPO / "tests" / "docs" / "bench.md"
BEGIN = "<!-- bench results: written by `make bench` from tests/bench/results.json, never by hand -->"
END = "<!-- end of bench results -->"
# The module's budget: Helm keeps it twice in a release Secret (1 MiB: the chart carries a module up to about
# two thirds of a MiB, envoyfilter/docs/limits.md), V8 compiles it per worker. 250,000 until the traffic roles
# measured stream durations (src/instruments/sizing/mod.rs, +9 KB after the module was cut from 265,850 to 251,480 bytes);
# 270,000 until the LB's check intervals (src/gate/lb.rs) and the quiet tick's fixed forms and version caches
# (src/host/shared.rs, in_flight, liveness): 273,824 bytes with them; 275,000 until `make build` built the
# module as the cdylib alone (231,974 bytes; 235,928 with std's address parser in src/net.rs).
MODULE_BUDGET_BYTES = 250_000
# The budget a kept run was measured against when it does not say (runs before it was recorded).
EARLIER_BUDGET_BYTES = 250_000
CLK = os.sysconf("SC_CLK_TCK")


# -- Envoy variants --------------------------------------------------------------------------

def variant(kind: str, ports: Ports, route: str, upstream_port: int | None = None, config: dict | None = None,
            baseline: Path = NOOP_WASM) -> dict:
    """The shipped bootstrap with the traffic path changed only where the variant says: "none" (no
    wasm filter), "noop" (the `baseline` module in its own VM instead of drain-gate) or drain-gate."""
    doc = render(ports, config)
    traffic = hcm(listener(doc, "traffic"))
    filters = traffic["http_filters"]
    if kind == "none":
        traffic["http_filters"] = [f for f in filters if f["name"] != "drain-gate"]
    elif kind == "noop":
        for f in filters:
            if f["name"] == "drain-gate":
                f["name"] = "noop"
                plugin = f["typed_config"]["config"]
                plugin["name"] = "noop"
                plugin["root_id"] = "noop"
                plugin["vm_config"]["vm_id"] = "noop"
                plugin["vm_config"]["code"]["local"]["filename"] = str(baseline)
                plugin.pop("configuration", None)
    routes = traffic["route_config"]["virtual_hosts"][0]["routes"]
    if route == "direct":
        # /stream still reaches the demo backend (long requests to hold open); the rest is answered here.
        routes[:] = [{"match": {"prefix": "/stream"}, "route": {"cluster": "backend", "timeout": "0s"}},
                     {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}]
    else:
        ep = doc["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
        ep["endpoint"]["address"]["socket_address"]["port_value"] = upstream_port
    return doc


def upstream_doc(port: int, admin: int) -> dict:
    """A plain Envoy answering 200 locally: the 'real upstream'."""
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {"listeners": [{
            "name": "upstream",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "upstream", "codec_type": "AUTO",
                    "route_config": {"virtual_hosts": [{"name": "u", "domains": ["*"], "routes": [
                        {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}]}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                }}]}],
        }]},
    }


class PlainEnvoy(Envoy):
    """An Envoy without drain-gate (readiness from the admin only)."""

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(self.admin_ready, timeout, what="upstream envoy ready")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- load generators -------------------------------------------------------------------------

@dataclass
class Load:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    cpu_us_per_req: float = float("nan")


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def wrk(url: str, seconds: float, conns: int, extra: list[str] | None = None) -> Load:
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", *(extra or []), url],
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(errs.group(1)) if errs else 0) + (sum(map(int, sock.groups())) if sock else 0)
    return Load(rps, p50, p99, total, errors)


def nearest_rank(samples, q: float) -> float:
    """The `q`-quantile (0 < q <= 1) by nearest rank: the ceil(q × n)-th smallest sample. Always one of
    the samples, so a p99 never exceeds the max (an interpolating method extrapolates past it at
    small n)."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def h2load(url: str, seconds: float, conns: int, streams: int = 8, extra: list[str] | None = None) -> Load:
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        out = subprocess.run(["h2load", "-c", str(conns), "-m", str(streams), "-D", str(int(seconds)),
                              "--log-file", log.name, *(extra or []), url], capture_output=True, text=True,
                             timeout=seconds + 30).stdout
        durations = sorted(int(line.split()[2]) for line in log if line.strip())  # microseconds
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out).group(1))
    return Load(rps, nearest_rank(durations, 0.5) / 1000, nearest_rank(durations, 0.99) / 1000,
                int(done.group(1)), int(done.group(3)) + int(done.group(4)))


def measured(envoy: Envoy, run) -> Load:
    before = cpu_seconds(envoy.proc.pid)
    load = run()
    used = cpu_seconds(envoy.proc.pid) - before
    load.cpu_us_per_req = used / max(load.requests, 1) * 1e6
    return load


# -- sections --------------------------------------------------------------------------------

def summary(samples: list[Load]) -> dict:
    """Medians over the rounds of one variant (and every round's req/s, for the spread)."""
    return {
        "rps": statistics.median(s.rps for s in samples),
        "p50_ms": statistics.median(s.p50_ms for s in samples),
        "p99_ms": statistics.median(s.p99_ms for s in samples),
        "cpu_us_per_req": statistics.median(s.cpu_us_per_req for s in samples),
        "errors": sum(s.errors for s in samples),
        "rounds": [round(s.rps) for s in samples],
    }


def overhead(rounds: int, seconds: float, conns: int, tools: list[str], routes: list[str], workdir: Path) -> dict:
    kinds = ["none", "noop", "drain-gate"]
    results: dict = {}
    up_port, up_admin = free_port(), free_port()
    upstream = PlainEnvoy(upstream_doc(up_port, up_admin), Ports(admin=up_admin), concurrency=1,
                          workdir=workdir / "upstream")
    envoys: dict = {}
    try:
        upstream.start()
        for route in routes:
            for kind in kinds:
                ports = Ports()
                envoys[(route, kind)] = Envoy(variant(kind, ports, route, up_port), ports, concurrency=1,
                                              workdir=workdir / f"{route}-{kind}").start()
        for tool in tools:
            for route in routes:
                samples = {k: [] for k in kinds}
                for r in range(rounds):
                    order = kinds[:] if r % 2 == 0 else kinds[::-1]
                    for kind in order:
                        e = envoys[(route, kind)]
                        url = e.traffic("/")
                        run = (lambda: wrk(url, seconds, conns)) if tool == "wrk" else (lambda: h2load(url, seconds, conns))
                        samples[kind].append(measured(e, run))
                results[f"{tool}/{route}"] = {kind: summary(v) for kind, v in samples.items()}
        # Count exactness after all that load: back to exactly 0 once the tick gave back the
        # unused lease (the count may lead the truth by a lease outside a drain, never trail it).
        for route in routes:
            e = envoys[(route, "drain-gate")]
            try:
                wait_for(lambda: requests.get(e.health("/drain/status"), timeout=5).json()["active"] == 0, 5)
            except TimeoutError:
                pass
            results[f"active_after/{route}"] = requests.get(e.health("/drain/status"), timeout=5).json()["active"]
    finally:
        for e in envoys.values():
            e.stop()
        upstream.stop()
    return results


def tcp_variant(kind: str, ports: Ports, tcp_port: int, upstream_port: int) -> dict:
    """The shipped bootstrap plus a TCP chain to `upstream_port`: tcp_proxy alone ("none"), after
    the no-op network filter ("noop"), or after drain-gate's traffic_tcp role ("drain-gate")."""
    doc = variants.tcp_listener(render(ports), tcp_port, upstream_port, counted=kind != "none")
    if kind == "noop":
        wasm = listener(doc, "tcp")["filter_chains"][0]["filters"][0]["typed_config"]["config"]
        wasm.update(name="noop", root_id="noop")
        wasm["vm_config"].update(vm_id="noop", code={"local": {"filename": str(NOOP_WASM)}})
        wasm["configuration"]["value"] = "network"
    return doc


def tcp(rounds: int, seconds: float, conns: int, workdir: Path) -> dict:
    """wrk through a TCP chain, keep-alive and one connection per request, the variants interleaved."""
    kinds = ["none", "noop", "drain-gate"]
    loads = {"keep-alive": [], "connection-per-request": ["-H", "Connection: close"]}
    up_port, up_admin = free_port(), free_port()
    upstream = PlainEnvoy(upstream_doc(up_port, up_admin), Ports(admin=up_admin), concurrency=1,
                          workdir=workdir / "tcp-upstream")
    envoys: dict = {}
    results: dict = {}
    try:
        upstream.start()
        for kind in kinds:
            ports, port = Ports(), free_port()
            envoys[kind] = (Envoy(tcp_variant(kind, ports, port, up_port), ports, concurrency=1,
                                  workdir=workdir / f"tcp-{kind}").start(), f"http://127.0.0.1:{port}/")
        for load, extra in loads.items():
            samples = {k: [] for k in kinds}
            for r in range(rounds):
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    e, url = envoys[kind]
                    samples[kind].append(measured(e, lambda: wrk(url, seconds, conns, extra)))
            results[f"tcp/{load}"] = {kind: summary(v) for kind, v in samples.items()}
        e = envoys["drain-gate"][0]
        active = lambda: requests.get(e.health("/drain/status"), timeout=5).json()["active"]  # noqa: E731
        try:  # every connection closed: exactly 0 once the tick gave back the unused lease
            wait_for(lambda: active() == 0, 5, what="connections back to 0")
        except TimeoutError:
            pass
        results["active_after/tcp"] = active()
    finally:
        for e, _ in envoys.values():
            e.stop()
        upstream.stop()
    return results


def _stream_end_time(sock: socket.socket) -> float:
    """Reads a chunked response until its terminating chunk; returns when it arrived."""
    buf = b""
    while not buf.endswith(b"0\r\n\r\n"):
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("stream closed early")
        buf += data
    return time.perf_counter()


def _open_stream(port: int, path: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    return s


def _poll_first_503(port: int, go, done, out) -> None:
    """Runs in its own process (no GIL shared with the stream reader): polls the LB check back to
    back on one keep-alive connection and reports when the first 503 arrived."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port)
    while not done.is_set():
        if not go.wait(0.05):
            continue
        while True:
            conn.request("GET", "/health_check.html")
            resp = conn.getresponse()
            resp.read()
            if resp.status == 503:
                out.put(time.perf_counter())
                break
        go.clear()


def flip(drains: int, baseline_drains: int, streams: int, workdir: Path, backend_port: int) -> dict:
    """Time from the last response byte at the client to the first 503 the LB could see."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    out = {}
    for mode, n in (("drain-gate", drains), ("sidecar-poller", baseline_drains)):
        ports = Ports(backend=backend_port)
        config = {"lb_buffer": "60m"}
        if mode == "sidecar-poller":
            config.update(min_drain="60m", drain_timeout="60m")  # only the external poller closes
        gaps, recorded = [], []
        with Envoy(render(ports, config), ports, concurrency=2, workdir=workdir / f"flip-{mode}") as e:
            go, done, first = ctx.Event(), ctx.Event(), ctx.Queue()
            poller = ctx.Process(target=_poll_first_503, args=(ports.health, go, done, first), daemon=True)
            poller.start()
            session, admin = requests.Session(), requests.Session()
            try:
                for _ in range(n):
                    socks = [_open_stream(ports.traffic, "/stream?seconds=0.3&interval_ms=100") for _ in range(streams - 1)]
                    last = _open_stream(ports.traffic, "/stream?seconds=0.6&interval_ms=100")
                    wait_for(lambda: session.get(e.health("/drain/status")).json()["active"] == streams, 10,
                             what="streams counted")
                    assert session.post(e.health("/drain")).json()["state"] == "DRAINING"
                    for s in socks:
                        _stream_end_time(s)
                        s.close()
                    go.set()
                    stop = threading.Event()
                    closer = None
                    if mode == "sidecar-poller":
                        closer = threading.Thread(target=_sidecar_poller, args=(admin, e, stop))
                        closer.start()
                    t0 = _stream_end_time(last)
                    last.close()
                    t1 = first.get(timeout=30)
                    stop.set()
                    if closer:
                        closer.join(30)
                    gaps.append((t1 - t0) * 1000)
                    recorded.append(session.get(e.health("/drain/status")).json()["progress"]["reason"])
                    assert session.post(e.health("/reopen")).status_code == 200
            finally:
                done.set()
                poller.join(5)
                if poller.is_alive():
                    poller.kill()
        out[mode] = {"drains": n, "mean_ms": statistics.mean(gaps), "p50_ms": statistics.median(gaps),
                     "p99_ms": nearest_rank(gaps, 0.99), "max_ms": max(gaps), "reasons": sorted(set(recorded)),
                     "gaps_ms": [round(g, 4) for g in gaps]}
    return out


def _sidecar_poller(admin: requests.Session, e: Envoy, stop: threading.Event) -> None:
    """The sidecar design's drain.sh loop: every 2 s sum downstream_rq_active + upstream_rq_active of the
    traffic path from Envoy admin /stats; at 0, POST /close-lb."""
    while not stop.is_set():
        text = admin.get(e.admin("/stats"), params={"filter": "downstream_rq_active|upstream_rq_active"}).text
        active = 0
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if name.startswith(("http.traffic.", "cluster.backend.")) and value.strip().isdigit():
                active += int(value)
        if active == 0:
            admin.post(e.health("/close-lb"))
            return
        stop.wait(2.0)


def scale(seconds: float, conns: int, workdir: Path, backend_port: int) -> dict:
    out = {}
    for concurrency in (1, 2, 4):
        ports = Ports(backend=backend_port)
        with Envoy(variant("drain-gate", ports, "direct"), ports, concurrency=concurrency,
                   workdir=workdir / f"scale-{concurrency}") as e:
            held = [_open_stream(ports.traffic, "/stream?seconds=60&interval_ms=1000") for _ in range(4)]
            health = {"lat": []}
            stop = threading.Event()

            def probe():
                import http.client

                conn = http.client.HTTPConnection("127.0.0.1", ports.health, timeout=5)
                nxt = time.perf_counter()
                while not stop.is_set():
                    t = time.perf_counter()
                    conn.request("GET", "/health_check.html")
                    conn.getresponse().read()
                    health["lat"].append((time.perf_counter() - t) * 1000)
                    nxt += 0.001
                    delay = nxt - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)

            th = threading.Thread(target=probe)
            th.start()
            load = measured(e, lambda: wrk(e.traffic("/"), seconds, conns))
            stop.set()
            th.join(10)
            during = wait_for(lambda: requests.get(e.health("/drain/status")).json()["active"] == len(held), 10,
                              what="exactly the held streams counted after the load")
            for s in held:
                s.close()
            after = wait_for(lambda: requests.get(e.health("/drain/status")).json()["active"] == 0, 10,
                             what="count back to 0")
            lat = sorted(health["lat"])
            out[str(concurrency)] = {
                "rps": load.rps, "p99_ms": load.p99_ms, "cpu_us_per_req": load.cpu_us_per_req,
                "errors": load.errors, "held_counted_exactly": bool(during), "active_after": 0 if after else None,
                "health_rps": len(lat) / seconds,
                "health_p99_ms": nearest_rank(lat, 0.99),
            }
    return out


def footprint(workdir: Path, backend_port: int) -> dict:
    out = {"drain_gate_wasm_bytes": WASM.stat().st_size, "noop_wasm_bytes": NOOP_WASM.stat().st_size}
    for kind in ("none", "drain-gate"):
        ports = Ports(backend=backend_port)
        doc = variant(kind, ports, "direct")
        if kind == "none":  # no plugin at all: drop the health listener too
            doc["static_resources"]["listeners"] = [l for l in doc["static_resources"]["listeners"] if l["name"] == "traffic"]
            e = PlainEnvoy(doc, ports, concurrency=2, workdir=workdir / "rss-none")
        else:
            e = Envoy(doc, ports, concurrency=2, workdir=workdir / "rss-dg")
        with e:
            wrk(e.traffic("/"), 2, 8)  # warm every worker
            out[f"rss_mib_{kind}"] = rss_mib(e.proc.pid)
    return out


# -- report ----------------------------------------------------------------------------------

def goals(res: dict) -> list[tuple[str, str, bool]]:
    """(goal, measured, met): what a drain may cost the gateway, the health listener, the module."""
    from tests.bench import cpu

    out = cpu.goals(res["cpu"]) if "cpu" in res else []
    if "health" in res:
        dg, floor = res["health"]["drain-gate /health_check.html"], res["health"]["direct_response (floor)"]
        x = floor["checks_per_s"] / dg["checks_per_s"]
        out.append(("health checks: the floor's checks/s ≤ 1.2 × drain-gate's", f"{x:.2f} ×", x <= 1.2))
    if "footprint" in res:
        b = res["footprint"]["drain_gate_wasm_bytes"]
        budget = res["meta"].get("module_budget_bytes", EARLIER_BUDGET_BYTES)
        out.append((f"module ≤ {budget:,} bytes", f"{b:,} bytes", b <= budget))
    return out


def report(res: dict) -> str:
    """The whole run as markdown: what results.md and the README's block hold."""
    from tests.bench import under_load

    lines = [markdown(res), *under_load.markdown(res)]
    met = goals(res)
    if met:
        lines += ["| goal | measured | met |", "|---|---|---|"]
        lines += [f"| {g} | {m} | {'yes' if ok else '**no**'} |" for g, m, ok in met]
        lines.append("")
    return "\n".join(lines)


def flip_p99(row: dict) -> float:
    """A flip row's p99 by nearest rank: from its gaps, or, for a run that kept none, from its size —
    below 100 drains the nearest rank of the 99th percentile is the n-th of n, the max."""
    if "gaps_ms" in row:
        return nearest_rank(row["gaps_ms"], 0.99)
    return row["max_ms"] if row["drains"] < 100 else row["p99_ms"]


def readme_block(text: str) -> str | None:
    """What stands between BEGIN and END in the README."""
    return readme.block(text, BEGIN, END)


def write_readme(res: dict) -> None:
    """Keeps a whole run (tests/bench/results.json) and writes it into tests/docs/bench.md."""
    COMMITTED.write_text(json.dumps(res, indent=2) + "\n")
    render_readme(res)


def render_readme(res: dict) -> None:
    """Writes the report of `res` into tests/docs/bench.md between BEGIN and END."""
    readme.write(README, BEGIN, END, report(res))


def source_commit() -> str:
    """The commit measured, `-dirty` when the module's sources differ from it."""
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock", "Makefile")
    return git("rev-parse", "--short=12", "HEAD") + ("-dirty" if dirty else "")


def markdown(res: dict) -> str:
    m = res["meta"]
    took = f", {m['minutes']:g} min" if "minutes" in m else ""
    lines = [f"Measured {m['date']} on {m['cpus']} cores ({m['cpu_model']}), Envoy {m['envoy']}, "
             f"command `{m['command']}`{took}, commit {m.get('commit', 'unknown')}.", ""]
    for section in ("overhead", "tcp"):
        if section not in res:
            continue
        lines += ["| load | variant | req/s | × no-op | × none | p50 ms | p99 ms | CPU µs/req |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, row in res[section].items():
            if key.startswith("active_after"):
                continue
            noop, none = row["noop"]["rps"], row["none"]["rps"]
            for kind in ("none", "noop", "drain-gate"):
                r = row[kind]
                lines.append(f"| {key} | {kind} | {r['rps']:.0f} | {r['rps'] / noop:.3f} | {r['rps'] / none:.3f} | "
                             f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['cpu_us_per_req']:.1f} |")
        lines.append("")
    if "cpu" in res:
        from tests.bench import cpu

        lines += cpu.markdown(res["cpu"])
    if "flip" in res:
        lines += ["| flip (last byte → first 503) | drains | mean ms | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
        for mode, r in res["flip"].items():
            lines.append(f"| {mode} | {r['drains']} | {r['mean_ms']:.2f} | {r['p50_ms']:.2f} | {flip_p99(r):.2f} | "
                         f"{r['max_ms']:.2f} |")
        lines.append("")
    if "scale" in res:
        lines += ["| concurrency | req/s | p99 ms | CPU µs/req | 4 held streams counted exactly | active after | health checks req/s (aimed at 1k) | health p99 ms |",
                  "|---|---|---|---|---|---|---|---|"]
        for c, r in res["scale"].items():
            lines.append(f"| {c} | {r['rps']:.0f} | {r['p99_ms']:.3f} | {r['cpu_us_per_req']:.1f} | {r['held_counted_exactly']} | "
                         f"{r['active_after']} | {r['health_rps']:.0f} | {r['health_p99_ms']:.3f} |")
        lines.append("")
    if "footprint" in res:
        f = res["footprint"]
        lines += [f"drain_gate.wasm {f['drain_gate_wasm_bytes']} bytes (no-op filter {f['noop_wasm_bytes']}); "
                  f"Envoy RSS at concurrency 2: {f['rss_mib_none']:.1f} MiB without the plugin, "
                  f"{f['rss_mib_drain-gate']:.1f} MiB with both roles.", ""]
    return "\n".join(lines)


def chart(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text
    import matplotlib.pyplot as plt

    rows = {k: v for k, v in res["overhead"].items() if not k.startswith("active_after")}
    kinds = ["none", "noop", "drain-gate"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.25
    for i, kind in enumerate(kinds):
        ax.bar([j + (i - 1) * width for j in range(len(rows))], [rows[k][kind]["rps"] for k in rows], width, label=kind)
    ax.set_xticks(range(len(rows)), list(rows))
    ax.set_ylabel("req/s (1 worker)")
    ax.set_title("Traffic-path throughput: no filter, no-op wasm filter, drain-gate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    from tests.bench import cpu

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="seconds, not minutes: checks the harness")
    ap.add_argument("--only", help="comma-separated sections, e.g. health,draining,rss")
    ap.add_argument("--cpu-rounds", type=int, default=30, help="rounds per load of the worker-CPU section")
    ap.add_argument("--cpu-blocks", type=int, default=5, help="blocks of freshly started Envoys the rounds are split into")
    ap.add_argument("--no-bisect", action="store_true", help="worker-CPU section without the bisection builds and the min_drain variant")
    ap.add_argument("--readme", action="store_true",
                    help="measure nothing: write the committed run (tests/bench/results.json) into tests/docs/bench.md")
    args = ap.parse_args()
    if args.readme:
        render_readme(json.loads(COMMITTED.read_text()))
        return 0
    started = time.monotonic()
    from tests.bench import under_load  # it builds on this module
    quick = args.quick
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=OUT))
    srv = demo_backend.serve(port := free_port())
    from tests.harness.envoy import envoy_binary

    banner = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True).stdout
    version = re.search(r"/(\d+\.\d+\.\d+)/", banner).group(1)
    cpu_model = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                      if l.startswith("model name")), platform.machine())
    argv = " ".join(a for a in sys.argv[1:] if a != "--quick")
    command = "make bench-quick" if quick else "make bench" + (f' BENCH_ARGS="{argv}"' if argv else "")
    res: dict = {"meta": {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "cpu_model": cpu_model,
                          "envoy": version, "command": command, "commit": source_commit(),
                          "module_budget_bytes": MODULE_BUDGET_BYTES}}
    if quick:
        sections = [
            ("cpu", lambda: cpu.worker_cpu(rounds=1, seconds=1, workdir=work, backend_port=port, bisect=False, warmup=False)),
            ("flip", lambda: flip(drains=3, baseline_drains=1, streams=3, workdir=work, backend_port=port)),
            ("tcp", lambda: tcp(rounds=1, seconds=1, conns=16, workdir=work)),
        ]
    else:
        sections = [
            ("overhead", lambda: overhead(rounds=5, seconds=5, conns=16, tools=["wrk", "h2load"], routes=["direct", "upstream"], workdir=work)),
            ("cpu", lambda: cpu.worker_cpu(rounds=args.cpu_rounds, seconds=1, workdir=work, backend_port=port,
                                           bisect=not args.no_bisect, blocks=args.cpu_blocks)),
            ("flip", lambda: flip(drains=60, baseline_drains=10, streams=5, workdir=work, backend_port=port)),
            ("scale", lambda: scale(seconds=5, conns=16, workdir=work, backend_port=port)),
            ("footprint", lambda: footprint(work, port)),
            ("health", lambda: under_load.health(rounds=3, seconds=5, rate=5000, workdir=work, backend_port=port)),
            ("draining", lambda: under_load.draining(rounds=5, seconds=5, workdir=work, backend_port=port)),
            ("rss", lambda: under_load.rss(work, port)),
            ("tcp", lambda: tcp(rounds=5, seconds=5, conns=16, workdir=work)),
        ]
    if args.only:
        sections = [(name, run) for name, run in sections if name in args.only.split(",")]
    for name, run in sections:
        res[name] = run()
        (OUT / "results.json").write_text(json.dumps(res, indent=2))  # partial results survive a failure
    srv.shutdown()
    res["meta"]["minutes"] = round((time.monotonic() - started) / 60, 1)
    md = report(res)
    (OUT / "results.md").write_text(md)
    if not quick and not args.only:
        write_readme(res)  # a whole run is what the README shows
    if "overhead" in res:
        chart(res, OUT / "overhead.svg")
    print(md)
    # The harness checks what it can check in seconds (never timing): the count is exact after
    # the load and every flip was made by the filter itself.
    bad = [k for section in ("overhead", "tcp") for k, v in res.get(section, {}).items()
           if k.startswith("active_after") and v != 0]
    bad += cpu.checks_failed(res["cpu"]) if "cpu" in res else []
    if "flip" in res and res["flip"]["drain-gate"]["reasons"] != ["active_zero"]:
        bad.append(f"flip reasons {res['flip']['drain-gate']['reasons']}")
    if bad:
        print(f"FAILED: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    stop_on_signals()  # Ctrl-C and SIGTERM stop what the run started, in a background job too
    raise SystemExit(main())
