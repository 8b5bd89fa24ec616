#!/usr/bin/env python3
"""Does your LB cut a drain-gate drain, or run a request twice? Opens long
streams through the LB, drains the gateway behind --health as its preStop does
and follows it to CLOSED. Its control (--control-health: another gateway, run
first; --control: alone, on --health) flips the check at drain start: an LB
that cuts at DOWN cuts its streams. Without one, a clean drain shows only that
nothing was cut. Drained gateways stay CLOSED: replace their pods afterwards.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.client
import json
import math
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime
from urllib.parse import urlsplit

EPILOG = """\
needs: go-httpbin behind --through (kubernetes/prove-httpbin.yaml: /drip and
  /websocket/echo); python3 >= 3.8; curl with HTTP2; DRAIN_GATE_ADMIN_TOKEN
  when --health is reached from outside admin_allow (port-forward: 127.0.0.1).
exit: 0 proven: nothing lost or cut, every kind on the drained gateway, and
  the control cut (without one: "uncontrolled"); 1 lost, cut or ran twice,
  whatever else went wrong (a control alone: the LB cut); 2 bad input, or no
  stream on the gateway: not drained; 3 proved nothing: the control cut
  nothing, a kind had no stream on the drained gateway, or the drain ended in
  FAULT or lost --health, nothing lost; 130 interrupted (a drain is reopened).
  --fingerprint: 0 measured, 1 ran twice or the proof lost, 3 not measured."""

KINDS = ("http1", "http2", "ws")
MAX_SECONDS = 600  # kubernetes/prove-httpbin.yaml lets an answer last 11 minutes
EXIT_PROVEN, EXIT_LOST, EXIT_BAD, EXIT_NOTHING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
TOKEN_ENV = "DRAIN_GATE_ADMIN_TOKEN"
# The in-flight count is published by each worker every tick (100 ms by default), later when a
# busy worker runs its tick late: read until it holds still for STEADY_S (five ticks) above where
# it was, or for REACH_WINDOW_S (a stream should outlast it per kind).
REACH_WINDOW_S = 2.0
STEADY_S = 0.5
START_WITHIN_S = 15.0
WS_PERIOD_S = 0.5  # one echo every this long
WS_TIMEOUT_S = 10.0
STOP_WITHIN_S = 5.0  # how long an ended run waits for each stream's thread
REOPEN_WITHIN_S = 30.0  # a hold's lease outlives its call by 10 ticks (>= 2 s)
# What curl's exit codes mean for a stream that did not complete (curl's man page, EXIT CODES).
CURL_EXITS = {6: "host not resolved", 7: "could not connect", 16: "HTTP/2 error", 18: "closed before the end",
              28: "timed out", 35: "TLS handshake failed", 52: "empty reply", 55: "send failed",
              56: "reset or receive failure", 60: "certificate not trusted", 92: "HTTP/2 stream reset"}
MARK = "\nprove-result "
# The ledger's requests (--ledger): STEADY_CLIENTS threads, one request after another, POST and GET
# in turn, STEADY_PAUSE_S apart; HELD of them held as long as the streams, opened with them.
STEADY_CLIENTS = 2
STEADY_PAUSE_S = 0.05
APP_503_EVERY = 5  # every 5th POST: the application's own 503
HELD = 4
REFUSE_S = 1.0  # --fingerprint: the control's flip comes this long after its drain's start
WARM_UP = 60  # --fingerprint: short GETs before the drains (a gateway's advice needs 20 streams)
LEDGER_TIMEOUT_S = 30.0
LEDGER_READ_S = 10.0
LEAD_S = 0.5  # the requests flow this long before the drain begins
POLL_S = 0.05  # the drained gateway's status, this often while its drain runs
QUIET_S = 1.0  # the requests go on until none reached the drained gateway for this long,
TAIL_MAX_S = 5.0  # at most this long after its drain ended


class BadInput(Exception):
    """Exit 2, with the cause: nothing judged."""


OUT = [sys.stdout]  # --json: the lines go to stderr, the JSON object to stdout


def say(line: str) -> None:
    print(line, file=OUT[0], flush=True)


# -- the gateway's health port ------------------------------------------------------
def exchange(conn: http.client.HTTPConnection, method: str, path: str, headers: dict, what: str) -> tuple[int, bytes]:
    """One request on `conn`, closed after: its status and body; BadInput naming `what` when it goes unanswered."""
    try:
        conn.request(method, path, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        raise BadInput(f"{what}: unreachable ({e})") from None
    finally:
        conn.close()


class Gateway:
    """One gateway's health port (:18180): drain-gate's HTTP API."""

    def __init__(self, url: str, token: str, option: str = "--health"):
        self.url = url.rstrip("/")
        self.option = option  # how the command line named it
        self.u = urlsplit(self.url)
        if self.u.scheme not in ("http", "https") or not self.u.hostname:
            raise BadInput(f"{option} {url}: not an http(s) URL")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def connection(self, timeout: float | None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.u.scheme == "https" else http.client.HTTPConnection
        return cls(self.u.hostname, self.u.port, timeout=timeout)

    def path(self, path: str) -> str:
        return self.u.path + path

    def call(self, method: str, path: str, timeout: float = 10) -> tuple[int, dict]:
        code, body = exchange(self.connection(timeout), method, self.path(path), self.headers,
                              f"{self.option} {self.url}")
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        return code, doc if isinstance(doc, dict) else {}

    def status(self) -> dict:
        code, doc = self.call("GET", "/drain/status")
        if code != 200 or not {"state", "receipt", "progress", "in_flight"} <= set(doc):
            raise BadInput(f"{self.option} {self.url}: /drain/status answered {code} without drain-gate's status "
                           "(is it a gateway's :18180?)")
        return doc


class HeldDrain:
    """POST /drain?wait=closed on a thread, held until CLOSED as the preStop holds it."""

    def __init__(self, gw: Gateway):
        self.conn = gw.connection(timeout=None)
        self.code: int | None = None
        self.error: str | None = None
        self.done = threading.Event()
        try:
            self.conn.request("POST", gw.path("/drain?wait=closed"), headers=gw.headers)
        except OSError as e:
            raise BadInput(f"{gw.option} {gw.url}: unreachable ({e})") from None
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        try:
            r = self.conn.getresponse()
            r.read()
            self.code = r.status
        except (OSError, http.client.HTTPException) as e:
            self.error = str(e) or type(e).__name__
        finally:
            self.done.set()

    def hang_up(self) -> None:
        """The hold's lease then expires (10 ticks), and /reopen is allowed again."""
        with contextlib.suppress(OSError):
            if self.conn.sock:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def in_flight(status: dict) -> int:
    return sum(status["in_flight"]["ages"].values())


def ts(text: str | None) -> float | None:
    """drain-gate's RFC 3339 timestamps ("...T11:09:41.348Z"), as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def reopen(gw: Gateway) -> str:
    """What became of a drain this run leaves early: POST /reopen until the hold this run
    held has expired. Never forced: a hold still renewed is a preStop's, the pod terminating."""
    deadline = time.monotonic() + REOPEN_WITHIN_S
    while True:
        try:
            code, doc = gw.call("POST", "/reopen")
        except BadInput as e:
            return f"not reopened: {e}"
        if code == 200:
            return "the gateway is OPEN again"
        if code == 409 and doc.get("error") == "prestop_hold" and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        return (f"not reopened: /reopen answered {code} {doc.get('error', '')} (state {doc.get('state', '?')}); "
                "a preStop hold still active is a terminating pod's: leave it")


