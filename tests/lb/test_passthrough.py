"""TLS passthrough behind a real HAProxy (the `gateways-passthrough` frontend of
envoyfilter/haproxy/haproxy.cfg: `mode tcp`, the check on drain-gate's port,
`on-marked-down shutdown-sessions`): a long TLS connection from a
Python ssl client through HAProxy and the gateway's TCP chain to a TLS backend
is held across a drain.

- With the traffic_tcp role: the check stays 200 while the connection is open,
  HAProxy never cuts it, and the flip (then DOWN, with 0 sessions) comes when
  it closes.
- The control, in the same run: a gateway whose TCP chain is tcp_proxy alone
  (HTTP counted only) flips at once and HAProxy's DOWN cuts the connection.
- The gateway's own count: with the traffic_tcp role, a drain whose flip comes
  at once (the "current" mode) has HAProxy cut the held connection at DOWN,
  and the receipt counts it as a TCP cut by the LB - behind haproxy.cfg's
  passthrough frontend (its HTTP and passthrough backends check the gateway
  from one address) and behind haproxy-tcp.cfg. HAProxy's `shutdown-sessions`
  sends the gateway a FIN, as a client done with its connection does: a
  connection a client closes during the drain is completed, one it resets is
  a cut but not the LB's.

`make test` holds the connection a few seconds with HAProxy checking every
1 s; `make scenarios` (`pytest -m full`) holds it 30 s with the
shipped 2 s checks.
"""
from __future__ import annotations

import socket
import struct
import time

import pytest

from tests.harness import forms, results, variants
from tests.harness.envoy import free_port, wait_for
from tests.harness.haproxy import HAProxy
from tests.harness.rig import QUICK, SHIPPED
from tests.harness.tcp import Echo, Held
from tests.harness.wire import post, state, status

pytestmark = pytest.mark.full  # has a full form: `pytest -m full` (`make scenarios`)
FULL = forms.FULL
TIMING = SHIPPED if FULL else QUICK
HOLD_S = 30 if FULL else 3
BACKEND = "gateways-passthrough"
ROWS: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def _results_table():
    """This file's rows in the scenario run's results.md (`make scenarios` runs it after
    tests/lb/test_scenarios.py, in the same run directory)."""
    yield
    if ROWS:
        head = ("\nTLS passthrough behind HAProxy `mode tcp` (tests/lb/test_passthrough.py):\n\n"
                "| test | LB config | checks | cut at DOWN: clients / gateway cut_lb "
                "| reset by their client: clients / gateway cut_other | closed by their client: clients / gateway "
                "completed | gateway cut (tcp) | sessions cut at DOWN |\n"
                "|---|---|---|---|---|---|---|---|\n")
        lines = [f"| {r['test']} | {r['lb']} | inter {TIMING.inter} | {r['client_cut']} / {r['gateway']['cut_lb']} "
                 f"| {r['client_reset']} / {r['gateway']['cut_other']} | {r['client_closed']} / {r['gateway']['completed']} "
                 f"| {r['gateway']['cut']} ({r['gateway']['cut_tcp']}) | {r['down_sessions']} |" for r in ROWS]
        results.add_section("passthrough", head + "\n".join(lines) + "\n", ROWS)


@pytest.fixture
def passthrough(gateway, tmp_path):
    """Factory: passthrough(counted) -> (gateway, HAProxy) with the TLS echo
    backend behind the gateway's TCP chain; everything stopped at the end."""
    echo = Echo(tmp_path, tls=True).start()
    started: list[HAProxy] = []

    def start(name: str, counted: bool, config: dict | None = None, tcp_cfg: bool = False, concurrency: int = 2):
        """`tcp_cfg`: behind haproxy-tcp.cfg (its one backend), else haproxy.cfg's passthrough frontend."""
        port = free_port()
        gw = gateway({"lb_buffer": "60m", "drain_timeout": "10m", **(config or {})}, concurrency=concurrency,
                     transform=lambda doc, _: variants.tcp_listener(doc, port, echo.port, counted=counted))
        if tcp_cfg:
            lb = HAProxy(tmp_path / f"haproxy-{name}", [(port, gw.ports.health)], inter=TIMING.inter, tcp=True)
        else:
            lb = HAProxy(tmp_path / f"haproxy-{name}", [(gw.ports.traffic, gw.ports.health)], inter=TIMING.inter,
                         tls=False, env={"GW1_TLS_ADDR": f"127.0.0.1:{port}"})
        started.append(lb)
        lb.start()
        lb.wait_status("gw1", "UP", 15, backend=backend(lb))
        return gw, lb

    try:
        yield start
    finally:
        for lb in started:
            lb.stop()
        echo.stop()


def backend(lb: HAProxy) -> str:
    return "gateways" if lb.cfg.name == "haproxy-tcp.cfg" else BACKEND


def entry(lb: HAProxy) -> int:
    """The port a client connects to: the TCP frontend of haproxy-tcp.cfg, or haproxy.cfg's passthrough one."""
    return lb.http_port if lb.cfg.name == "haproxy-tcp.cfg" else lb.passthrough_port


def killed_at_down(lb: HAProxy) -> list:
    """The sessions HAProxy's shutdown-sessions cut: its tcplog lines with termination D (the
    "is DOWN ... N sessions active" message can read 0 for a session it cuts in the same step)."""
    return [x for x in lb.sessions() if x.backend == backend(lb) and x.killed_by_down]


def probe(port: int) -> bool:
    """One connection that echoes a line and closes (its client's FIN)."""
    with Held(port, tls=True) as conn:
        return conn.echoes()


