"""Only the pod's SIGTERM cuts a drain short, in a real Envoy (`termination_watch`, `crate::instruments::termination`).

While a preStop answer is held during a drain, the health role asks pilot-agent's readiness through
the `agent` cluster at every tick. Here pilot-agent is tests/harness/pilot_agent.py (its readiness as
pilot-agent answers it), and the drain holds one stream, `/prestop` held until CLOSED:

- nothing listens on the `agent` cluster's port: Envoy answers the call itself (503, "upstream connect
  error …") — on each Envoy of the Istio matrix;
- pilot-agent answers 503 from before the drain (Envoy not ready as it sees it: a reason other than
  SIGTERM);

neither is a SIGTERM: the drain ends at CLOSED with its normal receipt line, `drain_gate_drains_cut_short`
stays 0, and the watch says once — one warning line, `drain_gate_termination_watch_unavailable` 1 — that
it cannot see the SIGTERM, and why. The control, the same rig: pilot-agent answers 200, then gets its
SIGTERM (503, its listener closed; Envoy's open connection carries the answer) — the drain is cut short,
`ended=SIGTERM`, and the watch asks no more — on each Envoy of the matrix.
"""
from __future__ import annotations

import re
import threading
import time

import pytest
import requests

from tests.harness import istio, variants
from tests.harness.envoy import free_port, wait_for
from tests.harness.pilot_agent import PilotAgent
from tests.harness.wire import status

CUT_SHORT = "wasmcustom.drain_gate_drains_cut_short"
UNAVAILABLE = "wasmcustom.drain_gate_termination_watch_unavailable"
CONFIG = {"termination_watch": "agent", "lb_buffer": "1s"}


def with_agent(port: int):
    """istio-proxy's bootstrap: the `agent` cluster to pilot-agent's status port (connect timeout 250 ms)."""
    def transform(doc: dict, _workdir) -> dict:
        doc["static_resources"]["clusters"].append(variants.static_cluster("agent", port, "0.250s"))
        return doc
    return transform


class Prestop:
    """A kubelet's `preStop: httpGet /prestop`, held by the gateway on a thread."""

    def __init__(self, gw):
        self.response: requests.Response | None = None
        self.error: Exception | None = None
        self._t = threading.Thread(target=self._run, args=(gw,), daemon=True)
        self._t.start()

    def _run(self, gw) -> None:
        try:
            self.response = requests.get(gw.health("/prestop"), timeout=60)
        except requests.RequestException as e:
            self.error = e

    def wait(self, timeout: float) -> requests.Response:
        self._t.join(timeout)
        assert not self._t.is_alive(), f"the preStop still held after {timeout}s"
        assert self.response is not None, self.error
        return self.response


def receipt_lines(gw) -> list[dict]:
    return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            for line in re.findall(r"event=drain_receipt .*", gw.log())]


def unavailable_lines(gw) -> list[str]:
    return re.findall(r"event=termination_watch_unavailable .*", gw.log())


def drain_ends_at_closed(gw, stream) -> None:
    """A drain of one 2 s stream, the preStop held: the normal receipt at CLOSED, nothing cut short."""
    held = stream(gw.traffic("/stream?seconds=2&interval_ms=200"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="the stream counted")
    prestop = Prestop(gw)
    r = prestop.wait(30)
    assert (r.status_code, r.json()["state"]) == (200, "CLOSED"), r.text
    assert held.wait(10) == 0, "the stream completed"
    lines = wait_for(lambda: receipt_lines(gw), 5, what="the receipt line")
    assert [(line["ended"], line["flipped"] != "-", line["closed"] != "-") for line in lines] == \
        [("CLOSED", True, True)], lines
    assert "event=sigterm_before_closed" not in gw.log()
    assert gw.stat(CUT_SHORT) == 0


@pytest.mark.parametrize("version", istio.ENVOY_MATRIX)
def test_nothing_listening_on_the_agent_port_is_no_sigterm(gateway, stream, monkeypatch, version):
    monkeypatch.setenv("ENVOY_BIN", istio.envoy_bin(version))
    closed = free_port()  # nothing listens
    gw = gateway(CONFIG, transform=with_agent(closed))
    drain_ends_at_closed(gw, stream)
    assert gw.stat("cluster.agent.upstream_cx_connect_fail") >= 2, "the watch asked at more than one tick"
    lines = unavailable_lines(gw)
    assert len(lines) == 1 and "cluster=agent reason=local_reply status=503" in lines[0], lines
    assert gw.stat(UNAVAILABLE) == 1


def test_a_pilot_agent_not_ready_before_the_drain_is_no_sigterm(gateway, stream):
    port = free_port()
    with PilotAgent(port, envoy_ready=lambda: False) as agent:  # not ready as pilot-agent sees Envoy
        gw = gateway(CONFIG, transform=with_agent(port))
        assert requests.get(f"http://127.0.0.1:{port}/healthz/ready", timeout=5).status_code == 503, \
            "503 before any drain"
        drain_ends_at_closed(gw, stream)
        assert agent.answers.count(503) >= 3, f"the watch asked at more than one tick: {agent.answers}"
    lines = unavailable_lines(gw)
    assert len(lines) == 1 and "cluster=agent reason=not_ready status=503" in lines[0], lines
    assert gw.stat(UNAVAILABLE) == 1


@pytest.mark.parametrize("version", istio.ENVOY_MATRIX)
def test_pilot_agent_s_sigterm_cuts_the_drain_short(gateway, stream, monkeypatch, version):
    monkeypatch.setenv("ENVOY_BIN", istio.envoy_bin(version))
    port = free_port()
    with PilotAgent(port, envoy_ready=lambda: True) as agent:
        gw = gateway({**CONFIG, "lb_buffer": "60m"}, transform=with_agent(port))
        stream(gw.traffic("/stream?seconds=60&interval_ms=200"))
        wait_for(lambda: status(gw)["active"] == 1, 10, what="the stream counted")
        Prestop(gw)
        wait_for(lambda: agent.answers.count(200) >= 2, 10, what="pilot-agent's 200s to the watch")
        assert receipt_lines(gw) == [] and gw.stat(CUT_SHORT) == 0, "ready: no SIGTERM"
        agent.sigterm()
        lines = wait_for(lambda: receipt_lines(gw), 10, what="the receipt line")
        assert 503 in agent.answers, "answered on the connection Envoy kept, the listener closed"
        asked = len(agent.answers)
        time.sleep(0.5)  # five ticks, the preStop still held
        assert len(agent.answers) == asked, "the SIGTERM seen: nothing more to ask"
    assert [(line["ended"], line["closed"]) for line in lines] == [("SIGTERM", "-")], lines
    assert "event=sigterm_before_closed state=DRAINING" in gw.log()
    assert gw.stat(CUT_SHORT) == 1
    assert unavailable_lines(gw) == [] and gw.stat(UNAVAILABLE) == 0
