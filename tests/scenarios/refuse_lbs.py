"""Refusing new requests while draining, behind LBs that resend a 503: does the drain converge
under continuous long traffic, and is anything lost?

    client (curl) ─▶ front LB ─┬─▶ gw1 Envoy (drain-gate) ─▶ demo backend
                               └─▶ gw2 Envoy (drain-gate) ─▶

The front LB is one of the shipped recipes, run as written:

    haproxy          envoyfilter/haproxy/haproxy-refuse.cfg (haproxy.cfg + retry-on / redispatch),
                     inter 500ms rise 2 fall 2, on-marked-down shutdown-sessions, retries 3
    haproxy-retries  envoyfilter/haproxy/haproxy.cfg: `retries 3` alone
    envoy            envoyfilter/lb/envoy-front.yaml: retry_policy on 503, previous_hosts; an active
                     check every 500 ms, 2 failures DOWN
    nginx            envoyfilter/lb/nginx-drain-gate.conf (Debian's nginx): proxy_next_upstream ...
                     http_503 non_idempotent; no active check (nginx has none)

`run_once`: a new 2.5 s stream every 0.3 s for 8 s; gw1 is drained at t = 1 s (the preStop call,
POST /drain?wait=closed) with `drain_timeout: 5s`, `lb_buffer: 2s`; when it is CLOSED its
receipt is read and its Envoy stopped (the pod exits: all nginx ever learns of the drain).
`run_round` runs every front LB with both modes, `serve` (the default, the control) and
`refuse` (draining_new_requests), at the same time, each in its own rig of the same shape. Each run: the streams lost (curl: not 200, or fewer chunks), the
resends the front LB logged, and the gateway's own account (/drain/status at CLOSED: cut,
cut_lb, refused, forced, how long DRAINING took).

`probe`: what each LB does with a request gw1 refused, by method and body size, and with a 503
the application itself answered (resent or not, processed how many times).

`tcp_refusal`: behind HAProxy `mode tcp` (haproxy-tcp.cfg), what refusing a new connection
would do — a server that closes, resets or holds each new connection at once, beside the real
gateway.

    PYTHONPATH=. .venv/bin/python -m tests.scenarios.refuse_lbs --runs 5 [--fronts haproxy,envoy,nginx]
    PYTHONPATH=. .venv/bin/python -m tests.scenarios.refuse_lbs --probe
    PYTHONPATH=. .venv/bin/python -m tests.scenarios.refuse_lbs --tcp
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import struct
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.harness.clients import CurlStream
from tests.harness.envoy import free_port, wait_for
from tests.harness.front import EnvoyFront, Nginx, Served
from tests.harness.grpc_app import h2_backend
from tests.harness.haproxy import CFG, CFG_REFUSE, CFG_TCP, HAProxy, h2_cfg
from tests.harness.rig import Backend, Gateway, PreStop
from tests.harness.timeline import parse_time
from tests.harness.wire import recv_until_close

FRONTS = ("haproxy", "haproxy-retries", "envoy", "nginx")
INTER_S = 0.5
LB_BUFFER = "2s"


@dataclass(frozen=True)
class Workload:
    period: float = 0.3  # a new stream every this long
    seconds: float = 2.5  # each stream lasts this long
    duration: float = 8.0  # streams start for this long
    drain_at: float = 1.0  # gw1's preStop call, this long after the first stream
    drain_timeout_s: int = 5
    interval_ms: int = 250  # one chunk every this long

    @property
    def arrivals(self) -> int:
        return int(self.duration / self.period) + 1


RIG = Workload()

# HAProxy's httplog: ... be/srv TR/Tw/Tc/Tr/Ta status bytes - - TERM ac/fc/bc/sc/rc sq/bq "METHOD path ..."
# (rc: retries, "+" when the last one was redispatched to another server).
_HAPROXY_LINE = re.compile(r"\] \S+ [^/\s]+/(?P<srv>\S+) \S+ (?P<status>-?\d+) \S+ \S+ \S+ \S{4} "
                           r"\d+/\d+/\d+/\d+/(?P<rc>\+?\d+) \S+ \"(?P<method>\S+) (?P<path>\S+)")


def haproxy_served(lb: HAProxy) -> list[Served]:
    out = []
    for m in map(_HAPROXY_LINE.search, lb.log().splitlines()):
        if m:
            server = None if m["srv"] == "<NOSRV>" else m["srv"]
            out.append(Served(path=m["path"], method=m["method"], status=int(m["status"]),
                              tries=1 + int(m["rc"].lstrip("+")), server=server, servers=[server] if server else []))
    return out


def gateway_config(mode: str, w: Workload = RIG) -> dict:
    return {"draining_new_requests": mode, "drain_timeout": f"{w.drain_timeout_s}s", "lb_buffer": LB_BUFFER}


class FrontRig:
    """Backend, gw1 and gw2 (the same plugin configuration) and, once `use()` named it, one
    front LB (another `use()` replaces it). A context manager: everything it started is
    stopped on every exit path. `backend_port`: another backend than the demo one (`h2`: it
    speaks HTTP/2, a gRPC server)."""

    def __init__(self, workdir: Path, config: dict, *, inter_s: float = INTER_S, backend_port: int | None = None,
                 h2: bool = False, concurrency: int = 2):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.inter_s = inter_s
        self.backend_port = backend_port
        self.h2 = h2
        self.concurrency = concurrency
        self.stack = contextlib.ExitStack()
        self.gws: list[Gateway] = []
        self.lb = None
        self.front: str | None = None

    def __enter__(self) -> "FrontRig":
        try:
            if self.backend_port is None:
                self.backend = Backend(self.workdir).start()
                self.stack.callback(self.backend.stop)
                self.backend_port = self.backend.port
            for name in ("gw1", "gw2"):
                gw = Gateway(name, self.backend_port, self.config, self.workdir, concurrency=self.concurrency)
                if self.h2:
                    h2_backend(gw.envoy.doc)
                self.stack.callback(gw.stop)
                self.gws.append(gw.start())
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def use(self, front: str, *, envoy_retry: str = "shipped", non_idempotent: bool = True,
            haproxy_cfg: Path | None = None, nginx_next: str | None = None, h2: bool = False) -> "FrontRig":
        """Starts `front` (on fresh ports; the one before is stopped) and waits until it has every
        gateway UP on a real check (nginx checks nothing: until it listens). `haproxy_cfg`: another
        file than the front's own; `h2`: HAProxy speaks HTTP/2 to the gateways (`proto h2`, what
        gRPC needs); `nginx_next`: nginx's `proxy_next_upstream` conditions."""
        if front not in FRONTS:
            raise ValueError(front)
        if self.lb is not None:
            self.lb.stop()
        checked = [(g.name, g.ports.traffic, g.ports.health) for g in self.gws]
        wd = self.workdir / f"{front}-{time.monotonic_ns()}"
        if front.startswith("haproxy"):
            cfg = haproxy_cfg or (CFG_REFUSE if front == "haproxy" else CFG)
            wd.mkdir(parents=True, exist_ok=True)
            lb = HAProxy(wd, [(t, h) for _, t, h in checked], inter=f"{int(self.inter_s * 1000)}ms", tls=False,
                         cfg=h2_cfg(cfg, wd) if h2 else cfg)
        elif front == "envoy":
            lb = EnvoyFront(wd, checked, inter_s=self.inter_s, retry=envoy_retry)
        else:
            lb = Nginx(wd, [(n, t) for n, t, _ in checked], non_idempotent=non_idempotent, next_upstream=nginx_next)
        self.lb, self.front = lb, front
        self.stack.callback(lb.stop)
        lb.start()
        for g in self.gws:
            if isinstance(lb, HAProxy):
                lb.wait_status(g.name, lambda s: s.up and s.check_status == "L7OK", 10 * self.inter_s + 10)
            elif isinstance(lb, EnvoyFront):
                lb.wait_status(g.name, "UP", 10 * self.inter_s + 10)
        return self

    def gw(self, name: str = "gw1") -> Gateway:
        return next(g for g in self.gws if g.name == name)

    def url(self, path: str) -> str:
        return self.lb.http(path) if isinstance(self.lb, HAProxy) else self.lb.url(path)

    @property
    def port(self) -> int:
        """The front LB's HTTP port."""
        return self.lb.http_port if isinstance(self.lb, HAProxy) else self.lb.port

    @property
    def grpc_target(self) -> str:
        """Where a gRPC client dials the front LB (nginx: its gRPC server)."""
        return self.lb.grpc_target if isinstance(self.lb, Nginx) else f"127.0.0.1:{self.port}"

    def served(self) -> list[Served]:
        return haproxy_served(self.lb) if isinstance(self.lb, HAProxy) else self.lb.served()


