"""Connections of TCP and TLS-passthrough chains in a real Envoy: drain-gate's
network filter (role traffic_tcp, as envoyfilter/istio/tcp-filter.yaml writes
it) before tcp_proxy to a TCP or TLS echo backend counts each connection from
accept to close in the same count as the HTTP streams, and the drain flips
only once both parts are 0. The TCP role registers and beats like the HTTP
one: a gateway with only TCP servers is announced once it registered."""
from __future__ import annotations

import copy
import json

import pytest
import requests

from tests.harness import variants
from tests.harness.envoy import free_port, hcm, wait_for
from tests.harness.tcp import Echo, Held
from tests.harness.wire import fresh_get, post, state, status


@pytest.fixture
def tcp_gateway(gateway, tmp_path):
    """Factory: tcp_gateway(config, tls=False) -> (Envoy, its TCP listener's port),
    with an echo backend (TLS when `tls`) behind that listener."""
    echoes: list[Echo] = []

    def start(config: dict | None = None, tls: bool = False):
        echo = Echo(tmp_path, tls=tls).start()
        echoes.append(echo)
        port = free_port()
        gw = gateway(config, transform=lambda doc, _: variants.tcp_listener(doc, port, echo.port))
        return gw, port

    yield start
    for echo in echoes:
        echo.stop()


def parts(gw) -> tuple[int, int, int]:
    """(active, http_streams, tcp_connections) from /drain/status."""
    st = status(gw)
    return st["active"], st["count"]["http_streams"], st["count"]["tcp_connections"]


def lb(gw) -> int:
    return requests.get(gw.health("/health_check.html"), timeout=5).status_code


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls-passthrough"])
def test_a_held_connection_counts_one_until_it_closes(tcp_gateway, tls):
    gw, port = tcp_gateway({"lb_buffer": "60m"}, tls=tls)
    assert parts(gw) == (0, 0, 0)
    with Held(port, tls=tls) as conn:
        assert conn.echoes(), "bytes pass through the filter both ways"
        wait_for(lambda: parts(gw) == (1, 0, 1), 5, what="the connection counted as one")
        assert conn.echoes()
        assert parts(gw) == (1, 0, 1), "bytes do not change the count"
    wait_for(lambda: parts(gw) == (0, 0, 0), 5, what="the close released it")
    assert gw.stat("wasmcustom.drain_gate_active_connections") == 0
    assert gw.stat("wasmcustom.drain_gate_count_errors") == 0


def test_drain_waits_for_the_held_connection_then_flips(tcp_gateway):
    gw, port = tcp_gateway({"lb_buffer": "60m"}, tls=True)
    conn = Held(port, tls=True)
    try:
        assert conn.echoes()
        wait_for(lambda: parts(gw) == (1, 0, 1), 5, what="the connection counted")
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        for _ in range(10):  # a second of checks: the connection is in flight
            assert (lb(gw), state(gw)) == (200, "DRAINING")
            assert conn.echoes(), "the connection still carries bytes during the drain"
    finally:
        conn.close()
    wait_for(lambda: lb(gw) == 503, 5, what="flip to 503 once the connection closed")
    st = status(gw)
    assert st["state"] == "CLOSING" and st["progress"]["reason"] == "active_zero"
    assert st["progress"]["forced"] is False and st["progress"]["active_at_closing"] == 0
    # Made by the TCP role in the callback that closed the connection, not by a timer.
    flip = [line for line in gw.log().splitlines() if "to=CLOSING" in line]
    assert len(flip) == 1 and "drain_gate_tcp" in flip[0], flip


@pytest.mark.parametrize("last", ["http", "tcp"])
def test_mixed_flips_only_when_streams_and_connections_are_both_zero(tcp_gateway, stream, last):
    gw, port = tcp_gateway({"lb_buffer": "60m"})
    conn = Held(port)
    s = None
    try:
        assert conn.echoes()
        s = stream(gw.traffic("/stream?seconds=60&interval_ms=200"))
        wait_for(lambda: parts(gw) == (2, 1, 1), 10, what="one stream and one connection counted")
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        first, second = (conn.close, s.kill) if last == "http" else (s.kill, conn.close)
        first()
        want = (1, 1, 0) if last == "http" else (1, 0, 1)
        wait_for(lambda: parts(gw) == want, 10, what="the first part released")
        for _ in range(5):
            assert (lb(gw), state(gw)) == (200, "DRAINING"), "one part is still in flight"
        second()
    finally:
        conn.close()
        if s is not None:
            s.kill()
    wait_for(lambda: state(gw) == "CLOSING", 10, what="flip once both parts are 0")
    st = status(gw)
    assert st["progress"]["reason"] == "active_zero" and st["progress"]["forced"] is False
    assert parts(gw) == (0, 0, 0)


