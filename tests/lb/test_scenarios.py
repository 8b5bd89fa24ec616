"""The sidecar design's scenarios (tests/docs/haproxy.md) against a real HAProxy with
`on-marked-down shutdown-sessions`.

    S1  one long HTTP/1.1 stream, drain mid-stream            -> completes; LB DOWN only after it
    S2  the same over HTTP/2 at a TLS frontend                 -> completes
    S3  two gateways, short requests >= 30 s, full preStop
        drain, stop after CLOSED, start again (rollout)        -> 0 5xx; 0 connection errors with 404,
                                                                  with 200 none but a request on the
                                                                  gateway at the DOWN instant
    S3 rollout  the sidecar design's S3 as written: two gateways, 90 s of continuous short requests,
        `rollout restart` of both, one after the other; current (503 at once, Istio's
        5 s drain, exit) vs improved (preStop held to CLOSED), 200 and 404
                                                               -> connection errors, 5xx, p50/p99
    S4  10 long streams + short traffic, drain mid-way         -> all complete
    S5  long streams keep arriving during the drain            -> 404 soft drain: 0 lost;
                                                                  200: lost streams measured
    L4  behind HAProxy `mode tcp`, two gateways: HTTP/1.1 keep-alive and
        HTTP/2 clients pinned to their connection, a request
        every 200 ms; gw1 drains                               -> with the connection rotation at
                                                                  drain start (event 3): 0 failed,
                                                                  0 sessions cut at DOWN; without it
                                                                  (the control) connections are reset
    control  S1 (and S2, S4) with the "current" flip
             (503 at drain start)                              -> the stream is cut, every time
    cuts     the "current" flip with HTTP/1.1 and HTTP/2 (TLS
             frontend) streams in flight, clients giving up    -> the gateway's receipt counts the 3 LB
                                                                  cuts and the 1 client that gave up in
                                                                  the drain, not the one that gave up OPEN

Every run also reads the gateway's own receipt of the drain and asserts that
it counts what the clients lost: cut_lb = what was cut in flight, cut_other =
what the test gave up itself during the drain (`assert_counts_agree`).

`make test` runs the quick set (S1, S4, S5 404, L4 with both LB answers and
the 200 control, the HTTP/1.1 control, the cut-count control) with
HAProxy checks every 1 s; `make scenarios` (`pytest -m full`) runs
every scenario with the shipped timings (inter 2s, lb_buffer 10s). Each run
writes, under out/scenarios/<run>/, a JSON timeline of the six events of a pod
termination per scenario and mode, an SVG of the two modes side by side, the logs of
every process, and results.json / results.md.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.harness import forms, results, timeline
from tests.harness.clients import CurlStream, PinnedClients, ShortLoop
from tests.harness.envoy import wait_for
from tests.harness.haproxy import CFG, CFG_SOFT_DRAIN, CFG_TCP, make_cert
from tests.harness.rig import QUICK, SHIPPED, PreStop, Rig, Timing, flip_now

pytestmark = pytest.mark.full  # has a full form: `pytest -m full` (`make scenarios`)
FULL = forms.FULL
TIMING: Timing = SHIPPED if FULL else QUICK
full_only = pytest.mark.skipif(not FULL, reason="the full form only: `make scenarios` (pytest -m full)")

RESULTS: list[dict] = []
ROLLOUTS: list[dict] = []  # S3 rollout rows, side by side in their own table
SOFT_GATE: list[dict] = []  # the soft drain gate's drains, in their own table

STREAM_SECONDS = 12  # >= 10 s, as the sidecar design's S1
INTERVAL_MS = 500
DRAIN_AFTER = 3.0  # seconds into the stream(s)

# The "current" mode has no event 3: Envoy's own drain began only at pod kill.
CURRENT = {"rotate_connections": False}

# The soft drain as shipped: no min_drain; the active = 0 flip waits until the
# LB's checker has been served a 404 (soft_drain_gate, the default).
SOFT = {"draining_lb_status": 404, "min_drain": "0s"}


@pytest.fixture(scope="module")
def run_dir():
    d = results.run_dir()
    yield d
    if RESULTS or ROLLOUTS or SOFT_GATE:
        results.add_section("scenarios", results_table(RESULTS) + rollout_table(ROLLOUTS) + soft_gate_table(SOFT_GATE),
                            RESULTS + ROLLOUTS + SOFT_GATE)


def client_figure(c: dict) -> str:
    """The clients' loss, in the gateway's terms: cut in flight (+ gave up by themselves during
    the drain; + failed on a connection HAProxy had closed while idle, which the gateway never saw)."""
    out = str(c["cut"])
    if c.get("unseen"):
        out += f" ({c['unseen']} at DOWN unseen)"
    if c.get("gave_up"):
        out += f" + {c['gave_up']} gave up"
    if c.get("idle"):
        out += f" (+{c['idle']} on idle conns)"
    return out


def gateway_figure(g: dict | None) -> str:
    """The gateway's own receipt: cut / of them the LB's."""
    return "-" if g is None else f"{g['cut']} / {g['cut_lb']}"


def results_table(rows: list[dict]) -> str:
    head = ("| scenario | mode | checks | long streams complete | short reqs / conn err / 5xx | clients lost "
            "| gateway cut / cut_lb "
            "| DRAINING | 3 Envoy drain | 4 active=0 | 1 LB 503 | 5 LB DOWN | 2 ready 503 | 6 first RST | cut at DOWN "
            "| notes |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")

    def t(v):
        return "-" if v is None else f"{v:+.1f}s"

    lines = []
    for r in rows:
        ev = r["events_rel"]
        short = r.get("short") or {}
        sh = f"{short['requests']} / {short['connection_errors']} / {short['http_5xx']}" if short else "-"
        streams = r["streams"]
        st = f"{sum(s['complete'] for s in streams)}/{len(streams)}" if streams else "-"
        lines.append(
            f"| {r['scenario']} | {r['mode']} | inter {r['check_inter']} | {st} | {sh} | {client_figure(r['client'])} "
            f"| {gateway_figure(r['gateway'])} | {t(ev['drain_start'])} "
            f"| {t(ev.get('rotation'))} | {t(ev['active_zero'])} | {t(ev['health_flip'])} | {t(ev['lb_down'])} | {t(ev['readiness_flip'])} "
            f"| {t(ev['first_rst'])} | {r.get('sessions_cut_at_down', '-')} | {note(r)} |"
        )
    return head + "\n".join(lines) + "\n"


def rollout_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    head = ("\nS3 rollout restart (2 gateways, continuous short requests through HAProxy, both restarted "
            "one after the other):\n\n"
            "| mode | checks | traffic | requests | connection errors | gateways' cut / cut_lb (unseen at DOWN) | 5xx | p50 | p99 "
            "| sessions cut at DOWN |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['mode']} | inter {r['check_inter']} | {r['seconds']:.0f} s | {r['requests']} "
             f"| {r['connection_errors']} | {gateway_figure(r['gateway'])} ({r.get('unseen', '-')}) | {r['http_5xx']} "
             f"| {r['p50_ms']} ms "
             f"| {r['p99_ms']} ms | {r['sessions_cut_at_down']} |" for r in rows]
    return head + "\n".join(lines) + "\n"


def soft_gate_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    head = ("\nSoft drain gate (404, min_drain 0s, an idle gw1 drained under short GETs, checks every 500 ms; "
            "tests/lb/soft_gate.py):\n\n"
            "| mode | drains | requests | drains with a cut | clients lost | gateway cut / cut_lb | unseen at DOWN |\n"
            "|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['mode']} | {r['drains']} | {r['requests']} | {r['drains_with_a_cut']} "
             f"| {r['client_cut']} | {r['gateway']['cut']} / {r['gateway']['cut_lb']} "
             f"| {sum(x.get('unseen', 0) for x in r['runs'])} |" for r in rows]
    return head + "\n".join(lines) + "\n"


def note(r: dict) -> str:
    parts = []
    if r.get("forced"):
        parts.append(f"forced at drain_timeout with {r.get('active_at_closing')} in flight")
    if r.get("loss"):
        lo = r["loss"]
        parts.append(f"{lo['arrivals']} arrivals, {lo['on_gw1']} on gw1, lost {lo['lost']} "
                     f"({lo['lost_in_flight_at_flip']} in flight at the flip, "
                     f"{lo['lost_started_in_detection_window']} started in the {lo['detection_window_s']}s window)")
    if r.get("lb_up_after_reopen"):
        parts.append(f"reopened from CLOSING; HAProxy UP again {r['lb_up_after_reopen'] - r['reopened']:+.1f}s "
                     "after /reopen (rise)")
    if r.get("lb_up_again"):
        parts.append(f"gw1 restarted, UP again {r['lb_up_again'] - r['trigger']:+.1f}s, "
                     f"{r['gw1_requests_after_restart']} reqs on it after")
    if (r.get("lb") or {}).get("close_after") == "lb_observed_down":
        ev = r["events"]
        parts.append(f"CLOSED {ev['readiness_flip'] - ev['health_flip']:.1f}s after the flip")
    if r.get("pinned"):
        pn = r["pinned"]
        parts.append(f"pinned clients: {pn['requests']} reqs ({pn['h1_requests']} h1, {pn['h2_requests']} h2), "
                     f"{pn['failed']} failed, {r['pinned_on_gw1']} on gw1, {pn['rotations']} reconnects asked")
    if r.get("prestop"):
        parts.append(f"preStop answered {r['prestop']['status']}")
    return "; ".join(parts)


def client_losses(rig: Rig, server: str, streams=(), short=None, pinned=None) -> dict:
    """What the clients lost, in the terms the gateway counts.

    `cut`: in flight on `server` when it was cut - long streams that did not complete (and that
    the test did not abort), short requests that got no answer (a connection error), pinned
    requests under way when HAProxy cut their session (its tcplog's termination D, at ms
    resolution); `short`: of them, the short requests; `gave_up`: streams the test aborted
    itself during the drain; `idle` (behind `mode tcp`): requests sent on a connection HAProxy
    had cut while it was idle - they never reached the gateway, which has nothing to count.
    """
    cut = sum(1 for s in streams if not s.complete and not s.gave_up)
    gave_up = sum(1 for s in streams if s.gave_up)
    short_cut = len(short.connection_errors) if short is not None else 0
    idle = 0
    if pinned is not None:
        cuts = [x.end for x in rig.haproxy.sessions() if x.server == server and x.killed_by_down]
        for f in pinned.failures:
            if any(f.start < c <= f.end for c in cuts):
                cut += 1
            else:
                idle += 1
    return {"cut": cut + short_cut, "short": short_cut, "gave_up": gave_up, "idle": idle}


# A short request HAProxy was still forwarding when it marked the gateway DOWN is lost without a
# stream in the gateway, or after the gateway had completed it: the clients saw it cut, the
# gateway has no cut to count. Only a short request ending this close to a DOWN may be that.
AT_DOWN_S = 0.5


def unseen_at_down(lost: int, counted: int, error_ends, downs) -> int:
    """How many of the clients' `lost` the gateway did not count (`counted`), once it is checked
    that the gateway counted no more than they lost and that each one it did not see is a short
    request that failed (at `error_ends`) within AT_DOWN_S of a DOWN instant in `downs`."""
    assert counted <= lost, f"the gateway counted {counted} cuts, the clients lost {lost}"
    at_down = sum(1 for t in error_ends if any(abs(t - d) <= AT_DOWN_S for d in downs if d is not None))
    assert lost - counted <= at_down, (
        f"the gateway did not count {lost - counted} of {lost} cuts; only {at_down} were short requests at DOWN")
    return lost - counted


def assert_counts_agree(tl: dict, short=None) -> None:
    """The gateway's receipt counts what the clients lost: every stream and connection cut in flight
    in it as an LB cut (HAProxy cut it at DOWN), every stream a client gave up by itself during the
    drain as a cut that is not the LB's, and nothing else. Exact for what was in flight in the
    gateway; a short request at the DOWN instant may be lost out of its sight (`unseen_at_down`)."""
    c, g = tl["client"], tl["gateway"]
    detail = f"{tl['scenario']} {tl['mode']}: the gateway counted {g}, the clients lost {c}"
    assert (g["cut_other"], g["cut"]) == (c["gave_up"], g["cut_lb"] + c["gave_up"]), detail
    ends = [e.end for e in short.connection_errors] if short is not None else []
    c["unseen"] = unseen_at_down(c["cut"], g["cut_lb"], ends, [tl["events"]["lb_down"]])


def finish(run_dir: Path, rig: Rig, *, scenario: str, mode: str, trigger: float, gw_name: str = "gw1",
           status: dict | None = None, streams=(), short=None, pinned=None, pair: tuple[str, str] = ("current", "improved"),
           extra: dict | None = None, receipt: dict | None = None) -> dict:
    """Builds, writes and draws one run's timeline; returns it, once it has checked that the
    gateway's own count (its receipt, `receipt` when the gateway no longer runs) agrees with
    what the clients lost."""
    gw = rig.gw(gw_name)
    status = status or gw.status()
    client = client_losses(rig, gw_name, streams, short, pinned)
    receipt = receipt or gw.receipt(at_least=client["cut"] + client["gave_up"])
    downs = [n for s, n in rig.haproxy.down_events() if s == gw_name]
    killed = [r for r in rig.haproxy.requests() if r.killed_by_down and r.server == gw_name]
    tl = timeline.build(
        scenario=scenario,
        mode=mode,
        trigger=trigger,
        status=status,
        samples=gw.poller.samples,
        stat=rig.stat,
        server=gw_name,
        streams=[s.summary() for s in streams],
        short=short,
        pinned=pinned,
        haproxy_log=rig.haproxy.requests(),
        draining_lb_status=rig.config.get("draining_lb_status", 200),
        inter=rig.timing.inter,
        # Sessions HAProxy cut at DOWN: its log lines with termination code D, or the count in
        # its "Server ... is DOWN ... N sessions active" message, whichever is larger (the
        # message can miss an HTTP/2 stream; a request cut before its response has no log line).
        extra={"server": gw_name, "haproxy_down_message_sessions": downs[0] if downs else None,
               "sessions_cut_at_down": max(len(killed), downs[0] if downs else 0),
               "timing": rig.timing.name, "client": client, "gateway": receipt, **(extra or {})},
    )
    d = run_dir / scenario
    timeline.write_json(tl, d / f"{mode}.json")
    panels = []
    for m in pair:
        p = d / f"{m}.json"
        panels.append((m, json.loads(p.read_text()) if p.exists() else None))
    timeline.render_svg(d / "timeline.svg", panels, f"{scenario}: {pair[0]} vs {pair[1]} (HAProxy inter {rig.timing.inter}, fall 2)")
    RESULTS.append(tl)
    assert_counts_agree(tl, short)
    return tl


def lb_down_seen(rig: Rig, name: str, after: float, timeout: float) -> float:
    return wait_for(lambda: rig.stat.first(name, "DOWN", after), timeout, 0.05, f"HAProxy marks {name} DOWN")


def wait_streams(streams, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for s in streams:
        s.wait(max(0.1, deadline - time.monotonic()))


# -- the reference configuration ---------------------------------------------------------------


def _directives(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        code = line.split("#", 1)[0].rstrip()
        if code.strip():
            out.append(code)
    return out


def test_reference_haproxy_configs_are_valid_and_differ_by_disable_on_404(tmp_path):
    """Both reference files parse (haproxy -c, every optional frontend on) and differ only by
    `http-check disable-on-404` in each backend that checks drain-gate."""
    env = {**os.environ, "HAPROXY_SOCKET": str(tmp_path / "admin.sock"), "GW2_ADDR": "127.0.0.1:1",
           "TLS_PEM": str(make_cert(tmp_path)), "GW1_TLS_ADDR": "127.0.0.1:2", "GW2_TLS_ADDR": "127.0.0.1:3",
           "APISERVER_ADDR": "127.0.0.1:4"}
    for cfg in (CFG, CFG_SOFT_DRAIN):
        r = subprocess.run(["haproxy", "-c", "-f", str(cfg)], env=env, capture_output=True, text=True)
        assert r.returncode == 0 and "WARNING" not in r.stdout + r.stderr, f"{cfg.name}: {r.stdout}{r.stderr}"
    plain, soft = _directives(CFG), _directives(CFG_SOFT_DRAIN)
    extra = [line for line in soft if line not in plain]
    checked = [line for line in plain if line.strip().startswith("option httpchk")]
    assert [line.strip() for line in extra] == ["http-check disable-on-404"] * len(checked) == ["http-check disable-on-404"] * 2
    assert [line for line in soft if line not in extra] == plain
    server = next(line for line in plain if line.strip().startswith("server gw1"))
    for word in ("check port", "rise 2", "fall 2", "on-marked-down shutdown-sessions"):
        assert word in server
    assert any(line.split() == ["retries", "3"] for line in plain)
    assert any(line.split()[:2] == ["option", "httpchk"] and "/health_check.html" in line for line in plain)


def test_reference_tcp_config_is_valid_with_the_same_checks(tmp_path):
    """haproxy-tcp.cfg parses with and without SOFT_DRAIN, is `mode tcp`, and checks the
    gateways exactly as haproxy.cfg does (shipped timings, shutdown-sessions)."""
    base = {**os.environ, "HAPROXY_SOCKET": str(tmp_path / "admin.sock"), "GW2_ADDR": "127.0.0.1:1"}
    for env in (base, {**base, "SOFT_DRAIN": "1"}):
        r = subprocess.run(["haproxy", "-c", "-f", str(CFG_TCP)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"{r.stdout}{r.stderr}"
    tcp, http = _directives(CFG_TCP), _directives(CFG)
    assert any(line.split() == ["mode", "tcp"] for line in tcp)
    for prefix in ("server gw1", "server gw2", "option httpchk", "http-check expect"):
        (line,) = [x for x in tcp if x.strip().startswith(prefix)]
        assert line in http, line
    assert "    http-check disable-on-404" in tcp


# -- S1 / S2 and their controls -------------------------------------------------------------------


def long_stream_run(run_dir: Path, *, scenario: str, mode: str, http2: bool, config: dict | None = None,
                    pair: tuple[str, str] = ("current", "improved")):
    """One long stream through HAProxy to one gateway; the drain starts DRAIN_AFTER s into it.

    mode "current":  POST /drain + POST /close-lb at once - the 503 at drain start.
    any other mode:  the preStop call (POST /drain?wait=closed) - drain-gate as shipped.
    """
    wd = run_dir / scenario / mode
    if mode == "current":
        config = {**(config or {}), **CURRENT}
    with Rig(wd, gateways=1, timing=TIMING, tls=http2, config=config) as rig:
        gw = rig.gw()
        s = CurlStream(rig.url("/stream", https=http2), seconds=STREAM_SECONDS, interval_ms=INTERVAL_MS,
                       http2=http2, label="long stream")
        wait_for(lambda: gw.status()["active"] >= 1, 10, 0.05, "the stream is in flight on the gateway")
        time.sleep(max(0.0, s.start_time + DRAIN_AFTER - time.time()))
        ps = None
        if mode == "current":
            trigger = flip_now(gw)
        else:
            ps = PreStop(gw, via="drain")
            trigger = ps.trigger
        s.wait(STREAM_SECONDS + 30)
        down = lb_down_seen(rig, "gw1", trigger, STREAM_SECONDS + 4 * TIMING.detection_window)
        if ps:
            ps.wait(STREAM_SECONDS + 60)
        final = gw.wait_state("CLOSED", 60)
        tl = finish(run_dir, rig, scenario=scenario, mode=mode, trigger=trigger, status=final, streams=[s],
                    pair=pair, extra={"prestop": {"status": ps.status_code, "returned": ps.returned} if ps else None,
                           "lb": final.get("lb")})
        return rig, s, ps, tl, down


def assert_survived(s: CurlStream, tl: dict, down: float, ps: PreStop) -> None:
    assert s.returncode == 0, f"curl exit {s.returncode}: {s.err}"
    assert s.http_code == 200
    assert s.chunks == s.expected_chunks, f"{s.chunks}/{s.expected_chunks} chunks"
    assert ps.status_code == 200 and ps.body["wait"] == "closed", ps.body
    assert tl["closing_reason"] == "active_zero" and not tl["forced"], tl["transitions"]
    # The order that makes it work: the stream ended, then the LB check flipped, then DOWN.
    assert tl["events"]["drain_start"] < s.end_time
    assert down > s.end_time, f"HAProxy marked the server DOWN {s.end_time - down:.2f}s before the stream ended"
    assert tl["sessions_cut_at_down"] == 0
    assert tl["haproxy_killed_sessions"] == []
    assert tl["events"]["first_rst"] is None
    assert tl["gateway"]["completed"] >= 1, "the gateway did not see the long stream complete"


def assert_cut(s: CurlStream, tl: dict, down: float) -> None:
    """The control must see the loss - a harness that cannot proves nothing."""
    assert not s.complete, f"the stream survived an immediate flip: {s.summary()}"
    assert s.chunks < s.expected_chunks
    if s.http2:
        # HAProxy 2.6 ends the cut h2 stream with END_STREAM: curl may exit 0; the body is short.
        assert s.returncode in (0, 92), s.err
    else:
        assert s.returncode in (18, 56), f"curl exit {s.returncode}: {s.err}"
    assert tl["sessions_cut_at_down"] >= 1
    assert tl["haproxy_killed_sessions"], "HAProxy logged no session cut with termination code D"
    assert abs(s.end_time - down) < 1.0, "the stream did not end at LB DOWN"
    assert s.end_time < s.start_time + STREAM_SECONDS


def test_s1_long_http1_stream_survives_the_drain(run_dir):
    rig, s, ps, tl, down = long_stream_run(run_dir, scenario="s1", mode="improved", http2=False)
    assert_survived(s, tl, down, ps)


def test_control_s1_immediate_flip_cuts_the_stream(run_dir):
    rig, s, ps, tl, down = long_stream_run(run_dir, scenario="s1", mode="current", http2=False)
    assert_cut(s, tl, down)


@full_only
def test_s2_long_http2_stream_survives_the_drain(run_dir):
    rig, s, ps, tl, down = long_stream_run(run_dir, scenario="s2", mode="improved", http2=True)
    assert s.http_version == "2", s.summary()
    assert_survived(s, tl, down, ps)


@full_only
def test_control_s2_immediate_flip_cuts_the_http2_stream(run_dir):
    rig, s, ps, tl, down = long_stream_run(run_dir, scenario="s2", mode="current", http2=True)
    assert s.http_version == "2", s.summary()
    assert_cut(s, tl, down)


# -- the gateway's own count of what was cut --------------------------------------------------------


def test_control_the_gateway_counts_what_haproxy_cut_and_what_clients_gave_up(run_dir):
    """The "current" flip (503 at once) with three long streams in flight - HTTP/1.1 at the plain
    frontend, HTTP/1.1 and HTTP/2 at the TLS frontend: HAProxy's DOWN cuts all three, and the
    gateway's receipt counts exactly those as LB cuts. A client that gives up by itself while
    the gateway is OPEN is not counted; one that gives up during the drain (before the flip,
    far from any DOWN) is a cut, not the LB's. One worker, so that its sorting of ends during
    the drain is observable (a request completed after the drain began is counted)."""
    wd = run_dir / "cuts" / "current"
    with Rig(wd, gateways=1, timing=TIMING, tls=True, config=CURRENT, concurrency=1) as rig:
        gw = rig.gw()
        open_quitter = CurlStream(rig.url("/stream"), seconds=60, label="gives up while OPEN")
        wait_for(lambda: gw.status()["active"] == 1, 10, 0.05, "the first client's stream in flight")
        open_quitter.kill()
        wait_for(lambda: gw.status()["active"] == 0, 10, 0.05, "its end seen by the gateway, still OPEN")
        streams = [CurlStream(rig.url("/stream"), seconds=STREAM_SECONDS, interval_ms=INTERVAL_MS, label="h1"),
                   CurlStream(rig.url("/stream", https=True), seconds=STREAM_SECONDS, interval_ms=INTERVAL_MS,
                              label="h1 at the TLS frontend"),
                   CurlStream(rig.url("/stream", https=True), seconds=STREAM_SECONDS, interval_ms=INTERVAL_MS,
                              http2=True, label="h2 at the TLS frontend")]
        quitter = CurlStream(rig.url("/stream"), seconds=60, label="gives up during the drain")
        wait_for(lambda: gw.status()["active"] == 4, 10, 0.05, "four streams in flight")
        trigger = time.time()
        assert gw.post("/drain").json()["state"] == "DRAINING"
        # The worker sorts ends from its next tick on: wait until it counts one.
        wait_for(lambda: requests.get(rig.url("/"), timeout=5).status_code == 200
                 and gw.status()["receipt"]["completed"] >= 1, 10, 0.05, "the worker sorting the drain's ends")
        quitter.kill()
        assert gw.receipt(at_least=1)["cut"] == 1, "the client that gave up during the drain"
        assert gw.post("/close-lb").json()["state"] == "CLOSING"
        down = lb_down_seen(rig, "gw1", trigger, 4 * TIMING.detection_window)
        wait_streams(streams, STREAM_SECONDS + 30)
        tl = finish(run_dir, rig, scenario="cuts", mode="current", trigger=trigger, streams=streams + [quitter],
                    pair=("current", "current"))
    assert streams[2].http_version == "2", streams[2].summary()
    for s in streams:
        assert_cut(s, tl, down)
    assert open_quitter.gave_up and quitter.gave_up
    g = tl["gateway"]
    assert (g["cut"], g["cut_lb"], g["cut_other"], g["cut_http"], g["cut_tcp"]) == (4, 3, 1, 4, 0), g
    assert {k: tl["client"][k] for k in ("cut", "gave_up", "idle", "unseen")} == \
        {"cut": 3, "gave_up": 1, "idle": 0, "unseen": 0}, tl["client"]


# -- S1 with LB-observed-down ---------------------------------------------------------------------


@full_only
def test_s1_lb_observed_down_closes_after_fall_checks(run_dir):
    """close_after=lb_observed_down: CLOSED about fall x inter after the flip, not a blind lb_buffer."""
    with Rig(run_dir / "s1-lb-observed" / "probe", gateways=1, timing=TIMING) as probe:
        assert "lb" in probe.gw().status(), "/drain/status has no `lb` key: the LB view is missing"
    lb_buffer_s = 1
    blind = run_dir / "s1" / "improved.json"  # the same S1 with close_after=lb_buffer, if it ran
    if blind.exists():
        (run_dir / "s1-lb-observed").mkdir(parents=True, exist_ok=True)
        (run_dir / "s1-lb-observed" / "lb_buffer.json").write_text(blind.read_text())
    config = {"close_after": "lb_observed_down", "lb_fall": 2, "lb_buffer": f"{lb_buffer_s}s"}
    rig, s, ps, tl, down = long_stream_run(run_dir, scenario="s1-lb-observed", mode="lb_observed_down",
                                           http2=False, config=config, pair=("lb_buffer", "lb_observed_down"))
    assert_survived(s, tl, down, ps)
    flip, closed = tl["events"]["health_flip"], tl["events"]["readiness_flip"]
    waited = closed - flip
    # CLOSED only once the LB has really marked the server DOWN ...
    assert closed >= down - 0.2, f"CLOSED {down - closed:.2f}s before HAProxy's DOWN"
    # ... which takes (fall-1)..fall checks after the flip, then lb_buffer: far less than a blind 10 s.
    assert waited <= TIMING.detection_window + TIMING.inter_s + lb_buffer_s + 1.0, waited
    assert waited < 10, waited
    lb = tl["lb"]
    assert lb["observed_down"] is True, lb
    checkers = {c["source"]: c for c in lb["checkers"]}
    assert "127.0.0.1" in checkers, lb
    assert checkers["127.0.0.1"]["consecutive_non_200"] >= 2, lb


# -- S4 ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["improved", "current"])
def test_s4_ten_long_streams_and_short_traffic(run_dir, mode):
    wd = run_dir / "s4" / mode
    with Rig(wd, gateways=1, timing=TIMING, config=CURRENT if mode == "current" else None) as rig:
        gw = rig.gw()
        short = ShortLoop(rig.url("/"), duration=STREAM_SECONDS + 30, workers=2, pause=0.02).start()
        streams = [CurlStream(rig.url("/stream"), seconds=STREAM_SECONDS, interval_ms=INTERVAL_MS, label=f"stream {i}")
                   for i in range(10)]
        wait_for(lambda: gw.status()["active"] >= 10, 10, 0.05, "10 streams in flight")
        time.sleep(max(0.0, streams[0].start_time + DRAIN_AFTER - time.time()))
        ps = PreStop(gw) if mode == "improved" else None
        trigger = ps.trigger if ps else flip_now(gw)
        # One gateway: once it has flipped, whatever is sent after LB DOWN has no server. The
        # short traffic runs until the flip (CLOSING), with every long stream in flight.
        wait_for(lambda: gw.status()["state"] in ("CLOSING", "CLOSED"), STREAM_SECONDS + 30, 0.02,
                 "the LB check flip")
        short.stop()
        wait_streams(streams, STREAM_SECONDS + 30)
        down = lb_down_seen(rig, "gw1", trigger, 4 * TIMING.detection_window + STREAM_SECONDS)
        if ps:
            assert ps.wait(60) == 200
        final = gw.wait_state("CLOSED", 60)
        tl = finish(run_dir, rig, scenario="s4", mode=mode, trigger=trigger, status=final, streams=streams,
                    short=short)
    lost = [s.summary() for s in streams if not s.complete]
    assert short.total > 50
    assert not short.connection_errors and not short.server_errors, short.summary()
    if mode == "improved":
        assert not lost, lost
        assert tl["closing_reason"] == "active_zero" and not tl["forced"]
        assert down > max(s.end_time for s in streams)
        assert tl["sessions_cut_at_down"] == 0
    else:
        assert len(lost) == 10, f"the immediate flip cut only {len(lost)} of 10 streams"
        assert len(tl["haproxy_killed_sessions"]) == 10


# -- S3 -----------------------------------------------------------------------------------------------


@full_only
@pytest.mark.parametrize("lb_status", [200, 404])
def test_s3_rollout_under_continuous_short_requests(run_dir, lb_status):
    """Two gateways; gw1 goes through the preStop drain (GET /prestop), is stopped at CLOSED
    and started again while short requests run for >= 30 s."""
    mode = "default-200" if lb_status == 200 else "soft-404"
    config = SOFT if lb_status == 404 else None
    wd = run_dir / "s3" / mode
    duration = 36.0
    with Rig(wd, gateways=2, timing=TIMING, config=config, soft_drain=lb_status == 404) as rig:
        gw1 = rig.gw("gw1")
        short = ShortLoop(rig.url("/"), duration=duration, workers=2, pause=0.01).start()
        rig.wait_answered(20, 30)  # traffic flows through both gateways before the rollout
        ps = PreStop(gw1, via="prestop")
        assert ps.wait(120) == 200, ps.body
        final = gw1.status()
        down = lb_down_seen(rig, "gw1", ps.trigger, 5)
        stopped = time.time()
        gw1.stop()
        gw1.start()
        started = time.time()
        up = wait_for(lambda: rig.stat.first("gw1", "UP", started), 10 * TIMING.inter_s + 10, 0.05, "gw1 UP again")
        short.join(duration + 30)
        served_after = [r for r in rig.haproxy.requests() if r.server == "gw1" and r.accept > up]
        tl = finish(run_dir, rig, scenario="s3", mode=mode, trigger=ps.trigger, status=final, short=short,
                    pair=("default-200", "soft-404"), receipt=final["receipt"],
                    extra={"stopped": stopped, "restarted": started, "lb_up_again": up,
                           "gw1_requests_after_restart": len(served_after)})
    summary = short.summary()
    assert short.started + duration - 1 <= time.time() and short.total > 500, summary
    assert up > started and served_after, "gw1 did not take traffic again after the restart"
    assert down < stopped, "gw1 was stopped before HAProxy had marked it DOWN"
    assert not short.server_errors, summary
    if lb_status == 404:
        assert not short.connection_errors, summary
        # HAProxy processed the 404 (NOLB, "stopping") before any 503: its log is in check order.
        # (Polled `show stat` cannot order them: the gated flip follows the 404 within milliseconds.)
        events = rig.haproxy.state_events("gw1")
        assert "stopping" in events and events.index("stopping") < events.index("DOWN"), events
        assert tl["sessions_cut_at_down"] == 0
    else:
        # The default 200: after the 503 flip HAProxy keeps sending new requests to gw1 until DOWN;
        # a request that happens to be in flight at that instant is cut. Every connection error
        # must be one of those - nothing else may fail.
        for e in short.connection_errors:
            assert abs(e.end - down) < 0.5, f"connection error {e.end - down:+.2f}s from LB DOWN: {e.error}"


# -- S3 as the sidecar design ran it: a rollout restart of both gateways ----------------------------

S3_SECONDS = 90.0
S3_SETTLE = 10.0  # traffic on both gateways before the rollout begins
ISTIO_DRAIN_S = 5.0  # Istio's default terminationDrainDuration: what "current" waits before Envoy exits


def restart_pod(rig: Rig, gw, mode: str) -> dict:
    """One pod of the rollout: its termination, then the new pod, until HAProxy has it UP again.

    current:  the order before drain-gate (events 1 -> 5 -> 6): the LB check flips to 503 at once and
              istio-proxy drains its listeners for Istio's default 5 s, then exits.
    improved: drain-gate as shipped: the preStop hook (GET /prestop) is held until CLOSED, then exit.
    """
    trigger = time.time()
    if mode == "current":
        flip_now(gw)
        requests.post(gw.envoy.admin("/drain_listeners?graceful"), timeout=5).raise_for_status()
        time.sleep(ISTIO_DRAIN_S)  # the modelled fixed drain period, not a wait for a condition
    else:
        ps = PreStop(gw, via="prestop")
        assert ps.wait(120) == 200, ps.body
    receipt = gw.status()["receipt"]  # this pod's drain, before the pod is gone
    stopped = time.time()
    gw.stop()
    gw.start()
    started = time.time()
    up = wait_for(lambda: rig.stat.first(gw.name, "UP", started), 10 * TIMING.inter_s + 10, 0.05,
                  f"{gw.name} UP again")
    down = rig.stat.first(gw.name, "DOWN", trigger)
    return {"gateway": gw.name, "trigger": trigger, "down": down, "stopped": stopped, "up": up, "receipt": receipt}


@full_only
@pytest.mark.parametrize("mode", ["current", "improved", "improved-404"])
def test_s3_rollout_restart_of_both_gateways(run_dir, mode):
    """The sidecar design's S3: replicas 2, 90 s of continuous traffic through HAProxy, both gateways
    restarted one after the other. Connection errors and 5xx are counted apart (retries 3)."""
    soft = mode == "improved-404"
    with Rig(run_dir / "s3-rollout" / mode, gateways=2, timing=TIMING, config=SOFT if soft else None,
             soft_drain=soft) as rig:
        short = ShortLoop(rig.url("/"), duration=S3_SECONDS, workers=4, pause=0).start()
        time.sleep(S3_SETTLE)
        pods = [restart_pod(rig, rig.gw(name), "current" if mode == "current" else "improved")
                for name in ("gw1", "gw2")]
        short.join(S3_SECONDS + 30)
        log = rig.haproxy.requests()
        cut = [x for x in log if x.killed_by_down]
        downs = rig.haproxy.down_events()
    summary = short.summary()
    gateway = {k: sum(p["receipt"][k] for p in pods) for k in ("cut", "cut_lb", "cut_other")}
    ROLLOUTS.append({"mode": mode, "check_inter": TIMING.inter, "seconds": summary["ended"] - summary["started"],
                     **{k: summary[k] for k in ("requests", "connection_errors", "http_5xx", "p50_ms", "p99_ms")},
                     "sessions_cut_at_down": max(len(cut), sum(n for _, n in downs)), "gateway": gateway,
                     "errors": [vars(e) for e in short.connection_errors + short.server_errors],
                     "haproxy_killed": [vars(x) for x in cut], "pods": pods})
    (run_dir / "s3-rollout" / f"{mode}.json").write_text(json.dumps(ROLLOUTS[-1], indent=2))
    assert summary["ended"] - short.started >= S3_SECONDS - 1 and short.total > 1000, summary
    # Each gateway counted what its DOWN cut: the clients' connection errors, all of them the LB's
    # (less a short request at a DOWN instant the gateway never saw cut). In "current", Envoy's own
    # listener drain (the modelled pod kill, --drain-time-s 1 here) also closes connections HAProxy
    # still sends on: requests lost without a stream in the gateway, and not the LB's cut.
    assert gateway["cut_other"] == 0, (gateway, summary)
    errors = summary["connection_errors"]
    if mode == "current":
        assert gateway["cut_lb"] <= errors, (gateway, summary)
        ROLLOUTS[-1]["unseen"] = errors - gateway["cut_lb"]
    else:
        ROLLOUTS[-1]["unseen"] = unseen_at_down(errors, gateway["cut_lb"], [e.end for e in short.connection_errors],
                                                [p["down"] for p in pods])
    for p in pods:
        assert p["down"] is not None and p["down"] < p["stopped"], f"{p['gateway']} stopped before DOWN: {p}"
        assert any(x.server == p["gateway"] and x.accept > p["up"] for x in log), f"{p['gateway']} idle after UP"
    if mode == "current":
        # The control: this rig must see the loss it is there to show.
        assert summary["connection_errors"] + summary["http_5xx"] >= 1, summary
    elif soft:
        assert summary["connection_errors"] == 0 and summary["http_5xx"] == 0, summary
    else:
        # 200 while draining: HAProxy sends new requests until DOWN; only those in flight at a DOWN
        # instant may fail, nothing else.
        at_down = [p["down"] for p in pods]
        for e in short.connection_errors + short.server_errors:
            assert min(abs(e.end - d) for d in at_down) < 0.5, f"error away from any DOWN: {e}"


# -- maintenance drain, then reopen ------------------------------------------------------------------


RISE = 2  # as in the reference cfg


def test_reopen_from_a_maintenance_drain_returns_after_rise(run_dir):
    """POST /drain?hold=closing takes gw1 out of HAProxy and keeps it out (CLOSING, no lb_buffer
    close); POST /reopen brings it back, but HAProxy sends it traffic only after `rise` good checks."""
    wd = run_dir / "maintenance" / "reopen"
    with Rig(wd, gateways=2, timing=TIMING, config={"lb_buffer": "1s"}) as rig:
        gw1 = rig.gw("gw1")
        short = ShortLoop(rig.url("/"), duration=120, workers=2, pause=0.01).start()
        try:
            wait_for(lambda: rig.haproxy.server_of("GET / ") is not None, 10, 0.05, "traffic through HAProxy")
            drained = time.time()
            r = gw1.post("/drain?hold=closing")
            assert r.status_code == 200 and r.json()["progress"]["hold_closing"], r.text
            gw1.wait_state("CLOSING", 10)
            down = lb_down_seen(rig, "gw1", drained, 4 * TIMING.detection_window)
            # Held: well past lb_buffer the gateway is still CLOSING (ready, out of the LB).
            time.sleep(2 * TIMING.inter_s)
            assert gw1.status()["state"] == "CLOSING"
            reopened = time.time()
            assert gw1.post("/reopen").json()["state"] == "OPEN"
            up = wait_for(lambda: rig.stat.first("gw1", "UP", reopened), 10 * TIMING.inter_s + 10, 0.05,
                          "gw1 UP again")
            wait_for(lambda: any(x.server == "gw1" and x.accept > up for x in rig.haproxy.requests()), 10, 0.05,
                     "requests on gw1 again")
        finally:
            short.stop()
        log = rig.haproxy.requests()
        finish(run_dir, rig, scenario="maintenance", mode="reopen", trigger=drained, status=gw1.status(),
               short=short, pair=("reopen", "reopen"), extra={"reopened": reopened, "lb_up_after_reopen": up})
    on_gw1_while_out = [x for x in log if x.server == "gw1" and down + 0.1 < x.accept < up - 0.1]
    assert not on_gw1_while_out, on_gw1_while_out[:3]
    # 200 until the flip: HAProxy sends requests to gw1 until DOWN, and one in flight at that
    # instant is cut (the default 200 answer, see S3). Nothing else may fail.
    for e in short.connection_errors + short.server_errors:
        assert abs(e.end - down) < 0.5, f"error {e.end - down:+.2f}s from LB DOWN: {e.error}"
    # UP needs `rise` consecutive 200s after the reopen: at least (rise - 1) check intervals.
    assert up - reopened >= (RISE - 1) * TIMING.inter_s - 0.2, f"UP {up - reopened:.2f}s after /reopen"


# -- S5 ---------------------------------------------------------------------------------------------

# dense: a new 8 s stream every second - the draining gateway always has some in flight.
# sparse: a new 4 s stream every 2.5 s - each gateway idles ~1 s between its streams.
WORKLOADS = {"dense": (1.0, 8), "sparse": (2.5, 4)}
S5_DRAIN_TIMEOUT = 20


def s5_run(run_dir: Path, lb_status: int, workload: str):
    period, seconds = WORKLOADS[workload]
    mode = "default-200" if lb_status == 200 else "soft-404"
    config = {**(SOFT if lb_status == 404 else {}), "drain_timeout": f"{S5_DRAIN_TIMEOUT}s"}
    scenario = f"s5-{workload}"
    wd = run_dir / scenario / mode
    streams: list[CurlStream] = []
    with Rig(wd, gateways=2, timing=TIMING, config=config, soft_drain=lb_status == 404) as rig:
        gw1 = rig.gw("gw1")
        t0 = time.time()
        ps = None
        closed_at = None
        hard_stop = t0 + 6 + S5_DRAIN_TIMEOUT + 30
        # New streams arrive every `period` s, before and during the drain, until gw1 is CLOSED.
        i = 0
        while time.time() < hard_stop:
            streams.append(CurlStream(rig.url(f"/stream?id=s5-{i}"), seconds=seconds, interval_ms=INTERVAL_MS,
                                      label=f"s5-{i}"))
            i += 1
            if ps is None and time.time() >= t0 + 6:
                ps = PreStop(gw1)
            if ps is not None and ps.returned is not None:
                closed_at = ps.returned
                break
            time.sleep(max(0.0, t0 + i * period - time.time()))
        assert ps is not None and ps.wait(5) == 200, "gw1 did not reach CLOSED"
        wait_streams(streams, seconds + 30)
        down = lb_down_seen(rig, "gw1", ps.trigger, 5)
        final = gw1.status()
        for s in streams:
            s.server = rig.haproxy.server_of(f"id={s.label}&") or rig.haproxy.server_of(f"id={s.label} ")
        tl = finish(run_dir, rig, scenario=scenario, mode=mode, trigger=ps.trigger, status=final,
                    streams=[s for s in streams if s.server == "gw1" or not s.complete],
                    pair=("default-200", "soft-404"),
                    extra={"workload": {"period_s": period, "stream_s": seconds, "arrivals": len(streams),
                                        "until_closed": closed_at},
                           "drain_timeout_s": S5_DRAIN_TIMEOUT})
    flip, lb_down = tl["events"]["health_flip"], tl["events"]["lb_down"]
    lost = [s for s in streams if not s.complete]
    on_gw1 = [s for s in streams if s.server == "gw1"]
    in_flight_at_flip = [s for s in lost if s.start_time < flip]
    in_window = [s for s in lost if flip <= s.start_time < lb_down]
    loss = {"arrivals": len(streams), "on_gw1": len(on_gw1), "lost": len(lost),
            "lost_in_flight_at_flip": len(in_flight_at_flip), "lost_started_in_detection_window": len(in_window),
            "forced": tl["forced"], "detection_window_s": round(lb_down - flip, 2),
            "started_on_gw1_after_flip": sum(1 for s in on_gw1 if s.start_time >= flip)}
    tl["loss"] = loss
    timeline.write_json(tl, run_dir / scenario / f"{mode}.json")
    return rig, streams, tl, loss, down


def test_s5_soft_drain_404_loses_nothing_while_streams_keep_arriving(run_dir):
    rig, streams, tl, loss, down = s5_run(run_dir, 404, "dense")
    assert loss["lost"] == 0, loss
    assert tl["lb_nolb"] is not None, "HAProxy never put gw1 in NOLB"
    assert tl["lb_nolb"] < tl["events"]["health_flip"]
    assert tl["closing_reason"] == "active_zero" and not tl["forced"]
    assert tl["sessions_cut_at_down"] == 0
    # After NOLB, nothing new reached gw1.
    late = [s for s in streams if s.server == "gw1" and s.start_time > tl["lb_nolb"] + 0.2]
    assert not late, [s.summary() for s in late]


@full_only
def test_s5_soft_drain_404_sparse(run_dir):
    rig, streams, tl, loss, down = s5_run(run_dir, 404, "sparse")
    assert loss["lost"] == 0, loss
    assert tl["sessions_cut_at_down"] == 0


@full_only
@pytest.mark.parametrize("workload", ["dense", "sparse"])
def test_s5_default_200_loss_is_measured_and_explained(run_dir, workload):
    """The default 200: the LB keeps sending new long streams to the draining gateway.

    Every stream lost must be one that was on gw1 at LB DOWN: in flight at a
    forced flip (drain_timeout), or started inside the detection window.
    """
    rig, streams, tl, loss, down = s5_run(run_dir, 200, workload)
    for s in streams:
        if not s.complete:
            assert s.server == "gw1", s.summary()
            assert s.start_time < down < s.start_time + WORKLOADS[workload][1], s.summary()
    assert loss["lost"] == loss["lost_in_flight_at_flip"] + loss["lost_started_in_detection_window"], loss
    assert loss["lost"] <= (tl["sessions_cut_at_down"] or 0), loss
    if workload == "dense":
        # A new 8 s stream every ~2 s on gw1: active never reaches 0, the drain ends at drain_timeout.
        assert tl["forced"], tl["transitions"]
        assert loss["lost"] >= 1, loss


# -- L4: HAProxy `mode tcp`, clients pinned to their connection ------------------------------------

L4_CLIENTS = {"h1": 6, "h2": 2}


def l4_run(run_dir: Path, *, lb_status: int, rotate: bool):
    """Two gateways behind haproxy-tcp.cfg; pinned clients run from before the preStop call
    on gw1 until 1 s after HAProxy marked gw1 DOWN (so a connection reset while idle shows
    on its next request)."""
    mode = f"{'rotation' if rotate else 'no-rotation'}-{lb_status}"
    config = {**(SOFT if lb_status == 404 else {}), "rotate_connections": rotate}
    with Rig(run_dir / "l4" / mode, gateways=2, timing=TIMING, config=config, soft_drain=lb_status == 404,
             tcp=True) as rig:
        gw1 = rig.gw("gw1")
        clients = PinnedClients(rig.haproxy.http_port, period=0.2, duration=120, **L4_CLIENTS).start()
        n = sum(L4_CLIENTS.values())
        wait_for(lambda: len(clients.results) >= 3 * n and not gw1.status()["active"] > n, 20, 0.05,
                 "every client settled")
        pinned_on_gw1 = rig.haproxy.servers()["gw1"].scur
        assert pinned_on_gw1 >= 1, "no client connection pinned to gw1"
        ps = PreStop(gw1)
        assert ps.wait(60) == 200, ps.body
        down = lb_down_seen(rig, "gw1", ps.trigger, 10)
        wait_for(lambda: all(any(r.client == c and r.start > down + 1.0 for r in clients.results)
                             for c in range(n)), 10, 0.05, "every client sent a request after DOWN")
        clients.stop()
        final = gw1.status()
        tl = finish(run_dir, rig, scenario="l4", mode=mode, trigger=ps.trigger, status=final, pinned=clients,
                    pair=(f"no-rotation-{lb_status}", f"rotation-{lb_status}"),
                    extra={"connection_rotation": final["connection_rotation"], "pinned_on_gw1": pinned_on_gw1})
    return clients, tl, down


def assert_rotated_without_loss(clients: PinnedClients, tl: dict) -> None:
    last = tl["connection_rotation"]["last"]
    assert last and last["outcome"] == "done", tl["connection_rotation"]
    rotation = tl["events"]["rotation"]
    assert rotation is not None and tl["events"]["drain_start"] <= rotation < tl["events"]["lb_down"]
    # Envoy asked every client pinned to gw1 to reconnect, before DOWN.
    asked = {c for t, _, c in clients.rotations if rotation <= t < tl["events"]["lb_down"]}
    assert len(asked) >= tl["pinned_on_gw1"], (asked, tl["pinned_on_gw1"], clients.summary())
    assert {"h1", "h2"} <= {p for t, p, _ in clients.rotations}, clients.rotations
    assert not clients.failures, clients.summary()
    assert tl["sessions_cut_at_down"] == 0, tl["haproxy_down_message_sessions"]


def assert_pinned_connections_reset(clients: PinnedClients, tl: dict) -> None:
    """The control must see the loss: without the rotation, the connections pinned to gw1
    are still there at DOWN and HAProxy resets them."""
    assert tl["connection_rotation"]["enabled"] is False
    assert tl["events"]["rotation"] is None and not clients.rotations
    assert tl["sessions_cut_at_down"] >= 1, tl["haproxy_down_message_sessions"]
    down = tl["events"]["lb_down"]
    assert clients.failures, clients.summary()
    for f in clients.failures:
        assert f.start >= down - 0.5, f"a failure {down - f.start:.2f}s before DOWN: {f}"


@pytest.mark.parametrize("lb_status", [200, 404])
def test_l4_rotation_at_drain_start_loses_nothing(run_dir, lb_status):
    clients, tl, down = l4_run(run_dir, lb_status=lb_status, rotate=True)
    assert_rotated_without_loss(clients, tl)


@pytest.mark.parametrize("lb_status", [200, pytest.param(404, marks=full_only)])
def test_control_l4_without_rotation_pinned_connections_are_reset(run_dir, lb_status):
    clients, tl, down = l4_run(run_dir, lb_status=lb_status, rotate=False)
    assert_pinned_connections_reset(clients, tl)
def test_soft_drain_gate_idle_gateway_short_loop(run_dir):
    """Soft drain, min_drain 0s, an idle gateway drained under a loop of short GETs
    (tests/lb/soft_gate.py): gated, HAProxy always sees the 404 (NOLB) before
    the 503 and DOWN cuts nothing; the control (soft_drain_gate: false) in the same
    run flips at once, HAProxy goes from UP to DOWN and cuts what it sent meanwhile.
    Drain by drain, the gateway's receipt counts what the clients lost, as LB cuts."""
    from tests.lb import soft_gate

    drains = 8 if FULL else 3
    res = soft_gate.run(drains, run_dir / "soft-gate")
    detail = json.dumps(res, indent=1)
    gated, control = res["gated"], res["control"]
    for mode, runs in res.items():
        SOFT_GATE.append({"mode": mode, "drains": len(runs), "requests": sum(r["requests"] for r in runs),
                          "drains_with_a_cut": sum(1 for r in runs if r["cut"]),
                          "client_cut": sum(r["connection_errors"] for r in runs),
                          "gateway": {k: sum(r["gateway"][k] for r in runs) for k in ("cut", "cut_lb")},
                          "runs": runs})
    for r in gated:
        assert r["gateway"]["cut"] == 0 == r["connection_errors"], detail
    for r in control:
        assert r["gateway"]["cut_other"] == 0, detail
        r["unseen"] = unseen_at_down(r["connection_errors"], r["gateway"]["cut_lb"], r["error_ends"], [r["down"]])
    assert sum(r["gateway"]["cut_lb"] for r in control) > 0, f"the gateway counted none of the control's cuts\n{detail}"
    assert len(gated) == len(control) == drains
    for r in gated:
        assert r["cut"] == 0 and not r["sessions_cut_at_down"], detail
        assert r["nolb_before_down"], f"HAProxy did not see the 404 before the 503:\n{detail}"
        assert (r["reason"], r["forced"]) == ("active_zero", False), detail
    assert sum(r["cut"] for r in control) > 0, f"the control cut nothing: the rig proves nothing\n{detail}"
    assert not any(r["nolb_before_down"] for r in control), detail
