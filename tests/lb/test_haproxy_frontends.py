"""Every frontend of the reference HAProxy configuration (envoyfilter/haproxy/haproxy.cfg),
against a real HAProxy in front of a real drain-gate Envoy: the TLS frontend's X-Forwarded-*
headers, the :80 redirect, the two passthrough frontends with their checks, the stats page, and
the documented check-then-hitless-reload procedure."""
from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import socketserver
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.harness.clients import CurlStream
from tests.harness.envoy import REPO, free_port, wait_for
from tests.harness.haproxy import CFG, HAProxy, make_cert
from tests.harness.rig import Backend, Gateway, Rig

TLS_BODY = b"tls server behind the passthrough\n"


class _TlsHandler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", str(len(TLS_BODY)))
        self.end_headers()
        self.wfile.write(TLS_BODY)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        with contextlib.suppress(OSError):
            while data := self.request.recv(4096):
                self.request.sendall(data)


def _serve(server) -> None:
    threading.Thread(target=server.serve_forever, daemon=True).start()


@pytest.fixture
def servers(tmp_path):
    """A TLS server (the gateway's own TLS port) and a TCP echo (kube-apiserver) on loopback."""
    pem = make_cert(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pem)
    tls = ThreadingHTTPServer(("127.0.0.1", free_port()), _TlsHandler)
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
    echo = socketserver.ThreadingTCPServer(("127.0.0.1", free_port()), _Echo)
    echo.daemon_threads = True
    for s in (tls, echo):
        _serve(s)
    fingerprint = hashlib.sha256(ssl.PEM_cert_to_DER_cert((tmp_path / "tls.crt").read_text())).hexdigest()
    yield {"tls": tls.server_address[1], "echo": echo.server_address[1], "fingerprint": fingerprint}
    for s in (tls, echo):
        s.shutdown()
        s.server_close()


@pytest.fixture
def rig(tmp_path, servers):
    env = {"GW1_TLS_ADDR": f"127.0.0.1:{servers['tls']}", "APISERVER_ADDR": f"127.0.0.1:{servers['echo']}"}
    with Rig(tmp_path / "rig", gateways=1, tls=True, haproxy_env=env, config={"lb_buffer": "60m"}) as r:
        yield r


def _peer_fingerprint(port: int) -> tuple[str, bytes]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), 5) as raw, ctx.wrap_socket(raw) as s:
        der = s.getpeercert(binary_form=True)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body = b""
        while chunk := s.recv(4096):
            body += chunk
    return hashlib.sha256(der).hexdigest(), body


def test_tls_frontend_forwards_client_scheme_port_and_host(rig):
    hap = rig.haproxy
    r = requests.get(hap.https("/headers"), headers={"host": "shop.example.local"}, verify=False, timeout=10)
    assert r.status_code == 200
    seen = r.json()
    assert seen["x-forwarded-proto"] == "https"
    assert seen["x-forwarded-port"] == str(hap.https_port)
    assert seen["x-forwarded-host"] == "shop.example.local"
    assert seen["host"] == "shop.example.local", "the Host header itself must pass unchanged"
    assert "127.0.0.1" in seen["x-forwarded-for"]


def test_port_80_frontend_redirects_to_https(rig):
    r = requests.get(f"http://127.0.0.1:{rig.haproxy.redirect_port}/cart?id=7",
                     headers={"host": "shop.example.local"}, allow_redirects=False, timeout=10)
    assert r.status_code == 301
    assert r.headers["location"] == "https://shop.example.local/cart?id=7"
    # Answered by HAProxy itself: nothing reached the gateways.
    assert not [x for x in rig.haproxy.requests() if "/cart" in x.request and x.server != "<NOSRV>"]


def test_gateway_passthrough_keeps_tls_end_to_end_and_follows_the_drain(rig, servers):
    hap = rig.haproxy
    hap.wait_status("gw1", lambda s: s.up and s.check_status == "L7OK", 15, backend="gateways-passthrough")
    fingerprint, body = _peer_fingerprint(hap.passthrough_port)
    assert fingerprint == servers["fingerprint"], "HAProxy ended the TLS itself"
    assert body.endswith(TLS_BODY)
    # The check port is drain-gate's: the drain takes the passthrough server out as well.
    assert rig.gw().post("/drain").json()["state"] == "CLOSING"
    hap.wait_status("gw1", "DOWN", 4 * rig.timing.detection_window, backend="gateways-passthrough")


