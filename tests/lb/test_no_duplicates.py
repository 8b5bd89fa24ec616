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
  CLOSED: no request ran twice, every GET answered 200, gw1 refused GETs (and resent: none of those
  sent once it refused ran on gw1), and served POSTs through the drain (HAProxy, nginx: ledger 1 ran
  POSTs sent while gw1 was DRAINING; Envoy, `refused_requests: all`: refused, none ran on gw1). Every
  POST answered 200 behind Envoy and nginx; behind HAProxy a POST gw1 served in CLOSING, still under
  way at HAProxy's DOWN, is cut by `on-marked-down shutdown-sessions` (HAProxy's log: D; gw1 counts
  it as the LB's cut): ran once, lost to its client. Its number is measured, never hidden.
- gw1's Envoy SIGKILLed while POSTs are held 3 s on it: no POST ran twice (their clients got an
  error: a crash may lose, never duplicate).

And in the same rig, each recipe as it was before (tests/lb/controls/) shows the duplicates: HAProxy's
resent the application's 503 to a POST (ran 4 times) and the killed gateway's POSTs (ran twice),
Envoy's the 503 to a POST (4 times), nginx's (`non_idempotent`) the killed gateway's POSTs (twice).

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
def test_every_post_answered_but_what_haproxys_down_cut(rows, lb):
    """Behind Envoy and nginx every POST answered 200. Behind HAProxy a POST gw1 served in CLOSING and
    still under way at HAProxy's DOWN is cut (`on-marked-down shutdown-sessions`): each POST that did
    not answer 200 is one HAProxy logged cut by its DOWN, ran once on gw1, and gw1 counted it as the
    LB's cut. The number per drain is the table's."""
    for d in rows[lb]["drains"]:
        if lb != "haproxy":
            assert d["posts_not_200"] == [], d["posts_not_200"]
            continue
        assert len(d["posts_not_200"]) == len(d["lb_down_cut"]) == d["cut_lb"] == d["cut"], d
        assert all(p["on"] == ["gw1"] and p["ran"] == 1 and p["sent_in"] == "CLOSING" for p in d["posts_not_200"]), d


@pytest.mark.parametrize("lb", LBS)
def test_a_killed_gateway_loses_its_posts_never_runs_them_twice(rows, lb):
    k = rows[lb]["kill"]
    assert k["on_victim"] >= 1 and k["others_ok"], k
    assert k["ran_twice"] == 0 and set(k["victims_ran"]) == {1} and k["victims_resent_to"] == [], k
    assert 200 not in k["victims_got"], k


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
