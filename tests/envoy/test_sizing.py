"""Sizing the drain from the traffic itself (envoyfilter/docs/observability.md, "How long are your requests? Sizing `drain_timeout`").

Real Envoy with drain-gate, two workers, the demo backend:
- 20 HTTP streams of 0.25 s and 4 of 2 s: /drain/status `durations.http` counts 24, its p99 and max read
  between 1.8 and 3 s; Envoy's /stats/prometheus shows `drain_gate_stream_duration_ms_count 24` and the
  `le` buckets (20 at or below 1 s, 24 in +Inf); `advice` is built on the longest stream (its `based_on_ms` and the
  figure `based_on` names at least `max_ms`, D = that figure rounded up to a second), and says so.
- A WebSocket held 3 s lands in `upgraded`, not `http`; a TCP connection held 1.5 s in `tcp`.
- Before any stream: "not enough data", no figures.
- The configured drain_timeout is a gauge, and a drain's duration lands in drain_gate_drain_duration_ms once its
  receipt line is logged.
The Prometheus form is read on every Envoy of the matrix (1.36, 1.40): the `le` tag comes from the bootstrap's
`stats_tags` entry (Istio: `extraStatTags: [le]`).
"""
from __future__ import annotations

import importlib.util
import io
import json
import math
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.harness import variants
from tests.harness.envoy import REPO, free_port, wait_for
from tests.harness.istio import envoy_bin
from tests.harness.tcp import Echo, Held
from tests.harness.wire import post, status

SHORT_MS, LONG_MS = 250, 2_000
SIZING_PAGE = REPO / "envoyfilter" / "docs" / "observability.md"
OUT = REPO / "out" / "sizing"


def grace_check(grace_s: int, config: dict) -> bool:
    """Whether `verify.py --pod-spec`'s grace-period check passes a pod of `grace_s` under this configuration
    (its own arithmetic, which the advice must agree with)."""
    spec = importlib.util.spec_from_file_location("verify", REPO / "envoyfilter" / "tools" / "verify.py")
    verify = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verify)
    out = io.StringIO()
    pod = {"kind": "Pod", "metadata": {"name": "gw"}, "spec": {"terminationGracePeriodSeconds": grace_s}}
    verify.check_grace(verify.Report(out), pod, config)
    (line,) = [l for l in out.getvalue().splitlines() if " terminationGracePeriodSeconds:" in l]
    return line.startswith("PASS")


def test_the_advised_grace_period_is_what_verify_py_checks(gateway):
    config = {"scrape_interval": "15s", "lb_buffer": "20s", "close_after": "lb_observed_down",
              "lb_down_timeout": "30s"}
    gw = gateway(config)
    paths = [f"/slow?ms={LONG_MS}"] * 20
    with ThreadPoolExecutor(max_workers=20) as pool:
        assert list(pool.map(lambda p: get(gw, p), paths)) == [200] * 20
    wait_for(lambda: durations(gw)["http"]["count"] == 20, 10, what="20 streams in durations.http")
    advice = status(gw)["advice"]
    assert advice["termination_grace_period_s"] == 120 + 30 + 15 + 15, advice
    advised = {**config, "drain_timeout": f"{advice['drain_timeout_s']}s"}
    assert grace_check(advice["termination_grace_period_s"], advised)
    assert not grace_check(advice["termination_grace_period_s"] - 1, advised)


def prometheus(gw) -> str:
    return requests.get(gw.admin("/stats/prometheus"), timeout=5).text


def sample(text: str, name: str, labels: str = "") -> float | None:
    """The value of one series of Envoy's Prometheus text (`labels`: exactly as printed, e.g. `le="250"`;
    Envoy prints an untagged stat with `{}`)."""
    pattern = rf"^{re.escape(name)}{re.escape('{' + labels + '}')} (\S+)$"
    m = re.search(pattern, text, re.M)
    return float(m[1]) if m else None


