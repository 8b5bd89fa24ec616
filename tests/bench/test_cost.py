"""The cost guard: what every path costs the shipped module may not grow unnoticed.

`tests/bench/cost.py` counts, on `target/drain_gate.wasm` in a proxy-wasm host stand-in, the wasm
instructions and the host calls of every path per stream. The counts are deterministic (two runs are the
same run), so they can be guarded exactly: a path whose instructions rise more than 5 % over the kept
baseline (`tests/bench/cost.json`) or fall more than 20 % under it, or whose host calls differ at all, fails
here with the difference; so do the floors the paths are compared with: the health twin (the LB check's), the
no-op filter and its counting twin (`open`'s). Every path checks that it did its work (`cost.PathError`), so a
change that stopped counting streams fails instead of passing as cheaper; every floor, what the host can see of
its work. Refreshing the baseline is a deliberate `make cost-baseline`, which also writes the table of
tests/docs/cost.md.

The module must be the optimized one and the floors built (`make build health-twin noop`, after `make
wasm-opt`): under CI (`CI=true`) a missing one fails; elsewhere the tests that need it skip, saying why.
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
    return cost.measure(optimized(cost.WASM, "build"), baselines={})


def floors(*names: str) -> dict:
    """The floors `names`, each counted on its module as `make` builds it (missing: fails under CI, skips
    elsewhere)."""
    return cost.measure_baselines({n: optimized(cost.BASELINES[n][3], cost.BASELINES[n][4]) for n in names})


@pytest.fixture(scope="module")
def twin():
    return floors("lb_check_twin")


@pytest.fixture(scope="module")
def open_floors():
    return floors("open_noop", "open_twin")


def held_to_the_baseline(rows: dict) -> list[str]:
    base = json.loads(cost.BASELINE.read_text())
    kept = {name: base["baselines"][name] for name in rows if name in base["baselines"]}
    return cost.compare({"paths": {}, "baselines": kept}, {"paths": {}, "baselines": rows})


def test_every_path_costs_what_its_baseline_keeps(measured):
    base = json.loads(cost.BASELINE.read_text())
    problems = cost.compare(base, measured)
    assert not problems, (
        "the module's cost moved beyond what tests/bench/cost.json keeps:\n  " + "\n  ".join(problems)
        + "\n(a deliberate change: `make cost-baseline` keeps the new figures and writes tests/docs/cost.md's table)")


def test_the_health_twin_costs_what_the_baseline_keeps(twin):
    """The LB check's goal is measured against the twin: a twin that moved moves the goal."""
    problems = held_to_the_baseline(twin)
    assert not problems, "\n  ".join(["the health twin moved:", *problems])


def test_the_floors_of_open_cost_what_the_baseline_keeps(open_floors):
    """`open`'s goal is measured against the counting twin, and its cost over the no-op filter is what drain-gate
    adds to a stream: a floor that moved moves both."""
    problems = held_to_the_baseline(open_floors)
    assert not problems, "\n  ".join(["a floor of open moved:", *problems])


def test_open_s_goal_over_the_counting_twin_is_computed_from_the_rows():
    base = json.loads(cost.BASELINE.read_text())
    twin = base["baselines"]["open_twin"]["instructions"]

    def goal(open_instructions: float) -> dict:
        res = copy.deepcopy(base)
        res["paths"]["open"]["instructions"] = open_instructions
        return next(g for g in cost.goals(res) if g["goal"].startswith("open ≤ 1.15 × the counting twin"))

    assert goal(1.15 * twin)["met"] and goal(1.15 * twin)["measured"] == "1.150 ×"
    over = goal(1.15 * twin + 100)
    assert not over["met"] and over["miss"] == "+100 instructions per stream over the goal", over
    without = copy.deepcopy(base)
    del without["baselines"]["open_twin"]
    assert not any(g["goal"].startswith("open ≤") for g in cost.goals(without)), "a goal with no twin to measure"


# A floor of `open` written out: it exports every callback of the stream and lets it through. FAULT is put in its
# request headers' callback; EXPORT_LOG is the export its log callback has.
FLOOR_WAT = """(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "failed")
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) FAULT)
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "EXPORT_LOG") (param i32))
  (func (export "proxy_on_delete") (param i32)))"""
CONTINUE = "(i32.const 0)"


@pytest.mark.parametrize("fault, log_export, error", [
    (CONTINUE, "proxy_on_log", None),
    (CONTINUE, "on_log", "does not export proxy_on_log: the stream skips it"),
    ("(i32.const 1)", "proxy_on_log", "a stream was not forwarded"),
    ("(drop (call $log (i32.const 4) (i32.const 0) (i32.const 6))) (i32.const 0)", "proxy_on_log",
     "errors logged: \\['failed', "),
], ids=["lets-it-through", "skips-a-callback", "stops-the-request", "logs-an-error"])
def test_a_floor_that_skipped_a_callback_stopped_the_stream_or_logged_an_error_fails(tmp_path, fault, log_export,
                                                                                      error):
    """What the host sees of a floor's work: the first module (every callback exported, the stream let through,
    nothing logged) is counted; each of the others, one fault apart, fails."""
    wasm = tmp_path / "floor.wasm"
    wasm.write_bytes(wasmtime.wat2wasm(FLOOR_WAT.replace("FAULT", fault).replace("EXPORT_LOG", log_export)))
    if error is None:
        assert cost.measure_baselines({"open_noop": wasm})["open_noop"]["n"] == cost.STREAMS * cost.WORKERS
        return
    with pytest.raises(cost.PathError, match=f"floor open_noop: (floor.wasm )?{error}"):
        cost.measure_baselines({"open_noop": wasm})


def test_a_counting_twin_no_dearer_than_the_no_op_fails():
    """The twin's count is in its own memory, out of the host's sight; what the host sees of it is its cost over
    the no-op's. The no-op counted in the twin's place fails."""
    noop = optimized(cost.NOOP_WASM, "noop")
    twin = optimized(cost.TWIN_WASM, "noop")
    assert cost.measure_baselines({"open_noop": noop, "open_twin": twin})  # the control: the real twin passes
    with pytest.raises(cost.PathError, match="the twin's per-stream structure did not run"):
        cost.measure_baselines({"open_noop": noop, "open_twin": noop})


def test_make_cost_counts_the_same_again(measured, capsys):
    """`make cost`'s command: a second run writes what the first counted, and finds nothing dearer."""
    assert cost.main([]) == 0
    again = json.loads(cost.OUT.read_text())
    again["baselines"] = {}  # the floors, when built, are counted beside the module; their goals with them
    again["goals"] = cost.goals(again)
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
    assert set(cost.BASELINES) == set(base["baselines"]), "the baseline does not have every floor"


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
