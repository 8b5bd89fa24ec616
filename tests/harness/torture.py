"""Load for the count-exactness torture: every way an HTTP stream can end.

Each client function runs one stream (or one connection of streams) against
the traffic listener and returns the label of what happened, so the test can
prove that every kind of ending really occurred. All sockets have timeouts;
nothing here loops without a bound.
"""
from __future__ import annotations

import random
import re
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from tests.harness.variants import FAULT_HEADER
from tests.harness.wire import read_head, recv_until_close

TIMEOUT = 15


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _abort(s: socket.socket) -> None:
    """Close with a TCP RST (no FIN): the peer sees a reset."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()


def _exchange(port: int, request: bytes) -> bytes:
    """Sends one request on a new connection and reads until the peer closes or resets."""
    s = _connect(port)
    try:
        s.sendall(request)
        return recv_until_close(s)
    finally:
        s.close()


def normal(port: int, rng: random.Random) -> str:
    out = _exchange(port, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    return "normal" if out.startswith(b"HTTP/1.1 200") else f"normal-unexpected:{out[:12]!r}"


def fault_abort(port: int, rng: random.Random) -> str:
    """A request the fault filter (after drain-gate) may answer locally."""
    out = _exchange(port, f"GET / HTTP/1.1\r\nHost: t\r\n{FAULT_HEADER}: 1\r\nConnection: close\r\n\r\n".encode())
    if out.startswith(b"HTTP/1.1 503"):
        return "local_reply"
    return "normal" if out.startswith(b"HTTP/1.1 200") else f"fault-unexpected:{out[:12]!r}"


def client_abort_mid_request_body(port: int, rng: random.Random) -> str:
    s = _connect(port)
    s.sendall(b"POST /slow?ms=300 HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n" + b"x" * rng.randint(1, 4000))
    time.sleep(rng.uniform(0, 0.05))
    _abort(s)
    return "client_abort_body"


def client_abort_mid_response(port: int, rng: random.Random) -> str:
    s = _connect(port)
    try:
        s.sendall(b"GET /stream?seconds=3&interval_ms=30 HTTP/1.1\r\nHost: t\r\n\r\n")
        head = read_head(s)
        if not head.startswith(b"HTTP/1.1 200"):
            return f"abort-unexpected:{head[:12]!r}"
    finally:
        _abort(s)
    return "client_abort_response"


def upstream_reset(port: int, rng: random.Random) -> str:
    out = _exchange(port, f"GET /reset?after_ms={rng.randint(0, 20)} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    # Headers and a chunk arrived, then the upstream reset: the body never ends.
    return "upstream_reset" if out.startswith(b"HTTP/1.1 200") and not out.endswith(b"0\r\n\r\n") \
        else f"reset-unexpected:{out[:40]!r}"


def upstream_timeout(port: int, rng: random.Random) -> str:
    out = _exchange(port, b"GET /timeout?ms=1500 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    return "upstream_timeout" if out.startswith(b"HTTP/1.1 504") else f"timeout-unexpected:{out[:12]!r}"


def websocket(port: int, rng: random.Random) -> str:
    s = _connect(port)
    try:
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                  b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        head = read_head(s)
        if not head.startswith(b"HTTP/1.1 101"):
            return f"ws-unexpected:{head[:12]!r}"
        for _ in range(rng.randint(1, 3)):
            s.sendall(b"ping")
            got = b""
            while len(got) < 4:
                data = s.recv(4)
                if not data:
                    return "ws-closed-early"
                got += data
        time.sleep(rng.uniform(0, 0.2))  # held open a while, then closed
    finally:
        if rng.random() < 0.5:
            _abort(s)
        else:
            s.close()
    return "websocket"


def h2_connection(port: int, rng: random.Random, streams: int = 12) -> Counter:
    """One HTTP/2 connection: streams reset by the client mid-response, reset
    mid-request-body, completed normally, and some left open when the
    connection is torn down. Returns a count per kind."""
    seen: Counter = Counter()
    s = _connect(port)
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    kinds = {}
    for i in range(streams):
        sid = conn.get_next_available_stream_id()
        kind = ("reset_mid_response", "reset_mid_body", "complete", "left_open")[i % 4]
        if kind == "reset_mid_body":
            conn.send_headers(sid, [(":method", "POST"), (":path", "/slow?ms=300"), (":scheme", "http"),
                                    (":authority", "t"), ("content-length", "50000")])
            conn.send_data(sid, b"y" * rng.randint(1, 2000))
            s.sendall(conn.data_to_send())
            conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            seen["h2_reset_mid_body"] += 1
        else:
            path = "/" if kind == "complete" else "/stream?seconds=3&interval_ms=20"
            conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                    (":authority", "t")], end_stream=True)
            kinds[sid] = kind
        s.sendall(conn.data_to_send())
    pending = {sid for sid, k in kinds.items() if k in ("reset_mid_response", "complete")}
    open_ok = {sid for sid, k in kinds.items() if k == "left_open"}
    deadline = time.monotonic() + TIMEOUT
    while (pending or open_ok) and time.monotonic() < deadline:
        data = s.recv(65536)
        if not data:
            break
        for ev in conn.receive_data(data):
            sid = getattr(ev, "stream_id", None)
            if isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                if kinds.get(sid) == "reset_mid_response" and sid in pending:
                    conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                    pending.discard(sid)
                    seen["h2_reset_mid_response"] += 1
                elif kinds.get(sid) == "left_open":
                    open_ok.discard(sid)
            elif isinstance(ev, h2.events.StreamEnded) and kinds.get(sid) == "complete":
                pending.discard(sid)
                seen["h2_complete"] += 1
        s.sendall(conn.data_to_send())
    # Tear the connection down with streams still running.
    seen["h2_left_open"] += sum(1 for k in kinds.values() if k == "left_open")
    if rng.random() < 0.5:
        _abort(s)
    else:
        conn.close_connection()
        try:
            s.sendall(conn.data_to_send())
        except OSError:
            pass
        s.close()
    return seen


MIX = [  # (function, weight)
    (normal, 10),
    (fault_abort, 10),
    (client_abort_mid_request_body, 8),
    (client_abort_mid_response, 8),
    (upstream_reset, 8),
    (upstream_timeout, 2),
    (websocket, 4),
]


def run_mix(port: int, total: int, rng_seed: int, workers: int = 24) -> Counter:
    """About `total` streams of every kind above, plus HTTP/2 connections."""
    import concurrent.futures as cf

    rng = random.Random(rng_seed)
    funcs = [f for f, w in MIX for _ in range(w)]
    h2_every = 12  # one HTTP/2 connection (12 streams) per this many HTTP/1.1 tasks
    tasks: list = []
    n = 0
    while n < total:
        if len(tasks) % h2_every == 0:
            tasks.append(h2_connection)
            n += 12
        else:
            tasks.append(rng.choice(funcs))
            n += 1
    outcomes: Counter = Counter()
    lock = threading.Lock()

    def one(i_task):
        i, task = i_task
        r = random.Random(rng_seed * 1_000_003 + i)
        try:
            res = task(port, r)
        except (OSError, h2.exceptions.ProtocolError) as e:  # a reset the client saw is still an ending
            res = f"client_error:{type(e).__name__}"
        with lock:
            if isinstance(res, Counter):
                outcomes.update(res)
            else:
                outcomes[res] += 1

    with cf.ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, enumerate(tasks)))
    return outcomes


@dataclass
class H2Load:
    """h2load in the background; `result()` parses its summary."""
    args: list
    proc: subprocess.Popen = field(init=False)

    def __post_init__(self):
        self.proc = subprocess.Popen(["h2load", *self.args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def result(self, timeout: float) -> dict:
        out, _ = self.proc.communicate(timeout=timeout)
        m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                      r"(\d+) errored, (\d+) timeout", out)
        c = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
        if not m or not c:
            raise AssertionError(f"h2load output not understood:\n{out}")
        return {"total": int(m[1]), "done": int(m[3]), "succeeded": int(m[4]), "failed": int(m[5]),
                "errored": int(m[6]), "2xx": int(c[1]), "5xx": int(c[4]), "rc": self.proc.returncode, "out": out}

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class HeldStreams:
    """K long HTTP/1.1 streams the client provably holds open: each has its
    response headers and first chunk, and none has seen its end until `close()`."""

    def __init__(self, port: int, k: int):
        self.socks = []
        for _ in range(k):
            s = _connect(port)
            s.sendall(b"GET /stream?seconds=3600&interval_ms=1000 HTTP/1.1\r\nHost: t\r\n\r\n")
            self.socks.append(s)
        for s in self.socks:
            buf = b""
            while b"chunk 0" not in buf:
                data = s.recv(4096)
                assert data, "held stream ended before its first chunk"
                buf += data
            assert buf.startswith(b"HTTP/1.1 200"), buf[:40]

    def all_open(self) -> bool:
        """No held stream has seen EOF, a reset or its terminating chunk."""
        for s in self.socks:
            s.setblocking(False)
            try:
                while True:
                    data = s.recv(65536)
                    if not data or b"\r\n0\r\n\r\n" in data:
                        return False
            except BlockingIOError:
                pass
            except OSError:
                return False
            finally:
                s.settimeout(TIMEOUT)
        return True

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = []
