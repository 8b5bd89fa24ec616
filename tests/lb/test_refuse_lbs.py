"""`draining_new_requests: refuse` behind real LBs that resend a refusal (tests/lb/refuse_lbs.py):
two gateways behind HAProxy 2.6 (envoyfilter/haproxy/haproxy-refuse.cfg), Envoy as the front LB
(envoyfilter/lb/envoy-front.yaml, the gateways with `refused_requests: all`) or Debian's nginx
(envoyfilter/lb/nginx-drain-gate.conf, the gateways with `refuse_with: reset`), each file run as
written; a new 2.5 s stream every 0.3 s for 8 s, gw1 drained at t = 1 s with `drain_timeout: 5s`.

- `refuse` loses 0 of >= 20 streams behind each LB, the drain closes on its own (active = 0,
  `forced: false`) in the time of the longest stream in flight, well before `drain_timeout`;
  every refusal was resent, the gateway cut nothing.
- `serve` (the default), in the same round and the same rig shape, loses streams behind each LB
  (the control): the drain never reaches active = 0 and is forced at `drain_timeout`. No LB's
  DOWN cuts (haproxy-refuse.cfg's server lines carry no `on-marked-down shutdown-sessions`):
  the loss is the pod's exit, which the gateway's receipt (read just before it) cannot see.
- what each LB resends (GET, PUT bodies from 1 kB to 2 MiB, a WebSocket upgrade, a request on a
  connection opened before the drain), what becomes of a POST while the gateways refuse (served
  through the drain by default; refused and resent behind Envoy's `all`), and what it does with a
  503 the application answered itself: no shipped recipe resends it to a POST, HAProxy's resends
  it to a GET (idempotent); the recipes before (tests/lb/controls/), in the same rigs, resent it
  to a POST too; `retries 3` alone resends nothing; nginx's recipe keeps every gateway in after
  an application's 503 and still moves a refused request on (`refuse_with: reset`).
- TCP: behind HAProxy `mode tcp` a connection a server closes, resets or holds at once is lost to
  its client, never resent: the TCP role serves while draining.

`make test` runs one round; `make scenarios` (`pytest -m full`) five, plus `retries 3`
alone under the same workload. The rows go to out/refuse-lbs/results.json and results.md.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.harness import forms
from tests.harness.envoy import REPO
from tests.harness.haproxy import CFG, CFG_REFUSE, CFG_REFUSE_CONTROL, make_cert
from tests.lb import refuse_lbs as rl

pytestmark = pytest.mark.full  # has a full form: `pytest -m full` (`make scenarios`)
FULL = forms.FULL
ROUNDS = 5 if FULL else 1
OUT = REPO / "out" / "refuse-lbs"
FRONTS = ("haproxy", "envoy", "nginx")
W = rl.RIG


WAIT_FOR_BODY = "http-request wait-for-body time 1s if { req.hdr(content-length) -m found }"
RETRY_LINES = ["retry-on conn-failure 503", "option redispatch 1",
               "acl drain_gate_resendable method GET HEAD OPTIONS TRACE PUT DELETE",
               "acl drain_gate_resendable req.hdr(idempotency-key) -m found",
               "http-request disable-l7-retry unless drain_gate_resendable", WAIT_FOR_BODY,
               "option srvtcpka", "srvtcpka-idle 10s", "srvtcpka-intvl 5s", "srvtcpka-cnt 3"]
# haproxy.cfg's HTTP server lines end with this; haproxy-refuse.cfg's go without it (a POST served
# through the drain in CLOSING would be cut at DOWN; a dead gateway's sessions end at TCP keep-alive).
SHUTDOWN_SESSIONS = " on-marked-down shutdown-sessions"
# The recipe before (tests/lb/controls/haproxy-refuse-resends-503.cfg), the probe's control.
CONTROL_LINES = ["retry-on conn-failure empty-response 503", "option redispatch 1", WAIT_FOR_BODY]


def _directives(path) -> list[str]:
    return [code for line in path.read_text().splitlines() if (code := line.split("#", 1)[0].rstrip()).strip()]


@pytest.mark.parametrize("cfg, lines", [(CFG_REFUSE, RETRY_LINES), (CFG_REFUSE_CONTROL, CONTROL_LINES)],
                         ids=["shipped", "control"])
def test_haproxy_refuse_cfg_is_haproxy_cfg_plus_the_retry_lines(tmp_path, cfg, lines):
    """haproxy-refuse.cfg parses with every frontend on and is haproxy.cfg plus, in the HTTP
    backend only, `retry-on conn-failure 503`, `option redispatch 1`, the rule that keeps every
    request but an idempotent or keyed one from being resent on a 503 (`disable-l7-retry unless
    drain_gate_resendable`), and the wait for a request body of announced length. Its control, the
    recipe before, is haproxy.cfg plus `retry-on conn-failure empty-response 503`, the redispatch
    and the wait: it resent every 503 and every request whose connection closed unanswered."""
    env = {**os.environ, "HAPROXY_SOCKET": str(tmp_path / "admin.sock"), "GW2_ADDR": "127.0.0.1:1",
           "TLS_PEM": str(make_cert(tmp_path)), "GW1_TLS_ADDR": "127.0.0.1:2", "GW2_TLS_ADDR": "127.0.0.1:3",
           "APISERVER_ADDR": "127.0.0.1:4"}
    r = subprocess.run(["haproxy", "-c", "-f", str(cfg)], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr
    plain, refuse = _directives(CFG), _directives(cfg)
    if cfg == CFG_REFUSE:  # the HTTP backend's server lines, as haproxy.cfg's but for shutdown-sessions
        http_servers = [line for line in plain if "server gw" in line and "_ADDR" in line and "_TLS_" not in line]
        assert len(http_servers) == 2 and all(line.endswith(SHUTDOWN_SESSIONS) for line in http_servers), http_servers
        plain = [line.removesuffix(SHUTDOWN_SESSIONS) if line in http_servers else line for line in plain]
    extra = [line for line in refuse if line not in plain]
    assert [line.strip() for line in extra] == lines
    assert [line for line in refuse if line not in extra] == plain
    backend = refuse.index("backend gateways")
    nxt = next(i for i, line in enumerate(refuse) if i > backend and not line.startswith(" "))
    assert all(backend < refuse.index(line) < nxt for line in extra), "the retry lines belong to the HTTP backend"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return rl.rounds(rl.run_round, ROUNDS, OUT, rl.table, rl.ROUND + ([rl.RETRIES_ALONE] if FULL else []))


def of(rows: list[dict], front: str, mode: str) -> list[dict]:
    got = [r for r in rows if r["front"] == front and r["mode"] == mode]
    assert len(got) == ROUNDS if front != "haproxy-retries" else got, (front, mode)
    return got


@pytest.mark.parametrize("front", FRONTS)
def test_refuse_loses_nothing_and_the_drain_closes_on_its_own(rows, front):
    for r in of(rows, front, "refuse"):
        assert r["arrivals"] >= 20, r
        assert r["lost"] == 0, r["lost_streams"]
        assert (r["closing_reason"], r["forced"]) == ("active_zero", False), r
        # The time of the longest stream in flight at drain start (2.5 s) and a tick, not drain_timeout.
        assert r["draining_s"] <= W.seconds + 1.0 < W.drain_timeout_s, r
        assert r["refused"] >= 1 and r["resent"] == r["refused"], "every refusal resent by the LB"
        assert r["cut"] == 0, r


@pytest.mark.parametrize("front", FRONTS)
def test_control_serve_loses_streams_in_the_same_rig(rows, front):
    """The default: the LB keeps sending new streams to the draining gateway, active never
    reaches 0, the flip is forced at drain_timeout with streams in flight."""
    for r in of(rows, front, "serve"):
        assert r["lost"] >= 1, f"{front}: serve lost nothing, the rig proves nothing: {r}"
        assert (r["closing_reason"], r["forced"]) == ("drain_timeout", True), r
        assert r["refused"] == 0 and r["resent"] == 0, r
        assert all(s["server"] == "gw1" for s in r["lost_streams"]), r["lost_streams"]


@pytest.mark.parametrize("front", FRONTS)
def test_the_gateway_counts_what_the_lb_cut(rows, front):
    """No recipe cuts at its DOWN: HAProxy (haproxy-refuse.cfg has no `on-marked-down
    shutdown-sessions`), Envoy (its check drains the connection pool) and nginx (no check) lose
    the streams still running on gw1 when its pod exits, at CLOSED: after the receipt was read,
    which counts no cut."""
    for r in of(rows, front, "serve"):
        assert r["cut"] == 0, r
        assert all(abs(s["end_s"] - r["exited_s"]) < 1.0 for s in r["lost_streams"]), r


@pytest.mark.skipif(not FULL, reason="`make scenarios`: the same workload behind haproxy.cfg's `retries 3` alone")
def test_retries_alone_pass_every_refusal_to_its_client(rows):
    for r in of(rows, "haproxy-retries", "refuse"):
        assert r["lost"] == r["refused"] >= 1 and r["resent"] == 0, r
        assert all(s["http_code"] == 503 for s in r["lost_streams"]), r["lost_streams"]
        assert (r["closing_reason"], r["forced"]) == ("active_zero", False), r


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict[tuple[str, str, str], dict]:
    """What each LB does with a request gw1 refused (rl.probe): the shipped recipes, behind the
    gateways their files name and behind gateways that refuse more, and the controls; in `make
    scenarios` a few variants too. Keyed (LB, refuse_with, refused_requests)."""
    rows = rl.probe(tmp_path_factory.mktemp("probe"), full=FULL)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "probe.json").write_text(json.dumps(rows, indent=1))
    (OUT / "probe.md").write_text(rl.probe_table(rows))
    return {(r["lb"], r["refuse_with"], r["refused_requests"]): r for r in rows}


SIZES = [f"PUT {n}" for n in (1024, 65536, 921600, 2097152)]
HAPROXY, ENVOY, NGINX = "HAProxy, haproxy-refuse.cfg", "Envoy, envoy-front.yaml", "nginx, nginx-drain-gate.conf"
HAPROXY_BEFORE = "control: HAProxy, the recipe before (`retry-on conn-failure empty-response 503`)"
ENVOY_BEFORE = "control: Envoy, the recipe before (`retriable_status_codes: [503]`)"
NGINX_BEFORE = "control: nginx, the recipe before (`error timeout non_idempotent`, `max_fails=1`)"
NGINX_503 = "control: nginx, `http_503 non_idempotent`, `max_fails=1` (the recipe before that)"
RETRIES_ALONE = "control: HAProxy, haproxy.cfg (`retries 3` alone)"
# The shipped recipes, behind the gateways their files name.
SHIPPED = [(HAPROXY, "response", "idempotent"), (HAPROXY, "response", "idempotent_or_key"),
           ("HAProxy, haproxy-refuse.cfg, `proto h2` (gRPC)", "response", "idempotent"), (ENVOY, "response", "all"),
           (NGINX, "reset", "idempotent")]


def resent(row: dict, kinds=("GET 0", *SIZES, "websocket", "existing")) -> list[bool]:
    return [row[k]["resent"] for k in kinds]


def outcome(c: dict) -> tuple:
    """A POST while refusing: ("served",), ("refused", "resent") or ("refused", status)."""
    if c["outcome"] != "refused":
        return (c["outcome"],)
    return ("refused", "resent" if c["resent"] else c["status"])


def test_what_each_lb_resends(probed):
    """A request gw1 refused, through each LB: GET, PUT bodies of 1 kB to 2 MiB, a WebSocket
    upgrade, a GET on a connection the LB opened to gw1 before the drain."""
    hap = probed[HAPROXY, "response", "idempotent"]
    # HAProxy resends what it holds whole in its buffer (tune.bufsize 16 kB): no body of 64 kB or more.
    assert resent(hap) == [True, True, False, False, False, True, True], hap
    assert {hap[k]["status"] for k in SIZES[1:]} == {503}
    alone = probed[RETRIES_ALONE, "response", "all"]
    assert resent(alone) == [False] * 7, alone
    envoy = probed[ENVOY, "response", "all"]
    # Envoy holds the request body for a retry up to its buffer (1 MiB): not the 2 MiB one.
    assert resent(envoy) == [True, True, True, True, False, True, True], envoy
    # Resent whether the LB refused it on the HTTP/2 connection it had or took a new one after the
    # drain's GOAWAY (both seen: `new_connections` 0 or 1).
    assert envoy["existing"]["http2"], envoy
    h2 = probed["HAProxy, haproxy-refuse.cfg, `proto h2` (gRPC)", "response", "idempotent"]
    assert resent(h2, ("GET 0", "PUT 1024", "existing")) == [True] * 3 and h2["existing"]["http2"], h2
    # `proto h2` carries no WebSocket upgrade to the gateway: HAProxy answers it 502 itself.
    assert (h2["websocket"]["reached"], h2["websocket"]["status"]) == (False, 502), h2
    nginx = probed[NGINX, "reset", "idempotent"]
    # nginx holds the whole body (up to client_max_body_size, 1 MiB by default: a bigger one it
    # answers 413 itself, draining or not).
    assert resent(nginx) == [True, True, True, True, False, True, True], nginx
    assert (nginx["PUT 2097152"]["reached"], nginx["PUT 2097152"]["status"]) == (False, 413)
    # The recipes before resent as much (their bodies, upgrades, existing connections).
    assert resent(probed[HAPROXY_BEFORE, "response", "all"]) == resent(hap)
    assert resent(probed[ENVOY_BEFORE, "response", "all"]) == resent(envoy)
    assert resent(probed[NGINX_BEFORE, "reset", "all"]) == resent(nginx)


def test_a_post_is_served_through_a_refusing_drain_unless_the_lb_resends_its_refusal(probed):
    """A POST while gw1 refuses: behind HAProxy and nginx (`refused_requests: idempotent`, the
    default) gw1 serves it, once; with `idempotent_or_key` HAProxy resends a POST with an
    Idempotency-Key that gw1 refused, and gw1 serves one without; behind Envoy (`all`) gw1 refuses
    it and Envoy resends it. Behind gateways that refuse more than their LB resends, the refused
    POST is lost (HAProxy: its 503 to the client; nginx: 502); the recipes before resent it, and
    `retries 3` alone lost it."""
    for key in SHIPPED:
        r = probed[key]
        assert r["post"]["processed"] == r["post_key"]["processed"] == 1, (key, r["post"], r["post_key"])
    for key in [(HAPROXY, "response", "idempotent"), ("HAProxy, haproxy-refuse.cfg, `proto h2` (gRPC)", "response",
                                                      "idempotent"), (NGINX, "reset", "idempotent")]:
        r = probed[key]
        assert outcome(r["post"]) == outcome(r["post_key"]) == ("served",), (key, r["post"], r["post_key"])
        assert r["post"]["processed"] == 1, r["post"]
    keyed = probed[HAPROXY, "response", "idempotent_or_key"]
    assert outcome(keyed["post"]) == ("served",) and outcome(keyed["post_key"]) == ("refused", "resent"), keyed
    envoy = probed[ENVOY, "response", "all"]
    assert outcome(envoy["post"]) == outcome(envoy["post_key"]) == ("refused", "resent"), envoy
    assert envoy["post"]["processed"] == 1, "refused, never forwarded: run once, by gw2"
    # The controls of that: the shipped HAProxy and nginx resend no POST gw1 refused.
    assert outcome(probed[f"{HAPROXY} {rl.MORE}", "response", "all"]["post"]) == ("refused", 503)
    assert outcome(probed[f"{NGINX} {rl.MORE}", "reset", "all"]["post"]) == ("refused", 502)
    assert outcome(probed[HAPROXY_BEFORE, "response", "all"]["post"]) == ("refused", "resent")
    assert outcome(probed[NGINX_BEFORE, "reset", "all"]["post"]) == ("refused", "resent")
    assert outcome(probed[RETRIES_ALONE, "response", "all"]["post"]) == ("refused", 503)
    if FULL:
        assert outcome(probed[ENVOY, "response", "idempotent"]["post"]) == ("served",)
        assert outcome(probed["control: HAProxy, the recipe before", "reset", "all"]["post"]) == ("refused", "resent")


def test_no_shipped_recipe_resends_an_application_503_to_a_post(probed):
    """Both gateways OPEN, the application answers 503: no shipped recipe resends it to a POST
    (processed once); HAProxy's resends it to a GET (an idempotent method: it runs 4 times with
    `retries 3`, and a second run changes nothing), Envoy's and nginx's to neither. The controls,
    in the same rigs: the recipes before resent it to a POST too (HAProxy's and Envoy's 4 times,
    nginx with `http_503` twice)."""
    for key in SHIPPED:
        assert probed[key]["app_503_post"]["processed"] == 1, (key, probed[key]["app_503_post"])
    for key in [(HAPROXY, "response", "idempotent"), (HAPROXY, "response", "idempotent_or_key")]:
        assert probed[key]["app_503_get"]["processed"] == 4, (key, probed[key]["app_503_get"])
    for key in [(ENVOY, "response", "all"), (NGINX, "reset", "idempotent")]:
        assert probed[key]["app_503_get"]["processed"] == 1, (key, probed[key]["app_503_get"])
    assert probed[HAPROXY_BEFORE, "response", "all"]["app_503_post"]["processed"] == 4
    assert probed[ENVOY_BEFORE, "response", "all"]["app_503_post"]["processed"] == 4
    assert probed[NGINX_503, "response", "all"]["app_503_post"]["processed"] == 2
    assert probed[RETRIES_ALONE, "response", "all"]["app_503_post"]["processed"] == 1


def test_nginx_keeps_every_gateway_in_after_an_application_503_and_moves_a_refused_request_on(probed):
    """nginx-drain-gate.conf passes every answer on (no `http_503`): the application's own 503
    reaches its client once, processed once, and the next requests reach both gateways; a request
    drain-gate refused (`refuse_with: reset`: an error to nginx) goes to the other gateway. The
    control, the recipe before that (`http_503 non_idempotent`, `max_fails=1`), resends the
    application's 503 to the other gateway (processed twice) and takes the first gateway out."""
    nginx = probed[NGINX, "reset", "idempotent"]
    assert nginx["app_503_post"] == {"status": 503, "processed": 1, "then": ["gw1", "gw2"]}, nginx
    assert nginx["GET 0"]["resent"] and nginx["PUT 1024"]["resent"], nginx
    before = probed[NGINX_503, "response", "all"]
    assert before["app_503_post"] == {"status": 503, "processed": 2, "then": ["gw2"]}, before


