"""The cost guard: what every path costs the shipped module may not grow unnoticed.

`tests/bench/cost.py` counts, on `target/drain_gate.wasm` in a proxy-wasm host stand-in, the wasm
instructions and the host calls of every path per stream. The counts are deterministic (two runs are the
same run), so they can be guarded exactly: a path whose instructions rise more than 5 % over the kept
baseline (`tests/bench/cost.json`), or whose host calls rise at all, fails here with the difference.
Refreshing the baseline is a deliberate `make cost-baseline`, which also writes the table of tests/docs/cost.md.
"""
from __future__ import annotations

import copy
import json

import pytest
import wasmtime

from tests.bench import cost
from tests.bench.proxy_host import HostError, Module, Process, Vm


@pytest.fixture(scope="module")
def measured():
    if not cost.WASM.exists():
        pytest.fail(f"{cost.WASM} is missing: `make build` builds it")
    if cost.WASM.with_name(cost.WASM.name + ".unoptimized").exists():
        pytest.skip("wasm-opt is not installed (make test installs it): the baseline counts the optimized module")
    return cost.measure(cost.WASM, twin=None)


def test_no_path_costs_more_than_its_baseline(measured):
    base = json.loads(cost.BASELINE.read_text())
    problems = cost.compare(base, measured)
    assert not problems, (
        "the module costs more than tests/bench/cost.json keeps:\n  " + "\n  ".join(problems)
        + "\n(a deliberate change: `make cost-baseline` keeps the new figures and writes tests/docs/cost.md's table)")


def test_make_cost_counts_the_same_again(measured, capsys):
    """`make cost`'s command: a second run writes what the first counted, and finds nothing dearer."""
    assert cost.main([]) == 0
    again = json.loads(cost.OUT.read_text())
    again["baselines"].pop("lb_check_twin", None)  # the twin, when built, is measured beside the module
    again["goals"] = [g for g in again["goals"] if not g["goal"].startswith("lb_check")]
    assert cost.dump(again) == cost.dump(measured)
    assert "against the baseline: no path costs more" in capsys.readouterr().out


def test_a_path_s_profile_adds_up_host_call_by_host_call(capsys):
    assert cost.main(["--profile", "lb_check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    events = [l.split(None, 2) for l in lines[:-1]]
    assert [e[2] for e in events if e[2].startswith(">")][:2] == ["> proxy_on_context_create",
                                                                    "> proxy_on_request_headers"]
    assert "proxy_send_local_response" in {e[2] for e in events}
    assert lines[-1].endswith("in all")
    total = int(lines[-1].split()[0].replace(",", ""))
    assert total == sum(int(e[0].replace(",", "")) for e in events) > 0


def test_the_readme_table_is_the_baseline():
    base = json.loads(cost.BASELINE.read_text())
    block = cost.readme_block(cost.README.read_text())
    assert block is not None, "tests/docs/cost.md has lost the markers of the cost table"
    assert block == cost.table(base), "tests/docs/cost.md's cost table is not tests/bench/cost.json: `make cost-baseline`"
    assert set(cost.PATHS) == set(base["paths"]), "the baseline does not have every path"


def test_the_guard_fails_on_more_instructions_or_one_more_host_call():
    base = json.loads(cost.BASELINE.read_text())
    same = copy.deepcopy(base)
    same["paths"]["open"]["instructions"] *= 1.04  # within the tolerance
    assert cost.compare(base, same) == []
    dearer = copy.deepcopy(base)
    dearer["paths"]["open"]["instructions"] *= 1.06
    assert [p.split(":")[0] for p in cost.compare(base, dearer)] == ["open"]
    one_more = copy.deepcopy(base)
    row = one_more["paths"]["held"]
    row["host_calls"] += 1
    row["by_call"]["proxy_get_shared_data"] = row["by_call"].get("proxy_get_shared_data", 0) + 1
    problems = cost.compare(base, one_more)
    assert len(problems) == 2 and all(p.startswith("held:") for p in problems), problems


def test_a_module_importing_a_call_the_host_does_not_implement_is_refused(tmp_path):
    wasm = tmp_path / "m.wasm"
    wasm.write_bytes(wasmtime.wat2wasm('(module (import "env" "proxy_get_log_level" '
                                       '(func (param i32) (result i32))))'))
    with pytest.raises(HostError, match="env.proxy_get_log_level"):
        Module(wasm)


def test_shared_data_keeps_envoy_s_versions_and_compare_and_swap(tmp_path):
    """The stand-in's shared data as Envoy's: one version counter for every key, a write with a stale
    version refused, a write without one always taken."""
    wat = """(module
      (import "env" "proxy_set_shared_data" (func $set (param i32 i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (data (i32.const 0) "kv")
      (func (export "put") (param $cas i32) (result i32)
        (call $set (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 1) (local.get $cas))))"""
    wasm = tmp_path / "shared.wasm"
    wasm.write_bytes(wasmtime.wat2wasm(wat))
    p = Process()
    vm = Vm(p, Module(wasm), "w")
    put = lambda cas: vm._call("put", cas)
    assert put(0) == 0 and p.shared[b"k"] == (b"v", 1)
    assert put(7) == 8, "a stale version: CasMismatch"
    assert put(1) == 0 and p.shared[b"k"][1] == 2
