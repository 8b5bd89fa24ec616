"""Clients of the scenario rig: curl for long streams, a bounded loop of short requests.

Every client records wall-clock times (epoch seconds) so that its outcome can
be placed on the same timeline as the drain state machine and HAProxy.
"""
from __future__ import annotations

import contextlib
import http.client
import select
import socket
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import requests

_MARK = "\n__curl__ "


class CurlStream:
    """One long response read by curl in the background.

    Lost means anything short of the whole body: a curl error (18/56 on
    HTTP/1.1, 92 on HTTP/2), a status other than 200, or fewer chunks than the
    backend sends. The chunk count matters on HTTP/2: HAProxy 2.6 ends a stream
    it cuts with an empty DATA frame carrying END_STREAM, which curl takes for
    a clean end (exit 0) of a body that had no content-length.

    With `seconds` the URL is the backend's `/stream` and gets `seconds` and
    `interval_ms`; without, the URL is asked as it is (its own `seconds` and
    `interval_ms`, if any, give the chunks expected). `args` go to curl before the URL.
    """

    def __init__(self, url: str, *args: str, seconds: float | None = None, interval_ms: int = 500,
                 http2: bool = False, label: str = "", max_time: float | None = None):
        if seconds is not None:
            sep = "&" if "?" in url else "?"
            self.url = f"{url}{sep}seconds={seconds:g}&interval_ms={interval_ms}"
        else:
            self.url = url
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
            seconds = float(query.get("seconds", ["0"])[0])
            interval_ms = int(query.get("interval_ms", ["1000"])[0])  # the backend's default
        self.expected_chunks = max(1, int(seconds / (interval_ms / 1000)))
        self.http2 = http2
        self.label = label
        cmd = ["curl", "-sS", "-N", "--max-time", str(max_time or seconds + 30),
               "-w", _MARK + "%{http_code} %{http_version}\n"]
        if not any(a.startswith("--http") for a in args):
            cmd += ["--http2"] if http2 else ["--http1.1"]
        if http2 or url.startswith("https:"):
            cmd.append("-k")  # the test certificate
        self.start_time = time.time()
        self.proc = subprocess.Popen([*cmd, *args, self.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.end_time: float | None = None
        self.returncode: int | None = None
        self.gave_up = False  # killed by the test: a client that gave up by itself
        self.out = ""
        self.err = ""
        self._done = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        out, err = self.proc.communicate()
        self.end_time = time.time()
        self.returncode = self.proc.returncode
        self.out, self.err = out, err
        self._done.set()

    # -- results -----------------------------------------------------------
    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float = 60) -> int:
        if not self._done.wait(timeout):
            raise TimeoutError(f"curl {self.url} still running after {timeout}s")
        return self.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.gave_up = True
            self.proc.kill()
        self._done.wait(10)

    @property
    def chunks(self) -> int:
        return self.out.count("chunk ")

    @property
    def http_code(self) -> int:
        _, _, tail = self.out.rpartition(_MARK)
        try:
            return int(tail.split()[0])
        except (IndexError, ValueError):
            return 0

    @property
    def http_version(self) -> str:
        _, _, tail = self.out.rpartition(_MARK)
        parts = tail.split()
        return parts[1] if len(parts) > 1 else ""

    @property
    def complete(self) -> bool:
        return self.returncode == 0 and self.http_code == 200 and self.chunks >= self.expected_chunks

    def summary(self) -> dict:
        return {
            "label": self.label,
            "url": self.url,
            "http2": self.http2,
            "start": self.start_time,
            "end": self.end_time,
            "exit": self.returncode,
            "http_code": self.http_code,
            "http_version": self.http_version,
            "chunks": self.chunks,
            "expected_chunks": self.expected_chunks,
            "complete": self.complete,
            "gave_up": self.gave_up,
            "error": self.err.strip()[-300:],
        }


@dataclass
class ShortResult:
    start: float
    end: float
    status: int  # 0 when the request failed without an HTTP answer
    error: str = ""


@dataclass
class ShortLoop:
    """A bounded loop of short GETs from `workers` threads, each with its own keep-alive session.

    Stops at `duration` seconds or `max_requests` requests, whichever comes
    first, or at stop(). Connection errors and HTTP 5xx are counted apart.
    """

    url: str
    duration: float
    workers: int = 2
    pause: float = 0.01
    max_requests: int = 200_000
    timeout: float = 10
    results: list[ShortResult] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.workers)]

    def start(self) -> "ShortLoop":
        self.started = time.time()
        self._deadline = time.monotonic() + self.duration
        for t in self._threads:
            t.start()
        return self

    def _run(self) -> None:
        session = requests.Session()
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                with self._lock:
                    if len(self.results) >= self.max_requests:
                        return
                t0 = time.time()
                try:
                    r = session.get(self.url, timeout=self.timeout)
                    res = ShortResult(t0, time.time(), r.status_code)
                except requests.RequestException as e:
                    res = ShortResult(t0, time.time(), 0, type(e).__name__ + ": " + str(e)[:200])
                    session.close()
                    session = requests.Session()
                with self._lock:
                    self.results.append(res)
                if self.pause:
                    time.sleep(self.pause)
        finally:
            session.close()

    def stop(self, timeout: float = 30) -> "ShortLoop":
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        return self

    def join(self, timeout: float) -> "ShortLoop":
        for t in self._threads:
            t.join(timeout)
        return self

    # -- counts ------------------------------------------------------------
    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def connection_errors(self) -> list[ShortResult]:
        return [r for r in self.results if r.status == 0]

    @property
    def server_errors(self) -> list[ShortResult]:
        return [r for r in self.results if r.status >= 500]

    def summary(self) -> dict:
        lat = sorted(r.end - r.start for r in self.results if r.status)
        return {
            "started": getattr(self, "started", None),
            "ended": max((r.end for r in self.results), default=None),
            "requests": self.total,
            "connection_errors": len(self.connection_errors),
            "http_5xx": len(self.server_errors),
            "other_non_200": sum(1 for r in self.results if r.status and r.status != 200 and r.status < 500),
            "p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2) if lat else None,
            "first_errors": [vars(r) for r in (self.connection_errors + self.server_errors)[:5]],
        }


