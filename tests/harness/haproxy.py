"""Start and stop a real HAProxy from envoyfilter/haproxy/*.cfg, read its state.

The configuration files are used as written: HAProxy itself expands the
"${NAME-default}" placeholders from the environment this module passes
(ports, check interval, certificate, admin socket). HAProxy runs in the
foreground as a child (`haproxy -db -f cfg`), never as the system service.
"""
from __future__ import annotations

import csv
import io
import os
import re
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tests.harness.envoy import REPO, free_port
from tests.harness.process import Child, wait_for
from tests.harness.wire import recv_until_close

CFG_DIR = REPO / "envoyfilter" / "haproxy"
CFG = CFG_DIR / "haproxy.cfg"
CFG_SOFT_DRAIN = CFG_DIR / "haproxy-soft-drain.cfg"
# `mode tcp` (an L4 LB); SOFT_DRAIN=1 in its environment adds disable-on-404.
CFG_TCP = CFG_DIR / "haproxy-tcp.cfg"
# haproxy.cfg plus the lines that resend what a draining gateway refused (`draining_new_requests: refuse`).
CFG_REFUSE = CFG_DIR / "haproxy-refuse.cfg"
# Its control: the recipe before, which resent every 503 and every request whose connection closed
# before an answer (`retry-on conn-failure empty-response 503`), POST included.
CFG_REFUSE_CONTROL = REPO / "tests" / "lb" / "controls" / "haproxy-refuse-resends-503.cfg"
BACKEND = "gateways"
SOCKET_PATH_MAX = 97  # HAProxy 2.6 refuses a longer `stats socket` path


# The HTTP backend's two server lines (gw1, gw2), up to the end of the line.
_HTTP_SERVER_LINE = re.compile(r"^(\s*server gw\d \"\$\{GW\d_ADDR[^\n]*?)\s*$", re.M)


def cuts_at_down(cfg: Path) -> bool:
    """Whether `cfg`'s HTTP server lines carry `on-marked-down shutdown-sessions` (haproxy.cfg's do,
    haproxy-refuse.cfg's do not): its DOWN then cuts every session still on the server."""
    return any("on-marked-down shutdown-sessions" in line for line in _HTTP_SERVER_LINE.findall(cfg.read_text()))


def h2_cfg(base: Path, workdir: Path) -> Path:
    """`base` with `proto h2 check-proto h1` on the gateways' server lines: HAProxy then speaks h2c
    to the gateway, which gRPC needs (its trailers, its bidirectional streams), and keeps its
    health check on HTTP/1 (`proto h2` alone moves the check to h2 too, which times out: L7TOUT)."""
    out, n = _HTTP_SERVER_LINE.subn(r"\1 proto h2 check-proto h1", base.read_text())
    if n != 2:
        raise ValueError(f"{base.name}: the server lines changed")
    path = Path(workdir) / f"{base.stem}-h2.cfg"
    path.write_text(out)
    return path


def shutdown_sessions_cfg(base: Path, workdir: Path) -> Path:
    """`base` (haproxy-refuse.cfg) with `on-marked-down shutdown-sessions` on its HTTP backend's two
    server lines, as haproxy.cfg has them: at its DOWN, HAProxy cuts every session still on the
    server."""
    text = base.read_text()
    lines = _HTTP_SERVER_LINE.findall(text)
    if len(lines) != 2 or any("on-marked-down" in line for line in lines):
        raise ValueError(f"{base.name}: not two HTTP server lines without on-marked-down: {lines}")
    path = Path(workdir) / f"{base.stem}-shutdown-sessions.cfg"
    path.write_text(_HTTP_SERVER_LINE.sub(r"\1 on-marked-down shutdown-sessions", text))
    return path


def make_cert(workdir: Path) -> Path:
    """A self-signed certificate + key in one PEM (made once per `workdir`), as
    `bind ... ssl crt` and socat's `cert=` want it."""
    key, crt, pem = workdir / "tls.key", workdir / "tls.crt", workdir / "tls.pem"
    if pem.exists():
        return pem
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", "/CN=drain-gate.test",
            "-addext", "subjectAltName=DNS:drain-gate.test,IP:127.0.0.1",
            "-keyout", str(key), "-out", str(crt),
        ],
        check=True,
        capture_output=True,
    )
    pem.write_bytes(crt.read_bytes() + key.read_bytes())
    return pem


