"""Traffic that never stops during a rollout, every request accounted.

Four kinds, all through HAProxy, each request tagged with an id of its own in its URL
(`/ledger/<id>`, `?id=<id>`) so that HAProxy's log says which gateway served it, and the
backend's ledger how many times it ran (its `GET /executions`):

  short      `/ledger/<id>` at a fixed rate on keep-alive           ok: the status asked for and the
             connections: GETs and, 1 in `post_every`, a POST       ledger's answer for that id
             with a small body; 1 in `app_503_every` of those
             POSTs asks the application for a 503 (`?status=503`)
  h1_stream  curl, HTTP/1.1, a new chunked stream every period      ok: curl exit 0, 200, every chunk
  h2_stream  curl, HTTP/2 at the TLS frontend                       ok: the same (HTTP/2 hides a cut
                                                                    from the exit code: chunks count)
  websocket  upgrade (101), then one echoed line every 0.5 s        ok: 101 and every line echoed
"""
from __future__ import annotations

import base64
import os
import random
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass

import requests

from tests.harness.clients import CurlStream
from tests.harness.process import wait_for

KINDS = ("short", "h1_stream", "h2_stream", "websocket")
ID = re.compile(r"(?:[?&]id=|/ledger/)([a-z0-9_-]+)")
# A real handshake's headers: HAProxy answers 400 to an upgrade without them.
WS_HEADERS = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"


@dataclass
class Outcome:
    kind: str
    id: str
    start: float
    end: float | None = None
    ok: bool = False
    status: int = 0  # HTTP status, 101 for a websocket upgrade, 0 without an answer
    exit: int | None = None  # curl's exit code
    bytes: int = 0
    expected_bytes: int = 0
    error: str = ""
    server: str | None = None  # HAProxy's server (the gateway), from its log
    method: str = "GET"
    want_status: int = 200  # what the application answers it (short: 503 when asked for one)


@dataclass(frozen=True)
class Profile:
    short_rate: float  # GETs per second, all workers together
    short_workers: int
    stream_seconds: tuple[int, int]  # each long request lasts a whole number of seconds in this range
    h1_period: float  # a new HTTP/1.1 stream every this many seconds
    h2_period: float
    ws_period: float
    interval_ms: int = 500  # one chunk / one echoed line every this long
    post_every: int = 0  # 1 in this many short requests is a POST (0: none)
    app_503_every: int = 0  # 1 in this many of those POSTs asks the application for a 503 (0: none)


# A POST is what an LB must never run twice (RFC 9110 9.2.2); the application's 503 to one is what
# a recipe that resends every 503 runs again.
QUICK = Profile(short_rate=50, short_workers=2, stream_seconds=(4, 10), h1_period=1.0, h2_period=2.0, ws_period=2.0,
                post_every=4, app_503_every=50)
FULL = Profile(short_rate=300, short_workers=6, stream_seconds=(5, 20), h1_period=1.0, h2_period=2.0, ws_period=2.0,
               post_every=4, app_503_every=50)
POST_BODY = b'{"amount": 1}'


def _stream_bytes(seconds: int, interval_ms: int) -> int:
    n = max(1, round(seconds / (interval_ms / 1000)))
    return sum(len(b"chunk %d\n" % i) for i in range(n))


