"""envoyfilter/istio/ run in real Envoy 1.36, 1.38 and 1.40, in a bootstrap that
mimics an Istio ingress gateway (tests/harness/istio/): each patch value is
taken from its YAML file and used as written (only ports and the wasm path are
substituted).

- EnvoyFilter form: the :18180 listener answers the FSM — including HAProxy's
  real health check request, byte for byte — the traffic filter counts the
  streams of every traffic listener, the preStop command of the gateway
  values drains and returns at CLOSED, the probes read what they should.
- WasmPlugin form: the traffic roles as istiod + istio-agent deliver them
  (ECDS, vm_id "", the mounted module of a file:// url, or the module pulled
  out of the image `make oci` builds for the oci:// route) with the vm_id ""
  health listener: the count reaches the health FSM and the flip happens; the
  NETWORK plugin counts a TCP server's connection as the TCP EnvoyFilter does;
  a canary pod stays counted whether or not its image could be fetched.
- The mismatch the README warns about: WasmPlugin traffic role with the
  EnvoyFilter-form health listener (vm_id "drain-gate"): no traffic role in the
  health role's vm_id, so the gateway is never announced (LB check and
  readiness 503), the count is distrusted and a drain only closes at
  drain_timeout.
- Distroless: /prestop authorized by the distroless gateway values' literal bearer header,
  with the token the chart renders into the health listener.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import re
import socket
import subprocess
import threading
import time

import pytest
import requests
import yaml

from tests.harness import istio, k8s
from tests.harness.envoy import WASM, Envoy, free_port, hcm, wait_for
from tests.harness.wire import KeepAlive, read_head, status

VERSIONS = istio.ENVOY_MATRIX


# -- helpers ---------------------------------------------------------------------------
def raw(port: int, request: bytes, timeout: float = 5) -> tuple[str, bytes]:
    """Sends `request` as is, reads one response (its content-length, or until
    the server closes) and closes, as an LB checker does: (status line, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while True:
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?im)^content-length:\s*(\d+)\r?$", head)
                if m and len(body) >= int(m.group(1)):
                    break
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(), body


def lb_check(env) -> tuple[str, bytes]:
    return raw(env.ports.health, istio.HAPROXY_HTTPCHK)


def load(rel: str) -> dict:
    return istio.load_one(istio.ISTIO / rel)


def patched(ef: dict, **config) -> dict:
    """The health EnvoyFilter with keys merged into its plugin configuration."""
    ef = copy.deepcopy(ef)
    plugin = istio.plugin_config(ef)
    merged = json.loads(plugin["configuration"]["value"])
    merged.update(config)
    plugin["configuration"]["value"] = json.dumps(merged, separators=(",", ":"))
    return ef


@contextlib.contextmanager
def held_call(command: list[str]):
    """A preStop command running in the background; killed if still held on exit."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _oci_tool():
    spec = importlib.util.spec_from_file_location("oci_image", istio.ENVOYFILTER / "tools" / "oci_image.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def start_gateway(backend_port, tmp_path, monkeypatch):
    """Factory: start_gateway(version, xds) -> a started Envoy running what
    istiod sends (`istio.Xds`: listeners and ECDS resources, or listeners
    alone); `env.at` maps each logical listener port to the actual one,
    `env.ecds_dir` is where its ECDS files are; `admin_address` is where its
    admin (and the bootstrap's prometheus_stats cluster) listens. Stopped on
    every path."""
    stack = contextlib.ExitStack()

    def start(version: str, xds, wasm=WASM, ready_path: str | None = "/live",
              clusters: list[dict] = (), admin_address: str = "127.0.0.1", stats_config: dict | None = None) -> Envoy:
        monkeypatch.setenv("ENVOY_BIN", istio.envoy_bin(version))
        xds = xds if isinstance(xds, istio.Xds) else istio.Xds(xds)
        at = {l["address"]["socket_address"]["port_value"]: free_port() for l in xds.listeners}
        admin = free_port(admin_address)
        workdir = tmp_path / f"envoy-{admin}"
        doc = istio.gateway_bootstrap(xds, at, admin, backend_port, wasm, clusters, admin_address, workdir / "ecds")
        if stats_config is not None:
            doc["stats_config"] = stats_config
        traffic = min(p for p in at if p != istio.HEALTH_PORT)
        env = Envoy(doc, istio.harness_ports(at, admin, backend_port, traffic), concurrency=2, workdir=workdir)
        env.at, env.ecds_dir = at, workdir / "ecds"
        stack.callback(env.stop)
        if ready_path:
            env.start(timeout=60)
        else:  # the harness's readiness check asks /live on :18180; poll the admin only
            env.start(wait_ready=False)
            wait_for(env.admin_ready, 60, interval=0.05, what="envoy admin /ready")
        version_seen = requests.get(env.admin("/server_info"), timeout=5).json()["version"]
        assert f"/{version}/" in version_seen, version_seen
        return env

    with stack:
        yield start


@pytest.fixture(scope="module")
def pulled_wasm(tmp_path_factory):
    """The module as istio-agent gets it for the WasmPlugin: built into the OCI
    image by envoyfilter/tools/oci_image.py, then taken out of it the way
    pkg/wasm/imagefetcher.go does, into istio-agent's cache directory."""
    tmp = tmp_path_factory.mktemp("istio-agent")
    tag = "0.1.0"
    digests = _oci_tool().build(WASM.read_bytes(), tmp / "oci", tag)
    module = istio.istio_extract_compat(tmp / "oci" / "drain-gate", tag)
    path = tmp / "cache" / f"{digests['manifest'].split(':')[1]}.wasm"
    path.parent.mkdir()
    path.write_bytes(module)
    return path


# -- what HAProxy sends ------------------------------------------------------------------
def test_haproxy_httpchk_request_on_the_wire(tmp_path):
    """A real haproxy (2.6 from Debian) with haproxy.cfg's `option httpchk GET
    /health_check.html`: capture the check request it writes."""
    got: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(15)
    port = srv.getsockname()[1]

    def accept():
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            got.append(read_head(conn))
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        "defaults\n  mode http\n  timeout connect 1s\n  timeout client 5s\n  timeout server 5s\n"
        f"frontend fe\n  bind 127.0.0.1:{free_port()}\n  default_backend be\n"
        "backend be\n  option httpchk GET /health_check.html\n  http-check expect status 200\n"
        f"  server gw 127.0.0.1:9 check port {port} inter 200ms rise 2 fall 2\n"
    )
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        t.join(15)
        assert got, f"haproxy sent no check: {proc.stderr.read1().decode() if proc.poll() is not None else ''}"
    finally:
        proc.terminate()
        proc.wait(10)
        srv.close()
    version = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout
    assert "version 2." in version
    # HTTP/1.0, no Host, no other header: what the health listener must answer.
    assert got[0] == istio.HAPROXY_HTTPCHK


