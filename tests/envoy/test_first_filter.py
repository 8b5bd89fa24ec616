"""drain-gate is the first HTTP filter of every chain, in every form: a request
an earlier filter holds does not exist for it (Envoy creates a wasm filter's
stream when the request reaches that filter), so a drain begun while it is
held would flip with it in flight.

- Where each form lands in the chain istiod 1.30.3 builds
  (tests/harness/istio/envoyfilter.py), and what another EnvoyFilter has to do
  to get in front of the EnvoyFilter form.
- Behind real HAProxy (envoyfilter/haproxy/haproxy.cfg, `shutdown-sessions`),
  two gateways of one form each: gw1 as shipped, gw2 with the traffic filter
  where it was before (the control). Each gets a request that the fault filter
  holds (x-envoy-fault-delay-request) and one that ext_authz holds (a CUSTOM
  AuthorizationPolicy's, calling a slow authorization server), both drained
  while held. EnvoyFilter form: gw1 counts both, stays DRAINING with the LB
  check at 200, flips after their end, both complete with 200; gw2 counts
  neither, flips at once, and HAProxy cuts both (502). WasmPlugin form: gw1
  counts the fault-held one, which completes; the CUSTOM policy's ext_authz
  stands before every WasmPlugin phase, so the request it holds is not counted
  and is cut, as on gw2 (the form's limit, measured).
- verify.py --config-dump on each of them names what stands in front.
"""
from __future__ import annotations

import copy
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from tests.deploy.test_istio_envoy import start_gateway  # noqa: F401 (a fixture)
from tests.deploy.test_verify import dump_of, verify
from tests.harness import istio
from tests.harness.authz import AuthzServer
from tests.harness.envoy import WASM, Ports, wait_for
from tests.harness.rig import Rig

VERIFY = istio.ENVOYFILTER / "tools" / "verify.py"
TRAFFIC_PORT = 8080
FAULT_STAT = f"http.outbound_0.0.0.0_{TRAFFIC_PORT}.fault.delays_injected"
ISTIOD = [f["name"] for f in istio.gateway_http_filters(custom_authz="ext-authz")]


def load(rel: str) -> dict:
    return istio.load_one(istio.ISTIO / rel)


def names(listener: dict) -> list[str]:
    return [f["name"] for hcm in istio.hcms(listener, {}) for f in hcm["http_filters"]]


def before_the_router(traffic_ef: dict) -> dict:
    """The traffic EnvoyFilter as the chart had it: INSERT_BEFORE the router, priority 10."""
    ef = copy.deepcopy(traffic_ef)
    ef["spec"]["priority"] = 10
    patch = ef["spec"]["configPatches"][0]
    patch["patch"]["operation"] = "INSERT_BEFORE"
    patch["match"]["listener"]["filterChain"]["filter"]["subFilter"] = {"name": "envoy.filters.http.router"}
    return ef


def user_envoyfilter(name: str, priority: int, op: str, value: dict, sub: str | None = None,
                     namespace: str = "istio-system", created: str = "") -> dict:
    """Another team's EnvoyFilter on the same gateway pods."""
    fm = {"name": istio.HCM_NAME, **({"subFilter": {"name": sub}} if sub else {})}
    return {"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
            "metadata": {"name": name, "namespace": namespace, **({"creationTimestamp": created} if created else {})},
            "spec": {"workloadSelector": {"labels": istio.DRAIN_GATE_LABEL}, "priority": priority,
                     "configPatches": [{"applyTo": "HTTP_FILTER", "match": {"context": "GATEWAY", "listener": {
                         "filterChain": {"filter": fm}}}, "patch": {"operation": op, "value": value}}]}}