@dataclass
class Server:
    """One row of `show stat` for a server of the backend."""

    name: str
    status: str  # UP, DOWN, NOLB, MAINT, "UP 1/2", "DOWN 1/2", ...
    check_status: str
    scur: int  # sessions on the server now

    @property
    def down(self) -> bool:
        return self.status == "DOWN" or self.status.startswith("MAINT")

    @property
    def up(self) -> bool:
        return self.status == "UP"


@dataclass
class LogLine:
    """One `option httplog` line."""

    accept: float  # epoch seconds
    end: float  # accept + total time
    server: str
    status: int
    termination: str  # e.g. "----", "SD--", "DD--"
    request: str

    @property
    def killed_by_down(self) -> bool:
        """Cut by `on-marked-down shutdown-sessions` (termination code D)."""
        return self.termination.startswith("D")


# 127.0.0.1:4321 [29/Nov/2026:16:34:09.812] fe be/srv TR/Tw/Tc/Tr/Ta status bytes - - TERM ... "GET / HTTP/1.1"
_HTTPLOG = re.compile(
    r"\[(?P<date>\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\] (?P<fe>\S+) (?P<be>[^/\s]+)/(?P<srv>\S+) "
    r"(?P<timers>\S+) (?P<status>-?\d+) \S+ \S+ \S+ (?P<term>\S{4}) .*?\"(?P<req>[^\"]*)\"?\s*$"
)


# 127.0.0.1:4321 [01/Dec/2026:10:49:27.271] fe be/srv Tw/Tc/Tt bytes TERM ... (`option tcplog`, mode tcp)
_TCPLOG = re.compile(
    r"\[(?P<date>\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\] (?P<fe>\S+) (?P<be>[^/\s]+)/(?P<srv>\S+) "
    r"(?P<timers>-?\d+/-?\d+/\+?-?\d+) \S+ (?P<term>\S{2}) \d+/\d+/\d+/\d+/\d+ \d+/\d+\s*$"
)


@dataclass
class Session:
    """One `option tcplog` line (mode tcp): a connection through HAProxy."""

    accept: float
    end: float  # accept + Tt
    backend: str
    server: str
    termination: str  # "--", "CD", "SD", "D-" (cut by shutdown-sessions) ...

    @property
    def killed_by_down(self) -> bool:
        return self.termination.startswith("D")


