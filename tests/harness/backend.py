"""Demo backend behind the traffic listener (stdlib only).

  GET /                      200 "hello"
  GET /stream?seconds=N      chunked, one chunk per `interval_ms` (default 1000) for N seconds
  GET /slow?ms=N             waits N ms, then 200
  GET /reset?after_ms=N      sends headers and one chunk, then resets the TCP connection
  GET /ws                    websocket upgrade (101), then echoes raw bytes until the client closes
  GET /drip?duration=D&numbytes=N   go-httpbin's /drip (what prove.py streams): content-length N,
                             N bytes "*" spread over D (Go duration "5s", or seconds)
  GET /websocket/echo        go-httpbin's websocket echo (RFC 6455 frames): each message back,
                             pong to a ping, close frame to a close frame, then the server closes
  GET /headers               200, the request headers as a JSON object (lower-case names)
  GET /status?code=N&id=X    answers N; the body is how many requests with that id this backend
                             has processed ("processed 2"): a request an LB resent shows it
  POST (any path)            the body is read first, then answered as the GET; PUT, PATCH and
                             DELETE the same
  any method /ledger/<id>, GET|DELETE /executions
                             the shipped ledger's own (envoyfilter/tools/ledger.py): one
                             execution of <id> per request (?hold_ms, ?status, Idempotency-Key)

Every execution is counted in one place, the ledger's `Ledger`: /ledger/<id>, /status?id=X and
each /stream, /ws and /drip that carries `id=X`; GET /executions says how often each id ran.

Run: python -m tests.harness.backend --port 18081
"""
import argparse
import base64
import hashlib
import importlib.util
import json
import re
import socket
import struct
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
LEDGER_PY = Path(__file__).resolve().parents[2] / "envoyfilter" / "tools" / "ledger.py"


