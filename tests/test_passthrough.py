"""TLS passthrough behind a real HAProxy (envoyfilter/haproxy/haproxy-passthrough.cfg,
`mode tcp`, `on-marked-down shutdown-sessions`): a long TLS connection from a
Python ssl client through HAProxy and the gateway's TCP chain to a TLS backend
is held across a drain.

- With the traffic_tcp role: the check stays 200 while the connection is open,
  HAProxy never cuts it, and the flip (then DOWN, with 0 sessions) comes when
  it closes.
- The control, in the same run: a gateway whose TCP chain is tcp_proxy alone
  (HTTP counted only) flips at once and HAProxy's DOWN cuts the connection.

`make test` holds the connection a few seconds with HAProxy checking every
1 s; `make scenarios` (DRAIN_GATE_SCENARIOS=full) holds it 30 s with the
seed's 2 s checks.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.harness import variants
from tests.harness.envoy import free_port, wait_for
from tests.harness.haproxy import CFG, CFG_PASSTHROUGH, HAProxy
from tests.harness.rig import QUICK, SEED
from tests.harness.tcp import Echo, Held
from tests.harness.wire import post, state, status

FULL = os.environ.get("DRAIN_GATE_SCENARIOS", "") == "full"
TIMING = SEED if FULL else QUICK
HOLD_S = 30 if FULL else 3


def _lines(path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]


def test_passthrough_config_is_valid_and_checks_like_the_http_one(tmp_path):
    env = {**os.environ, "HAPROXY_SOCKET": str(tmp_path / "admin.sock"), "GW2_ADDR": "127.0.0.1:1"}
    r = subprocess.run(["haproxy", "-c", "-f", str(CFG_PASSTHROUGH)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}"
    ours, http = _lines(CFG_PASSTHROUGH), _lines(CFG)
    assert "mode tcp" in ours and "mode http" not in ours
    for line in ("option httpchk GET /health_check.html", "http-check expect status 200"):
        assert line in ours and line in http
    def checks(lines):  # each server line from `check` on: what decides UP, DOWN and the cut
        return [line[line.index(" check "):] for line in lines if line.startswith("server ")]

    assert checks(ours) and checks(ours) == checks(http), \
        "the same check port, timing and on-marked-down shutdown-sessions"


@pytest.fixture
def passthrough(gateway, tmp_path):
    """Factory: passthrough(counted) -> (gateway, HAProxy) with the TLS echo
    backend behind the gateway's TCP chain; everything stopped at the end."""
    echo = Echo(tmp_path, tls=True).start()
    started: list[HAProxy] = []

    def start(name: str, counted: bool):
        port = free_port()
        gw = gateway({"lb_buffer": "60m", "drain_timeout": "10m"},
                     transform=lambda doc, _: variants.tcp_listener(doc, port, echo.port, counted=counted))
        lb = HAProxy(tmp_path / f"haproxy-{name}", [(port, gw.ports.health)], inter=TIMING.inter,
                     tls=False, passthrough=True)
        started.append(lb)
        lb.start()
        lb.wait_status("gw1", "UP", 15)
        return gw, lb

    try:
        yield start
    finally:
        for lb in started:
            lb.stop()
        echo.stop()


def test_long_tls_connection_survives_the_drain_and_the_control_is_cut(passthrough):
    gw, lb = passthrough("counted", counted=True)
    ctl_gw, ctl_lb = passthrough("control", counted=False)
    conn, ctl = Held(lb.http_port, tls=True), Held(ctl_lb.http_port, tls=True)
    try:
        assert conn.echoes() and ctl.echoes(), "TLS end to end through HAProxy and the gateway"
        wait_for(lambda: status(gw)["count"]["tcp_connections"] == 1, 10, what="the connection counted")
        assert status(ctl_gw)["active"] == 0, "the control counts HTTP only"
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        assert post(ctl_gw, "/drain").json()["state"] == "CLOSING", "nothing counted: the control flips at once"

        ctl_lb.wait_status("gw1", "DOWN", TIMING.detection_window + 5)
        wait_for(lambda: not ctl.echoes(1), 5, what="the control's connection cut by shutdown-sessions")
        assert ctl_lb.down_events() == [("gw1", 1)], ctl_lb.log_tail()

        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline:  # held across the drain, checked every 100 ms
            assert conn.echoes(), "the counted connection was cut"
            assert lb.servers()["gw1"].up and state(gw) == "DRAINING"
            time.sleep(0.1)
    finally:
        conn.close()
        ctl.close()
    wait_for(lambda: state(gw) == "CLOSING", 5, what="the flip on the close")
    st = status(gw)
    assert st["progress"]["reason"] == "active_zero" and st["progress"]["forced"] is False
    lb.wait_status("gw1", "DOWN", TIMING.detection_window + 5)
    assert lb.down_events() == [("gw1", 0)], "nothing left to cut at DOWN"