# -- where istiod puts the patches ---------------------------------------------------------
def _names(listener):
    return [f["name"] for f in hcm(listener)["http_filters"]]


def test_patches_land_where_istiod_puts_them():
    traffic, health = load("traffic-filter.yaml"), load("health-listener.yaml")
    base = [istio.gateway_listener(8080), istio.gateway_listener(8443), istio.gateway_listener(15443, tcp=True)]
    out = {l["name"]: l for l in istio.apply_envoyfilters(base, [traffic, health])}
    counted = ["drain-gate", *(f["name"] for f in istio.gateway_http_filters())]
    assert counted == ["drain-gate", "envoy.filters.http.grpc_stats", "envoy.filters.http.fault",
                       "envoy.filters.http.cors", "envoy.filters.http.router"]
    assert _names(out["0.0.0.0_8080"]) == counted
    assert _names(out["0.0.0.0_8443"]) == counted
    assert out["0.0.0.0_15443"] == base[2], "a TCP listener has no HTTP filter chain to count on"
    # The health listener is added after the patches, unpatched (listener_patch.go).
    assert out["drain-gate-health"] == health["spec"]["configPatches"][0]["patch"]["value"], "added as written"
    # A gateway without the selected labels gets nothing.
    assert istio.apply_envoyfilters(base, [traffic, health], labels={"istio": "other"}) == base


def test_tcp_patch_lands_before_tcp_proxy_and_only_there():
    traffic, tcp, health = load("traffic-filter.yaml"), load("tcp-filter.yaml"), load("health-listener.yaml")
    base = [istio.gateway_listener(8080), istio.gateway_listener(15443, tcp=True)]
    out = {l["name"]: l for l in istio.apply_envoyfilters(base, [traffic, tcp, health])}
    names = [f["name"] for f in out["0.0.0.0_15443"]["filter_chains"][0]["filters"]]
    assert names == ["drain-gate-tcp", "envoy.filters.network.tcp_proxy"]
    assert [f["name"] for f in out["0.0.0.0_8080"]["filter_chains"][0]["filters"]] == [istio.HCM_NAME]
    assert _names(out["0.0.0.0_8080"]) == _names(istio.apply_envoyfilters(base, [traffic])[0])
    assert out["drain-gate-health"] == health["spec"]["configPatches"][0]["patch"]["value"], "not matched"
    assert istio.apply_envoyfilters(base, [tcp], labels={"istio": "other"}) == base


def tcp_connection_holds_the_drain(env, port: int = 15443) -> None:
    """A connection through the TCP server on `port` (tcp_proxy to the backend)
    is counted and holds the drain; its close flips it."""
    conn = socket.create_connection(("127.0.0.1", env.at[port]), timeout=10)
    try:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: backend\r\n\r\n")
        assert read_head(conn).startswith(b"HTTP/1.1 200 OK"), "tcp_proxy carries the bytes"
        wait_for(lambda: status(env)["count"]["tcp_connections"] == 1, 10, what="the connection counted")
        st = status(env)
        assert (st["active"], st["count"]["http_streams"], st["count"]["reliable"]) == (1, 0, True)
        assert requests.post(env.health("/drain"), timeout=5).json()["state"] == "DRAINING"
        for _ in range(5):
            assert lb_check(env)[0] == "HTTP/1.0 200 OK"
    finally:
        conn.close()
    wait_for(lambda: lb_check(env)[0] == "HTTP/1.0 503 Service Unavailable", 5, what="flip on the close")
    st = status(env)
    assert st["state"] == "CLOSING" and st["progress"]["reason"] == "active_zero"
    assert st["progress"]["forced"] is False


@pytest.mark.parametrize("version", VERSIONS)
def test_tcp_patch_counts_a_passthrough_connection_and_flips_on_its_close(version, start_gateway):
    """The three EnvoyFilters as written: a connection through the TCP server
    (tcp_proxy to the backend) holds the drain; its close flips it."""
    listeners = istio.gateway_xds(
        [istio.gateway_listener(8080), istio.gateway_listener(15443, tcp=True)],
        [load("traffic-filter.yaml"), load("tcp-filter.yaml"), patched(load("health-listener.yaml"), lb_buffer="60m")],
    )
    env = start_gateway(version, listeners)
    tcp_connection_holds_the_drain(env)


# -- EnvoyFilter form ---------------------------------------------------------------------
# What each form of Envoy's drain_listeners admin call does to a gateway
# (--drain-strategy immediate, --drain-time-s 1, as the harness starts Envoy):
# (the next response on a keep-alive connection, a new traffic connection at
# +0.5 s and at +2.5 s, the health listener at +2.5 s, a 3 s stream in flight).
# drain-gate sends only the first form; the other two stop the health listener
# with the traffic ones, which is why the README warns against them.
ADMIN_DRAIN_FORMS = {
    "/drain_listeners?graceful&skip_exit": ("close", "accepted", "accepted", "200", "completes"),
    "/drain_listeners": ("close", "refused", "refused", "refused", "completes"),
    "/drain_listeners?graceful": ("close", "accepted", "refused", "refused", "completes"),
}

# Before 1.40 a plain drain_listeners stops the listeners without starting the
# drain sequence: a keep-alive connection is not told to close.
ADMIN_DRAIN_BEFORE_1_40 = {"/drain_listeners": (None, "refused", "refused", "refused", "completes")}


def expected_drain_form(version: str, form: str) -> tuple:
    major_minor = tuple(int(x) for x in version.split(".")[:2])
    if major_minor < (1, 40) and form in ADMIN_DRAIN_BEFORE_1_40:
        return ADMIN_DRAIN_BEFORE_1_40[form]
    return ADMIN_DRAIN_FORMS[form]


def _accepts(url: str) -> str:
    try:
        return "accepted" if requests.get(url, timeout=3).status_code == 200 else "error"
    except requests.ConnectionError:
        return "refused"


def _health_answer(env) -> str:
    try:
        return lb_check(env)[0].split()[1]
    except OSError:
        return "refused"


