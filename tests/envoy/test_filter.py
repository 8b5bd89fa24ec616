"""drain-gate in a real Envoy (2 workers): the state table, every transition over
HTTP, the in-process flip, timers, held answers, caching, authorization,
configuration refusal and the exactness of the count."""
from __future__ import annotations

import concurrent.futures as cf
import subprocess
import threading
import time

import pytest
import requests

from tests.harness.envoy import REPO, wait_for
from tests.harness.wire import post, state, status

# Long enough that DRAINING and CLOSING stay put unless a test moves them.
STILL = {"min_drain": "30m", "drain_timeout": "60m", "lb_buffer": "60m"}
STATES = ["OPEN", "DRAINING", "CLOSING", "CLOSED", "FAULT"]
TABLE = {  # state: (LB, readiness, liveness)
    "OPEN": (200, 200, 200),
    "DRAINING": (200, 200, 200),
    "CLOSING": (503, 200, 200),
    "CLOSED": (503, 503, 200),
    "FAULT": (503, 503, 500),
}
# The path from OPEN to each state.
PATH = {
    "OPEN": [],
    "DRAINING": ["/drain"],
    "CLOSING": ["/drain", "/close-lb"],
    "CLOSED": ["/drain", "/close-lb", "/close"],
    "FAULT": ["/fault"],
}
COMMANDS = {"/drain": "DRAINING", "/close-lb": "CLOSING", "/close": "CLOSED", "/reopen": "OPEN", "/fault": "FAULT"}
LEGAL = {
    ("OPEN", "/drain"), ("OPEN", "/fault"),
    ("DRAINING", "/close-lb"), ("DRAINING", "/reopen"), ("DRAINING", "/fault"),
    ("CLOSING", "/close"), ("CLOSING", "/reopen"), ("CLOSING", "/fault"),
    ("CLOSED", "/fault"),
}


def lb(gw) -> int:
    return requests.get(gw.health("/health_check.html"), timeout=5).status_code


def go(gw, target: str) -> None:
    for path in PATH[target]:
        assert post(gw, path).status_code == 200, path
    assert state(gw) == target


@pytest.mark.parametrize("target", STATES)
def test_state_table(gateway, target):
    gw = gateway(STILL)
    go(gw, target)
    want_lb, want_ready, want_live = TABLE[target]
    # Fresh connections land on either worker: all must agree.
    for _ in range(10):
        r = requests.get(gw.health("/health_check.html"), headers={"connection": "close"}, timeout=5)
        assert (r.status_code, r.text) == (want_lb, "OK\n" if want_lb == 200 else "DRAIN\n")
        assert r.headers["content-type"].startswith("text/plain")
        r = requests.get(gw.health("/health"), headers={"connection": "close"}, timeout=5)
        assert r.status_code == want_ready and r.json() == {"state": target, "ready": want_ready == 200}
        r = requests.get(gw.health("/live"), headers={"connection": "close"}, timeout=5)
        assert r.status_code == want_live and r.json() == {"state": target, "live": want_live == 200}
    for path, code in [("/health_check.html", want_lb), ("/health", want_ready), ("/live", want_live)]:
        r = requests.head(gw.health(path), timeout=5)
        assert r.status_code == code and r.content == b"" and "etag" in r.headers


@pytest.mark.parametrize("start", STATES)
def test_every_transition_over_http(gateway, start):
    """Illegal commands answer 409 and change nothing; each legal one moves (fresh gateway each)."""
    gw = gateway(STILL)
    go(gw, start)
    for cmd, target in COMMANDS.items():
        if (start, cmd) in LEGAL:
            continue
        r = post(gw, cmd)
        assert r.status_code == 409, (start, cmd, r.text)
        assert r.json() == {"error": "illegal_transition", "state": start, "requested": target}
        assert state(gw) == start
    legal = [cmd for cmd in COMMANDS if (start, cmd) in LEGAL]
    for i, cmd in enumerate(legal):
        if i:
            gw = gateway(STILL)
            go(gw, start)
        r = post(gw, cmd)
        assert r.status_code == 200, (start, cmd, r.text)
        body = r.json()
        assert body["state"] == COMMANDS[cmd]
        last = body["progress"]["transitions"][-1]
        assert (last["from"], last["to"]) == (start, COMMANDS[cmd])
        assert f"event=transition from={start} to={COMMANDS[cmd]}" in gw.log()


