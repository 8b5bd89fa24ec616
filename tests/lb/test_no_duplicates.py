"""No request runs twice behind the shipped LB recipes (tests/lb/no_duplicates.py): real HAProxy 2.6
(envoyfilter/haproxy/haproxy-refuse.cfg), Envoy as the front LB (envoyfilter/lb/envoy-front.yaml) and
nginx (envoyfilter/lb/nginx-drain-gate.conf), each file run as written, two real gateways behind each
configured as the file says, each gateway in front of a ledger of its own (envoyfilter/tools/ledger.py:
how often each request ran, and on which gateway). Each LB in its own rig, the three at the same time.

- The application's 503 to a POST reaches its client, and the POST ran once. A GET the application
  answers 503: HAProxy resends it (its `retry-on 503` cannot tell the application's 503 from a refusal,
  and a GET may run twice: RFC 9110), so it ran 4 times (`retries 3`); Envoy and nginx do not.
- 10 GETs at once while gw1 refuses: every one resent, answered 200, ran once (Envoy's recipe allows
  that many retries under way at once; its control, the file with Envoy's default of 3, lost some).
- gw1 drained (its preStop call) under a steady sequence of POSTs and GETs from before DRAINING until
  CLOSED, and long POSTs (1.5 s) sent from its flip until the LB marks it DOWN: no request ran twice,
  every request answered 200, gw1 refused GETs (and resent: none of those sent once it refused ran on
  gw1), and served POSTs through the drain (HAProxy, nginx: ledger 1 ran POSTs sent while gw1 was
  DRAINING; Envoy, `refused_requests: all`: refused, none ran on gw1). Behind HAProxy, in every
  drain, POSTs gw1 served in CLOSING were still running at HAProxy's DOWN (gw1's ledger ran them,
  and held each past the instant HAProxy's admin socket first showed gw1 DOWN): each answered 200,
  HAProxy's file has no `on-marked-down shutdown-sessions` on its server lines.
- gw1's Envoy SIGKILLed while POSTs are held 3 s on it: no POST ran twice (their clients got an
  error: a crash may lose, never duplicate). Behind HAProxy the kernel resets their connections
  and HAProxy answers 502 at once: no `shutdown-sessions` is needed to end them.

And in the same rig, each recipe as it was before (tests/lb/controls/) shows the duplicates: HAProxy's
resent the application's 503 to a POST (ran 4 times) and the killed gateway's POSTs (ran twice),
Envoy's the 503 to a POST (4 times), nginx's (`non_idempotent`) the killed gateway's POSTs (twice).
And each drain behind HAProxy has its control: the same drain behind haproxy-refuse.cfg with
`on-marked-down shutdown-sessions` on its two server lines (a change of the shipped text made here),
which cuts every POST gw1 serves in CLOSING that still runs at the DOWN (HAProxy's log: D).

`make test` drains gw1 once behind each LB, `make scenarios` (`pytest -m full`) five times. The rows
go to out/no-duplicates/results.json and results.md.
"""
from __future__ import annotations

import json

import pytest

from tests.harness import forms
from tests.harness.envoy import REPO
from tests.lb import no_duplicates as nd

pytestmark = pytest.mark.full  # has a full form: `pytest -m full` (`make scenarios`)
DRAINS = 5 if forms.FULL else 1
OUT = REPO / "out" / "no-duplicates"
LBS = tuple(nd.RECIPES)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict]:
    got = nd.run_all(tmp_path_factory.mktemp("no-duplicates"), LBS, DRAINS)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(got, indent=1))
    (OUT / "results.md").write_text(nd.table(got))
    return {r["lb"]: r for r in got}


@pytest.mark.parametrize("lb", LBS)
def test_the_applications_503_to_a_post_reaches_its_client_once(rows, lb):
    got = rows[lb]["app_503"]["POST"]
    assert (got["status"], got["ran"], len(got["on"])) == (503, 1, 1), got


