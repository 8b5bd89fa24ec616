"""Clients of the scenario rig: curl for long streams, a bounded loop of short requests.

Every client records wall-clock times (epoch seconds) so that its outcome can
be placed on the same timeline as the drain state machine and HAProxy.
"""
from __future__ import annotations

import http.client
import subprocess
import threading
import time
from dataclasses import dataclass, field

import requests

_MARK = "\n__curl__ "


class CurlStream:
    """One long response read by curl in the background.

    Lost means anything short of the whole body: a curl error (18/56 on
    HTTP/1.1, 92 on HTTP/2), a status other than 200, or fewer chunks than the
    backend sends. The chunk count matters on HTTP/2: HAProxy 2.6 ends a stream
    it cuts with an empty DATA frame carrying END_STREAM, which curl takes for
    a clean end (exit 0) of a body that had no content-length.
    """

    def __init__(self, url: str, *, seconds: float, interval_ms: int = 500, http2: bool = False,
                 label: str = "", max_time: float | None = None):
        sep = "&" if "?" in url else "?"
        self.url = f"{url}{sep}seconds={seconds:g}&interval_ms={interval_ms}"
        self.expected_chunks = max(1, int(seconds / (interval_ms / 1000)))
        self.http2 = http2
        self.label = label
        args = ["curl", "-sS", "-N", "--max-time", str(max_time or seconds + 30),
                "-w", _MARK + "%{http_code} %{http_version}\n"]
        args += ["--http2", "-k"] if http2 else ["--http1.1"]
        self.start_time = time.time()
        self.proc = subprocess.Popen(args + [self.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.end_time: float | None = None
        self.returncode: int | None = None
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

    def wait(self, timeout: float) -> int:
        if not self._done.wait(timeout):
            raise TimeoutError(f"curl {self.url} still running after {timeout}s")
        return self.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
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


class KeepAlive:
    """One HTTP/1.1 connection, reused for every request (a keep-alive client
    pinned to one gateway, as an L4 LB pins it)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10):
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def get(self, path: str = "/") -> str | None:
        """GET `path` on this connection; the response's `connection` header."""
        self.conn.request("GET", path)
        r = self.conn.getresponse()
        body = r.read()
        assert r.status == 200, (r.status, body)
        return r.getheader("connection")

    def close(self) -> None:
        self.conn.close()
