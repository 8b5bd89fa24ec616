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

`make test` holds the connection a few seconds with HAProxy checking every
1 s; `make scenarios` (DRAIN_GATE_SCENARIOS=full) holds it 30 s with the
shipped 2 s checks.
"""
from __future__ import annotations

import os
import time

import pytest

from tests.harness import variants
from tests.harness.envoy import free_port, wait_for
from tests.harness.haproxy import HAProxy
from tests.harness.rig import QUICK, SHIPPED
from tests.harness.tcp import Echo, Held
from tests.harness.wire import post, state, status

FULL = os.environ.get("DRAIN_GATE_SCENARIOS", "") == "full"
TIMING = SHIPPED if FULL else QUICK
HOLD_S = 30 if FULL else 3
BACKEND = "gateways-passthrough"


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
        lb = HAProxy(tmp_path / f"haproxy-{name}", [(gw.ports.traffic, gw.ports.health)], inter=TIMING.inter,
                     tls=False, env={"GW1_TLS_ADDR": f"127.0.0.1:{port}"})
        started.append(lb)
        lb.start()
        lb.wait_status("gw1", "UP", 15, backend=BACKEND)
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
    conn, ctl = Held(lb.passthrough_port, tls=True), Held(ctl_lb.passthrough_port, tls=True)
    try:
        assert conn.echoes() and ctl.echoes(), "TLS end to end through HAProxy and the gateway"
        wait_for(lambda: status(gw)["count"]["tcp_connections"] == 1, 10, what="the connection counted")
        assert status(ctl_gw)["active"] == 0, "the control counts HTTP only"
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        assert post(ctl_gw, "/drain").json()["state"] == "CLOSING", "nothing counted: the control flips at once"

        ctl_lb.wait_status("gw1", "DOWN", TIMING.detection_window + 5, backend=BACKEND)
        wait_for(lambda: not ctl.echoes(1), 5, what="the control's connection cut by shutdown-sessions")
        assert ctl_lb.down_events(BACKEND) == [("gw1", 1)], ctl_lb.log_tail()

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
    assert lb.down_events(BACKEND) == [("gw1", 0)], "nothing left to cut at DOWN"
