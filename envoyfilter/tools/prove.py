#!/usr/bin/env python3
"""Does your LB cut a drain-gate drain? Opens N long streams through the LB,
drains one gateway as its preStop does (POST /drain?wait=closed) and follows it
to CLOSED. --control flips that gateway's check to 503 at drain start instead
(/close-lb): the LB's DOWN then finds the streams in flight. Run the control
first: a control that cuts nothing proves nothing. A drained gateway stays
CLOSED: replace its pod before the next run.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.client
import json
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
--through needs go-httpbin behind the LB (kubernetes/prove-httpbin.yaml): it
  asks URL/drip?duration=S (http1, http2) and URL/websocket/echo (ws).
needs: python3 >= 3.8; curl with HTTP2; DRAIN_GATE_ADMIN_TOKEN when --health is
  reached from outside admin_allow (kubectl port-forward comes from 127.0.0.1).
exit: 0 nothing lost, nothing cut; 1 streams lost or cut (what a control that
  proves something answers); 2 bad input, a gateway not OPEN or in a preStop
  hold, too few streams on it (no drain started); 130 interrupted (a drain
  under way is reopened)."""

KINDS = ("http1", "http2", "ws")
MAX_SECONDS = 600  # kubernetes/prove-httpbin.yaml lets an answer last 11 minutes
EXIT_CLEAN, EXIT_LOST, EXIT_BAD, EXIT_INTERRUPTED = 0, 1, 2, 130
TOKEN_ENV = "DRAIN_GATE_ADMIN_TOKEN"
# The in-flight count is published by each worker every tick (100 ms by default): read until it
# holds still for STEADY_S (over two ticks), at most REACH_WINDOW_S.
REACH_WINDOW_S = 1.0
STEADY_S = 0.25
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


class BadInput(Exception):
    """Exit 2, with the cause."""


def say(line: str) -> None:
    print(line, flush=True)