def reset(conn: Held) -> None:
    """The client aborts: its close sends a TCP reset (SO_LINGER 0), not a FIN."""
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def receipt_of(gw, at_least: int = 0, timeout: float = 5) -> dict:
    """The gateway's receipt once its `cut` reached `at_least`, or as it is after `timeout`."""
    deadline = time.monotonic() + timeout
    while (r := status(gw)["receipt"])["cut"] < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return r


def test_long_tls_connection_survives_the_drain_and_the_control_is_cut(passthrough):
    gw, lb = passthrough("counted", counted=True)
    ctl_gw, ctl_lb = passthrough("control", counted=False)
    conn, ctl = Held(lb.passthrough_port, tls=True), Held(ctl_lb.passthrough_port, tls=True)
    try:
        assert conn.echoes() and ctl.echoes(), "TLS end to end through HAProxy and the gateway"
        wait_for(lambda: status(gw)["count"]["tcp_connections"] == 1, 10, what="the connection counted")
        assert status(ctl_gw)["active"] == 0, "the control counts HTTP only"
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        assert post(ctl_gw, "/drain").json()["state"] == "CLOSING", "nothing counted: the control flips at once"

        ctl_lb.wait_status("gw1", "DOWN", TIMING.detection_window + 5, backend=BACKEND)
        wait_for(lambda: not ctl.echoes(1), 5, what="the control's connection cut by shutdown-sessions")
        wait_for(lambda: len(killed_at_down(ctl_lb)) == 1, 5, what="the control's session logged cut at DOWN")

        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline:  # held across the drain, checked every 100 ms
            assert conn.echoes(), "the counted connection was cut"
            assert lb.servers(BACKEND)["gw1"].up and state(gw) == "DRAINING"
            time.sleep(0.1)
    finally:
        conn.close()
        ctl.close()
    wait_for(lambda: state(gw) == "CLOSING", 5, what="the flip on the close")
    st = status(gw)
    assert st["progress"]["reason"] == "active_zero" and st["progress"]["forced"] is False
    lb.wait_status("gw1", "DOWN", TIMING.detection_window + 5, backend=BACKEND)
    assert [n for _, n in lb.down_events(BACKEND)] == [0] and not killed_at_down(lb), "nothing left to cut at DOWN"
    # The client closed its connection itself during the drain: completed, no cut. The
    # control's connection was cut, but a gateway without the TCP role has nothing to count.
    r, ctl_r = status(gw)["receipt"], status(ctl_gw)["receipt"]
    ROWS.append({"test": "held across the drain", "lb": "haproxy.cfg passthrough", "client_cut": 0,
                 "client_closed": 1, "client_reset": 0, "gateway": r, "down_sessions": 0})
    assert (r["cut"], r["completed"]) == (0, 1), r
    assert ctl_r["cut"] == 0, ctl_r


@pytest.mark.parametrize("tcp_cfg", [False, True], ids=["haproxy.cfg-passthrough", "haproxy-tcp.cfg"])
def test_control_the_gateway_counts_the_connection_haproxy_cut(passthrough, tcp_cfg):
    """The flip at once (POST /drain then /close-lb) with a TLS connection held: HAProxy's DOWN
    cuts it, and the gateway counts one TCP cut, the LB's. In the same drain, before the flip:
    a connection its client closes (a FIN, as HAProxy's cut sends) is completed, one its client
    resets is a cut that is not the LB's. One worker, so that its sorting of the drain's ends is
    observable (a connection closed after the drain began is counted)."""
    gw, lb = passthrough("current", counted=True, config={"rotate_connections": False}, tcp_cfg=tcp_cfg,
                         concurrency=1)
    held, closes, resets = (Held(entry(lb), tls=True) for _ in range(3))
    try:
        assert held.echoes() and closes.echoes() and resets.echoes()
        wait_for(lambda: status(gw)["count"]["tcp_connections"] == 3, 10, what="three connections counted")
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        # The worker sorts ends from its next tick on: connect and close until one is counted.
        probes = []
        wait_for(lambda: probes.append(probe(entry(lb))) or (all(probes) and status(gw)["receipt"]["completed"] >= 1),
                 10, 0.05, what="the drain's first end sorted")
        sorted_before = status(gw)["receipt"]["completed"]
        closes.close()
        reset(resets)
        r = wait_for(lambda: (r := status(gw)["receipt"])["completed"] > sorted_before and r["cut"] >= 1 and r, 10,
                     what="the closed and the reset connection sorted")
        # (probes that ended in the worker's last tick may still be counted with them: completed at its tick)
        assert (r["cut"], r["cut_lb"]) == (1, 0) and r["completed"] >= sorted_before + 1, r
        assert post(gw, "/close-lb").json()["state"] == "CLOSING"
        lb.wait_status("gw1", "DOWN", TIMING.detection_window + 5, backend=backend(lb))
        wait_for(lambda: not held.echoes(1), 5, what="the held connection cut by shutdown-sessions")
    finally:
        for c in (held, closes, resets):
            c.close()
    r = receipt_of(gw, at_least=2)
    killed = killed_at_down(lb)
    # Closed by their client in the drain: `closes` and the probes (those that closed before the
    # worker's first tick of the drain ended while it was, to it, OPEN: not the drain's).
    ROWS.append({"test": "control: flip at once", "lb": "haproxy-tcp.cfg" if tcp_cfg else "haproxy.cfg passthrough",
                 "client_cut": 1, "client_closed": f"{1 + len(probes)}", "client_reset": 1, "gateway": r,
                 "down_sessions": len(killed)})
    assert len(killed) == 1, lb.log_tail()
    assert (r["cut_tcp"], r["cut_lb"], r["cut_other"], r["cut_http"]) == (2, 1, 1, 0), r
    assert 2 <= r["completed"] <= 1 + len(probes), r
