"""The rollout on one picture: a panel per strategy, a row per gateway.

Each row is the gateway's life from start to exit, coloured by what HAProxy had it as (UP, NOLB,
DOWN); ▼ marks its deletion (preStop start), | SIGTERM, ■ exit; a red × each lost request on the
row of the gateway that served it (row "(none)": HAProxy found no server).
"""
from __future__ import annotations

import warnings
from pathlib import Path

from tests.harness.timeline import _HAP_COLORS, _segments


def _rows(tl: dict) -> list[str]:
    names = [p["name"] for p in tl["pods"]]
    return names + (["(none)"] if any(not o["server"] for o in tl["lost"]) else [])


def _panel(ax, name: str, r: dict, x0: float, x1: float) -> None:
    tl = r["timeline"]
    t0 = tl["t0"]
    rows = _rows(tl)
    y_of = {n: len(rows) - 1 - i for i, n in enumerate(rows)}
    for pod in tl["pods"]:
        if not pod["created_at"]:
            continue
        y, start = y_of[pod["name"]], pod["created_at"] - t0
        stop = (pod["exit_at"] or t0 + x1) - t0
        points = [(start, "starting")] + [(c["t"] - t0, c["status"].split()[0] if c["status"] else "UP")
                                      for c in tl["haproxy"] if c["server"] == pod["name"]]
        points = sorted(p for p in points if p[0] >= start - 1)
        for s, w, v in _segments(points, max(start, x0), stop):
            ax.broken_barh([(s, w)], (y + 0.2, 0.6), facecolors=_HAP_COLORS.get(v, "#dddddd"))
        for key, marker in (("deleted_at", "v"), ("sigterm_at", "|"), ("exit_at", "s")):
            if pod[key]:
                ax.plot([pod[key] - t0], [y + 0.5], marker=marker, color="black", markersize=6)
    for o in tl["lost"]:
        if o["end"]:
            ax.plot([o["end"] - t0], [y_of[o["server"] or "(none)"] + 0.5], marker="x", color="#de2d26",
                    markersize=7, mew=1.5)
    ax.set_yticks([v + 0.5 for v in y_of.values()], list(y_of), fontsize=7)
    ax.set_ylim(0, len(rows))
    ax.set_xlim(x0, x1)
    lost = ", ".join(f"{k} {r['lost'][k]}/{r['sent'][k]}" for k in r["lost"])
    ax.set_title(f"{name}: lost {lost}; rollout {r['rollout_s']:.0f} s", fontsize=8,
                 color="#de2d26" if sum(r["lost"].values()) else "black")
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", color="#eeeeee")


def render(result: dict, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        matplotlib.rcParams["svg.hashsalt"] = "drain-gate"
        matplotlib.rcParams["svg.fonttype"] = "none"
        items = list(result["strategies"].items())
        x0 = -12.0
        x1 = max(r["rollout_s"] for _, r in items) + 8
        rows = max(len(_rows(r["timeline"])) for _, r in items)
        fig, axes = plt.subplots(len(items), 1, figsize=(9, 0.6 + (0.32 * rows + 0.5) * len(items)),
                                 squeeze=False, sharex=True)
        for ax, (name, r) in zip(axes[:, 0], items):
            _panel(ax, name, r, x0, x1)
        axes[-1, 0].set_xlabel("seconds since the first new gateway started", fontsize=8)
        fig.suptitle(f"Rolling update of {result['n']} gateways behind HAProxy (maxSurge 1, maxUnavailable 0)",
                     fontsize=10)
        fig.text(0.5, 0.005, "grey starting · HAProxy: green UP · orange NOLB · red DOWN    ▼ deleted (preStop) · | SIGTERM · "
                 "■ exit    × lost request", ha="center", fontsize=7)
        fig.tight_layout(rect=(0, 0.02, 1, 0.97))
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="svg", metadata={"Date": None})
        plt.close(fig)
    return path