class PodExit:
    """gw1's pod: when the preStop call returns (CLOSED), its receipt is read and its Envoy
    stopped — what the kubelet's SIGTERM and pilot-agent do next."""

    def __init__(self, gw: Gateway, ps: PreStop, timeout: float):
        self.gw, self.ps = gw, ps
        self.final: dict | None = None
        self.exited: float | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self._thread.start()

    def _run(self, timeout: float) -> None:
        try:
            self.ps.wait(timeout)
            self.final = self.gw.status()
        except Exception as e:  # reported by wait()
            self.error = repr(e)
        finally:
            self.gw.stop()
            self.exited = time.time()

    def wait(self, timeout: float) -> dict:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self.gw.name} did not exit within {timeout}s")
        if self.error or self.final is None:
            raise RuntimeError(f"{self.gw.name}: {self.error}")
        return self.final


def _closing(st: dict) -> tuple[float | None, str | None]:
    """When DRAINING ended (CLOSING began) and why."""
    for t in reversed(st["progress"]["transitions"]):
        if t["to"] == "CLOSING":
            return parse_time(t["at"]), t["reason"]
    return None, None


def run_once(front: str, mode: str, workdir: Path, w: Workload = RIG) -> dict:
    """One drain of gw1 under the workload; the streams' outcome and the gateway's account."""
    streams: list[CurlStream] = []
    with FrontRig(workdir, gateway_config(mode, w)) as rig:
        rig.stack.callback(lambda: [s.kill() for s in streams])  # every exit path: no curl left behind
        rig.use(front)
        gw1 = rig.gw("gw1")
        t0 = time.time()
        ps = pod = None
        for i in range(w.arrivals):
            if ps is None and i * w.period >= w.drain_at:
                time.sleep(max(0.0, t0 + w.drain_at - time.time()))
                ps = PreStop(gw1, via="drain", timeout=w.drain_timeout_s + 60)
                pod = PodExit(gw1, ps, w.drain_timeout_s + 60)
            time.sleep(max(0.0, t0 + i * w.period - time.time()))
            streams.append(CurlStream(rig.url(f"/stream?id=rl{i}"), seconds=w.seconds, interval_ms=w.interval_ms,
                                      label=f"rl{i}", max_time=w.seconds + 30))
        if ps is None:
            raise RuntimeError("the workload ended before the drain")
        deadline = time.monotonic() + w.seconds + 40
        for s in streams:
            s.wait(max(0.1, deadline - time.monotonic()))
        final = pod.wait(w.drain_timeout_s + 60)
        logged = wait_for(lambda: (v := [x for x in rig.served() if "id=rl" in x.path]) and len(v) >= len(streams)
                          and v, 10, 0.1, "the front LB logged every stream")
    served = {m[1]: r for r in logged if (m := re.search(r"id=(rl\d+)&", r.path))}
    started = parse_time(final["progress"]["drain_started_at"])
    closing, reason = _closing(final)
    lost = [s for s in streams if not s.complete]
    receipt = final["receipt"]
    return {
        "front": front,
        "mode": mode,
        "arrivals": len(streams),
        "lost": len(lost),
        "lost_streams": [{"id": s.label, "server": getattr(served.get(s.label), "server", None),
                          "http_code": s.http_code, "exit": s.returncode, "chunks": s.chunks,
                          "start_s": round(s.start_time - t0, 2), "end_s": round((s.end_time or t0) - t0, 2)}
                         for s in lost],
        "on_gw1": sum(1 for r in served.values() if r.server == "gw1"),
        "resent": sum(1 for r in served.values() if r.resent),
        "refused": receipt["refused"],
        "cut": receipt["cut"],
        "cut_lb": receipt["cut_lb"],
        "forced": final["progress"]["forced"],
        "closing_reason": reason,
        "draining_s": round(closing - started, 2) if closing and started else None,
        "drain_timeout_s": w.drain_timeout_s,
        "drain_at_s": round(ps.trigger - t0, 2),
        "exited_s": round(pod.exited - t0, 2),
    }


