"""pilot-agent's readiness, as istio-proxy's Envoy reaches it through its `agent` cluster.

What Istio's pilot-agent (1.30, `pilot/cmd/pilot-agent/status`) does on its status port, as far as
drain-gate's `termination_watch` and an LB checking it see:

- `GET /healthz/ready` answers a status and nothing else (`handleReadyProbe` writes the status line
  only; the reason goes to pilot-agent's own log), over HTTP/1.1 with keep-alive (Go's net/http):
  503 until Envoy first is ready (its first configuration received, `server.state` LIVE, its workers
  started), 200 from then on — both facts are cached for the life of the process, so readiness
  never goes back — and 503 from SIGTERM on ("server is terminated": the agent's context is
  cancelled).
- At SIGTERM the status server stops accepting connections (`Run` returns as the context is
  cancelled and closes its listener); a connection already open — Envoy keeps its upstream
  connections — is still answered, 503.
"""
from __future__ import annotations

import socket
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

READY_PATH = "/healthz/ready"
POLL_S = 0.05  # how soon a SIGTERM closes the listener (socketserver's poll interval)


class _Readiness(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Go's net/http
    server: "_Server"

    def log_message(self, fmt, *args):
        pass

    def setup(self):
        super().setup()
        self.server.conns.add(self.connection)

    def finish(self):
        self.server.conns.discard(self.connection)
        super().finish()

    def do_GET(self):
        code = self.server.agent.answer() if self.path == READY_PATH else 404
        # Go's headers for a handler that only calls WriteHeader (gzhttp adds the Vary).
        self.send_response_only(code)
        self.send_header("Vary", "Accept-Encoding")
        self.send_header("Date", formatdate(usegmt=True))
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    agent: "PilotAgent"
    conns: set

    def handle_error(self, request, client_address):
        pass  # HAProxy closes a check's connection as soon as it has the status line


class PilotAgent:
    """pilot-agent's status port on 127.0.0.1:`port`. `envoy_ready()` is what pilot-agent reads
    of Envoy (its admin stats) until it first says yes. Use as a context manager, or start()
    and stop(); stop() also closes the connections still open."""

    def __init__(self, port: int, envoy_ready: Callable[[], bool]):
        self.port = port
        self.envoy_ready = envoy_ready
        self.ready_once = False
        self.terminated = False
        self.answers: list[int] = []  # every readiness status answered, in order
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._serving: threading.Thread | None = None

    def answer(self) -> int:
        with self._lock:
            if not self.terminated and not self.ready_once:
                self.ready_once = bool(self.envoy_ready())
            code = 503 if self.terminated or not self.ready_once else 200
            self.answers.append(code)
            return code

    def start(self) -> "PilotAgent":
        self._server = _Server(("127.0.0.1", self.port), _Readiness)
        self._server.agent = self
        self._server.conns = set()
        self._serving = threading.Thread(target=self._server.serve_forever, args=(POLL_S,), daemon=True)
        self._serving.start()
        return self

    def sigterm(self) -> None:
        """The pod's SIGTERM: no new connection accepted, and 503 from now on. The listener is
        closed first, so every 503 of the termination is answered on a connection opened before."""
        self._close_listener()
        with self._lock:
            self.terminated = True

    def _close_listener(self) -> None:
        if self._server and self._serving:
            self._server.shutdown()
            self._server.server_close()
            self._serving = None

    def stop(self) -> None:
        self._close_listener()
        if self._server:
            for conn in list(self._server.conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._server = None

    def __enter__(self) -> "PilotAgent":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
