"""gRPC behind each LB recipe while a gateway drains refusing new requests
(tests/lb/refuse_grpc.py): unary, server-streaming and bidirectional calls one after
another through real HAProxy, Envoy and nginx, gw1 drained (its preStop call) while they run, each
LB in two rigs of the same shape — `serve` (the default) beside `refuse` with the gRPC setting the
choice table gives it (envoyfilter/docs/lb.md, "200, 404 or refuse while draining?"):

- behind HAProxy and Envoy gRPC is refused too (`draining_grpc_requests: refuse`): answered HTTP
  503 with grpc-status 14, and resent to gw2 — no unary or server-streaming call lost, where serve
  loses none either (or only what HAProxy's own DOWN cut); behind Envoy no bidirectional call
  either. Behind HAProxy a bidirectional call (its request still being sent as the refusal comes)
  is not resent: the reason HAProxy refuses gRPC only for clients that make no such calls;
- behind nginx gRPC is served (the default): nginx never resends a gRPC call — the control,
  `refuse-grpc` in the same rig shape, loses the refused one — while every other request is
  refused (a GET straight to gw1 is reset, `refuse_with: reset`).

`make test` runs one round, `make scenarios` (`pytest -m full`) three. The rows go to
out/refuse-grpc/results.json and results.md.
"""
from __future__ import annotations

import pytest

from tests.harness import forms
from tests.harness.envoy import REPO
from tests.lb import refuse_grpc as rg
from tests.lb.refuse_lbs import rounds

pytestmark = pytest.mark.full  # has a full form: `pytest -m full` (`make scenarios`)
FULL = forms.FULL
ROUNDS = 3 if FULL else 1
OUT = REPO / "out" / "refuse-grpc"
FRONTS = ("haproxy", "envoy", "nginx")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return rounds(rg.run_round, ROUNDS, OUT, rg.table)


def of(rows: list[dict], front: str, mode: str) -> list[dict]:
    got = [r for r in rows if r["front"] == front and r["mode"] == mode]
    assert len(got) == ROUNDS, (front, mode)
    return got


def lost(r: dict, kinds=rg.KINDS) -> int:
    return sum(len(r["failed"][k]) for k in kinds)


@pytest.mark.parametrize("front", FRONTS)
def test_refusing_loses_no_grpc_call_that_serving_completes(rows, front):
    for serve, refuse in zip(of(rows, front, "serve"), of(rows, front, "refuse")):
        safe = ("unary", "server-streaming", "bidirectional") if front != "haproxy" else ("unary", "server-streaming")
        assert sum(refuse["calls"][k] for k in ("unary", "server-streaming")) >= 15, refuse
        assert lost(refuse, safe) == 0, refuse["failed"]
        # Serving completes every call but one HAProxy's DOWN cuts in flight (its log: D).
        assert lost(serve) == serve["killed_by_lb_down"], serve
        for r in (serve, refuse):
            assert (r["closing_reason"], r["forced"]) == ("active_zero", False), r
        # Every other request was refused: the GET straight to gw1.
        assert refuse["direct_get"] == ("no answer (reset)" if rg.REFUSE_WITH[front] == "reset"
                                        else "HTTP/1.1 503 Service Unavailable"), refuse
        grpc_refused = refuse["refused"] - 1
        if rg.GRPC[front] == "refuse":
            assert grpc_refused >= 1, refuse
            # Each refused call resent once (to gw2) or lost, HAProxy's bidirectional ones.
            assert refuse["resent"] + lost(refuse) == grpc_refused, refuse
        else:
            assert grpc_refused == 0, f"gRPC served behind {front}: {refuse}"


def test_haproxy_resends_no_refused_call_whose_request_is_still_being_sent(rows):
    """The same refuse rig: a bidirectional call (its second message 20 ms after the first) is
    refused at its headers, while HAProxy holds no whole request to send again; its client gets
    the 503 (CANCELLED: HAProxy also cancels the request stream)."""
    for r in of(rows, "haproxy", "refuse"):
        assert r["failed"]["bidirectional"], r
        assert set(r["failed"]["bidirectional"]) <= {"CANCELLED", "UNAVAILABLE"}, r


def test_nginx_resends_no_refused_grpc_call(rows):
    """The control of nginx's row: gRPC refused too, nginx passes the refusal to its client
    (grpc_pass streams the request body and never tries another gateway once it was sent); after
    that first refusal `max_fails=1` takes gw1 out and the rest go to gw2."""
    for r in of(rows, "nginx", "refuse-grpc"):
        assert lost(r) >= 1 and r["resent"] == 0, r
        # The refusal reaches the client as nginx passes the gateway's reset on: a 502 (UNAVAILABLE) or a
        # reset of the client's stream (INTERNAL); both are seen here, run to run. Neither is a resend.
        assert set(o for k in rg.KINDS for o in r["failed"][k]) <= {"UNAVAILABLE", "INTERNAL"}, r
