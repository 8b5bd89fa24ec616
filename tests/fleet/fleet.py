"""A gateway fleet behind one HAProxy, and how Kubernetes ends a gateway pod.

    clients ──▶ HAProxy 2.6 (envoyfilter/haproxy/*.cfg, one server line per gateway)
                  ├─ traffic ─▶ old1 … oldN, new1 … newN   Envoy --concurrency 1 ─▶ demo backend
                  └─ check ───▶ each gateway's check port (what the strategy's LB checks)

A Pod is one gateway: a real Envoy from envoyfilter/envoy.yaml (drain-gate in both roles) and
the part of pilot-agent that matters to a drain, emulated here:

- its readiness (`:15021/healthz/ready`, tests/harness/pilot_agent.py): 503 until Envoy admin
  `/ready` first answers 200, then 200, and 503 from SIGTERM on ("server is terminated": the
  agent's context is cancelled), a status line with no body; at SIGTERM its listener closes;
- at SIGTERM: `POST /drain_listeners?graceful` on Envoy admin (a gateway drains every listener,
  not `inboundonly`), then terminationDrainDuration (5 s), then SIGKILL, as pilot-agent's
  `cmd.Process.Kill()`. Envoy runs with `--drain-time-s 45 --drain-strategy immediate`, the
  flags pilot-agent passes (drainDuration 45 s): during those 5 s the listeners still accept
  and every response asks the client to close.

Kubelet (Pod.delete): the strategy's preStop hook to completion or the grace period, then SIGTERM;
SIGKILL at the end of the grace period whatever happens, but never sooner than 2 s after the SIGTERM
(the kubelet's minimum grace, when the preStop took the whole period). Envoy reaches pilot-agent's
readiness through the bootstrap's `agent` cluster, as istio-proxy's does (drain-gate's
`termination_watch`). Just before the SIGKILL the pod reads
the gateway's own account of its drain (`/drain/status` `receipt`: what it cut, what the LB cut,
what it refused), with its `event=drain_receipt` log line as the fallback.
"""
from __future__ import annotations

import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.bench.bench import _sidecar_poller
from tests.harness.envoy import REPO, Envoy, Ports, free_port, render
from tests.harness.haproxy import CFG, CFG_REFUSE, CFG_SOFT_DRAIN, HAProxy
from tests.harness.pilot_agent import PilotAgent
from tests.harness.timeline import parse_time
from tests.harness.variants import static_cluster

TERMINATION_DRAIN_S = 5.0  # Istio's terminationDrainDuration default
ISTIO_DRAIN_DURATION_S = 45  # Istio's drainDuration default: Envoy --drain-time-s
GRACE_S = 150.0  # terminationGracePeriodSeconds of envoyfilter/kubernetes/gateway-values.yaml
MIN_GRACE_S = 2.0  # the kubelet's minimum between SIGTERM and SIGKILL (minimumGracePeriodInSeconds)
DRAIN_TIMEOUT_S = 30  # every strategy that waits for active = 0 gives up after this long
FAIL_WAIT_S = 15.0  # fail-then-wait's fixed drain time (Contour / Envoy Gateway default: 60 s)
DRAIN_SH_LB_BUFFER_S = 10.0  # the sidecar design's drain.sh: its LB_BUFFER


# -- strategies -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Strategy:
    """What the LB checks on each gateway, and what the preStop hook does."""

    name: str
    check: str  # "agent" (pilot-agent readiness), "admin" (Envoy /ready) or "health" (drain-gate)
    prestop: str | None  # None, "fail-then-wait", "drain.sh" or "drain-gate"
    soft_drain: bool = False  # HAProxy `http-check disable-on-404`
    config: dict = field(default_factory=dict)  # drain-gate's plugin configuration
    resend: bool = False  # HAProxy's retry lines of the refuse mode (haproxy-refuse.cfg)
    retries: int | None = None  # HAProxy's `retries`, when not the shipped 3
    shutdown_sessions: bool | None = None  # the server lines' `on-marked-down shutdown-sessions`; None: as the file has it
    cfg: Path | None = None  # another HAProxy file than the shipped one the fields above choose

    @property
    def haproxy_cfg(self) -> Path:
        if self.cfg:
            return self.cfg
        return CFG_REFUSE if self.resend else CFG_SOFT_DRAIN if self.soft_drain else CFG

    @property
    def check_path(self) -> str:
        return {"agent": "/healthz/ready", "admin": "/ready", "health": "/health_check.html"}[self.check]

    @property
    def check_request(self) -> list[str]:
        """HAProxy's check lines. Envoy's admin answers HTTP/1.0 with 426: HTTP/1.1 and a Host."""
        if self.check == "admin":
            return [f"option httpchk GET {self.check_path} HTTP/1.1", "http-check send hdr Host gateway"]
        return [f"option httpchk GET {self.check_path}"]