def test_apiserver_passthrough_is_checked_on_its_own_port(rig):
    hap = rig.haproxy
    hap.wait_status("master1", lambda s: s.up and s.check_status == "L4OK", 15, backend="kube-apiserver")
    with socket.create_connection(("127.0.0.1", hap.apiserver_port), 5) as s:
        s.sendall(b"\x16\x03\x01 client hello bytes")
        assert s.recv(100) == b"\x16\x03\x01 client hello bytes"


def test_stats_page_is_served_on_loopback_only(rig):
    r = requests.get(f"http://127.0.0.1:{rig.haproxy.stats_port}/", timeout=10)
    assert r.status_code == 200 and "gateways-passthrough" in r.text and "kube-apiserver" in r.text
    assert not re.search(r"HAProxy version \d", r.text), "stats hide-version"
    default = re.search(r'bind "\$\{STATS_BIND-([^}]*)\}"', CFG.read_text())
    assert default and default[1].startswith("127.0.0.1:"), "the stats page must default to loopback"


def _reload_block() -> str:
    text = (REPO / "envoyfilter" / "docs" / "lb.md").read_text()
    return text.split("### Reload HAProxy", 1)[1].split("```shell\n", 1)[1].split("```", 1)[0]


def test_documented_reload_is_checked_and_hitless(tmp_path):
    """The envoyfilter/docs/lb.md reload commands, as written, on a master-worker HAProxy: a stream
    in flight through the old worker completes, and new requests go to the new one; a restart,
    the control, cuts it."""
    with contextlib.ExitStack() as stack:
        backend = Backend(tmp_path).start()
        stack.callback(backend.stop)
        gw = Gateway("gw1", backend.port, {}, tmp_path)
        stack.callback(gw.stop)
        gw.start()
        hap = HAProxy(tmp_path / "haproxy", [(gw.ports.traffic, gw.ports.health)], inter="1s", tls=False,
                      master_worker=True)
        stack.callback(hap.stop)
        hap.start()
        hap.wait_status("gw1", "UP", 15)
        before = _workers(hap)
        stream = CurlStream(hap.http("/stream"), seconds=4, interval_ms=250, label="through the reload")
        wait_for(lambda: gw.status()["active"] >= 1, 10, 0.05, "stream in flight")
        lines = _reload_block().replace("/etc/haproxy/haproxy.cfg", str(hap.cfg)).replace(
            "/run/haproxy-master.sock", str(hap.master_socket)).strip().splitlines()
        check_and_reload, show = "\n".join(lines[:2]), lines[2]
        r = _bash(check_and_reload, hap)
        assert "Configuration file is valid" in r.stdout + r.stderr
        # The master re-executes itself on reload: its CLI is back with the new worker.
        new = wait_for(lambda: _workers(hap) - before, 10, 0.05, "a new worker")
        assert new.pop() in _bash(show, hap).stdout
        assert requests.get(hap.http("/"), timeout=10).status_code == 200
        stream.wait(30)
        assert stream.complete, stream.summary()
        # Control: a restart (what a reload avoids) cuts the stream in flight.
        cut = CurlStream(hap.http("/stream"), seconds=4, interval_ms=250, label="through a restart")
        wait_for(lambda: gw.status()["active"] >= 1, 10, 0.05, "stream in flight")
        hap.stop()
        cut.wait(30)
    assert not cut.complete, cut.summary()


def _bash(script: str, hap: HAProxy) -> subprocess.CompletedProcess:
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=hap._environ(),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _workers(hap: HAProxy) -> set[str]:
    """PIDs of the current workers (`show proc` on the master CLI); none while it re-executes."""
    try:
        text = hap.command("show proc", master=True)
    except OSError:
        return set()
    current = text.split("# old workers", 1)[0]
    return {line.split()[0] for line in current.splitlines() if re.match(r"^\d+\s+worker\b", line)}
