"""The scenario rig: demo backend, one or two gateways (real Envoys running
drain-gate from envoyfilter/envoy.yaml), and HAProxy from
envoyfilter/haproxy/*.cfg in front of them, all on loopback.

    client ──▶ HAProxy ──traffic──▶ gw1 Envoy :traffic ──▶ backend
                       ──traffic──▶ gw2 Envoy :traffic ──▶
                       ──check────▶ gwN Envoy :health (drain-gate, /health_check.html)

Everything it starts is stopped when the `with` block ends, on every path.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import requests

from tests.harness import wire
from tests.harness.envoy import REPO, Envoy, Ports, free_port, render
from tests.harness.haproxy import HAProxy
from tests.harness.process import Child, accepts, wait_for
from tests.harness.timeline import GatewayPoller, StatPoller


@dataclass(frozen=True)
class Timing:
    """HAProxy check timing and the drain-gate lb_buffer that covers it."""

    name: str
    inter: str
    inter_s: float
    lb_buffer: str
    fall: int = 2  # as in the reference cfg

    @property
    def detection_window(self) -> float:
        """503 flip -> DOWN takes at most fall x inter (plus a check's duration)."""
        return self.fall * self.inter_s


# `make test`: quick. `make scenarios`: the shipped timings (haproxy.cfg's inter 2s, drain-gate's
# default lb_buffer 10s).
QUICK = Timing("quick", "1s", 1.0, lb_buffer="3s")
SHIPPED = Timing("shipped", "2s", 2.0, lb_buffer="10s")


class Backend(Child):
    """The demo backend (tests/harness/backend.py, with TCP_NODELAY) in its own process."""

    name = "demo backend"

    def __init__(self, workdir: Path):
        super().__init__(workdir / "backend.log")
        self.port = free_port()

    def start(self) -> "Backend":
        self.spawn([sys.executable, "-m", "tests.harness.backend", "--port", str(self.port)], cwd=REPO)
        self.wait_until(lambda: accepts(self.port), 15, "demo backend listening")
        return self


class Gateway:
    """One Envoy running drain-gate on fixed ports, so that it can be stopped and started again.

    `bootstrap(ports, workdir)`: the gateway's bootstrap, instead of envoy.yaml's
    (`render`); it may write the files the bootstrap names into `workdir`."""

    def __init__(self, name: str, backend_port: int, config: dict, workdir: Path, concurrency: int = 2,
                 bootstrap: Callable[[Ports, Path], dict] | None = None):
        self.name = name
        self.ports = Ports(backend=backend_port)
        self.config = config
        doc = bootstrap(self.ports, workdir / name) if bootstrap else render(self.ports, config)
        self.envoy = Envoy(doc, self.ports, concurrency=concurrency, workdir=workdir / name)
        self.poller: GatewayPoller | None = None
        self.session = requests.Session()

    def start(self) -> "Gateway":
        self.envoy.start()
        return self

    def stop(self) -> None:
        self.envoy.stop()

    def url(self, path: str) -> str:
        return self.envoy.health(path)

    def status(self) -> dict:
        return wire.status(self.envoy, self.session)

    def post(self, path: str) -> requests.Response:
        return wire.post(self.envoy, path, self.session)

    def wait_state(self, state: str, timeout: float) -> dict:
        return wait_for(lambda: (s := self.status())["state"] == state and s, timeout, 0.05,
                        f"{self.name} state {state}")

    def receipt(self, at_least: int = 0, timeout: float = 5) -> dict:
        """The gateway's receipt of its current (or last) drain (`/drain/status`), once its
        `cut` has reached `at_least` (what the clients saw cut: a stream's end is counted when
        Envoy has processed the reset), or as it is after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.status()["receipt"]
            if r["cut"] >= at_least or time.monotonic() >= deadline:
                return r
            time.sleep(0.05)


class PreStop:
    """The preStop hook: one held admin call on the gateway's health port, on a thread.

    `via="drain"` sends POST /drain?wait=closed, `via="prestop"` GET /prestop
    (a Kubernetes preStop.httpGet). It returns when the gateway is CLOSED.
    """

    def __init__(self, gw: Gateway, via: str = "drain", timeout: float = 300):
        self.gw = gw
        self.via = via
        self.timeout = timeout
        self.trigger: float | None = None
        self.returned: float | None = None
        self.status_code: int | None = None
        self.body: dict | None = None
        self.error: str | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        wait_for(lambda: self.trigger is not None, 5, 0.01, "preStop call sent")
        # The call is held until CLOSED; what can be seen at once is that the drain began.
        wait_for(lambda: self.returned is not None or gw.status()["state"] != "OPEN", 5, 0.01,
                 f"{gw.name} left OPEN")

    def _run(self) -> None:
        try:
            self.trigger = time.time()
            if self.via == "prestop":
                r = requests.get(self.gw.url("/prestop"), timeout=self.timeout)
            else:
                r = requests.post(self.gw.url("/drain?wait=closed"), timeout=self.timeout)
            self.status_code = r.status_code
            self.body = r.json()
        except Exception as e:  # reported by wait()
            self.error = repr(e)
        finally:
            self.returned = time.time()
            self._done.set()

    def wait(self, timeout: float) -> int:
        if not self._done.wait(timeout):
            raise TimeoutError(f"preStop on {self.gw.name} did not return within {timeout}s")
        if self.error:
            raise RuntimeError(f"preStop on {self.gw.name} failed: {self.error}")
        return self.status_code


def flip_now(gw: Gateway) -> float:
    """The "current" mode of the scenarios through the real filter: 503 at drain start.

    POST /drain then POST /close-lb at once; returns the trigger time.
    """
    trigger = time.time()
    r = gw.post("/drain")
    assert r.status_code == 200, r.text
    r = gw.post("/close-lb")
    assert r.status_code == 200, r.text
    return trigger


class Stacked:
    """A rig of started parts, used as a context manager: `_start` starts each part and puts its stop on
    `self.stack`; a start that fails stops what it started, and every exit stops the rest, last first."""

    stack: contextlib.ExitStack

    def _start(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()


class Rig(Stacked):
    """Backend + gateways + HAProxy + pollers. Use as a context manager."""

    def __init__(self, workdir: Path, *, gateways: int = 1, config: dict | None = None,
                 soft_drain: bool = False, timing: Timing = QUICK, tls: bool = False, tcp: bool = False,
                 haproxy_env: dict[str, str] | None = None, haproxy_cfg: Path | None = None,
                 concurrency: int = 2, bootstraps: list[Callable[[Ports, Path], dict]] | None = None):
        """`bootstraps`: each gateway's bootstrap (see `Gateway`), instead of envoy.yaml's."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.n = gateways
        self.timing = timing
        self.soft_drain = soft_drain
        self.config = {"lb_buffer": timing.lb_buffer, **(config or {})}
        self.tls = tls
        self.tcp = tcp
        self.haproxy_env = haproxy_env
        self.haproxy_cfg = haproxy_cfg
        self.concurrency = concurrency
        self.bootstraps = bootstraps
        self.stack = contextlib.ExitStack()
        self.gws: list[Gateway] = []
        self.haproxy: HAProxy | None = None
        self.stat: StatPoller | None = None

    def _start(self) -> None:
        backend = Backend(self.workdir).start()
        self.stack.callback(backend.stop)
        self.backend = backend
        for i in range(self.n):
            gw = Gateway(f"gw{i + 1}", backend.port, self.config, self.workdir, concurrency=self.concurrency,
                         bootstrap=self.bootstraps[i] if self.bootstraps else None)
            self.stack.callback(gw.stop)
            gw.start()
            self.gws.append(gw)
        self.haproxy = HAProxy(
            self.workdir / "haproxy",
            [(g.ports.traffic, g.ports.health) for g in self.gws],
            soft_drain=self.soft_drain,
            inter=self.timing.inter,
            tls=self.tls,
            tcp=self.tcp,
            env=self.haproxy_env,
            cfg=self.haproxy_cfg,
        )
        self.stack.callback(self.haproxy.stop)
        self.haproxy.start()
        # Every server UP on a real check (L7OK), not just the start-up assumption.
        for g in self.gws:
            self.haproxy.wait_status(g.name, lambda s: s.up and s.check_status == "L7OK",
                                     timeout=5 * self.timing.inter_s + 5)
        self.stat = StatPoller(self.haproxy).start()
        self.stack.callback(self.stat.stop)
        for g in self.gws:
            g.poller = GatewayPoller(g.url("/drain/status")).start()
            self.stack.callback(g.poller.stop)

    # -- convenience -------------------------------------------------------
    def gw(self, name: str = "gw1") -> Gateway:
        return next(g for g in self.gws if g.name == name)

    def url(self, path: str, *, https: bool = False) -> str:
        return self.haproxy.https(path) if https else self.haproxy.http(path)

    def wait_lb(self, name: str, status: str, timeout: float):
        return self.haproxy.wait_status(name, status, timeout)

    def wait_answered(self, n: int, timeout: float) -> Counter:
        """Until every gateway has answered `n` requests with 200 through HAProxy (its log)."""
        def answered():
            served = Counter(r.server for r in self.haproxy.requests() if r.status == 200)
            return all(served[g.name] >= n for g in self.gws) and served

        return wait_for(answered, timeout, 0.1, f"{n} answers from every gateway")
