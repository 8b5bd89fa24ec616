"""One node's NodePorts with `externalTrafficPolicy: Local`, as kube-proxy programs
them since KEP-1669 (ProxyTerminatingEndpoints, GA in Kubernetes 1.28), for the
pods of that node (no kube-proxy runs here: this is its rule, on loopback).

Every port of the node (the LB's traffic port, its check port) hands each new TCP
connection to one of the node's own endpoints for that port:

- a **ready** one (readiness passes, not terminating), round robin, if there is any;
- else a **serving** one that is terminating (readiness still passes): a deleted pod
  keeps the node's traffic while it is the node's only endpoint that serves;
- else none: the connection is closed at once (kube-proxy drops it; the LB sees a
  failed connection either way).

A connection stays with the endpoint it was given for its whole life (conntrack),
whatever becomes of that endpoint. Readiness is polled every `probe_period`
(the kubelet's probe, the EndpointSlice update and kube-proxy's sync, in one);
`terminating` is set by whoever deletes the pod. Every connection is logged:
(time, port, endpoint).
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import requests

from tests.harness.envoy import free_port


@dataclass
class Endpoint:
    """A pod on the node: its port for each node port, and its readiness probe."""

    name: str
    ports: dict[str, int]  # node port name ("traffic", "check") -> the pod's port
    readiness_url: str
    terminating: Callable[[], bool] = lambda: False
    serving: bool = False  # the last readiness probe passed

    @property
    def ready(self) -> bool:
        return self.serving and not self.terminating()


@dataclass
class Connection:
    at: float
    port: str
    endpoint: str | None  # None: no endpoint, dropped


@dataclass
class NodePort:
    names: tuple[str, ...] = ("traffic", "check")
    probe_period: float = 0.5
    endpoints: list[Endpoint] = field(default_factory=list)
    log: list[Connection] = field(default_factory=list)

    def __post_init__(self):
        self.port = {name: free_port() for name in self.names}
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "NodePort":
        for name in self.names:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.port[name]))
            s.listen(128)
            s.settimeout(0.2)
            self._sockets.append(s)
            self._spawn(self._accept, s, name)
        self._spawn(self._probe)
        return self

    def stop(self) -> None:
        self._stop.set()
        for s in self._sockets:
            s.close()
        for t in self._threads:
            t.join(2)

    def add(self, endpoint: Endpoint) -> Endpoint:
        self._probe_one(endpoint)
        with self._lock:
            self.endpoints.append(endpoint)
        return endpoint

    def remove(self, name: str) -> None:
        with self._lock:
            self.endpoints = [e for e in self.endpoints if e.name != name]

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    # -- kube-proxy's choice ------------------------------------------------------------------
    def pick(self) -> Endpoint | None:
        """A ready endpoint (round robin), else a serving terminating one, else none."""
        with self._lock:
            ready = [e for e in self.endpoints if e.ready]
            pool = ready or [e for e in self.endpoints if e.serving and e.terminating()]
            if not pool:
                return None
            self._next += 1
            return pool[self._next % len(pool)]

    def _probe_one(self, e: Endpoint) -> None:
        try:
            e.serving = requests.get(e.readiness_url, timeout=1).status_code == 200
        except requests.RequestException:
            e.serving = False

    def _probe(self) -> None:
        while not self._stop.wait(self.probe_period):
            with self._lock:
                endpoints = list(self.endpoints)
            for e in endpoints:
                self._probe_one(e)

    # -- forwarding ---------------------------------------------------------------------------
    def _accept(self, listener: socket.socket, name: str) -> None:
        while not self._stop.is_set():
            try:
                client, _ = listener.accept()
            except (socket.timeout, OSError):
                continue
            e = self.pick()
            self.log.append(Connection(time.time(), name, e.name if e else None))
            if e is None:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", e.ports[name]), timeout=2)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._spawn(self._pipe, client, upstream)
            self._spawn(self._pipe, upstream, client)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        """Bytes one way until EOF (passed on as a half close) or an error (a reset both ways)."""
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def connections(self, port: str, since: float = 0.0) -> dict[str | None, int]:
        """New connections of `port` since `since`, per endpoint (None: dropped)."""
        out: dict[str | None, int] = {}
        for c in self.log:
            if c.port == port and c.at >= since:
                out[c.endpoint] = out.get(c.endpoint, 0) + 1
        return out