class Traffic:
    """Starts every kind of client against HAProxy; stop() ends the launching, drain() waits."""

    def __init__(self, http_base: str, https_base: str, ws_addr: tuple[str, int], profile: Profile, rng_seed: int = 1):
        self.http, self.https, self.ws_addr = http_base, https_base, ws_addr
        self.p = profile
        self.rng = random.Random(rng_seed)
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._curls: list[tuple[Outcome, CurlStream]] = []
        self._n = 0
        self.started = self.stopped = None

    @classmethod
    def through(cls, haproxy, profile: Profile) -> "Traffic":
        """Clients of a harness HAProxy's HTTP and HTTPS frontends."""
        return cls(haproxy.http("").rstrip("/"), haproxy.https("").rstrip("/"), ("127.0.0.1", haproxy.http_port),
                   profile)

    def flowing(self, timeout: float = 30) -> None:
        """Until 20 short GETs have been answered."""
        wait_for(lambda: sum(o.ok for o in self.outcomes if o.kind == "short") >= 20, timeout, 0.1,
                 "short GETs flowing")

    def _new(self, kind: str) -> Outcome:
        with self._lock:
            self._n += 1
            o = Outcome(kind, f"{kind.split('_')[0]}-{self._n}", time.time())
            self.outcomes.append(o)
        return o

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def start(self) -> "Traffic":
        self.started = time.time()
        for w in range(self.p.short_workers):
            self._spawn(self._short_worker, w)
        self._spawn(self._every, self.p.h1_period, lambda: self._curl("h1_stream"))
        self._spawn(self._every, self.p.h2_period, lambda: self._curl("h2_stream"))
        self._spawn(self._every, self.p.ws_period, lambda: self._spawn(self._websocket, self._new("websocket")))
        return self

    def stop(self) -> None:
        """No new requests from now on."""
        self.stopped = time.time()
        self._stop.set()

    def drain(self, timeout: float) -> None:
        """Waits for every request to end (each has its own time limit below `timeout`)."""
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.1, deadline - time.monotonic()))
        for o, c in self._curls:
            try:
                c.wait(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                c.kill()
            self._settle_curl(o, c)

    # -- clients ----------------------------------------------------------------------------
    def _every(self, period: float, launch) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            launch()
            nxt += period
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def _short_worker(self, w: int) -> None:
        period = self.p.short_workers / self.p.short_rate
        nxt = time.monotonic() + w * period / self.p.short_workers
        session = requests.Session()
        sent = posts = 0
        while not self._stop.is_set():
            if self._stop.wait(max(0.0, nxt - time.monotonic())):
                break
            nxt += period
            o = self._new("short")
            sent += 1
            url = f"{self.http}/ledger/{o.id}"
            # Each worker's POSTs and 503s fall at other instants than the other workers'.
            if self.p.post_every and (sent + w) % self.p.post_every == 0:
                o.method, posts = "POST", posts + 1
                if self.p.app_503_every and (posts + w * self.p.app_503_every // self.p.short_workers) \
                        % self.p.app_503_every == 0:
                    o.want_status, url = 503, f"{url}?status=503"
            try:
                r = session.request(o.method, url, data=POST_BODY if o.method == "POST" else None,
                                    headers={"content-type": "application/json"} if o.method == "POST" else None,
                                    timeout=10)
                o.status, o.bytes = r.status_code, len(r.content)
                o.ok = r.status_code == o.want_status and _ledger_id(r) == o.id
            except requests.RequestException as e:
                o.error = f"{type(e).__name__}: {str(e)[:160]}"
                session.close()
                session = requests.Session()
            o.end = time.time()
        session.close()

    def _seconds(self) -> int:
        lo, hi = self.p.stream_seconds
        return self.rng.randint(lo, hi)

    def pin(self, seconds: int) -> None:
        """One HTTP/1.1 stream, one HTTP/2 stream and one websocket that last `seconds`:
        requests known to be in flight at a later moment, accounted with the rest."""
        self._curl("h1_stream", seconds)
        self._curl("h2_stream", seconds)
        self._spawn(self._websocket, self._new("websocket"), seconds)

    def _curl(self, kind: str, seconds: int | None = None) -> None:
        o = self._new(kind)
        seconds = seconds or self._seconds()
        o.expected_bytes = _stream_bytes(seconds, self.p.interval_ms)
        base = self.https if kind == "h2_stream" else self.http
        c = CurlStream(f"{base}/stream?id={o.id}", seconds=seconds, interval_ms=self.p.interval_ms,
                       http2=kind == "h2_stream", label=o.id, max_time=seconds + 40)
        o.start = c.start_time
        with self._lock:
            self._curls.append((o, c))

    @staticmethod
    def _settle_curl(o: Outcome, c: CurlStream) -> None:
        o.end, o.exit, o.status = c.end_time, c.returncode, c.http_code
        body = c.out.rpartition("\n__curl__ ")[0]
        o.bytes = len(body.encode())
        o.ok = c.returncode == 0 and c.http_code == 200 and o.bytes == o.expected_bytes
        o.error = c.err.strip()[-160:]

    def _websocket(self, o: Outcome, seconds: int | None = None) -> None:
        lines = max(1, round((seconds or self._seconds()) / (self.p.interval_ms / 1000)))
        o.expected_bytes = sum(len(b"ping %d\n" % i) for i in range(lines))
        try:
            with socket.create_connection(self.ws_addr, timeout=10) as s:
                key = base64.b64encode(os.urandom(16)).decode()
                s.sendall(f"GET /ws?id={o.id} HTTP/1.1\r\nHost: rollout\r\n{WS_HEADERS}"
                          f"Sec-WebSocket-Key: {key}\r\n\r\n".encode())
                head = _read_until(s, b"\r\n\r\n")
                o.status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
                if o.status == 101:
                    self._echo(s, o, lines)
        except (OSError, ValueError) as e:
            o.error = f"{type(e).__name__}: {str(e)[:160]}"
        o.ok = o.status == 101 and o.bytes == o.expected_bytes
        o.end = time.time()

    def _echo(self, s: socket.socket, o: Outcome, lines: int) -> None:
        for i in range(lines):
            line = b"ping %d\n" % i
            s.sendall(line)
            if _read_until(s, b"\n") != line:
                o.error = f"echo of line {i} missing"
                return
            o.bytes += len(line)
            time.sleep(self.p.interval_ms / 1000)

    # -- accounting ------------------------------------------------------------------------
    def attribute(self, haproxy_requests) -> None:
        """Which gateway served each request, from HAProxy's log lines (LogLine objects)."""
        by_id = {}
        for r in haproxy_requests:
            m = ID.search(r.request)
            if m:
                by_id[m.group(1)] = r.server
        for o in self.outcomes:
            o.server = by_id.get(o.id)

    def counts(self) -> tuple[dict, dict]:
        sent = {k: 0 for k in KINDS}
        lost = {k: 0 for k in KINDS}
        for o in self.outcomes:
            sent[o.kind] += 1
            lost[o.kind] += 0 if o.ok else 1
        return sent, lost

    def lost(self) -> list[dict]:
        return [asdict(o) for o in self.outcomes if not o.ok]


def _ledger_id(r: requests.Response) -> str | None:
    """The id the ledger says it ran (None: not the ledger's answer, e.g. a gateway's refusal)."""
    try:
        body = r.json()
    except ValueError:
        return None
    return body.get("id") if isinstance(body, dict) else None


def _read_until(s: socket.socket, end: bytes, limit: int = 65536) -> bytes:
    buf = b""
    while not buf.endswith(end) and len(buf) < limit:
        data = s.recv(1)
        if not data:
            break
        buf += data
    return buf
