"""Generates drain-gate.dashboard.json (Grafana, with grafana-foundation-sdk), the
same in a ConfigMap for Grafana's dashboard sidecar (drain-gate.dashboard.configmap.yaml)
and drain-gate.prometheusrule.yaml (drain-gate.rules.yaml wrapped for the Prometheus
Operator); and for the drain-gate chart's `observability` value (Helm reads no
file outside the chart) the rule groups and the dashboard under
envoyfilter/chart/files/. `make observability` runs it; a test regenerates
every file and compares it to the committed one.

    python -m envoyfilter.observability.generate [--check]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
)

HERE = Path(__file__).resolve().parent
RULES = HERE / "drain-gate.rules.yaml"
DASHBOARD = HERE / "drain-gate.dashboard.json"
PROMETHEUS_RULE = HERE / "drain-gate.prometheusrule.yaml"
DASHBOARD_CONFIGMAP = HERE / "drain-gate.dashboard.configmap.yaml"
CHART_FILES = HERE.parent / "chart" / "files"
CHART_RULES = CHART_FILES / "drain-gate.rules.yaml"
CHART_DASHBOARD = CHART_FILES / "drain-gate.dashboard.json"

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
POD = 'namespace=~"$namespace", pod=~"$pod"'
LEGEND = "{{namespace}}/{{pod}}"
STATES = [("OPEN", "green"), ("DRAINING", "yellow"), ("CLOSING", "orange"), ("CLOSED", "blue"), ("FAULT", "red")]
TRANSITIONS = ["open", "draining", "closing", "closed", "fault"]
# The drain-gate plugins Envoy runs, from its own per-plugin wasm stats.
PLUGINS = 'envoy_wasm_(.+_)?drain_gate_(health|traffic|tcp)(_canary)?(_istio_translated_wasmplugin)?_vm_reload'


def query(expr: str, legend: str = LEGEND, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def state_panel() -> statetimeline.Panel:
    mappings = ValueMap({str(i): ValueMappingResult(text=name, color=color, index=i)
                         for i, (name, color) in enumerate(STATES)})
    return (
        statetimeline.Panel()
        .title("State per gateway")
        .description("drain_gate_state: 0 OPEN, 1 DRAINING, 2 CLOSING, 3 CLOSED, 4 FAULT")
        .with_target(query(f"drain_gate_state{{{POD}}}"))
        .mappings([mappings])
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .fill_opacity(70).line_width(0)
        .height(8).span(24)
    )


def series_panel(title: str, description: str, targets: list[prometheus.Dataquery], unit: str = "short",
                 bars: bool = False) -> timeseries.Panel:
    panel = (
        timeseries.Panel().title(title).description(description).unit(unit).min(0)
        .line_width(1).fill_opacity(10).height(8).span(12)
    )
    for target in targets:
        panel = panel.with_target(target)
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
    return panel


def transitions_targets() -> list[prometheus.Dataquery]:
    return [
        query(f"increase(drain_gate_transitions_to_{t}{{{POD}}}[$__rate_interval])",
              f"{LEGEND} → {t.upper()}", chr(ord("A") + i))
        for i, t in enumerate(TRANSITIONS)
    ]


def stat_panel(title: str, description: str, expr: str, span: int = 6) -> stat.Panel:
    return (
        stat.Panel().title(title).description(description)
        .with_target(query(expr))
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]))
        .height(5).span(span)
    )


def variables(board: dash.Dashboard) -> dash.Dashboard:
    board = board.with_variable(dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    for name, selector in (("namespace", "drain_gate_state"), ("pod", 'drain_gate_state{namespace=~"$namespace"}')):
        board = board.with_variable(
            dash.QueryVariable(name).label(name).datasource(DATASOURCE)
            .query(f"label_values({selector}, {name})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True).include_all(True).all_value(".*")
        )
    return board


def dashboard() -> dict:
    board = (
        dash.Dashboard("drain-gate")
        .uid("drain-gate")
        .description("Ingress gateway drains: state, requests in flight and their age, transitions, forced closes, "
                     "what the LB cut, count health")
        .tags(["drain-gate", "istio", "envoy"])
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("10s")
    )
    board = variables(board)
    for i, panel in enumerate(panels(), start=1):
        board = board.with_panel(panel.id(i))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def panels() -> list:
    """The panels, top to bottom (Grafana lays them out left to right by span)."""
    return [
        state_panel(),
        series_panel("Active requests", "drain_gate_active_requests: HTTP streams in flight (all workers)",
                     [query(f"drain_gate_active_requests{{{POD}}}")]),
        series_panel("Oldest request in flight",
                     "drain_gate_oldest_in_flight_seconds: what a drain is waiting for (to one tick)",
                     [query(f"drain_gate_oldest_in_flight_seconds{{{POD}}}")], unit="s"),
        series_panel("Transitions", "transitions into each state", transitions_targets(), bars=True),
        series_panel("Time draining (last 10m)",
                     "seconds each gateway spent DRAINING or CLOSING in the last 10 minutes, sampled every 5s",
                     [query(f"count_over_time(((drain_gate_state{{{POD}}} >= 1) <= 2)[10m:5s]) * 5")], unit="s"),
        series_panel("Forced closes", "drains closed by drain_timeout with requests still in flight",
                     [query(f"increase(drain_gate_forced_closes{{{POD}}}[$__rate_interval])")], bars=True),
        series_panel("Cut in drains",
                     "streams and connections ended by the downstream during a drain: cut by the LB at its DOWN "
                     "(DrainGateCut pages), or given up by their clients (ordinary, no alert)",
                     [query(f"increase(drain_gate_cut_lb{{{POD}}}[$__rate_interval])", f"{LEGEND} cut by the LB", "A"),
                      query(f"increase(drain_gate_cut{{{POD}}}[$__rate_interval]) - "
                            f"increase(drain_gate_cut_lb{{{POD}}}[$__rate_interval])", f"{LEGEND} gave up", "B")],
                     bars=True),
        stat_panel("Cut by the LB (1h)",
                   "streams and connections the LB cut in drains in the last hour: 0 is a rollout that lost nothing",
                   f"max_over_time(drain_gate_cut_lb{{{POD}}}[1h]) - min_over_time(drain_gate_cut_lb{{{POD}}}[1h])"),
        stat_panel("Forced closes (1h)", "drain_timeout closes in the last hour",
                   f"increase(drain_gate_forced_closes{{{POD}}}[1h])"),
        stat_panel("Count errors (1h)", "streams the traffic role could not count: the count is unreliable",
                   f"increase(drain_gate_count_errors{{{POD}}}[1h])"),
        stat_panel("Count unreliable", "1: the health role distrusts the count; drains wait for drain_timeout",
                   f"drain_gate_count_unreliable{{{POD}}}"),
        stat_panel("drain-gate roles loaded",
                   "Envoy's own wasm stats: 2 = health and traffic roles, 1 = one is missing",
                   f'count by (namespace, pod) ({{__name__=~"{PLUGINS}", {POD}}})'),
    ]


def prometheus_rule() -> dict:
    rules = yaml.safe_load(RULES.read_text())
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "drain-gate", "labels": {"app.kubernetes.io/name": "drain-gate"}},
        "spec": rules,
    }


def dashboard_configmap(text: str) -> dict:
    """The dashboard for Grafana's sidecar, which loads ConfigMaps labelled grafana_dashboard: "1"."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "drain-gate-dashboard",
                     "labels": {"grafana_dashboard": "1", "app.kubernetes.io/name": "drain-gate"}},
        "data": {"drain-gate.json": text},
    }


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings as `|` blocks: the dashboard stays readable in the ConfigMap."""


_BlockDumper.add_representer(
    str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style="|" if "\n" in v else None))


def render() -> dict[Path, str]:
    """Every generated file and its text."""
    header = "# Generated by generate.py (`make observability`) from {}: edit that instead.\n"
    board = json.dumps(dashboard(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return {
        DASHBOARD: board,
        PROMETHEUS_RULE: header.format("drain-gate.rules.yaml")
        + yaml.safe_dump(prometheus_rule(), sort_keys=False, width=120),
        DASHBOARD_CONFIGMAP: header.format("generate.py's dashboard()")
        + yaml.dump(dashboard_configmap(board), Dumper=_BlockDumper, sort_keys=False, width=120, allow_unicode=True),
        CHART_RULES: header.format("../../observability/drain-gate.rules.yaml")
        + yaml.safe_dump(prometheus_rule()["spec"], sort_keys=False, width=120),
        CHART_DASHBOARD: board,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="fail if a committed file differs")
    args = ap.parse_args()
    stale = []
    for path, text in render().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run `make observability`)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
