"""A configuration change made the way the chart makes it cuts nothing: real
Envoy, with file-based LDS and ECDS standing in for istiod.

`helm upgrade --set config.tick=200ms --set config.draining_lb_status=404`
changes every role's configuration. The EnvoyFilters before and after it
(rendered by helm, applied as istiod applies them) give the gateway the same
listeners and three new ECDS resources; istiod pushes both, so the rig writes
the resources, then the listeners once more. A gateway mid-drain carries a
long stream on its HTTP listener, a connection through its TCP server and
the preStop's `POST /drain?wait=closed` held on the health listener. Envoy
runs with --drain-time-s 2 (Istio's drainDuration is 45 s; how long Envoy
keeps a replaced chain's connections).

- As shipped: no listener is modified and no chain drains; the new
  configuration takes effect (the LB check of the draining gateway turns to
  404, the traffic roles of the new configuration register) while the
  stream, the connection and the held call run on past the drain time; the
  count still holds all of them, the drain flips when the last one ends and
  the held call returns at CLOSED.
- The control: the same configuration inline in the filters, as the chart
  had it. The change replaces every chain: Envoy closes the stream, the
  connection and the held call after the drain time, the preStop returns
  with nothing and the pod would go on to SIGTERM with requests in flight.

  PYTHONPATH=. .venv/bin/python -m pytest tests/envoy/test_config_change.py -v -p no:cacheprovider

What each run saw is written to out/config-change/measured.md.
"""
from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest
import requests

from tests.deploy.test_istio_envoy import held_call, lb_check
from tests.harness import istio, k8s
from tests.harness.envoy import REPO, WASM, Envoy, free_port, wait_for
from tests.harness.variants import Lds
from tests.harness.wire import read_head, status

OUT = REPO / "out" / "config-change"
DRAIN_TIME_S = 2
CHANGE = ("--set", "config.tick=200ms", "--set", "config.draining_lb_status=404")
STREAM_S = 7  # outlasts the change (~2 s in) + the drain time + a margin
# A value other than the chart's default for every key of its `config`.
EVERY_KEY = {
    "drain_timeout": "90s", "min_drain": "1s", "lb_buffer": "20s", "tick": "200ms", "draining_lb_status": "404",
    "admin_allow": "{10.0.0.0/8}", "admin_token": "a3f1c2d4e5b60718293a4b5c", "close_after": "lb_observed_down",
    "lb_fall": "3", "lb_down_timeout": "30s", "rotate_connections": "false", "lb_checkers": "{10.0.0.0/8}",
    "soft_drain_gate": "false", "draining_new_requests": "refuse", "refused_requests": "all",
    "draining_grpc_requests": "refuse",
    "refuse_with": "reset", "termination_watch": "false", "scrape_interval": "5s",
}


def chart_envoyfilters(*sets: str) -> list[dict]:
    """The chart's EnvoyFilters, rendered with `sets` (what `helm upgrade --set` applies)."""
    return [o for o in k8s.template("--set", "wasm.configMap.create=false", *sets) if o["kind"] == "EnvoyFilter"]


def istiod(*sets: str) -> istio.Xds:
    base = [istio.gateway_listener(8080), istio.gateway_listener(15443, tcp=True)]
    return istio.gateway_xds(base, chart_envoyfilters(*sets))


def test_a_configuration_change_is_a_new_ecds_resource_and_the_same_listeners():
    """What istiod sends before and after `helm upgrade --set …`: the same
    listeners, each drain-gate filter asking for its configuration by name,
    and three new ECDS resources (every role's configuration changed); the
    same for a change of every configuration key; new listeners for a new
    healthPort or tcp.enabled (envoyfilter/docs/configuration.md, "Changing the
    configuration")."""
    before, after = istiod(), istiod(*CHANGE)
    assert after.listeners == before.listeners
    assert istio.ecds_names(before.listeners) == ["drain-gate", "drain-gate-tcp", "drain-gate-health"]
    names = lambda xds: sorted(e["name"] for e in xds.extensions)  # noqa: E731
    assert names(before) == names(after) == ["drain-gate", "drain-gate-health", "drain-gate-tcp"]
    changed = {b["name"] for b, a in zip(sorted(before.extensions, key=lambda e: e["name"]),
                                         sorted(after.extensions, key=lambda e: e["name"])) if a != b}
    assert changed == {"drain-gate", "drain-gate-tcp", "drain-gate-health"}
    # Every configuration key, all changed at once: still only ECDS. What moves filters does change listeners.
    assert set(EVERY_KEY) == set(istio.load_one(k8s.CHART / "values.yaml")["config"])
    every = istiod(*[a for k, v in EVERY_KEY.items() for a in ("--set", f"config.{k}={v}")])
    assert every.listeners == before.listeners and every.extensions != before.extensions
    for sets in (("--set", "healthPort=18181"), ("--set", "tcp.enabled=false")):
        assert istiod(*sets).listeners != before.listeners, sets
    # The control's form: the configuration inline, so the change is a listener change.
    inline = istio.inline_extensions(before.listeners, before.extensions)
    assert istio.ecds_names(inline) == [] and istio.inline_extensions(after.listeners, after.extensions) != inline


