"""An HTTP/3 client (aioquic) for the gateway's QUIC listener: one QUIC connection,
run by its own asyncio loop in a background thread, that records what the server
sent on it — each request stream's status, bytes and end, the HTTP/3 GOAWAY frames
on the server's control stream, and the connection's close.

aioquic's H3Connection reads a GOAWAY frame but raises no event for it, so the
client reads the server's control stream itself (RFC 9114 section 6.2.1: a stream
type, then frames of type, length, payload; GOAWAY is type 0x07 with one stream id).
"""
from __future__ import annotations

import asyncio
import ssl
import threading
import time
from dataclasses import dataclass, field

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import Buffer, BufferReadError
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamDataReceived, StreamReset

CONTROL_STREAM = 0x00
GOAWAY = 0x07


@dataclass
class Stream:
    """One request stream, as the client saw it."""

    stream_id: int
    status: int | None = None
    body: bytes = b""
    ended: bool = False  # the server's END_STREAM (a FIN on the QUIC stream)
    reset: int | None = None  # the server's RESET_STREAM error code

    @property
    def chunks(self) -> int:
        return self.body.count(b"chunk ")


@dataclass
class _Uni:
    data: bytearray = field(default_factory=bytearray)


def goaways_in(data: bytes) -> list[int] | None:
    """The stream ids of the GOAWAY frames in the complete frames of a server
    unidirectional stream's bytes, or None when it is not the control stream."""
    buf = Buffer(data=bytes(data))
    try:
        if buf.pull_uint_var() != CONTROL_STREAM:
            return None
    except BufferReadError:
        return []
    found = []
    while not buf.eof():
        try:
            kind, size = buf.pull_uint_var(), buf.pull_uint_var()
            payload = buf.pull_bytes(size)
        except BufferReadError:
            break  # the rest of the frame has not arrived yet
        if kind == GOAWAY:
            found.append(Buffer(data=payload).pull_uint_var())
    return found


class _Protocol(QuicConnectionProtocol):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.h3 = H3Connection(self._quic)
        self.streams: dict[int, Stream] = {}
        self.uni: dict[int, _Uni] = {}
        self.terminated: ConnectionTerminated | None = None

    def quic_event_received(self, event) -> None:
        if isinstance(event, ConnectionTerminated):
            self.terminated = event
        if isinstance(event, StreamDataReceived) and event.stream_id % 4 == 3:  # server-initiated uni
            self.uni.setdefault(event.stream_id, _Uni()).data += event.data
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            self.streams[event.stream_id].reset = event.error_code
        for ev in self.h3.handle_event(event):
            s = self.streams.get(getattr(ev, "stream_id", -1))
            if s is None:
                continue
            if isinstance(ev, HeadersReceived):
                s.status = int(dict(ev.headers).get(b":status", b"0"))
                s.ended = s.ended or ev.stream_ended
            elif isinstance(ev, DataReceived):
                s.body += ev.data
                s.ended = s.ended or ev.stream_ended

    def goaways(self) -> list[int]:
        for uni in self.uni.values():
            found = goaways_in(uni.data)
            if found is not None:
                return found
        return []

    def get(self, authority: str, path: str) -> Stream:
        sid = self._quic.get_next_available_stream_id()
        self.streams[sid] = Stream(sid)
        self.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                                   (b":authority", authority.encode()), (b":path", path.encode())],
                             end_stream=True)
        self.transmit()
        return self.streams[sid]


class H3Client:
    """One HTTP/3 connection to 127.0.0.1:`port` (the test certificate is not checked).
    A context manager: the connection and its loop end on every exit path."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10, idle_timeout: float = 60):
        self.port, self.host, self.timeout = port, host, timeout
        self.config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE,
                                        server_name="drain-gate.test", idle_timeout=idle_timeout)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._cm = None
        self.proto: _Protocol | None = None

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout)

    def _call(self, fn):
        async def call():
            return fn()
        return self._run(call())

    def __enter__(self) -> "H3Client":
        self.thread.start()

        async def open_():
            self._cm = connect(self.host, self.port, configuration=self.config, create_protocol=_Protocol)
            return await self._cm.__aenter__()

        try:
            self.proto = self._run(open_())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._cm is not None:
            cm, self._cm = self._cm, None
            try:
                self._run(cm.__aexit__(None, None, None))
            except Exception:  # noqa: BLE001 - already closed by the server
                pass
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        if not self.loop.is_running():
            self.loop.close()

    # -- what the tests call ---------------------------------------------------
    def get(self, path: str) -> Stream:
        """Sends a GET on a new request stream; the returned Stream fills in as the answer arrives."""
        return self._call(lambda: self.proto.get(f"{self.host}:{self.port}", path))

    def snapshot(self, stream: Stream) -> Stream:
        """A copy of `stream` as the loop sees it now."""
        return self._call(lambda: Stream(stream.stream_id, stream.status, bytes(stream.body), stream.ended,
                                         stream.reset))

    def goaways(self) -> list[int]:
        """The stream ids of every HTTP/3 GOAWAY the server sent so far."""
        return self._call(lambda: list(self.proto.goaways()))

    def terminated(self) -> ConnectionTerminated | None:
        """The connection's close (CONNECTION_CLOSE or idle timeout), None while it is open."""
        return self._call(lambda: self.proto.terminated)

    def wait(self, cond, timeout: float, what: str):
        """Polls cond() (evaluated outside the loop) until it is truthy, up to `timeout` s."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = cond()
            if got:
                return got
            time.sleep(0.05)
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