# One round: every front LB with both modes, and `retries 3` alone with refuse (full rounds).
ROUND = [(f, m) for f in ("haproxy", "envoy", "nginx") for m in ("serve", "refuse")]
RETRIES_ALONE = ("haproxy-retries", "refuse")


def run_round(workdir: Path, runs: list[tuple[str, str]] = ROUND, w: Workload = RIG) -> list[dict]:
    """Every (front, mode) of `runs` at the same time, each in its own rig: the control
    (`serve`) and `refuse` under the same load."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(run_once, front, mode, workdir / f"{front}-{mode}", w) for front, mode in runs]
        return [f.result() for f in futures]


def table(rows: list[dict]) -> str:
    head = ("| front LB | mode | streams lost / started | on gw1 | resent by the LB | gateway: refused "
            "| gateway: cut (cut_lb) | DRAINING s (drain_timeout 5 s) | forced |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['front']} | {r['mode']} | {r['lost']}/{r['arrivals']} | {r['on_gw1']} | {r['resent']} | "
             f"{r['refused']} | {r['cut']} ({r['cut_lb']}) | {r['draining_s']} | {str(r['forced']).lower()} |"
             for r in rows]
    return head + "\n".join(lines) + "\n"


# -- what an LB resends ------------------------------------------------------------------------

# (front, options, label): every LB recipe, and the variants the recipes' comments name.
PROBE_LBS = [
    ("haproxy", {}, "HAProxy, haproxy-refuse.cfg"),
    ("haproxy-retries", {}, "HAProxy, haproxy.cfg (`retries 3` alone)"),
    ("envoy", {"envoy_retry": "shipped"}, "Envoy, envoy-front.yaml (retriable_status_codes 503)"),
    ("envoy", {"envoy_retry": "headers"}, "Envoy, retriable-headers x-drain-gate"),
    ("nginx", {"non_idempotent": True}, "nginx, nginx-drain-gate.conf (http_503 non_idempotent)"),
    ("nginx", {"non_idempotent": False}, "nginx, without non_idempotent"),
]
# What is sent: (method, body bytes).
PROBE_KINDS = [("GET", 0), ("POST", 1024), ("POST", 64 * 1024)]
PROBE_HELD = {"draining_new_requests": "refuse", "min_drain": "60m", "drain_timeout": "60m", "lb_buffer": "60m"}


def _send(url: str, method: str, size: int) -> tuple[int, str]:
    r = requests.request(method, url, data=b"x" * size if size else None, timeout=10,
                         headers={"connection": "close"})
    return r.status_code, r.text.strip()


def _refused_so_far(gw: Gateway) -> int:
    return gw.status()["refusing"]["this_drain"]


def probe_refused(rig: FrontRig, method: str, size: int, tries: int = 4) -> dict:
    """Requests through the front LB until gw1 (DRAINING, refusing) has refused one: what its
    client got. gw1's own counter says which request it refused, whatever the LB logs."""
    gw1 = rig.gw("gw1")
    for n in range(tries):
        before = _refused_so_far(gw1)
        code, body = _send(rig.url(f"/status?code=200&id=probe-{method}-{size}-{n}-{time.monotonic_ns()}"),
                           method, size)
        if _refused_so_far(gw1) > before:
            return {"status": code, "resent": code == 200, "backend": body}
    raise RuntimeError(f"{rig.front}: gw1 refused none of {tries} {method} requests")