class Gateway:
    """One gateway-like Envoy whose listeners come from a file-based LDS
    source and whose drain-gate filters read their configuration from
    files, as istiod would serve them (`inline`: in the listeners instead)."""

    def __init__(self, workdir, backend_port: int, inline: bool):
        self.inline = inline
        self.at = {8080: free_port(), 15443: free_port(), istio.HEALTH_PORT: free_port()}
        admin = free_port()
        self.ecds_dir = workdir / "ecds"
        doc = istio.gateway_bootstrap(self.xds(), self.at, admin, backend_port, WASM, ecds_dir=self.ecds_dir)
        self.lds = Lds(doc, workdir)
        self.env = Envoy(self.lds.doc, istio.harness_ports(self.at, admin, backend_port), concurrency=2,
                         workdir=workdir, drain_time_s=DRAIN_TIME_S)
        self.env.at = self.at

    def xds(self, *sets: str) -> istio.Xds:
        xds = istiod(*sets)
        return istio.Xds(istio.inline_extensions(xds.listeners, xds.extensions)) if self.inline else xds

    def change(self) -> None:
        """istiod pushing the changed EnvoyFilters: the ECDS resources, then the listeners."""
        new = self.xds(*CHANGE)
        istio.serve_extensions(self.ecds_dir, new.extensions, WASM)
        pushed = istio.gateway_bootstrap(new, self.at, self.env.ports.admin, self.env.ports.backend, WASM,
                                         ecds_dir=self.ecds_dir)["static_resources"]["listeners"]
        assert (pushed == self.lds.listeners) != self.inline, "inline: the listeners change; ECDS: they do not"
        self.lds.push(pushed)

    def stat(self, name: str) -> int:
        return self.env.stat(name) or 0

    def reloads(self) -> dict[str, int]:
        kinds = {"drain-gate": "http_filter", "drain-gate-health": "http_filter", "drain-gate-tcp": "network_filter"}
        return {n: self.stat(f"extension_config_discovery.{k}.{n}.config_reload") for n, k in kinds.items()}


class TcpClient:
    """One connection through the TCP server (tcp_proxy to the HTTP backend),
    kept open; `works()` sends a request on it and reads the answer."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)

    def works(self) -> bool:
        try:
            self.sock.sendall(b"GET / HTTP/1.1\r\nHost: backend\r\n\r\n")
            head, _, body = read_head(self.sock).partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(body) < length:
                chunk = self.sock.recv(length - len(body))
                if not chunk:
                    return False
                body += chunk
            return head.startswith(b"HTTP/1.1 200")
        except (OSError, StopIteration, ValueError):
            return False

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def mid_drain(gw: Gateway, stream):
    """A long stream on the HTTP listener, a connection through the TCP
    server, both counted, then the gateway values' preStop held: DRAINING."""
    s = stream(f"http://127.0.0.1:{gw.at[8080]}/stream?seconds={STREAM_S}&interval_ms=250")
    tcp = TcpClient(gw.at[15443])
    assert tcp.works(), "tcp_proxy carries the bytes"
    wait_for(lambda: status(gw.env)["active"] == 2, 10, what="the stream and the connection counted")
    proxy = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    command = [a.replace(":18180/", f":{gw.at[istio.HEALTH_PORT]}/") for a in proxy["lifecycle"]["preStop"]["exec"]["command"]]
    try:
        with held_call(command) as prestop:
            wait_for(lambda: status(gw.env)["state"] == "DRAINING", 5, what="DRAINING")
            assert lb_check(gw.env)[0] == "HTTP/1.0 200 OK"
            yield s, tcp, prestop
    finally:
        tcp.close()


@pytest.fixture(scope="module")
def measured():
    """Collects one line per run; written to out/config-change/measured.md when the module ends."""
    lines: list[str] = []
    yield lines
    if lines:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "measured.md").write_text(
            f"`PYTHONPATH=. .venv/bin/python -m pytest tests/envoy/test_config_change.py -v`, --drain-time-s "
            f"{DRAIN_TIME_S}, change: `{' '.join(CHANGE)}`\n\n" + "\n".join(lines) + "\n")