@pytest.mark.parametrize("form", list(ADMIN_DRAIN_FORMS))
@pytest.mark.parametrize("version", VERSIONS)
def test_admin_drain_forms_behave_as_documented(version, form, start_gateway, stream):
    """Catches an Envoy upgrade that changes what the three forms do."""
    efs = [load("traffic-filter.yaml"),
           patched(load("health-listener.yaml"), min_drain="30m", drain_timeout="60m", rotate_connections=False)]
    env = start_gateway(version, istio.gateway_xds([istio.gateway_listener(8080)], efs))
    s = stream(env.traffic("/stream?seconds=3&interval_ms=500"))
    wait_for(lambda: status(env)["active"] == 1, 10, what="the stream counted")
    client = KeepAlive(env.ports.traffic)
    try:
        assert client.get() is None
        t0 = time.monotonic()
        assert requests.post(env.admin(form), timeout=5).status_code == 200
        keepalive = client.get()
    finally:
        client.close()
    time.sleep(max(0.0, t0 + 0.5 - time.monotonic()))
    early = _accepts(env.traffic("/"))
    time.sleep(max(0.0, t0 + 2.5 - time.monotonic()))
    late, health = _accepts(env.traffic("/")), _health_answer(env)
    streamed = "completes" if s.wait(30) == 0 and s.chunks == 6 else f"lost ({s.chunks} chunks)"
    seen = (keepalive, early, late, health, streamed)
    assert seen == expected_drain_form(version, form), seen


def _rotation_outcome(env) -> dict:
    return wait_for(lambda: (r := status(env)["connection_rotation"]["last"]) and r["outcome"] != "pending" and r,
                    10, what="the rotation's outcome")


def _drain_and_flip(env) -> None:
    """A drain answering 200 rotates at its flip: drain, then flip at once (`/close-lb`)."""
    assert requests.post(env.health("/drain"), timeout=10).status_code == 200
    assert status(env)["connection_rotation"]["last"] is None, "no rotation while the LB still sends here"
    assert requests.post(env.health("/close-lb"), timeout=10).status_code == 200


@pytest.mark.parametrize("version", VERSIONS)
def test_envoyfilter_form_rotates_connections_at_the_flip(version, start_gateway):
    """The health listener as shipped rotates through the bootstrap's
    prometheus_stats cluster (the EnvoyFilters add none): after the flip a
    keep-alive connection is closed after its next response, and the health
    listener keeps answering."""
    efs = [load("traffic-filter.yaml"), patched(load("health-listener.yaml"), min_drain="30m", drain_timeout="60m")]
    assert istio.added_clusters(efs) == []
    env = start_gateway(version, istio.gateway_xds([istio.gateway_listener(8080)], efs))
    client = KeepAlive(env.ports.traffic)
    try:
        assert client.get() is None
        _drain_and_flip(env)
        last = _rotation_outcome(env)
        assert (last["outcome"], last["admin_status"], last["trigger"]) == ("done", 200, "flip"), last
        assert status(env)["connection_rotation"]["cluster"] == "prometheus_stats"
        assert client.get() == "close"
    finally:
        client.close()
    assert requests.get(env.traffic("/"), timeout=5).status_code == 200
    assert lb_check(env)[0].startswith("HTTP/1.0 503"), "CLOSING: the health listener answers, 503"


