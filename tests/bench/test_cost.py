"""The cost guard: what every path costs the shipped module may not grow unnoticed.

`tests/bench/cost.py` counts, on `target/drain_gate.wasm` in a proxy-wasm host stand-in, the wasm
instructions and the host calls of every path per stream. The counts are deterministic (two runs are the
same run), so they can be guarded exactly: a path whose instructions rise more than 5 % over the kept
baseline (`tests/bench/cost.json`) or fall more than 20 % under it, or whose host calls differ at all, fails
here with the difference; so does the health twin, the LB check's floor. Every path checks that it did its
work (`cost.PathError`), so a change that stopped counting streams fails instead of passing as cheaper.
Refreshing the baseline is a deliberate `make cost-baseline`, which also writes the table of tests/docs/cost.md.

The module must be the optimized one and the twin built (`make build health-twin`, after `make wasm-opt`):
under CI (`CI=true`) a missing one fails; elsewhere the tests that need it skip, saying why.
"""
from __future__ import annotations

import copy
import json
import re

import pytest
import wasmtime

from tests.bench import cost
from tests.bench.guard import optimized
from tests.bench.proxy_host import HostError, Module, Process, Vm


@pytest.fixture(scope="module")
def measured():
    if not cost.WASM.exists():
        pytest.fail(f"{cost.WASM} is missing: `make build` builds it")
    return cost.measure(optimized(cost.WASM, "build"), twin=None)


@pytest.fixture(scope="module")
def twin():
    return cost.twin_lb_check(Module(optimized(cost.HEALTH_TWIN_WASM, "health-twin")))


def test_every_path_costs_what_its_baseline_keeps(measured):
    base = json.loads(cost.BASELINE.read_text())
    problems = cost.compare(base, measured)
    assert not problems, (
        "the module's cost moved beyond what tests/bench/cost.json keeps:\n  " + "\n  ".join(problems)
        + "\n(a deliberate change: `make cost-baseline` keeps the new figures and writes tests/docs/cost.md's table)")


def test_the_health_twin_costs_what_the_baseline_keeps(twin):
    """The LB check's goal is measured against the twin: a twin that moved moves the goal."""
    base = json.loads(cost.BASELINE.read_text())
    problems = cost.compare({"paths": {}, "baselines": base["baselines"]},
                            {"paths": {}, "baselines": {"lb_check_twin": {"per": cost.TWIN[0], **twin}}})
    assert not problems, "\n  ".join(["the health twin moved:", *problems])


def test_make_cost_counts_the_same_again(measured, capsys):
    """`make cost`'s command: a second run writes what the first counted, and finds nothing dearer."""
    assert cost.main([]) == 0
    again = json.loads(cost.OUT.read_text())
    again["baselines"].pop("lb_check_twin", None)  # the twin, when built, is measured beside the module
    again["goals"] = [g for g in again["goals"] if not g["goal"].startswith("lb_check")]
    assert cost.dump(again) == cost.dump(measured)
    assert "against the baseline: every path within its bounds" in capsys.readouterr().out


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
    same["paths"]["draining"]["instructions"] *= 0.81
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
    twin = copy.deepcopy(base)
    twin["baselines"]["lb_check_twin"]["instructions"] *= 1.06
    assert [p.split(":")[0] for p in cost.compare(base, twin)] == ["lb_check_twin"]


def test_the_guard_fails_on_a_path_that_got_much_cheaper_or_lost_a_host_call():
    """A change that stops doing work must not pass as an improvement: 20 % fewer instructions, or one host
    call fewer, fails too, asking for a deliberate `make cost-baseline`."""
    base = json.loads(cost.BASELINE.read_text())
    cheaper = copy.deepcopy(base)
    cheaper["paths"]["open"]["instructions"] *= 0.79
    problems = cost.compare(base, cheaper)
    assert [p.split(":")[0] for p in problems] == ["open"] and "make cost-baseline" in problems[0], problems
    no_count = copy.deepcopy(base)
    row = no_count["paths"]["draining"]
    row["host_calls"] -= 2
    row["by_call"]["proxy_increment_metric"] -= 2
    problems = cost.compare(base, no_count)
    assert len(problems) == 2 and all(p.startswith("draining:") for p in problems), problems
    assert "fewer" in problems[0]


