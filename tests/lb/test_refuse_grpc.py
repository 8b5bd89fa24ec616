"""gRPC behind each LB recipe while a gateway drains refusing new requests
(tests/lb/refuse_grpc.py): unary, server-streaming and bidirectional calls one after
another through real HAProxy, Envoy and nginx, gw1 drained (its preStop call) while they run, each
LB in rigs of the same shape — `serve` (the default) beside `refuse` and `refuse-grpc`
(`draining_grpc_requests` serve or refuse; envoyfilter/docs/refuse.md, "Which requests are
refused, per LB"):

- behind HAProxy's file as shipped gRPC is served (`refuse`: gRPC, a POST, is one the file
  resends on no 503) and loses nothing serving does not; to refuse gRPC too the file takes the
  one line its comment gives (GRPC_LINE, added by the test to the shipped text): then a refused
  unary or server-streaming call is resent to gw2, a bidirectional one (its request still being
  sent as the refusal comes) is not. The control, gRPC refused behind the file as shipped:
  every refused call reaches its client;
- behind Envoy gRPC is refused too (`refuse-grpc`): answered HTTP 503 with grpc-status 14 and
  drain-gate's `x-drain-gate` header, which Envoy's `retriable-headers` resends — no call lost;
- behind nginx gRPC is served (`refuse`): nginx never resends a gRPC call — the control,
  `refuse-grpc` in the same rig shape, loses the refused one — while a GET is refused (a GET
  straight to gw1 is reset, `refuse_with: reset`).

`make test` runs one round, `make scenarios` (`pytest -m full`) three. The rows go to
out/refuse-grpc/results.json and results.md.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.harness import forms
from tests.harness.envoy import REPO
from tests.harness.haproxy import CFG_REFUSE, h2_cfg
from tests.lb import refuse_grpc as rg
from tests.lb.refuse_lbs import rounds

pytestmark = pytest.mark.full  # has a full form: `pytest -m full` (`make scenarios`)
FULL = forms.FULL
ROUNDS = 3 if FULL else 1
OUT = REPO / "out" / "refuse-grpc"
# Per LB, the refusing mode its recipe runs and the kinds of call it loses none of.
ALL = rg.KINDS
RECIPES = [("haproxy", "refuse", ALL), ("haproxy", "refuse-grpc", ("unary", "server-streaming")),
           ("envoy", "refuse-grpc", ALL), ("nginx", "refuse", ALL)]


def test_the_grpc_line_is_the_one_haproxy_refuse_cfg_gives(tmp_path):
    """The line the rig adds to refuse gRPC behind HAProxy is, word for word, the one the shipped
    file's comment gives, and the file with it (and `proto h2`) parses: one directive more."""
    shipped = CFG_REFUSE.read_text()
    assert f"#     {rg.GRPC_LINE}\n" in shipped
    added = rg.haproxy_grpc_cfg(tmp_path)
    assert added.read_text().splitlines().count(f"    {rg.GRPC_LINE}") == 1
    assert len(added.read_text().splitlines()) == len(shipped.splitlines()) + 1
    env = {**os.environ, "HAPROXY_SOCKET": str(tmp_path / "admin.sock"), "GW2_ADDR": "127.0.0.1:1"}
    r = subprocess.run(["haproxy", "-c", "-f", str(h2_cfg(added, tmp_path))], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0 and "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return rounds(rg.run_round, ROUNDS, OUT, rg.table)


def of(rows: list[dict], front: str, mode: str) -> list[dict]:
    got = [r for r in rows if r["front"] == front and r["mode"] == mode]
    assert len(got) == ROUNDS, (front, mode)
    return got


def lost(r: dict, kinds=rg.KINDS) -> int:
    return sum(len(r["failed"][k]) for k in kinds)


@pytest.mark.parametrize("front, mode, safe", RECIPES, ids=[f"{f}-{m}" for f, m, _ in RECIPES])
def test_refusing_loses_no_grpc_call_that_serving_completes(rows, front, mode, safe):
    for serve, refuse in zip(of(rows, front, "serve"), of(rows, front, mode)):
        assert sum(refuse["calls"][k] for k in ("unary", "server-streaming")) >= 15, refuse
        # Serving completes every call but one HAProxy's DOWN cuts (the sessions its DOWN message
        # counts, where the server lines carry `shutdown-sessions`; haproxy-refuse.cfg's do not: 0):
        # gRPC served through a refusing drain too.
        assert lost(serve) == serve["killed_by_lb_down"], serve
        served = rg.GRPC[mode] == "serve"
        # With `shutdown-sessions` HAProxy's DOWN cuts what is on gw1 at its instant, a call it assigned
        # then included (the DOWN-instant race of envoyfilter/docs/refuse.md): the only loss of a kind
        # the LB resends. Behind haproxy-refuse.cfg, Envoy and nginx `killed` is 0.
        killed = refuse["killed_by_lb_down"]
        assert (lost(refuse) == killed) if served else (lost(refuse, safe) <= killed), (killed, refuse["failed"])
        for r in (serve, refuse):
            assert (r["closing_reason"], r["forced"]) == ("active_zero", False), r
        # A GET was refused: the one straight to gw1.
        assert refuse["direct_get"] == ("no answer (reset)" if rg.REFUSE_WITH[front] == "reset"
                                        else "HTTP/1.1 503 Service Unavailable"), refuse
        grpc_refused = refuse["refused"] - 1
        if not served:
            assert grpc_refused >= 1, refuse
            # Each refused call resent once (to gw2) or lost, HAProxy's bidirectional ones; and a
            # call HAProxy's DOWN cut, refused or not.
            assert grpc_refused <= refuse["resent"] + lost(refuse) <= grpc_refused + killed, refuse
        else:
            assert grpc_refused == 0, f"gRPC served behind {front}: {refuse}"


def test_haproxy_resends_no_refused_call_whose_request_is_still_being_sent(rows):
    """HAProxy with GRPC_LINE: a bidirectional call (its second message 20 ms after the first) is
    refused at its headers, while HAProxy holds no whole request to send again; its client gets
    the 503 (CANCELLED: HAProxy also cancels the request stream)."""
    for r in of(rows, "haproxy", "refuse-grpc"):
        assert r["failed"]["bidirectional"], r
        assert set(r["failed"]["bidirectional"]) <= {"CANCELLED", "UNAVAILABLE"}, r


def test_haproxy_as_shipped_resends_no_refused_grpc_call(rows):
    """The control of GRPC_LINE: gRPC refused behind haproxy-refuse.cfg as shipped, whose
    `disable-l7-retry` keeps every POST but a keyed one from being resent on a 503: every call
    gw1 refused reaches its client (UNAVAILABLE; CANCELLED for a call still being sent)."""
    for r in of(rows, "haproxy", "refuse-grpc-without-the-line"):
        grpc_refused = r["refused"] - 1
        assert grpc_refused >= 1 and r["resent"] == 0, r
        assert grpc_refused <= lost(r) <= grpc_refused + r["killed_by_lb_down"], r
        assert set(o for k in rg.KINDS for o in r["failed"][k]) <= {"UNAVAILABLE", "CANCELLED"}, r


def test_nginx_resends_no_refused_grpc_call(rows):
    """The control of nginx's row: gRPC refused too, nginx passes the refusal to its client
    (grpc_pass streams the request body and never tries another gateway once it was sent)."""
    for r in of(rows, "nginx", "refuse-grpc"):
        assert lost(r) >= 1 and r["resent"] == 0, r
        # The refusal reaches the client as nginx passes the gateway's reset on: a 502 (UNAVAILABLE), a
        # reset of the client's stream (INTERNAL) or a stream ended without a grpc-status (UNKNOWN); each
        # is seen here, run to run. None is a resend.
        assert set(o for k in rg.KINDS for o in r["failed"][k]) <= {"UNAVAILABLE", "INTERNAL", "UNKNOWN"}, r
