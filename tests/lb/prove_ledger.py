"""prove.py with the ledger (`--ledger`) behind real LBs: one ledger (envoyfilter/tools/ledger.py)
behind every gateway, as envoyfilter/kubernetes/prove-ledger.yaml runs it in staging, routed by
each gateway beside the demo backend (go-httpbin's /drip and /websocket/echo):

    prove.py ─▶ front LB ─┬─▶ gw1 Envoy (drain-gate) ─┬─▶ demo backend   (/drip, /websocket/echo)
                          ├─▶ gw2 Envoy (drain-gate) ─┤
                          └─▶ gw3 (HAProxy's rig)     └─▶ the ledger     (/ledger/<id>, /executions)

`LedgerRig`: the backend, the ledger and N gateways (the same plugin configuration), and one front
LB at a time (`use`): HAProxy from a file of envoyfilter/haproxy/ or tests/lb/controls/ (N server
lines, `on-marked-down shutdown-sessions` on or off: `haproxy_variant`), Envoy
(envoyfilter/lb/envoy-front.yaml) or nginx (envoyfilter/lb/nginx-drain-gate.conf), each file as
written but for the addresses and the check interval. `prove` runs prove.py as an operator does.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.harness.envoy import REPO, render
from tests.harness.front import ENVOY_FRONT, NGINX_CONF, EnvoyFront, Nginx
from tests.harness.haproxy import HAProxy
from tests.harness.ledger import Ledger
from tests.harness.rig import Backend, Gateway, Stacked
from tests.harness.variants import listener, static_cluster

PROVE = REPO / "envoyfilter" / "tools" / "prove.py"
OUT = REPO / "out" / "prove"
INTER_S = 0.5  # every LB's check interval here (HAProxy inter 500ms fall 2; Envoy the same)
SDS = " on-marked-down shutdown-sessions"


def with_ledger(doc: dict, ledger_port: int) -> dict:
    """The gateway's bootstrap with the ledger's paths routed to it, the rest to the backend."""
    vhost = listener(doc, "traffic")["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
        "virtual_hosts"][0]
    vhost["routes"][:0] = [{"match": {"prefix": "/ledger/"}, "route": {"cluster": "ledger", "timeout": "0s"}},
                           {"match": {"path": "/executions"}, "route": {"cluster": "ledger", "timeout": "0s"}}]
    doc["static_resources"]["clusters"].append(static_cluster("ledger", ledger_port))
    return doc


def haproxy_variant(base: Path, workdir: Path, *, servers: int, shutdown_sessions: bool | None = None) -> Path:
    """`base` with a server line for gw3 (a copy of gw2's) when `servers` is 3, and
    `on-marked-down shutdown-sessions` on every gateway server line of the HTTP backend
    (`shutdown_sessions=True`), on none (False), or as written (None)."""
    out, n = [], 0
    for line in base.read_text().splitlines():
        m = re.match(r'^(\s*server gw(\d) "\$\{GW\d_ADDR[^\n]*)$', line)
        if m:
            n += 1
            if shutdown_sessions is not None:
                line = line.replace(SDS, "") + (SDS if shutdown_sessions else "")
            out.append(line)
            if m[2] == "2" and servers == 3:
                out.append(line.replace("GW2_", "GW3_").replace("server gw2", "server gw3"))
            continue
        out.append(line)
    if n != 2:
        raise ValueError(f"{base.name}: {n} gateway server lines, not 2")
    tag = {True: "sds", False: "no-sds", None: "as-written"}[shutdown_sessions]
    path = Path(workdir) / f"{base.stem}-{servers}-{tag}.cfg"
    path.write_text("\n".join(out) + "\n")
    return path


class LedgerRig(Stacked):
    """Backend, ledger, `n` gateways (each routing the ledger's paths to it) and, once `use()`
    named it, one front LB. A context manager: everything it started is stopped on every path."""

    def __init__(self, workdir: Path, config: dict, n: int = 2, inter_s: float = INTER_S):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config, self.n, self.inter_s = config, n, inter_s
        self.stack = contextlib.ExitStack()
        self.gws: list[Gateway] = []
        self.lb = None
        self.starts = 0

    def _start(self) -> None:
        self.backend = Backend(self.workdir).start()
        self.stack.callback(self.backend.stop)
        self.ledger = Ledger(self.workdir).start()
        self.stack.callback(self.ledger.stop)
        for i in range(self.n):
            self.gws.append(self._gateway(f"gw{i + 1}"))

    def _gateway(self, name: str) -> Gateway:
        self.starts += 1
        config = self.config
        gw = Gateway(name, self.backend.port, config, self.workdir / f"start-{self.starts}",
                     bootstrap=lambda ports, _: with_ledger(render(ports, config), self.ledger.port))
        self.stack.callback(gw.stop)
        return gw.start()

    def gw(self, name: str) -> Gateway:
        return next(g for g in self.gws if g.name == name)

    def replace(self, name: str) -> Gateway:
        """The gateway's pod replaced: a fresh Envoy on the same ports (the LB sees it UP again)."""
        gw = self.gw(name)
        gw.stop()
        gw.start()
        if self.lb is not None:
            self.wait_up([gw])
        return gw

    def reconfigure(self, config: dict) -> None:
        """Every gateway replaced by one with `config` (on new ports: `use()` an LB after)."""
        for gw in self.gws:
            gw.stop()
        self.config = config
        self.gws = [self._gateway(g.name) for g in self.gws]

    def fingerprint(self, name: str, *extra: str, kinds: str = "http1,ws", seconds: int = 5) -> Run:
        """prove.py's fingerprint of the LB in use: the control alone on gw1 (then replaced)."""
        url = self.url()
        run = prove("--through", url, "--ledger", url, "--control", "--health", self.gw("gw1").url(""),
                    "--streams", "6", "--kinds", kinds, "--seconds", str(seconds), "--fingerprint", "--json",
                    *extra, name=f"fingerprint-{name}")
        self.replace("gw1")
        return run

    def use(self, front: str, cfg: Path | None = None, shutdown_sessions: bool | None = None) -> "LedgerRig":
        """Starts `front` (the one before stopped) and waits until it has every gateway UP on a
        real check (nginx checks nothing: until it listens). HAProxy: `cfg` (its server lines as
        `haproxy_variant` makes them)."""
        if self.lb is not None:
            self.lb.stop()
        wd = self.workdir / f"{front}-{time.monotonic_ns()}"
        wd.mkdir(parents=True)
        checked = [(g.name, g.ports.traffic, g.ports.health) for g in self.gws]
        if front == "haproxy":
            path = haproxy_variant(cfg, wd, servers=self.n, shutdown_sessions=shutdown_sessions)
            extra = {f"{n.upper()}_{k}": v for n, t, h in checked[2:]
                     for k, v in (("ADDR", f"127.0.0.1:{t}"), ("HEALTH_PORT", str(h)))}
            self.lb = HAProxy(wd, [(t, h) for _, t, h in checked[:2]], inter=f"{int(self.inter_s * 1000)}ms",
                              tls=False, cfg=path, env=extra)
        elif front == "envoy":
            self.lb = EnvoyFront(wd, checked, inter_s=self.inter_s, recipe=ENVOY_FRONT)
        elif front == "nginx":
            self.lb = Nginx(wd, [(n, t) for n, t, _ in checked], recipe=NGINX_CONF)
        else:
            raise ValueError(front)
        self.stack.callback(self.lb.stop)
        self.lb.start()
        self.wait_up()
        return self

    def wait_up(self, gws: list[Gateway] | None = None) -> None:
        for g in gws or self.gws:
            if isinstance(self.lb, HAProxy):
                self.lb.wait_status(g.name, lambda s: s.up and s.check_status == "L7OK", 10 * self.inter_s + 10)
            elif isinstance(self.lb, EnvoyFront):
                self.lb.wait_status(g.name, "UP", 10 * self.inter_s + 10)

    def url(self, path: str = "") -> str:
        return self.lb.http(path) if isinstance(self.lb, HAProxy) else self.lb.url(path)


@dataclass
class Run:
    """One prove.py run: its exit code, its lines (stdout, or stderr with --json) and its JSON."""

    code: int
    out: str
    err: str
    seconds: float

    @property
    def text(self) -> str:
        return self.err if self.json is not None else self.out

    @property
    def json(self) -> dict | None:
        try:
            return json.loads(self.out)
        except ValueError:
            return None

    def line(self, prefix: str) -> str:
        found = [x for x in self.text.splitlines() if x.startswith(prefix)]
        assert len(found) == 1, (prefix, self.text)
        return found[0]

    @property
    def verdict(self) -> str:
        """Its verdict line, which names the exit code (the fingerprint's lines follow it)."""
        found = [x for x in self.text.splitlines() if x.startswith("prove: ") and "(exit " in x]
        return found[-1] if found else ""


def prove(*args: str, name: str | None = None, timeout: float = 150) -> Run:
    """prove.py as an operator runs it: python3 isolated from this venv, curl; its output kept
    in out/prove/`name`.txt."""
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-I", str(PROVE), *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "COLUMNS": "80"})
    run = Run(r.returncode, r.stdout, r.stderr, time.monotonic() - t)
    if name:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.txt").write_text(f"$ prove.py {' '.join(args)}\n{run.out}{run.err}exit {run.code} "
                                         f"({run.seconds:.1f} s)\n")
    return run


# The fingerprint envoyfilter/docs/install.md's commands are checked against, offline
# (tests/deploy/test_install_commands.py): HAProxy's haproxy.cfg with its shipped timings (inter 2s
# fall 2) in front of gateways at drain-gate's defaults but refusing (what the fingerprint needs).
FIXTURE = REPO / "tests" / "fixtures" / "fingerprint" / "haproxy.json"


def main() -> int:
    """Writes FIXTURE from a real run:
        PYTHONPATH=. .venv/bin/python -m tests.lb.prove_ledger"""
    import tempfile

    from tests.harness.haproxy import CFG

    with tempfile.TemporaryDirectory(prefix="fingerprint-") as wd, \
            LedgerRig(Path(wd), {"draining_new_requests": "refuse"}, inter_s=2.0) as rig:
        rig.use("haproxy", CFG)
        run = rig.fingerprint("haproxy-shipped-timings", seconds=10)
    print(run.err, file=sys.stderr)
    if run.code != 0 or run.json is None:
        return 1
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(run.json, indent=1) + "\n")
    print(f"wrote {FIXTURE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
