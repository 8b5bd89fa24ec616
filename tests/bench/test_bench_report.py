"""The figures the READMEs quote about the benchmarks and the module are generated or checked here.

tests/docs/bench.md holds one whole `make bench` run, kept in tests/bench/results.json
with the commit it measured: what stands between its markers must be exactly that run as `make bench`
writes it. The module's budget and the size claim of envoyfilter/docs/install.md are checked against the
module this checkout builds.
"""
from __future__ import annotations

import json
import math

import pytest

from tests.bench import bench
from tests.bench.guard import optimized
from tests.harness.envoy import WASM

SECTIONS = ("overhead", "cpu", "flip", "scale", "footprint", "health", "draining", "rss", "tcp")


def test_the_benchmarks_section_is_the_kept_run():
    res = json.loads(bench.COMMITTED.read_text())
    assert set(SECTIONS) <= set(res), f"a whole run has every section; missing {set(SECTIONS) - set(res)}"
    assert res["meta"]["command"].startswith("make bench") and "--only" not in res["meta"]["command"]
    assert not res["meta"]["commit"].endswith("-dirty"), "measured on sources that were not committed"
    block = bench.readme_block(bench.README.read_text())
    assert block is not None, "tests/docs/bench.md has lost the markers of the benchmark results"
    assert block == bench.report(res).strip("\n"), (
        "tests/docs/bench.md's benchmark tables are not the kept run: run `make bench` (never edit them)")


def test_the_module_is_within_its_budget():
    """The budget is the optimized module's: without it (no wasm-opt) this fails under CI and skips elsewhere."""
    if not WASM.exists():
        pytest.fail(f"{WASM} is missing: `make build` builds it")
    optimized(WASM, "build", "the budget is the optimized module's")
    size = WASM.stat().st_size
    assert size <= bench.MODULE_BUDGET_BYTES, f"{WASM.name} is {size:,} bytes, over its budget"
    # envoyfilter/docs/install.md: client-side `kubectl apply` cannot carry the module in its annotation.
    assert 4 * math.ceil(size / 3) > 262_144