def test_racing_callers_get_one_success(gateway):
    gw = gateway(STILL)
    with cf.ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: post(gw, "/drain", headers={"connection": "close"}).status_code, range(32)))
    assert sorted(set(codes)) == [200, 409] and codes.count(200) == 1, codes
    assert gw.log().count("to=DRAINING") == 1


def test_flip_waits_for_the_last_stream(gateway):
    gw = gateway({"lb_buffer": "60m"})
    with requests.get(gw.traffic("/stream?seconds=3&interval_ms=250"), stream=True, timeout=30) as resp:
        lines = resp.iter_lines()
        assert next(lines) == b"chunk 0"
        wait_for(lambda: status(gw)["active"] == 1, 5, what="the stream counted exactly")
        assert post(gw, "/drain").json()["state"] == "DRAINING"
        seen = []
        for line in lines:
            # Right after a chunk that is not the last, the backend is sleeping
            # 250 ms before the next one: the stream is in flight.
            if line != b"chunk 11":
                seen.append((lb(gw), state(gw)))
        assert line == b"chunk 11"
    assert len(seen) == 10 and set(seen) == {(200, "DRAINING")}, seen
    wait_for(lambda: lb(gw) == 503, 5, what="flip to 503 after the stream ended")
    st = status(gw)
    assert st["state"] == "CLOSING" and st["progress"]["reason"] == "active_zero"
    assert st["progress"]["forced"] is False and st["progress"]["active_at_closing"] == 0
    assert st["progress"]["drain_duration_ms"] >= 1000
    # Made by the traffic role in the callback that ended the stream, not by a timer.
    flip = [line for line in gw.log().splitlines() if "to=CLOSING" in line]
    assert len(flip) == 1 and "drain_gate_traffic" in flip[0], flip


def test_drain_with_nothing_in_flight_flips_at_once(gateway):
    gw = gateway({"lb_buffer": "60m"})
    r = post(gw, "/drain")
    assert r.status_code == 200 and r.json()["state"] == "CLOSING"
    assert [t["to"] for t in r.json()["progress"]["transitions"]] == ["DRAINING", "CLOSING"]


def test_min_drain_delays_the_flip(gateway):
    gw = gateway({"min_drain": "1500ms", "lb_buffer": "60m"})
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    wait_for(lambda: state(gw) == "CLOSING", 10, what="CLOSING after min_drain")
    st = status(gw)
    assert st["progress"]["reason"] == "active_zero"
    assert st["progress"]["drain_duration_ms"] >= 1500


def test_forced_close_at_drain_timeout(gateway, stream):
    gw = gateway({"drain_timeout": "1s", "lb_buffer": "60m"})
    s = stream(gw.traffic("/stream?seconds=8&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    post(gw, "/drain")
    wait_for(lambda: state(gw) == "CLOSING", 10, what="forced CLOSING")
    assert s.running(), "the stream is still in flight: the close was forced"
    st = status(gw)
    assert st["progress"]["forced"] is True and st["progress"]["reason"] == "drain_timeout"
    assert st["progress"]["active_at_closing"] == 1 and st["active"] == 1
    assert gw.stat("wasmcustom.drain_gate_forced_closes") == 1
    assert "reason=drain_timeout active=1 forced=true" in gw.log()


def test_lb_buffer_then_closed(gateway):
    gw = gateway({"lb_buffer": "1s"})
    post(gw, "/drain")
    wait_for(lambda: state(gw) == "CLOSED", 10, what="CLOSED after lb_buffer")
    p = status(gw)["progress"]
    assert p["reason"] == "lb_buffer_elapsed"
    closing, closed = (t["at"] for t in p["transitions"][1:3])
    from datetime import datetime

    gap = datetime.fromisoformat(closed) - datetime.fromisoformat(closing)
    assert gap.total_seconds() >= 1.0


def _in_background(fn):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn()), daemon=True)
    t.start()
    return t, box