@pytest.fixture
def gateway(backend_port, tmp_path, monkeypatch):
    """gateway(version, inline) -> a started Gateway; stopped on every path."""
    with contextlib.ExitStack() as stack:
        def start(version: str, inline: bool) -> Gateway:
            monkeypatch.setenv("ENVOY_BIN", istio.envoy_bin(version))
            gw = Gateway(tmp_path / f"{'inline' if inline else 'ecds'}-{version}", backend_port, inline)
            stack.callback(gw.env.stop)
            gw.env.start(timeout=60)
            return gw
        yield start


@pytest.mark.parametrize("version", istio.ENVOY_MATRIX)
def test_a_configuration_change_cuts_nothing(version, gateway, stream, measured):
    gw = gateway(version, inline=False)
    with mid_drain(gw, stream) as (s, tcp, prestop):
        modified, reloads = gw.stat("listener_manager.listener_modified"), gw.reloads()
        roots = status(gw.env)["traffic"]["roots"]
        gw.change()
        changed = time.monotonic()
        wait_for(lambda: all(v > reloads[n] for n, v in gw.reloads().items()), 10,
                 what="the three new configurations loaded")
        wait_for(lambda: lb_check(gw.env)[0] == "HTTP/1.0 404 Not Found", 5,
                 what="the new health configuration answers the LB (draining_lb_status 404)")
        in_effect = time.monotonic() - changed
        wait_for(lambda: status(gw.env)["traffic"]["roots"] > roots, 5,
                 what="the traffic roles of the new configuration registered")
        # Past the drain time: nothing was replaced, nothing drains, everything runs on.
        while time.monotonic() - changed < DRAIN_TIME_S + 1.5:
            assert s.running() and prestop.poll() is None, "cut by the change"
            time.sleep(0.1)
        assert gw.stat("listener_manager.listener_modified") == modified
        assert gw.stat("listener_manager.total_filter_chains_draining") == 0
        assert tcp.works(), "the TCP connection outlives the drain time"
        tcp_at = time.monotonic() - changed
        st = status(gw.env)
        assert (st["state"], st["active"], st["count"]["reliable"]) == ("DRAINING", 2, True), st
        assert s.wait(STREAM_S + 10) == 0 and s.chunks == STREAM_S * 4, s.err
        assert prestop.poll() is None, "the connection still holds the drain"
        tcp.close()
        wait_for(lambda: status(gw.env)["state"] == "CLOSING", 5, what="the flip at the last one's end")
        assert status(gw.env)["progress"]["reason"] == "active_zero"
        assert prestop.poll() is None, "held until CLOSED"
        assert requests.post(gw.env.health("/close"), timeout=5).status_code == 200
        out, err = prestop.communicate(timeout=10)
        assert prestop.returncode == 0 and json.loads(out)["state"] == "CLOSED", (out, err)
    measured.append(f"- ECDS, Envoy {version}: 0 listeners modified, 0 chains draining; the new health "
                    f"configuration answered the LB {in_effect:.2f} s after the change; the {STREAM_S} s stream "
                    f"completed ({s.chunks} chunks), the TCP connection answered {tcp_at:.1f} s "
                    "after the change, the held preStop returned CLOSED")


def test_the_control_inline_configuration_cuts_all_three_after_the_drain_time(gateway, stream, measured):
    gw = gateway(istio.ENVOY_MATRIX[-1], inline=True)
    with mid_drain(gw, stream) as (s, tcp, prestop):
        modified = gw.stat("listener_manager.listener_modified")
        gw.change()
        changed = time.monotonic()
        wait_for(lambda: gw.stat("listener_manager.listener_modified") == modified + 3, 10,
                 what="every listener replaced")
        wait_for(lambda: prestop.poll() is not None and not s.running(), DRAIN_TIME_S + 5,
                 what="the stream and the held call cut")
        cut = time.monotonic() - changed
        assert DRAIN_TIME_S - 0.5 <= cut, f"cut after {cut:.1f} s, before the drain time"
        assert s.wait(5) != 0 and s.chunks < STREAM_S * 4, "the stream was cut"
        out, _ = prestop.communicate(timeout=5)
        assert prestop.returncode != 0 and '"state"' not in out, "the preStop returned with no answer"
        assert not tcp.works(), "the TCP connection was closed"
    measured.append(f"- inline (control), Envoy {istio.ENVOY_MATRIX[-1]}: 3 listeners modified; the stream "
                    f"({s.chunks} of {STREAM_S * 4} chunks), the held preStop (no answer) and the TCP connection "
                    f"cut {cut:.1f} s after the change")
