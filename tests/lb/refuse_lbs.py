"""Refusing new requests while draining, behind LBs that resend a refusal: does the drain converge
under continuous long traffic, is anything lost, and does anything run twice?

    client (curl) ─▶ front LB ─┬─▶ gw1 Envoy (drain-gate) ─▶ demo backend
                               └─▶ gw2 Envoy (drain-gate) ─▶

The front LB is one of the shipped recipes, run as written:

    haproxy          envoyfilter/haproxy/haproxy-refuse.cfg (haproxy.cfg + retry-on conn-failure 503,
                     redispatch, disable-l7-retry but for idempotent or keyed requests), inter 500ms
                     rise 2 fall 2 (no on-marked-down shutdown-sessions), retries 3
    haproxy-retries  envoyfilter/haproxy/haproxy.cfg: `retries 3` alone
    envoy            envoyfilter/lb/envoy-front.yaml: retry_policy on drain-gate's x-drain-gate
                     header (retriable-headers), connect-failure, refused-stream, previous_hosts; an
                     active check every 500 ms, 2 failures DOWN; the gateways `refused_requests: all`
    nginx            envoyfilter/lb/nginx-drain-gate.conf (Debian's nginx): proxy_next_upstream
                     error timeout (no non_idempotent), max_fails=3; no active check (nginx has
                     none); the gateways `refuse_with: reset`

and, as controls, the recipes before them (tests/lb/controls/: HAProxy and Envoy resent every 503,
nginx every request that failed after it was sent, POST included), behind gateways that refuse
every request (`refused_requests: all`), as those recipes had them.

`run_once`: a new 2.5 s stream every 0.3 s for 8 s; gw1 is drained at t = 1 s (the preStop call,
POST /drain?wait=closed) with `drain_timeout: 5s`, `lb_buffer: 2s`; when it is CLOSED its
receipt is read and its Envoy stopped (the pod exits: all nginx ever learns of the drain).
`run_round` runs every front LB with both modes, `serve` (the default, the control) and
`refuse` (draining_new_requests), at the same time, each in its own rig of the same shape. Each run: the streams lost (curl: not 200, or fewer chunks), the
resends the front LB logged, and the gateway's own account (/drain/status at CLOSED: cut,
cut_lb, refused, forced, how long DRAINING took).

`probe`: what each LB does with a request gw1 refused, by body size, a WebSocket upgrade, a
request on a connection opened before the drain; whether a POST (with and without an
Idempotency-Key) is served, or refused and resent or lost; and a 503 the application itself
answered to a GET and to a POST (resent or not, processed how many times).

`tcp_refusal`: behind HAProxy `mode tcp` (haproxy-tcp.cfg), what refusing a new connection
would do — a server that closes, resets or holds each new connection at once, beside the real
gateway.

    PYTHONPATH=. .venv/bin/python -m tests.lb.refuse_lbs --runs 5 [--fronts haproxy,envoy,nginx]
    PYTHONPATH=. .venv/bin/python -m tests.lb.refuse_lbs --probe
    PYTHONPATH=. .venv/bin/python -m tests.lb.refuse_lbs --tcp
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import re
import socket
import struct
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.harness.clients import CurlStream
from tests.harness.envoy import free_port, wait_for
from tests.harness.front import ENVOY_FRONT, ENVOY_FRONT_CONTROL, NGINX_503, NGINX_CONF, NGINX_CONTROL, EnvoyFront, Nginx, Served
from tests.harness.grpc_app import h2_backend
from tests.harness.haproxy import CFG, CFG_REFUSE, CFG_REFUSE_CONTROL, HAProxy, h2_cfg
from tests.harness.process import stop_on_signals
from tests.harness.rig import Backend, Gateway, PreStop, Stacked
from tests.harness.timeline import parse_time
from tests.harness.wire import h2_exchange, read_head, recv_until_close

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


# How the gateways refuse behind each front LB, as each recipe's file says: nginx's recipe
# resends a reset, not a 503; Envoy's resends drain-gate's refusal alone, of any request.
REFUSE_WITH = {"nginx": "reset"}
REFUSED_REQUESTS = {"envoy": "all"}


def gateway_config(mode: str, w: Workload = RIG, front: str = "haproxy") -> dict:
    config = {"draining_new_requests": mode, "drain_timeout": f"{w.drain_timeout_s}s", "lb_buffer": LB_BUFFER}
    if mode == "refuse" and front in REFUSE_WITH:
        config["refuse_with"] = REFUSE_WITH[front]
    if mode == "refuse" and front in REFUSED_REQUESTS:
        config["refused_requests"] = REFUSED_REQUESTS[front]
    return config


class FrontRig(Stacked):
    """Backend, gw1 and gw2 (the same plugin configuration) and, once `use()` named it, one
    front LB (another `use()` replaces it). A context manager: everything it started is
    stopped on every exit path. `backend_port`: another backend than the demo one (`h2`: it
    speaks HTTP/2, a gRPC server); `backend_ports`: one for each gateway (gw1's, gw2's)."""

    def __init__(self, workdir: Path, config: dict, *, inter_s: float = INTER_S, backend_port: int | None = None,
                 h2: bool = False, concurrency: int = 2, backend_ports: list[int] | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.inter_s = inter_s
        self.backend_port = backend_port
        self.backend_ports = backend_ports
        self.h2 = h2
        self.concurrency = concurrency
        self.stack = contextlib.ExitStack()
        self.gws: list[Gateway] = []
        self.lb = None
        self.front: str | None = None

    def _start(self) -> None:
        if self.backend_port is None and self.backend_ports is None:
            self.backend = Backend(self.workdir).start()
            self.stack.callback(self.backend.stop)
            self.backend_port = self.backend.port
        for name, port in zip(("gw1", "gw2"), self.backend_ports or [self.backend_port] * 2):
            gw = Gateway(name, port, self.config, self.workdir, concurrency=self.concurrency)
            if self.h2:
                h2_backend(gw.envoy.doc)
            self.stack.callback(gw.stop)
            self.gws.append(gw.start())

    def use(self, front: str, **opts) -> "FrontRig":
        """Starts `front` (on fresh ports; the one before is stopped) and waits until it has every
        gateway UP on a real check (nginx checks nothing: until it listens); `opts`: start_lb's."""
        if self.lb is not None:
            self.lb.stop()
        self.lb, self.front = self.start_lb(front, **opts), front
        return self

    def start_lb(self, front: str, *, envoy_retry: str = "shipped", envoy_yaml: Path = ENVOY_FRONT,
                 haproxy_cfg: Path | None = None, nginx_conf: Path = NGINX_CONF, nginx_next: str | None = None,
                 h2: bool = False, recipe: Path | None = None):
        """A front LB of its own, beside any other, stopped with the rig. `haproxy_cfg`,
        `envoy_yaml`, `nginx_conf`: another file than the front's own (a control); `h2`: HAProxy
        speaks HTTP/2 to the gateways (`proto h2`, what gRPC needs); `envoy_retry`: "none" drops
        Envoy's retry_policy; `nginx_next`: nginx's `proxy_next_upstream` conditions; `recipe`: another
        file than the shipped one for whichever front (tests/lb/controls/)."""
        if recipe is not None and front == "envoy":
            envoy_yaml = recipe
        elif recipe is not None and front == "nginx":
            nginx_conf = recipe
        if front not in FRONTS:
            raise ValueError(front)
        checked = [(g.name, g.ports.traffic, g.ports.health) for g in self.gws]
        wd = self.workdir / f"{front}-{time.monotonic_ns()}"
        if front.startswith("haproxy"):
            cfg = haproxy_cfg or recipe or (CFG_REFUSE if front == "haproxy" else CFG)
            wd.mkdir(parents=True, exist_ok=True)
            lb = HAProxy(wd, [(t, h) for _, t, h in checked], inter=f"{int(self.inter_s * 1000)}ms", tls=False,
                         cfg=h2_cfg(cfg, wd) if h2 else cfg)
        elif front == "envoy":
            lb = EnvoyFront(wd, checked, inter_s=self.inter_s, retry=envoy_retry, recipe=envoy_yaml)
        else:
            lb = Nginx(wd, [(n, t) for n, t, _ in checked], recipe=nginx_conf, next_upstream=nginx_next)
        self.stack.callback(lb.stop)
        lb.start()
        for g in self.gws:
            if isinstance(lb, HAProxy):
                lb.wait_status(g.name, lambda s: s.up and s.check_status == "L7OK", 10 * self.inter_s + 10)
            elif isinstance(lb, EnvoyFront):
                lb.wait_status(g.name, "UP", 10 * self.inter_s + 10)
        return lb

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
    with FrontRig(workdir, gateway_config(mode, w, front)) as rig:
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