def test_a_connection_that_never_ends_closes_at_drain_timeout(tcp_gateway):
    gw, port = tcp_gateway({"drain_timeout": "1s", "lb_buffer": "60m"})
    with Held(port) as conn:
        assert conn.echoes()
        wait_for(lambda: parts(gw) == (1, 0, 1), 5, what="the connection counted")
        post(gw, "/drain")
        wait_for(lambda: state(gw) == "CLOSING", 10, what="forced CLOSING")
        st = status(gw)
        assert st["progress"]["forced"] is True and st["progress"]["reason"] == "drain_timeout"
        assert st["progress"]["active_at_closing"] == 1
        assert conn.echoes(), "Envoy itself does not cut it: the LB's shutdown-sessions will"
    assert "reason=drain_timeout active=1 forced=true" in gw.log()


def test_a_tcp_only_gateway_is_announced_once_its_tcp_role_registers(gateway, tmp_path):
    """No HTTP traffic listener at all: the health role alone waits (503, the
    control), and the TCP listener arriving through file-based LDS is a
    traffic role seen — announced, the count reliable, its connections counted."""
    echo = Echo(tmp_path).start()
    port, box = free_port(), {}

    def tcp_later(doc, workdir):
        doc = variants.without_listener(variants.tcp_listener(doc, port, echo.port), "traffic")
        box["all"] = copy.deepcopy(doc["static_resources"]["listeners"])
        doc["static_resources"]["listeners"] = [x for x in box["all"] if x["name"] != "tcp"]
        box["lds"] = variants.Lds(doc, workdir)
        return box["lds"].doc

    answer = lambda path: fresh_get(gw.ports.health, path)[0]  # noqa: E731
    try:
        gw = gateway({"lb_buffer": "60m"}, transform=tcp_later)
        wait_for(lambda: answer("/live") == 200, 10, what="health listener serving")
        st = status(gw)
        assert (st["waiting_for"], st["lb_status"], st["traffic"]["seen"]) == ("traffic_role", 503, False)
        box["lds"].push(box["all"])
        wait_for(lambda: answer("/health_check.html") == 200 and answer("/health") == 200, 15,
                 what="announced once the TCP role registered")
        st = status(gw)
        assert st["waiting_for"] is None and st["traffic"]["seen"] is True and st["traffic"]["roots"] >= 1
        assert st["count"]["reliable"] is True and st["count"]["unreliable_reason"] is None
        with Held(port) as conn:
            assert conn.echoes()
            wait_for(lambda: parts(gw) == (1, 0, 1), 5, what="the connection counted")
        wait_for(lambda: parts(gw) == (0, 0, 0), 5, what="the close released it")
    finally:
        echo.stop()


def misplaced(doc: dict, listener: str, role: str) -> dict:
    """The bootstrap with listener `listener`'s drain-gate filter given role `role`."""
    doc = copy.deepcopy(doc)
    for lst in doc["static_resources"]["listeners"]:
        if lst["name"] != listener:
            continue
        chain = lst["filter_chains"][0]["filters"]
        filters = chain if listener == "tcp" else hcm(lst)["http_filters"]
        for f in filters:
            if f["name"].startswith("drain-gate") or "wasm" in f["name"]:
                cfg = f["typed_config"]["config"]["configuration"]
                cfg["value"] = json.dumps({**json.loads(cfg["value"]), "role": role})
    return doc


@pytest.mark.parametrize("listener,role,loaded_as", [
    ("tcp", "traffic", "a network filter"), ("traffic", "traffic_tcp", "an HTTP filter")])
def test_a_role_loaded_as_the_wrong_kind_of_filter_passes_traffic_and_says_so(
        gateway, tmp_path, listener, role, loaded_as):
    """The traffic role as a network filter, or the TCP role as an HTTP filter: no VM fails
    (the SDK would abort it on the first callback of the other kind); what passes is not
    counted, so the count is not trusted (`misplaced_role`), and one log line says why."""
    with Echo(tmp_path) as echo:
        port = free_port()
        gw = gateway({"lb_buffer": "60m"}, wait_ready=False, transform=lambda doc, _: misplaced(
            variants.tcp_listener(doc, port, echo.port), listener, role))
        gw.wait_ready() if listener == "tcp" else wait_for(gw.admin_ready, 30, what="Envoy admin")
        for _ in range(3):
            if listener == "tcp":
                with Held(port) as conn:
                    assert conn.echoes(), "bytes pass through the misplaced filter"
            else:
                assert requests.get(gw.traffic("/stream?seconds=0"), timeout=5).status_code == 200
        wait_for(lambda: status(gw)["count"]["unreliable_reason"] == "misplaced_role", 5,
                 what="the count marked as not trusted")
        log = gw.log()
        assert f"event=misplaced_role role={role} what=\"loaded as {loaded_as}" in log
        assert log.count("event=misplaced_role") <= 3, "once per root context"
        assert "panicked" not in log and "Plugin failed" not in log
        assert post(gw, "/drain").json()["state"] == "DRAINING", "never a trusted 0"
