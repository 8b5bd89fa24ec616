"""Demo backend behind the traffic listener (stdlib only).

  GET /                      200 "hello"
  GET /stream?seconds=N      chunked, one chunk per `interval_ms` (default 1000) for N seconds
  GET /slow?ms=N             waits N ms, then 200
  GET /reset?after_ms=N      sends headers and one chunk, then resets the TCP connection
  GET /ws                    websocket upgrade (101), then echoes raw bytes until the client closes
  GET /headers               200, the request headers as a JSON object (lower-case names)
  GET /status?code=N&id=X    answers N; the body is how many requests with that id this backend
                             has processed ("processed 2"): a request an LB resent shows it
  POST (any path)            the body is read first, then answered as the GET

Run: python -m tests.harness.backend --port 18081
"""
import argparse
import base64
import hashlib
import json
import socket
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


_PROCESSED: Counter = Counter()  # /status?id=X: requests processed per id
_PROCESSED_LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
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

    def do_GET(self):
        path = urlsplit(self.path).path
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
                digest = hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
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
        elif path == "/headers":
            self._plain(200, json.dumps({k.lower(): v for k, v in self.headers.items()}))
        elif path == "/status":
            key = (parse_qs(urlsplit(self.path).query).get("id") or [""])[0]
            with _PROCESSED_LOCK:
                _PROCESSED[key] += 1
                n = _PROCESSED[key]
            self._plain(int(self._q("code", 200)), f"processed {n}\n")
        else:
            self._plain(200, "hello\n")

    def do_POST(self):
        # Read the body first: left unread it would be parsed as the next request on the connection.
        left = int(self.headers.get("content-length") or 0)
        while left > 0:
            chunk = self.rfile.read(min(left, 65536))
            if not chunk:
                break
            left -= len(chunk)
        self.do_GET()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


def serve(port: int, host: str = "127.0.0.1") -> Server:
    """Starts the backend on a daemon thread and returns the server."""
    srv = Server((host, port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18081)
    args = ap.parse_args()
    srv = Server(("127.0.0.1", args.port), Handler)
    print(f"demo backend on 127.0.0.1:{args.port}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
