"""The six events of a pod termination, observed, written as JSON and drawn as SVG.

    event 1  LB check (/health_check.html) flips to 503       drain-gate: closing_at
    event 2  readiness (/health) flips to 503                  drain-gate: closed_at
    event 3  Envoy's own connection drain                      drain-gate: connection_rotation.answered_at
             (drain_listeners?graceful&skip_exit)               (none when the call was off or failed)
    event 4  active = 0                                        drain-gate: the active_zero transition,
                                                               else the first status poll reading 0
    event 5  HAProxy marks the server DOWN                     `show stat` on the admin socket
    event 6  first in-flight request cut (RST), or none        the clients, and HAProxy's log
                                                               (termination code D)

Times are epoch seconds; each timeline also carries them relative to the
trigger (the preStop call, "T+0"). DRAINING itself (drain_started_at, right
after T+0) is the trigger's effect, not one of the six events.
"""
from __future__ import annotations

import json
import os
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path

import requests

EVENTS = [
    ("health_flip", "1 LB check 503"),
    ("readiness_flip", "2 readiness 503"),
    ("rotation", "3 Envoy connection drain"),
    ("active_zero", "4 active = 0"),
    ("lb_down", "5 LB DOWN"),
    ("first_rst", "6 first RST"),
]


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time (drain-gate's, Prometheus's) as epoch seconds; None for none."""
    return datetime.fromisoformat(text).timestamp() if text else None


class Poller:
    """Calls `sample()` every `interval` seconds on a thread until stopped."""

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a poll that fails (process restarting) is skipped
                pass
            self._stop.wait(self.interval)

    def sample(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class GatewayPoller(Poller):
    """Polls a gateway's GET /drain/status (never the LB check: that would count as a checker)."""

    def __init__(self, status_url: str, interval: float = 0.1):
        super().__init__(interval)
        self.url = status_url
        self.samples: list[tuple[float, str, int, int]] = []  # (t, state, active, lb_status)
        self.last: dict | None = None
        self._session = requests.Session()

    def sample(self) -> None:
        body = self._session.get(self.url, timeout=1).json()
        self.last = body
        self.samples.append((time.time(), body["state"], body["active"], body["lb_status"]))


class StatPoller(Poller):
    """Polls HAProxy's `show stat`; keeps every change of each server's status."""

    def __init__(self, haproxy, interval: float = 0.1):
        super().__init__(interval)
        self.haproxy = haproxy
        self.changes: list[tuple[float, str, str, str]] = []  # (t, server, status, check_status)
        self._now: dict[str, str] = {}

    def sample(self) -> None:
        t = time.time()
        for name, srv in self.haproxy.servers().items():
            if self._now.get(name) != srv.status:
                self._now[name] = srv.status
                self.changes.append((t, name, srv.status, srv.check_status))

    def first(self, server: str, status: str, after: float) -> float | None:
        for t, name, st, _ in self.changes:
            if name == server and st == status and t >= after:
                return t
        return None


def rotation_time(status: dict) -> float | None:
    """Event 3: when Envoy's admin accepted this drain's connection rotation."""
    last = (status.get("connection_rotation") or {}).get("last")
    if not last or last["outcome"] != "done":
        return None
    if last["drain_started_at"] != status["progress"].get("drain_started_at"):
        return None
    return parse_time(last["answered_at"])


def fsm_events(status: dict, samples: list[tuple[float, str, int, int]], after: float) -> dict:
    """Events 1-4 from a gateway's final /drain/status and its poll samples."""
    progress = status["progress"]
    drain_start = parse_time(progress.get("drain_started_at"))
    closing = parse_time(progress.get("closing_at"))
    closed = parse_time(progress.get("closed_at"))
    active_zero = None
    for step in progress.get("transitions", []):
        if step["to"] == "CLOSING" and step["reason"] == "active_zero":
            active_zero = parse_time(step["at"])
    if active_zero is None and drain_start is not None:
        for t, _, active, _ in samples:
            if t >= max(drain_start, after) and active == 0:
                active_zero = t
                break
    reason = next(
        (s["reason"] for s in reversed(progress.get("transitions", [])) if s["to"] == "CLOSING"), None
    )
    return {
        "drain_start": drain_start,
        "rotation": rotation_time(status),
        "active_zero": active_zero,
        "health_flip": closing,
        "readiness_flip": closed,
        "closing_reason": reason,
        "forced": progress.get("forced"),
        "active_at_closing": progress.get("active_at_closing"),
        "transitions": [
            {"to": s["to"], "reason": s["reason"], "at": parse_time(s["at"]), "active": s["active"]}
            for s in progress.get("transitions", [])
        ],
    }


