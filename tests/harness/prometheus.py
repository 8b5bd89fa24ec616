"""Start and stop a real Prometheus that scrapes Envoys and evaluates drain-gate's rules.

The binary is Debian's `prometheus` (2.42), run in the foreground as a child on
a free loopback port with its own TSDB directory — never the system service.
It scrapes each Envoy's admin `/stats/prometheus` every second and evaluates
envoyfilter/observability/drain-gate.rules.yaml, as written, every second.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import requests
import yaml

from tests.harness.envoy import REPO, free_port
from tests.harness.process import Child
from tests.harness.timeline import parse_time

RULES = REPO / "envoyfilter" / "observability" / "drain-gate.rules.yaml"
NAMESPACE = "gateways"


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if not path:
        raise RuntimeError("prometheus is not installed: run `make deps` (Debian package `prometheus`)")
    return path


def scrape_config(targets: dict[str, int], interval: str = "1s") -> dict:
    """prometheus.yml: one job; each target an Envoy admin port, labelled like a Kubernetes pod."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "drain-gate",
                "metrics_path": "/stats/prometheus",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": NAMESPACE, "pod": pod}}
                    for pod, port in targets.items()
                ],
            }
        ],
    }


class Prometheus(Child):
    """One Prometheus process; stopped on every exit path (use as a context manager)."""

    name = "prometheus"

    def __init__(self, targets: dict[str, int], workdir: Path):
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir / "prometheus.log")
        self.port = free_port()
        self.workdir = workdir
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(scrape_config(targets), sort_keys=False))

    def start(self, timeout: float = 30) -> "Prometheus":
        self.spawn([
            prometheus_binary(),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ])
        self.wait_until(self._ready, timeout, "prometheus /-/ready")
        return self

    def _ready(self) -> bool:
        try:
            return requests.get(self.url("/-/ready"), timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    # -- HTTP API -----------------------------------------------------------
    def _api(self, path: str, **params) -> dict | list:
        body = requests.get(self.url(f"/api/v1/{path}"), params=params, timeout=5).json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's vector (or a scalar/string as a one-element list)."""
        data = self._api("query", query=expr)
        result = data["result"]
        return result if data["resultType"] in ("vector", "matrix") else [{"value": result}]

    def value(self, expr: str) -> float | None:
        """The single value of an instant query, or None when it returns nothing."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def query_range(self, expr: str, start: float, end: float, step: float = 1) -> list[dict]:
        return self._api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def alerts(self, name: str, state: str = "firing") -> list[dict]:
        """The label sets of `name` in ALERTS with alertstate `state`."""
        return [r["metric"] for r in self.query(f'ALERTS{{alertname="{name}",alertstate="{state}"}}')]

    def rule(self, name: str) -> dict:
        for group in self._api("rules")["groups"]:
            for rule in group["rules"]:
                if rule["name"] == name:
                    return rule
        raise KeyError(f"no rule {name} loaded (rules: {RULES})")

    def evaluated_since(self, name: str, t: float) -> bool:
        """Whether `name` has been evaluated after the wall-clock time `t`."""
        last = self.rule(name).get("lastEvaluation", "")
        return bool(last) and parse_time(last) > t
