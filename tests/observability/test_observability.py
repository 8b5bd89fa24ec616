"""The alerting rules and the Grafana dashboard in envoyfilter/observability/.

- promtool accepts the rules file; the PrometheusRule and the dashboard are what
  generate.py makes today, and the dashboard loads back into the SDK's model.
- Live: a real Envoy running drain-gate, a real Prometheus 2.42 scraping its
  `/stats/prometheus` every second and evaluating the rules file as written
  every second. A clean drain - whose one stream's client gives up by itself
  (a cut, not the LB's) - leaves DrainGateForcedClose and DrainGateCut
  inactive; a drain forced by drain_timeout with a stream held makes
  DrainGateForcedClose fire for that pod, and once the test, playing the LB
  checker, has been served lb_fall 503s and resets the stream (the LB's
  shutdown-sessions at DOWN), DrainGateCut fires too, and the query that
  answers "did the rollout cut anything?" reads exactly the receipt's count.
  Every dashboard query returns data during the drain. A second Envoy without
  the health listener is the control for the role alerts' expressions.
- Live, a pod killed mid-drain: the rig's kubelet (tests/fleet/fleet.py) runs
  drain-gate's preStop for a 3 s grace period with a stream held, then SIGTERM
  (pilot-agent's readiness turns 503) and, 2 s later, SIGKILL: the gateway's
  receipt line says ended=SIGTERM, and DrainGateDrainCutShort fires in the real
  Prometheus that scraped it. The control: a pod whose drain reaches CLOSED
  within its grace period, the same rig, no line with ended=SIGTERM and no alert.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import yaml

from envoyfilter.observability import generate
from tests.fleet import fleet
from tests.harness import variants, wire
from tests.harness.envoy import REPO, Envoy, Ports, render, wait_for
from tests.harness.prometheus import NAMESPACE, RULES, Prometheus

POD = "gateway-0"
LONE = "gateway-traffic-only"
FORCED = "DrainGateForcedClose"
CUT = "DrainGateCut"
# "Did the last rollout cut anything?": the streams and connections the LB cut in drains over the
# last hour, per namespace (envoyfilter/docs/observability.md, Observability). Exact: no extrapolation.
ROLLOUT_CUT = ("sum by (namespace) (max_over_time(drain_gate_cut_lb[1h]) - min_over_time(drain_gate_cut_lb[1h]))")
RECEIPTS = REPO / "out" / "observability" / "receipts.log"
# The variables Grafana substitutes: every namespace and pod, its default rate window.
GRAFANA_VARS = {"$namespace": ".*", "$pod": ".*", "$__rate_interval": "1m"}
SAVED = REPO / "out" / "observability" / "drain.json"


def all_rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def rules() -> dict[str, dict]:
    """The alerting rules by name (the recording rules have no `alert`)."""
    return {r["alert"]: r for r in all_rules() if "alert" in r}


def panel_queries() -> list[tuple[str, str, str]]:
    """(panel title, legend, PromQL) of every target, with Grafana's variables substituted."""
    out = []
    for panel in generate.dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], target["legendFormat"], expr))
    return out


# -- static -------------------------------------------------------------------
def test_promtool_accepts_the_rules():
    if not shutil.which("promtool"):
        pytest.fail("promtool is missing: `make deps` installs the Debian prometheus package")
    run = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(all_rules())} rules found" in run.stdout


def test_every_alert_has_summary_pod_or_node_description_and_a_readme_runbook():
    readme = (REPO / "envoyfilter" / "docs" / "runbooks.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", readme, re.M)}
    for name, rule in rules().items():
        ann = rule["annotations"]
        # A pod's alert names the pod; a node's (kube-state-metrics: no pod to name), the node.
        assert ann["summary"] and re.search(r"\{\{ \$labels\.(pod|node) \}\}", ann["description"]), name
        assert ann["runbook_url"] == f"envoyfilter/docs/runbooks.md#{name.lower()}", name
        assert name.lower() in anchors, f"envoyfilter/docs/runbooks.md has no runbook section `{name}`"