def rounds(run, n: int, out: Path, table, *args) -> list[dict]:
    """`n` rounds of `run(workdir, *args)` (run_round), their rows written to `out`/results.json and
    results.md (`table`)."""
    rows = []
    for i in range(n):
        rows += run(out / "runs" / f"round-{i}", *args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    (out / "results.md").write_text(table(rows))
    return rows


def table(rows: list[dict]) -> str:
    head = ("| front LB | mode | streams lost / started | on gw1 | resent by the LB | gateway: refused "
            "| gateway: cut (cut_lb) | DRAINING s (drain_timeout 5 s) | forced |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['front']} | {r['mode']} | {r['lost']}/{r['arrivals']} | {r['on_gw1']} | {r['resent']} | "
             f"{r['refused']} | {r['cut']} ({r['cut_lb']}) | {r['draining_s']} | {str(r['forced']).lower()} |"
             for r in rows]
    return head + "\n".join(lines) + "\n"


# -- what an LB resends ------------------------------------------------------------------------

@dataclass
class ProbeLB:
    """One row of the probe: a front LB (`front`, start_lb's `opts`) behind gateways that refuse
    as `refuse_with` and `requests` (`refused_requests`) say. `quick`: in `make test` too;
    `control`: a recipe before (tests/lb/controls/) or `retries 3` alone, not one to use."""

    front: str
    label: str
    refuse_with: str
    requests: str
    opts: dict = field(default_factory=dict)
    quick: bool = True
    control: bool = False


# Every LB recipe as shipped, behind gateways set as its file says; the shipped recipes behind
# gateways that refuse more than they resend; the recipes before, behind gateways that refuse every
# request as those recipes had them (the controls). `make scenarios` adds a few variants.
MORE = "(gateways refusing more than it resends)"
PROBE_LBS = [
    ProbeLB("haproxy", "HAProxy, haproxy-refuse.cfg", "response", "idempotent"),
    ProbeLB("haproxy", "HAProxy, haproxy-refuse.cfg", "response", "idempotent_or_key"),
    ProbeLB("haproxy", "HAProxy, haproxy-refuse.cfg, `proto h2` (gRPC)", "response", "idempotent", {"h2": True}),
    ProbeLB("envoy", "Envoy, envoy-front.yaml", "response", "all"),
    ProbeLB("envoy", "Envoy, envoy-front.yaml", "response", "idempotent", quick=False),
    ProbeLB("nginx", "nginx, nginx-drain-gate.conf", "reset", "idempotent"),
    ProbeLB("haproxy", f"HAProxy, haproxy-refuse.cfg {MORE}", "response", "all"),
    ProbeLB("nginx", f"nginx, nginx-drain-gate.conf {MORE}", "reset", "all"),
    ProbeLB("haproxy", "control: HAProxy, the recipe before (`retry-on conn-failure empty-response 503`)", "response",
            "all", {"haproxy_cfg": CFG_REFUSE_CONTROL}, control=True),
    ProbeLB("haproxy-retries", "control: HAProxy, haproxy.cfg (`retries 3` alone)", "response", "all", control=True),
    ProbeLB("envoy", "control: Envoy, the recipe before (`retriable_status_codes: [503]`)", "response", "all",
            {"envoy_yaml": ENVOY_FRONT_CONTROL}, control=True),
    ProbeLB("nginx", "control: nginx, the recipe before (`error timeout non_idempotent`, `max_fails=1`)", "reset",
            "all", {"nginx_conf": NGINX_CONTROL}, control=True),
    ProbeLB("nginx", "control: nginx, `http_503 non_idempotent`, `max_fails=1` (the recipe before that)", "response",
            "all", {"nginx_conf": NGINX_CONTROL, "nginx_next": NGINX_503}, control=True),
    ProbeLB("haproxy", "control: HAProxy, the recipe before", "reset", "all", {"haproxy_cfg": CFG_REFUSE_CONTROL},
            quick=False, control=True),
]
# What is sent for the columns of refused requests: (method, body bytes). PUT: a body the gateways
# refuse (an idempotent method) behind every recipe.
PROBE_KINDS = [("GET", 0), ("PUT", 1024), ("PUT", 64 * 1024), ("PUT", 900 * 1024), ("PUT", 2 * 1024 * 1024)]
PROBE_HELD = {"draining_new_requests": "refuse", "min_drain": "60m", "drain_timeout": "60m", "lb_buffer": "60m"}
IDEMPOTENCY_KEY = "idempotency-key"


def _send(url: str, method: str, size: int, headers: dict | None = None) -> tuple[int, str]:
    r = requests.request(method, url, data=b"x" * size if size else None, timeout=10,
                         headers={"connection": "close", **(headers or {})})
    return r.status_code, r.text.strip()


def _refused_so_far(gw: Gateway) -> int:
    return gw.status()["refusing"]["this_drain"]


def lb_port(lb) -> int:
    return lb.http_port if isinstance(lb, HAProxy) else lb.port


def lb_url(lb, path: str) -> str:
    return f"http://127.0.0.1:{lb_port(lb)}{path}"


def until_refused(gw1: Gateway, send, tries: int = 4) -> dict:
    """`send()` (→ what its client got) until gw1 has refused one: gw1's own counter says which,
    whatever the LB logs. `reached: False`: gw1 refused none (the LB answered by itself)."""
    got = None
    for _ in range(tries):
        before = _refused_so_far(gw1)
        got = send()
        if _refused_so_far(gw1) > before:
            return {"status": got, "reached": True}
    return {"status": got, "reached": False}


def probe_refused(rig: FrontRig, method: str, size: int, tries: int = 4, lb=None) -> dict:
    """Requests through the front LB (`lb`, else the rig's) until gw1 (DRAINING, refusing) has
    refused one: what its client got."""
    lb = lb or rig.lb

    def send() -> int:
        return _send(lb_url(lb, f"/status?code=200&id=probe-{method}-{size}-{time.monotonic_ns()}"), method, size)[0]

    got = until_refused(rig.gw("gw1"), send, tries)
    return {**got, "resent": got["reached"] and got["status"] == 200}


def ws_upgrade(port: int) -> int:
    """A WebSocket upgrade (RFC 6455 handshake) on a new connection: the status it got (0: none;
    101 only with the server's `Sec-WebSocket-Accept` for this key: the upgrade went through)."""
    key = base64.b64encode(os.urandom(16)).decode()
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /ws?id=ws-{time.monotonic_ns()} HTTP/1.1\r\nHost: probe\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        head = read_head(s)
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", head)
    code = int(m[1]) if m else 0
    got = re.search(rb"(?im)^sec-websocket-accept:\s*(\S+)\r$", head)
    if code == 101 and (not got or got[1] != accept):
        return -101  # a 101 without the handshake: not a WebSocket
    return code


def raw_request(port: int, size: int, *, apart: bool, method: str = "PUT") -> int:
    """One request of `size` bytes of body on a new connection: its headers and body in one write,
    or (`apart`) the body 50 ms after the headers, as a client that writes them separately. The
    status it got (0: none)."""
    body = b"x" * size
    head = (f"{method} /status?code=200&id=raw-{time.monotonic_ns()} HTTP/1.1\r\nHost: probe\r\n"
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


def refused_raw_requests(rig: FrontRig, size: int, apart: bool, want: int = 3, tries: int = 12) -> list[int]:
    """What the clients of the first `want` raw requests (PUT) gw1 refused got."""
    gw1, got = rig.gw("gw1"), []
    for _ in range(tries):
        before = _refused_so_far(gw1)
        code = raw_request(rig.lb.http_port, size, apart=apart)
        if _refused_so_far(gw1) > before:
            got.append(code)
            if len(got) == want:
                return got
    raise RuntimeError(f"gw1 refused {len(got)} of {tries} requests")


def probe_app_503(rig: FrontRig, method: str = "POST", size: int = 1024, lb=None) -> dict:
    """A 503 the application answers (both gateways OPEN, forwarding): does the LB resend it,
    how many times did the application process the request, and which gateways do the next
    requests reach (four of HTTP/1.1 and, but to nginx, four of HTTP/2; nginx: one it counted a
    failure is out)?"""
    lb = lb or rig.lb
    key = f"app-{rig.front}-{time.monotonic_ns()}"
    code, body = _send(lb_url(lb, f"/status?code=503&id={key}"), method, size)
    m = re.search(r"processed (\d+)", body)
    marker = f"after-{time.monotonic_ns()}"
    h2 = not isinstance(lb, Nginx)  # nginx's HTTP port speaks HTTP/1.1 only
    for i in range(4):  # and HTTP/2, for an LB that speaks it to the gateway only for an HTTP/2 client
        requests.get(lb_url(lb, f"/status?code=200&id={marker}-{i}"), timeout=10)
        if h2:
            h2_exchange(lb_port(lb), [(":method", "GET"), (":scheme", "http"), (":authority", "probe"),
                                      (":path", f"/status?code=200&id=h2-{marker}-{i}")])
    served = wait_for(lambda: (v := [x for x in served_by(lb) if marker in x.path]) and len(v) == 4 * (1 + h2) and v,
                      10, 0.1, "the front LB logged every request")
    return {"status": code, "processed": int(m[1]) if m else None, "then": sorted({x.server for x in served})}


def served_by(lb) -> list[Served]:
    return haproxy_served(lb) if isinstance(lb, HAProxy) else lb.served()


def probe_post(rig: FrontRig, lb, headers: dict | None = None, tries: int = 6) -> dict:
    """POSTs (1 kB) through the front LB, gw1 refusing, until one reached gw1 (the LB's log, or
    gw1's own count of refusals): `served` by gw1, or `refused` (resent: its client got the 200,
    else the status it got); `processed`: how often the application ran it."""
    gw1, code, rid = rig.gw("gw1"), None, ""
    for _ in range(tries):
        rid = f"post-{rig.front}-{time.monotonic_ns()}"
        before = _refused_so_far(gw1)
        code, body = _send(lb_url(lb, f"/status?code=200&id={rid}"), "POST", 1024, headers)
        m = re.search(r"processed (\d+)", body)
        processed = int(m[1]) if m else 0
        if _refused_so_far(gw1) > before:
            return {"outcome": "refused", "status": code, "resent": code == 200, "processed": processed}
        logged = wait_for(lambda: [x for x in served_by(lb) if rid in x.path], 10, 0.05, "the front LB logged it")
        if logged[-1].server == "gw1":
            return {"outcome": "served", "status": code, "resent": False, "processed": processed}
    return {"outcome": "never reached gw1", "status": code, "resent": False, "processed": None}


def _fresh(rig: FrontRig, running: list, i: int, row: ProbeLB):
    """nginx started again: its round robin begins anew, its record of failed servers is empty
    (the control's `max_fails=1` takes a gateway out for 10 s after one error)."""
    if row.front == "nginx":
        running[i].stop()
        running[i] = rig.start_lb(row.front, **row.opts)
    return running[i]


def probe_group(workdir: Path, refuse_with: str, refused: str, lbs: list[ProbeLB]) -> list[dict]:
    """Every LB of `lbs` in front of the same two gateways (`refuse_with`, `refused_requests`),
    each its own process for the whole probe: first the application's own 503 to a GET and to a
    POST (gw1 OPEN), then, gw1 held DRAINING (min_drain), each kind of request it refuses, and a
    POST with and without an Idempotency-Key. nginx is started again before each request it is
    to send to gw1: its round robin then begins with gw1."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = [{"lb": lb.label, "refuse_with": refuse_with, "refused_requests": refused, "control": lb.control}
            for lb in lbs]
    with FrontRig(workdir, {**PROBE_HELD, "refuse_with": refuse_with, "refused_requests": refused}) as rig:
        running = [rig.start_lb(lb.front, **lb.opts) for lb in lbs]
        for i, (row, lb) in enumerate(zip(rows, lbs)):
            rig.front = lb.front
            row["app_503_get"] = probe_app_503(rig, "GET", 0, lb=running[i])
            row["app_503_post"] = probe_app_503(rig, lb=_fresh(rig, running, i, lb))
        r = rig.gw("gw1").post("/drain")
        assert r.status_code == 200 and r.json()["state"] == "DRAINING", r.text
        wait_for(lambda: rig.gw("gw1").status()["refusing"]["active"], 5, 0.05, "gw1 refusing")
        time.sleep(0.3)  # a tick: every worker refuses
        for row, front, lb in zip(rows, running, lbs):
            row["existing"] = probe_existing(rig, front, h2=lb.opts.get("h2", False) or lb.front == "envoy")
        for i, (row, lb) in enumerate(zip(rows, lbs)):
            rig.front = lb.front
            for method, size in PROBE_KINDS:
                row[f"{method} {size}"] = probe_refused(rig, method, size, lb=_fresh(rig, running, i, lb))
            code = until_refused(rig.gw("gw1"), lambda f=_fresh(rig, running, i, lb): ws_upgrade(lb_port(f)))
            row["websocket"] = {**code, "resent": code["reached"] and code["status"] == 101}
            row["post"] = probe_post(rig, _fresh(rig, running, i, lb))
            row["post_key"] = probe_post(rig, _fresh(rig, running, i, lb),
                                         {IDEMPOTENCY_KEY: f"key-{time.monotonic_ns()}"})
    return rows


def probe(workdir: Path, full: bool = True) -> list[dict]:
    """probe_group for every way the gateways refuse, two at a time; the rows in PROBE_LBS's
    order (`full`: the variants too)."""
    lbs = [lb for lb in PROBE_LBS if full or lb.quick]
    groups: dict[tuple[str, str], list[ProbeLB]] = {}
    for lb in lbs:
        groups.setdefault((lb.refuse_with, lb.requests), []).append(lb)
    with ThreadPoolExecutor(2) as pool:
        futures = {key: pool.submit(probe_group, Path(workdir) / f"{key[0]}-{key[1]}", *key, group)
                   for key, group in groups.items()}
        done = {key: iter(f.result()) for key, f in futures.items()}
    return [next(done[(lb.refuse_with, lb.requests)]) for lb in lbs]


def probe_existing(rig: FrontRig, lb, *, h2: bool) -> dict:
    """A request gw1 refuses on a connection to it the LB opened before the drain (the probe's
    requests while gw1 was OPEN): HTTP/2 (`h2`: HAProxy with `proto h2`; Envoy for an HTTP/2
    client) or a keep-alive HTTP/1.1 one. What its client got, and how many connections gw1 took
    meanwhile (the drain's rotation sent a GOAWAY on an HTTP/2 one as it began)."""
    gw1 = rig.gw("gw1")
    opened = gw1.envoy.stat("http.traffic.downstream_cx_total")

    def send() -> int:
        path = f"/status?code=200&id=existing-{time.monotonic_ns()}"
        if not h2:
            return requests.get(lb_url(lb, path), timeout=10).status_code
        return h2_exchange(lb_port(lb), [(":method", "GET"), (":scheme", "http"), (":authority", "probe"),
                                         (":path", path)]).status or 0

    got = until_refused(gw1, send)
    return {**got, "resent": got["reached"] and got["status"] == 200, "http2": h2,
            "new_connections": gw1.envoy.stat("http.traffic.downstream_cx_total") - opened}


def probe_table(rows: list[dict]) -> str:
    kinds = [f"{m} {s}" for m, s in PROBE_KINDS] + ["websocket", "existing"]
    names = {"GET 0": "GET", "PUT 1024": "PUT 1 kB", "PUT 65536": "PUT 64 kB", "PUT 921600": "PUT 900 kB",
             "PUT 2097152": "PUT 2 MiB", "websocket": "WebSocket upgrade",
             "existing": "GET on a connection opened before the drain"}

    def cell(c: dict) -> str:
        if not c["reached"]:
            return f"never reached gw1: {c['status']} to the client"
        out = "resent" if c["resent"] else f"not resent: {c['status']} to the client"
        if "http2" in c:
            out += f" ({'HTTP/2' if c['http2'] else 'HTTP/1.1'}, {c['new_connections']} new to gw1)"
        return out

    def post(c: dict) -> str:
        if c["outcome"] == "served":
            return "**served** by gw1"
        if c["outcome"] == "refused":
            return "refused, resent" if c["resent"] else f"refused, **lost**: {c['status']} to the client"
        return f"never reached gw1: {c['status']} to the client"

    def app(c: dict) -> str:
        n = c["processed"]
        return f"resent, **processed {n}×**" if n and n > 1 else f"not resent, processed {n}×"

    columns = ([f"refused {names[k]}" for k in kinds] + ["a POST while refusing",
               "a POST with an Idempotency-Key while refusing", "the application's own 503 to a GET",
               "the application's own 503 to a POST", "then, the next requests reach"])
    head = ("| LB | refuse_with | refused_requests | " + " | ".join(columns) + " |\n|---|---|---|" +
            "---|" * len(columns) + "\n")
    lines = [f"| {r['lb']} | {r['refuse_with']} | {r['refused_requests']} | " + " | ".join(cell(r[k]) for k in kinds) +
             f" | {post(r['post'])} | {post(r['post_key'])} | {app(r['app_503_get'])} | {app(r['app_503_post'])} | "
             f"{', '.join(r['app_503_post']['then'])} |" for r in rows]
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
    stop_on_signals()  # Ctrl-C and SIGTERM stop what the run started, in a background job too
    raise SystemExit(main())