def build(
    *,
    scenario: str,
    mode: str,
    trigger: float,
    status: dict,
    samples,
    stat: StatPoller,
    server: str,
    streams=(),
    short=None,
    pinned=None,
    haproxy_log=(),
    draining_lb_status: int = 200,
    inter: str = "",
    extra: dict | None = None,
) -> dict:
    """One scenario run's timeline: the six events, every client, HAProxy's view."""
    ev = fsm_events(status, samples, trigger)
    lb_down = stat.first(server, "DOWN", trigger)
    lb_nolb = stat.first(server, "NOLB", trigger)
    killed = [r for r in haproxy_log if r.killed_by_down and r.server == server]
    cut_times = [s["end"] for s in streams if not s["complete"] and s["end"]]
    if short is not None:
        cut_times += [r.end for r in short.connection_errors]
    if pinned is not None:
        cut_times += [r.end for r in pinned.failures]
    cut_times += [r.end for r in killed]
    first_rst = min(cut_times) if cut_times else None
    events = {
        "health_flip": ev["health_flip"],
        "readiness_flip": ev["readiness_flip"],
        "drain_start": ev["drain_start"],
        "rotation": ev["rotation"],
        "active_zero": ev["active_zero"],
        "lb_down": lb_down,
        "first_rst": first_rst,
    }
    rel = {k: (round(v - trigger, 3) if v is not None else None) for k, v in events.items()}
    return {
        "scenario": scenario,
        "mode": mode,
        "draining_lb_status": draining_lb_status,
        "check_inter": inter,
        "trigger": trigger,
        "events": events,
        "events_rel": rel,
        "lb_nolb": lb_nolb,
        "closing_reason": ev["closing_reason"],
        "forced": ev["forced"],
        "active_at_closing": ev["active_at_closing"],
        "transitions": ev["transitions"],
        "haproxy_changes": [
            {"t": t, "server": n, "status": s, "check": c} for t, n, s, c in stat.changes
        ],
        "haproxy_killed_sessions": [vars(r) for r in killed],
        "streams": list(streams),
        "short": short.summary() if short is not None else None,
        "short_errors": (
            [{"t": r.end, "status": r.status, "error": r.error}
             for r in short.connection_errors + short.server_errors]
            if short is not None else []
        ),
        "pinned": pinned.summary() if pinned is not None else None,
        "pinned_failures": [vars(r) for r in pinned.failures] if pinned is not None else [],
        "pinned_rotations": [t for t, _, _ in pinned.rotations] if pinned is not None else [],
        **(extra or {}),
    }


def write_json(timeline: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(timeline, indent=2, sort_keys=False))
    return path


# -- the picture ----------------------------------------------------------------

_STATE_COLORS = {
    "OPEN": "#9ecae1", "DRAINING": "#fdd49e", "CLOSING": "#fc8d59", "CLOSED": "#bdbdbd", "FAULT": "#756bb1",
    "STOPPED": "#636363",
}
_LB_COLORS = {"200": "#74c476", "404": "#fdae6b", "503": "#de2d26", "none": "#636363"}
_HAP_COLORS = {"UP": "#74c476", "NOLB": "#fdae6b", "DOWN": "#de2d26", "MAINT": "#969696"}


def _segments(points: list[tuple[float, str]], x0: float, x1: float):
    """[(t, value)...] sorted -> [(start, width, value)] clipped to [x0, x1]."""
    merged: list[tuple[float, str]] = []
    for t, v in points:
        if not merged or merged[-1][1] != v:
            merged.append((t, v))
    points = merged
    out = []
    for i, (t, v) in enumerate(points):
        end = points[i + 1][0] if i + 1 < len(points) else x1
        s, e = max(t, x0), min(end, x1)
        if e > s:
            out.append((s, e - s, v))
    return out


