"""A slow authorization server for the filters Istio puts before the router,
on a thread of the test process: the ext_authz filter's HTTP service, and the
JWKS that jwt_authn fetches.

- Any path but /jwks: an authorization check. ext_authz sends it the
  request's method and path (and some headers); it answers 200 (allow).
- /jwks: the JSON Web Key Set of `Jwt`, which signs the tokens.

Either waits first for the milliseconds its path's `authz_ms` query parameter
names (0 without one), so that a test decides which request is held, and for
how long. It counts what it holds right now, per kind.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Jwt:
    """An RSA key (kid `k1`), its JWKS, and RS256 tokens for `issuer`."""

    def __init__(self, issuer: str = "https://issuer.drain-gate.test"):
        self.issuer = issuer
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> bytes:
        numbers = self.key.public_key().public_numbers()
        def raw(n: int) -> bytes:
            return n.to_bytes((n.bit_length() + 7) // 8, "big")
        return json.dumps({"keys": [{"kty": "RSA", "kid": "k1", "alg": "RS256", "use": "sig",
                                     "n": _b64(raw(numbers.n)), "e": _b64(raw(numbers.e))}]}).encode()

    def token(self) -> str:
        head = _b64(json.dumps({"alg": "RS256", "kid": "k1", "typ": "JWT"}).encode())
        body = _b64(json.dumps({"iss": self.issuer, "sub": "client", "exp": int(time.time()) + 3600}).encode())
        signature = self.key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{head}.{body}.{_b64(signature)}"


class AuthzServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, jwt: Jwt | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.port = self.server_address[1]
        self.jwt = jwt or Jwt()
        self.holding: Counter = Counter()  # "check" / "jwks" -> held now
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> "AuthzServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()

    def cluster(self, name: str = "ext-authz") -> dict:
        """An Envoy cluster that reaches it."""
        return {"name": name, "type": "STATIC", "connect_timeout": "1s", "load_assignment": {
            "cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": self.port}}}}]}]}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: AuthzServer

    def log_message(self, fmt, *args):  # quiet
        pass

    def _answer(self) -> None:
        url = urlsplit(self.path)
        kind = "jwks" if url.path == "/jwks" else "check"
        delay = float((parse_qs(url.query).get("authz_ms") or ["0"])[0]) / 1000
        with self.server.lock:
            self.server.holding[kind] += 1
        try:
            time.sleep(delay)
        finally:
            with self.server.lock:
                self.server.holding[kind] -= 1
        body = self.server.jwt.jwks() if kind == "jwks" else b""
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_HEAD = _answer