def emitted_metrics() -> set[str]:
    """The drain_gate_* names of the one list in src/ that names every metric drain-gate emits."""
    homes = [f for f in (REPO / "src").rglob("*.rs") if re.search(r"pub const ALL: \[Metric", f.read_text())]
    assert len(homes) == 1, homes
    return set(re.findall(r'"(drain_gate_[a-z_]+)"', homes[0].read_text()))


def test_alerts_and_dashboard_use_the_emitted_metric_names():
    emitted = emitted_metrics()
    used = set()
    for text in [RULES.read_text()] + [expr for _, _, expr in panel_queries()]:
        names = re.sub(r"\{[^}]*\}", "", text)  # label matchers hold values, not metric names
        used |= {m for m in re.findall(r"drain_gate_[a-z_]+", names) if not m.endswith("_vm_reload")}
    # A histogram's series are its name's _bucket, _count and _sum.
    used = {re.sub(r"_(bucket|count|sum)$", "", m) if re.sub(r"_(bucket|count|sum)$", "", m) in emitted else m
            for m in used}
    assert used and used <= emitted, used - emitted


def test_every_alert_has_a_promtool_unit_test():
    text = (REPO / "tests" / "observability" / "drain-gate.rules.test.yaml").read_text()
    tested = set(re.findall(r"alertname: (\w+)", text))
    assert tested == set(rules()), set(rules()) ^ tested


def test_generated_files_are_up_to_date():
    for path, text in generate.render().items():
        assert path.read_text() == text, f"{path.name} is stale: run `make observability`"


