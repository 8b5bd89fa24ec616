"""The admin surface, against a real Envoy: who may change
the state (source address, bearer token — and not a forged X-Forwarded-For),
that reads never change it, that request bodies are neither buffered nor
read, and that no answer carries attacker input back.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.parse

import pytest

from tests.harness.envoy import transitions
from tests.harness.wire import fresh_get, post, status

STILL = {"min_drain": "30m", "drain_timeout": "60m", "lb_buffer": "60m"}
TOKEN = "admin-token-0123456789abcdef"
OUTSIDE = "127.0.0.2"
ADMIN = [("POST", "/drain"), ("POST", "/drain?wait=closed&timeout=1s"), ("POST", "/close-lb"), ("POST", "/close"),
         ("POST", "/reopen"), ("POST", "/fault"), ("GET", "/prestop"), ("GET", "/prestop?timeout=1s")]


def request(gw, method: str, path: str, source: str | None = None, headers: dict | None = None,
            body: bytes | None = None) -> tuple[int, dict, bytes]:
    return fresh_get(gw.ports.health, path, source=source, headers=headers, method=method, timeout=10, body=body)


def snapshot(gw) -> tuple:
    st = status(gw)
    return st["state"], st["progress"]["since"], json.dumps(st["progress"]["transitions"])


def honoured(path: str) -> str:
    """The same admin call, but holding at most 100 ms."""
    if path == "/prestop":
        return "/prestop?timeout=100ms"
    return path.replace("timeout=1s", "timeout=100ms")


@pytest.mark.parametrize("method,path", ADMIN)
def test_outside_admin_allow_is_403(gateway, method, path):
    gw = gateway({**STILL, "admin_allow": ["127.0.0.1/32"]})
    before = snapshot(gw)
    for headers in [{}, {"x-real-ip": "127.0.0.1"}, {"forwarded": "for=127.0.0.1"},
                    {"authorization": f"Bearer {TOKEN}"}, {"host": "127.0.0.1"}]:
        code, h, body = request(gw, method, path, source=OUTSIDE, headers=headers)
        assert code == 403, (headers, code, body)
        assert json.loads(body)["error"] == "forbidden" and "www-authenticate" not in h
    assert snapshot(gw) == before and transitions(gw.log()) == []
    # The same call from inside the allow-list is honoured.
    code, _, _ = request(gw, method, honoured(path), source="127.0.0.1")
    assert code in (200, 409, 504), code


def forged_xff_gets_through(gw, method: str, path: str) -> bool:
    code, _, body = request(gw, method, honoured(path), source=OUTSIDE, headers={"x-forwarded-for": "127.0.0.1"})
    assert code in (200, 403, 409, 504), (code, body)
    return code != 403


@pytest.mark.parametrize("method,path", ADMIN)
def test_forged_x_forwarded_for_does_not_pass_admin_allow(gateway, method, path):
    """admin_allow checks `source.address`, which Envoy takes from
    X-Forwarded-For unless the HCM sets use_remote_address."""
    gw = gateway({**STILL, "admin_allow": ["127.0.0.1/32"]})
    assert not forged_xff_gets_through(gw, method, path)
    assert transitions(gw.log()) == []


@pytest.mark.parametrize("method,path", ADMIN)
def test_wrong_or_missing_token_is_401(gateway, method, path):
    gw = gateway({**STILL, "admin_allow": ["127.0.0.1/32"], "admin_token": TOKEN})
    before = snapshot(gw)
    for auth in [None, "", "Bearer", "Bearer ", f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer x{TOKEN}",
                 f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN.upper()}", f"Bearer{TOKEN}", f"Token {TOKEN}",
                 f"Bearer {TOKEN} {TOKEN}", "Bearer " + "A" * 4000]:
        headers = {} if auth is None else {"authorization": auth}
        code, h, body = request(gw, method, path, source=OUTSIDE, headers=headers)
        assert code == 401, (auth, code, body)
        assert h["www-authenticate"] == 'Bearer realm="drain-gate"' and json.loads(body)["error"] == "unauthorized"
    # A token in the query is no token (and an unknown parameter, but 401 first).
    sep = "&" if "?" in path else "?"
    code, _, _ = request(gw, method, f"{path}{sep}access_token={TOKEN}", source=OUTSIDE)
    assert code == 401
    assert snapshot(gw) == before and transitions(gw.log()) == []
    code, _, _ = request(gw, method, honoured(path), source=OUTSIDE,
                         headers={"authorization": f"bearer   {TOKEN} "})
    assert code in (200, 409, 504), "the right token is honoured"


# Every read, and every admin path read the wrong way: none may move the state.
READS = [("GET", "/health_check.html"), ("HEAD", "/health_check.html"), ("GET", "/health"), ("HEAD", "/health"),
         ("GET", "/live"), ("HEAD", "/live"), ("GET", "/drain/status"), ("HEAD", "/drain/status"),
         ("GET", "/health?wait=closed"), ("GET", "/drain/status?x=1"), ("GET", "/nope"),
         ("GET", "/drain"), ("HEAD", "/drain"), ("GET", "/drain?wait=closed"), ("GET", "/close-lb"),
         ("GET", "/close"), ("GET", "/reopen"), ("GET", "/fault"), ("HEAD", "/fault"), ("HEAD", "/prestop"),
         ("HEAD", "/prestop?timeout=1s"), ("GET", "/prestop?wait=closed"), ("GET", "/prestop?timeout=soon"),
         ("GET", "/prestop?timeout=0s"), ("GET", "/prestop?timeout=2h"), ("GET", "/prestop?x=1"),
         ("OPTIONS", "/drain"), ("PUT", "/drain"), ("DELETE", "/fault"), ("PATCH", "/reopen")]


def test_reads_never_change_the_state_in_any_state(gateway):
    gw = gateway({**STILL, "admin_allow": ["127.0.0.1/32"], "admin_token": TOKEN})
    outside_prestop = [  # /prestop is the one GET that drains: only with a wrong token here
        ({}, 401), ({"authorization": "Bearer wrong-token-wrong-token"}, 401),
        ({"authorization": f"Basic {TOKEN}"}, 401)]
    for step in [None, "/drain", "/close-lb", "/close", "/fault"]:
        if step:
            assert post(gw, step).status_code == 200, step
        before = snapshot(gw)
        n_before = len(transitions(gw.log()))
        for method, path in READS:
            for source in ["127.0.0.1", OUTSIDE]:
                code, _, _ = request(gw, method, path, source=source,
                                     headers={"if-none-match": '"open-200"', "authorization": "Bearer nope"})
                assert code in (200, 304, 400, 401, 404, 405, 500, 503), (method, path, code)
        for headers, want in outside_prestop:
            code, _, _ = request(gw, "GET", "/prestop", source=OUTSIDE, headers=headers)
            assert code == want, (headers, code)
        assert snapshot(gw) == before, f"a read moved the state from {before[0]}"
        assert len(transitions(gw.log())) == n_before


def _send_big_post(gw, path: str, source: str, size: int = 1 << 20) -> tuple[bytes, int]:
    """Sends the headers and the first 64 KiB of a `size` body, then waits for
    the answer; returns it and how many body bytes had been sent by then."""
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", gw.ports.health))
    body = (b'{"state":"FAULT","to":"OPEN"}' * (size // 29 + 1))[:size]
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {size}\r\n\r\n".encode())
    sent = 0
    s.setblocking(False)
    out = b""
    deadline = time.monotonic() + 10
    while b"\r\n\r\n" not in out and time.monotonic() < deadline:
        if sent < 65536:
            try:
                sent += s.send(body[sent:65536])
            except BlockingIOError:
                pass
        try:
            out += s.recv(65536)
        except BlockingIOError:
            time.sleep(0.01)
    at_answer = sent
    # Keep sending: Envoy must not take the rest in (it closes or resets).
    s.settimeout(5)
    try:
        while sent < size:
            sent += s.send(body[sent:sent + 65536])
    except OSError:
        pass
    s.close()
    return out, at_answer


def test_request_bodies_are_neither_buffered_nor_read(gateway):
    gw = gateway({**STILL, "admin_allow": ["127.0.0.1/32"]})
    head, _ = _send_big_post(gw, "/drain", OUTSIDE)
    assert head.startswith(b"HTTP/1.1 403"), head[:80]
    assert status(gw)["state"] == "OPEN"
    head, _ = _send_big_post(gw, "/fault", OUTSIDE)
    assert head.startswith(b"HTTP/1.1 403") and status(gw)["state"] == "OPEN"
    # From inside the allow-list the answer comes at the headers: the 1 MiB
    # body (which names other states) is not read, not buffered, not obeyed.
    head, sent_at_answer = _send_big_post(gw, "/drain", "127.0.0.1")
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    assert sent_at_answer <= 65536, "the answer waited for the body"
    assert status(gw)["state"] == "DRAINING"
    # The listener is still there for everyone else.
    code, _, body = fresh_get(gw.ports.health, "/live")
    assert code == 200 and json.loads(body)["state"] == "DRAINING"


MARK = "qz7mark"
PAYLOADS = [f'{MARK}<script>alert(1)</script>', f'{MARK}"}},"state":"OPEN","x":"', f"{MARK}'><img src=x>",
            f"{MARK}\\u0000{{{{7*7}}}}", f"{MARK}%3Csvg%3E"]


def test_no_answer_carries_attacker_input(gateway):
    # 127.0.0.3 may call admin endpoints; a drain there completes at once, so
    # no held answer waits.
    gw = gateway({"min_drain": "0s", "lb_buffer": "0s", "admin_allow": ["127.0.0.3/32"], "admin_token": TOKEN})
    paths = ["/health_check.html", "/health", "/live", "/drain/status", "/drain", "/close-lb", "/prestop", "/nope"]
    answers = 0
    for p in PAYLOADS:
        q = urllib.parse.quote(p, safe="")
        targets = [f"/{q}", f"/drain/status/{q}", f"/health?{q}=1", f"/drain?wait={q}",
                   f"/drain?wait=closed&timeout={q}", f"/prestop?timeout={q}", f"/health_check.html?{q}"]
        targets += paths
        headers = {"if-none-match": p, "authorization": f"Bearer {p}", "user-agent": p, "referer": p,
                   "x-forwarded-for": p, "cookie": f"s={q}", "x-request-id": p}
        for target in targets:
            for method in ["GET", "POST", "HEAD", "PUT"]:
                for source in ["127.0.0.1", "127.0.0.3"]:
                    code, h, body = request(gw, method, target, source=source, headers=headers, body=p.encode())
                    blob = body.decode("utf-8", "replace") + json.dumps(h)
                    assert MARK not in blob, (method, target, code, blob[:400])
                    answers += 1
    assert answers >= 500


def test_an_empty_admin_allow_without_a_token_locks_every_caller_out_and_says_so(gateway):
    """`admin_allow: []` and no `admin_token`: nobody may call the admin endpoints, loopback (the
    preStop hook's source) included, and the health role says so in its log when it loads."""
    gw = gateway({**STILL, "admin_allow": []})
    for method, path in ADMIN:
        code, _, body = request(gw, method, honoured(path), source="127.0.0.1")
        assert code == 403 and json.loads(body)["error"] == "forbidden", (path, code, body)
    assert fresh_get(gw.ports.health, "/health")[0] == 200, "reads stay open"
    assert status(gw)["state"] == "OPEN" and transitions(gw.log()) == []
    assert "event=config_warning" in gw.log() and "nobody can call the admin endpoints" in gw.log()