# The refuse mode's recipe before `refused_requests` (`retry-on conn-failure empty-response 503`, every
# method resent), kept as the tests' control.
CFG_REFUSE_RESENDS_503 = REPO / "tests" / "lb" / "controls" / "haproxy-refuse-resends-503.cfg"

_DG = {"close_after": "lb_observed_down", "lb_fall": 2, "lb_buffer": "1s", "drain_timeout": f"{DRAIN_TIMEOUT_S}s",
       "termination_watch": "agent"}


def strategies(inter_s: float) -> dict[str, Strategy]:
    # The sidecar design's hc container served drain-gate's FSM, moved only from outside (by
    # drain.sh): it never flips by itself.
    hc_fsm = {"min_drain": "60m", "drain_timeout": "60m", "lb_buffer": "60m"}
    soft = {**_DG, "draining_lb_status": 404, "min_drain": f"{int(inter_s) + 1}s"}
    refuse = {**_DG, "draining_new_requests": "refuse", "refused_requests": "idempotent"}
    return {s.name: s for s in (
        Strategy("istio-default", check="agent", prestop=None),
        Strategy("fail-then-wait", check="admin", prestop="fail-then-wait"),
        Strategy("sidecar-design", check="health", prestop="drain.sh", config=hc_fsm),
        Strategy("drain-gate-200", check="health", prestop="drain-gate", config=_DG),
        Strategy("drain-gate-404", check="health", prestop="drain-gate", soft_drain=True, config=soft),
        # Three gateways drain at once in this rollout, and each redispatch avoids only the server
        # HAProxy just tried: 3 retries are not enough (measured, tests/docs/rollout.md), 8 are.
        # Gateways refuse idempotent requests only and serve every POST through the drain;
        # haproxy-refuse.cfg resends a 503 to those only.
        Strategy("drain-gate-200-refuse", check="health", prestop="drain-gate", resend=True, retries=8,
                 config=refuse),
        # The same with haproxy.cfg's `on-marked-down shutdown-sessions` (haproxy-refuse.cfg goes
        # without): its DOWN cuts a POST a gateway serves in CLOSING, and kills a request HAProxy
        # assigned at that instant. Run on request only (OPTIONAL).
        Strategy("drain-gate-200-refuse-shutdown-sessions", check="health", prestop="drain-gate", resend=True,
                 retries=8, shutdown_sessions=True, config=refuse),
        # The control of the duplicates: the recipe before (every 503 resent, whatever the method)
        # and gateways that refuse every request, as that recipe had them.
        Strategy("drain-gate-200-refuse-resends-503", check="health", prestop="drain-gate", resend=True, retries=8,
                 cfg=CFG_REFUSE_RESENDS_503, config={**refuse, "refused_requests": "all"}),
    )}


# Run only when named (`--strategies`): not part of `make rollout`.
OPTIONAL = ("drain-gate-200-refuse-shutdown-sessions",)


# -- HAProxy --------------------------------------------------------------------------------

def render_haproxy_cfg(base: Path, names: list[str], check: list[str], retries: int | None = None,
                       shutdown_sessions: bool | None = None) -> str:
    """The reference configuration with one `server` line per gateway (copied from gw1's, with
    `on-marked-down shutdown-sessions` as the file has it, or added / taken off when
    `shutdown_sessions` is True / False), `option redispatch` after
    `retries 3` (unless the file has its own, as haproxy-refuse.cfg), `retries` set to `retries`
    when given, and the strategy's check request lines."""
    out, skip, seen = [], False, set()
    own_redispatch = any(line.split("#", 1)[0].split()[:2] == ["option", "redispatch"]
                         for line in base.read_text().splitlines())
    for line in base.read_text().splitlines():
        s = line.strip()
        if s.startswith(".if defined(GW2_ADDR)"):
            skip = True
        elif skip:
            skip = s != ".endif"
        elif s.startswith("server gw1 "):
            has = " on-marked-down shutdown-sessions" in line
            if shutdown_sessions is False:
                if not has:
                    raise ValueError(f"{base}: no shutdown-sessions on the server line")
                line = line.replace(" on-marked-down shutdown-sessions", "")
            elif shutdown_sessions and not has:
                line += " on-marked-down shutdown-sessions"
            out += [line.replace("gw1", n).replace("GW1_", f"{n.upper()}_") for n in names]
            seen.add("server")
        elif s == "option httpchk GET /health_check.html":
            out += [line.replace(s, c) for c in check]
            seen.add("httpchk")
        elif s == "retries 3":
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}retries {retries or 3}")
            if not own_redispatch:
                out.append(f"{indent}option redispatch")
            seen.add("retries")
        else:
            out.append(line)
    if seen != {"server", "httpchk", "retries"}:
        raise ValueError(f"{base}: expected lines not found (found {sorted(seen)})")
    return "\n".join(out) + "\n"