def raw_post(port: int, size: int, *, apart: bool) -> int:
    """One POST of `size` bytes on a new connection: its headers and body in one write, or
    (`apart`) the body 50 ms after the headers, as a client that writes them separately. The
    status it got (0: none)."""
    body = b"x" * size
    head = (f"POST /status?code=200&id=raw-{time.monotonic_ns()} HTTP/1.1\r\nHost: probe\r\n"
            f"Connection: close\r\nContent-Length: {size}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if apart:
            s.sendall(head)
            time.sleep(0.05)
            s.sendall(body)
        else:
            s.sendall(head + body)
        answer = recv_until_close(s)
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    return int(m[1]) if m else 0


def refused_raw_posts(rig: FrontRig, size: int, apart: bool, want: int = 3, tries: int = 12) -> list[int]:
    """What the clients of the first `want` raw POSTs gw1 refused got."""
    gw1, got = rig.gw("gw1"), []
    for _ in range(tries):
        before = _refused_so_far(gw1)
        code = raw_post(rig.lb.http_port, size, apart=apart)
        if _refused_so_far(gw1) > before:
            got.append(code)
            if len(got) == want:
                return got
    raise RuntimeError(f"gw1 refused {len(got)} of {tries} POSTs")


def probe_app_503(rig: FrontRig, method: str = "POST", size: int = 1024) -> dict:
    """A 503 the application answers (both gateways OPEN, forwarding): does the LB resend it,
    and how many times did the application process the request?"""
    key = f"app-{rig.front}-{time.monotonic_ns()}"
    code, body = _send(rig.url(f"/status?code=503&id={key}"), method, size)
    m = re.search(r"processed (\d+)", body)
    return {"status": code, "processed": int(m[1]) if m else None}


def probe(workdir: Path) -> list[dict]:
    """Every LB of PROBE_LBS in front of the same two gateways (refuse mode): first the
    application's own 503 to a POST (gw1 OPEN), then, gw1 held DRAINING (min_drain), each kind of
    request it refuses. nginx is started again before each request it is to send to gw1: its
    round robin then begins with gw1, and a 503 takes gw1 out of its rotation (max_fails=1)."""
    rows = {label: {"lb": label} for _, _, label in PROBE_LBS}
    with FrontRig(workdir, PROBE_HELD) as rig:
        for front, opts, label in PROBE_LBS:
            rig.use(front, **opts)
            rows[label]["app_503_post"] = probe_app_503(rig)
        r = rig.gw("gw1").post("/drain")
        assert r.status_code == 200 and r.json()["state"] == "DRAINING", r.text
        wait_for(lambda: rig.gw("gw1").status()["refusing"]["active"], 5, 0.05, "gw1 refusing")
        for front, opts, label in PROBE_LBS:
            for method, size in PROBE_KINDS:
                rig.use(front, **opts)  # fresh: nginx's record of failed servers starts over
                rows[label][f"{method} {size}"] = probe_refused(rig, method, size)
    return list(rows.values())


def probe_table(rows: list[dict]) -> str:
    kinds = [f"{m} {s}" for m, s in PROBE_KINDS]
    names = {"GET 0": "GET", "POST 1024": "POST 1 kB", "POST 65536": "POST 64 kB"}

    def cell(c: dict) -> str:
        return "resent → 200" if c["resent"] else f"not resent: {c['status']} to the client"

    head = ("| LB | " + " | ".join(f"refused {names[k]}" for k in kinds) +
            " | the application's own 503 to a POST |\n|---|" + "---|" * (len(kinds) + 1) + "\n")
    lines = []
    for r in rows:
        app = r["app_503_post"]
        app_cell = (f"resent, processed {app['processed']}×" if app["processed"] and app["processed"] > 1
                    else f"not resent, processed {app['processed']}×")
        lines.append(f"| {r['lb']} | " + " | ".join(cell(r[k]) for k in kinds) + f" | {app_cell} |")
    return head + "\n".join(lines) + "\n"


# -- TCP: what refusing a new connection would do -----------------------------------------------

class Refuser:
    """A TCP server on loopback that "refuses" each new connection at once, as a network filter
    could: `close` (FIN), `reset` (RST) or `hold` (accepted, never read nor answered)."""

    def __init__(self, how: str):
        if how not in ("close", "reset", "hold"):
            raise ValueError(how)
        self.how = how
        self.port = free_port()
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._sock = socket.create_server(("127.0.0.1", self.port), backlog=64)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.accepted += 1
            if self.how == "hold":
                self._held.append(conn)
                continue
            if self.how == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for c in self._held:
            c.close()
        self._sock.close()


def _tcp_request(port: int, timeout: float) -> str:
    """One HTTP/1.1 GET on a new TCP connection through the LB: `served`, `closed` (EOF without
    an answer), `reset` or `timed out` (held)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: tcp\r\nConnection: close\r\n\r\n")
            got = b""
            while True:
                data = s.recv(65536)
                if not data:
                    break
                got += data
    except ConnectionResetError:
        return "reset"
    except socket.timeout:
        return "timed out"
    return "served" if got.startswith(b"HTTP/1.1 200") and got.endswith(b"hello\n") else ("closed" if not got else
                                                                                        "other")


def tcp_refusal(workdir: Path, connections: int = 8, timeout: float = 3.0) -> list[dict]:
    """Behind haproxy-tcp.cfg as written (`mode tcp`, `retries 3`, checks on drain-gate's port):
    gw1 is a Refuser (or, the control, a real gateway), gw2 a real gateway, both checked on the
    real gateway's health port (200: UP). `connections` new connections, one after the other."""
    rows = []
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        backend = Backend(workdir).start()
        stack.callback(backend.stop)
        real = [Gateway(n, backend.port, {"lb_buffer": "60m"}, workdir) for n in ("gw1", "gw2")]
        for g in real:
            stack.callback(g.stop)
            g.start()
        for how in ("close", "reset", "hold", "gateway"):
            refuser = None
            if how != "gateway":
                refuser = Refuser(how)
                stack.callback(refuser.stop)
            first = refuser.port if refuser else real[0].ports.traffic
            lb = HAProxy(workdir / f"tcp-{how}", [(first, real[1].ports.health),
                                                        (real[1].ports.traffic, real[1].ports.health)],
                         inter=f"{int(INTER_S * 1000)}ms", tcp=True)
            stack.callback(lb.stop)
            lb.start()
            for name in ("gw1", "gw2"):
                lb.wait_status(name, lambda s: s.up and s.check_status == "L7OK", 10 * INTER_S + 10)
            outcomes = [_tcp_request(lb.http_port, timeout) for _ in range(connections)]
            lb.stop()
            rows.append({"gw1": how, "connections": connections, "client_timeout_s": timeout,
                         "accepted_by_gw1": refuser.accepted if refuser else None,
                         **{k: outcomes.count(k) for k in ("served", "closed", "reset", "timed out", "other")}})
            if refuser:
                refuser.stop()
    return rows


def tcp_table(rows: list[dict]) -> str:
    head = ("| gw1 answers a new connection by | connections | served | closed, no answer | reset "
            f"| held until the client gave up ({rows[0]['client_timeout_s']:g} s) |\n|---|---|---|---|---|---|\n")
    names = {"close": "closing it (FIN)", "reset": "resetting it (RST)", "hold": "holding it (never answered)",
             "gateway": "serving it (the real gateway, the control)"}
    return head + "\n".join(f"| {names[r['gw1']]} | {r['connections']} | {r['served']} | {r['closed']} | "
                            f"{r['reset']} | {r['timed out']} |" for r in rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--fronts", default="haproxy,envoy,nginx", help="a subset of the round's front LBs")
    ap.add_argument("--probe", action="store_true", help="what each LB resends, instead of the drains")
    ap.add_argument("--tcp", action="store_true", help="behind HAProxy mode tcp: refusing a new connection")
    ap.add_argument("--workdir", help="keep the logs of every process here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="refuse-lbs-") as wd:
        base = Path(args.workdir or wd)
        if args.probe:
            rows = probe(base / "probe")
            print(json.dumps(rows, indent=1))
            print(probe_table(rows))
            return 0
        if args.tcp:
            rows = tcp_refusal(base / "tcp")
            print(json.dumps(rows, indent=1))
            print(tcp_table(rows))
            return 0
        rows = []
        runs = [(f, m) for f, m in ROUND if f in args.fronts.split(",")] + [RETRIES_ALONE]
        for i in range(args.runs):
            for row in run_round(base / f"round-{i}", runs):
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(table(rows))
    # The recipes lose nothing with refuse; serve (the control) and `retries 3` alone lose.
    bad = [r for r in rows if (r["mode"] == "refuse" and r["front"] != "haproxy-retries") == bool(r["lost"])]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