@dataclass
class PinnedRequest:
    start: float
    end: float
    proto: str  # "h1" or "h2"
    client: int
    ok: bool
    error: str = ""


class PinnedClients:
    """Clients behind an L4 LB, each holding one connection and sending a GET every `period` s.

    `h1` HTTP/1.1 keep-alive clients and `h2` HTTP/2 (cleartext, prior knowledge)
    clients. A client opens a new connection only when the server asked it to
    (HTTP/1.1 `connection: close`; HTTP/2 GOAWAY, after which a request it had
    not yet sent goes to a new connection, as RFC 9113 allows) or after a
    failure. A failure is a request that got no complete 200: a connection
    reset, closed or refused under it. Bounded by `duration` and stop().
    """

    def __init__(self, port: int, *, h1: int = 4, h2: int = 2, period: float = 0.2, duration: float = 60):
        self.port = port
        self.period = period
        self.duration = duration
        self.results: list[PinnedRequest] = []
        self.rotations: list[tuple[float, str, int]] = []  # (t, proto, client): asked to reconnect
        self.connects = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._h1, args=(i,), daemon=True) for i in range(h1)]
        self._threads += [threading.Thread(target=self._h2, args=(h1 + i,), daemon=True) for i in range(h2)]

    def start(self) -> "PinnedClients":
        self.started = time.time()
        self._deadline = time.monotonic() + self.duration
        for i, t in enumerate(self._threads):
            t.start()
            time.sleep(self.period / len(self._threads))  # spread the clients over one period
        return self

    def stop(self, timeout: float = 30) -> "PinnedClients":
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        return self

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline

    def _record(self, req: PinnedRequest, rotated: bool = False) -> None:
        with self._lock:
            self.results.append(req)
            if rotated:
                self.rotations.append((req.end, req.proto, req.client))

    def _connected(self) -> None:
        with self._lock:
            self.connects += 1

    def _h1(self, client: int) -> None:
        conn = None
        while self._running():
            t0 = time.time()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                    conn.connect()
                    self._connected()
                conn.request("GET", "/")
                r = conn.getresponse()
                ok = r.status == 200 and r.read() == b"hello\n"
                close = (r.getheader("connection") or "").lower() == "close"
                self._record(PinnedRequest(t0, time.time(), "h1", client, ok, "" if ok else f"status {r.status}"),
                             rotated=close)
                if close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                self._record(PinnedRequest(t0, time.time(), "h1", client, False, f"{type(e).__name__}: {e}"[:200]))
                conn.close()
                conn = None
            time.sleep(max(0.0, t0 + self.period - time.time()))
        if conn is not None:
            conn.close()

    def _h2(self, client: int) -> None:
        h2c = None
        while self._running():
            t0 = time.time()
            try:
                if h2c is not None and h2c.pending_goaway():
                    h2c.close()  # asked to go: the next request takes a new connection
                    h2c = None
                    self._rotated("h2", client)
                if h2c is None:
                    h2c = _H2Conn(self.port)
                    self._connected()
                try:
                    ok = h2c.get("/")
                except _NotProcessed:
                    h2c.close()
                    self._rotated("h2", client)
                    h2c = _H2Conn(self.port)
                    self._connected()
                    ok = h2c.get("/")
                self._record(PinnedRequest(t0, time.time(), "h2", client, ok, "" if ok else "not 200"))
            except (OSError, ConnectionError, h2.exceptions.ProtocolError) as e:
                self._record(PinnedRequest(t0, time.time(), "h2", client, False, f"{type(e).__name__}: {e}"[:200]))
                if h2c is not None:
                    h2c.close()
                h2c = None
            time.sleep(max(0.0, t0 + self.period - time.time()))
        if h2c is not None:
            h2c.close()

    def _rotated(self, proto: str, client: int) -> None:
        with self._lock:
            self.rotations.append((time.time(), proto, client))

    @property
    def failures(self) -> list[PinnedRequest]:
        return [r for r in self.results if not r.ok]

    def summary(self) -> dict:
        return {
            "started": getattr(self, "started", None),
            "ended": max((r.end for r in self.results), default=None),
            "requests": len(self.results),
            "h1_requests": sum(1 for r in self.results if r.proto == "h1"),
            "h2_requests": sum(1 for r in self.results if r.proto == "h2"),
            "failed": len(self.failures),
            "connects": self.connects,
            "rotations": len(self.rotations),
            "first_rotation": min((t for t, _, _ in self.rotations), default=None),
            "first_failures": [vars(r) for r in self.failures[:5]],
        }


