"""`/drain/status` never contradicts itself, read at the flip, in a real Envoy (2 workers).

`active` is the exact count, read when the status answers; the in-flight ages (`in_flight`) and the
receipt's `completed` are what each traffic worker publishes and counts at its `tick`. A status read in the
same millisecond as the flip — the end of the drain's last stream — must not show that stream in flight
beside `active: 0`, list more streams than `active` without `in_flight.older_than_count`, or show a
`completed` short of the streams that ended unless `receipt.completed_as_of` dates it before they ended.
The test polls `/drain/status` as fast as one client can while the drain's two streams end (the first leaves
the count below the list, the second flips), until the next ticks have counted them, and reads every answer.
"""
from __future__ import annotations

import time
from datetime import datetime

import requests

from tests.harness.envoy import wait_for
from tests.harness.wire import post, status

# The status shows a time of the timers' (monotonic) clock on the wall clock, and the flip's time is a wall
# clock reading: each side is truncated to a millisecond.
SLACK_MS = 2
# Drains tried for a read between a stream's end and its worker's next tick (within 100 ms): a loop
# stalled for longer than that on a loaded machine misses it, and the next drain tries again.
ROUNDS = 3
STREAMS = 2  # in flight when the drain begins: the first ends in DRAINING, the second's end flips


def ms(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339).timestamp() * 1000


def listed(st: dict) -> int:
    return sum(st["in_flight"]["ages"].values())


def contradictions(st: dict, ended: int) -> list[str]:
    """What `st` says against itself; `ended`: the drain's streams that ended once it is CLOSING."""
    found = []
    f, reliable = st["in_flight"], st["count"]["reliable"]
    if reliable and st["active"] == 0 and (listed(st) or f["oldest_age_ms"] is not None):
        found.append("a stream in flight beside active 0")
    if reliable and listed(st) > st["active"] and not f.get("older_than_count"):
        found.append("more streams in flight than active, without older_than_count")
    r = st["receipt"]
    if st["state"] == "CLOSING" and r["completed"] < ended:
        as_of = r.get("completed_as_of")
        if as_of is None:
            found.append("completed short of the streams that ended, undated")
        elif ms(as_of) > ms(st["progress"]["closing_at"]) + SLACK_MS:
            found.append("completed short of the streams that ended, dated after they ended")
    return found


def drain_two_streams(gw, stream, session: requests.Session) -> list[dict]:
    """Drains the gateway while two streams (1.5 s and 2 s) are in flight, and reads `/drain/status` in a
    tight loop from before the first ends until a while after the second's end was counted: every answer,
    in order."""
    ss = [stream(gw.traffic(f"/stream?seconds={t}&interval_ms=250")) for t in (1.5, 2)]
    wait_for(lambda: (st := status(gw))["active"] >= STREAMS and listed(st) == STREAMS, 10,
             what="the streams counted and listed")
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    reads: list[dict] = []
    counted_at = None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        st = status(gw, session)
        reads.append(st)
        if counted_at is None and st["state"] == "CLOSING" and st["receipt"]["completed"] >= STREAMS:
            counted_at = time.monotonic()
        if counted_at is not None and time.monotonic() - counted_at > 0.3:
            break
    assert counted_at is not None, f"no flip, or its streams never counted as completed: {reads[-1]}"
    assert all(s.wait(10) == 0 and s.complete for s in ss), "the streams ended whole"
    return reads


def test_a_status_read_at_the_flip_never_contradicts_its_count(gateway, stream):
    gw = gateway({"lb_buffer": "60m"})
    older, in_window = [], []
    with requests.Session() as session:
        for _ in range(ROUNDS):
            reads = drain_two_streams(gw, stream, session)
            bad = [(found, st) for st in reads if (found := contradictions(st, ended=STREAMS))]
            assert not bad, (f"{len(bad)} of {len(reads)} reads contradict themselves "
                             f"({sorted({why for found, _ in bad for why in found})}); the first: {bad[0]}")
            closing = [st for st in reads if st["state"] == "CLOSING"]
            assert closing[0]["progress"]["reason"] == "active_zero" and closing[0]["active"] == 0
            # Read after the first stream's end and before its worker's tick: the list is older than the count.
            older += [st for st in reads if st["in_flight"]["older_than_count"]]
            # Read after the flip and before the worker's tick counted the last stream: the moment the
            # figures published once a tick lag the count.
            in_window += [st for st in closing if st["receipt"]["completed"] < STREAMS]
            if older and in_window:
                break
            assert post(gw, "/reopen").json()["state"] == "OPEN"
    assert older, f"no read landed between the first stream's end and its worker's next tick in {ROUNDS} drains"
    assert in_window, f"no read landed between the flip and its worker's next tick in {ROUNDS} drains"
    assert (older[0]["active"], listed(older[0])) == (1, 2) and older[0]["in_flight"]["as_of"], older[0]
    first = in_window[0]
    assert listed(first) == 0 and first["in_flight"]["age_ms"] == 0, first["in_flight"]
