"""A gRPC application for the tests (grpcio, generic handlers: bytes in, bytes out, no codegen),
and the gateway bootstrap change that lets it sit behind the traffic listener.

    Unary   one message in, one back
    Ticks   server streaming: request b"<n> <interval_ms>", n messages back, that far apart
    Echo    bidirectional: every message echoed
"""
from __future__ import annotations

import contextlib
import time
from concurrent import futures

import grpc

SERVICE = "drain_gate.test.Long"
UNARY = f"/{SERVICE}/Unary"
TICKS = f"/{SERVICE}/Ticks"
ECHO = f"/{SERVICE}/Echo"


@contextlib.contextmanager
def grpc_backend():
    """The server on a free loopback port (yields the port); stopped on every exit path."""

    def unary(request: bytes, context):
        return b"ok " + request

    def ticks(request: bytes, context):
        n, ms = (int(x) for x in request.split())
        for i in range(n):
            if not context.is_active():
                return
            yield b"tick %d" % i
            time.sleep(ms / 1000)

    def echo(requests, context):
        for m in requests:
            yield m

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Ticks": grpc.unary_stream_rpc_method_handler(ticks),
        "Echo": grpc.stream_stream_rpc_method_handler(echo),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(0).wait(5)


def h2_backend(doc: dict) -> dict:
    """The bootstrap's backend cluster speaks HTTP/2 (gRPC); everything else as written."""
    for c in doc["static_resources"]["clusters"]:
        if c["name"] == "backend":
            c["typed_extension_protocol_options"] = {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            }
    return doc
