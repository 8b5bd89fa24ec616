"""The count stays exact under torture: never below what is held, never
wrapped, and exactly 0 when the last stream ends.

Envoy with 4 workers, Envoy's fault filter in front of drain-gate, a route
with an upstream timeout; ≥ 10k streams (≥ 100k with `pytest -m soak`, see
`make soak`) ending in every way a stream can end. K long streams are held
open for the whole run: no poll of /drain/status may show fewer than K, and
none may show a wrapped (huge) value. Afterwards the count is exactly K, then
exactly 0, and that 0 is what flips the drain (reason active_zero).
"""
from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.harness import forms, torture
from tests.harness.envoy import VM_TROUBLE, wait_for
from tests.harness.variants import with_fault_and_timeout
from tests.harness.wire import post, status

pytestmark = pytest.mark.soak  # has a soak form: `pytest -m soak` (`make soak`)
SOAK = forms.SOAK
TOTAL = 100_000 if SOAK else 10_000
HELD = 6
# Far above anything this load can hold in flight, far below a wrapped u64.
SANE_MAX = 5_000
STILL = {"drain_timeout": "60m", "lb_buffer": "60m"}


class Poller(threading.Thread):
    """Polls /drain/status as fast as it can until stopped; keeps every `active`."""

    def __init__(self, gw):
        super().__init__(daemon=True)
        self.gw = gw
        self.seen: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self):
        with requests.Session() as s:
            while not self.stop.is_set():
                try:
                    r = s.get(self.gw.health("/drain/status"), timeout=5)
                    self.seen.append(r.json()["active"])
                except (requests.RequestException, ValueError, KeyError) as e:
                    self.errors.append(repr(e))
                    if len(self.errors) > 20:
                        return
                time.sleep(0.01)


@pytest.mark.parametrize("stats", ["gauge", "reject_all"])
def test_count_is_exact_under_torture(custom_gateway, stats):
    kw = {"stats_matcher": {"reject_all": True}} if stats == "reject_all" else {}
    gw = custom_gateway(STILL, concurrency=4, transform=lambda d, _: with_fault_and_timeout(d), **kw)
    source = "gauge" if stats == "gauge" else "shared_data"
    assert status(gw)["count"] == {"source": source, "reliable": True, "http_streams": 0, "tcp_connections": 0,
                                   "unreliable_reason": None}

    held = torture.HeldStreams(gw.ports.traffic, HELD)
    poller = Poller(gw)
    loads = []
    try:
        wait_for(lambda: status(gw)["active"] == HELD, 10, what="held streams counted")
        poller.start()
        # Bulk: h2load over HTTP/1.1 and HTTP/2 (prior knowledge), every request
        # a candidate for the fault filter's local 503.
        bulk = int(TOTAL * 0.4)
        url = gw.traffic("/")
        common = ["-H", "x-fault-abort: 1", "-t", "1", "-c", "16"]
        loads = [torture.H2Load(["--h1", "-n", str(bulk), *common, url]),
                 torture.H2Load(["-n", str(bulk), "-m", "4", *common, url])]
        mixed = torture.run_mix(gw.ports.traffic, TOTAL - 2 * bulk, rng_seed=6)
        results = [load.result(timeout=900) for load in loads]
        assert held.all_open(), "a held stream ended during the run: the test proves nothing"
        poller.stop.set()
        poller.join(10)
        # Every poll saw at least the streams the client held, and no wrap.
        assert not poller.errors, poller.errors[:3]
        assert len(poller.seen) >= 20, f"only {len(poller.seen)} polls during the load"
        assert min(poller.seen) >= HELD, f"a poll reported {min(poller.seen)} < {HELD} held streams"
        assert max(poller.seen) <= SANE_MAX, f"wrapped or runaway count: {max(poller.seen)}"

        # The load happened, with every kind of ending.
        total = sum(r["done"] for r in results) + sum(mixed.values())
        assert total >= TOTAL, (total, mixed)
        for r in results:
            assert r["done"] == bulk and r["2xx"] > 0, r["out"]
            assert r["5xx"] > 0, "the fault filter answered nothing locally"
        for kind in ["normal", "local_reply", "client_abort_body", "client_abort_response", "upstream_reset",
                     "upstream_timeout", "websocket", "h2_reset_mid_response", "h2_reset_mid_body",
                     "h2_complete", "h2_left_open"]:
            assert mixed[kind] > 0, (kind, mixed)
        unexpected = {k: v for k, v in mixed.items() if "unexpected" in k}
        assert not unexpected, unexpected

        # After the load: exactly the held streams, and it stays so.
        wait_for(lambda: status(gw)["active"] == HELD, 30, what=f"count back to {HELD}")
        for _ in range(10):
            assert status(gw)["active"] == HELD
            time.sleep(0.05)
        # The drain must wait for them, and flip on the exact 0.
        assert post(gw, "/drain").json()["state"] == "DRAINING"
    finally:
        poller.stop.set()
        for load in loads:
            load.kill()
        held.close()
    wait_for(lambda: status(gw)["state"] == "CLOSING", 30, what="flip once the held streams closed")
    st = status(gw)
    assert st["active"] == 0 and st["count"] == {"source": source, "reliable": True, "http_streams": 0,
                                                 "tcp_connections": 0, "unreliable_reason": None}
    assert st["progress"]["reason"] == "active_zero" and st["progress"]["forced"] is False
    for _ in range(10):
        assert status(gw)["active"] == 0, "count moved after reaching 0"
        time.sleep(0.05)
    if stats == "gauge":
        assert gw.stat("wasmcustom.drain_gate_active_requests") == 0
    log = gw.log()
    assert "event=count_error" not in log
    assert not VM_TROUBLE.search(log), VM_TROUBLE.search(log)