@pytest.mark.parametrize("lb", LBS)
def test_the_applications_503_to_a_get_is_resent_by_haproxy_only(rows, lb):
    """HAProxy resends an idempotent request on any 503 (4 runs: `retries 3`, each to the other
    gateway); a second run of a GET changes nothing (RFC 9110). Envoy and nginx resend no 503."""
    got = rows[lb]["app_503"]["GET"]
    assert got["status"] == 503, got
    assert got["ran"] == (4 if lb == "haproxy" else 1), got


@pytest.mark.parametrize("lb", LBS)
def test_many_refusals_at_once_are_all_resent(rows, lb):
    b = rows[lb]["burst"]
    assert b["refused"] >= 4 and b["on_gw1"] == 0, b
    assert b["answered_200"] == b["sent"] and b["ran"] == [1], b
    if lb == "envoy":
        assert b["retry_overflow"] == 0, b


def test_control_envoy_with_its_default_retry_limit_loses_refusals(rows):
    """The same file without its `circuit_breakers`: Envoy allows 3 retries under way at once and
    passes the other refusals to their clients (503, never run)."""
    b = rows["envoy"]["control_burst"]
    assert b["retry_overflow"] >= 1 and b["answered_200"] == b["sent"] - b["retry_overflow"], b
    assert b["ran"] == [0, 1], b


@pytest.mark.parametrize("lb", LBS)
def test_a_refusing_drain_under_posts_and_gets_runs_nothing_twice(rows, lb):
    for d in rows[lb]["drains"]:
        assert d["posts"] >= 20 and d["gets"] >= 20, d
        assert d["ran_twice"] == [], d["ran_twice"]
        assert d["gets_not_200"] == [] and d["never_ran"] == [], d
        assert (d["closing_reason"], d["forced"]) == ("active_zero", False), d


@pytest.mark.parametrize("lb", LBS)
def test_gw1_refused_gets_and_the_lb_resent_them(rows, lb):
    for d in rows[lb]["drains"]:
        assert d["refused"] >= 1, d
        assert d["gets_sent_during"] >= 5 and d["gets_gw1_ran"] == 0, d


@pytest.mark.parametrize("lb", LBS)
def test_posts_are_served_through_the_drain_where_the_lb_cannot_resend_them(rows, lb):
    """HAProxy (disable-l7-retry but for idempotent requests) and nginx (no POST resent once sent):
    gw1 refuses only idempotent requests and serves POSTs while DRAINING. Envoy's recipe resends
    drain-gate's refusal alone: gw1 refuses every request, no POST sent once it refused ran there."""
    for d in rows[lb]["drains"]:
        if lb == "envoy":
            assert sum(d["posts_gw1_served"].values()) == 0, d
        else:
            assert d["posts_gw1_within_draining"] >= 1, d


@pytest.mark.parametrize("lb", LBS)
def test_every_post_answered_200(rows, lb):
    """Every POST answered 200, the long ones sent from gw1's flip to the LB's DOWN included; nothing
    was cut, by the LB or anyone (gw1's receipt)."""
    for d in rows[lb]["drains"]:
        assert d["posts_not_200"] == [], d["posts_not_200"]
        assert d["lb_down_cut"] == [] and d["cut"] == d["cut_lb"] == 0, d


def test_haproxy_lets_the_posts_running_at_its_down_end(rows):
    """Behind HAProxy gw1 serves POSTs in CLOSING (HAProxy cannot resend them) until HAProxy's DOWN,
    and some still run on gw1 at the DOWN, in every drain: each answered 200 and ran once — the
    file's server lines have no `on-marked-down shutdown-sessions`. The proof is not vacuous: the
    control below cuts those POSTs."""
    for d in rows["haproxy"]["drains"]:
        assert d["lb_down_s"] is not None and 0 < d["lb_down_s"][1] < 3, d["lb_down_s"]
        assert d["long_posts"] >= 3, d
        at_down = d["posts_at_down"]
        long_ones = [r for r in at_down if r["hold_ms"] == nd.DRAIN.long_hold_ms]
        assert long_ones and all(r["sent_in"] == "CLOSING" for r in long_ones), at_down
        assert d["posts_at_down_200"] == len(at_down), at_down
        assert all(r["on"] == ["gw1"] and r["ran"] == 1 and not r["lb_cut"] for r in at_down), at_down