# The admin cluster the chart used to add: istio-proxy's admin at a fixed 127.0.0.1:15000.
FIXED_ADMIN_CLUSTER = {
    "name": "drain_gate_envoy_admin", "type": "STATIC", "connect_timeout": "1s",
    "load_assignment": {"cluster_name": "drain_gate_envoy_admin", "endpoints": [{"lb_endpoints": [{"endpoint": {
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": istio.ISTIO_ADMIN_PORT}}}}]}]},
}


@pytest.mark.parametrize("version", VERSIONS)
def test_rotation_reaches_an_admin_on_ipv6_loopback_only(version, start_gateway):
    """An IPv6-only pod: istio-proxy's bootstrap binds the admin to ::1 (its
    {{ .localhost }}), and prometheus_stats dials ::1 too. The shipped health
    listener rotates through it; a cluster fixed at 127.0.0.1 (the chart's
    former CLUSTER ADD, here at the admin's own port) finds nothing there."""
    health = patched(load("health-listener.yaml"), min_drain="30m", drain_timeout="60m")
    listeners = istio.gateway_xds([istio.gateway_listener(8080)], [load("traffic-filter.yaml"), health])
    env = start_gateway(version, listeners, clusters=[FIXED_ADMIN_CLUSTER], admin_address="::1")
    assert env.admin("/ready").startswith("http://[::1]:") and requests.get(env.admin("/ready"), timeout=5).ok
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{env.ports.admin}/ready", timeout=5)
    client = KeepAlive(env.ports.traffic)
    try:
        assert client.get() is None
        _drain_and_flip(env)
        last = _rotation_outcome(env)
        assert (last["outcome"], last["admin_status"]) == ("done", 200), last
        assert client.get() == "close"
    finally:
        client.close()
    # The control: the same listener naming the fixed cluster.
    fixed = istio.gateway_xds([istio.gateway_listener(8080)], [
        load("traffic-filter.yaml"), patched(health, rotate_connections=FIXED_ADMIN_CLUSTER["name"])])
    env = start_gateway(version, fixed, clusters=[FIXED_ADMIN_CLUSTER], admin_address="::1")
    _drain_and_flip(env)
    last = _rotation_outcome(env)
    assert last["outcome"] == "failed" and last["admin_status"] != 200, last


@pytest.mark.parametrize("version", VERSIONS)
def test_envoyfilter_form_counts_flips_and_prestop_returns_at_closed(version, start_gateway, stream):
    listeners = istio.gateway_xds(
        [istio.gateway_listener(8080), istio.gateway_listener(8443)],
        [load("traffic-filter.yaml"), load("health-listener.yaml")],
    )
    env = start_gateway(version, listeners)

    line, body = lb_check(env)
    assert (line, body) == ("HTTP/1.0 200 OK", b"OK\n")
    # a NetScaler-style HTTP/1.1 check with Host is answered too
    line, _ = raw(env.ports.health, b"GET /health_check.html HTTP/1.1\r\nHost: 203.0.113.213\r\nConnection: close\r\n\r\n")
    assert line == "HTTP/1.1 200 OK"
    # ... and without Host, HTTP/1.1 is refused by Envoy: the NetScaler monitor must send one
    line, _ = raw(env.ports.health, b"GET /health_check.html HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert line == "HTTP/1.1 400 Bad Request"

    streams = [stream(f"http://127.0.0.1:{env.at[p]}/stream?seconds=3&interval_ms=250") for p in (8080, 8443)]
    wait_for(lambda: status(env)["active"] == 2, 10, what="both traffic listeners counted")
    assert status(env)["count"]["reliable"] is True

    # The gateway values' preStop (as written but for the port) and readiness;
    # the patches for a gateway without the chart carry the same.
    proxy = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    command = [a.replace(":18180/", f":{env.ports.health}/") for a in proxy["lifecycle"]["preStop"]["exec"]["command"]]
    with held_call(command) as prestop:
        wait_for(lambda: status(env)["state"] == "DRAINING", 5, what="DRAINING")
        held_200 = 0
        while any(s.running() for s in streams):
            before = status(env)
            line, _ = lb_check(env)
            after = status(env)
            if before["state"] == after["state"] == "DRAINING" and after["active"] > 0:
                assert line == "HTTP/1.0 200 OK", (before, after)
                held_200 += 1
            time.sleep(0.1)
        assert held_200 >= 3, "the LB kept seeing 200 while requests were in flight"
        for s in streams:
            assert s.wait(10) == 0 and s.chunks == 12, s.err

        wait_for(lambda: lb_check(env)[0] == "HTTP/1.0 503 Service Unavailable", 2, what="LB flip to 503")
        st = status(env)
        assert st["state"] == "CLOSING"
        assert st["progress"]["reason"] == "active_zero" and st["progress"]["forced"] is False
        assert st["progress"]["active_at_closing"] == 0
        assert lb_check(env)[1] == b"DRAIN\n"
        assert requests.get(env.health(proxy["readinessProbe"]["httpGet"]["path"]), timeout=5).status_code == 200
        assert requests.get(env.health("/live"), timeout=5).status_code == 200

        lb_buffer = st["progress"]["lb_buffer_ms"] / 1000
        out, err = prestop.communicate(timeout=lb_buffer + 10)
        assert prestop.returncode == 0, err
        assert json.loads(out)["state"] == "CLOSED"

    st = status(env)
    assert st["state"] == "CLOSED"
    assert requests.get(env.health(proxy["readinessProbe"]["httpGet"]["path"]), timeout=5).status_code == 503
    assert requests.get(env.health("/live"), timeout=5).status_code == 200
    assert lb_check(env)[0] == "HTTP/1.0 503 Service Unavailable"

    # The grace period arithmetic of gateway-values.yaml, against the plan the
    # running filter reports.
    values = istio.load_one(istio.KUBERNETES / "gateway-values.yaml")
    assert_grace_covers_the_drain(st["progress"], command, values["terminationGracePeriodSeconds"],
                                  values["podAnnotations"]["proxy.istio.io/config"])


def assert_grace_covers_the_drain(progress: dict, command: list[str], grace: int, proxy_config: str) -> None:
    """The pod's grace period holds curl's --max-time, which holds the preStop
    call's own limit (drain_timeout + lb_buffer + 5 s, from the running
    filter's plan), plus pilot-agent's terminationDrainDuration after SIGTERM."""
    drain_duration = int(re.search(r"terminationDrainDuration:\s*(\d+)s", proxy_config).group(1))
    hold = (progress["drain_timeout_ms"] + progress["lb_buffer_ms"]) / 1000 + 5
    max_time = float(command[command.index("--max-time") + 1])
    assert hold <= max_time, "curl gives up before drain-gate answers"
    assert max_time + drain_duration <= grace, "the kubelet kills the pod before the drain ends"


# -- WasmPlugin form ------------------------------------------------------------------------
def local_module(wp: dict, pulled=None):
    """What Envoy loads for a WasmPlugin: a file:// url names the module the pod
    mounts (the harness substitutes the built module, as for the EnvoyFilters);
    an oci:// one, the module istio-agent pulled (`pulled`)."""
    if wp["spec"]["url"].startswith("file://"):
        assert wp["spec"]["url"] == "file://" + istio.load_one(k8s.CHART / "values.yaml")["wasm"]["path"]
        return WASM
    assert pulled is not None, f"{wp['spec']['url']}: the test needs the pulled module"
    return pulled


def _wasmplugin_gateway(tmp_path, health_ef: dict, listeners: list[dict], plugins: list[tuple[dict, dict]],
                        labels: dict = istio.POD_LABELS, server_ports: dict[str, int] | None = None,
                        envoyfilters: list[dict] = ()) -> istio.Xds:
    """`listeners` with each WasmPlugin's ECDS filter where istiod puts it, for
    the pod with `labels`, then the health EnvoyFilter and `envoyfilters`
    applied (their configuration over ECDS too). `plugins`: (WasmPlugin, the TypedExtensionConfig Envoy receives
    for it), one ECDS file each (Envoy takes one resource per filter
    subscription; a filter an EnvoyFilter replaced by istiod's own entry reads
    the same file instead of ADS); `server_ports`: see `istio.insert_wasmplugin`."""
    paths, files = {}, []
    for i, (wp, ext) in enumerate(plugins):
        if not istio.selects_workload(wp, wp["metadata"]["namespace"], labels):
            continue
        ecds = tmp_path / f"ecds-{i}.yaml"
        istio.write_ecds(ecds, [ext])
        paths[istio.wasmplugin_resource_name(wp)] = ecds
        files.append((wp, ecds))
    xds = istio.gateway_xds(istio.insert_wasmplugins(listeners, files, server_ports), [health_ef, *envoyfilters],
                            labels=labels)
    return istio.Xds(istio.ecds_over_files(xds.listeners, paths), xds.extensions)


def _wasmplugin_listeners(tmp_path, health_ef: dict, module=None, wp: dict | None = None,
                          labels: dict = istio.POD_LABELS, port: int = 8080) -> istio.Xds:
    wp = wp or load("wasmplugin/traffic.yaml")
    ext = istio.wasmplugin_extension_config(wp, module or local_module(wp))
    return _wasmplugin_gateway(tmp_path, health_ef, [istio.gateway_listener(port)], [(wp, ext)], labels)


def _oci_wasmplugin(url: str = "oci://registry.example.com/drain-gate/drain-gate:0.1.0", **sets) -> dict:
    (wp,) = k8s.template("--set", "wasm.configMap.create=false", "--set", "form=wasmplugin", "--set",
                         f"wasmPlugin.url={url}", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
                         "--show-only", "templates/wasmplugin.yaml")
    return wp


def _count_flips_at_zero(env, stream, port: int, per_stream: int = 1) -> None:
    """A stream through `port` counted (`per_stream` times: one per traffic filter),
    a drain held while it runs, the flip when it ends."""
    assert lb_check(env)[0] == "HTTP/1.0 200 OK"
    s = stream(f"http://127.0.0.1:{env.at[port]}/stream?seconds=2&interval_ms=250")
    wait_for(lambda: status(env)["active"] == per_stream, 10, what="the WasmPlugin's stream counted")
    assert status(env)["count"]["reliable"] is True
    assert env.stat("wasmcustom.drain_gate_count_unreliable") == 0
    assert requests.post(env.health("/drain"), timeout=5).status_code == 200
    assert lb_check(env)[0] == "HTTP/1.0 200 OK"
    assert s.wait(10) == 0 and s.chunks == 8
    ended = time.monotonic()
    wait_for(lambda: lb_check(env)[0] == "HTTP/1.0 503 Service Unavailable", 2, what="LB flip to 503")
    assert time.monotonic() - ended < 2
    st = status(env)
    assert st["progress"]["reason"] == "active_zero" and st["progress"]["forced"] is False


@pytest.mark.parametrize("version", VERSIONS)
def test_wasmplugin_form_count_reaches_the_health_fsm(version, start_gateway, stream, tmp_path):
    """The WasmPlugin as shipped (file://: the mounted module) with the vm_id "" health listener."""
    env = start_gateway(version, _wasmplugin_listeners(tmp_path, load("wasmplugin/health-listener.yaml")))
    _count_flips_at_zero(env, stream, 8080)


@pytest.mark.parametrize("version", VERSIONS)
def test_wasmplugin_oci_route_count_reaches_the_health_fsm(version, start_gateway, stream, tmp_path, pulled_wasm):
    """wasmPlugin.url=oci://…: the module istio-agent takes out of the image `make oci` builds."""
    wp = _oci_wasmplugin()
    env = start_gateway(version, _wasmplugin_listeners(tmp_path, load("wasmplugin/health-listener.yaml"),
                                                       local_module(wp, pulled_wasm), wp))
    _count_flips_at_zero(env, stream, 8080)


def passthrough() -> tuple[dict, dict[str, int]]:
    """The example's TLS-passthrough server as istiod builds it (a tcp_proxy
    chain on the listener 8443, for the Gateway server on 443), and the server
    port its NETWORK plugin match is compared with."""
    listener = istio.gateway_listener(istio.PASSTHROUGH_LISTENER_PORT, tcp=True)
    return listener, {listener["name"]: istio.PASSTHROUGH_SERVER_PORT}


def _tcp_gateway(tmp_path, tcp: dict | None = None, health: dict | None = None) -> istio.Xds:
    """An HTTP listener (8080) and the passthrough server (443 -> 8443) with the
    WasmPlugin form: the HTTP plugin, the NETWORK plugin `tcp` (default
    wasmplugin/tcp.yaml), the health listener."""
    wp, tcp = load("wasmplugin/traffic.yaml"), tcp or load("wasmplugin/tcp.yaml")
    plugins = [(p, istio.wasmplugin_extension_config(p, local_module(p))) for p in (wp, tcp)]
    listener, server_ports = passthrough()
    return _wasmplugin_gateway(tmp_path, health or load("wasmplugin/health-listener.yaml"),
                               [istio.gateway_listener(8080), listener], plugins, server_ports=server_ports)


def test_wasmplugin_tcp_plugin_lands_before_tcp_proxy_on_its_server_port_only(tmp_path):
    """The example's tcp.yaml names the passthrough server's port (443): istiod
    puts the plugin on that server's tcp_proxy chain, whose listener is 8443,
    and on no HTTP chain. Named by the listener's port (8443) instead, it
    reaches no TCP chain; without a match it reaches the HTTP chain too."""
    tcp_name = istio.wasmplugin_resource_name(load("wasmplugin/tcp.yaml"))
    assert tcp_name == "extensions.istio.io/trafficextension/istio-system.drain-gate-tcp~istio-translated-wasmplugin"
    assert load("wasmplugin/tcp.yaml")["spec"]["match"] == [{"ports": [{"number": istio.PASSTHROUGH_SERVER_PORT}]}]
    listeners = {l["name"]: l for l in _tcp_gateway(tmp_path).listeners}
    tcp_chain = [f["name"] for f in listeners["0.0.0.0_8443"]["filter_chains"][0]["filters"]]
    assert tcp_chain == [tcp_name, "envoy.filters.network.tcp_proxy"]
    assert [f["name"] for f in listeners["0.0.0.0_8080"]["filter_chains"][0]["filters"]] == [istio.HCM_NAME]
    by_listener_port = copy.deepcopy(load("wasmplugin/tcp.yaml"))
    by_listener_port["spec"]["match"] = [{"ports": [{"number": istio.PASSTHROUGH_LISTENER_PORT}]}]
    chain = {l["name"]: l for l in _tcp_gateway(tmp_path, by_listener_port).listeners}["0.0.0.0_8443"]["filter_chains"][0]
    assert [f["name"] for f in chain["filters"]] == ["envoy.filters.network.tcp_proxy"], "uncounted"
    unmatched = copy.deepcopy(load("wasmplugin/tcp.yaml"))
    del unmatched["spec"]["match"]
    http_chain = {l["name"]: l for l in _tcp_gateway(tmp_path, unmatched).listeners}["0.0.0.0_8080"]["filter_chains"][0]
    assert [f["name"] for f in http_chain["filters"]] == [tcp_name, istio.HCM_NAME]


@pytest.mark.parametrize("version", VERSIONS)
def test_wasmplugin_tcp_plugin_counts_a_passthrough_connection_and_flips_on_its_close(version, start_gateway,
                                                                                        tmp_path):
    """The NETWORK WasmPlugin as istiod + istio-agent deliver it (ECDS network
    filter, vm_id "", the mounted module): a connection through the passthrough
    server holds the drain; its close flips it. As the EnvoyFilter form's TCP filter does."""
    health = patched(load("wasmplugin/health-listener.yaml"), lb_buffer="60m")
    env = start_gateway(version, _tcp_gateway(tmp_path, health=health))
    tcp_connection_holds_the_drain(env, istio.PASSTHROUGH_LISTENER_PORT)


CANARY_LABELS = {**istio.POD_LABELS, "drain-gate.io/canary": "true"}
CANARY_URL = "oci://registry.example.com/drain-gate/drain-gate:0.2.0"


def canary_objects(*sets: str) -> dict[tuple[str, str], dict]:
    """The chart's WasmPlugin form with a canary image: the fleet's WasmPlugin
    (file://), the canary's (oci://) and the canary's placeholder EnvoyFilter."""
    return k8s.by_kind(k8s.template("--set", "wasm.configMap.create=false", "--set", "form=wasmplugin",
                                    "--set", f"wasmPlugin.canary.url={CANARY_URL}", *sets,
                                    "--show-only", "templates/wasmplugin.yaml"))


def _canary_plugins(module, fetched: bool = True) -> list[tuple[dict, dict]]:
    """The fleet's WasmPlugin (file://) and the canary's (oci://, on the labelled pod):
    the canary's module as istio-agent pulled it (`module`), or (fetched False)
    istio-agent's stand-in."""
    objs = canary_objects()
    fleet, canary = objs[("WasmPlugin", "drain-gate-traffic")], objs[("WasmPlugin", "drain-gate-traffic-canary")]
    ext = istio.wasmplugin_extension_config(canary, module) if fetched else istio.wasmplugin_fetch_failed(canary)
    return [(fleet, istio.wasmplugin_extension_config(fleet, local_module(fleet))), (canary, ext)]


def canary_pod(tmp_path, plugins: list[tuple[dict, dict]], placeholder: bool = True,
               labels: dict = CANARY_LABELS) -> list[dict]:
    """A pod's listeners with the canary rendered: the canary pod's by default;
    `placeholder` False: without the chart's placeholder EnvoyFilter (as the chart was)."""
    efs = [canary_objects()[("EnvoyFilter", "drain-gate-traffic-canary-placeholder")]] if placeholder else []
    return _wasmplugin_gateway(tmp_path, load("wasmplugin/health-listener.yaml"), [istio.gateway_listener(8080)],
                               plugins, labels, envoyfilters=efs)


@pytest.mark.parametrize("fetched", [True, False], ids=["canary-fetched", "canary-fetch-failed"])
def test_wasmplugin_canary_pod_stays_counted_whatever_its_image_does(fetched, start_gateway, stream, tmp_path,
                                                                     pulled_wasm):
    """The canary pod (drain-gate.io/canary=true) runs the fleet's filter and the
    canary's. Fetched, both count: each stream twice, the flip still at zero.
    Not fetched (istio-agent's allow-all RBAC stand-in), the fleet's filter
    still counts: the pod stays protected while verify.py names the stand-in.
    Either configuration replaces the placeholder."""
    env = start_gateway(VERSIONS[-1], canary_pod(tmp_path, _canary_plugins(pulled_wasm, fetched)))
    assert status(env)["traffic"]["placeholders"] == 0
    _count_flips_at_zero(env, stream, 8080, per_stream=2 if fetched else 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_wasmplugin_with_envoyfilter_vm_id_only_closes_at_drain_timeout(version, start_gateway, stream, tmp_path):
    """The EnvoyFilter-form health listener (vm_id "drain-gate") next to the
    WasmPlugin (vm_id ""): the health role sees no traffic role in its vm_id, so
    it never announces the gateway and never trusts the count.
    Only change to the file: drain_timeout 4s instead of 120s, to see the end."""
    drain_timeout = 4
    health = patched(load("health-listener.yaml"), drain_timeout=f"{drain_timeout}s")
    # The harness's readiness waits for the traffic role, which never comes here.
    env = start_gateway(version, _wasmplugin_listeners(tmp_path, health), ready_path=None)
    wait_for(lambda: raw(env.ports.health, b"GET /live HTTP/1.0\r\n\r\n")[0].endswith("200 OK"), 30,
             what="health listener serving")

    s = stream(f"http://127.0.0.1:{env.at[8080]}/stream?seconds=1&interval_ms=250")
    wait_for(lambda: status(env)["active"] == 1, 10, what="stream visible in the shared gauge")
    st = status(env)
    assert st["count"]["reliable"] is False, "no traffic role in vm_id drain-gate"
    assert st["waiting_for"] == "traffic_role" and st["traffic"]["seen"] is False
    assert lb_check(env)[0] == "HTTP/1.0 503 Service Unavailable", "not announced to the LB"
    assert requests.get(env.health("/health"), timeout=5).status_code == 503, "nor to Kubernetes"
    wait_for(lambda: env.stat("wasmcustom.drain_gate_count_unreliable") == 1, 5,
             what="the count_unreliable gauge says so (DrainGateCountUnreliable)")
    assert requests.post(env.health("/drain"), timeout=5).status_code == 200
    drained = time.monotonic()
    assert s.wait(10) == 0
    wait_for(lambda: status(env)["active"] == 0, 5, what="stream released")
    # A trusted count would have flipped by now; this one must not.
    while time.monotonic() - drained < drain_timeout - 1:
        assert status(env)["state"] == "DRAINING"
        time.sleep(0.2)
    wait_for(lambda: status(env)["state"] == "CLOSING", 4, what="CLOSING at drain_timeout")
    st = status(env)
    assert st["progress"]["reason"] == "drain_timeout" and st["progress"]["forced"] is True
    assert time.monotonic() - drained >= drain_timeout - 0.5


# -- distroless: /prestop with the literal bearer header --------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_distroless_prestop_with_bearer_header(version, start_gateway):
    token = "a3f1c2d4e5b60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8"  # like `openssl rand -hex 24`
    hook = istio.load_one(istio.KUBERNETES / "gateway-values-distroless.yaml")["lifecycle"]["preStop"]["httpGet"]
    (header,) = hook["httpHeaders"]
    placeholder = header["value"].split(" ", 1)[1]
    # drain-gate's token alphabet (src/config.rs is_token68): the placeholder is outside it
    assert not re.fullmatch(r"[A-Za-z0-9._~+/=-]{16,}", placeholder), "the placeholder must never be a valid token"
    # The health listener as the README installs it (--set config.admin_token),
    # then admin_allow [] so the test's loopback address does not authorize by
    # itself, as the kubelet's node address would not.
    (health,) = k8s.template("--set", "wasm.configMap.create=false", "--set", f"config.admin_token={token}",
                             "--show-only", "templates/health-listener.yaml")
    health = patched(health, admin_allow=[])
    env = start_gateway(version, istio.gateway_xds(
        [istio.gateway_listener(8080)], [load("traffic-filter.yaml"), health]))
    url = env.health(hook["path"])

    assert requests.get(url, timeout=5).status_code == 401
    assert requests.get(url, headers={"Authorization": header["value"]}, timeout=5).status_code == 401
    assert status(env)["state"] == "OPEN"

    started = time.monotonic()
    r = requests.get(url, headers={header["name"]: header["value"].replace(placeholder, token)}, timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "CLOSED"
    st = status(env)
    assert st["progress"]["reason"] == "lb_buffer_elapsed"
    assert time.monotonic() - started >= st["progress"]["lb_buffer_ms"] / 1000 - 0.5


@pytest.mark.parametrize("version", VERSIONS)
def test_health_listener_without_its_plugin_fails_closed(version, start_gateway):
    """If drain-gate is not running on the listener, the LB's check gets the
    catch-all 503 (the route as written; only the plugin taken out)."""
    health = copy.deepcopy(load("health-listener.yaml"))
    health_hcm = hcm(health["spec"]["configPatches"][0]["patch"]["value"])
    health_hcm["http_filters"] = [f for f in health_hcm["http_filters"] if f["name"] != "drain-gate-health"]
    env_listeners = istio.gateway_xds([istio.gateway_listener(8080)], [health])
    # Envoy.wait_ready asks /live, which is 503 here: start without it, then poll.
    env = start_gateway(version, env_listeners, ready_path=None)
    line, body = lb_check(env)
    assert (line, body) == ("HTTP/1.0 503 Service Unavailable", b"drain-gate unavailable\n")


# -- Gateway API form (envoyfilter/gateway-api/) ---------------------------------------------
def _gateway_api_pod(options: str, workdir) -> tuple[dict, dict]:
    """(pod template, istio-proxy container) of the Deployment istiod renders
    for the Gateway with the ConfigMap `options` (kubectl's strategic merge)."""
    workdir.mkdir(exist_ok=True)
    deployment = istio.gateway_api_patched(options, "Deployment", workdir)
    return deployment["spec"]["template"], istio.proxy_container(deployment)


def _gateway_api_listeners(health: dict, pod_labels: dict) -> istio.Xds:
    """istiod's listener for the Gateway's listener port, with the Gateway API
    EnvoyFilters applied for a pod with `pod_labels` (and their ECDS resources)."""
    (listener,) = istio.load_one(istio.GATEWAY_API / "gateway.yaml")["spec"]["listeners"]
    traffic = istio.load_one(istio.GATEWAY_API / "traffic-filter.yaml")
    return istio.gateway_xds([istio.gateway_listener(listener["port"])], [traffic, health], labels=pod_labels)


@pytest.mark.parametrize("version", VERSIONS)
def test_gateway_api_form_counts_flips_and_prestop_returns_at_closed(version, start_gateway, stream, tmp_path):
    template, proxy = _gateway_api_pod("options.yaml", tmp_path / "kubectl")
    xds = _gateway_api_listeners(istio.load_one(istio.GATEWAY_API / "health-listener.yaml"),
                                 template["metadata"]["labels"])
    assert [l["name"] for l in xds.listeners] == ["0.0.0.0_80", "drain-gate-health"]
    assert "drain-gate" in _names(xds.listeners[0]), "the patched pod's labels select the traffic filter"
    env = start_gateway(version, xds)
    assert lb_check(env) == ("HTTP/1.0 200 OK", b"OK\n")

    s = stream(f"http://127.0.0.1:{env.at[80]}/stream?seconds=2&interval_ms=250")
    wait_for(lambda: status(env)["active"] == 1, 10, what="the Gateway listener's stream counted")
    assert status(env)["count"]["reliable"] is True
    # The preStop of the patched Deployment, as written but for the port.
    command = [a.replace(":18180/", f":{env.ports.health}/") for a in proxy["lifecycle"]["preStop"]["exec"]["command"]]
    with held_call(command) as prestop:
        wait_for(lambda: status(env)["state"] == "DRAINING", 5, what="DRAINING")
        before, (line, _), after = status(env), lb_check(env), status(env)
        assert after["active"] == 1, "the stream outlives the start of the drain"
        assert (before["state"], line) == ("DRAINING", "HTTP/1.0 200 OK"), "200 to the LB while it runs"
        assert s.wait(10) == 0 and s.chunks == 8, s.err
        wait_for(lambda: lb_check(env)[0] == "HTTP/1.0 503 Service Unavailable", 2, what="LB flip to 503")
        st = status(env)
        assert st["state"] == "CLOSING" and st["progress"]["reason"] == "active_zero"
        assert prestop.poll() is None, "the preStop call is held until CLOSED"
        # Skip lb_buffer (the other forms wait it out): the held call returns at CLOSED.
        assert requests.post(env.health("/close"), timeout=5).status_code == 200
        out, err = prestop.communicate(timeout=10)
        assert prestop.returncode == 0, err
        assert json.loads(out)["state"] == "CLOSED"
    assert requests.get(env.health(proxy["readinessProbe"]["httpGet"]["path"]), timeout=5).status_code == 503
    assert_grace_covers_the_drain(st["progress"], command, template["spec"]["terminationGracePeriodSeconds"],
                                  template["metadata"]["annotations"]["proxy.istio.io/config"])


def test_gateway_api_envoyfilters_skip_pods_without_the_mount():
    """A pod istiod rendered without the ConfigMap (no wasm mount, e.g. before
    the rollout) keeps its listeners as they are."""
    plain = istio.gateway_api_rendered()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    health = istio.load_one(istio.GATEWAY_API / "health-listener.yaml")
    assert _gateway_api_listeners(health, plain) == istio.Xds([istio.gateway_listener(80)])


@pytest.mark.parametrize("version", VERSIONS)
def test_gateway_api_wasmplugin_form_count_reaches_the_health_fsm(version, start_gateway, stream, tmp_path):
    template, _ = _gateway_api_pod("options.yaml", tmp_path / "kubectl")
    labels = template["metadata"]["labels"]
    namespace = istio.load_one(istio.GATEWAY_API / "gateway.yaml")["metadata"]["namespace"]
    wp = istio.load_one(istio.GATEWAY_API / "wasmplugin" / "traffic.yaml")
    assert istio.selects_workload(wp, namespace, labels), "the selector reaches the patched pods"
    health = istio.load_one(istio.GATEWAY_API / "wasmplugin" / "health-listener.yaml")
    env = start_gateway(version, _wasmplugin_listeners(tmp_path, health, None, wp, labels, port=80))

    s = stream(f"http://127.0.0.1:{env.at[80]}/stream?seconds=1&interval_ms=250")
    wait_for(lambda: status(env)["active"] == 1, 10, what="the WasmPlugin's stream counted")
    assert status(env)["count"]["reliable"] is True
    assert requests.post(env.health("/drain"), timeout=5).status_code == 200
    assert s.wait(10) == 0 and s.chunks == 4
    wait_for(lambda: lb_check(env)[0] == "HTTP/1.0 503 Service Unavailable", 2, what="LB flip to 503")
    st = status(env)
    assert st["progress"]["reason"] == "active_zero" and st["progress"]["forced"] is False


def test_gateway_api_distroless_prestop_with_bearer_header(start_gateway, tmp_path):
    """The distroless ConfigMap's httpGet hook, through kubectl's merge, with
    the token put in by envoyfilter/docs/install.md's sed commands."""
    token = "b4e2d3c5f6a70829304b5c6d7e8f9a01b2c3d4e5f6a7b8c9"  # like `openssl rand -hex 24`
    template, proxy = _gateway_api_pod("options-distroless.yaml", tmp_path / "kubectl")
    hook = proxy["lifecycle"]["preStop"]["httpGet"]
    (header,) = hook["httpHeaders"]
    placeholder = header["value"].split(" ", 1)[1]
    text = (istio.GATEWAY_API / "health-listener.yaml").read_text()
    assert text.count('"admin_token":""') == 1
    health = yaml.safe_load(text.replace('"admin_token":""', f'"admin_token":"{token}"'))
    # admin_allow []: the test's loopback must not authorize by itself, as the kubelet's node address would not.
    env = start_gateway(VERSIONS[-1], _gateway_api_listeners(patched(health, admin_allow=[]),
                                                             template["metadata"]["labels"]))
    url = env.health(hook["path"])
    assert requests.get(url, headers={"Authorization": header["value"]}, timeout=5).status_code == 401
    auth = {header["name"]: header["value"].replace(placeholder, token)}
    answer: list[requests.Response] = []
    held = threading.Thread(target=lambda: answer.append(requests.get(url, headers=auth, timeout=60)), daemon=True)
    held.start()
    wait_for(lambda: status(env)["state"] == "CLOSING", 5, what="idle gateway: CLOSING at once")
    assert not answer, "/prestop is held until CLOSED"
    assert requests.post(env.health("/close"), headers=auth, timeout=5).status_code == 200
    held.join(10)
    assert answer and answer[0].status_code == 200 and answer[0].json()["state"] == "CLOSED"


# -- the role alerts on each form's names ------------------------------------------------
RULES_TEST = istio.REPO / "tests" / "observability" / "drain-gate.rules.test.yaml"
# istio-proxy's stats settings that shape a stat's Prometheus name: no default tag extractors
# (tools/packaging/common/envoy_bootstrap.json; none of its own tags matches a wasm.* name), and an
# inclusion list that keeps the wasm prefix (pkg/bootstrap/config.go).
ISTIO_STATS = {"use_all_default_tags": False,
               "stats_matcher": {"inclusion_list": {"patterns": [{"prefix": "wasm"}, {"prefix": "server"}]}}}


def plugin_stat_names(env) -> dict[str, str]:
    """The drain-gate plugins' `vm_reload` counters this Envoy exports to Prometheus, by role (its
    plugin config's name: drain-gate-health, -traffic or -tcp, the form's prefix and suffix around it)."""
    text = requests.get(env.admin("/stats/prometheus"), timeout=5).text
    names = set(re.findall(r"^(envoy_wasm_\w*drain_gate_\w+_vm_reload)\b", text, re.M))
    return {re.search(r"drain_gate_(health|traffic|tcp)", n)[1]: n for n in names}


def role_alerts_test(forms: dict[str, dict[str, str]]) -> dict:
    """A promtool unit test of the rules file: for each form's names, a gateway with every role, a
    TCP-only one (health + TCP), and one missing each role; each alert expected exactly on the pods
    that miss the role it names."""
    pods = {}
    for form, names in forms.items():
        pods[f"{form}-both"] = ["health", "traffic", "tcp"]
        pods[f"{form}-tcp-only"] = ["health", "tcp"]
        pods[f"{form}-no-health"] = ["traffic", "tcp"]
        pods[f"{form}-tcp-no-health"] = ["tcp"]
        pods[f"{form}-no-traffic"] = ["health"]
    series = [{"series": f'{forms[pod.split("-")[0]][role]}{{namespace="gw",pod="{pod}"}}', "values": "0x10"}
              for pod, roles in pods.items() for role in roles]
    lacks = {"DrainGateHealthRoleMissing": lambda roles: "health" not in roles,
             "DrainGateTrafficRoleMissing": lambda roles: not {"traffic", "tcp"} & set(roles)}
    rules = istio.REPO / "envoyfilter" / "observability" / "drain-gate.rules.yaml"
    annotations = {r["alert"]: r["annotations"] for g in yaml.safe_load(rules.read_text())["groups"]
                   for r in g["rules"] if r.get("alert") in lacks}

    def expected(alert: str, pod: str) -> dict:
        ann = {k: v.replace("{{ $labels.namespace }}", "gw").replace("{{ $labels.pod }}", pod)
               for k, v in annotations[alert].items()}
        return {"exp_labels": {"severity": "critical", "namespace": "gw", "pod": pod}, "exp_annotations": ann}

    tests = [{"eval_time": "6m", "alertname": alert,
              "exp_alerts": [expected(alert, pod) for pod, roles in pods.items() if lacked(roles)]}
             for alert, lacked in lacks.items()]
    return {"rule_files": [str(rules)],
            "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}]}


def test_role_alerts_fire_exactly_when_a_role_is_missing_under_each_form_s_real_names(start_gateway, tmp_path):
    """Each form's rendered config in a real Envoy 1.40 with istio-proxy's stats settings: the names
    its drain-gate plugins export are the ones the rules' promtool test feeds (EnvoyFilter form:
    drain-gate-*; WasmPlugin form on Istio 1.30: istio-system.drain-gate-*~istio-translated-wasmplugin,
    the health listener an EnvoyFilter), and, fed to promtool, each role alert fires exactly on the
    gateways that miss its role — a TCP-only gateway included."""
    envoyfilter = istio.gateway_xds(
        [istio.gateway_listener(8080), istio.gateway_listener(15443, tcp=True)],
        [load("traffic-filter.yaml"), load("tcp-filter.yaml"), load("health-listener.yaml")])
    forms = {}
    for form, listeners in (("envoyfilter", envoyfilter), ("wasmplugin", _tcp_gateway(tmp_path))):
        env = start_gateway(VERSIONS[-1], listeners, stats_config=ISTIO_STATS)
        forms[form] = wait_for(lambda: len(n := plugin_stat_names(env)) == 3 and n, 10,
                               what=f"the {form} form's three plugins' stats")
        env.stop()
    assert forms["envoyfilter"] == {r: f"envoy_wasm_drain_gate_{r}_vm_reload" for r in ("health", "traffic", "tcp")}
    assert forms["wasmplugin"] == {
        "health": "envoy_wasm_drain_gate_health_vm_reload",
        **{r: f"envoy_wasm_istio_system_drain_gate_{r}_istio_translated_wasmplugin_vm_reload"
           for r in ("traffic", "tcp")}}
    fed = RULES_TEST.read_text()
    for names in forms.values():
        for name in names.values():
            assert f"series: {name}{{" in fed, f"{RULES_TEST.name} does not feed {name}"
    test = tmp_path / "roles.rules.test.yaml"
    test.write_text(yaml.safe_dump(role_alerts_test(forms), sort_keys=False))
    run = subprocess.run(["promtool", "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