# -- where each form lands --------------------------------------------------------------
def test_the_traffic_role_is_the_first_http_filter_in_every_form(tmp_path):
    custom = [istio.gateway_listener(TRAFFIC_PORT, custom_authz="ext-authz")]
    assert ISTIOD == ["envoy.filters.http.rbac", "envoy.filters.http.ext_authz", "envoy.filters.http.grpc_stats",
                      "envoy.filters.http.fault", "envoy.filters.http.cors", "envoy.filters.http.router"]
    # EnvoyFilter form, Istio's and the Gateway API's: in front of a CUSTOM policy's pair too.
    for traffic, health in ((load("traffic-filter.yaml"), load("health-listener.yaml")),
                            (istio.load_one(istio.GATEWAY_API / "traffic-filter.yaml"),
                             istio.load_one(istio.GATEWAY_API / "health-listener.yaml"))):
        labels = {**istio.POD_LABELS, **traffic["spec"]["workloadSelector"]["labels"]}
        (out, _) = istio.apply_envoyfilters(custom, [traffic, health], labels=labels)
        assert names(out) == ["drain-gate", *ISTIOD]
    # WasmPlugin form: first in phase AUTHN, which a CUSTOM policy's pair precedes.
    for wp in (load("wasmplugin/traffic.yaml"), istio.load_one(istio.GATEWAY_API / "wasmplugin" / "traffic.yaml")):
        (out,) = istio.insert_wasmplugins(custom, [(wp, tmp_path / "ecds.yaml")])
        assert names(out) == [*ISTIOD[:2], istio.wasmplugin_resource_name(wp), *ISTIOD[2:]]
        # ... and ahead of another AUTHN plugin without a priority, and of every later phase.
        other = copy.deepcopy(wp)
        other["metadata"]["name"], other["spec"]["priority"] = "auth", 0
        (out,) = istio.insert_wasmplugins([istio.gateway_listener(TRAFFIC_PORT)],
                                          [(other, tmp_path / "o.yaml"), (wp, tmp_path / "ecds.yaml")])
        assert names(out)[:2] == [istio.wasmplugin_resource_name(wp), istio.wasmplugin_resource_name(other)]
    # The plain Envoy of `make run` and of the scenario rigs.
    doc = istio.load_one(istio.ENVOYFILTER / "envoy.yaml")
    (traffic_listener,) = [lst for lst in doc["static_resources"]["listeners"] if lst["name"] == "traffic"]
    assert names(traffic_listener)[0] == "drain-gate"


LUA = {"name": "team.lua", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "default_source_code": {
        "inline_string": "function envoy_on_request(h) end"}}}