# -- the streams ----------------------------------------------------------------------
class Stream:
    """One long stream through the LB: when it started (headers or 101 received), when it
    ended, and whether it completed; if not, how it ended."""

    def __init__(self, kind: str):
        self.kind = kind
        self.started: float | None = None
        self.ended: float | None = None
        self.ok = False
        self.how = ""
        self.done = threading.Event()

    def _end(self, ok: bool, how: str = "") -> None:
        self.ok, self.how, self.ended = ok, how, time.time()
        self.done.set()

    def kill(self) -> None:
        pass


class Through:
    """The LB's URL (--through) and how to speak TLS to it."""

    def __init__(self, url: str, cacert: str | None, insecure: bool):
        self.url = url.rstrip("/")
        self.u = urlsplit(self.url)
        if self.u.scheme not in ("http", "https") or not self.u.hostname:
            raise BadInput(f"--through {url}: not an http(s) URL")
        self.https = self.u.scheme == "https"
        if cacert and not os.path.isfile(cacert):
            raise BadInput(f"--cacert {cacert}: no such file")
        self.cacert, self.insecure = cacert, insecure

    def curl_tls(self) -> list[str]:
        return ["-k"] if self.insecure else ["--cacert", self.cacert] if self.cacert else []

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.cacert)
        if self.insecure:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def drip(self, seconds: int) -> tuple[str, int]:
        n = 2 * seconds + 1  # a byte every half second
        return f"{self.url}/drip?duration={seconds}s&numbytes={n}&delay=0", n

    def open(self, kind: str, seconds: int) -> Stream:
        return WsStream(self, seconds) if kind == "ws" else CurlStream(self, kind, seconds)


class CurlStream(Stream):
    """GET /drip by curl, HTTP/1.1 or HTTP/2 (ALPN on https, prior knowledge on http)."""

    def __init__(self, through: Through, kind: str, seconds: int):
        super().__init__(kind)
        url, self.expected = through.drip(seconds)
        proto = "--http1.1" if kind == "http1" else "--http2" if through.https else "--http2-prior-knowledge"
        argv = ["curl", "-sS", "-N", "-D", "-", "-o", os.devnull, "-w", MARK + "%{http_code} %{size_download}\n",
                "--max-time", str(seconds + 60), proto, *through.curl_tls(), url]
        # Its own session: a Ctrl-C reaches prove.py alone, which ends the streams itself.
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = []
        for line in self.proc.stdout:
            out.append(line)
            if self.started is None and line.strip() == "" and out[0].startswith("HTTP/"):
                self.started = time.time()
        err = self.proc.stderr.read()
        code = self.proc.wait()
        _, marked, tail = "".join(out).rpartition(MARK.strip("\n"))
        parts = tail.split() if marked else []  # a curl killed wrote no -w line
        status, size = (int(parts[0]), int(parts[1])) if len(parts) == 2 and all(map(str.isdigit, parts)) else (0, 0)
        if code == 0 and status == 200 and size == self.expected:
            self._end(True)
        elif code < 0:
            self._end(False, "ended by this run")
        elif code:
            last = err.strip().splitlines()[-1] if err.strip() else ""
            self._end(False, f"curl {code} ({CURL_EXITS.get(code, last or 'error')})")
        elif status != 200:
            self._end(False, f"status {status}")
        else:
            self._end(False, "ended early (a short body)")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


class WsClosed(Exception):
    """The peer closed the connection."""