# -- the gateway's health port ------------------------------------------------------
class Gateway:
    """One gateway's health port (:18180): drain-gate's HTTP API."""

    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self.u = urlsplit(self.url)
        if self.u.scheme not in ("http", "https") or not self.u.hostname:
            raise BadInput(f"--health {url}: not an http(s) URL")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def connection(self, timeout: float | None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.u.scheme == "https" else http.client.HTTPConnection
        return cls(self.u.hostname, self.u.port, timeout=timeout)

    def path(self, path: str) -> str:
        return self.u.path + path

    def call(self, method: str, path: str, timeout: float = 10) -> tuple[int, dict]:
        conn = self.connection(timeout)
        try:
            conn.request(method, self.path(path), headers=self.headers)
            r = conn.getresponse()
            code, body = r.status, r.read()
        except (OSError, http.client.HTTPException) as e:
            raise BadInput(f"--health {self.url}: unreachable ({e})") from None
        finally:
            conn.close()
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        return code, doc if isinstance(doc, dict) else {}

    def status(self) -> dict:
        code, doc = self.call("GET", "/drain/status")
        if code != 200 or not {"state", "receipt", "progress", "in_flight"} <= set(doc):
            raise BadInput(f"--health {self.url}: /drain/status answered {code} without drain-gate's status "
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
            raise BadInput(f"--health {gw.url}: unreachable ({e})") from None
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
        _, _, tail = "".join(out).rpartition(MARK.strip("\n"))
        parts = tail.split()
        status, size = (int(parts[0]), int(parts[1])) if len(parts) >= 2 and parts[1].isdigit() else (0, 0)
        if code == 0 and status == 200 and size == self.expected:
            self._end(True)
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


# -- the run ---------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="prove.py", description=__doc__, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--through", required=True, metavar="URL", help="the LB (its VIP) in front of go-httpbin")
    ap.add_argument("--health", required=True, metavar="URL",
                    help="one gateway's :18180 behind it, e.g. http://127.0.0.1:18180")
    ap.add_argument("--streams", type=int, default=30, metavar="N", help="streams, spread over the kinds (30)")
    ap.add_argument("--seconds", type=int, default=30, metavar="S",
                    help="each stream's length, above the LB's detection window (30)")
    ap.add_argument("--kinds", default=",".join(KINDS), metavar="K", help="of http1,http2,ws (all)")
    ap.add_argument("--control", action="store_true", help="flip the check at drain start (/close-lb)")
    ap.add_argument("--cacert", metavar="FILE", help="the CA of an https --through (default: the system's)")
    ap.add_argument("--insecure", action="store_true", help="do not verify an https --through")
    args = ap.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in args.kinds if k not in KINDS]
    if bad or not args.kinds:
        ap.error(f"--kinds: {','.join(bad) or 'none'}: the kinds are {', '.join(KINDS)}")
    if not 1 <= args.streams <= 1000:
        ap.error(f"--streams {args.streams}: between 1 and 1000")
    if not 1 <= args.seconds <= MAX_SECONDS:
        ap.error(f"--seconds {args.seconds}: between 1 and {MAX_SECONDS}")
    return args


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.gw = Gateway(args.health, os.environ.get(TOKEN_ENV, ""))
        self.through = Through(args.through, args.cacert, args.insecure)
        self.streams: list[Stream] = []
        self.held: HeldDrain | None = None
        self.closed = False

    # -- before anything is drained ---------------------------------------------------
    def preflight(self) -> dict:
        http_kinds = [k for k in self.args.kinds if k != "ws"]
        if http_kinds and not shutil.which("curl"):
            raise BadInput(f"--kinds {','.join(http_kinds)}: curl is not installed")
        if "http2" in self.args.kinds and "HTTP2" not in subprocess.run(["curl", "-V"], capture_output=True,
                                                                          text=True).stdout:
            raise BadInput("--kinds http2: this curl has no HTTP2 (curl -V)")
        st = self.gw.status()
        hold = st["progress"]["prestop_hold_until"]
        if hold:
            raise BadInput(f"the gateway behind --health is in a preStop hold (lease until {hold}): its pod is "
                           "terminating; prove.py drains only a gateway no one else is draining")
        if st["state"] != "OPEN":
            raise BadInput(f"the gateway behind --health is {st['state']}, not OPEN (a drained gateway stays CLOSED "
                           "until its pod is replaced)")
        if not st["count"]["reliable"]:
            raise BadInput(f"the gateway's count is not reliable ({st['count']['unreliable_reason']}): a drain "
                           "there proves nothing")
        code, doc = self.gw.call("POST", "/reopen")  # illegal in OPEN (409): changes nothing, tells who may drain
        if code in (401, 403):
            raise BadInput(f"--health {self.gw.url}: admin calls answered {code} {doc.get('error', '')}: set "
                           f"{TOKEN_ENV} (admin_token), or reach it from admin_allow (kubectl port-forward)")
        for kind in self.args.kinds:
            self.probe(kind)
        return st

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

    def open_streams(self, baseline: int) -> int:
        """Opens the streams, waits until each started, returns how many the gateway counts."""
        a = self.args
        for i in range(a.streams):
            self.streams.append(self.through.open(a.kinds[i % len(a.kinds)], a.seconds))
        deadline = time.monotonic() + START_WITHIN_S
        while time.monotonic() < deadline and not all(s.started or s.done.is_set() for s in self.streams):
            time.sleep(0.02)
        failed = [s for s in self.streams if not s.started]
        if failed:
            raise BadInput(f"{len(failed)} of {a.streams} streams did not start through --through "
                           f"({failed[0].kind}: {failed[0].how or 'no answer'})")
        reached, since, end = 0, time.monotonic(), time.monotonic() + REACH_WINDOW_S
        while reached < a.streams and time.monotonic() < end and not (reached and time.monotonic() - since > STEADY_S):
            now = in_flight(self.gw.status()) - baseline
            if now > reached:
                reached, since = now, time.monotonic()
            time.sleep(0.05)
        return reached

    # -- the drain ---------------------------------------------------------------------
    def drain(self) -> tuple[float, dict]:
        """Starts the drain (and, for the control, the flip), follows it to CLOSED and
        until every stream ended; returns when it began (this clock) and the last status."""
        t0 = time.time()
        self.held = HeldDrain(self.gw)
        deadline = time.monotonic() + 10
        while self.gw.status()["state"] == "OPEN":
            if self.held.done.is_set() or time.monotonic() > deadline:
                raise BadInput(f"POST /drain?wait=closed answered {self.held.code or self.held.error} and the "
                               "gateway stayed OPEN")
            time.sleep(0.02)
        if self.args.control:
            code, doc = self.gw.call("POST", "/close-lb")
            if code != 200:
                raise BadInput(f"POST /close-lb answered {code} {doc.get('error', '')} (state {doc.get('state')})")
        say(f"prove: {'drained with the flip at once (the control)' if self.args.control else 'draining'} at "
            f"{datetime.fromtimestamp(t0).strftime('%H:%M:%S')}; following it to CLOSED")
        st = self.gw.status()
        while not (self.held.done.is_set() or st["state"] in ("CLOSED", "FAULT")):
            time.sleep(0.1)
            st = self.gw.status()
        self.closed = st["state"] == "CLOSED" or self.held.code == 200
        if not self.closed:
            raise BadInput(f"the drain ended in {st['state']}, not CLOSED (the held call: "
                           f"{self.held.code or self.held.error}): someone else moved the gateway; nothing to judge")
        end = max(s.started for s in self.streams) + self.args.seconds + 70
        while not all(s.done.is_set() for s in self.streams) and time.time() < end:
            time.sleep(0.05)
        return t0, self.gw.status()

    # -- what it saw -------------------------------------------------------------------
    def report(self, t0: float, reached: int, st: dict) -> int:
        a, streams = self.args, self.streams
        for kind in a.kinds:
            mine = [s for s in streams if s.kind == kind]
            lost = Counter(s.how for s in mine if not s.ok)
            how = "; ".join(f"{h}: {n}" for h, n in sorted(lost.items()))
            say(f"{kind + ':':6} sent {len(mine)}, completed {len(mine) - sum(lost.values())}, "
                f"cut {sum(lost.values())}" + (f" ({how})" if how else ""))
        r, p, lb = st["receipt"], st["progress"], st["lb"]
        start = ts(p["drain_started_at"])
        flip = ts(p["closing_at"])
        down = ts(lb["observed_down_at"]) if lb["observed_down"] else None
        closed = ts(p["closed_at"])
        reason = next((x["reason"] for x in p["transitions"] if x["to"] == "CLOSING"), "-")
        forced = (p["active_at_closing"] or 0) if p["forced"] else 0
        at = (lambda t: f"+{t - start:.2f} s") if start else (lambda t: "?")
        say(f"receipt: cut {r['cut']} (by the LB {r['cut_lb']}, other {r['cut_other']}), completed {r['completed']}, "
            f"ended upstream {r['ended_upstream']}, refused {r['refused']}, forced {'yes' if p['forced'] else 'no'}, "
            f"flip {at(flip) if flip else '-'} ({reason})")
        lost = [s for s in streams if not s.ok]
        first_cut = min((s.ended for s in lost), default=None)
        parts = ["drain 0.00 s", f"flip {at(flip)}" if flip else "no flip"]
        parts += [f"LB down {at(down)}" if down else "LB down not seen"]
        parts += [f"first cut +{first_cut - t0:.2f} s"] if first_cut else []
        parts += [f"CLOSED {at(closed)}"] if closed else [f"{st['state']}"]
        say("timeline: " + ", ".join(parts))
        self.verdict(t0, reached, st, lost, down, start)
        if self.closed:
            say("prove: the gateway is CLOSED now and stays so: replace its pod (kubectl delete pod) before the "
                "next run")
        say(f"prove: lost {len(lost)} of {len(streams)}, gateway cut {r['cut']}, forced {forced}")
        return EXIT_CLEAN if not lost and r["cut"] == 0 else EXIT_LOST

    def verdict(self, t0, reached, st, lost, down, start) -> None:
        r = st["receipt"]
        if not self.args.control:
            if lost or r["cut"]:
                say(f"prove: NOT clean: {len(lost)} stream(s) lost, {r['cut']} cut on the gateway")
            else:
                say(f"prove: clean: every stream completed, {reached} of them through the drained gateway, and "
                    "it cut nothing (if this LB's control cut nothing, this proves nothing about it)")
            return
        if lost or r["cut"]:
            say(f"control: the LB cut {len(lost)} stream(s) once the check said 503: it cuts at DOWN, so the run "
                "without --control is a proof")
            return
        last_end = max(s.ended for s in self.streams) - t0
        if not st["lb"]["checkers"]:
            why = "no LB checker asked this gateway's /health_check.html: this LB does not read drain-gate's check"
        elif down is None:
            why = (f"no LB checker was served {st['lb']['lb_fall']} 503s in a row (lb_fall): the LB never took the "
                   "gateway out while the streams ran (its fall above lb_fall, or --seconds too short)")
        elif start and last_end < down - start:
            why = (f"the streams ended (+{last_end:.2f} s) before the LB marked the gateway down "
                   f"(+{down - start:.2f} s): raise --seconds above its detection window")
        else:
            why = (f"the LB marked the gateway down (+{down - start:.2f} s) with the streams in flight and cut none: "
                   "it does not cut at DOWN")
        say(f"control: proved nothing: {why}; a run without --control proves nothing about this LB")

    # -- the whole ---------------------------------------------------------------------
    def run(self) -> int:
        a = self.args
        try:
            st = self.preflight()
            say(f"prove: {a.streams} streams ({', '.join(a.kinds)}) of {a.seconds} s through {self.through.url}; "
                f"gateway {self.gw.url}: OPEN")
            baseline = in_flight(st)
            reached = self.open_streams(baseline)
            say(f"prove: {reached} of {a.streams} streams reached the gateway (its in-flight count "
                f"{baseline} -> {baseline + reached})")
            if reached < len(a.kinds):
                raise BadInput(f"too few streams through the gateway behind --health to judge: {reached} of "
                               f"{a.streams} reached it, {len(a.kinds)} needed (more --streams, or --health on a "
                               "gateway this LB sends to); nothing was drained")
            t0, st = self.drain()
            return self.report(t0, reached, st)
        except BadInput as e:
            print(f"prove: error: {e}", file=sys.stderr, flush=True)
            left = self.leave()
            if left:
                print(f"prove: {left}", file=sys.stderr, flush=True)
            return EXIT_BAD
        except KeyboardInterrupt:
            if self.closed:
                say("prove: interrupted; the drain had ended: the gateway is CLOSED")
            else:
                say("prove: interrupted" + (f": {self.leave()}" if self.held else "; nothing was drained"))
            return EXIT_INTERRUPTED
        except Exception:  # a fault of this tool: the drain it started must not outlive it
            left = self.leave()
            if left:
                print(f"prove: {left}", file=sys.stderr, flush=True)
            raise
        finally:
            for s in self.streams:
                s.kill()
            # No stream's thread may outlive the run: the interpreter's exit would find it
            # blocked in a read.
            for s in self.streams:
                s.done.wait(STOP_WITHIN_S)

    def leave(self) -> str:
        """Leaves no drain this run started behind: hangs up the held call, reopens."""
        if not self.held or self.closed:
            return ""
        self.held.hang_up()
        self.held = None
        return reopen(self.gw)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = parse(argv)
    try:
        run = Run(args)
    except BadInput as e:
        print(f"prove: error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD
    return run.run()


if __name__ == "__main__":
    sys.exit(main())
