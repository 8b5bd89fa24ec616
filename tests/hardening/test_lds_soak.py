"""What drain-gate keeps in a process stays flat across listener updates.

Every LDS update of the traffic listener with a changed plugin configuration
creates new traffic root contexts (one per worker, one in the main thread's
VM); the old ones stay while their filter chain drains, then say goodbye.
Here the traffic listener is updated N times through file-based LDS while
streams run across the updates — a new one every few updates, each living
over several of them — and at checkpoints the test reads:

* `footprint.shared_keys` (the shared-data keys drain-gate created: ids are
  reused, so the beat and in-flight keys stay as many as the roots alive at
  once) and `footprint.metric_definitions` (one set per VM, however many root
  contexts it held);
* Envoy's resident memory (VmRSS);
* the age of the oldest stream in flight against the client's own clock: it
  reads long by less than a tick plus the poll, never short.

`make test` runs 60 updates; `make soak` (`pytest -m soak`) runs 200 and
writes its table into tests/docs/envoy.md (tests/harness/figures.py).
"""
from __future__ import annotations

import time

import pytest

from tests.hardening.test_liveness import lds_gateway, with_traffic_config
from tests.harness import figures, forms, torture
from tests.harness.envoy import wait_for
from tests.harness.wire import status

pytestmark = pytest.mark.soak  # has a soak form: `pytest -m soak` (`make soak`)
UPDATES = 200 if forms.SOAK else 60
STREAM_EVERY = 5  # updates between two new streams
UPDATE_EVERY_S = 0.25  # an update at most this often (a busy control plane)
STREAM_S = 4  # each stream lives over several updates
DRAIN_TIME_S = STREAM_S + 2  # how long Envoy keeps a replaced filter chain
WARM = int(DRAIN_TIME_S / UPDATE_EVERY_S) + 16
TICK_MS = 100


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_lds_updates_leave_keys_metrics_memory_and_ages_flat(custom_gateway):
    gw, lds, _ = lds_gateway(custom_gateway, {"lb_buffer": "60m"}, drain_time_s=DRAIN_TIME_S)
    wait_for(lambda: status(gw)["traffic"]["roots"] >= 3, 10, what="traffic roots registered")
    # (requested at, answered at, the stream): the client's bounds on its start.
    streams: list[tuple[float, float, torture.HeldStreams]] = []
    rows, worst_age_error_ms, closed_at = [], 0, 0.0
    try:
        for i in range(1, UPDATES + 1):
            pushed = time.monotonic()
            modified = gw.stat("listener_manager.listener_modified") or 0
            lds.push(with_traffic_config(lds.listeners, lb_buffer=f"{10 + i}s"))
            wait_for(lambda: (gw.stat("listener_manager.listener_modified") or 0) > modified, 10,
                     what=f"update {i} applied")
            if i % STREAM_EVERY == 0:
                asked = time.monotonic()
                held = torture.HeldStreams(gw.ports.traffic, 1)
                streams.append((asked, time.monotonic(), held))
            for entry in list(streams):
                if time.monotonic() - entry[0] > STREAM_S:
                    entry[2].close()
                    streams.remove(entry)
                    closed_at = time.monotonic()
            # A stream enters the summaries at its worker's next tick, and leaves them at the
            # tick after its end: the ages are compared when neither is that recent.
            settled = time.monotonic() - closed_at > 3 * TICK_MS / 1000
            if streams and settled and time.monotonic() - streams[0][1] > 2 * TICK_MS / 1000:
                asked, answered, _ = streams[0]
                before = time.monotonic()
                st = status(gw)
                after = time.monotonic()
                reported = st["in_flight"]["oldest_age_ms"] or 0
                true_low, true_high = (before - answered) * 1000, (after - asked) * 1000
                assert reported >= true_low, f"update {i}: the oldest age read short ({reported} < {true_low})"
                assert reported <= true_high + TICK_MS + 50, f"update {i}: {reported} > {true_high}"
                worst_age_error_ms = max(worst_age_error_ms, reported - true_low)
                assert st["count"]["reliable"] is True, st["count"]
            time.sleep(max(0.0, UPDATE_EVERY_S - (time.monotonic() - pushed)))  # the pace, not a wait
            # Steady from about the drain time on: the old chains leave as fast as new ones come.
            if i >= WARM and (i in (WARM, UPDATES // 2, UPDATES) or i % 50 == 0):
                st = status(gw)
                rows.append((i, st["footprint"]["shared_keys"], st["footprint"]["metric_definitions"],
                             st["traffic"]["roots"], rss_kib(gw.proc.pid)))
    finally:
        for _, _, held in streams:
            held.close()
    table = ["| updates | shared-data keys | metric definitions (a VM) | traffic roots | Envoy RSS |",
             "|---|---|---|---|---|"]
    table += [f"| {i} | {keys} | {defs} | {roots} | {rss / 1024:.1f} MiB |" for i, keys, defs, roots, rss in rows]
    print("\n" + "\n".join(table) + f"\nlargest age error: +{worst_age_error_ms:.0f} ms")
    warm = rows[0]
    for i, keys, defs, _, rss in rows[1:]:
        assert keys <= warm[1] + 6, f"shared-data keys grew from {warm[1]} to {keys} by update {i}"
        assert defs == warm[2], f"metric definitions grew from {warm[2]} to {defs} by update {i}"
        assert rss <= warm[4] + 4 * 1024, f"Envoy's memory grew from {warm[4]} to {rss} KiB by update {i}"
    st = status(gw)
    assert st["traffic"]["lost_total"] == 0 and "event=traffic_role_lost" not in gw.log()
    assert "event=count_unreliable" not in gw.log()
    assert st["footprint"]["metric_definitions"] == warm[2]
    if UPDATES == 200:  # `make soak`: the run the README shows
        figures.write(figures.RELIABILITY, "lds-soak", "\n" + "\n".join(
            [f"  `pytest -m soak` (what `make soak` runs), {time.strftime('%Y-%m-%d')}, commit {figures.commit()}, {gw.concurrency} workers:", ""]
            + [f"  {row}" for row in table]
            + ["", f"  The oldest stream's age read long by at most {worst_age_error_ms:.0f} ms and never short."]) + "\n  ")
