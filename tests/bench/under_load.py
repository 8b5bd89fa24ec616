"""`make bench` sections beside a rollout's questions (tests/bench/bench.py runs them):

  health   the health listener under a real load generator (h2load --h1, the LB's HTTP/1.x) at
           >= 5,000 checks/s while wrk loads the traffic listener: p50/p99 beside the same rate on
           a direct_response listener of the same Envoy (the floor any listener pays)
  draining the traffic path while a drain runs (every stream counted exactly, host calls per
           stream) beside the same Envoy outside a drain and beside the no-op filter
  rss      Envoy RSS with the no-op filter vs drain-gate's two roles at concurrency 1, 2, 4: the
           per-worker cost of the roles themselves, V8 being in both
"""
from __future__ import annotations

import statistics
import threading
from pathlib import Path

import requests

from tests.bench.bench import PlainEnvoy, h2load, measured, rss_mib, upstream_doc, variant, wrk
from tests.harness.envoy import Envoy, Ports, free_port, wait_for


def _median(samples: list, key: str) -> float:
    return statistics.median(getattr(s, key) for s in samples)


def health(rounds: int, seconds: float, rate: int, workdir: Path, backend_port: int) -> dict:
    """Checks at `rate`/s on 8 HTTP/1.1 connections, the traffic listener under wrk -c16 meanwhile."""
    ports = Ports(backend=backend_port)
    doc = variant("drain-gate", ports, "direct")
    floor_port = free_port()
    doc["static_resources"]["listeners"].append(upstream_doc(floor_port, 0)["static_resources"]["listeners"][0])
    targets = {"drain-gate /health_check.html": f"http://127.0.0.1:{ports.health}/health_check.html",
               "direct_response (floor)": f"http://127.0.0.1:{floor_port}/"}
    samples: dict = {k: [] for k in targets}
    with Envoy(doc, ports, concurrency=2, workdir=workdir / "health") as e:
        for r in range(rounds):
            for name in (list(targets) if r % 2 == 0 else list(targets)[::-1]):
                load = threading.Thread(target=wrk, args=(e.traffic("/"), seconds + 2, 16))
                load.start()
                samples[name].append(h2load(targets[name], seconds, 8, 1, ["--h1", f"--rps={rate // 8}"]))
                load.join(seconds + 60)
    return {name: {"checks_per_s": _median(v, "rps"), "p50_ms": _median(v, "p50_ms"),
                   "p99_ms": _median(v, "p99_ms"), "errors": sum(s.errors for s in v),
                   "rounds_p99_ms": [round(s.p99_ms, 3) for s in v]} for name, v in samples.items()}


def draining(rounds: int, seconds: float, workdir: Path, backend_port: int) -> dict:
    """wrk on three Envoys (1 worker): no-op filter, drain-gate OPEN, drain-gate DRAINING."""
    hold = {"min_drain": "60m", "drain_timeout": "60m"}  # stays DRAINING for the whole run
    kinds = {"noop": ("noop", None), "drain-gate open": ("drain-gate", hold),
             "drain-gate draining": ("drain-gate", hold)}
    envoys, samples = {}, {k: [] for k in kinds}
    try:
        for name, (kind, config) in kinds.items():
            ports = Ports(backend=backend_port)
            envoys[name] = Envoy(variant(kind, ports, "direct", config=config), ports, concurrency=1,
                                 workdir=workdir / f"draining-{name.replace(' ', '-')}").start()
        drained = envoys["drain-gate draining"]
        assert requests.post(drained.health("/drain"), timeout=5).json()["state"] == "DRAINING"
        for r in range(rounds):
            for name in (list(kinds) if r % 2 == 0 else list(kinds)[::-1]):
                e = envoys[name]
                samples[name].append(measured(e, lambda: wrk(e.traffic("/"), seconds, 16)))
        # Exact during the drain: back to 0 at once, no lease left over.
        exact = wait_for(lambda: requests.get(drained.health("/drain/status"), timeout=5).json()["active"] == 0,
                         5, what="active back to 0 in the drain")
        state = requests.get(drained.health("/drain/status"), timeout=5).json()["state"]
    finally:
        for e in envoys.values():
            e.stop()
    out = {name: {"rps": _median(v, "rps"), "p99_ms": _median(v, "p99_ms"),
                  "cpu_us_per_req": _median(v, "cpu_us_per_req"), "rounds": [round(s.rps) for s in v]}
           for name, v in samples.items()}
    out["draining_exact_after"] = bool(exact) and state == "DRAINING"
    return out


def rss(workdir: Path, backend_port: int) -> dict:
    """RSS after a short wrk warm-up that reaches every worker, no-op vs drain-gate."""
    out: dict = {}
    for concurrency in (1, 2, 4):
        for kind in ("noop", "drain-gate"):
            ports = Ports(backend=backend_port)
            doc = variant(kind, ports, "direct")
            if kind == "noop":  # the no-op filter alone: no health role either
                doc["static_resources"]["listeners"] = [
                    lst for lst in doc["static_resources"]["listeners"] if lst["name"] == "traffic"]
            e = (Envoy if kind == "drain-gate" else PlainEnvoy)(doc, ports, concurrency=concurrency,
                                                               workdir=workdir / f"rss-{kind}-{concurrency}")
            with e:
                wrk(e.traffic("/"), 2, 4 * concurrency)
                out.setdefault(str(concurrency), {})[kind] = rss_mib(e.proc.pid)
        row = out[str(concurrency)]
        row["roles_mib"] = row["drain-gate"] - row["noop"]
    c1, c4 = out["1"]["roles_mib"], out["4"]["roles_mib"]
    out["roles_mib_per_extra_worker"] = (c4 - c1) / 3
    return out


def markdown(res: dict) -> list[str]:
    lines: list[str] = []
    if "health" in res:
        lines += ["| health checks under load (h2load --h1, 8 conns) | checks/s | p50 ms | p99 ms | errors |",
                  "|---|---|---|---|---|"]
        lines += [f"| {k} | {v['checks_per_s']:.0f} | {v['p50_ms']:.3f} | {v['p99_ms']:.3f} | {v['errors']} |"
                  for k, v in res["health"].items()]
        lines.append("")
    if "draining" in res:
        d = res["draining"]
        lines += ["| traffic path (wrk -c16, 1 worker) | req/s | p99 ms | CPU µs/req |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['rps']:.0f} | {v['p99_ms']:.3f} | {v['cpu_us_per_req']:.1f} |"
                  for k, v in d.items() if isinstance(v, dict)]
        lines += ["", f"Count exact after the load during the drain: {d['draining_exact_after']}.", ""]
    if "rss" in res:
        r = res["rss"]
        lines += ["| concurrency | RSS no-op MiB | RSS drain-gate MiB | the roles MiB |", "|---|---|---|---|"]
        lines += [f"| {c} | {r[c]['noop']:.1f} | {r[c]['drain-gate']:.1f} | {r[c]['roles_mib']:.1f} |"
                  for c in ("1", "2", "4")]
        lines += ["", f"The roles per extra worker: {r['roles_mib_per_extra_worker']:.2f} MiB.", ""]
    return lines
