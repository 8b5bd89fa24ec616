"""Connection rotation during a drain (event 3 of a pod termination) in a real Envoy:
the health role calls POST /drain_listeners?graceful&skip_exit on Envoy's admin
once per drain — at the flip, or in a soft drain once every LB checker was served
the 404 — Envoy closes keep-alive connections after their next response and keeps
accepting new ones, and the health listener never stops. Before that, keep-alive
connections are kept: no request of a drain pays a new connection for it."""
from __future__ import annotations

import concurrent.futures as cf
import socket
import threading
import time

import pytest
import requests

from tests.harness.envoy import wait_for
from tests.harness.wire import KeepAlive, post, status

# DRAINING stays put unless a test moves it.
STILL = {"min_drain": "30m", "drain_timeout": "60m", "lb_buffer": "60m"}
# An idle drain flips at once and then stays CLOSING.
FLIPS = {"drain_timeout": "60m", "lb_buffer": "60m"}
ADMIN_PATH = "/drain_listeners?graceful&skip_exit"


def rotation(gw) -> dict:
    return status(gw)["connection_rotation"]


def last_outcome(gw):
    last = rotation(gw)["last"]
    return last and last["outcome"] not in ("pending",) and last


def _start_drain(gw, how: str, held: list) -> None:
    if how == "drain":
        # Racing callers on both workers: one moves the state, one rotation.
        with cf.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: post(gw, "/drain").status_code, range(8)))
        assert sorted(codes) == [200] + [409] * 7, codes
    else:  # the distroless preStop form: one held GET, no second call
        def prestop():
            try:
                held.append(requests.get(gw.health("/prestop?timeout=20s"), timeout=30).status_code)
            except requests.RequestException as e:  # Envoy stopped at test end
                held.append(e)

        threading.Thread(target=prestop, daemon=True).start()
        # DRAINING lasts until the traffic role's next tick gives back its lease (an idle
        # drain then flips): a poll can miss it, so wait for the drain to have begun.
        wait_for(lambda: status(gw)["state"] in ("DRAINING", "CLOSING"), 10, what="the drain begun")


@pytest.mark.parametrize("how", ["drain", "prestop"])
def test_the_flip_rotates_keepalive_connections_and_keeps_listening(gateway, how):
    gw = gateway(FLIPS)
    before = rotation(gw)
    assert (before["enabled"], before["cluster"], before["last"]) == (True, "drain_gate_envoy_admin", None)
    assert before["admin_path"] == ADMIN_PATH
    client = KeepAlive(gw.ports.traffic)
    try:
        assert client.get() is None, "keep-alive before the drain"
        held: list = []
        _start_drain(gw, how, held)
        last = wait_for(lambda: last_outcome(gw), 10, what="the rotation's outcome")
        assert last["outcome"] == "done" and last["admin_status"] == 200 and last["error"] is None, last
        assert last["trigger"] == "flip"
        st = status(gw)
        assert st["state"] == "CLOSING"
        assert last["drain_started_at"] == st["progress"]["drain_started_at"]
        assert st["progress"]["closing_at"] <= last["requested_at"] <= last["answered_at"]
        # Envoy closes the held connection after its next response ...
        assert client.get() == "close"
    finally:
        client.close()
    # ... and keeps accepting new ones, on :18180 and (past its drain time) on traffic.
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        assert requests.get(gw.traffic("/"), timeout=5).status_code == 200
        assert requests.get(gw.health("/live"), timeout=5).status_code == 200
        time.sleep(0.25)
    # Exactly one call, from the worker that claimed it.
    assert gw.log().count("event=connection_rotation outcome=pending") == 1, gw.log_tail()
    assert gw.log().count("event=connection_rotation outcome=done") == 1


