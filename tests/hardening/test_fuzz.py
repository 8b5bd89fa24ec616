"""Fuzzed requests leave the real health listener serving and the state OPEN
(the pure core is fuzzed by tests/props.rs): ≥ 5k random requests over raw
sockets — odd methods, 64 KiB paths, bad percent-encoding, huge and many
headers, bodies on GET, broken chunking, pipelining. Admin calls are allowed only from 127.0.0.2, so
every admin path can be fuzzed from 127.0.0.1 without moving the state.

Envoy must log no wasm panic or trap, answer only documented codes, the VM
must keep serving, and the state must stay OPEN with no transition logged.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import random
import socket
from collections import Counter

import pytest

from tests.harness.envoy import VM_TROUBLE, transitions
from tests.harness.wire import fresh_get, state, statuses

RNG_SEED = 6
CONNECTIONS = 1600
PATHS = ["/health_check.html", "/health", "/live", "/drain/status", "/drain", "/close-lb", "/close",
         "/reopen", "/fault", "/prestop", "/", "/nope"]
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "PROPFIND", "QUERY", "get",
           "post", "CONNECT", "BREW", "G\x01T", "X" * 300, ""]
# What a fuzzed request may get: the plugin's documented answers, or Envoy's
# own refusal of a malformed request before the plugin sees it (400, 413,
# 414, 426 for HTTP/1.0, 431, 501, 505), or its 100 Continue. Never 401 (no token is configured), 5xx from the
# plugin (FAULT, state unavailable) or Envoy's 503 for a failed VM.
ALLOWED = {100, 200, 304, 400, 403, 404, 405, 413, 414, 426, 431, 501, 505}


def junk(rng: random.Random, n: int) -> str:
    alphabet = "abcXYZ019%&=?/.;:~!$'()*+,@[]{}<>\"\\|^` \t"
    return "".join(rng.choice(alphabet) for _ in range(n))


def fuzz_path(rng: random.Random) -> str:
    base = rng.choice(PATHS)
    r = rng.random()
    if r < 0.05:
        return "/" + "a" * 65536  # 64 KiB path
    if r < 0.15:
        return base + rng.choice(["%", "%z", "%zz", "%0", "%00", "%C0%AF", "%FF%FE", "%25%", "%%"])
    if r < 0.25:
        return base + "?" + "&".join(rng.choice(["wait=closed", "timeout=1ms", "timeout=99999999999999h",
                                                  "timeout=%31s", "wait", "=", "&&", junk(rng, 8), "x" * 3000])
                                     for _ in range(rng.randint(1, 4)))
    if r < 0.32:
        return rng.choice(["*", "http://x" + base, "//" + base, "/../" + base, base + "/..", base.upper(),
                           base + "#frag", base + ";p=1", "\u00e9" + base, base + "\u2028"])
    if r < 0.40:
        return base + junk(rng, rng.randint(1, 40))
    return base


def fuzz_request(rng: random.Random, last: bool) -> bytes:
    """One request. Only the last of a pipeline may break the framing (Envoy
    drops the connection there), so that the ones before it all reach the plugin."""
    if last:
        method = rng.choice(METHODS) if rng.random() < 0.5 else rng.choice(["GET", "HEAD", "POST"])
        version = rng.choice(["HTTP/1.1"] * 8 + ["HTTP/1.0", "HTTP/2.0", "HTTP/9.9", "HTTP/1.1 extra"])
    else:
        method = rng.choice(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "PROPFIND"])
        version = "HTTP/1.1"
    path = fuzz_path(rng) if last else fuzz_path(rng).replace("a" * 65536, "a" * 600)
    headers = ["Host: fuzz"]
    r = rng.random() if last else 0.1 + rng.random() * 0.9
    if r < 0.05:
        headers.append("X-Big: " + "b" * rng.choice([8000, 50000, 70000]))  # huge header
    elif r < 0.10:
        headers += [f"X-H{i}: {junk(rng, 20)}" for i in range(rng.choice([50, 150, 400]))]  # many headers
    elif r < 0.16 and last:
        headers.append(rng.choice([
            "If-None-Match: " + junk(rng, 30), "If-None-Match: *", 'If-None-Match: W/"open-200"',
            "Authorization: Bearer " + junk(rng, 30), "Authorization: " + "x" * 5000, "Host: a", "Host:",
            "Bad Header: 1", "X-Fold: a\r\n folded", "Content-Length: -1", "Content-Length: 1, 2",
            "Transfer-Encoding: gzip", "Expect: 100-continue", "Connection: upgrade\r\nUpgrade: websocket",
            "X-Nul: a\x00b", "X-Ctl: \x7f\x1b",
        ]))
    body = b""
    r = rng.random()
    if r < 0.15:  # a body, also on GET/HEAD
        body = rng.randbytes(rng.choice([1, 100, 4000, 40000]))
        headers.append(f"Content-Length: {len(body)}")
    elif r < 0.22:
        body = b"5\r\nhello\r\n0\r\n\r\n" if rng.random() < 0.5 or not last else b"zz\r\nnot-chunked\r\n"
        headers.append("Transfer-Encoding: chunked")
    elif r < 0.30 and not last:
        headers.append(rng.choice(["If-None-Match: " + junk(rng, 30), 'If-None-Match: "open-200", *',
                                   "Authorization: Bearer " + junk(rng, 30), "X-Forwarded-For: 127.0.0.2"]))
    if last:
        headers.append("Connection: close")
    head = f"{method} {path} {version}\r\n" + "\r\n".join(headers) + "\r\n\r\n"
    return head.encode("utf-8", "surrogateescape") + body


def one_connection(port: int, i: int) -> tuple[int, list[int]]:
    rng = random.Random(RNG_SEED * 7919 + i)
    n = rng.choice([1, 1, 2, 3, 5, 8])  # several requests: pipelined in one write
    data = b"".join(fuzz_request(rng, last=(k == n - 1)) for k in range(n))
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # Envoy may close on an early protocol error while we still send
        # Envoy delays its close (delayed_close_timeout, 1 s) for the peer to
        # close first: once answers flow, a quiet 200 ms means it is done.
        try:
            while len(out) < 1 << 22:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
                s.settimeout(0.2)
        except (socket.timeout, ConnectionResetError):
            pass
    return n, statuses(out)


# Admin calls only from an address no fuzzer uses; timers that never fire during the test.
FUZZED = {"admin_allow": ["127.0.0.2/32"], "drain_timeout": "60m", "lb_buffer": "60m"}


def fuzz(gw, connection, connections: int, workers: int) -> tuple[int, Counter]:
    """Runs `connection(port, i)` for each i on the health listener: (requests sent, status counts)."""
    with cf.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda i: connection(gw.ports.health, i), range(connections)))
    return sum(n for n, _ in results), Counter(c for _, cs in results for c in cs)


def assert_vm_untroubled_and_state_unmoved(gw) -> None:
    log = gw.log()
    trouble = VM_TROUBLE.search(log)
    assert not trouble, log[max(0, trouble.start() - 300):trouble.end() + 300]
    assert transitions(log) == [], "a fuzzed request moved the state"


@pytest.mark.parametrize("rng_seed", [RNG_SEED])
def test_fuzzed_requests_leave_the_vm_serving_and_the_state_open(gateway, rng_seed):
    gw = gateway(FUZZED)
    sent, codes = fuzz(gw, one_connection, CONNECTIONS, 32)
    assert sent >= 5000, sent
    assert set(codes) <= ALLOWED, codes
    # Envoy answers at most two pipelined requests that get a local reply and
    # leaves the rest of the pipeline unread (the same without the plugin, with
    # a direct_response route), so not every request sent gets an answer.
    assert sum(codes.values()) >= 2000, f"too few answers to mean anything: {codes}"
    # The plugin itself answered most of them (its codes, not only Envoy's 4xx).
    assert codes[200] + codes[403] + codes[404] + codes[405] >= 1500, codes
    assert codes[403] > 0 and codes[405] > 0 and codes[431] > 0, codes

    assert_vm_untroubled_and_state_unmoved(gw)
    # The VM keeps serving, on every worker.
    for _ in range(20):
        code, headers, body = fresh_get(gw.ports.health, "/live")
        assert code == 200 and json.loads(body) == {"state": "OPEN", "live": True}
        code, headers, body = fresh_get(gw.ports.health, "/health_check.html")
        assert (code, body) == (200, b"OK\n") and headers["etag"] == '"open-200"'
    assert state(gw) == "OPEN"


# ---- HTTP/2 (h2c, prior knowledge) ------------------------------------------

H2_CONNECTIONS = 300
# What a fuzzed HTTP/2 stream may get: the plugin's documented answers, or
# Envoy's refusal of a malformed one (400, 404, 413, 431, 501). A stream
# Envoy resets (a protocol error) gets no status at all.
H2_ALLOWED = {200, 304, 400, 403, 404, 405, 413, 431, 501}


def h2_headers(rng: random.Random, last: bool) -> list[tuple[bytes, bytes]]:
    """One stream's header block. Only the last stream of a connection may break
    the protocol (Envoy may then end the connection), so that the ones before it
    all reach the plugin."""
    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "PROPFIND"]
    if last:
        methods += ["CONNECT", "BREW", "get", "", "G T"]
    path = fuzz_path(rng).replace("a" * 65536, "a" * rng.choice([600, 20000]))
    if not last:
        path = "".join(c for c in path if 0x21 <= ord(c) < 0x7f) or "/"
    hs = [(b":method", rng.choice(methods).encode()), (b":scheme", b"http"), (b":authority", b"fuzz"),
          (b":path", path.encode("utf-8", "surrogateescape"))]
    r = rng.random()
    if r < 0.15:
        hs += [(f"x-h{i}".encode(), junk(rng, 20).strip().encode()) for i in range(rng.choice([50, 200]))]
    elif r < 0.20:
        hs.append((b"x-big", b"b" * rng.choice([8000, 70000])))
    elif r < 0.35:
        hs.append(rng.choice([(b"if-none-match", b'"open-200"'), (b"if-none-match", b"*"),
                              (b"authorization", b"Bearer " + junk(rng, 30).strip().encode()),
                              (b"x-forwarded-for", b"127.0.0.2"), (b"te", b"trailers")]))
    if last and rng.random() < 0.6:
        hs = rng.choice([
            lambda: [h for h in hs if h[0] != rng.choice([b":method", b":path", b":scheme"])],
            lambda: hs + [(b":path", b"/health")],
            lambda: hs + [(b"x-after", b"1"), (b":extra", b"pseudo after a regular header")],
            lambda: hs + [(b"Upper-Case", b"1")],
            lambda: hs + [(b"x-nul", b"a\x00b")],
            lambda: hs + [(b"connection", b"close")],
            lambda: hs + [(b"content-length", b"-1")],
            lambda: [(k, v) if k != b":scheme" else (k, rng.choice([b"", b"ftp"])) for k, v in hs],
        ])()
    return hs


def h2_exchange(s: socket.socket, conn, want: int, out: list[int]) -> int:
    """Reads until `want` streams ended (or were reset) or the connection ends;
    appends each response status to `out`; returns how many streams ended."""
    import h2.events

    done = 0
    while done < want:
        data = s.recv(65536)
        if not data:
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                out.append(int(dict(ev.headers)[b":status"]))
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                done += 1
            elif isinstance(ev, h2.events.ConnectionTerminated):
                return done
        s.sendall(conn.data_to_send())
    return done


def h2_send(conn, rng: random.Random, last: bool) -> None:
    sid = conn.get_next_available_stream_id()
    body = rng.random() < 0.2
    conn.send_headers(sid, h2_headers(rng, last=last), end_stream=not body)
    if body:
        conn.send_data(sid, rng.randbytes(rng.choice([1, 100, 16000])), end_stream=rng.random() < 0.8)


def h2_connection(port: int, i: int) -> tuple[int, list[int]]:
    """Fuzzed streams on one h2c connection: the well-formed ones first, all at
    once, then (after their answers) the last one, which may break the protocol.
    Returns (streams sent, statuses)."""
    import h2.config
    import h2.connection
    import h2.exceptions

    rng = random.Random(RNG_SEED * 104729 + i)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding=None, validate_outbound_headers=False,
        normalize_outbound_headers=False, validate_inbound_headers=False))
    conn.initiate_connection()
    n = rng.choice([1, 2, 4, 8])
    statuses: list[int] = []
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        try:
            for _ in range(n - 1):
                h2_send(conn, rng, last=False)
            s.sendall(conn.data_to_send())
            h2_exchange(s, conn, n - 1, statuses)
            h2_send(conn, rng, last=True)
            tail = rng.randbytes(rng.choice([9, 64, 300])) if rng.random() < 0.05 else b""
            s.sendall(conn.data_to_send() + tail)
            s.settimeout(0.5)
            h2_exchange(s, conn, 1, statuses)
        except (OSError, h2.exceptions.H2Error):
            pass  # Envoy ended the connection (the last stream broke the protocol)
    return n, statuses


def test_fuzzed_h2c_streams_leave_the_vm_serving_and_the_state_open(gateway):
    gw = gateway(FUZZED)
    sent, codes = fuzz(gw, h2_connection, H2_CONNECTIONS, 16)
    assert sent >= 1000, sent
    assert set(codes) <= H2_ALLOWED, codes
    # The plugin answered most streams over HTTP/2: its own codes, admin refusals included.
    assert codes[200] + codes[403] + codes[404] + codes[405] >= sent // 2, codes
    assert codes[403] > 0 and codes[200] > 0, codes
    assert_vm_untroubled_and_state_unmoved(gw)
    for _ in range(10):
        code, _, body = fresh_get(gw.ports.health, "/live")
        assert code == 200 and json.loads(body) == {"state": "OPEN", "live": True}
    assert state(gw) == "OPEN"