class WsStream(Stream):
    """A WebSocket to /websocket/echo: a message every half second, each echoed, for
    `seconds`; then the close handshake. Completed: every echo and the close frame came."""

    def __init__(self, through: Through, seconds: int, background: bool = True, linger: bool = True):
        super().__init__("ws")
        self.through, self.seconds, self.linger = through, seconds, linger
        self.sock: socket.socket | None = None
        self.buf = b""
        if background:
            threading.Thread(target=self._run, daemon=True).start()
        else:
            self._run()

    def _run(self) -> None:
        try:
            self._connect()
            self.started = time.time()
            deadline, i = self.started + self.seconds, 0
            while True:
                msg = f"prove {i}".encode()
                self._send(0x1, msg)
                if self._message() != (0x1, msg):
                    return self._end(False, "a wrong echo")
                i += 1
                left = deadline - time.time()
                if left <= 0:
                    break
                if self._readable(min(WS_PERIOD_S, left)):  # nothing is due: the peer closed or reset
                    op, payload = self._message()
                    return self._end(False, f"unexpected frame {op:#x}")
            self._send(0x8, b"\x03\xe8")  # 1000, normal closure
            op, _ = self._message()
            if op != 0x8:
                return self._end(False, f"frame {op:#x} instead of the close frame")
            # The server closes the connection first (RFC 6455, 7.1.1): a client that hung up
            # first would be a downstream end, which the gateway counts as a cut.
            with contextlib.suppress(WsClosed):
                while self.linger and self._readable(WS_TIMEOUT_S):
                    self._fill()
            self._end(True)
        except WsClosed as e:
            self._end(False, str(e))
        except ConnectionResetError:
            self._end(False, "reset")
        except socket.timeout:
            self._end(False, f"no answer for {WS_TIMEOUT_S:g} s")
        except ssl.SSLError as e:
            self._end(False, f"TLS: {e.reason or e}")
        except OSError as e:
            self._end(False, e.strerror or str(e))
        finally:
            self.kill()

    def _connect(self) -> None:
        u = self.through.u
        port = u.port or (443 if self.through.https else 80)
        sock = socket.create_connection((u.hostname, port), timeout=WS_TIMEOUT_S)
        if self.through.https:
            sock = self.through.ssl_context().wrap_socket(sock, server_hostname=u.hostname)
        self.sock = sock
        key = base64.b64encode(os.urandom(16)).decode()
        host = u.netloc.rpartition("@")[2]
        sock.sendall(f"GET {u.path}/websocket/echo HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                     f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        while b"\r\n\r\n" not in self.buf:
            self._fill()
            if len(self.buf) > 65536:
                raise WsClosed("an answer that is not HTTP")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else lines[0]
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        if status != "101" or headers.get("sec-websocket-accept", "").encode() != accept:
            raise WsClosed(f"upgrade answered {status}" + ("" if status != "101" else " without the right accept"))

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise WsClosed("closed without a close frame")
        self.buf += data

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _readable(self, timeout: float) -> bool:
        if self.buf or (isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()):
            return True
        return bool(select.select([self.sock], [], [], timeout)[0])

    def _send(self, opcode: int, payload: bytes) -> None:
        n, mask = len(payload), os.urandom(4)
        size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
        self.sock.sendall(bytes([0x80 | opcode]) + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _message(self) -> tuple[int, bytes]:
        """The next data or close frame; a ping is answered, a pong skipped."""
        while True:
            b0, b1 = self._take(2)
            n = b1 & 0x7F
            if n >= 126:
                n = int.from_bytes(self._take(2 if n == 126 else 8), "big")
            mask = self._take(4) if b1 & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self._take(n)))
            op = b0 & 0x0F
            if op == 0x9:
                self._send(0xA, payload)
            elif op != 0xA:
                return op, payload

    def kill(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes this stream's thread in select or recv
            with contextlib.suppress(OSError):
                self.sock.close()


# -- the ledger (--ledger) ------------------------------------------------------------
class Sent:
    """One request to the ledger through the LB: what its client got, and (once the ledger was
    read) how often it ran."""

    def __init__(self, rid: str, method: str, want: int = 200, hold_ms: int = 0):
        self.rid, self.method, self.want, self.hold_ms = rid, method, want, hold_ms
        self.start = self.end = 0.0
        self.status = 0  # 0: no answer (`error` says why)
        self.refused = False  # its answer was a gateway's refusal (x-drain-gate: refused)
        self.error = ""
        self.ran: int | None = None  # executions, once read

    @property
    def answered(self) -> bool:
        """It ran, and its client got the application's answer."""
        return bool(self.ran) and self.status == self.want and not self.refused

    def how(self) -> str:
        if self.refused:
            return "a refusal reached its client"
        what = f"answered {self.status}" if self.status else self.error or "no answer"
        return f"{what}, {'ran' if self.ran else 'never ran'}"


class Ledger:
    """ledger.py behind the LB (--ledger): each request to URL/ledger/<id> is one execution of <id>,
    recorded as it arrives; URL/executions says how often each id ran. Every id of this run starts
    with its own prefix: a ledger others share is read for this run's ids alone."""

    def __init__(self, url: str, through: Through):
        self.url = url.rstrip("/")
        self.u = urlsplit(self.url)
        if self.u.scheme not in ("http", "https") or not self.u.hostname:
            raise BadInput(f"--ledger {url}: not an http(s) URL")
        self.ctx = through.ssl_context() if self.u.scheme == "https" else None
        self.prefix = f"prove-{os.urandom(4).hex()}-"
        self.lock = threading.Lock()

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.ctx:
            return http.client.HTTPSConnection(self.u.hostname, self.u.port, timeout=timeout, context=self.ctx)
        return http.client.HTTPConnection(self.u.hostname, self.u.port, timeout=timeout)

    def send(self, s: Sent) -> Sent:
        """One request on a connection of its own (the LB picks a gateway for each)."""
        query = f"?hold_ms={s.hold_ms}" + (f"&status={s.want}" if s.want != 200 else "")
        body = b"x" * 64 if s.method in ("POST", "PUT", "PATCH") else None
        headers = {"Connection": "close", **({"Content-Type": "application/octet-stream"} if body else {})}
        conn = self.connection(timeout=s.hold_ms / 1000 + LEDGER_TIMEOUT_S)
        s.start = time.time()
        try:
            conn.request(s.method, f"{self.u.path}/ledger/{s.rid}{query}", body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            s.status, s.refused = r.status, (r.getheader("x-drain-gate") or "").startswith("refused")
        except (OSError, http.client.HTTPException) as e:
            s.error = str(e) or type(e).__name__
        finally:
            conn.close()
            s.end = time.time()
        return s

    def executions(self) -> dict[str, int]:
        """How often each id of this run ran; BadInput when the ledger does not answer."""
        code, body = exchange(self.connection(timeout=LEDGER_TIMEOUT_S), "GET", f"{self.u.path}/executions",
                              {"Connection": "close"}, f"--ledger {self.url}: /executions")
        try:
            runs = json.loads(body)["executions"]
            if not isinstance(runs, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise BadInput(f"--ledger {self.url}: /executions answered {code} without the ledger's counts (is "
                           "ledger.py behind it? kubernetes/prove-ledger.yaml)") from None
        return {k: v for k, v in runs.items() if k.startswith(self.prefix)}

    def read(self, sent: list[Sent]) -> dict[str, int]:
        """The executions of `sent`, each written into its Sent; a few tries (the LB may be taking
        a gateway out)."""
        deadline = time.monotonic() + LEDGER_READ_S
        while True:
            try:
                runs = self.executions()
                break
            except BadInput:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        for s in sent:
            s.ran = runs.get(s.rid, 0)
        return runs


class Steady:
    """A steady sequence of short requests to the ledger, POST and GET in turn from each of
    STEADY_CLIENTS threads, a new connection each; every APP_503_EVERY-th POST asks the ledger to
    answer 503 (the application's own 503: an LB that resends it runs it twice)."""

    def __init__(self, ledger: Ledger, tag: str):
        self.ledger, self.tag = ledger, tag
        self.sent: list[Sent] = []
        self.stop_event = threading.Event()
        self.n = 0
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(STEADY_CLIENTS)]
        for t in self.threads:
            t.start()

    def _next(self, method: str) -> Sent:
        with self.ledger.lock:
            self.n += 1
            n = self.n
        app_503 = method == "POST" and n % APP_503_EVERY == 0
        s = Sent(f"{self.ledger.prefix}{self.tag}-{n}-{method.lower()}{'503' if app_503 else ''}", method,
                 503 if app_503 else 200)
        with self.ledger.lock:
            self.sent.append(s)
        return s

    def _client(self, i: int) -> None:
        k = i
        while not self.stop_event.is_set():
            self.ledger.send(self._next(("POST", "GET")[k % 2]))
            k += 1
            self.stop_event.wait(STEADY_PAUSE_S)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(LEDGER_TIMEOUT_S + 5)


class Watch:
    """The drained gateway's /drain/status every POLL_S from its drain's start, on this machine's
    clock: its receipt's refusals (each new request a refusing gateway refuses, counted as it
    ends) and its other ends (a served request's, counted by its worker's next tick, and those of
    the streams already in flight), and how many 503s in a row each LB checker has been served.
    Its in-flight count is no measure of new requests: a worker adds to it in leases of 8."""

    def __init__(self, gw: Gateway):
        self.gw = gw
        self.samples: list[tuple[float, int, int, dict[str, int]]] = []  # (t, refused, other ends, checkers)
        self.refusing = False
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                st = self.gw.status()
            except BadInput:
                self.stop_event.wait(POLL_S)
                continue
            t = time.time()
            if st["state"] != "OPEN":  # the receipt counts from the drain's start
                r = st["receipt"]
                self.refusing = st["refusing"]["active"]
                self.samples.append((t, r["refused"], r["cut"] + r["completed"] + r["ended_upstream"],
                                     {c["source"]: c["consecutive_503"] for c in st["lb"]["checkers"]}))
            self.stop_event.wait(POLL_S)

    def last_new(self, until: float | None = None) -> float | None:
        """When the last new request reached the gateway (before `until`): the first sample at the
        highest count of its refusals (a refusing gateway), else of its ends."""
        i = 1 if self.refusing else 2
        seen = [(x[0], x[i]) for x in self.samples if until is None or x[0] < until]
        if not seen:
            return None
        top = max(n for _, n in seen)
        return next(t for t, n in seen if n == top)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(5)


# -- the run ---------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="prove.py", description=__doc__, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--through", required=True, metavar="URL", help="the LB (its VIP) in front of go-httpbin")
    ap.add_argument("--health", required=True, metavar="URL",
                    help="a gateway's :18180 behind it (http://127.0.0.1:18180)")
    ap.add_argument("--control-health", metavar="URL", help="another gateway's: the control, run first")
    ap.add_argument("--control", action="store_true", help="the control alone, on --health")
    ap.add_argument("--streams", type=int, default=30, metavar="N", help="streams, spread over the kinds (30)")
    ap.add_argument("--seconds", type=int, default=30, metavar="S",
                    help="stream length, above the LB's detection window (30)")
    ap.add_argument("--kinds", default=",".join(KINDS), metavar="K", help="of http1,http2,ws (all)")
    ap.add_argument("--ledger", metavar="URL", help="the LB in front of ledger.py: what ran twice")
    ap.add_argument("--fingerprint", action="store_true", help="measure the LB (--ledger, a control); advise")
    ap.add_argument("--json", action="store_true", help="the fingerprint as one JSON object on stdout")
    ap.add_argument("--cacert", metavar="FILE", help="the CA of an https --through (default: the system's)")
    ap.add_argument("--insecure", action="store_true", help="do not verify an https --through")
    args = ap.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in args.kinds if k not in KINDS]
    if bad or not args.kinds:
        ap.error(f"--kinds: {','.join(bad) or 'none'}: the kinds are {', '.join(KINDS)}")
    if not 1 <= args.streams <= 1000:
        ap.error(f"--streams {args.streams}: between 1 and 1000")
    if args.streams < len(args.kinds):
        ap.error(f"--streams {args.streams}: at least one per kind ({len(args.kinds)})")
    if not 1 <= args.seconds <= MAX_SECONDS:
        ap.error(f"--seconds {args.seconds}: between 1 and {MAX_SECONDS}")
    if args.control and args.control_health:
        ap.error("--control with --control-health: --control-health runs the control itself")
    if args.control_health and args.control_health.rstrip("/") == args.health.rstrip("/"):
        ap.error("--control-health and --health: the control drains one gateway, the proof another")
    if args.fingerprint and not args.ledger:
        ap.error("--fingerprint needs --ledger: what the LB resends is counted by the ledger")
    if args.fingerprint and not (args.control or args.control_health):
        ap.error("--fingerprint needs a control (--control-health, or --control): its flip at drain start is "
                 "what the LB's check is timed by")
    if args.json and not args.fingerprint:
        ap.error("--json prints the fingerprint: add --fingerprint")
    return args


class Phase:
    """One drain of this run, the control's or the proof's, and what it saw."""

    def __init__(self, role: str, gw: Gateway):
        self.role, self.gw = role, gw
        self.streams: list[Stream] = []
        self.on_gw: dict[str, int] = {}  # of each kind, counted on the gateway once they all started
        self.held: HeldDrain | None = None
        self.t0: float | None = None  # when the drain began (this clock)
        self.status: dict = {}  # the last status seen
        self.end = ""  # the state the drain ended in, "" while under way
        self.health_lost = ""  # why the drain could not be followed to its end
        # With --ledger: the held requests and the steady ones, the drained gateway watched, and
        # what the ledger said (None: not read, `ledger_error` says why).
        self.held_sent: list[Sent] = []
        self.held_on_gw = 0
        self.steady: Steady | None = None
        self.watch: Watch | None = None
        self.flip_local: float | None = None  # when /close-lb answered (the control), this machine's clock
        self.runs: dict[str, int] | None = None
        self.ledger_error = ""

    def say(self, line: str) -> None:
        say(f"{self.role}: {line}")

    def of(self, kind: str) -> list[Stream]:
        return [s for s in self.streams if s.kind == kind]

    def lost(self, kind: str | None = None) -> list[Stream]:
        return [s for s in self.streams if not s.ok and kind in (None, s.kind)]

    def early(self, kind: str) -> int:
        """Streams of `kind` that had ended before the drain began."""
        return sum(1 for s in self.of(kind) if s.ended and self.t0 and s.ended < self.t0)

    def crossed(self, kind: str) -> int:
        """Streams of `kind` on the gateway when its drain began: those counted there, less any
        that had ended by then (any of them may have been one of those)."""
        return max(0, self.on_gw.get(kind, 0) - self.early(kind))

    @property
    def cut(self) -> int:
        """What the gateway counts as cut in this drain (its receipt)."""
        return self.status["receipt"]["cut"] if self.status else 0

    @property
    def under_way(self) -> bool:
        return self.held is not None and not self.end

    def requests(self) -> list[Sent]:
        """Its requests to the ledger, held and steady."""
        return self.held_sent + (self.steady.sent if self.steady else [])

    def unanswered(self) -> list[Sent]:
        return [r for r in self.requests() if not r.answered] if self.runs is not None else []

    def ran_twice(self) -> list[Sent]:
        return [r for r in self.requests() if (r.ran or 0) > 1]


def why_no_cut(ph: Phase) -> str:
    """Why a control's flip cut nothing, from what its gateway saw of the LB."""
    st = ph.status
    lb, start = st["lb"], ts(st["progress"]["drain_started_at"])
    down = ts(lb["observed_down_at"]) if lb["observed_down"] else None
    last_end = max((s.ended for s in ph.streams if s.ended), default=time.time()) - (ph.t0 or time.time())
    if ph.health_lost:
        return f"its health port was lost mid-drain, and with it what the LB did ({ph.health_lost})"
    if not lb["checkers"]:
        return "no LB checker asked this gateway's /health_check.html: this LB does not read drain-gate's check"
    if down is None:
        return (f"no LB checker was served {lb['lb_fall']} 503s in a row (lb_fall): the LB never took the gateway "
                "out while the streams ran (its fall above lb_fall, or --seconds too short)")
    if start and last_end < down - start:
        return (f"the streams ended (+{last_end:.2f} s) before the LB marked the gateway down "
                f"(+{down - start:.2f} s): raise --seconds above its detection window")
    return (f"the LB marked the gateway down (+{down - start if start else 0:.2f} s) with the streams in flight "
            "and cut none: it does not cut at DOWN")


def ran_twice(phases: list[Phase], probes: list[Sent]) -> list[tuple[str, Sent]]:
    """Requests that ran more than once: every one of a drain's, and the POST the application
    answered 503 (a GET may run twice: RFC 9110 9.2.2)."""
    return ([(ph.role, r) for ph in phases for r in ph.ran_twice()]
            + [("before the drains", r) for r in probes if r.method == "POST" and (r.ran or 0) > 1])


def judge(phases: list[Phase], kinds: list[str], probes: list[Sent] = (), fp: dict | None = None
          ) -> tuple[int, list[str]]:
    """The run's answer from every drain it made: the exit code and the lines that say why.
    A request that ran twice trumps, then losses: whatever else went wrong, a proof that lost
    or cut a stream, or lost a request to the ledger, exits 1."""
    control = next((p for p in phases if p.role == "control"), None)
    proof = next((p for p in phases if p.role == "proof"), None)
    lines: list[str] = []
    nothing: list[str] = []  # why it proved nothing: the run's reasons, or a kind's
    nothing += [f"{p.role}: the ledger was not read: {p.ledger_error}" for p in phases if p.ledger_error]
    twice = ran_twice(phases, probes)
    if twice:
        shown = ", ".join(f"{r.rid} {r.ran}x ({where}, {r.method}"
                          + (", answered 503 by the application)" if r.want == 503 else ")") for where, r in twice[:3])
        more = f" and {len(twice) - 3} more" if len(twice) > 3 else ""
        return EXIT_LOST, [f"prove: RAN TWICE (exit 1): {len(twice)} request(s) ran more than once: {shown}{more}: "
                           "this LB resends requests that ran"]
    if control:
        cut = [k for k in kinds if control.lost(k)]
        if control.lost() or control.cut:
            lines.append(f"control: the LB cut {len(control.lost())} stream(s) ({', '.join(cut) or 'none seen'}) "
                         "once the check said 503: it cuts at DOWN")
            nothing += [f"{k}: the control cut none of its {control.crossed(k)} on the gateway" if control.crossed(k)
                        else f"{k}: no stream of it crossed the control's gateway" for k in kinds if k not in cut]
        else:
            nothing.append(f"the control cut nothing: {why_no_cut(control)}")
    if fp is not None:
        return judge_fingerprint(proof, fp, lines)
    if proof is None:  # the control alone
        if control.lost() or control.cut:
            return EXIT_LOST, lines + ["prove: the control cut (exit 1): this LB cuts at DOWN; a proof on another "
                                       "gateway shows whether drain-gate's drain does"
                                       + "".join(f"; proved nothing for {x}" for x in nothing)]
        return EXIT_NOTHING, lines + [f"prove: proved nothing (exit 3): {'; '.join(nothing)}"]
    nothing += [f"{k}: no stream of it crossed the drained gateway (more --streams)" for k in kinds
                if not proof.crossed(k)]
    if proof.health_lost:
        nothing.append(f"the drain was not followed to its end: {proof.health_lost}")
    elif proof.end != "CLOSED":
        nothing.append(f"the drain ended in {proof.end}, not CLOSED")
    lost, unanswered = len(proof.lost()), len(proof.unanswered())
    if lost or proof.cut or unanswered:
        ledger = f", and {unanswered} of {len(proof.requests())} request(s) to the ledger" if unanswered else ""
        return EXIT_LOST, lines + [f"prove: LOST (exit 1): the drain lost {lost} of {len(proof.streams)} stream(s){ledger}"
                                   f", its gateway counts {proof.cut} cut"
                                   + (f" (and: {'; '.join(nothing)})" if nothing else "")]
    if nothing:
        return EXIT_NOTHING, lines + [f"prove: proved nothing (exit 3): {'; '.join(nothing)}"]
    crossed = sum(proof.crossed(k) for k in kinds)
    ledger = (f"; {len(proof.requests())} requests to the ledger answered, none ran twice"
              if proof.runs is not None else "")
    if control:
        return EXIT_PROVEN, lines + [f"prove: proven (exit 0): the LB cut the control's streams of every kind at "
                                     f"DOWN; the drain lost none of the {crossed} on its gateway, every kind among "
                                     f"them, and cut none{ledger}"]
    return EXIT_PROVEN, lines + [f"prove: nothing lost, nothing cut (exit 0), {crossed} streams on the drained "
                                 f"gateway, every kind among them{ledger}; uncontrolled: no control (--control-health) "
                                 "showed that this LB cuts, so this shows only that this drain cut nothing"]


def judge_fingerprint(proof: Phase | None, fp: dict, lines: list[str]) -> tuple[int, list[str]]:
    """--fingerprint: 0 measured, 1 the proof (if any) lost, 3 a figure not measured."""
    if proof and (proof.lost() or proof.cut or proof.unanswered()):
        return EXIT_LOST, lines + [f"prove: LOST (exit 1): the proof's drain lost {len(proof.lost())} stream(s) and "
                                   f"{len(proof.unanswered())} request(s) to the ledger, its gateway counts "
                                   f"{proof.cut} cut"]
    if fp["missing"]:
        return EXIT_NOTHING, lines + [f"prove: fingerprint not measured (exit 3): {'; '.join(fp['missing'])}"]
    return EXIT_PROVEN, lines + ["prove: fingerprint measured (exit 0), nothing ran twice"]


def report_ledger(ph: Phase) -> None:
    """A drain's requests to the ledger: sent, answered, lost and how, what ran twice, and what the
    gateway refused."""
    if ph.runs is None:
        ph.say(f"ledger: not read ({ph.ledger_error})")
        return
    reqs = ph.requests()
    posts = [r for r in reqs if r.method == "POST"]
    app = sum(1 for r in posts if r.want == 503)
    lost = ph.unanswered()
    twice = ph.ran_twice()
    ph.say(f"ledger: sent {len(reqs)} (POST {len(posts)}, {app} of them answered 503 by the application; GET "
           f"{len(reqs) - len(posts)}; {len(ph.held_sent)} held {ph.held_sent[0].hold_ms / 1000:g} s, {ph.held_on_gw} "
           f"on the gateway), answered {len(reqs) - len(lost)}, lost {len(lost)}, ran twice {len(twice)}"
           if ph.held_sent else f"ledger: sent {len(reqs)}, answered {len(reqs) - len(lost)}, lost {len(lost)}, "
                                f"ran twice {len(twice)}")
    if lost:
        how = Counter(f"{r.method} {r.how()}" for r in lost)
        ph.say("ledger: lost: " + "; ".join(f"{h}: {n}" for h, n in sorted(how.items())))
    if twice:
        ph.say("ledger: ran twice: " + ", ".join(f"{r.rid} ({r.method}) {r.ran}x" for r in twice[:5]))
    st = ph.status
    if st and st["refusing"]["mode"] == "refuse":
        reached = refusals_reached(ph)
        ph.say(f"ledger: the gateway refused {st['receipt']['refused']} (refused_requests: "
               f"{st['refusing']['requests']}, refuse_with: {st['refusing']['refuse_with']}); "
               f"{len(reached)} refusal(s) of this run reached a client")


def refusals_reached(ph: Phase) -> list[Sent]:
    """Requests sent once the drain began that came back as the gateway's refusal, or never ran
    and got no answer of the application: a refusal the LB did not resend."""
    return [r for r in ph.requests() if r.start >= (ph.t0 or 0) and r.ran is not None
            and (r.refused or (not r.ran and not r.answered))]


# -- the fingerprint (--fingerprint) ----------------------------------------------------------
def check_timing(ph: Phase) -> dict:
    """When the LB stopped sending the control's gateway new requests, against its checks: each
    checker's k-th 503 in a row first seen at t_k, its interval (t_K - t_1) / (K - 1), and the
    detection: from its last check answered 200 (t_1 - interval) to the last new request, the
    longest a flip can wait for the LB (fall x inter); its fall, detection / interval."""
    out = {"active_check": False, "check_interval_s": None, "fall": None, "detection_s": None,
           "first_503_s": None, "sent_until_s": None, "why": ""}
    samples = ph.watch.samples if ph.watch else []
    if not samples or ph.flip_local is None:
        out["why"] = "the gateway's status was not read while it drained"
        return out
    # A gateway that serves counts ends, not arrivals: read them before the streams and held
    # requests of this run began to end by themselves.
    natural = [s.ended for s in ph.streams if s.ok and s.ended] + [r.end for r in ph.held_sent if r.answered]
    until = None if ph.watch.refusing else min(natural, default=None)
    t_last = ph.watch.last_new(until - POLL_S if until else None) or ph.flip_local
    out["sent_until_s"] = round(t_last - ph.flip_local, 2)
    end = min(samples[-1][0], until) if until else samples[-1][0]
    kept = end - t_last < QUIET_S
    firsts: dict[str, dict[int, float]] = {}
    for t, _, _, checkers in samples:
        for source, n in checkers.items():
            seen = firsts.setdefault(source, {})
            for k in range(1, n + 1):
                seen.setdefault(k, t)
    out["active_check"] = bool(firsts)
    if not firsts:
        out["why"] = ("no active check: no LB checker asked this gateway's /health_check.html; the LB "
                      + ("kept sending it new requests as long as this run watched" if kept else
                         f"sent it its last new request +{out['sent_until_s']:.2f} s after the flip"))
        return out
    timed = {src: ks for src, ks in firsts.items() if 1 in ks}
    if not timed:
        out["why"] = "no LB checker was served a 503 while the run watched"
        return out
    src = min(timed, key=lambda x: timed[x][1])
    ks = timed[src]
    top = max(ks)
    if top < 2:
        out["why"] = f"checker {src} was served one 503 only: its interval is not measured"
        return out
    inter = (ks[top] - ks[1]) / (top - 1)
    out["check_interval_s"] = round(inter, 2)
    out["first_503_s"] = round(ks[1] - ph.flip_local, 2)
    if kept:
        out["why"] = (f"the LB kept sending it new requests as long as this run watched (+{out['sent_until_s']:.2f} "
                      "s after the flip), its check failing" + ("" if ph.watch.refusing else
                                                                 ": raise --seconds (a serving gateway is read until "
                                                                 "its streams end)"))
        return out
    detection = max(0.0, t_last - (ks[1] - inter))
    out["detection_s"] = round(detection, 2)
    out["fall"] = max(1, round(detection / inter))
    return out


def fingerprint(phases: list[Phase], probes: list[Sent]) -> dict:
    """What the LB did, measured (`lb`), and the settings that follow (`advice`); `missing`: the
    figures it could not measure, and why."""
    control = next(p for p in phases if p.role == "control")
    st = control.status
    missing: list[str] = []
    timing = check_timing(control)
    lb: dict = {k: timing[k] for k in ("active_check", "check_interval_s", "fall", "detection_s", "first_503_s",
                                       "sent_until_s")}
    lb["detection"] = timing["why"] or (f"{timing['detection_s']:.2f} s from its last check answered 200 to its last "
                                        f"new request: fall {timing['fall']} x inter {timing['check_interval_s']:.2f} s")
    if timing["detection_s"] is None and timing["active_check"]:
        missing.append(f"detection: {timing['why']}")
    # Does it cut at DOWN? The control's streams.
    cut = len(control.lost()) + len([r for r in control.held_sent if r.ran and not r.answered])
    if cut or control.cut:
        lb["cuts_at_down"], why = True, f"the control: {cut} cut once the check said 503 (the gateway counts {control.cut})"
    elif not timing["active_check"]:
        lb["cuts_at_down"], why = False, "no active check: the LB never takes the gateway out on its check"
    else:
        why = why_no_cut(control)
        lb["cuts_at_down"] = False if why.endswith("does not cut at DOWN") else None
        if lb["cuts_at_down"] is None:
            missing.append(f"cuts_at_down: {why}")
    lb["cuts_at_down_why"] = why
    # Does it resend a refusal? The control's requests, sent once its gateway refused.
    refusing, refused = st["refusing"], st["receipt"]["refused"]
    reached = refusals_reached(control)
    if control.runs is None:
        lb["resends_refused"] = lb["resends_refused_post"] = None
        why = f"the ledger was not read: {control.ledger_error}"
        missing.append(f"resends_refused: {why}")
    elif refusing["mode"] != "refuse":
        lb["resends_refused"] = lb["resends_refused_post"] = None
        why = ("the gateways serve new requests while draining (draining_new_requests: serve): nothing was refused; "
               "measure with refuse to know")
    elif not refused:
        lb["resends_refused"] = lb["resends_refused_post"] = None
        why = "the draining gateway refused nothing (no new request reached it)"
        missing.append(f"resends_refused: {why}")
    else:
        gets = [r for r in reached if r.method != "POST"]
        posts = [r for r in reached if r.method == "POST"]
        lb["resends_refused"] = not gets
        lb["resends_refused_post"] = (not posts) if refusing["requests"] == "all" else None
        why = (f"the gateway refused {refused} (refused_requests: {refusing['requests']}, refuse_with: "
               f"{refusing['refuse_with']}); {len(gets)} GET and {len(posts)} POST refusal(s) reached a client")
    lb["resends_refused_why"] = why
    lb["refused_with"] = {k: refusing[k] for k in ("mode", "requests", "refuse_with")}
    # Does it resend what the application answered 503?
    for method, key in (("POST", "resends_after_application_503"), ("GET", "resends_get_after_application_503")):
        mine = [r for r in probes + [r for ph in phases for r in ph.requests()]
                if r.method == method and r.want == 503 and r.ran]
        lb[key] = any(r.ran > 1 for r in mine) if mine else None
        if method == "POST" and not mine:
            missing.append("resends_after_application_503: no POST the application answered 503 ran")
    # The settings that follow.
    refuse = lb["resends_refused"] is True and lb["resends_after_application_503"] is False
    inter, detection = timing["check_interval_s"], timing["detection_s"]
    lb_buffer = math.ceil(detection + inter + 1) if detection is not None else None
    advices = [ph.status["advice"] for ph in phases if ph.status]
    drain_timeout = max((a["drain_timeout_s"] for a in advices if a["drain_timeout_s"]), default=None)
    graces = [ph.status["advice"]["termination_grace_period_s"]
              + max(0, (lb_buffer or 0) - math.ceil((ph.status["progress"]["lb_buffer_ms"] or 0) / 1000))
              for ph in phases if ph.status and ph.status["advice"]["termination_grace_period_s"]]
    advice = {
        "lb_fall": timing["fall"],
        "lb_buffer_s": lb_buffer,
        "draining_new_requests": "refuse" if refuse else "serve",
        "refused_requests": ("all" if lb["resends_refused_post"] else "idempotent") if refuse else None,
        "refuse_with": refusing["refuse_with"] if refuse else None,
        "drain_timeout_s": drain_timeout,
        "termination_grace_period_s": max(graces, default=None),
        "based_on": next((a["based_on"] for a in advices if a["drain_timeout_s"] == drain_timeout), ""),
    }
    return {"lb": lb, "advice": advice, "missing": missing}


def fingerprint_text(fp: dict) -> list[str]:
    lb, a = fp["lb"], fp["advice"]

    def yes(v: bool | None) -> str:
        return "not measured" if v is None else "yes" if v else "no"

    first = f", its first 503 +{lb['first_503_s']:.2f} s after the flip" if lb["first_503_s"] is not None else ""
    lines = [f"fingerprint: detection {lb['detection']}{first}",
             f"fingerprint: cuts at DOWN: {yes(lb['cuts_at_down'])} ({lb['cuts_at_down_why']})",
             f"fingerprint: resends a refused request: {yes(lb['resends_refused'])}"
             + (f", a refused POST: {yes(lb['resends_refused_post'])}" if lb["resends_refused_post"] is not None else "")
             + f" ({lb['resends_refused_why']})",
             f"fingerprint: resends after the application's 503: POST {yes(lb['resends_after_application_503'])}, "
             f"GET {yes(lb['resends_get_after_application_503'])}"]
    if lb["resends_after_application_503"]:
        lines.append("fingerprint: this LB runs a POST twice when the application answers 503 (RFC 9110 9.2.2: a "
                     "proxy MUST NOT retry it): fix its retries before anything else")

    def setting(v, unit: str = "") -> str:
        return "-" if v is None else f"{v}{unit}"

    lines.append(f"advice: lb_fall {setting(a['lb_fall'])}, lb_buffer {setting(a['lb_buffer_s'], 's')}, "
                 f"draining_new_requests {a['draining_new_requests']}"
                 + (f" (refused_requests {a['refused_requests']}, refuse_with {a['refuse_with']})"
                    if a["draining_new_requests"] == "refuse" else "")
                 + f", drain_timeout {setting(a['drain_timeout_s'], 's')}, terminationGracePeriodSeconds "
                 f"{setting(a['termination_grace_period_s'])} ({a['based_on'] or 'no sizing advice'})")
    return lines


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        token = os.environ.get(TOKEN_ENV, "")
        self.gw = Gateway(args.health, token)
        self.control_gw = Gateway(args.control_health, token, "--control-health") if args.control_health else None
        self.through = Through(args.through, args.cacert, args.insecure)
        self.ledger = Ledger(args.ledger, self.through) if args.ledger else None
        self.phases: list[Phase] = []
        self.probes: list[Sent] = []  # --fingerprint: the application's 503 to a POST and to a GET

    def plan(self) -> list[tuple[str, Gateway]]:
        """The drains, in order: the control (if any), then the proof."""
        if self.control_gw:
            return [("control", self.control_gw), ("proof", self.gw)]
        return [("control" if self.args.control else "proof", self.gw)]

    # -- before anything is drained ---------------------------------------------------
    def preflight(self) -> None:
        http_kinds = [k for k in self.args.kinds if k != "ws"]
        if http_kinds and not shutil.which("curl"):
            raise BadInput(f"--kinds {','.join(http_kinds)}: curl is not installed")
        if "http2" in self.args.kinds and "HTTP2" not in subprocess.run(["curl", "-V"], capture_output=True,
                                                                          text=True).stdout:
            raise BadInput("--kinds http2: this curl has no HTTP2 (curl -V)")
        for _, gw in self.plan():
            self.check(gw)
        for kind in self.args.kinds:
            self.probe(kind)
        if self.ledger:
            self.ledger.executions()

    def check(self, gw: Gateway, hint: str = "") -> None:
        """A gateway this run may drain: OPEN, no preStop hold, a reliable count, admin calls allowed."""
        st = gw.status()
        hold = st["progress"]["prestop_hold_until"]
        if hold:
            raise BadInput(f"the gateway behind {gw.option} is in a preStop hold (lease until {hold}): its pod is "
                           "terminating; prove.py drains only a gateway no one else is draining")
        if st["state"] != "OPEN":
            raise BadInput(f"the gateway behind {gw.option} is {st['state']}, not OPEN (a drained gateway stays "
                           f"CLOSED until its pod is replaced){hint}")
        if not st["count"]["reliable"]:
            raise BadInput(f"the count of the gateway behind {gw.option} is not reliable "
                           f"({st['count']['unreliable_reason']}): a drain there proves nothing")
        code, doc = gw.call("POST", "/reopen")  # illegal in OPEN (409): changes nothing, tells who may drain
        if code in (401, 403):
            raise BadInput(f"{gw.option} {gw.url}: admin calls answered {code} {doc.get('error', '')}: set "
                           f"{TOKEN_ENV} (admin_token), or reach it from admin_allow (kubectl port-forward)")

    def probe(self, kind: str) -> None:
        """One short answer of each kind through the LB, before any stream or drain."""
        if kind == "ws":
            s = WsStream(self.through, 0, background=False, linger=False)
            if not s.ok:
                raise BadInput(f"--through {self.through.url}: ws {self.through.url}/websocket/echo: {s.how}")
            return
        url = f"{self.through.url}/drip?duration=0&numbytes=1&delay=0"
        proto = "--http1.1" if kind == "http1" else "--http2" if self.through.https else "--http2-prior-knowledge"
        r = subprocess.run(["curl", "-sS", "-o", os.devnull, "-w", "%{http_code} %{http_version}", "--max-time",
                            "10", proto, *self.through.curl_tls(), url], capture_output=True, text=True)
        status, _, version = r.stdout.partition(" ")
        if r.returncode:
            raise BadInput(f"--through {self.through.url}: {kind}: {r.stderr.strip() or f'curl {r.returncode}'}")
        if status != "200":
            raise BadInput(f"--through {self.through.url}: {kind} GET /drip answered {status}, not 200 (is "
                           "go-httpbin behind it?)")
        if kind == "http2" and version != "2":
            raise BadInput(f"--through {self.through.url}: http2 answered over HTTP/{version} (no h2 on this LB "
                           "port): leave http2 out of --kinds")

    def open_streams(self, ph: Phase) -> None:
        """Opens the streams kind by kind, each kind once the gateway's count of the last one held
        still: that count, which tells no kind from another, then tells how many of each it carries."""
        a = self.args
        count = first = in_flight(ph.gw.status())
        for k, kind in enumerate(a.kinds):
            n = len(range(k, a.streams, len(a.kinds)))
            mine = [self.through.open(kind, a.seconds) for _ in range(n)]
            ph.streams += mine
            deadline = time.monotonic() + START_WITHIN_S
            while time.monotonic() < deadline and not all(s.started or s.done.is_set() for s in mine):
                time.sleep(0.02)
            failed = [s for s in mine if not s.started]
            if failed:
                raise BadInput(f"{len(failed)} of {n} {kind} streams did not start through --through "
                               f"({failed[0].how or 'no answer'})")
            now = self.settle(ph.gw, count, n)
            ph.on_gw[kind] = max(0, min(n, now - count))
            count = now
        reached = sum(ph.on_gw.values())
        ph.say(f"{reached} of {a.streams} streams reached the gateway "
               f"({', '.join(f'{k} {n}' for k, n in ph.on_gw.items())}; its in-flight count {first} -> {count})")
        if not reached:
            raise BadInput(f"none of the {a.streams} streams reached the gateway behind {ph.gw.option} (more "
                           f"--streams, or {ph.gw.option} on a gateway this LB sends to); it was not drained")

    @staticmethod
    def settle(gw: Gateway, before: int, n: int) -> int:
        """The gateway's in-flight count once it shows all n streams more than `before`, or has held
        still above `before` for STEADY_S; at most REACH_WINDOW_S (none of them there)."""
        now, since = in_flight(gw.status()), time.monotonic()
        end = since + REACH_WINDOW_S
        while now - before < n and time.monotonic() < end and not (now > before and
                                                                    time.monotonic() - since >= STEADY_S):
            time.sleep(0.05)
            seen = in_flight(gw.status())
            if seen != now:
                now, since = seen, time.monotonic()
        return now

    # -- the ledger --------------------------------------------------------------------
    def app_503(self) -> None:
        """--fingerprint, before any drain: WARM_UP short GETs, so that each gateway has measured
        enough streams for its sizing advice; then two POSTs and two GETs the application answers
        503, each counted: an LB that resends them runs them again."""
        warm = [Sent(f"{self.ledger.prefix}warm-{i}", "GET") for i in range(WARM_UP)]
        threads = [threading.Thread(target=lambda part=warm[i::STEADY_CLIENTS]: [self.ledger.send(r) for r in part],
                                    daemon=True) for i in range(STEADY_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(LEDGER_TIMEOUT_S * 2)
        self.probes += warm
        for i, method in enumerate(("POST", "GET") * 2):
            self.probes.append(self.ledger.send(Sent(f"{self.ledger.prefix}app503-{i}-{method.lower()}", method, 503)))
        self.ledger.read(self.probes)
        got = ", ".join(f"{r.method} answered {r.status or r.error}, ran {r.ran}x" for r in self.probes if r.want == 503)
        say(f"the application's 503: {got}")

    def open_held(self, ph: Phase) -> None:
        """HELD requests to the ledger, held as long as the streams: in flight when the drain begins."""
        before = in_flight(ph.gw.status())
        ms = self.args.seconds * 1000
        ph.held_sent = [Sent(f"{self.ledger.prefix}{ph.role}-held-{i}-{m.lower()}", m, hold_ms=ms)
                        for i, m in enumerate(("POST", "GET") * (HELD // 2))]
        for r in ph.held_sent:
            threading.Thread(target=self.ledger.send, args=(r,), daemon=True).start()
        ph.held_on_gw = max(0, min(HELD, self.settle(ph.gw, before, HELD) - before))

    def finish_ledger(self, ph: Phase) -> None:
        """Once the drain ended: the steady requests go on until none reached the drained gateway
        for QUIET_S (at most TAIL_MAX_S), the held ones are answered, and the ledger is read."""
        ended = time.time()
        while time.time() - ended < TAIL_MAX_S:
            last = ph.watch.last_new() if ph.watch else None
            if last is None or time.time() - last >= QUIET_S:
                break
            time.sleep(0.1)
        ph.steady.stop()
        if ph.watch:
            ph.watch.stop()
        deadline = time.time() + LEDGER_TIMEOUT_S + self.args.seconds
        while not all(r.end for r in ph.held_sent) and time.time() < deadline:
            time.sleep(0.05)
        try:
            ph.runs = self.ledger.read(ph.requests())
        except BadInput as e:
            ph.ledger_error = str(e)

    def stop_ledger(self) -> None:
        for ph in self.phases:
            if ph.steady:
                ph.steady.stop_event.set()
            if ph.watch:
                ph.watch.stop_event.set()

    # -- the drain ---------------------------------------------------------------------
    def drain(self, ph: Phase) -> None:
        """Starts the drain (and, for the control, the flip), follows it to its end and waits
        until every stream ended."""
        gw, control = ph.gw, ph.role == "control"
        ph.t0 = time.time()
        ph.held = HeldDrain(gw)
        if self.ledger:
            ph.watch = Watch(gw)
        deadline = time.monotonic() + 10
        while (st := gw.status())["state"] == "OPEN":
            if ph.held.done.is_set() or time.monotonic() > deadline:
                raise BadInput(f"POST /drain?wait=closed answered {ph.held.code or ph.held.error} and the "
                               "gateway stayed OPEN")
            time.sleep(0.02)
        ph.status = st
        if control and self.args.fingerprint:
            # A gateway that refuses does so from its drain's start, its check still 200: what the LB
            # does with what it refuses shows in that second, however soon the LB's DOWN comes.
            time.sleep(REFUSE_S)
        if control:
            code, doc = gw.call("POST", "/close-lb")
            if code != 200:
                raise BadInput(f"POST /close-lb answered {code} {doc.get('error', '')} (state {doc.get('state')})")
            ph.flip_local = time.time()
        flip = f"the flip {REFUSE_S:g} s after its start" if self.args.fingerprint else "the flip at once"
        ph.say(f"{'drained with ' + flip if control else 'draining as its preStop does'} at "
               f"{datetime.fromtimestamp(ph.t0).strftime('%H:%M:%S')}; following it to CLOSED")
        ph.end = self.follow(ph)
        end = max(s.started for s in ph.streams) + self.args.seconds + 70
        while not all(s.done.is_set() for s in ph.streams) and time.time() < end:
            time.sleep(0.05)
        if not ph.health_lost:
            with contextlib.suppress(BadInput):
                ph.status = gw.status()  # the receipt once every stream ended

    @staticmethod
    def follow(ph: Phase) -> str:
        """The state the drain ended in: CLOSED, FAULT (POST /fault, or the gateway faulted), OPEN
        (someone reopened it); "?" when its health port was lost on the way."""
        try:
            while True:
                if ph.held.code == 200:  # the preStop's answer: CLOSED
                    return "CLOSED"
                if ph.status["state"] in ("CLOSED", "FAULT", "OPEN"):
                    return ph.status["state"]
                time.sleep(0.1)
                ph.status = ph.gw.status()
        except BadInput as e:
            ph.health_lost = str(e)
            return "?"

    # -- what it saw -------------------------------------------------------------------
    def report(self, ph: Phase) -> None:
        for kind in self.args.kinds:
            mine = ph.of(kind)
            lost = Counter(s.how for s in mine if not s.ok)
            how = "; ".join(f"{h}: {n}" for h, n in sorted(lost.items()))
            early = f" ({ph.early(kind)} ended before the drain began)" if ph.early(kind) else ""
            ph.say(f"{kind + ':':6} sent {len(mine)}, on the gateway {ph.crossed(kind)}{early}, completed "
                   f"{len(mine) - sum(lost.values())}, lost {sum(lost.values())}" + (f" ({how})" if how else ""))
        st = ph.status
        r, p, lb = st["receipt"], st["progress"], st["lb"]
        start = ts(p["drain_started_at"])
        flip = ts(p["closing_at"])
        down = ts(lb["observed_down_at"]) if lb["observed_down"] else None
        closed = ts(p["closed_at"])
        reason = next((x["reason"] for x in p["transitions"] if x["to"] == "CLOSING"), "-")
        forced = (p["active_at_closing"] or 0) if p["forced"] else 0
        at = (lambda t: f"+{t - start:.2f} s") if start else (lambda t: "?")
        seen = " (as last seen)" if ph.health_lost else ""
        ph.say(f"receipt{seen}: cut {r['cut']} (by the LB {r['cut_lb']}, other {r['cut_other']}), completed "
               f"{r['completed']}, ended upstream {r['ended_upstream']}, refused {r['refused']}, forced "
               f"{'yes' if p['forced'] else 'no'}, flip {at(flip) if flip else '-'} ({reason})")
        first_cut = min((s.ended for s in ph.lost() if s.ended), default=None)
        parts = ["drain 0.00 s", f"flip {at(flip)}" if flip else "no flip"]
        parts += [f"LB down {at(down)}" if down else "LB down not seen"]
        parts += [f"first cut +{first_cut - ph.t0:.2f} s"] if first_cut else []
        parts += [f"CLOSED {at(closed)}"] if closed else [ph.end if ph.end != "?" else f"{st['state']} last seen"]
        ph.say("timeline: " + ", ".join(parts))
        ph.say({"CLOSED": "the gateway is CLOSED now and stays so: replace its pod (kubectl delete pod) before the "
                          "next run",
                "FAULT": "the drain ended in FAULT (POST /fault, or the gateway faulted): only a restart of "
                         "istio-proxy leaves it; replace its pod",
                "OPEN": "the drain ended in OPEN: someone reopened the gateway"}.get(
            ph.end, f"lost the health port mid-drain ({ph.health_lost}): the drain goes on without this run; "
                    "replace the pod once it is CLOSED"))
        ph.say(f"lost {len(ph.lost())} of {len(ph.streams)}, gateway cut {r['cut']}, forced {forced}")

    # -- the whole ---------------------------------------------------------------------
    def run(self) -> int:
        a = self.args
        try:
            self.preflight()
            gateways = ", ".join(f"{role} gateway {gw.url}" for role, gw in self.plan())
            say(f"prove: {a.streams} streams ({', '.join(a.kinds)}) of {a.seconds} s through {self.through.url}; "
                f"{gateways}: OPEN")
            if self.ledger:
                say(f"ledger {self.ledger.url}: this run's ids start with {self.ledger.prefix}")
            if a.fingerprint:
                self.app_503()
            for role, gw in self.plan():
                if self.phases:
                    self.check(gw, "; after the control: do --control-health and --health reach one gateway?")
                ph = Phase(role, gw)
                self.phases.append(ph)
                self.open_streams(ph)
                if self.ledger:
                    self.open_held(ph)
                    ph.steady = Steady(self.ledger, ph.role)
                    time.sleep(LEAD_S)
                self.drain(ph)
                if self.ledger:
                    self.finish_ledger(ph)
                self.report(ph)
                if self.ledger:
                    report_ledger(ph)
            fp = fingerprint(self.phases, self.probes) if a.fingerprint else None
            code, lines = judge(self.phases, a.kinds, self.probes, fp)
            for line in lines:
                say(line)
            if fp:
                for line in fingerprint_text(fp):
                    say(line)
                if a.json:
                    print(json.dumps({**fp, "exit": code, "verdict": lines[-1]}, indent=1), flush=True)
            return code
        except BadInput as e:
            print(f"prove: error: {e}", file=sys.stderr, flush=True)
            left = self.leave()
            if left:
                print(f"prove: {left}", file=sys.stderr, flush=True)
            return EXIT_BAD
        except KeyboardInterrupt:
            ph = self.phases[-1] if self.phases else None
            if ph and ph.under_way:
                say(f"prove: interrupted: {self.leave()}")
            elif ph and ph.end:
                say(f"prove: interrupted; the drain had ended: the gateway is {ph.end}")
            else:
                say("prove: interrupted; nothing was drained" if not ph or ph.role == "control" else
                    f"prove: interrupted; the proof's gateway was not drained (the control's is {self.phases[0].end})")
            return EXIT_INTERRUPTED
        except Exception:  # a fault of this tool: the drain it started must not outlive it
            left = self.leave()
            if left:
                print(f"prove: {left}", file=sys.stderr, flush=True)
            raise
        finally:
            self.stop_ledger()
            streams = [s for ph in self.phases for s in ph.streams]
            for s in streams:
                s.kill()
            # No stream's thread may outlive the run: the interpreter's exit would find it
            # blocked in a read.
            for s in streams:
                s.done.wait(STOP_WITHIN_S)

    def leave(self) -> str:
        """Leaves no drain this run started behind: hangs up the held call, reopens."""
        ph = self.phases[-1] if self.phases else None
        if not ph or not ph.under_way:
            return ""
        ph.held.hang_up()
        ph.held = None
        return reopen(ph.gw)


def main(argv: list[str] | None = None) -> int:
    # Explicitly: Python installs its SIGINT handler only when SIGINT is not ignored at start,
    # and a script's background job starts with SIGINT ignored. SIGTERM ends it the same way.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = parse(argv)
    OUT[0] = sys.stderr if args.json else sys.stdout
    try:
        run = Run(args)
    except BadInput as e:
        print(f"prove: error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD
    return run.run()


if __name__ == "__main__":
    sys.exit(main())