def test_keepalive_connections_are_kept_while_draining_and_rotated_at_the_flip(gateway, stream):
    """200 while draining: the LB still sends here, so a reconnect would come back — the
    drain keeps every keep-alive connection (no request pays a new connection) until the
    flip, when the LB will mark the gateway DOWN `fall` checks later."""
    gw = gateway(FLIPS)
    s = stream(gw.traffic("/stream?seconds=3&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="the stream counted")
    client = KeepAlive(gw.ports.traffic)
    try:
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        while s.running():
            assert client.get() is None, "kept alive while draining"
            time.sleep(0.2)
        wait_for(lambda: status(gw)["state"] == "CLOSING", 5, what="the flip at the stream's end")
        last = wait_for(lambda: last_outcome(gw), 5, what="the rotation at the flip")
        assert (last["outcome"], last["trigger"]) == ("done", "flip")
        assert client.get() == "close"
    finally:
        client.close()


def test_a_soft_drain_rotates_once_the_lb_was_served_its_404(gateway, stream):
    """404 while draining: once every LB checker was served the 404 (HAProxy
    `disable-on-404`: NOLB), no new connection comes here — a reconnect goes to another
    gateway, and the rotation goes out then, while the drain still runs."""
    gw = gateway({**FLIPS, "draining_lb_status": 404})
    s = stream(gw.traffic("/stream?seconds=4&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="the stream counted")
    client = KeepAlive(gw.ports.traffic)
    try:
        assert requests.get(gw.health("/health_check.html"), timeout=5).status_code == 200  # the LB
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        for _ in range(5):
            assert client.get() is None, "the LB was not served the 404 yet: kept"
            time.sleep(0.1)
        assert rotation(gw)["last"] is None
        assert requests.get(gw.health("/health_check.html"), timeout=5).status_code == 404
        last = wait_for(lambda: last_outcome(gw), 5, what="the rotation after the 404")
        assert (last["outcome"], last["trigger"]) == ("done", "soft_drain_gate")
        assert status(gw)["state"] == "DRAINING" and s.running()
        assert client.get() == "close"
    finally:
        client.close()


def test_rotation_turned_off_rotates_nothing(gateway):
    gw = gateway({**STILL, "rotate_connections": False})
    client = KeepAlive(gw.ports.traffic)
    try:
        assert post(gw, "/drain").status_code == 200
        # Longer than several ticks and than Envoy's --drain-time-s: the same
        # connection keeps being kept alive.
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            assert client.get() is None
            time.sleep(0.2)
    finally:
        client.close()
    r = rotation(gw)
    assert (r["enabled"], r["cluster"], r["last"]) == (False, None, None)
    assert "event=connection_rotation" not in gw.log()


def test_a_maintenance_drain_does_not_rotate(gateway):
    """`POST /drain?hold=closing` is meant to be reopened, and Envoy's drain sequence
    cannot be undone: a maintenance drain leaves the connections alone, and reopening
    it gives a gateway whose keep-alive connections are still kept alive."""
    gw = gateway(STILL)
    client = KeepAlive(gw.ports.traffic)
    try:
        assert post(gw, "/drain?hold=closing").json()["state"] == "DRAINING"
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            assert client.get() is None
            time.sleep(0.2)
        assert post(gw, "/reopen").status_code == 200
        assert client.get() is None
    finally:
        client.close()
    r = rotation(gw)
    assert (r["enabled"], r["last"]) == (True, None)


def test_missing_cluster_is_shown_and_the_drain_goes_on(gateway, stream):
    gw = gateway({"rotate_connections": "no_such_cluster", "lb_buffer": "60m"})
    s = stream(gw.traffic("/stream?seconds=3&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="the stream counted")
    assert post(gw, "/drain").status_code == 200
    # The drain is untouched: DRAINING while the stream runs, CLOSING when it ends ...
    assert status(gw)["state"] == "DRAINING"
    assert s.wait(30) == 0 and s.chunks == 6
    st = wait_for(lambda: (x := status(gw))["state"] == "CLOSING" and x, 10, what="CLOSING")
    assert st["progress"]["reason"] == "active_zero"
    # ... and the rotation at the flip is recorded as failed, naming the cluster.
    last = wait_for(lambda: last_outcome(gw), 10, what="the rotation's outcome")
    assert last["outcome"] == "failed" and last["requested_at"] is None, last
    assert "no_such_cluster" in last["error"], last
    assert "event=connection_rotation outcome=failed" in gw.log()



def test_reopen_does_not_undo_the_rotation(gateway):
    """The limit envoyfilter/docs/limits.md states: Envoy's drain sequence has no way back, so
    after a reopen every response still closes its connection; a second drain
    asks Envoy again."""
    gw = gateway(FLIPS)
    assert post(gw, "/drain").status_code == 200
    wait_for(lambda: last_outcome(gw), 10, what="the rotation's outcome")
    assert post(gw, "/reopen").status_code == 200
    client = KeepAlive(gw.ports.traffic)
    try:
        assert client.get() == "close"
    finally:
        client.close()
    assert status(gw)["state"] == "OPEN"
    # The next drain asks again, once, and Envoy takes it.
    first = rotation(gw)["last"]
    assert post(gw, "/drain").status_code == 200
    again = wait_for(lambda: (r := last_outcome(gw)) and r["drain_started_at"] != first["drain_started_at"] and r,
                     10, what="the second drain's rotation")
    assert again["outcome"] == "done", again
    assert gw.log().count("event=connection_rotation outcome=pending") == 2
    assert gw.alive()


def _closes(port: int, path: str) -> bool:
    """A `Connection: close` request on a fresh connection: whether the server
    closes it within 3 s after its answer (False: answered, socket left open)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got = b""
        try:
            while data := s.recv(65536):
                got += data
        except TimeoutError:
            assert got.startswith(b"HTTP/1.1 200"), got
            return False
        assert got.startswith(b"HTTP/1.1 200"), got
        return True


def test_after_the_rotation_envoy_leaves_a_closing_connection_open(gateway):
    """Measured Envoy behaviour envoyfilter/docs/limits.md states as a limit: once the drain
    sequence runs, a `Connection: close` request is answered (with
    `connection: close`) but Envoy leaves the socket open, on the traffic and
    on the health listener. Clients that read by length (curl, HAProxy's check,
    the kubelet) are not affected; one that reads until the server closes is."""
    gw = gateway(FLIPS)
    assert _closes(gw.ports.traffic, "/") and _closes(gw.ports.health, "/health")
    assert post(gw, "/drain").status_code == 200
    wait_for(lambda: last_outcome(gw), 10, what="the rotation's outcome")
    assert not _closes(gw.ports.traffic, "/")
    assert not _closes(gw.ports.health, "/health")