def _fsm_points(tl: dict) -> list[tuple[float, str]]:
    trig = tl["trigger"]
    pts = [(-1e9, "OPEN")]
    for s in tl["transitions"]:
        if s["at"] is not None and s["at"] >= trig - 1:
            pts.append((s["at"] - trig, s["to"]))
    # A rollout: the process was stopped, and a new one starts OPEN.
    if tl.get("stopped"):
        pts.append((tl["stopped"] - trig, "STOPPED"))
    if tl.get("restarted"):
        pts.append((tl["restarted"] - trig, "OPEN"))
    return pts


def _lb_points(tl: dict) -> list[tuple[float, str]]:
    answer = {"OPEN": "200", "DRAINING": str(tl.get("draining_lb_status", 200)),
              "CLOSING": "503", "CLOSED": "503", "FAULT": "503", "STOPPED": "none"}
    return [(t, answer[s]) for t, s in _fsm_points(tl)]


def _hap_points(tl: dict, server: str) -> list[tuple[float, str]]:
    pts = [(-1e9, "UP")]
    for c in tl["haproxy_changes"]:
        if c["server"] != server:
            continue
        # "UP 1/2" is still UP (one failed check), "DOWN 1/2" still DOWN (one good one).
        key = c["status"].split()[0] if c["status"] else "UP"
        pts.append((c["t"] - tl["trigger"], key))
    return pts


def _interval_s(url: str) -> float:
    q = dict(p.split("=", 1) for p in url.split("?", 1)[-1].split("&") if "=" in p)
    return int(q.get("interval_ms", 1000)) / 1000


def _panel(ax, tl: dict, title: str, x0: float, x1: float, server: str) -> None:
    trig = tl["trigger"]
    lanes = []
    streams = tl["streams"]
    y = 0
    # Long streams, bottom up.
    for s in reversed(streams):
        start = s["start"] - trig
        end = (s["end"] or (trig + x1)) - trig
        color = "#31a354" if s["complete"] else "#de2d26"
        if not s["complete"]:
            # What the stream would have run: the part the cut took away.
            full = s["expected_chunks"] * _interval_s(s["url"])
            ax.broken_barh([(start, full)], (y + 0.15, 0.7), facecolors="none", edgecolor="#de2d26",
                           linestyle="--", linewidth=0.8)
        ax.broken_barh([(start, end - start)], (y + 0.15, 0.7), facecolors=color, alpha=0.8)
        if not s["complete"]:
            ax.plot([end], [y + 0.5], marker="x", color="black", markersize=9, mew=2)
        lanes.append((y, s.get("label") or "stream"))
        y += 1
    if tl.get("short"):
        sh = tl["short"]
        s0 = (sh.get("started") or trig + x0) - trig
        s1 = (sh.get("ended") or trig + x1) - trig
        ax.broken_barh([(s0, s1 - s0)], (y + 0.3, 0.4), facecolors="#9ecae1")
        for e in tl.get("short_errors", []):
            ax.plot([e["t"] - trig], [y + 0.5], marker="|", color="#de2d26", markersize=14, mew=2)
        lanes.append((y, f"short reqs ({sh['connection_errors']} conn err, {sh['http_5xx']} 5xx)"))
        y += 1
    if tl.get("pinned"):
        pn = tl["pinned"]
        s0, s1 = (pn.get("started") or trig + x0) - trig, (pn.get("ended") or trig + x1) - trig
        ax.broken_barh([(s0, s1 - s0)], (y + 0.3, 0.4), facecolors="#c6dbef")
        for t in tl.get("pinned_rotations", []):
            ax.plot([t - trig], [y + 0.5], marker="|", color="#3182bd", markersize=8, mew=1)
        for e in tl.get("pinned_failures", []):
            ax.plot([e["end"] - trig], [y + 0.5], marker="x", color="#de2d26", markersize=9, mew=2)
        lanes.append((y, f"pinned clients ({pn['rotations']} reconnects asked, {pn['failed']} failed)"))
        y += 1
    for label, points, colors in (
        ("HAProxy server", _hap_points(tl, server), _HAP_COLORS),
        ("LB check answer", _lb_points(tl), _LB_COLORS),
        ("drain-gate FSM", _fsm_points(tl), _STATE_COLORS),
    ):
        for start, width, v in _segments(points, x0, x1):
            ax.broken_barh([(start, width)], (y + 0.1, 0.8), facecolors=colors.get(v, "#dddddd"),
                           edgecolor="white")
            if width > (x1 - x0) * 0.06:
                ax.text(start + width / 2, y + 0.5, v, ha="center", va="center", fontsize=7)
        lanes.append((y, label))
        y += 1
    ax.set_yticks([ly + 0.5 for ly, _ in lanes])
    ax.set_yticklabels([lab for _, lab in lanes], fontsize=8)
    ax.set_ylim(0, y + 2.4)
    ax.set_xlim(x0, x1)
    ax.axvline(0, color="black", lw=1)
    ax.text(0.05, y + 2.15, "T+0 preStop call", fontsize=7, ha="left", va="center")
    rel = tl["events_rel"]
    placed: list[float] = []
    for key, label in EVENTS:
        t = rel.get(key)
        if t is None:
            continue
        ax.axvline(t, color="#444444", lw=0.8, ls="--")
        level = sum(1 for p in placed if abs(p - t) < (x1 - x0) * 0.08)
        placed.append(t)
        ax.text(t, y + 0.3 + 0.42 * level, label.split(" ", 1)[0], fontsize=8, ha="center",
                va="center", bbox={"boxstyle": "circle,pad=0.15", "fc": "white", "ec": "#444444"})
    for key, label, ha in (("stopped", "gw stopped ", "right"), ("restarted", " started", "left")):
        if tl.get(key):
            ax.axvline(tl[key] - trig, color="#636363", lw=0.8, ls=":")
            ax.text(tl[key] - trig, y + 1.75, label, fontsize=7, ha=ha, va="center")
    ax.set_xlabel("seconds since the preStop call", fontsize=8)
    cut = tl.get("sessions_cut_at_down")
    if cut is not None:
        title = f"{title}: HAProxy cut {cut} session{'s' if cut != 1 else ''} at DOWN"
    ax.set_title(title, fontsize=9, color="#de2d26" if cut else "black")
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#eeeeee")