def parse_tcp_log_line(line: str) -> Session | None:
    m = _TCPLOG.search(line)
    if not m:
        return None
    accept = datetime.strptime(m["date"], "%d/%b/%Y:%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
    total = int(m["timers"].split("/")[-1].lstrip("+"))
    return Session(accept, accept + max(total, 0) / 1000, m["be"], m["srv"], m["term"])


# Logged once per DOWN transition (the stderr copy starts with "[WARNING]").
_DOWN = re.compile(r"^Server (?P<be>[^/\s]+)/(?P<srv>\S+) is DOWN\b.*?(?P<sessions>\d+) sessions active")
_STATE = re.compile(rf"^Server {BACKEND}/(?P<srv>\S+) is (?P<state>UP|DOWN|stopping)\b")


def parse_log_line(line: str) -> LogLine | None:
    m = _HTTPLOG.search(line)
    if not m:
        return None
    accept = datetime.strptime(m["date"], "%d/%b/%Y:%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
    total = m["timers"].split("/")[-1].lstrip("+")
    try:
        total_ms = int(total)
    except ValueError:
        total_ms = 0
    return LogLine(
        accept=accept,
        end=accept + max(total_ms, 0) / 1000,
        server=m["srv"],
        status=int(m["status"]),
        termination=m["term"],
        request=m["req"],
    )


class HAProxy(Child):
    """One HAProxy process in front of the gateways. Use as a context manager."""

    name = "haproxy"

    def __init__(
        self,
        workdir: Path,
        gateways: list[tuple[int, int]],
        *,
        soft_drain: bool = False,
        inter: str = "2s",
        tls: bool = True,
        tcp: bool = False,
        env: dict[str, str] | None = None,
        master_worker: bool = False,
        cfg: Path | None = None,
    ):
        """`gateways`: (traffic port, health port) of gw1[, gw2] on 127.0.0.1.

        `tcp`: haproxy-tcp.cfg (an L4 LB, no TLS frontend) instead of the HTTP-mode
        files. `env` adds placeholders (the passthrough and kube-apiserver frontends
        exist only when their addresses are given); `master_worker` runs
        HAProxy with a master CLI socket (`-W -S`), which can reload it. `cfg`: another
        file of envoyfilter/haproxy/ (haproxy-refuse.cfg), run as written like the others."""
        if not 1 <= len(gateways) <= 2:
            raise ValueError("the reference configuration has one or two gateways")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg or (CFG_TCP if tcp else CFG_SOFT_DRAIN if soft_drain else CFG)
        tls = tls and not tcp
        self.socket_path = self.workdir / "admin.sock"
        if len(str(self.socket_path)) > SOCKET_PATH_MAX:  # a deep workdir: the socket goes to a short one
            self._socket_dir = tempfile.TemporaryDirectory(prefix="haproxy-")
            self.socket_path = Path(self._socket_dir.name) / "admin.sock"
        self.http_port = free_port()
        self.https_port = free_port() if tls else None
        self.redirect_port = free_port() if tls else None
        self.stats_port = free_port()
        self.passthrough_port = free_port()
        self.apiserver_port = free_port()
        self.master_socket = self.socket_path.parent / "master.sock" if master_worker else None
        self.names = [f"gw{i + 1}" for i in range(len(gateways))]
        base = {
            "HAPROXY_SOCKET": str(self.socket_path),
            "FRONTEND_HTTP": f"127.0.0.1:{self.http_port}",
            "FRONTEND_TCP": f"127.0.0.1:{self.http_port}",
            "CHECK_INTER": inter,
            "STATS_BIND": f"127.0.0.1:{self.stats_port}",
            # Used only when GW1_TLS_ADDR / APISERVER_ADDR turn those frontends on.
            "FRONTEND_PASSTHROUGH": f"127.0.0.1:{self.passthrough_port}",
            "FRONTEND_APISERVER": f"127.0.0.1:{self.apiserver_port}",
        }
        if tcp and soft_drain:
            base["SOFT_DRAIN"] = "1"
        if tls:
            base["TLS_PEM"] = str(make_cert(self.workdir))
            base["FRONTEND_HTTPS"] = f"127.0.0.1:{self.https_port}"
            base["FRONTEND_REDIRECT"] = f"127.0.0.1:{self.redirect_port}"
        for name, (traffic, health) in zip(self.names, gateways):
            base[f"{name.upper()}_ADDR"] = f"127.0.0.1:{traffic}"
            base[f"{name.upper()}_HEALTH_PORT"] = str(health)
        self.env = {**base, **(env or {})}
        super().__init__(self.workdir / "haproxy.log")

    # -- lifecycle -------------------------------------------------------
    def _environ(self) -> dict:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("GW1_", "GW2_", "TLS_PEM", "APISERVER_", "SOFT_DRAIN"))}
        return {**base, **self.env, "TZ": "UTC"}

    def _files(self) -> list[str]:
        """The operator's file as written, then one global line of the rig's own: one thread. The rig
        reads HAProxy's log as its evidence, and a multi-threaded HAProxy drops a `log stdout` line
        when two threads write at once (fd_write_frag_line in src/fd.c gives up after 200 tries:
        seen here as 3 of the 8 sessions cut at one DOWN never logged)."""
        one_thread = self.workdir / "rig-global.cfg"
        one_thread.write_text("# Added by the test rig after the operator's file.\nglobal\n    nbthread 1\n")
        return ["-f", str(self.cfg), "-f", str(one_thread)]

    def check_config(self) -> None:
        r = subprocess.run(["haproxy", "-c", *self._files()], env=self._environ(), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"haproxy -c {self.cfg.name} failed:\n{r.stdout}{r.stderr}")

    def start(self, timeout: float = 20) -> "HAProxy":
        self.check_config()
        master = ["-W", "-S", str(self.master_socket)] if self.master_socket else []
        self.spawn(["haproxy", "-db", *master, *self._files()], env=self._environ())
        self.wait_until(self._answering, timeout, "haproxy admin socket answering")
        return self

    def _answering(self) -> bool:
        try:
            # The master CLI answers only once the workers are up.
            return bool(self.servers()) and (not self.master_socket or bool(self.command("show proc", master=True)))
        except OSError:
            return False

    # -- addresses -------------------------------------------------------
    def http(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def https(self, path: str) -> str:
        return f"https://127.0.0.1:{self.https_port}{path}"

    # -- admin socket ------------------------------------------------------
    def command(self, cmd: str, timeout: float = 2, master: bool = False) -> str:
        """One command on the admin socket (or, `master=True`, the master CLI)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.master_socket if master else self.socket_path))
            s.sendall(cmd.encode() + b"\n")
            if master:  # the master CLI answers once the request side is closed
                s.shutdown(socket.SHUT_WR)
            return recv_until_close(s, limit=1 << 24).decode(errors="replace")

    def servers(self, backend: str = BACKEND) -> dict[str, Server]:
        """`show stat` rows of one backend's servers (default: the gateways), by name."""
        text = self.command("show stat")
        lines = text.splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        rows = csv.DictReader(io.StringIO("\n".join([lines[0][2:], *lines[1:]])))
        out = {}
        for row in rows:
            if row.get("pxname") == backend and row.get("svname") not in ("BACKEND", "FRONTEND", None):
                out[row["svname"]] = Server(
                    name=row["svname"],
                    status=row.get("status", ""),
                    check_status=row.get("check_status", ""),
                    scur=int(row.get("scur") or 0),
                )
        return out

    def wait_status(self, name: str, want, timeout: float, backend: str = BACKEND) -> Server:
        """Polls `show stat` until server `name` satisfies `want` (a status or a predicate)."""
        pred = want if callable(want) else (lambda s: s.status == want)
        last: list[Server | None] = [None]

        def reached() -> Server | None:
            last[0] = self.servers(backend).get(name)
            return last[0] if last[0] and pred(last[0]) else None

        try:
            return wait_for(reached, timeout, 0.05, f"haproxy server {name}: {want}")
        except TimeoutError:
            raise TimeoutError(f"haproxy server {name}: {want} not reached within {timeout}s "
                               f"(last: {last[0]})") from None

    # -- logs --------------------------------------------------------------
    def requests(self) -> list[LogLine]:
        return [r for r in map(parse_log_line, self.log().splitlines()) if r]

    def sessions(self) -> list[Session]:
        """Every connection HAProxy logged in `mode tcp` (`option tcplog`), in log order."""
        return [x for x in map(parse_tcp_log_line, self.log().splitlines()) if x]

    def down_events(self, backend: str = BACKEND) -> list[tuple[str, int]]:
        """(server, sessions it still had) for every "Server <backend>/X is DOWN" message, in order.

        With on-marked-down shutdown-sessions, those sessions are the ones
        HAProxy cut at that instant.
        """
        out = []
        for line in self.log().splitlines():
            m = _DOWN.match(line)
            if m and m["be"] == backend:
                out.append((m["srv"], int(m["sessions"])))
        return out

    def state_events(self, server: str) -> list[str]:
        """Every state change HAProxy logged for `server`, in order: "UP", "DOWN",
        or "stopping" (NOLB: a 404 under `http-check disable-on-404`)."""
        return [m["state"] for m in map(_STATE.match, self.log().splitlines()) if m and m["srv"] == server]

    def server_of(self, marker: str) -> str | None:
        """The server that served the request whose request line contains `marker`."""
        for r in self.requests():
            if marker in r.request:
                return r.server
        return None