def test_control_haproxy_shutdown_sessions_cuts_the_posts_running_at_its_down(rows):
    """The control: the same drain behind haproxy-refuse.cfg with `on-marked-down shutdown-sessions`
    on its two server lines. In every drain POSTs gw1 served in CLOSING still run at HAProxy's DOWN,
    and every one of them is cut: not 200, ran once on gw1, logged D (cut by the DOWN) by HAProxy."""
    drains = rows["haproxy"]["control_drains"]
    assert len(drains) == DRAINS, drains
    for d in drains:
        at_down = d["posts_at_down"]
        assert at_down, d
        assert all(r["status"] != 200 and r["lb_cut"] and r["on"] == ["gw1"] and r["ran"] == 1 for r in at_down), at_down
        assert d["ran_twice"] == [], d["ran_twice"]


@pytest.mark.parametrize("lb", LBS)
def test_a_killed_gateway_loses_its_posts_never_runs_them_twice(rows, lb):
    k = rows[lb]["kill"]
    assert k["on_victim"] >= 1 and k["others_ok"], k
    assert k["ran_twice"] == 0 and set(k["victims_ran"]) == {1} and k["victims_resent_to"] == [], k
    assert 200 not in k["victims_got"], k
    if lb == "haproxy":
        # The kernel resets the dead process's connections: HAProxy answers 502 at once (no resend:
        # disable-l7-retry, no empty-response), without `shutdown-sessions` and long before any
        # keep-alive probe.
        assert k["victims_got"] == [502] and max(k["answered_after_kill_s"]) < 2, k


def test_control_haproxy_before_resent_the_503_to_a_post_and_a_killed_gateways_posts(rows):
    """`retry-on conn-failure empty-response 503` without disable-l7-retry: the application's 503 to a
    POST ran 4 times; a POST whose gateway died after forwarding it (HAProxy 2.6.12 sees the close as
    `empty-response`) was resent to gw2 and ran twice, its client got gw2's 200."""
    r = rows["haproxy"]
    assert r["control_app_503"]["POST"]["ran"] == 4, r["control_app_503"]
    k = r["control_kill"]
    assert k["ran_twice"] == k["on_victim"] >= 1 and set(k["victims_ran"]) == {2}, k
    assert k["victims_got"] == [200] and k["victims_resent_to"] == ["gw2"], k


def test_control_envoy_before_resent_the_503_to_a_post(rows):
    """`retriable_status_codes: [503]`: the application's 503 to a POST ran 4 times. A gateway killed
    after forwarding is a reset, which neither file resends: the old one ran those POSTs once too."""
    r = rows["envoy"]
    assert r["control_app_503"]["POST"]["ran"] == 4, r["control_app_503"]
    k = r["control_kill"]
    assert k["ran_twice"] == 0 and set(k["victims_ran"]) == {1} and 200 not in k["victims_got"], k


def test_control_nginx_non_idempotent_resent_a_killed_gateways_posts(rows):
    """`proxy_next_upstream error timeout non_idempotent`: the POSTs on the killed gateway were resent
    to gw2 and ran twice. It passes the application's 503 on (no `http_503`): ran once."""
    r = rows["nginx"]
    k = r["control_kill"]
    assert k["ran_twice"] == k["on_victim"] >= 1 and set(k["victims_ran"]) == {2}, k
    assert k["victims_got"] == [200] and k["victims_resent_to"] == ["gw2"], k
    assert r["control_app_503"]["POST"]["ran"] == 1, r["control_app_503"]
