"""What tests send to a running gateway and read back: the health API calls
(/drain/status, admin POSTs), raw HTTP/1.1 on fresh connections, and one
HTTP/2 request with headers sent as they are."""
from __future__ import annotations

import http.client
import re
import socket
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import requests

STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def status(gw, session: requests.Session | None = None, **kw) -> dict:
    """GET /drain/status of `gw` (anything with `.health(path)`); it must answer 200."""
    r = (session or requests).get(gw.health("/drain/status"), timeout=kw.pop("timeout", 5), **kw)
    assert r.status_code == 200, r.text
    return r.json()


def state(gw) -> str:
    return status(gw)["state"]


def post(gw, path: str, session: requests.Session | None = None, **kw) -> requests.Response:
    """POST to the health listener of `gw` (an admin call)."""
    return (session or requests).post(gw.health(path), timeout=kw.pop("timeout", 10), **kw)


def fresh_get(port: int, path: str, host: str = "127.0.0.1", source: str | None = None,
              headers: dict | None = None, method: str = "GET", timeout: float = 5,
              body: bytes | None = None) -> tuple[int, dict, bytes]:
    """One request on a new connection (so it may land on any worker):
    (status, headers with lower-case names, body). `source` binds the client address."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request(method, path, body=body, headers={"connection": "close", **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def read_head(sock: socket.socket, limit: int = 65536) -> bytes:
    """What the peer sends up to the end of a message head (a blank line), its close,
    or `limit` bytes: the head and whatever came with it."""
    buf = b""
    while b"\r\n\r\n" not in buf and len(buf) < limit:
        data = sock.recv(4096)
        if not data:
            break
        buf += data
    return buf


def recv_until_close(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    """Everything the peer sends until it closes or resets (at most `limit` bytes).
    A socket timeout propagates: a peer that never closes is an error, not an answer."""
    out = b""
    while len(out) < limit:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return out


def statuses(raw: bytes) -> list[int]:
    """Status codes of every response in a raw HTTP/1.x byte stream (no 1xx here)."""
    return [int(m[1]) for m in STATUS_LINE.finditer(raw)]


def raw_exchange(port: int, request: bytes, timeout: float = 5) -> tuple[int | None, dict, bytes]:
    """Sends `request` bytes as they are on a new connection and reads until the
    peer closes: (status, headers with lower-case names, body) of its HTTP/1
    answer, or (None, {}, b"") when none came. The request should ask the peer
    to close (`Connection: close`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw = recv_until_close(s)
    if not STATUS_LINE.match(raw):
        return None, {}, b""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


@dataclass
class H2Answer:
    status: int | None = None
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    # "ended" (a whole answer), "reset" (RST_STREAM), "closed" (the connection
    # went away: GOAWAY, EOF or TCP reset) or "timeout".
    outcome: str = "timeout"
    # The RST_STREAM's error code (RFC 9113 §7), when reset.
    error_code: int | None = None


def h2_exchange(port: int, headers: list[tuple[str, str]], timeout: float = 5) -> H2Answer:
    """One HTTP/2 (prior knowledge) request on a new connection, its headers
    sent as they are: not validated or normalized by the client."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding="utf-8", validate_outbound_headers=False,
        normalize_outbound_headers=False, validate_inbound_headers=False))
    answer = H2Answer()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        conn.initiate_connection()
        conn.send_headers(1, headers, end_stream=True)
        s.sendall(conn.data_to_send())
        deadline = time.monotonic() + timeout
        while answer.outcome == "timeout" and time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                data = b""
            if not data:
                answer.outcome = "closed"
                break
            for ev in conn.receive_data(data):
                _h2_event(conn, ev, answer)
            s.sendall(conn.data_to_send())
    return answer


def _h2_event(conn: h2.connection.H2Connection, ev, answer: H2Answer) -> None:
    if isinstance(ev, h2.events.ResponseReceived):
        answer.headers = dict(ev.headers)
        answer.status = int(answer.headers.pop(":status"))
    elif isinstance(ev, h2.events.DataReceived):
        answer.body += ev.data
        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
    elif isinstance(ev, h2.events.StreamEnded):
        answer.outcome = "ended"
    elif isinstance(ev, h2.events.StreamReset):
        answer.outcome = "reset"
        answer.error_code = int(ev.error_code)
    elif isinstance(ev, h2.events.ConnectionTerminated):
        answer.outcome = "closed"


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