def test_another_envoyfilter_gets_in_front_only_at_its_priority_applied_after_it():
    """istiod applies EnvoyFilters by ascending priority, then the root
    namespace's first, then the older, then by name: drain-gate's INSERT_FIRST at
    the highest priority is applied last, unless another EnvoyFilter of that
    same priority comes after it in that order."""
    traffic, health = load("traffic-filter.yaml"), load("health-listener.yaml")
    top = traffic["spec"]["priority"]
    assert top == 2 ** 31 - 1, "the highest int32"
    base = [istio.gateway_listener(TRAFFIC_PORT)]
    behind = [
        user_envoyfilter("first", 0, "INSERT_FIRST", LUA),
        user_envoyfilter("before-anything", top - 1, "INSERT_BEFORE", LUA),
        user_envoyfilter("before-drain-gate", 100, "INSERT_BEFORE", LUA, sub="drain-gate"),  # not there yet
    ]
    for other in behind:
        (out, _) = istio.apply_envoyfilters(base, [other, traffic, health])
        assert names(out)[0] == "drain-gate", other["metadata"]["name"]
    # The Gateway API form lives in the Gateway's namespace: one of the root
    # namespace at the same priority is applied before it.
    gw_traffic = istio.load_one(istio.GATEWAY_API / "traffic-filter.yaml")
    root = user_envoyfilter("first-in-root", top, "INSERT_FIRST", LUA, created="2026-12-02T10:00:00Z")
    root["spec"]["workloadSelector"] = gw_traffic["spec"]["workloadSelector"]
    labels = {**istio.POD_LABELS, **gw_traffic["spec"]["workloadSelector"]["labels"]}
    (out,) = istio.apply_envoyfilters(base, [gw_traffic, root], labels=labels)
    assert names(out)[0] == "drain-gate"
    # The same priority, the same (root) namespace, created later: applied after it, in front.
    later = user_envoyfilter("team-lua", top, "INSERT_FIRST", LUA, created="2026-12-02T10:00:00Z")
    traffic["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    (out, _) = istio.apply_envoyfilters(base, [later, traffic, health])
    assert names(out)[:2] == ["team.lua", "drain-gate"]
    assert [ef["metadata"]["name"] for ef in istio.envoyfilter_order([later, traffic])] == [
        "drain-gate-traffic", "team-lua"]


# -- held requests behind HAProxy ---------------------------------------------------------
# Each kind of request, and the filter that holds it: the fault filter
# (x-envoy-fault-delay-request), jwt_authn fetching the JWKS for a token, a
# CUSTOM AuthorizationPolicy's ext_authz.
KINDS = ("fault", "jwt", "authz")


def gateway(authz: AuthzServer, listeners, plugins: list[tuple[dict, dict]] = ()):
    """A bootstrap factory for the rig: what istiod sends (`listeners(ecds files)`:
    an istio.Xds) with the authorization server's cluster. `plugins`:
    WasmPlugins and their ECDS configurations, written into the gateway's
    directory."""
    def bootstrap(ports: Ports, workdir: Path) -> dict:
        workdir.mkdir(parents=True, exist_ok=True)
        files = []
        for i, (wp, ext) in enumerate(plugins):
            files.append((wp, workdir / f"ecds-{i}.yaml"))
            istio.write_ecds(files[-1][1], [ext])
        doc = istio.gateway_bootstrap(listeners(files), {TRAFFIC_PORT: ports.traffic, istio.HEALTH_PORT: ports.health},
                                      ports.admin, ports.backend, ecds_dir=workdir / "ecds")
        doc["static_resources"]["clusters"].append(authz.cluster())
        return doc
    return bootstrap


def chain(authz: AuthzServer, jwks_ms: int) -> list[dict]:
    """istiod's traffic listener with a CUSTOM policy, a RequestAuthentication
    whose JWKS takes `jwks_ms` to fetch (its rule's timeout: 30 s), and a fault
    filter that takes its delay from the request."""
    jwt = {"cluster": "ext-authz", "uri": f"http://jwks.drain-gate.test/jwks?authz_ms={jwks_ms}",
           "issuer": authz.jwt.issuer, "timeout": "30s"}
    return [istio.gateway_listener(TRAFFIC_PORT, custom_authz="ext-authz", jwt=jwt, fault_delay_header=True)]


class Held:
    """A request through HAProxy that a filter of the gateway holds, on a thread."""

    def __init__(self, rig: Rig, authz: AuthzServer, kind: str, n: int, hold_ms: int):
        self.kind, self.marker = kind, f"id={kind}{n}"
        path = f"/?{self.marker}" + (f"&authz_ms={hold_ms}" if kind == "authz" else "")
        headers = {"fault": {"x-envoy-fault-delay-request": str(hold_ms)},
                   "jwt": {"authorization": f"Bearer {authz.jwt.token()}"}}.get(kind, {})
        self.status: int | str | None = None
        self.thread = threading.Thread(target=self._run, args=(rig.url(path), headers), daemon=True)
        self.thread.start()

    def _run(self, url: str, headers: dict) -> None:
        try:
            self.status = requests.get(url, headers=headers, timeout=30).status_code
        except requests.RequestException as e:
            self.status = type(e).__name__

    def wait(self) -> None:
        self.thread.join(30)
        assert not self.thread.is_alive(), f"{self.marker} still running"


def send_held(rig: Rig, authz: AuthzServer, hold_ms: dict[str, int]) -> list[Held]:
    """One request of each kind to each gateway: HAProxy's round robin
    alternates, so each is sent once the previous one is held where it went."""
    held: list[Held] = []
    holding = {
        "fault": lambda: sum(g.envoy.stat(FAULT_STAT) or 0 for g in rig.gws),
        "jwt": lambda: authz.holding["jwks"],
        "authz": lambda: authz.holding["check"],
    }
    for kind in KINDS:
        for n in (1, 2):
            held.append(Held(rig, authz, kind, n, hold_ms[kind]))
            wait_for(lambda: holding[kind]() == n, 10, what=f"{held[-1].marker} held")
    return held


def lb_check(gw) -> int:
    return requests.get(gw.url("/health_check.html"), timeout=5).status_code


def verify_dump(gw) -> tuple[int, list[str]]:
    dump = requests.get(gw.envoy.admin("/config_dump"), timeout=10).text
    r = subprocess.run([sys.executable, str(VERIFY), "--config-dump", "-", "--health-port", str(gw.ports.health)],
                       input=dump, capture_output=True, text=True, timeout=60)
    assert not r.stderr, r.stderr
    return r.returncode, [line for line in r.stdout.splitlines() if line.startswith(("PASS first", "FAIL "))]


def drain_both(rig: Rig, counted: tuple[int, int]) -> tuple[dict, dict]:
    """What each gateway counts while the requests are held; then both drain at once."""
    gw1, gw2 = rig.gws
    # Outside a drain the count leads by its lease until the next tick gives it back.
    wait_for(lambda: (gw1.status()["active"], gw2.status()["active"]) == counted, 3,
             what=f"the gateways count {counted} of the held requests")
    assert gw1.status()["count"]["reliable"] and gw2.status()["count"]["reliable"]
    return gw1.post("/drain").json(), gw2.post("/drain").json()


def draining_while_counted(gw) -> int:
    """Until `gw` counts nothing: DRAINING, and the LB check 200, whenever a
    request is counted before and after the check. Returns how many checks."""
    seen = 0
    while (before := gw.status())["active"] > 0:
        code, after = lb_check(gw), gw.status()
        if after["active"] > 0:
            assert (before["state"], after["state"], code) == ("DRAINING", "DRAINING", 200), (before, after)
            seen += 1
        time.sleep(0.1)
    return seen


def receipt(gw, completed: int) -> tuple[int, int]:
    """Once the drain's receipt counts `completed` ends completed: (cut, cut by the LB)."""
    r = wait_for(lambda: (r := gw.status()["receipt"])["completed"] == completed and r, 3,
                 what=f"{gw.name}'s receipt: {completed} completed")
    return r["cut"], r["cut_lb"]


def served(rig: Rig, held: list[Held]) -> dict[str, tuple[str, int | str, bool]]:
    """marker -> (server, client's status, HAProxy cut it at DOWN); one of each kind on each gateway."""
    for h in held:
        h.wait()

    def logged():
        lines = {h.marker: next((r for r in rig.haproxy.requests() if h.marker in r.request), None) for h in held}
        return None not in lines.values() and lines

    # HAProxy writes a request's line as its session ends, which can come after its client saw the answer.
    logs = wait_for(logged, 5, what="HAProxy's log line of each request")
    result = {h.marker: (logs[h.marker].server, h.status, logs[h.marker].killed_by_down) for h in held}
    kinds = sorted((server, marker[3:-1]) for marker, (server, _, _) in result.items())
    assert kinds == sorted((gw, kind) for gw in ("gw1", "gw2") for kind in KINDS), result
    return result


def test_envoyfilter_form_counts_requests_held_after_it_behind_haproxy(tmp_path):
    """gw1 counts all three held requests, gw2 (before the router) none."""
    traffic, health = load("traffic-filter.yaml"), load("health-listener.yaml")
    hold = 5000  # longer than the sends, then a flip to HAProxy's DOWN (fall 2 x inter 1 s)
    with AuthzServer() as authz:
        shipped = gateway(authz, lambda _: istio.gateway_xds(chain(authz, hold), [traffic, health]))
        control = gateway(authz, lambda _: istio.gateway_xds(chain(authz, hold), [before_the_router(traffic), health]))
        with Rig(tmp_path, gateways=2, bootstraps=[shipped, control]) as rig:
            gw1, gw2 = rig.gws
            held = send_held(rig, authz, {kind: hold for kind in KINDS})
            d1, d2 = drain_both(rig, counted=(3, 0))
            assert (d1["state"], lb_check(gw1)) == ("DRAINING", 200), "gw1 counts them while they are held"
            assert (d2["state"], d2["progress"]["reason"], lb_check(gw2)) == ("CLOSING", "active_zero", 503), \
                "gw2 counts none: a false flip"
            assert draining_while_counted(gw1) >= 3
            st = wait_for(lambda: (s := gw1.status())["state"] == "CLOSING" and s, 3, what="gw1 flips after their end")
            assert (st["progress"]["reason"], st["progress"]["forced"]) == ("active_zero", False)
            for marker, (server, code, cut) in served(rig, held).items():
                assert (code, cut) == ((200, False) if server == "gw1" else (502, True)), marker
            downs = dict(rig.haproxy.down_events())
            assert "gw2" in downs and downs.get("gw1", 0) == 0, f"gw1 goes DOWN with nothing left: {downs}"
            # The receipts: gw1's three completed. gw2 counted none of its three while they were held, yet its
            # receipt has them as the LB's cuts: Envoy creates a wasm filter's stream at the access log of a
            # stream that never reached it.
            assert (receipt(gw1, completed=3), receipt(gw2, completed=0)) == ((0, 0), (3, 3))
            code, lines = verify_dump(gw1)
            assert code == 0 and lines == [f"PASS first filter: listener 0.0.0.0_{TRAFFIC_PORT}: drain-gate is "
                                           "the first HTTP filter"], lines
            code, lines = verify_dump(gw2)
            assert code == 1 and len(lines) == 1 and lines[0].startswith(
                f"FAIL first filter: listener 0.0.0.0_{TRAFFIC_PORT}: before drain-gate: envoy.filters.http.rbac, "
                "envoy.filters.http.ext_authz, envoy.filters.http.jwt_authn, envoy.filters.http.grpc_stats, "
                "envoy.filters.http.fault, envoy.filters.http.cors; envoy.filters.http.ext_authz, "
                "envoy.filters.http.jwt_authn, envoy.filters.http.fault can hold a request"), lines
            assert "an older chart, or another EnvoyFilter of that priority applied after it" in lines[0]


def test_wasmplugin_form_counts_requests_held_after_it_behind_haproxy(tmp_path):
    """gw1 (phase AUTHN) counts the fault- and the JWKS-held requests; gw2
    (UNSPECIFIED_PHASE, before grpc_stats) only the fault-held one; neither the
    one a CUSTOM policy's ext_authz holds, which stands before every phase."""
    wp, health = load("wasmplugin/traffic.yaml"), load("wasmplugin/health-listener.yaml")
    old = copy.deepcopy(wp)
    old["spec"]["phase"] = "UNSPECIFIED_PHASE"  # where the chart had it
    del old["spec"]["priority"]
    # gw2 flips when its fault-held request ends; the JWKS-held one outlasts that
    # flip's DOWN, gw1 flips after it, and the authorization-held one outlasts gw1's DOWN.
    hold = {"fault": 1500, "jwt": 6000, "authz": 10000}
    with AuthzServer() as authz:
        def form(plugin: dict):
            return gateway(authz, lambda files: istio.gateway_xds(
                istio.insert_wasmplugins(chain(authz, hold["jwt"]), files), [health]),
                [(plugin, istio.wasmplugin_extension_config(plugin, WASM))])
        with Rig(tmp_path, gateways=2, bootstraps=[form(wp), form(old)]) as rig:
            gw1, gw2 = rig.gws
            held = send_held(rig, authz, hold)
            d1, d2 = drain_both(rig, counted=(2, 1))
            assert (d1["state"], d2["state"], lb_check(gw1), lb_check(gw2)) == ("DRAINING", "DRAINING", 200, 200)
            assert draining_while_counted(gw1) >= 3
            wait_for(lambda: gw1.status()["state"] == "CLOSING", 3, what="gw1 flips after the JWKS-held request")
            expected = {"gw1": {"fault": 200, "jwt": 200, "authz": 502},
                        "gw2": {"fault": 200, "jwt": 502, "authz": 502}}
            for marker, (server, code, cut) in served(rig, held).items():
                want = expected[server][marker[3:-1]]
                assert (code, cut) == (want, want == 502), (marker, server)
            assert (receipt(gw1, completed=2), receipt(gw2, completed=1)) == ((1, 1), (2, 2))
            code, lines = verify_dump(gw1)
            assert code == 1 and len(lines) == 1 and lines[0].startswith(
                f"FAIL first filter: listener 0.0.0.0_{TRAFFIC_PORT}: before drain-gate: envoy.filters.http.rbac, "
                "envoy.filters.http.ext_authz; envoy.filters.http.ext_authz can hold a request"), lines
            assert "the WasmPlugin form cannot come first" in lines[0] and "use the EnvoyFilter form" in lines[0]
            code, lines = verify_dump(gw2)
            assert code == 1 and len(lines) == 1 and "envoy.filters.http.ext_authz, envoy.filters.http.jwt_authn can " \
                "hold a request" in lines[0], lines


def test_verify_names_an_envoyfilter_in_front_of_the_gateway_api_form(start_gateway):
    """The Gateway API form's traffic filter with another team's ext_authz
    EnvoyFilter of the same priority, created after it in its namespace: in
    front, and verify.py says so."""
    traffic = istio.load_one(istio.GATEWAY_API / "traffic-filter.yaml")
    health = istio.load_one(istio.GATEWAY_API / "health-listener.yaml")
    traffic["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    ext_authz = istio.custom_authz_filters("ext-authz")[1]
    del ext_authz["typed_config"]["filter_enabled_metadata"]
    other = user_envoyfilter("team-authz", traffic["spec"]["priority"], "INSERT_FIRST", ext_authz,
                             namespace=traffic["metadata"]["namespace"], created="2026-12-02T10:00:00Z")
    other["spec"]["workloadSelector"] = traffic["spec"]["workloadSelector"]
    labels = {**istio.POD_LABELS, **traffic["spec"]["workloadSelector"]["labels"]}
    xds = istio.gateway_xds([istio.gateway_listener(TRAFFIC_PORT)], [traffic, health, other], labels=labels)
    assert names(xds.listeners[0])[:2] == ["envoy.filters.http.ext_authz", "drain-gate"]
    env = start_gateway(istio.ENVOY_MATRIX[-1], xds)
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 1 and [line for line in lines if line.startswith("FAIL ")] == [
        f"FAIL first filter: listener 0.0.0.0_{TRAFFIC_PORT}: before drain-gate: envoy.filters.http.ext_authz; "
        "envoy.filters.http.ext_authz can hold a request, which is not counted until it is let go, and a drain "
        "begun meanwhile flips with it in flight (the drain-gate chart inserts the traffic filter first "
        "(INSERT_FIRST at priority 2147483647): an older chart, or another EnvoyFilter of that priority applied "
        "after it, put these in front)"], lines


def test_verify_passes_a_filter_in_front_that_never_holds(start_gateway, tmp_path):
    """Every EnvoyFilter patch lands after the WasmPlugin phases: another team's
    RBAC inserted first stands in front of the WasmPlugin form. RBAC decides at
    once, so verify.py passes the chain, naming it."""
    wp, health = load("wasmplugin/traffic.yaml"), load("wasmplugin/health-listener.yaml")
    rbac = {"name": "team.rbac", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.rbac."
                                                           "v3.RBAC", "rules": {"action": "DENY"}}}
    ecds = tmp_path / "ecds.yaml"
    istio.write_ecds(ecds, [istio.wasmplugin_extension_config(wp, WASM)])
    xds = istio.gateway_xds(istio.insert_wasmplugins([istio.gateway_listener(TRAFFIC_PORT)], [(wp, ecds)]),
                            [user_envoyfilter("team-rbac", 0, "INSERT_FIRST", rbac), health])
    assert names(xds.listeners[0])[:2] == ["team.rbac", istio.wasmplugin_resource_name(wp)]
    env = start_gateway(istio.ENVOY_MATRIX[-1], xds)
    code, lines = verify("--config-dump", "-", stdin=dump_of(env))
    assert code == 0 and f"PASS first filter: listener 0.0.0.0_{TRAFFIC_PORT}: before drain-gate only team.rbac, " \
        "which never hold a request (team.rbac decides at once: continues, or answers 403 itself)" in lines, lines