class _NotProcessed(Exception):
    """GOAWAY said the stream was never processed: safe to send again (RFC 9113 §6.8)."""


class _GracefulH2(h2.connection.H2Connection):
    """h2 closes its whole state machine on a GOAWAY; RFC 9113 §6.8 lets the streams up
    to its last_stream_id finish (Envoy's drain sends GOAWAY, then the response)."""

    def _receive_goaway_frame(self, frame):
        state = self.state_machine.state
        result = super()._receive_goaway_frame(frame)
        self.state_machine.state = state
        return result


class _H2Conn:
    """One HTTP/2 cleartext connection (prior knowledge) that sends one GET at a time."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = _GracefulH2(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.goaway: int | None = None  # last_stream_id of the server's GOAWAY

    def _feed(self, data: bytes) -> list:
        if not data:
            raise ConnectionError("connection closed by the peer")
        events = self.conn.receive_data(data)
        for e in events:
            if isinstance(e, h2.events.ConnectionTerminated):
                self.goaway = e.last_stream_id if self.goaway is None else min(self.goaway, e.last_stream_id)
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)
        return events

    def pending_goaway(self) -> bool:
        """Reads what arrived while idle; True once the server sent GOAWAY."""
        while self.goaway is None and select.select([self.sock], [], [], 0)[0]:
            self._feed(self.sock.recv(65536))
        return self.goaway is not None

    def get(self, path: str) -> bool:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "GET"), (":path", path), (":authority", "drain-gate"),
                                     (":scheme", "http")], end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        status = None
        while True:
            for ev in self._feed(self.sock.recv(65536)):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    status = dict(ev.headers).get(b":status")
                elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                    raise ConnectionError(f"stream reset: {ev.error_code!r}")
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    return status == b"200"
            if self.goaway is not None and self.goaway < sid:
                raise _NotProcessed()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