def prometheus_when(gw, name: str, value: float, timeout: float = 10) -> str:
    """Envoy's Prometheus text once series `name` (untagged) reads `value`."""
    def seen():
        text = prometheus(gw)
        return text if sample(text, name) == value else None
    return wait_for(seen, timeout, interval=0.2, what=f"{name} at {value}")


def durations(gw) -> dict:
    return status(gw)["durations"]


def get(gw, path: str) -> int:
    return requests.get(gw.traffic(path), timeout=30).status_code


@pytest.mark.parametrize("version", ["1.36.4", "1.40.0"])
def test_stream_durations_quantiles_prometheus_buckets_and_advice(gateway, version, monkeypatch):
    monkeypatch.setenv("ENVOY_BIN", envoy_bin(version))
    gw = gateway({"drain_timeout": "3m", "lb_buffer": "10s"}, concurrency=2)
    st = status(gw)
    assert st["durations"]["http"] == {"count": 0, "p50_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}
    assert st["advice"] == {"drain_timeout_s": None, "termination_grace_period_s": None, "based_on_ms": None,
                            "based_on": "not enough data: 0 HTTP streams measured, 20 needed"}
    assert sample(prometheus(gw), "drain_gate_drain_timeout_seconds") == 180

    paths = [f"/slow?ms={SHORT_MS}"] * 20 + [f"/slow?ms={LONG_MS}"] * 4
    with ThreadPoolExecutor(max_workers=24) as pool:
        assert list(pool.map(lambda p: get(gw, p), paths)) == [200] * 24
    wait_for(lambda: durations(gw)["http"]["count"] == 24, 10, what="24 streams in durations.http")
    st = status(gw)
    http = st["durations"]["http"]
    assert 1_800 <= http["p99_ms"] <= 3_000 and 1_800 <= http["max_ms"] <= 3_000, http
    # A stream is timed on its worker's ticks and bucketed by them rounded up: a 0.25 s one reads 300 or 400 ms, a
    # tick that runs late (a busy machine) shortens or lengthens it by one more.
    assert http["p50_ms"] <= 500, http
    assert st["durations"]["upgraded"]["count"] == 0 and st["durations"]["tcp"]["count"] == 0
    advice = st["advice"]
    OUT.mkdir(parents=True, exist_ok=True)  # what envoyfilter/docs/observability.md shows, from this run
    (OUT / f"status-{version}.json").write_text(json.dumps(
        {"durations": st["durations"], "advice": advice}, indent=2) + "\n")
    # The advice is built on a figure at least the longest stream measured (one that would have cut none),
    # checked on the figure and D, not on drain_timeout_s, which the 120 s floor keeps above these streams anyway.
    figure = int(re.search(r" of 24 HTTP streams: (\d+) ms", advice["based_on"])[1])
    assert figure >= http["max_ms"], (advice, http)
    assert advice["based_on_ms"] == figure, advice
    d_s = math.ceil(advice["based_on_ms"] / 1000)
    assert d_s >= http["max_ms"] / 1000 and advice["drain_timeout_s"] == max(d_s + 30, 120), advice
    assert advice["based_on"] == f"longest of 24 HTTP streams: {http['max_ms']} ms", advice
    assert (advice["drain_timeout_s"], advice["termination_grace_period_s"]) == (120, 145), advice
    advised = {"drain_timeout": f"{advice['drain_timeout_s']}s", "lb_buffer": "10s"}
    assert grace_check(advice["termination_grace_period_s"], advised)
    assert not grace_check(advice["termination_grace_period_s"] - 1, advised)
    # envoyfilter/docs/observability.md's sizing table starts from this measurement: its first row is this advice.
    table = re.search(r"<!-- sizing:.*?-->\n(.*?)<!-- /sizing -->", SIZING_PAGE.read_text(), re.S)[1]
    d, timeout, _, grace = map(int, re.search(r"^\| (\d+) s \| `(\d+)s` \| `(\d+)s` \| (\d+) \|$", table, re.M).groups())
    # Its D is the requests' own length; the advice's D, their measured longest, reads up to a tick (or a late
    # tick) more: the same second or the next.
    assert d == LONG_MS // 1000 <= d_s <= d + 1, (table, advice)
    assert (timeout, grace) == (advice["drain_timeout_s"], advice["termination_grace_period_s"]), table

    text = prometheus_when(gw, "drain_gate_stream_duration_ms_count", 24, 10)
    name = "drain_gate_stream_duration_ms_bucket"
    assert sample(text, name, 'le="500"') == 20, text
    assert sample(text, name, 'le="1000"') == 20
    assert sample(text, name, 'le="5000"') == 24
    assert sample(text, name, 'le="+Inf"') == 24
    assert 20 * SHORT_MS <= sample(text, "drain_gate_stream_duration_ms_sum") <= 20 * 400 + 4 * 2_200
    assert "le___" not in text, "every bucket's bound is a tag"


def test_a_websocket_is_upgraded_not_http(gateway):
    gw = gateway()
    sock = socket.create_connection(("127.0.0.1", gw.ports.traffic), timeout=10)
    try:
        sock.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                     b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 101")
        wait_for(lambda: status(gw)["active"] == 1, 10, what="the websocket counted")
        held = time.monotonic()
        while time.monotonic() - held < 3:
            sock.sendall(b"ping")
            assert sock.recv(4096) == b"ping"
            time.sleep(0.5)
    finally:
        sock.close()
    wait_for(lambda: durations(gw)["upgraded"]["count"] == 1, 10, what="the websocket in durations.upgraded")
    d = durations(gw)
    assert 2_800 <= d["upgraded"]["max_ms"] <= 3_500, d
    assert d["http"]["count"] == 0, d
    text = prometheus_when(gw, "drain_gate_upgraded_duration_ms_count", 1, 10)
    assert sample(text, "drain_gate_upgraded_duration_ms_bucket", 'le="2500"') == 0
    assert sample(text, "drain_gate_upgraded_duration_ms_bucket", 'le="5000"') == 1
    assert sample(text, "drain_gate_stream_duration_ms_count") in (None, 0)


def test_a_drain_s_duration_is_in_its_histogram(gateway, stream):
    gw = gateway({"lb_buffer": "1s"})
    held = stream(gw.traffic("/stream?seconds=2&interval_ms=200"))
    wait_for(lambda: status(gw)["active"] == 1, 10, what="the stream counted")
    assert post(gw, "/drain").status_code == 200
    held.wait(20)
    wait_for(lambda: status(gw)["state"] == "CLOSED", 20, what="CLOSED")
    line = wait_for(lambda: re.search(r"event=drain_receipt .*duration_ms=(\d+)", gw.log()), 10,
                    what="the receipt line")
    took = int(line[1])
    assert 1_000 <= took <= 3_000, line[0]
    text = prometheus_when(gw, "drain_gate_drain_duration_ms_count", 1, 20)
    # An Envoy histogram keeps two significant digits of each value.
    assert sample(text, "drain_gate_drain_duration_ms_sum") == pytest.approx(took, rel=0.05)


def test_a_tcp_connection_lands_in_tcp(gateway, tmp_path):
    echo = Echo(tmp_path).start()
    try:
        port = free_port()
        gw = gateway(transform=lambda doc, _: variants.tcp_listener(doc, port, echo.port))
        with Held(port) as conn:
            assert conn.echoes()
            wait_for(lambda: status(gw)["count"]["tcp_connections"] == 1, 5, what="the connection counted")
            time.sleep(1.5)  # the connection's length: what the test measures
        wait_for(lambda: durations(gw)["tcp"]["count"] == 1, 10, what="the connection in durations.tcp")
        d = durations(gw)
        assert 1_400 <= d["tcp"]["max_ms"] <= 2_500, d
        assert d["http"]["count"] == 0 and d["upgraded"]["count"] == 0, d
        text = prometheus_when(gw, "drain_gate_tcp_duration_ms_count", 1)
        assert sample(text, "drain_gate_tcp_duration_ms_bucket", 'le="1000"') == 0
        assert sample(text, "drain_gate_tcp_duration_ms_bucket", 'le="2500"') == 1
    finally:
        echo.stop()