class FleetHAProxy(HAProxy):
    """HAProxy in front of a whole fleet: `servers` is [(name, traffic port, check port)]."""

    def __init__(self, workdir: Path, servers: list[tuple[str, int, int]], *, strategy: Strategy, inter: str):
        super().__init__(workdir, [servers[0][1:]], soft_drain=strategy.soft_drain, inter=inter, tls=True)
        self.http_port, self.https_port = free_port(), free_port()
        self.env["FRONTEND_HTTP"] = f"127.0.0.1:{self.http_port}"
        self.env["FRONTEND_HTTPS"] = f"127.0.0.1:{self.https_port}"
        base = strategy.haproxy_cfg
        self.names = [name for name, _, _ in servers]
        self.env = {k: v for k, v in self.env.items() if not k.startswith("GW1_")}
        for name, traffic, check in servers:
            self.env[f"{name.upper()}_ADDR"] = f"127.0.0.1:{traffic}"
            self.env[f"{name.upper()}_HEALTH_PORT"] = str(check)
        self.cfg = self.workdir / "haproxy.cfg"
        self.cfg.write_text(render_haproxy_cfg(base, self.names, strategy.check_request, strategy.retries,
                                               strategy.shutdown_sessions))


# -- the pod ----------------------------------------------------------------------------------

