"""Draws envoyfilter/docs/observability.md's dashboard picture from the Prometheus data the live test saved
(tests/observability/test_observability.py writes out/observability/drain.json):

    python -m tests.observability.render out/observability/drain.json PNG
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from envoyfilter.observability.generate import STATES  # noqa: E402

PANELS = ["State per gateway", "Active requests", "Oldest request in flight", "Transitions", "Forced closes",
          "Cut in drains"]


def points(result: list[dict], t0: float):
    for r in result:
        xs = [float(t) - t0 for t, _ in r["values"]]
        ys = [float(v) for _, v in r["values"]]
        yield r["metric"], xs, ys


def legend(template: str, metric: dict) -> str:
    return re.sub(r"\{\{(\w+)\}\}", lambda m: metric.get(m[1], ""), template)


def draw(data: dict, out: Path) -> None:
    t0 = data["start"]
    fig, axes = plt.subplots(len(PANELS) + 1, 1, figsize=(12, 12), sharex=True)
    for ax, title in zip(axes, PANELS):
        for s in (s for s in data["series"] if s["panel"] == title):
            for metric, xs, ys in points(s["result"], t0):
                if title == "Transitions" and not any(ys):
                    continue  # the transitions that never happened would only crowd the legend
                ax.step(xs, ys, where="post", label=legend(s["legend"], metric))
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_yticks(range(len(STATES)), [name for name, _ in STATES])
    alerts = axes[-1]
    alert_series = next(s["result"] for s in data["series"] if s["panel"] == "ALERTS")
    for metric, xs, _ in points(alert_series, t0):
        y = (1 if metric["alertstate"] == "firing" else 0.5) + (0.15 if metric["alertname"] == "DrainGateCut" else 0)
        alerts.plot(xs, [y] * len(xs), "o", ms=3, label=f'{metric["alertname"]} {metric["alertstate"]}')
    alerts.set_title("ALERTS (DrainGateForcedClose, DrainGateCut)", loc="left", fontsize=10)
    alerts.set_yticks([0.5, 1], ["pending", "firing"])
    alerts.set_ylim(0, 1.5)
    alerts.set_xlabel("seconds since Prometheus started: a drain whose client gives up; reopen; a stream held, "
                      "drain forced at drain_timeout (4 s); the LB's cut")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("drain-gate: two Envoys scraped by Prometheus every 1 s (live test data; gateway-traffic-only has no health role)")
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def main() -> int:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    draw(json.loads(src.read_text()), out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