def test_haproxy_resends_a_body_only_once_it_holds_it(tmp_path):
    """HAProxy 2.6 resends a refused request with a body (a PUT) only if the whole request was in
    its buffer when the 503 came: a body written after the headers was still on its way and the
    client got the 503. haproxy-refuse.cfg's wait-for-body line makes it wait for a body of
    announced length first (the control: the same file without that line, in the same rig)."""
    shipped = CFG_REFUSE.read_text()
    without = tmp_path / "haproxy-refuse-without-wait.cfg"
    without.write_text("\n".join(line for line in shipped.splitlines()
                                 if line.strip() != WAIT_FOR_BODY) + "\n")
    assert without.read_text().count("wait-for-body") == shipped.count("wait-for-body") - 1
    with rl.FrontRig(tmp_path / "rig", rl.PROBE_HELD) as rig:
        assert rig.gw("gw1").post("/drain").json()["state"] == "DRAINING"
        rig.use("haproxy", haproxy_cfg=without)
        assert rl.refused_raw_requests(rig, 1024, apart=False) == [200] * 3, "headers and body in one write: resent"
        assert rl.refused_raw_requests(rig, 1024, apart=True) == [503] * 3, "the body after the headers: not resent"
        rig.use("haproxy")
        assert rl.refused_raw_requests(rig, 1024, apart=True) == [200] * 3, "with wait-for-body: resent"
        assert rl.refused_raw_requests(rig, 12000, apart=True) == [200] * 3
        assert rl.refused_raw_requests(rig, 64 * 1024, apart=False) == [503] * 3, "bigger than the buffer"


def test_tcp_a_refused_connection_is_lost_never_resent(tmp_path):
    """Behind haproxy-tcp.cfg: once HAProxy's connection to a server is up, it resends nothing;
    whatever gw1 does with a new connection (close, reset, hold), its client loses it. The real
    gateway (the control) serves every one."""
    rows = {r["gw1"]: r for r in rl.tcp_refusal(tmp_path, connections=6, timeout=1.0)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "tcp.md").write_text(rl.tcp_table(list(rows.values())))
    for how in ("close", "reset", "hold"):
        r = rows[how]
        # Round robin: every other connection went to gw1, and each of those was lost.
        assert r["served"] == 3 and r["closed"] + r["reset"] + r["timed out"] == 3 and r["other"] == 0, r
        assert r["accepted_by_gw1"] >= 3, r
    assert rows["close"]["closed"] == 3, "a close reaches the client as a close"
    # A reset too, or HAProxy takes it for a failed connect and retries the same server after its
    # 1 s turn-around (no redispatch in haproxy-tcp.cfg): lost either way, sometimes late.
    assert rows["hold"]["timed out"] == 3, "a held connection waits until its client gives up"
    assert rows["gateway"]["served"] == 6, rows["gateway"]