def render_svg(path: Path, panels: list[tuple[str, dict | None]], title: str) -> Path:
    """Side-by-side panels (e.g. current | improved) of one scenario, as SVG."""
    with warnings.catch_warnings():
        # matplotlib's font-config parser still calls pyparsing's camelCase names.
        warnings.simplefilter("ignore", DeprecationWarning)
        return _render_svg(path, panels, title)


def _render_svg(path: Path, panels: list[tuple[str, dict | None]], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "drain-gate"
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable SVG
    present = [tl for _, tl in panels if tl]
    lo, hi = 0.0, 1.0
    for tl in present:
        trig = tl["trigger"]
        for s in tl["streams"]:
            lo = min(lo, s["start"] - trig)
            hi = max(hi, (s["end"] or trig) - trig)
        for v in tl["events_rel"].values():
            if v is not None:
                hi = max(hi, v)
        for key in ("stopped", "restarted", "lb_up_again"):
            if tl.get(key):
                hi = max(hi, tl[key] - trig)
        if tl.get("short") and tl["short"].get("ended"):
            hi = max(hi, tl["short"]["ended"] - trig)
            lo = min(lo, (tl["short"].get("started") or trig) - trig)
    x0, x1 = lo - 1, hi + 1.5
    lanes = max(len(tl["streams"]) + (1 if tl.get("short") else 0) + 3 for tl in present) if present else 4
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 2.2 + 0.32 * lanes), squeeze=False)
    for ax, (label, tl) in zip(axes[0], panels):
        if not tl:
            ax.text(0.5, 0.5, f"{label}: not run", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        _panel(ax, tl, label, x0, x1, tl.get("server", "gw1"))
    legend = ("events: 1 LB check 503 · 2 readiness 503 · 3 Envoy connection drain · 4 active = 0 · "
              "5 HAProxy DOWN · 6 first RST (x = stream cut)")
    fig.suptitle(title, fontsize=11)
    fig.text(0.5, 0.01, legend, ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None})
    if os.environ.get("TIMELINE_PNG"):
        fig.savefig(os.environ["TIMELINE_PNG"], format="png", dpi=110)
    plt.close(fig)
    return path