@pytest.mark.parametrize("how", ["post", "prestop"])
def test_wait_closed_holds_until_closed(gateway, stream, how):
    gw = gateway({"lb_buffer": "200ms"})
    s = stream(gw.traffic("/stream?seconds=3&interval_ms=250"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    call = (lambda: post(gw, "/drain?wait=closed", timeout=30)) if how == "post" else (
        lambda: requests.get(gw.health("/prestop"), timeout=30))
    t, box = _in_background(call)
    wait_for(lambda: state(gw) == "DRAINING", 5, what="drain started by the held call")
    while s.running():
        assert t.is_alive() or state(gw) != "DRAINING", "answered while the stream was in flight"
        t.join(0.05)
    t.join(15)
    r = box["r"]
    assert r.status_code == 200 and r.json()["state"] == "CLOSED" and r.json()["wait"] == "closed"
    assert s.wait() == 0


def test_wait_joins_a_drain_and_times_out(gateway, stream):
    gw = gateway({"lb_buffer": "60m"})
    stream(gw.traffic("/stream?seconds=20&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    assert post(gw, "/drain").status_code == 200
    r = requests.get(gw.health("/prestop?timeout=300ms"), timeout=10)
    assert r.status_code == 504 and r.json()["wait"] == "timeout" and r.json()["state"] == "DRAINING"


def test_wait_is_released_by_forced_reopen(gateway, stream):
    gw = gateway({"lb_buffer": "60m"})
    stream(gw.traffic("/stream?seconds=20&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    t, box = _in_background(lambda: post(gw, "/drain?wait=closed&timeout=30s", timeout=30))
    wait_for(lambda: state(gw) == "DRAINING", 5, what="drain started")
    assert post(gw, "/reopen?force=true").status_code == 200
    t.join(10)
    r = box["r"]
    assert r.status_code == 409 and r.json()["error"] == "drain_aborted" and r.json()["state"] == "OPEN"


def test_wait_when_already_closed_answers_at_once(gateway):
    gw = gateway({"lb_buffer": "0s"})
    assert post(gw, "/drain").json()["state"] == "CLOSED"
    r = post(gw, "/drain?wait=closed")
    assert r.status_code == 200 and r.json()["wait"] == "closed"


def test_etag_and_304(gateway):
    gw = gateway(STILL)
    for path in ["/health_check.html", "/health", "/live"]:
        r = requests.get(gw.health(path), timeout=5)
        assert r.headers["cache-control"] == "max-age=1"
        tag = r.headers["etag"]
        r2 = requests.get(gw.health(path), headers={"if-none-match": tag}, timeout=5)
        assert r2.status_code == 304 and r2.headers["etag"] == tag and r2.content == b""
    tag = requests.get(gw.health("/health_check.html"), timeout=5).headers["etag"]
    go(gw, "CLOSING")
    r = requests.get(gw.health("/health_check.html"), headers={"if-none-match": tag}, timeout=5)
    assert r.status_code == 503 and r.headers["etag"] != tag


def _curl_from(source: str, method: str, url: str, *headers: str) -> tuple[int, str]:
    args = ["curl", "-s", "-o", "/dev/stderr", "-w", "%{http_code}", "--interface", source, "-X", method]
    for h in headers:
        args += ["-H", h]
    p = subprocess.run([*args, url], capture_output=True, text=True, timeout=10)
    return int(p.stdout), p.stderr


def test_admin_outside_allow_list_is_forbidden(gateway):
    gw = gateway({**STILL, "admin_allow": ["127.0.0.2/32"]})
    code, body = _curl_from("127.0.0.1", "POST", gw.health("/drain"))
    assert code == 403 and '"forbidden"' in body
    code, _ = _curl_from("127.0.0.1", "GET", gw.health("/prestop"))
    assert code == 403
    code, _ = _curl_from("127.0.0.1", "GET", gw.health("/health"))
    assert code == 200, "reads stay open"
    assert state(gw) == "OPEN"
    code, _ = _curl_from("127.0.0.2", "POST", gw.health("/drain"))
    assert code == 200 and state(gw) == "DRAINING"


def test_admin_token(gateway):
    token, next_token = "t0ken-for-the-prestop-hook", "the-next-token-after-rotation"
    gw = gateway({**STILL, "admin_allow": ["127.0.0.2/32"], "admin_token": [token, next_token]})
    for headers in [(), ("Authorization: Bearer wrong-token-wrong-token",), (f"Authorization: Basic {token}",)]:
        code, body = _curl_from("127.0.0.1", "POST", gw.health("/drain"), *headers)
        assert code == 401 and '"unauthorized"' in body, headers
    assert state(gw) == "OPEN"
    code, _ = _curl_from("127.0.0.1", "POST", gw.health("/drain"), f"Authorization: Bearer {token}")
    assert code == 200 and state(gw) == "DRAINING"
    code, _ = _curl_from("127.0.0.1", "POST", gw.health("/reopen"), f"Authorization: Bearer {next_token}")
    assert code == 200 and state(gw) == "OPEN"


def test_errors_are_specific_json(gateway):
    gw = gateway(STILL)
    r = requests.get(gw.health("/nope"), timeout=5)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = requests.get(gw.health("/drain"), timeout=5)
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"] == "method_not_allowed"
    r = post(gw, "/health")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    r = post(gw, "/drain?wait=closed&timeout=soon")
    assert r.status_code == 400 and "timeout" in r.json()["message"]
    assert state(gw) == "OPEN"


@pytest.mark.parametrize(
    "role,raw,key",
    [
        ("health", '{"role":"health","drain_timeout":"12x"}', "drain_timeout"),
        ("health", '{"role":"health","admin_allow":["10.0.0.0/40"]}', "admin_allow"),
        ("health", '{"role":"health","surprise":1}', "surprise"),
        ("traffic", '{"role":"traffic","draining_lb_status":503}', "draining_lb_status"),
        ("traffic", "not json", "(configuration)"),
    ],
)
def test_bad_configuration_is_refused_at_load(gateway, role, raw, key):
    gw = gateway(raw_config={role: raw}, wait_ready=False)
    line = wait_for(
        lambda: next((l for l in gw.log().splitlines() if f"invalid configuration: {key}:" in l), None),
        30,
        what="the refusal log line",
    )
    assert key in line
    if role == "health":
        # The plugin never runs: the health listener fails closed, or Envoy refuses the listener.
        def answer():
            if gw.proc.poll() is not None:
                return "exited"
            try:
                return requests.get(gw.health("/health_check.html"), timeout=2).status_code
            except requests.RequestException:
                return None
        assert wait_for(answer, 30, what="health listener answer") in ("exited", 503, 500)


def test_count_returns_to_zero_after_resets_and_timeouts(gateway, stream):
    gw = gateway(STILL)
    # Client resets mid-stream.
    streams = [stream(gw.traffic("/stream?seconds=30&interval_ms=200")) for _ in range(4)]
    wait_for(lambda: status(gw)["active"] == 4, 10, what="4 streams counted")
    for s in streams:
        s.kill()
    wait_for(lambda: status(gw)["active"] == 0, 10, what="count back to 0 after client resets")
    # Upstream resets.
    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: subprocess.run(["curl", "-s", "-o", "/dev/null", gw.traffic("/reset?after_ms=50")],
                                               timeout=10), range(8)))
    wait_for(lambda: status(gw)["active"] == 0, 10, what="count back to 0 after upstream resets")
    # Client timeouts while the upstream is still thinking.
    with cf.ThreadPoolExecutor(8) as pool:
        rcs = list(pool.map(lambda _: subprocess.run(["curl", "-s", "-o", "/dev/null", "--max-time", "0.3",
                                                      gw.traffic("/slow?ms=2000")], timeout=10).returncode, range(8)))
    assert set(rcs) == {28}, rcs
    # Many short requests on both workers.
    with cf.ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: requests.get(gw.traffic("/"), headers={"connection": "close"}, timeout=10).status_code, range(400)))
    assert codes.count(200) == 400
    wait_for(lambda: status(gw)["active"] == 0, 10, what="count back to 0")
    assert status(gw)["count"] == {"source": "gauge", "reliable": True, "http_streams": 0, "tcp_connections": 0,
                            "unreliable_reason": None}


def test_websocket_is_counted_until_closed(gateway):
    import socket

    gw = gateway({"lb_buffer": "60m"})
    sock = socket.create_connection(("127.0.0.1", gw.ports.traffic), timeout=10)
    sock.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                 b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    sock.sendall(b"ping")
    assert sock.recv(4096) == b"ping"
    wait_for(lambda: status(gw)["active"] == 1, 10, what="upgraded stream counted")
    post(gw, "/drain")
    assert state(gw) == "DRAINING" and lb(gw) == 200
    sock.close()
    wait_for(lambda: state(gw) == "CLOSING", 10, what="flip after the websocket closed")


def test_health_requests_are_not_counted(gateway, stream):
    gw = gateway({"lb_buffer": "60m"})
    stream(gw.traffic("/stream?seconds=20&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    held = [_in_background(lambda: post(gw, "/drain?wait=closed&timeout=20s", timeout=30)) for _ in range(3)]
    wait_for(lambda: state(gw) == "DRAINING", 5, what="drain started")
    assert all(t.is_alive() for t, _ in held), "held while the stream runs"
    for _ in range(20):
        requests.get(gw.health("/health"), timeout=5)
    assert status(gw)["active"] == 1, "only the traffic stream counts"
    post(gw, "/reopen")
    for t, _ in held:
        t.join(10)


def test_count_survives_a_stats_matcher_that_rejects_everything(gateway, stream):
    gw = gateway({"lb_buffer": "60m"}, stats_matcher={"reject_all": True})
    assert gw.stat("wasmcustom.drain_gate_active_requests") is None, "the gauge is really excluded"
    s = stream(gw.traffic("/stream?seconds=2&interval_ms=200"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted without the gauge")
    st = status(gw)
    assert st["count"] == {"source": "shared_data", "reliable": True, "http_streams": 1, "tcp_connections": 0,
                            "unreliable_reason": None}
    post(gw, "/drain")
    assert state(gw) == "DRAINING", "must not flip while the stream runs"
    assert s.wait() == 0 and s.chunks == 10
    wait_for(lambda: state(gw) == "CLOSING", 5, what="flip after the stream ended")
    assert status(gw)["active"] == 0


def test_close_after_lb_observed_down(gateway):
    gw = gateway({"close_after": "lb_observed_down", "lb_fall": 2, "lb_buffer": "200ms", "lb_down_timeout": "60s"})
    check = lambda src: _curl_from(src, "GET", gw.health("/health_check.html"))[0]  # noqa: E731
    assert check("127.0.0.1") == 200 and check("127.0.0.2") == 200
    assert post(gw, "/drain").json()["state"] == "CLOSING"
    assert [check("127.0.0.1") for _ in range(3)] == [503] * 3
    lb_status = status(gw)["lb"]
    assert lb_status["observed_down"] is False, "127.0.0.2 has not seen the 503s yet"
    assert {c["source"]: c["consecutive_503"] for c in lb_status["checkers"]} == {"127.0.0.1": 3, "127.0.0.2": 0}
    assert state(gw) == "CLOSING"
    assert check("127.0.0.2") == 503
    assert state(gw) == "CLOSING"
    assert check("127.0.0.2") == 503
    assert status(gw)["lb"]["observed_down"] is True
    wait_for(lambda: state(gw) == "CLOSED", 5, what="CLOSED after the LB was observed DOWN")
    p = status(gw)["progress"]
    assert p["reason"] == "lb_observed_down"


def test_close_after_lb_observed_down_times_out(gateway):
    gw = gateway({"close_after": "lb_observed_down", "lb_buffer": "0s", "lb_down_timeout": "1s"})
    assert _curl_from("127.0.0.1", "GET", gw.health("/health_check.html"))[0] == 200
    assert post(gw, "/drain").json()["state"] == "CLOSING"
    wait_for(lambda: state(gw) == "CLOSED", 10, what="CLOSED at lb_down_timeout")
    assert status(gw)["progress"]["reason"] == "lb_down_timeout"


def test_answers_haproxy_httpchk_on_the_wire(gateway):
    """HAProxy 2.6 `option httpchk GET /health_check.html` sends HTTP/1.0 without Host."""
    import socket

    gw = gateway(STILL)
    with socket.create_connection(("127.0.0.1", gw.ports.health), timeout=5) as sock:
        sock.sendall(b"GET /health_check.html HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.0 200") or data.startswith(b"HTTP/1.1 200"), data[:80]
    assert data.endswith(b"\r\n\r\nOK\n")


def _hold_until(gw) -> str | None:
    return status(gw)["progress"]["prestop_hold_until"]


def test_reopen_is_refused_while_a_prestop_hold_is_active(gateway, stream):
    gw = gateway({"lb_buffer": "60m"})
    stream(gw.traffic("/stream?seconds=20&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    t, box = _in_background(lambda: requests.get(gw.health("/prestop?timeout=30s"), timeout=30))
    wait_for(lambda: _hold_until(gw) is not None, 5, what="the held preStop is a hold")
    # The hold lives in one worker; every worker refuses (fresh connections spread).
    for _ in range(10):
        r = post(gw, "/reopen", headers={"connection": "close"})
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["error"] == "prestop_hold" and body["state"] == "DRAINING" and "preStop" in body["message"]
    assert t.is_alive(), "the refused reopen released the hook"
    r = post(gw, "/reopen?force=true")
    assert r.status_code == 200 and r.json()["state"] == "OPEN"
    t.join(10)
    assert box["r"].status_code == 409 and box["r"].json()["error"] == "drain_aborted"
    assert _hold_until(gw) is None


def test_a_hold_nobody_renews_expires(gateway, stream):
    """The holder goes away (here: kubelet's connection drops, so no worker
    renews the lease): the hold expires by itself and /reopen works again."""
    gw = gateway({"lb_buffer": "60m", "tick": "100ms"})
    stream(gw.traffic("/stream?seconds=20&interval_ms=500"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="stream counted")
    hook = stream(gw.health("/prestop?timeout=30s"))
    wait_for(lambda: _hold_until(gw) is not None, 5, what="the held preStop is a hold")
    assert post(gw, "/reopen").status_code == 409
    hook.kill()
    wait_for(lambda: post(gw, "/reopen").status_code == 200, 10, what="the unrenewed hold expired")
    assert state(gw) == "OPEN"


def test_maintenance_drain_holds_closing_until_reopen(gateway):
    control = gateway({"lb_buffer": "300ms"})
    assert post(control, "/drain").json()["state"] == "CLOSING"
    wait_for(lambda: state(control) == "CLOSED", 10, what="the plain drain closes after lb_buffer")
    gw = gateway({"lb_buffer": "300ms"})
    r = post(gw, "/drain?hold=closing")
    assert r.status_code == 200 and r.json()["state"] == "CLOSING" and r.json()["progress"]["hold_closing"]
    # Ten lb_buffers later it still holds: readiness 200, LB 503.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert state(gw) == "CLOSING" and lb(gw) == 503
        time.sleep(0.1)
    assert requests.get(gw.health("/health"), timeout=5).status_code == 200
    assert post(gw, "/reopen").json()["state"] == "OPEN"
    assert lb(gw) == 200
    assert post(gw, "/drain?hold=closing").json()["state"] == "CLOSING"
    assert post(gw, "/close").json()["state"] == "CLOSED"


def test_prestop_joining_a_maintenance_drain_closes_it(gateway):
    gw = gateway({"lb_buffer": "300ms"})
    assert post(gw, "/drain?hold=closing").json()["state"] == "CLOSING"
    r = requests.get(gw.health("/prestop?timeout=10s"), timeout=15)
    assert r.status_code == 200 and r.json()["state"] == "CLOSED"
    assert r.json()["progress"]["hold_closing"] is False


def _readme_block(heading: str, index: int = 0) -> str:
    """The `index`-th ```sh block of README.md after `heading`."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    return section.split("```sh\n")[1 + index].split("```", 1)[0]


def _on(gw, block: str) -> str:
    """The block aimed at the test's gateway instead of `make run`'s ports."""
    return block.replace("localhost:18180", f"127.0.0.1:{gw.ports.health}").replace(
        "localhost:18080", f"127.0.0.1:{gw.ports.traffic}")


def test_readme_run_walkthrough_runs_as_written(gateway):
    """The README's `make run` walk-through, against a real Envoy (its 20 s stream made 2 s): the
    stream is counted before the drain, the LB check answers 200 while it runs, and the preStop
    call returns at CLOSED after it ended; the stream's chunks never reach the terminal."""
    gw = gateway({"lb_buffer": "200ms"})
    block = _readme_block("## Run it", 1)
    assert "seconds=20' > /dev/null &" in block
    script = _on(gw, block).replace("seconds=20", "seconds=2")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "HTTP/1.1 200 OK" in r.stdout and "chunk" not in r.stdout, r.stdout
    assert '"state":"CLOSED"' in r.stdout, r.stdout  # only the held preStop call can print it
    s = status(gw)
    assert s["state"] == "CLOSED" and s["progress"]["forced"] is False, s


def test_readme_maintenance_walkthrough_runs_as_written(gateway):
    """The README's hand-run drain, against a real Envoy: every `# →` line prints what it says."""
    gw = gateway({"lb_buffer": "200ms"})
    block = _readme_block("### Maintenance drain")
    expected = [line.split("# →", 1)[1].split()[0] for line in block.splitlines() if "# →" in line]
    script = _on(gw, block)
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == expected
    assert state(gw) == "OPEN"