def test_prometheus_rule_wraps_the_rules_file():
    obj = yaml.safe_load(generate.PROMETHEUS_RULE.read_text())
    assert (obj["apiVersion"], obj["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert obj["spec"] == yaml.safe_load(RULES.read_text())


def test_dashboard_configmap_is_valid_and_carries_the_dashboard():
    import kubernetes_validate

    obj = yaml.safe_load(generate.DASHBOARD_CONFIGMAP.read_text())
    kubernetes_validate.validate(obj, kubernetes_validate.utils.latest_version(), strict=True)
    assert obj["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(obj["data"]["drain-gate.json"]) == json.loads(generate.DASHBOARD.read_text())


def test_dashboard_loads_in_the_sdk_model():
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard
    from grafana_foundation_sdk.models.prometheus import Dataquery

    register_default_plugins()
    committed = json.loads(generate.DASHBOARD.read_text())
    model = Dashboard.from_json(committed)
    assert [p.title for p in model.panels] == [p["title"] for p in committed["panels"]]
    assert all(isinstance(t, Dataquery) for p in model.panels for t in p.targets)
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == committed


# -- live -----------------------------------------------------------------------
def _post(gw, path: str) -> None:
    r = wire.post(gw, path)
    assert r.status_code == 200, (path, r.status_code, r.text)


def _seen(prom: Prometheus, expr: str, value: float, what: str, timeout: float = 20) -> float:
    """Waits until Prometheus reads `value` for `expr`; returns the wall-clock time it did."""
    wait_for(lambda: prom.value(expr) == value, timeout, interval=0.2, what=what)
    return time.time()


def traffic_only(backend_port: int, workdir) -> Envoy:
    """An Envoy whose bootstrap lost the health listener: the traffic role alone."""
    ports = Ports(backend=backend_port)
    return Envoy(variants.without_listener(render(ports), "drain-gate-health"), ports, workdir=workdir)


def test_live_forced_close_and_lb_cut_fire_and_clean_drain_does_not(gateway, stream, backend_port, tmp_path):
    # One worker: that it sorts the ends of a drain is observable (a request completed in it is counted).
    gw = gateway({"drain_timeout": "4s", "lb_buffer": "60s"}, concurrency=1)
    lone = traffic_only(backend_port, tmp_path / "traffic-only")
    try:
        lone.start(wait_ready=False)
        wait_for(lone.admin_ready, 30, interval=0.1, what="the traffic-only Envoy ready")
        _live(gw, stream, {POD: gw.ports.admin, LONE: lone.ports.admin}, tmp_path / "prometheus")
    finally:
        lone.stop()


def _live(gw, stream, targets: dict[str, int], workdir) -> None:
    with Prometheus(targets, workdir) as prom:
        start = time.time()
        sel = f'{{namespace="{NAMESPACE}",pod="{POD}"}}'
        _seen(prom, f"drain_gate_state{sel}", 0, "the gateway scraped, OPEN")
        _role_alerts_match_envoy_stats(prom)

        # A clean drain: its one stream's client gives up by itself during it (a cut, not the
        # LB's), and the flip follows at once, not forced.
        quitter = stream(gw.traffic("/stream?seconds=40"))
        wait_for(lambda: wire.status(gw)["active"] == 1, 10, what="the stream counted")
        _post(gw, "/drain")
        wait_for(lambda: wire.fresh_get(gw.ports.traffic, "/")[0] == 200
                 and wire.status(gw)["receipt"]["completed"] >= 1, 10, what="the worker sorting the drain's ends")
        quitter.kill()
        wait_for(lambda: wire.status(gw)["state"] == "CLOSING", 10, what="clean drain reaches CLOSING")
        assert wire.status(gw)["progress"]["forced"] is False
        # The worker adds the cut to the drain's receipt at its next tick.
        r = wait_for(lambda: (r := wire.status(gw)["receipt"])["cut"] == 1 and r, 5, what="the client's cut counted")
        assert r["cut_lb"] == 0, r
        _seen(prom, f"drain_gate_transitions_to_closing{sel}", 1, "the clean close scraped")
        seen = _seen(prom, f"drain_gate_cut{sel}", 1, "the client's cut scraped")
        for alert in (FORCED, CUT):
            wait_for(lambda: prom.evaluated_since(alert, seen), 10, interval=0.2, what=f"{alert} evaluated after it")
            assert prom.rule(alert)["state"] == "inactive", alert
            assert prom.alerts(alert, "firing") == [] and prom.alerts(alert, "pending") == [], alert
        assert _rollout_cut(prom) == 0

        # A drain forced by drain_timeout with a stream held.
        _post(gw, "/reopen")
        held = stream(gw.traffic("/stream?seconds=40"))
        wait_for(lambda: wire.status(gw)["active"] == 1, 10, what="the held stream counted")
        _post(gw, "/drain")
        _seen(prom, f"drain_gate_state{sel}", 1, "DRAINING scraped")
        wait_for(lambda: wire.status(gw)["progress"]["forced"] is True, 15, what="drain_timeout forces CLOSING")
        firing = wait_for(lambda: prom.alerts(FORCED, "firing"), 20, interval=0.2, what=f"{FORCED} firing")
        assert [(a["namespace"], a["pod"]) for a in firing] == [(NAMESPACE, POD)]
        assert held.running(), "the gateway itself never cuts the held stream"
        assert prom.alerts(CUT, "firing") == [], "nothing cut yet: the LB has not marked it DOWN"

        # The LB: its lb_fall-th 503 marks the gateway DOWN, and shutdown-sessions resets the stream.
        for _ in range(2):
            assert requests.get(gw.health("/health_check.html"), timeout=5).status_code == 503
        held.kill()
        r = wait_for(lambda: (r := wire.status(gw)["receipt"])["cut_lb"] == 1 and r, 5, what="the LB's cut counted")
        assert (r["cut"], r["cut_other"]) == (1, 0), r
        firing = wait_for(lambda: prom.alerts(CUT, "firing"), 20, interval=0.2, what=f"{CUT} firing")
        assert [(a["namespace"], a["pod"], a["severity"]) for a in firing] == [(NAMESPACE, POD, "critical")]
        assert _rollout_cut(prom) == 1, "the query reads the receipt's count exactly"

        _every_panel_returns_data(prom)
        _save(prom, start)
        _post(gw, "/close")
        receipts = wait_for(lambda: len(found := re.findall(r"event=drain_receipt .*", gw.log())) == 2 and found,
                            10, what="both drains' receipt lines")
        assert "ended=OPEN" in receipts[0] and " cut=1 " in receipts[0] and " cut_lb=0 " in receipts[0], receipts
        assert "ended=CLOSED forced=true" in receipts[1] and " cut_lb=1 " in receipts[1], receipts
        RECEIPTS.parent.mkdir(parents=True, exist_ok=True)
        RECEIPTS.write_text("\n".join(receipts) + "\n")


CUT_SHORT = "DrainGateDrainCutShort"


def _receipt_lines(pod: fleet.Pod) -> list[dict]:
    return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            for line in re.findall(r"event=drain_receipt .*", pod.envoy.log())]


def test_a_pod_killed_mid_drain_leaves_a_cut_short_receipt_and_pages(backend_port, stream, tmp_path):
    strategy = fleet.strategies(1.0)["drain-gate-200"]
    cut = fleet.Pod("gateway-cut", backend_port, strategy, tmp_path, grace_s=3.0)
    # The control closes 1 s after its flip whether or not an LB checks it: its preStop returns at CLOSED.
    closes = dataclasses.replace(strategy, config={**strategy.config, "close_after": "lb_buffer"})
    done = fleet.Pod("gateway-done", backend_port, closes, tmp_path, grace_s=30.0)
    try:
        for pod in (cut, done):
            pod.start()
        with Prometheus({cut.name: cut.ports.admin, done.name: done.ports.admin}, tmp_path / "prometheus") as prom:
            for pod in (cut, done):
                _seen(prom, f'drain_gate_drains_cut_short{{pod="{pod.name}"}}', 0, f"{pod.name} scraped")
            held = stream(cut.envoy.traffic("/stream?seconds=40"))  # the drain cannot end within 3 s
            wait_for(lambda: wire.status(cut.envoy)["active"] == 1, 10, what="the held stream counted")
            for pod in (cut, done):
                pod.delete()  # the kubelet: preStop, SIGTERM, SIGKILL
            for pod in (cut, done):
                pod.wait_exit(40)
            assert held.wait(10) != 0, "the stream ended with the pod"
            assert cut.exit_at - cut.sigterm_at >= fleet.MIN_GRACE_S - 0.1
            lines = _receipt_lines(cut)
            assert [line["ended"] for line in lines] == ["SIGTERM"], lines
            assert lines[0]["closed"] == "-" and "event=sigterm_before_closed state=DRAINING" in cut.envoy.log()
            assert [line["ended"] for line in _receipt_lines(done)] == ["CLOSED"], "the control drained"
            firing = wait_for(lambda: prom.alerts(CUT_SHORT, "firing"), 20, interval=0.2, what=f"{CUT_SHORT} firing")
            assert [(a["pod"], a["severity"]) for a in firing] == [(cut.name, "critical")]
            seen = time.time()
            wait_for(lambda: prom.evaluated_since(CUT_SHORT, seen), 10, interval=0.2, what="evaluated again")
            assert [a["pod"] for a in prom.alerts(CUT_SHORT, "firing")] == [cut.name], "not the pod that drained"
    finally:
        for pod in (cut, done):
            pod.stop()


def _rollout_cut(prom: Prometheus) -> float:
    result = prom.query(ROLLOUT_CUT)
    assert [r["metric"].get("namespace") for r in result] == [NAMESPACE], result
    return float(result[0]["value"][1])


def _role_alerts_match_envoy_stats(prom: Prometheus) -> None:
    """Envoy's per-plugin wasm stats exist under the names the role alerts match: the
    health-role-missing expression finds the traffic-only Envoy and nothing else, and
    the traffic-role-missing one finds nothing."""
    def plugins():
        found = {}
        for r in prom.query(f'{{__name__=~"{generate.PLUGINS}"}}'):
            found.setdefault(r["metric"]["pod"], []).append(r["metric"]["__name__"])
        return len(found) == 2 and found

    found = wait_for(plugins, 15, interval=0.2, what="both Envoys' wasm plugin stats scraped")
    assert sorted(found[POD]) == ["envoy_wasm_drain_gate_health_vm_reload", "envoy_wasm_drain_gate_traffic_vm_reload"]
    assert found[LONE] == ["envoy_wasm_drain_gate_traffic_vm_reload"]
    missing = {name: [r["metric"]["pod"] for r in prom.query(rules()[name]["expr"])]
               for name in ("DrainGateHealthRoleMissing", "DrainGateTrafficRoleMissing")}
    assert missing == {"DrainGateHealthRoleMissing": [LONE], "DrainGateTrafficRoleMissing": []}


def _every_panel_returns_data(prom: Prometheus) -> None:
    for title, _, expr in panel_queries():
        wait_for(lambda: prom.query(expr), 15, interval=0.25, what=f"panel {title!r}: {expr}")


def _save(prom: Prometheus, start: float) -> None:
    """What envoyfilter/docs/observability.md's dashboard picture is drawn from (`make dashboard-png`): every
    panel's series from the start up to a 1 s step that shows the alerts firing."""
    firing = f'ALERTS{{alertname="{CUT}",alertstate="firing"}}'
    end = wait_for(lambda: prom.query_range(firing, start, time.time()) and time.time(), 10,
                   interval=0.25, what="the firing alert on a range step")
    series = [{"panel": title, "legend": legend, "result": prom.query_range(expr, start, end)}
              for title, legend, expr in panel_queries() if "[1h]" not in expr]
    series.append({"panel": "ALERTS", "legend": f"{FORCED}, {CUT}",
                   "result": prom.query_range(f'ALERTS{{alertname=~"{FORCED}|{CUT}"}}', start, end)})
    SAVED.parent.mkdir(parents=True, exist_ok=True)
    SAVED.write_text(json.dumps({"start": start, "end": end, "series": series}))


# -- what a drain waits for --------------------------------------------------------
def _ages_bounds(started: tuple[float, float], read: tuple[float, float], tick: float) -> tuple[float, float]:
    """The age /drain/status may report (s) for a stream started between `started` (curl launched,
    the stream counted) and read between `read`: a stream is stamped with the last tick before it."""
    return read[0] - started[1], read[1] - started[0] + tick


def _start_held(gw, stream, expect_active: int) -> tuple[object, tuple[float, float]]:
    t0 = time.time()
    held = stream(gw.traffic("/stream?seconds=30"))
    wait_for(lambda: wire.status(gw)["active"] >= expect_active, 10, what=f"{expect_active} streams counted")
    return held, (t0, time.time())


def _read(gw) -> tuple[dict, tuple[float, float]]:
    t0 = time.time()
    doc = wire.status(gw)
    return doc, (t0, time.time())


def test_in_flight_ages_read_back_within_one_tick(gateway, stream):
    tick = 0.1
    gw = gateway({"tick": "100ms", "drain_timeout": "60s"})
    first, a = _start_held(gw, stream, 1)
    wait_for(lambda: (wire.status(gw)["in_flight"]["oldest_age_ms"] or 0) >= 2500, 10, what="the first stream 2.5 s old")
    second, b = _start_held(gw, stream, 2)
    wait_for(lambda: sum(wire.status(gw)["in_flight"]["ages"].values()) == 2, 5, what="both streams published")
    for phase in ("OPEN", "DRAINING"):
        if phase == "DRAINING":
            _post(gw, "/drain")
        doc, r = _read(gw)
        assert doc["state"] == phase
        lo, hi = _ages_bounds(a, r, tick)
        assert lo <= doc["in_flight"]["oldest_age_ms"] / 1000 <= hi, (phase, lo, hi, doc["in_flight"])
        ages = doc["in_flight"]["ages"]
        assert ages["lt_10s"] >= 1 and ages["lt_60s"] == ages["ge_60s"] == 0, ages
        b_lo, b_hi = _ages_bounds(b, r, tick)
        if b_hi < 1:  # the second stream's age is known to be under a second
            assert (ages["lt_1s"], ages["lt_10s"]) == (1, 1), (b_lo, b_hi, ages)
    # The gauge is whole seconds, set by the health role's last tick (at most one tick ago).
    t0 = time.time()
    gauge = gw.stat("wasmcustom.drain_gate_oldest_in_flight_seconds")
    lo, hi = _ages_bounds(a, (t0 - tick, time.time()), tick)
    assert int(lo) <= gauge <= int(hi), (lo, gauge, hi)
    first.kill()
    second.kill()
    wait_for(lambda: wire.status(gw)["in_flight"]["oldest_age_ms"] is None, 5, what="no stream in flight")
    assert wire.status(gw)["in_flight"]["ages"] == {"lt_1s": 0, "lt_10s": 0, "lt_60s": 0, "ge_60s": 0}


# -- how long are the requests? ----------------------------------------------------
P99 = 'drain_gate:request_duration_seconds:p99_1h{histogram="drain_gate"}'
P999 = 'drain_gate:request_duration_seconds:p999_1h{histogram="drain_gate"}'


def _recorded(prom: Prometheus, expr: str) -> float | None:
    """A recorded percentile, once the rule has seen an increase (NaN before it)."""
    value = prom.value(expr)
    return None if value is None or math.isnan(value) else value


def _get_all(gw, path: str, n: int, workers: int) -> None:
    with ThreadPoolExecutor(workers) as pool:
        codes = list(pool.map(lambda _: requests.get(gw.traffic(path), timeout=30).status_code, range(n)))
    assert codes == [200] * n, codes


def test_request_duration_rules_read_known_durations_from_real_envoy(gateway, tmp_path):
    """The recipe for sizing drain_timeout: the recording rules, evaluated by a real
    Prometheus on drain-gate's stream-duration histogram in a real Envoy, put the 99th and
    99.9th percentiles in the bucket of the requests whose duration the test chose — first
    200 requests of 20 ms (p99 at most 0.5 s: a duration is measured on the 100 ms ticks and
    rounded up to its tick, never down, and a tick a busy worker runs late adds to it), then 4 more
    of 3 s (p99 in (2.5, 5] s, the exported bucket around 3 s)."""
    gw = gateway()
    with Prometheus({POD: gw.ports.admin}, tmp_path / "prometheus") as prom:
        _get_all(gw, "/slow?ms=1", 1, 1)  # the histogram exists before the load is counted
        count = f'drain_gate_stream_duration_ms_count{{pod="{POD}"}}'
        wait_for(lambda: (prom.value(count) or 0) >= 1, 30, interval=0.5, what="the histogram scraped")

        _get_all(gw, "/slow?ms=20", 200, 10)
        fast = wait_for(lambda: (prom.value(count) or 0) >= 201 and _recorded(prom, P99), 30, interval=0.5,
                        what="200 short requests recorded")
        assert 0 < fast <= 0.5, fast

        _get_all(gw, "/slow?ms=3000", 4, 4)
        wait_for(lambda: (prom.value(count) or 0) >= 205 and (_recorded(prom, P99) or 0) > 2.5, 30, interval=0.5,
                 what="4 requests of 3 s recorded")
        assert 2.5 < prom.value(P99) <= 5.0
        assert 2.5 < prom.value(P999) <= 5.0


def test_readme_sizing_table_follows_its_arithmetic():
    """Each row of envoyfilter/docs/observability.md's sizing table is the rule it states: drain_timeout =
    max(D + 30 s, 120 s), grace = drain_timeout + lb_buffer + 15 s; every duration
    parses as drain-gate configuration would (at most 60m)."""
    text = (REPO / "envoyfilter" / "docs" / "observability.md").read_text()
    table = re.search(r"<!-- sizing:.*?-->\n(.*?)<!-- /sizing -->", text, re.S)
    assert table, "envoyfilter/docs/observability.md has no sizing table"
    rows = re.findall(r"^\| (\d+) s \| `(\d+)s` \| `(\d+)s` \| (\d+) \|$", table[1], re.M)
    assert len(rows) >= 3, table[1]
    for d, timeout, buffer, grace in (tuple(map(int, r)) for r in rows):
        assert timeout == max(d + 30, 120) and timeout <= 3600, (d, timeout)
        assert grace == timeout + buffer + 15, (d, grace)
