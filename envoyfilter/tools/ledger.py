#!/usr/bin/env python3
"""An application that counts what it executes: the backend of the staging
proof's duplicates check, and of drain-gate's own tests.

Every request to /ledger/<id> is one execution of <id>, recorded when it
arrives, before it is held or answered: a client sees only the last answer of
a request its LB sent several times, the ledger sees each. GET /executions
then says how often each id ran; an id that ran more than once is a duplicate.

  /ledger/<id>?hold_ms=N&status=S   any method: one execution of <id>; its body
                                    is read whole, the answer held N ms
                                    (default 0, at most 600000), then answered
                                    S (default 200) with {"id", "executions"}.
                                    With an Idempotency-Key header: a key seen
                                    before is not executed again - its stored
                                    answer is replayed, or 409 while it runs.
  GET /executions                   {"executions": {id: n}, "total", "duplicates": [id, ...]}
  DELETE /executions                forget every execution
  GET /healthz                      200

One process holds the counts: run one replica (kubernetes/prove-ledger.yaml).
Stdlib only, Python >= 3.8.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MAX_HOLD_MS = 600_000
MAX_BODY = 16 * 1024 * 1024
PREFIX = "/ledger/"


class Ledger:
    """The executions per id, and the answers stored per Idempotency-Key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, int] = {}
        self.keys: dict[str, tuple[int, bytes] | None] = {}  # None: still running

    def begin(self, rid: str, key: str | None) -> tuple[str, int | tuple[int, bytes] | None]:
        """("run", executions so far) for an execution; ("replay", answer) or
        ("running", None) for a key seen before."""
        with self.lock:
            if key is not None and key in self.keys:
                stored = self.keys[key]
                return ("running", None) if stored is None else ("replay", stored)
            if key is not None:
                self.keys[key] = None
            self.runs[rid] = self.runs.get(rid, 0) + 1
            return "run", self.runs[rid]

    def finish(self, key: str | None, answer: tuple[int, bytes]) -> None:
        if key is not None:
            with self.lock:
                self.keys[key] = answer

    def report(self) -> dict:
        with self.lock:
            runs = dict(self.runs)
        return {"executions": runs, "total": sum(runs.values()),
                "duplicates": sorted(i for i, n in runs.items() if n > 1)}

    def forget(self) -> None:
        with self.lock:
            self.runs.clear()
            self.keys.clear()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "drain-gate-ledger"
    ledger: Ledger

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def answer(self, status: int, body: dict | bytes) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode() + b"\n"
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def read_body(self) -> bool:
        """Reads the request body whole; False (and answered 400/413) when it cannot."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return True
                self.rfile.read(size + 2)
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            self.answer(400, {"error": "content-length is not a number"})
            return False
        if length < 0 or length > MAX_BODY:
            self.answer(413, {"error": f"body above {MAX_BODY} bytes"})
            return False
        self.rfile.read(length)
        return True

    def handle_any(self) -> None:
        url = urlsplit(self.path)
        if not self.read_body():
            return
        if url.path == "/healthz":
            return self.answer(200, {"ok": True})
        if url.path == "/executions":
            if self.command == "GET":
                return self.answer(200, self.ledger.report())
            if self.command == "DELETE":
                self.ledger.forget()
                return self.answer(200, self.ledger.report())
            return self.answer(405, {"error": "GET or DELETE /executions"})
        if not url.path.startswith(PREFIX) or len(url.path) == len(PREFIX):
            return self.answer(404, {"error": "ask /ledger/<id>, /executions or /healthz"})
        rid = url.path[len(PREFIX):]
        query = parse_qs(url.query)
        try:
            hold_ms = int(query.get("hold_ms", ["0"])[0])
            status = int(query.get("status", ["200"])[0])
        except ValueError:
            return self.answer(400, {"error": "hold_ms and status are whole numbers"})
        if not 0 <= hold_ms <= MAX_HOLD_MS or not 200 <= status <= 599:
            return self.answer(400, {"error": f"hold_ms 0..{MAX_HOLD_MS}, status 200..599"})
        key = self.headers.get("idempotency-key")
        what, value = self.ledger.begin(rid, key)
        if what == "running":
            return self.answer(409, {"error": "a request with this Idempotency-Key is still running"})
        if what == "replay":
            stored_status, stored_body = value
            return self.answer(stored_status, stored_body)
        if hold_ms:
            time.sleep(hold_ms / 1000)
        body = json.dumps({"id": rid, "executions": value}).encode() + b"\n"
        self.ledger.finish(key, (status, body))
        self.answer(status, body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = handle_any


def serve(listen: str) -> ThreadingHTTPServer:
    host, _, port = listen.rpartition(":")
    handler = type("LedgerHandler", (Handler,), {"ledger": Ledger()})
    server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="0.0.0.0:8080", help="host:port (default 0.0.0.0:8080)")
    args = parser.parse_args(argv)
    try:
        server = serve(args.listen)
    except (OSError, ValueError) as e:
        print(f"ledger: cannot listen on {args.listen}: {e}", file=sys.stderr)
        return 2

    def stop(signum, _frame) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    # Installed explicitly: a process started with SIGINT ignored (a script's
    # background job) would otherwise not stop on it.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"ledger: listening on {args.listen}", flush=True)
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