def test_a_path_that_did_not_count_its_streams_fails(monkeypatch):
    """`open` and `tcp_open` check on the host that each stream was counted while in flight and given back:
    a module whose streams went uncounted (the count stuck at 0) fails them, whatever it costs."""
    module = Module(optimized(cost.WASM, "build"))
    monkeypatch.setattr(cost.Gateway, "counted", lambda self, part="streams": 0)
    with pytest.raises(cost.PathError, match="not counted"):
        cost.path_open(module)
    with pytest.raises(cost.PathError, match="not counted"):
        cost.path_tcp_open(module)
    with pytest.raises(cost.PathError, match="the count reads 0"):
        cost.path_draining(module)


def test_a_count_that_follows_only_the_first_stream_of_a_lease_fails(monkeypatch):
    """The lease leads the truth, so one stream in flight proves little: the path also holds more than two
    leases of streams and sees the count rise to them, then fall to 0."""
    module = Module(optimized(cost.WASM, "build"))
    real = cost.Gateway.counted
    monkeypatch.setattr(cost.Gateway, "counted", lambda self, part="streams": min(real(self, part), cost.LEASE))
    with pytest.raises(cost.PathError, match="not every one counted"):
        cost.path_open(module)


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


OBSERVABILITY = cost.REPO / "envoyfilter" / "docs" / "observability.md"


def prose(page) -> str:
    """`page` without the table `make cost-baseline` writes, its lines joined."""
    text = page.read_text()
    if cost.BEGIN in text:
        text = text.split(cost.BEGIN, 1)[0] + text.split(cost.END, 1)[1]
    return re.sub(r"\s*\n\s*", " ", text)


def test_the_prose_quotes_the_baseline():
    """The figures the pages quote from the cost table are the kept baseline's: a refreshed baseline that moves
    one fails here until the sentence says what the table says."""
    base = json.loads(cost.BASELINE.read_text())
    p = base["paths"]
    o = p["open"]

    def over_open(name: str) -> tuple[str, str]:
        row = p[name]
        return f"{row['instructions'] - o['instructions']:,.0f}", f"{row['instructions'] / o['instructions']:.2f}"

    quotes = {
        cost.README: [
            (r"so `open` pays the lease once per (\d+): ([\d.]+) calls", (str(cost.STREAMS), f"{o['host_calls']:g}")),
            (r"\(`draining`\) costs a stream (\d+) host calls[^.]*?\+([\d,]+) instructions over `open` \(([\d.]+) ×\)",
             (f"{p['draining']['host_calls']:g}", *over_open("draining"))),
            (r"\(`held`\) costs a stream what `open` costs and the same property read: \+(\d+) host call and "
             r"\+([\d,]+) instructions over `open` \(([\d.]+) ×\)",
             (f"{p['held']['host_calls'] - o['host_calls']:g}", *over_open("held"))),
        ],
        OBSERVABILITY: [
            (r"`open` in the \[cost table\]\([^)]*\): ([\d,]+) wasm instructions per stream",
             (f"{o['instructions']:,.0f}",)),
        ],
    }
    for page, checks in quotes.items():
        text = prose(page)
        for pattern, want in checks:
            m = re.search(pattern, text)
            assert m, f"{page.relative_to(cost.REPO)}: no sentence quotes it any more: {pattern}"
            assert m.groups() == want, (f"{page.relative_to(cost.REPO)} quotes {m.groups()} where "
                                        f"tests/bench/cost.json says {want}: {m[0]}")
    # What it says the durations added: the difference of the two figures it quotes.
    m = re.search(r"([\d,]+) wasm instructions per stream, ([\d,]+) more than the ([\d,]+) of the baseline before",
                  prose(OBSERVABILITY))
    assert m, "envoyfilter/docs/observability.md no longer says what measuring durations added"
    now, more, before = (int(g.replace(",", "")) for g in m.groups())
    assert now - before == more, m[0]
