"""Calibrates the cost meter once: ns per wasm instruction and per host call, from one whole `make bench`.

`make bench` kept its run in tests/bench/results.json: per load and round, the worker CPU per request of every
variant (the no-op filter, the twin, drain-gate in OPEN, in a drain, held by `min_drain`, and the bisection
builds). The meter counts, for each of those modules and states as the bench ran them (one worker, a
direct_response route), the wasm instructions and host calls per stream. Every variant's CPU over the twin's,
against its instructions and host calls over the twin's, is one equation; the least-squares fit over all of
them (4 loads × 7 variants) is the estimate, and resampling the bench's rounds (paired, 2000 times, a fixed
generator) its 95 % interval. The only host call the variants differ in is `proxy_increment_metric` (two per
stream in a drain): its figure stands for every kind, which the bench cannot tell apart.

  python -m tests.bench.calibrate   writes tests/bench/cost-calibration.json (`make cost-calibration`)
"""
from __future__ import annotations

import hashlib
import json
import random
import statistics
import subprocess
import sys

from tests.bench import cost
from tests.bench.proxy_host import Module

RESULTS = cost.REPO / "tests" / "bench" / "results.json"
TARGET = cost.REPO / "target"
MODULES = {
    "noop": TARGET / "noop" / "wasm32-wasip1" / "release" / "noop_filter.wasm",
    "twin": TARGET / "noop" / "wasm32-wasip1" / "release" / "twin_filter.wasm",
    "drain-gate": cost.WASM,
    "dg-no-count": TARGET / "bench-fixtures" / "wasm32-wasip1" / "release" / "drain_gate_bisect.wasm",
    "dg-no-wasm-opt": TARGET / "wasm32-wasip1" / "release" / "drain_gate.wasm",
}
RESAMPLES = 2000
# What the bench's modules are built from, besides src/: a change there since the bench's commit would make
# the counts another module's.
SOURCES = ["src", "Cargo.toml", "Cargo.lock", "Makefile", "tests/bench/noop", "tests/bench/twin",
           "tests/bench/bisect"]


def counts() -> dict[str, dict]:
    """Per stream, each variant as `tests/bench/cpu.py` runs it (one worker)."""
    missing = [str(p) for p in MODULES.values() if not p.exists()]
    if missing:
        raise SystemExit(f"missing modules (make build bench-fixtures): {', '.join(missing)}")
    m = {k: Module(p) for k, p in MODULES.items()}
    one = {"workers": 1}
    return {
        # The no-op, the twin and the bisection build count no stream: their paths check none.
        "noop": cost.path_open(m["noop"], roles=("traffic",), counts=False, **one),
        "twin": cost.path_open(m["twin"], roles=("traffic",), counts=False, **one),
        "drain-gate": cost.path_open(m["drain-gate"], **one),
        "drain-gate-draining": cost.path_draining(m["drain-gate"], **one),
        "dg-min-drain": cost.path_held(m["drain-gate"], **one),
        "dg-draining-no-rotation": cost.path_draining(m["drain-gate"], {"rotate_connections": False}, **one),
        "dg-no-count": cost.path_open(m["dg-no-count"], counts=False, **one),
        "dg-no-wasm-opt": cost.path_open(m["dg-no-wasm-opt"], **one),
    }


def fit(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares through the origin: y = a·x1 + b·x2 (µs; instructions, host calls) → (a, b)."""
    s11 = sum(x1 * x1 for x1, _, _ in points)
    s22 = sum(x2 * x2 for _, x2, _ in points)
    s12 = sum(x1 * x2 for x1, x2, _ in points)
    s1y = sum(x1 * y for x1, _, y in points)
    s2y = sum(x2 * y for _, x2, y in points)
    det = s11 * s22 - s12 * s12
    return (s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det


def points(loads: dict, c: dict, idx: list[int] | None = None) -> list[tuple[float, float, float]]:
    out = []
    for rows in loads.values():
        twin = rows["twin"]["rounds"]
        pick = idx if idx is not None else range(len(twin))
        for v, row in rows.items():
            if v in ("none", "twin") or v not in c:
                continue
            d = statistics.median(row["rounds"][i] - twin[i] for i in pick)
            out.append((c[v]["instructions"] - c["twin"]["instructions"],
                        c[v]["host_calls"] - c["twin"]["host_calls"], d))
    return out


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=cost.REPO, capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    res = json.loads(RESULTS.read_text())
    commit = res["meta"]["commit"]
    changed = git("diff", "--name-only", commit, "HEAD", "--", *SOURCES).split()
    size = cost.WASM.stat().st_size
    if size != res["footprint"]["drain_gate_wasm_bytes"]:
        raise SystemExit(f"{cost.WASM.name} is {size} bytes, the bench's {res['footprint']['drain_gate_wasm_bytes']}: "
                         "not the module it measured")
    c = counts()
    loads = res["cpu"]["loads"]
    a, b = fit(points(loads, c))
    rng = random.Random(20261201)
    n = len(next(iter(loads.values()))["twin"]["rounds"])
    boot = sorted(fit(points(loads, c, [rng.randrange(n) for _ in range(n)])) for _ in range(RESAMPLES))
    lo, hi = int(0.025 * RESAMPLES), int(0.975 * RESAMPLES) - 1
    a_ci = sorted(x for x, _ in boot)
    b_ci = sorted(y for _, y in boot)
    ns_i, ns_h = a * 1000, b * 1000
    out = {
        "bench": {k: res["meta"][k] for k in ("date", "command", "commit", "cpu_model", "envoy")},
        "counted_at": git("rev-parse", "--short=12", "HEAD"),
        "module_sha256": hashlib.sha256(cost.WASM.read_bytes()).hexdigest(),
        "sources_changed_since_the_bench": changed,
        "ns_per_instruction": round(ns_i, 3),
        "ns_per_instruction_ci95": [round(a_ci[lo] * 1000, 3), round(a_ci[hi] * 1000, 3)],
        "ns_per_host_call": {"proxy_increment_metric": round(ns_h), "*": round(ns_h)},
        "ns_per_host_call_ci95": [round(b_ci[lo] * 1000), round(b_ci[hi] * 1000)],
        "per_stream": {v: {"instructions": r["instructions"], "host_calls": r["host_calls"]} for v, r in c.items()},
        "summary": (f"calibrated from `{res['meta']['command']}` of {res['meta']['date']} (commit {commit}, Envoy "
                    f"{res['meta']['envoy']}, V8): {ns_i:.2f} ns per wasm instruction [95 %: "
                    f"{a_ci[lo] * 1000:.2f}, {a_ci[hi] * 1000:.2f}] and {ns_h:.0f} ns per host call "
                    f"[{b_ci[lo] * 1000:.0f}, {b_ci[hi] * 1000:.0f}], fitted to the worker CPU of 7 variants "
                    f"over the twin in 4 loads (tests/bench/cost-calibration.json; `python -m "
                    f"tests.bench.calibrate`); the host-call figure is `proxy_increment_metric`'s, the only "
                    f"kind the bench's variants differ in, and stands for every kind."),
    }
    cost.CALIBRATION.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