class Pod:
    """One gateway pod: Envoy + the emulated pilot-agent + the kubelet's termination."""

    def __init__(self, name: str, backend_port: int, strategy: Strategy, workdir: Path, grace_s: float = GRACE_S):
        self.name = name
        self.strategy = strategy
        self.grace_s = grace_s
        self.ports = Ports(backend=backend_port)
        self.agent_port = free_port()
        doc = render(self.ports, strategy.config)
        # istio-proxy's cluster to pilot-agent's status port.
        doc["static_resources"]["clusters"].append(static_cluster("agent", self.agent_port, "0.250s"))
        for listener in doc["static_resources"]["listeners"]:
            if listener["name"] == "traffic":
                # What `drain_listeners?inboundonly` drains: the traffic listener only (the sidecar
                # design's drain.sh drains Envoy's listeners while its hc runs in another container).
                listener["traffic_direction"] = "INBOUND"
        self.envoy = Envoy(doc, self.ports, concurrency=1, workdir=workdir / name,
                           drain_time_s=ISTIO_DRAIN_DURATION_S, drain_strategy="immediate")
        self.created_at = self.up_at = self.deleted_at = None
        self.prestop_end = self.sigterm_at = self.exit_at = None
        self.prestop_result: str = ""
        self.flip_at: float | None = None  # when the check the LB reads began to fail
        self.receipt: dict | None = None  # the gateway's own account of its drain, read before it exits
        self.final_status: dict | None = None  # its whole /drain/status then
        self.receipt_at: float | None = None
        self.admin = requests.Session()
        self._agent: PilotAgent | None = None
        self._kubelet: threading.Thread | None = None

    @property
    def check_port(self) -> int:
        return {"agent": self.agent_port, "admin": self.ports.admin,
                "health": self.ports.health}[self.strategy.check]

    def start(self) -> "Pod":
        self.created_at = time.time()
        self.envoy.start()
        self._agent = PilotAgent(self.agent_port, self._envoy_ready).start()
        return self

    def _envoy_ready(self) -> bool:
        """What pilot-agent reads of Envoy until it first is ready."""
        try:
            return requests.get(self.envoy.admin("/ready"), timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        """Cleanup on every exit path (not part of a rollout)."""
        if self._agent:
            self._agent.stop()
            self._agent = None
        self.envoy.stop()

    # -- termination --------------------------------------------------------------------
    def delete(self) -> None:
        """What the API server's delete sets off: the kubelet's termination, on a thread."""
        self.deleted_at = time.time()
        self._kubelet = threading.Thread(target=self._terminate, daemon=True)
        self._kubelet.start()

    def wait_exit(self, timeout: float) -> None:
        if self._kubelet:
            self._kubelet.join(timeout)
            if self._kubelet.is_alive():
                raise TimeoutError(f"{self.name} still terminating after {timeout}s")

    def _terminate(self) -> None:
        deadline = self.deleted_at + self.grace_s
        if self.strategy.prestop:
            hook = threading.Thread(target=self._run_prestop, daemon=True)
            hook.start()
            hook.join(self.grace_s)
            self.prestop_end = time.time()
        self.sigterm_at = time.time()
        if self._agent:
            self._agent.sigterm()
        if self.strategy.check == "agent":
            self.flip_at = self.sigterm_at
        try:
            self.admin.post(self.envoy.admin("/drain_listeners?graceful"), timeout=5)
        except requests.RequestException:
            pass
        kill_at = min(self.sigterm_at + TERMINATION_DRAIN_S, max(deadline, self.sigterm_at + MIN_GRACE_S))
        time.sleep(max(0.0, kill_at - time.time()))
        self._kill()

    def _kill(self) -> None:
        proc = self.envoy.proc
        if proc and proc.poll() is None:
            self.receipt_at = time.time()
            self.receipt = self._read_receipt()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self.exit_at = time.time()
        if self._agent:
            self._agent.stop()
            self._agent = None

    def _read_receipt(self) -> dict | None:
        """The drain's receipt from `/drain/status` (`drain_started_at` null: no drain ran), else
        from the `event=drain_receipt` line the gateway logged when the drain ended."""
        try:
            self.final_status = requests.get(self.envoy.health("/drain/status"), timeout=2).json()
            return self.final_status["receipt"]
        except (requests.RequestException, ValueError, KeyError):
            pass
        lines = re.findall(r"event=drain_receipt .*", self.envoy.log())
        if not lines:
            return None
        fields = dict(kv.split("=", 1) for kv in lines[-1].split() if "=" in kv)
        return {"drain_started_at": fields["started"],
                **{k: int(fields[k]) for k in ("cut", "cut_http", "cut_tcp", "cut_lb", "cut_other", "completed",
                                               "ended_upstream", "refused")}}

    def _run_prestop(self) -> None:
        try:
            self.prestop_result = PRESTOP[self.strategy.prestop](self)
        except Exception as e:  # the hook failed: kubelet goes on to SIGTERM
            self.prestop_result = f"error: {e!r}"

    @property
    def drain_s(self) -> float | None:
        """Deletion (preStop start) to exit."""
        return round(self.exit_at - self.deleted_at, 3) if self.exit_at and self.deleted_at else None

    def summary(self) -> dict:
        keys = ("created_at", "up_at", "deleted_at", "flip_at", "prestop_end", "sigterm_at", "receipt_at", "exit_at")
        return {"name": self.name, **{k: getattr(self, k) for k in keys},
                "drain_s": self.drain_s, "prestop_result": self.prestop_result, "receipt": self.receipt}


# -- preStop hooks ----------------------------------------------------------------------------

def _fail_then_wait(pod: Pod) -> str:
    """Contour / Envoy Gateway shutdown-manager style: fail Envoy's health check, wait a fixed time."""
    pod.flip_at = time.time()
    pod.admin.post(pod.envoy.admin("/healthcheck/fail"), timeout=5).raise_for_status()
    time.sleep(FAIL_WAIT_S)
    return f"waited {FAIL_WAIT_S:g}s"


def _drain_sh(pod: Pod) -> str:
    """The sidecar design's drain.sh: /drain, Envoy drain_listeners, poll admin /stats every 2 s until
    active = 0 (at most DRAIN_TIMEOUT_S), /close-lb, sleep LB_BUFFER, /close."""
    health = requests.Session()
    health.post(pod.envoy.health("/drain"), timeout=5).raise_for_status()
    pod.admin.post(pod.envoy.admin("/drain_listeners?inboundonly&graceful&skip_exit"), timeout=5)
    stop = threading.Event()
    poller = threading.Thread(target=_sidecar_poller, args=(pod.admin, pod.envoy, stop), daemon=True)
    poller.start()
    poller.join(DRAIN_TIMEOUT_S)
    forced = poller.is_alive()
    if forced:
        stop.set()
        poller.join(5)
        health.post(pod.envoy.health("/close-lb"), timeout=5).raise_for_status()
    pod.flip_at = parse_time(health.get(pod.envoy.health("/drain/status"), timeout=5).json()["progress"]["closing_at"])
    time.sleep(DRAIN_SH_LB_BUFFER_S)
    health.post(pod.envoy.health("/close"), timeout=5).raise_for_status()
    return "timeout" if forced else "active_zero"


def _drain_gate(pod: Pod) -> str:
    """drain-gate's preStop: one held call, answered at CLOSED."""
    r = requests.post(pod.envoy.health("/drain?wait=closed"), timeout=pod.grace_s + 60)
    body = r.json()
    pod.flip_at = parse_time(body.get("progress", {}).get("closing_at"))
    reason = next((t["reason"] for t in reversed(body.get("progress", {}).get("transitions", []))
                   if t["to"] == "CLOSING"), "")
    return f"{r.status_code} {body.get('state')} {reason}".strip()


PRESTOP = {"fail-then-wait": _fail_then_wait, "drain.sh": _drain_sh, "drain-gate": _drain_gate}