def _load_ledger():
    """envoyfilter/tools/ledger.py, the application shipped to operators (a script, not a package)."""
    spec = importlib.util.spec_from_file_location("drain_gate_ledger", LEDGER_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ledger = _load_ledger()


class Handler(ledger.Handler):
    """The demo paths, and the ledger's: its Handler answers /ledger/<id> and /executions, its
    Ledger (`self.ledger`, one per server: `handler()`) counts every execution."""

    protocol_version = "HTTP/1.1"
    server_version = BaseHTTPRequestHandler.server_version
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle holds the
    # second until the peer's delayed ACK and every keep-alive request takes 40+ ms.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # quiet
        pass

    def _q(self, name, default):
        vals = parse_qs(urlsplit(self.path).query).get(name)
        return float(vals[0]) if vals else default

    def _plain(self, code, body):
        data = body.encode()
        self.send_response(code)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _ledger_path(self) -> bool:
        path = urlsplit(self.path).path
        return path.startswith(ledger.PREFIX) or path == "/executions"

    def _run(self) -> None:
        """One execution of the request's `id=`, in the ledger (none without an id)."""
        rid = (parse_qs(urlsplit(self.path).query).get("id") or [None])[0]
        if rid is not None:
            self.ledger.begin(rid, None)

    def do_GET(self):
        if self._ledger_path():
            return self.handle_any()
        path = urlsplit(self.path).path
        if path in ("/stream", "/ws", "/drip"):
            self._run()
        if path == "/stream":
            seconds = self._q("seconds", 10)
            interval = self._q("interval_ms", 1000) / 1000
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            n = max(1, round(seconds / interval))
            for i in range(n):
                self._chunk(b"chunk %d\n" % i)
                time.sleep(interval)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        elif path == "/slow":
            time.sleep(self._q("ms", 1000) / 1000)
            self._plain(200, "slow\n")
        elif path == "/reset":
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self._chunk(b"partial\n")
            time.sleep(self._q("after_ms", 100) / 1000)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
        elif path == "/ws":
            self.send_response(101)
            self.send_header("upgrade", "websocket")
            self.send_header("connection", "Upgrade")
            key = self.headers.get("sec-websocket-key")
            if key:  # RFC 6455 handshake; HAProxy refuses a 101 without it (502)
                digest = hashlib.sha1((key + _WS_GUID).encode()).digest()
                self.send_header("sec-websocket-accept", base64.b64encode(digest).decode())
            self.end_headers()
            self.wfile.flush()
            self.connection.settimeout(120)
            try:
                while True:
                    data = self.connection.recv(4096)
                    if not data:
                        break
                    self.connection.sendall(data)
            except OSError:
                pass
            self.close_connection = True
        elif path == "/drip":
            self._drip()
        elif path == "/websocket/echo":
            self._websocket_echo()
        elif path == "/headers":
            self._plain(200, json.dumps({k.lower(): v for k, v in self.headers.items()}))
        elif path == "/status":
            key = (parse_qs(urlsplit(self.path).query).get("id") or [""])[0]
            _, n = self.ledger.begin(key, None)
            self._plain(int(self._q("code", 200)), f"processed {n}\n")
        else:
            self._plain(200, "hello\n")

    def _drip(self):
        """go-httpbin's /drip: `numbytes` bytes over `duration`, the first at once."""
        q = parse_qs(urlsplit(self.path).query)
        duration = _go_duration((q.get("duration") or ["2s"])[0])
        n = int((q.get("numbytes") or ["10"])[0])
        pause = duration / (n - 1) if n > 1 else duration
        self.send_response(200)
        self.send_header("content-type", "application/octet-stream")
        self.send_header("content-length", str(n))
        self.end_headers()
        for i in range(n):
            if i and pause:
                time.sleep(pause)
            self.wfile.write(b"*")
            self.wfile.flush()

    def _websocket_echo(self):
        key = self.headers.get("sec-websocket-key")
        if (self.headers.get("upgrade") or "").lower() != "websocket" or not key:
            self._plain(400, "not a websocket upgrade\n")
            return
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept",
                         base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        self.connection.settimeout(3600)
        try:
            while (frame := _ws_read(self.rfile)) is not None:
                opcode, payload = frame
                if opcode == 0x8:  # close: answer it, then the server closes first (RFC 6455 7.1.1)
                    self.wfile.write(_ws_frame(0x8, payload[:2]))
                    return
                if opcode in (0x1, 0x2, 0x9):  # text, binary: echoed; ping: pong
                    self.wfile.write(_ws_frame(0xA if opcode == 0x9 else opcode, payload))
                    self.wfile.flush()
        except OSError:
            pass

    def do_POST(self):
        if self._ledger_path():
            return self.handle_any()
        # Read the body first: left unread it would be parsed as the next request on the connection.
        left = int(self.headers.get("content-length") or 0)
        while left > 0:
            chunk = self.rfile.read(min(left, 65536))
            if not chunk:
                break
            left -= len(chunk)
        self.do_GET()

    def _ledger_only(self):
        """HEAD, OPTIONS: the ledger's paths, else 501 as the demo paths always answered them."""
        if self._ledger_path():
            return self.handle_any()
        self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({self.command!r})")

    do_PUT = do_PATCH = do_DELETE = do_POST
    do_HEAD = do_OPTIONS = _ledger_only


def handler() -> type[Handler]:
    """The handler class of one server: a Ledger of its own."""
    return type("BackendHandler", (Handler,), {"ledger": ledger.Ledger()})


def _go_duration(text: str) -> float:
    """A Go duration ("5s", "500ms", "1m") or a number of seconds, as go-httpbin reads it."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text)
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    return float(m[1]) * units[m[2] or "s"]


def _ws_read(rfile) -> tuple[int, bytes] | None:
    """One client frame (masked, unfragmented): (opcode, payload); None at EOF."""
    head = rfile.read(2)
    if len(head) < 2:
        return None
    n = head[1] & 0x7F
    if n == 126:
        n = struct.unpack("!H", rfile.read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", rfile.read(8))[0]
    mask = rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
    data = rfile.read(n)
    return head[0] & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def _ws_frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked server frame (FIN set)."""
    n = len(payload)
    size = bytes([n]) if n < 126 else b"\x7e" + struct.pack("!H", n) if n < 65536 else b"\x7f" + struct.pack("!Q", n)
    return bytes([0x80 | opcode]) + size + payload


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


def serve(port: int, host: str = "127.0.0.1") -> Server:
    """Starts the backend on a daemon thread and returns the server."""
    srv = Server((host, port), handler())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18081)
    args = ap.parse_args()
    srv = Server(("127.0.0.1", args.port), handler())
    print(f"demo backend on 127.0.0.1:{args.port}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
