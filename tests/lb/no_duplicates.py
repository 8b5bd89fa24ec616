"""No request runs twice: each LB recipe as shipped, two gateways behind it, each gateway forwarding
to a ledger of its own (envoyfilter/tools/ledger.py, which counts every execution of a request id
as it arrives), so that the ledgers say how often each request ran and on which gateway.

    client ─▶ front LB ─┬─▶ gw1 Envoy (drain-gate) ─▶ ledger 1
                        └─▶ gw2 Envoy (drain-gate) ─▶ ledger 2

The LBs and their gateways' configuration (each as its file says):

    haproxy  envoyfilter/haproxy/haproxy-refuse.cfg   refuse, refused_requests: idempotent
    envoy    envoyfilter/lb/envoy-front.yaml           refuse, refused_requests: all
    nginx    envoyfilter/lb/nginx-drain-gate.conf      refuse, refuse_with: reset, refused_requests: idempotent

and each one's control, the recipe before (tests/lb/controls/), in the same rig (the same two
gateways and ledgers; only the LB process is another).

`run_lb` runs, in one rig: the application's 503 to a POST and to a GET (`app_503`), shipped and
control; a gateway SIGKILLed with POSTs held 3 s on it (`kill`), control and shipped (gw1 started
again after each); a refusing drain of gw1 under a steady sequence of POSTs and GETs, and long POSTs
sent from gw1's flip (CLOSING) until the LB marks it DOWN (`drain`), `drains` times (gw1 started
again between them). Behind HAProxy each drain has its control beside it: the same drain behind
haproxy-refuse.cfg with `on-marked-down shutdown-sessions` on its server lines (as haproxy.cfg has
them), which cuts the POSTs gw1 serves in CLOSING that are still running at the DOWN.

    PYTHONPATH=. .venv/bin/python -m tests.lb.no_duplicates [--drains 5] [--fronts haproxy,envoy,nginx]
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import requests
import yaml

from tests.harness.envoy import REPO
from tests.harness.front import ENVOY_FRONT, NGINX_CONF, EnvoyFront
from tests.harness.haproxy import CFG_REFUSE, HAProxy, shutdown_sessions_cfg
from tests.harness.ledger import Ledger
from tests.harness.process import wait_for
from tests.harness.rig import PreStop
from tests.harness.timeline import parse_time
from tests.lb.refuse_lbs import FrontRig

CONTROLS = REPO / "tests" / "lb" / "controls"
INTER_S = 0.5  # the LBs' check interval (HAProxy and Envoy: fall 2, rise 2)
TICK_S = 0.1  # drain-gate's tick: a worker sees the drain begin at its next one


@dataclass(frozen=True)
class Recipe:
    front: str  # FrontRig's name of the LB
    label: str
    shipped: Path
    control: Path
    gateways: dict  # the gateways' refusing, as the shipped file says
    # The drain's control: the shipped file changed by this (in a work directory), or None.
    drain_control: Callable[[Path, Path], Path] | None = None
    drain_control_label: str = ""


RECIPES = {
    "haproxy": Recipe("haproxy", "HAProxy 2.6", CFG_REFUSE, CONTROLS / "haproxy-refuse-resends-503.cfg",
                      {"refused_requests": "idempotent"}, shutdown_sessions_cfg,
                      "haproxy-refuse.cfg with `on-marked-down shutdown-sessions` on its server lines"),
    "envoy": Recipe("envoy", "Envoy", ENVOY_FRONT, CONTROLS / "envoy-front-resends-503.yaml",
                    {"refused_requests": "all"}),
    "nginx": Recipe("nginx", "nginx 1.22", NGINX_CONF, CONTROLS / "nginx-non-idempotent.conf",
                    {"refuse_with": "reset", "refused_requests": "idempotent"}),
}


@dataclass(frozen=True)
class Workload:
    """The drain's traffic: `clients` threads, each sending one request after another (a new
    connection each), `pause` s apart, POST and GET in turn (odd threads start with a GET), each
    held `hold_ms` by the ledger; gw1's preStop call `drain_at` s after the first. And the long
    POSTs: from the moment gw1 is seen CLOSING (its flip), one every `long_every` s, each held
    `long_hold_ms`, until the LB is seen marking gw1 DOWN (at most `long_for` s): those the LB sends
    to gw1 are served there (a refusing drain serves POSTs) and still run at the DOWN, which comes
    at most fall x inter (1 s) after the flip behind HAProxy."""

    clients: int = 4
    pause: float = 0.1
    hold_ms: int = 100
    drain_at: float = 0.5
    body: int = 200  # a POST's body, bytes
    long_every: float = 0.1
    long_hold_ms: int = 1500
    long_for: float = 1.5
    # gw1's drain: DRAINING at least `min_drain` (so that it refuses and serves for a while), CLOSING
    # `lb_buffer`: HAProxy marks it DOWN after 2 failed checks 0.5 s apart (<= 1 s; Envoy at its
    # first: a 503), and a long POST sent up to then ends on gw1 before it is CLOSED (1 + 1.5 s).
    min_drain: str = "2s"
    drain_timeout: str = "10s"
    lb_buffer: str = "3s"


DRAIN = Workload()
KILL_POSTS = 4  # POSTs in flight when a gateway is killed
KILL_HOLD_MS = 3000


def gateway_config(recipe: Recipe, w: Workload = DRAIN) -> dict:
    return {"draining_new_requests": "refuse", "min_drain": w.min_drain, "drain_timeout": w.drain_timeout,
            "lb_buffer": w.lb_buffer, **recipe.gateways}


@dataclass
class Sent:
    """One request through the LB, as its client saw it."""

    rid: str
    method: str
    start: float
    hold_ms: int = 0
    end: float = 0.0
    status: int = 0  # 0: no answer (`error` says what)
    error: str | None = None


def send(url: str, method: str, rid: str, *, hold_ms: int = 0, status: int = 200, body: int = 0,
         timeout: float = 30) -> Sent:
    s = Sent(rid, method, time.time(), hold_ms)
    try:
        r = requests.request(method, f"{url}/ledger/{rid}?hold_ms={hold_ms}&status={status}",
                             data=b"x" * body if body else None, timeout=timeout, headers={"connection": "close"})
        s.status = r.status_code
    except requests.RequestException as e:
        s.error = type(e).__name__ + ": " + str(e)[:160]
    s.end = time.time()
    return s


@dataclass
class Ledgers:
    """gw1's ledger and gw2's."""

    gw1: Ledger
    gw2: Ledger
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def read(self) -> "Ledgers":
        self.counts = {"gw1": self.gw1.executions(), "gw2": self.gw2.executions()}
        return self

    def ran(self, rid: str) -> int:
        return sum(c.get(rid, 0) for c in self.counts.values())

    def on(self, rid: str) -> list[str]:
        return [g for g, c in self.counts.items() if c.get(rid)]


def run_id(tag: str) -> str:
    return f"{tag}-{time.monotonic_ns()}"


# -- (a) the application's own 503 -----------------------------------------------------------

def app_503(rig: FrontRig, ledgers: Ledgers) -> dict:
    """A POST and a GET the application answers 503 (both gateways OPEN): what the client got and
    how often each ran."""
    out = {}
    for method in ("POST", "GET"):
        s = send(rig.url(""), method, run_id(f"app503-{method.lower()}"), status=503,
                 body=DRAIN.body if method == "POST" else 0)
        ledgers.read()
        out[method] = {"status": s.status, "ran": ledgers.ran(s.rid), "on": ledgers.on(s.rid)}
    return out


# -- (c) a gateway killed with POSTs in flight -----------------------------------------------

def kill(rig: FrontRig, ledgers: Ledgers, victim: str = "gw1") -> dict:
    """KILL_POSTS POSTs at once, each held KILL_HOLD_MS by the ledger; once every one has arrived at
    a ledger (some at the victim's), the victim's Envoy is SIGKILLed. What each client got and how
    often each POST ran. The victim is started again afterwards."""
    gw = rig.gw(victim)
    tag = run_id("kill")
    ids = [f"{tag}-{i}" for i in range(KILL_POSTS)]
    with ThreadPoolExecutor(KILL_POSTS) as pool:
        futures = [pool.submit(send, rig.url(""), "POST", rid, hold_ms=KILL_HOLD_MS, body=DRAIN.body, timeout=30)
                   for rid in ids]
        wait_for(lambda: (ledgers.read(), all(ledgers.ran(r) for r in ids))[1], KILL_HOLD_MS / 1000 - 0.5, 0.05,
                 "every POST arrived at a ledger")
        on_victim = [r for r in ids if victim in ledgers.on(r)]
        if not on_victim:
            raise RuntimeError(f"none of {KILL_POSTS} POSTs reached {victim}: {ledgers.counts}")
        os.kill(gw.envoy.proc.pid, signal.SIGKILL)
        gw.envoy.proc.wait(10)
        killed = time.time()
        sent = [f.result(timeout=60) for f in futures]
    ledgers.read()
    gw.stop()  # closes its log
    gw.start()
    victims = [s for s in sent if s.rid in on_victim]
    return {"posts": KILL_POSTS, "on_victim": len(on_victim),
            "victims_got": sorted({s.status if s.status else "no answer" for s in victims}, key=str),
            "victims_ran": [ledgers.ran(s.rid) for s in victims],
            "victims_resent_to": sorted({g for s in victims for g in ledgers.on(s.rid) if g != victim}),
            "others_ok": all(s.status == 200 and ledgers.ran(s.rid) == 1 for s in sent if s.rid not in on_victim),
            "ran_twice": sum(1 for s in sent if ledgers.ran(s.rid) > 1),
            "answered_after_kill_s": [round(s.end - killed, 2) for s in victims]}


# -- many refusals at once -------------------------------------------------------------------

BURST = 10  # GETs at once, half of them to gw1
BURST_HOLD_MS = 1000


def envoy_default_retries(workdir: Path) -> Path:
    """envoy-front.yaml without its `circuit_breakers` (Envoy's default: 3 retries under way at once)."""
    doc = yaml.safe_load(ENVOY_FRONT.read_text())
    (cluster,) = doc["static_resources"]["clusters"]
    if "circuit_breakers" not in cluster:
        raise ValueError(f"{ENVOY_FRONT.name}: no circuit_breakers")
    del cluster["circuit_breakers"]
    path = Path(workdir) / "envoy-front-default-retries.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def burst(rig: FrontRig, ledgers: Ledgers) -> dict:
    """gw1 DRAINING (POST /drain; min_drain keeps it there), BURST GETs sent at once, each held
    BURST_HOLD_MS by the ledger: the LB resends every one gw1 refused at the same time (Envoy:
    that many retries under way at once). What the clients got, how often each ran. gw1 is
    started again afterwards."""
    gw1 = rig.gw("gw1")
    r = gw1.post("/drain")
    if r.status_code != 200 or r.json()["state"] != "DRAINING":
        raise RuntimeError(f"gw1 did not drain: {r.status_code} {r.text}")
    wait_for(lambda: gw1.status()["refusing"]["active"], 5, 0.02, "gw1 refusing")
    time.sleep(3 * TICK_S)  # each worker refuses from its next tick on
    tag = run_id("burst")
    with ThreadPoolExecutor(BURST) as pool:
        sent = list(pool.map(lambda i: send(rig.url(""), "GET", f"{tag}-{i}", hold_ms=BURST_HOLD_MS, timeout=30),
                             range(BURST)))
    st = gw1.status()
    ledgers.read()
    out = {"sent": BURST, "refused": st["refusing"]["this_drain"], "state_after": st["state"],
           "answered_200": sum(1 for s in sent if s.status == 200),
           "got": sorted({s.status or "no answer" for s in sent}, key=str),
           "ran": sorted({ledgers.ran(s.rid) for s in sent}), "on_gw1": sum(1 for s in sent if "gw1" in ledgers.on(s.rid))}
    if isinstance(rig.lb, EnvoyFront):
        out["retry_overflow"] = rig.lb.stat("cluster.gateways.upstream_rq_retry_overflow")
    gw1.stop()
    gw1.start()
    return out


# -- (b) a refusing drain under POSTs and GETs -----------------------------------------------

class Traffic:
    """The drain's clients (Workload), until stopped."""

    def __init__(self, url: str, w: Workload):
        self.url, self.w = url, w
        self.sent: list[Sent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._n = itertools.count()
        self._tag = run_id("drain")
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(w.clients)]
        self.t0 = time.time()
        for t in self._threads:
            t.start()

    def _client(self, i: int) -> None:
        for k in itertools.count(i % 2):
            if self._stop.is_set():
                return
            method = ("POST", "GET")[k % 2]
            s = send(self.url, method, f"{self._tag}-{next(self._n)}-{method.lower()}", hold_ms=self.w.hold_ms,
                     body=self.w.body if method == "POST" else 0, timeout=30)
            with self._lock:
                self.sent.append(s)
            time.sleep(self.w.pause)

    def stop(self, timeout: float) -> list[Sent]:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            raise TimeoutError(f"the drain's clients did not end within {timeout}s")
        return sorted(self.sent, key=lambda s: s.start)


class LbDown:
    """When the LB marks gw1 DOWN, as its own state says (HAProxy: `show stat` on its admin socket;
    Envoy: its active check's health flags on /clusters), polled every 20 ms on a thread: `down` is
    the first time it was seen DOWN (the DOWN came at or before it), `up` the last time it was seen
    not DOWN before that. nginx checks nothing: never DOWN."""

    def __init__(self, lb, server: str = "gw1"):
        self.lb, self.server = lb, server
        self.up: float | None = None
        self.down: float | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.watching = isinstance(lb, (HAProxy, EnvoyFront))
        if self.watching:
            self._thread.start()

    def _is_down(self) -> bool:
        if isinstance(self.lb, HAProxy):
            srv = self.lb.servers().get(self.server)
            return bool(srv and srv.down)
        return self.lb.host_status().get(self.server) == "DOWN"

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and self.down is None:
                t = time.time()
                if self._is_down():
                    self.down = t
                else:
                    self.up = t
                self._stop.wait(0.02)
        except Exception as e:  # reported by stop()
            self.error = repr(e)

    def stop(self) -> None:
        self._stop.set()
        if self.watching:
            self._thread.join(5)
        if self.error:
            raise RuntimeError(f"watching the LB's state of {self.server}: {self.error}")


class LongPosts:
    """The long POSTs of `w` (Workload): sent from the moment gw1 is seen CLOSING until `down` saw
    the LB mark it DOWN, or `w.long_for` s."""

    def __init__(self, url: str, gw1, down: LbDown, w: Workload):
        self.url, self.gw1, self.down, self.w = url, gw1, down, w
        self.sent: list[Sent] = []
        self.seen_closing: float | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._senders: list[threading.Thread] = []
        self._tag = run_id("long")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _send(self, rid: str) -> None:
        s = send(self.url, "POST", rid, hold_ms=self.w.long_hold_ms, body=self.w.body, timeout=30)
        with self._lock:
            self.sent.append(s)

    def _run(self) -> None:
        try:
            while self.gw1.status()["state"] in ("OPEN", "DRAINING"):
                if self._stop.wait(0.02):
                    return
            self.seen_closing = time.time()
            for i in itertools.count():
                if self.down.down is not None or time.time() - self.seen_closing > self.w.long_for:
                    return
                t = threading.Thread(target=self._send, args=(f"{self._tag}-{i}-post",), daemon=True)
                t.start()
                self._senders.append(t)
                if self._stop.wait(self.w.long_every):
                    return
        except Exception as e:  # reported by stop()
            self.error = repr(e)

    def stop(self, timeout: float) -> list[Sent]:
        self._stop.set()
        deadline = time.monotonic() + timeout
        self._thread.join(max(0.1, deadline - time.monotonic()))
        for t in self._senders:
            t.join(max(0.1, deadline - time.monotonic()))
        if self._thread.is_alive() or any(t.is_alive() for t in self._senders):
            raise TimeoutError(f"the long POSTs did not end within {timeout}s")
        if self.error:
            raise RuntimeError(f"the long POSTs: {self.error}")
        return list(self.sent)


def _transition(st: dict, to: str) -> tuple[float | None, str | None]:
    for t in st["progress"]["transitions"]:
        if t["to"] == to:
            return parse_time(t["at"]), t["reason"]
    return None, None


def drain(rig: FrontRig, ledgers: Ledgers, w: Workload = DRAIN) -> dict:
    """gw1 drained (its preStop call, held until CLOSED) while `w` runs through the LB from before
    DRAINING until CLOSED, and its long POSTs from the flip to the LB's DOWN; then the clients stop
    and every request is accounted: its answer, how often it ran, on which gateway, and when its
    client sent it against gw1's transitions and the LB's DOWN."""
    gw1 = rig.gw("gw1")
    down = LbDown(rig.lb)
    traffic = Traffic(rig.url(""), w)
    long_posts = LongPosts(rig.url(""), gw1, down, w)
    try:
        time.sleep(w.drain_at)
        ps = PreStop(gw1, via="drain", timeout=60)
        ps.wait(40)
    finally:
        try:
            sent = traffic.stop(40)
            long_sent = long_posts.stop(40)
        finally:
            down.stop()
    sent = sorted(sent + long_sent, key=lambda s: s.start)
    final = gw1.status()
    ledgers.read()
    started = parse_time(final["progress"]["drain_started_at"])
    closing, reason = _transition(final, "CLOSING")
    closed, _ = _transition(final, "CLOSED")
    if not (started and closing and closed):
        raise RuntimeError(f"gw1 did not go through DRAINING, CLOSING, CLOSED: {final['progress']}")

    def phase(t: float) -> str:
        # OPEN: sent before every worker of gw1 refused for sure (the drain's start and two ticks).
        return ("OPEN" if t < started + 2 * TICK_S else "DRAINING" if t < closing else "CLOSING" if t < closed
                else "CLOSED")

    # HAProxy's own record of what its DOWN cut (`on-marked-down shutdown-sessions`: termination D).
    lb_down_cut = ([x.request for x in rig.lb.requests() if x.killed_by_down and "/ledger/" in x.request]
                   if isinstance(rig.lb, HAProxy) else [])

    def running_at_down(s: Sent) -> bool:
        # Run on gw1, so the LB sent it there before its DOWN; the ledger answers it no sooner than
        # hold_ms after it arrived, so no sooner than start + hold_ms: after `down.down` (when the
        # DOWN was first seen, at or after the DOWN itself), it was still running at the DOWN.
        return down.down is not None and "gw1" in ledgers.on(s.rid) and s.start + s.hold_ms / 1000 > down.down

    rows = [{"rid": s.rid, "method": s.method, "hold_ms": s.hold_ms, "status": s.status, "error": s.error,
             "ran": ledgers.ran(s.rid), "on": ledgers.on(s.rid), "sent_in": phase(s.start),
             "answered_in": phase(s.end), "start_s": round(s.start - started, 3), "end_s": round(s.end - started, 3),
             "at_lb_down": running_at_down(s),
             "lb_cut": any(f"/ledger/{s.rid}?" in r for r in lb_down_cut)} for s in sent]
    posts = [r for r in rows if r["method"] == "POST"]
    at_down = [r for r in posts if r["at_lb_down"]]
    gets = [r for r in rows if r["method"] == "GET"]
    during = [r for r in rows if r["sent_in"] != "OPEN"]  # sent once gw1 refused
    out = {
        "posts": len(posts), "gets": len(gets),
        "posts_not_200": [r for r in posts if r["status"] != 200],
        "gets_not_200": [r for r in gets if r["status"] != 200],
        "ran_twice": [r for r in rows if r["ran"] > 1],
        "never_ran": [r for r in rows if r["ran"] == 0],
        "refused": final["receipt"]["refused"],
        "cut": final["receipt"]["cut"], "cut_lb": final["receipt"]["cut_lb"],
        "closing_reason": reason, "forced": final["progress"]["forced"],
        "draining_s": round(closing - started, 2), "closing_s": round(closed - closing, 2),
        # Sent once gw1 refused, and run on gw1: served through the drain, by the phase it was sent in.
        "posts_gw1_served": {p: sum(1 for r in posts if r["sent_in"] == p and "gw1" in r["on"])
                             for p in ("DRAINING", "CLOSING", "CLOSED")},
        # ... and answered before CLOSING: begun and ended while gw1 was DRAINING.
        "posts_gw1_within_draining": sum(1 for r in posts if r["sent_in"] == r["answered_in"] == "DRAINING"
                                         and "gw1" in r["on"]),
        "gets_gw1_ran": sum(1 for r in gets if r["sent_in"] != "OPEN" and "gw1" in r["on"]),
        "posts_sent_during": sum(1 for r in during if r["method"] == "POST"),
        "gets_sent_during": sum(1 for r in during if r["method"] == "GET"),
        # The long POSTs: sent from the flip (gw1 seen CLOSING) until the LB's DOWN was seen.
        "long_posts": len(long_sent), "long_posts_gw1": sum(1 for s in long_sent if "gw1" in ledgers.on(s.rid)),
        # When the LB marked gw1 DOWN, after the flip: between `lb_down_s[0]` (last seen not DOWN) and
        # `lb_down_s[1]` (first seen DOWN); None: never (nginx).
        "lb_down_s": ([round(t - closing, 3) if t else None for t in (down.up, down.down)]
                      if down.down is not None else None),
        "seen_closing_s": round(long_posts.seen_closing - closing, 3) if long_posts.seen_closing else None,
        # POSTs run on gw1 and still running at the LB's DOWN (above), and what became of them.
        "posts_at_down": at_down,
        "posts_at_down_200": sum(1 for r in at_down if r["status"] == 200),
        "posts_at_down_ended_before_closed": sum(1 for r in at_down if r["status"] == 200 and r["end_s"] <
                                                 round(closed - started, 3)),
        "lb_down_cut": lb_down_cut,
    }
    if isinstance(rig.lb, EnvoyFront):
        # Retries Envoy did not make: more at once than the cluster's circuit breaker allows (`max_retries`).
        out["retry_overflow"] = rig.lb.stat("cluster.gateways.upstream_rq_retry_overflow")
    return out


# -- one LB ----------------------------------------------------------------------------------

def run_lb(name: str, workdir: Path, drains: int = 1, w: Workload = DRAIN) -> dict:
    """Every case behind one LB, in one rig (the module's docstring)."""
    recipe = RECIPES[name]
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    row: dict = {"lb": name, "label": recipe.label, "shipped": recipe.shipped.name, "control": recipe.control.name,
                 "drain_control": recipe.drain_control_label, "gateways": recipe.gateways}
    with contextlib.ExitStack() as stack:
        ledgers = Ledgers(Ledger(workdir, label="ledger-gw1"), Ledger(workdir, label="ledger-gw2"))
        for ledger in (ledgers.gw1, ledgers.gw2):
            stack.callback(ledger.stop)
            ledger.start()
        rig = stack.enter_context(FrontRig(workdir, gateway_config(recipe, w), inter_s=INTER_S,
                                           backend_ports=[ledgers.gw1.port, ledgers.gw2.port]))
        t = time.monotonic()
        rig.use(recipe.front, recipe=recipe.shipped)
        row["app_503"] = app_503(rig, ledgers)
        row["burst"] = burst(rig, ledgers)
        if recipe.front == "envoy":  # its control: the same file with Envoy's default retries at once
            rig.use(recipe.front, recipe=envoy_default_retries(workdir))
            row["control_burst"] = burst(rig, ledgers)
        rig.use(recipe.front, recipe=recipe.control)
        row["control_app_503"] = app_503(rig, ledgers)
        row["control_kill"] = kill(rig, ledgers)
        rig.use(recipe.front, recipe=recipe.shipped)  # a fresh LB: nothing counted against the killed gateway
        row["kill"] = kill(rig, ledgers)
        row["drains"], row["control_drains"] = [], []
        control = recipe.drain_control(recipe.shipped, workdir) if recipe.drain_control else None
        gw1, first = rig.gw("gw1"), True
        for _ in range(drains):  # each drain, then its control
            for cfg, out in ((recipe.shipped, row["drains"]), (control, row["control_drains"])):
                if cfg is None:
                    continue
                if not first:  # the drain before left it CLOSED (the kill started it again)
                    gw1.stop()
                    gw1.start()
                first = False
                rig.use(recipe.front, recipe=cfg)
                out.append(drain(rig, ledgers, w))
        row["seconds"] = round(time.monotonic() - t, 1)
    return row


def run_all(workdir: Path, fronts=tuple(RECIPES), drains: int = 1) -> list[dict]:
    """Every LB at the same time, each in its own rig."""
    with ThreadPoolExecutor(len(fronts)) as pool:
        futures = [pool.submit(run_lb, name, Path(workdir) / name, drains) for name in fronts]
        return [f.result() for f in futures]


# -- the table -------------------------------------------------------------------------------

def _app(c: dict) -> str:
    return f"{c['status']}, ran {c['ran']}×"


def _burst(b: dict | None) -> str:
    if not b:
        return "–"
    lost = f", {b['retry_overflow']} not resent (retry overflow)" if b.get("retry_overflow") else ""
    ran = "/".join(f"{n}×" for n in b["ran"])
    return f"{b['answered_200']} of {b['sent']} answered 200 ({b['refused']} refused by gw1{lost}), ran {ran}"


def _kill(k: dict) -> str:
    got = ", ".join(map(str, k["victims_got"]))
    ran = "/".join(f"{n}×" for n in sorted(set(k["victims_ran"])))
    again = f", resent to {', '.join(k['victims_resent_to'])}" if k["victims_resent_to"] else ""
    return f"{k['on_victim']} of {k['posts']} on gw1: their clients got {got}; ran {ran}{again}"


def _at_down(d: dict) -> str:
    if d["lb_down_s"] is None:
        return "no DOWN (no check)"
    n = len(d["posts_at_down"])
    head = f"DOWN {d['lb_down_s'][1]:.1f} s after the flip"
    if not n:
        return f"{head}, no POST running on gw1 then"
    cut = sum(1 for r in d["posts_at_down"] if r["lb_cut"])
    ok = d["posts_at_down_200"]
    return (f"{head}, {n} POSTs running on gw1 then: {ok} answered 200"
            + (f" ({d['posts_at_down_ended_before_closed']} before gw1 was CLOSED)" if ok else "")
            + (f", {cut} cut by the DOWN" if cut else ""))


def _drain(d: dict) -> str:
    cut = f", {len(d['lb_down_cut'])} cut by the LB's DOWN" if d.get("lb_down_cut") else ""
    return (f"{d['posts']} POSTs ({d['long_posts']} long), {d['gets']} GETs: not 200 {len(d['posts_not_200'])} + "
            f"{len(d['gets_not_200'])}{cut}, ran twice {len(d['ran_twice'])}; gw1 refused {d['refused']}, served "
            + " / ".join(str(d["posts_gw1_served"][p]) for p in ("DRAINING", "CLOSING", "CLOSED"))
            + f" POSTs; {_at_down(d)}")


def table(rows: list[dict]) -> str:
    head = ("| LB | recipe | the application's 503 to a POST | ... to a GET | 10 GETs at once, gw1 refusing "
            "| gw1 drained under POSTs and GETs, each drain (POSTs gw1 served: sent while DRAINING / CLOSING / "
            "CLOSED; the LB's DOWN and the POSTs still running on gw1 then) | gw1 SIGKILLed, POSTs held 3 s on it |"
            "\n|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        gws = ", ".join(f"`{k}: {v}`" for k, v in r["gateways"].items())
        lines.append(f"| {r['label']} | {r['shipped']} (refuse, {gws}) | {_app(r['app_503']['POST'])} | "
                     f"{_app(r['app_503']['GET'])} | {_burst(r['burst'])} | "
                     f"{'<br>'.join(_drain(d) for d in r['drains'])} | {_kill(r['kill'])} |")
        lines.append(f"| {r['label']} | {r['control']} (the control) | {_app(r['control_app_503']['POST'])} | "
                     f"{_app(r['control_app_503']['GET'])} | – | – | {_kill(r['control_kill'])} |")
        if r.get("control_drains"):
            lines.append(f"| {r['label']} | {r['drain_control']} (the control) | – | – | – | "
                         f"{'<br>'.join(_drain(d) for d in r['control_drains'])} | – |")
        if r.get("control_burst"):
            lines.append(f"| {r['label']} | {r['shipped']} without its `circuit_breakers` (the control: Envoy's "
                         f"default, 3 retries at once) | – | – | {_burst(r['control_burst'])} | – | – |")
    return head + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drains", type=int, default=5, help="refusing drains of gw1 behind each LB")
    ap.add_argument("--fronts", default=",".join(RECIPES))
    ap.add_argument("--workdir", help="keep the logs of every process here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="no-duplicates-") as wd:
        rows = run_all(Path(args.workdir or wd), tuple(args.fronts.split(",")), args.drains)
    print(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
