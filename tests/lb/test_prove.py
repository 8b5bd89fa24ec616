"""envoyfilter/tools/prove.py, the staging proof an operator runs against their own LB, run here
as an operator runs it (a subprocess, standard library and curl only) against every LB the tests
run, each recipe as written: HAProxy 2.6 in mode http (haproxy.cfg's TLS frontend: h2 by ALPN,
the stream's certificate checked with --cacert) and mode tcp (haproxy-tcp.cfg: h2c prior
knowledge), Envoy as the front LB (lb/envoy-front.yaml) and nginx (lb/nginx-drain-gate.conf),
two gateways behind each, the demo backend answering go-httpbin's /drip and /websocket/echo.

Behind each LB the two commands of envoyfilter/docs/lb.md ("Prove your LB in staging") with the
rig's addresses: the control first (--control: the flip at drain start, on gw1), then the proof
(the preStop's drain, on gw2, which then carries every stream):
- HAProxy (`on-marked-down shutdown-sessions`): the control exits 1 and what it lost is what the
  drained gateway counts as the LB's cuts; the proof exits 0: nothing lost, nothing cut.
- Envoy and nginx cut nothing at a failed check: the control exits 0 and says it proved nothing,
  and why (Envoy: it marked the gateway down with the streams in flight and cut none; nginx: no
  check ever reached the gateway); the proof exits 0.
Bad input exits 2 with the cause and drains nothing: arguments, unreachable URLs, a port that is
not drain-gate's, a gateway not OPEN or in a preStop hold (left as it was), too few streams on the
gateway (saying how many reached it), an LB that does not pass a kind. SIGINT in a drain reopens
the gateway (exit 130).

Timings are the quick ones (HAProxy inter 1s, lb_buffer 3s; Envoy front inter 500ms, lb_buffer
2s) with short streams: the control's outlast its LB's detection window (4 s behind HAProxy, 3 s
behind Envoy; nginx has none), the proof's are 2 s.
"""
from __future__ import annotations

import ast
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.harness import docs, istio, wire
from tests.harness.envoy import REPO
from tests.harness.process import wait_for
from tests.harness.rig import QUICK, Backend, Gateway, PreStop, Rig
from tests.lb.refuse_lbs import FrontRig

PROVE = REPO / "envoyfilter" / "tools" / "prove.py"
README = REPO / "envoyfilter" / "docs" / "lb.md"
OUT = REPO / "out" / "prove"
LAST = re.compile(r"^prove: lost (\d+) of (\d+), gateway cut (\d+), forced (\d+)$", re.M)
REACHED = re.compile(r"^prove: (\d+) of (\d+) streams reached the gateway", re.M)
RECEIPT = re.compile(r"^receipt: cut (\d+) \(by the LB (\d+), other (\d+)\)", re.M)
STREAMS = 9  # three of each kind: with two gateways behind the LB, >= 3 reach each one


@dataclass
class Proof:
    code: int
    out: str
    err: str
    seconds: float

    @property
    def last(self) -> dict[str, int]:
        m = LAST.search(self.out)
        assert m and self.out.rstrip().endswith(m[0]), self.out + self.err
        return dict(zip(("lost", "of", "cut", "forced"), map(int, m.groups())))

    @property
    def reached(self) -> int:
        m = REACHED.search(self.out)
        assert m, self.out + self.err
        return int(m[1])

    def line(self, prefix: str) -> str:
        (line,) = [x for x in self.out.splitlines() if x.startswith(prefix)] or [""]
        return line


def prove(*args: str, name: str | None = None, timeout: float = 120) -> Proof:
    """prove.py as an operator runs it: python3, isolated from this venv's packages."""
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-I", str(PROVE), *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "COLUMNS": "80"})
    p = Proof(r.returncode, r.stdout, r.stderr, time.monotonic() - t)
    if name:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.txt").write_text(f"$ prove.py {' '.join(args)}\n{p.out}{p.err}exit {p.code} ({p.seconds:.1f} s)\n")
    return p


# -- the tool itself ---------------------------------------------------------------------
def test_help_fits_one_screen():
    p = prove("--help")
    lines = p.out.splitlines()
    assert p.code == 0 and len(lines) <= 40 and max(map(len, lines)) <= 80, p.out
    for word in ("--through", "--health", "--control", "go-httpbin", "DRAIN_GATE_ADMIN_TOKEN", "exit: 0", "130"):
        assert word in p.out, word


def test_standard_library_only():
    """Any machine with python3 runs it: every import is of the standard library."""
    tree = ast.parse(PROVE.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert names and names <= set(sys.stdlib_module_names) | {"__future__"}, names - set(sys.stdlib_module_names)


def test_the_staging_backend_is_valid_and_outlasts_the_longest_stream():
    """kubernetes/prove-httpbin.yaml: valid objects (strict), go-httpbin with MAX_DURATION above
    prove.py's longest --seconds (go-httpbin refuses a longer /drip and ends a websocket there),
    the Service on the pod's port."""
    docs = {d["kind"]: d for d in istio.load_docs(istio.KUBERNETES / "prove-httpbin.yaml")}
    assert set(docs) == {"Namespace", "Deployment", "Service"}
    for obj in docs.values():
        assert istio.k8s_errors(obj) == [], obj["kind"]
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("docker.io/mccutchen/go-httpbin:")
    env = {e["name"]: e["value"] for e in container["env"]}
    m = re.fullmatch(r"(\d+)m", env["MAX_DURATION"])
    limit = re.search(r"^MAX_SECONDS = (\d+)", PROVE.read_text(), re.M)
    assert m and limit and int(m[1]) * 60 > int(limit[1]), (env, limit)
    (port,) = docs["Service"]["spec"]["ports"]
    assert port["targetPort"] == container["ports"][0]["name"]
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("args, cause", [
    (["--kinds", "http1,grpc"], "--kinds: grpc: the kinds are http1, http2, ws"),
    (["--streams", "0"], "--streams 0: between 1 and 1000"),
    (["--seconds", "0"], "--seconds 0: between 1 and 600"),
    (["--seconds", "601"], "--seconds 601: between 1 and 600"),
    (["--through", "ftp://203.0.113.10/"], "--through ftp://203.0.113.10/: not an http(s) URL"),
    (["--health", "203.0.113.212:18180"], "--health 203.0.113.212:18180: not an http(s) URL"),
    (["--cacert", "/nonexistent/ca.pem"], "--cacert /nonexistent/ca.pem: no such file"),
])
def test_bad_arguments_exit_2_naming_the_option(args, cause):
    base = {"--through": "http://203.0.113.10/", "--health": "http://127.0.0.1:1"}
    base.update(dict(zip(args[::2], args[1::2])))
    p = prove(*[x for kv in base.items() for x in kv])
    assert p.code == 2 and cause in p.err and not p.out, (p.out, p.err)


# -- bad input against real gateways: nothing drained ---------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The demo backend and two gateways with no LB in front: a gateway's own traffic port
    serves as --through (it passes every kind)."""
    wd = tmp_path_factory.mktemp("prove-pair")
    with contextlib.ExitStack() as stack:
        backend = Backend(wd).start()
        stack.callback(backend.stop)
        gws = []
        for name in ("gwA", "gwB"):
            gw = Gateway(name, backend.port, {"lb_buffer": "1s"}, wd)
            stack.callback(gw.stop)
            gws.append(gw.start())
        yield backend, gws


@pytest.fixture
def gws(pair):
    """gwA and gwB, OPEN (a test that drained one must leave it so)."""
    _, gws = pair
    for gw in gws:
        assert gw.status()["state"] == "OPEN", f"{gw.name} left drained by an earlier test"
    return gws


def traffic(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.ports.traffic}"


def test_unreachable_or_wrong_urls_exit_2_with_the_cause(gws):
    gw, _ = gws
    before = gw.status()["receipt"]["drain_started_at"]
    p = prove("--through", traffic(gw), "--health", "http://127.0.0.1:1")
    assert p.code == 2 and "--health http://127.0.0.1:1: unreachable" in p.err, p.err
    p = prove("--through", traffic(gw), "--health", traffic(gw))
    assert p.code == 2 and "without drain-gate's status (is it a gateway's :18180?)" in p.err, p.err
    p = prove("--through", "http://127.0.0.1:1", "--health", gw.url(""))
    assert p.code == 2 and "--through http://127.0.0.1:1: http1: curl: (7) Failed to connect" in p.err, p.err
    p = prove("--through", "http://127.0.0.1:1", "--health", gw.url(""), "--kinds", "ws")
    assert p.code == 2 and "--through http://127.0.0.1:1: ws" in p.err and "refused" in p.err, p.err
    assert gw.status()["receipt"]["drain_started_at"] == before, "nothing was drained"


def test_a_gateway_not_open_exits_2_and_is_left_as_it_was(gws):
    gw, _ = gws
    assert gw.post("/drain?hold=closing").json()["state"] == "CLOSING"
    try:
        p = prove("--through", traffic(gw), "--health", gw.url(""))
        assert p.code == 2 and "the gateway behind --health is CLOSING, not OPEN" in p.err, p.err
        assert gw.status()["state"] == "CLOSING", "prove.py left a drain it did not start alone"
    finally:
        assert gw.post("/reopen").status_code == 200


def test_too_few_streams_through_the_gateway_exits_2_saying_how_many(gws):
    """The streams go to gwA, --health is gwB's: none reached it, and it is never drained."""
    gw_a, gw_b = gws
    before = gw_b.status()["receipt"]["drain_started_at"]
    p = prove("--through", traffic(gw_a), "--health", gw_b.url(""), "--streams", "6", "--seconds", "3")
    assert p.code == 2, (p.out, p.err)
    assert ("too few streams through the gateway behind --health to judge: 0 of 6 reached it, 3 needed"
            in p.err), p.err
    assert p.reached == 0
    assert gw_b.status()["receipt"]["drain_started_at"] == before, "nothing was drained"


def test_sigint_in_a_drain_reopens_the_gateway(gws):
    gw, _ = gws
    proc = subprocess.Popen([sys.executable, "-I", str(PROVE), "--through", traffic(gw), "--health", gw.url(""),
                             "--streams", "3", "--seconds", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: gw.status()["state"] == "DRAINING", 20, 0.05, "prove.py's drain")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "prove: interrupted: the gateway is OPEN again" in out, (out, err)
    assert gw.status()["state"] == "OPEN"
    # Its streams ended with it.
    wait_for(lambda: wire.status(gw.envoy)["active"] == 0, 10, 0.1, "the interrupted run's streams gone")


def test_a_gateway_in_a_prestop_hold_exits_2_and_keeps_its_hold(gws):
    """A held GET /prestop (the pod is terminating) with a stream in flight keeps the gateway
    DRAINING: prove.py refuses it and leaves the hold alone (no /reopen?force). The last test of
    the pair: gwB stays drained."""
    _, gw = gws
    curl = subprocess.Popen(["curl", "-sN", "-o", os.devnull, f"{traffic(gw)}/stream?seconds=20"])
    try:
        wait_for(lambda: gw.status()["active"] >= 1, 10, 0.05, "a stream in flight")
        PreStop(gw, via="prestop")
        hold = wait_for(lambda: gw.status()["progress"]["prestop_hold_until"], 5, 0.05, "the hold")
        p = prove("--through", traffic(gw), "--health", gw.url(""))
        assert p.code == 2, (p.out, p.err)
        assert (f"the gateway behind --health is in a preStop hold (lease until {hold[:17]}" in p.err
                and "its pod is terminating" in p.err), p.err
        st = gw.status()
        assert st["state"] == "DRAINING" and st["progress"]["prestop_hold_until"], st["progress"]
    finally:
        curl.kill()


# -- behind the LBs ---------------------------------------------------------------------------
def readme_commands() -> tuple[str, str]:
    """prove.py's two commands in envoyfilter/docs/lb.md ("Prove your LB in staging"): the control,
    then the proof."""
    found = [c for b in docs.sh_blocks(README) for c in docs.commands(b) if "envoyfilter/tools/prove.py" in c]
    assert len(found) == 2, found
    return found[0], found[1]


CONTROL_SHELL = re.compile(r"^rc=0; (?P<prove>python3 envoyfilter/tools/prove.py .* --control) \|\| rc=\$\?; "
                           r"\[ \$rc -eq 1 \]$")


def test_the_readme_runs_the_control_first_then_the_proof():
    control, proof = readme_commands()
    m = CONTROL_SHELL.match(control)
    assert m and "--control" not in proof, (control, proof)
    assert m["prove"].removesuffix(" --control") == proof
    # The line as bash -euo pipefail runs it: only the control's exit 1 goes on to the proof.
    for code in (0, 1, 2, 130):
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", control.replace(m["prove"], f"(exit {code})")])
        assert (r.returncode == 0) == (code == 1), code


def as_run_here(command: str, through: list[str], health: str, *extra: str) -> list[str]:
    """A README command with a rig's addresses (`through`: the URL and its options) and `extra`."""
    m = CONTROL_SHELL.match(command)
    argv = shlex.split(m["prove"] if m else command)
    assert argv[:2] == ["python3", "envoyfilter/tools/prove.py"], argv
    out, args = [], iter(argv[2:])
    for a in args:
        value = next(args) if a in ("--through", "--health") else None
        out += through if a == "--through" else ["--health", health] if a == "--health" else [a]
        assert a not in ("--through", "--health") or value, a
    return out + list(extra)


def control_then_proof(name: str, through: list[str], gw1: Gateway, gw2: Gateway, kinds: str,
                       control_s: int, proof_s: int) -> tuple[Proof, Proof]:
    """The README's two commands behind a rig's LB: the control on gw1, the proof on gw2."""
    control_cmd, proof_cmd = readme_commands()
    common = ["--streams", str(STREAMS), "--kinds", kinds]
    control = prove(*as_run_here(control_cmd, through, gw1.url(""), "--seconds", str(control_s), *common),
                    name=f"{name}-control")
    proof = prove(*as_run_here(proof_cmd, through, gw2.url(""), "--seconds", str(proof_s), *common),
                  name=f"{name}-proof")
    for p in (control, proof):
        assert p.code in (0, 1), (p.out, p.err)
        assert p.reached >= len(kinds.split(",")) and p.last["of"] == STREAMS, p.out
        assert "prove: the gateway is CLOSED now" in p.out, p.out
    assert gw1.status()["state"] == gw2.status()["state"] == "CLOSED"
    # The proof: the preStop's drain waited for every stream, nothing lost, nothing cut.
    assert proof.code == 0, proof.out + proof.err
    assert proof.last == {"lost": 0, "of": STREAMS, "cut": 0, "forced": 0}, proof.out
    assert proof.line("prove: clean: every stream completed"), proof.out
    assert "(active_zero)" in proof.line("receipt:"), proof.out
    return control, proof


@pytest.mark.parametrize("mode", ["http", "tcp"])
def test_haproxy_control_cuts_and_the_proof_loses_nothing(tmp_path, mode):
    """Behind HAProxy the control's flip is followed by the DOWN and its shutdown-sessions: exit
    1, every stream it lost on gw1 is one the gateway counts as cut, and as the LB's."""
    with Rig(tmp_path, gateways=2, tls=mode == "http", tcp=mode == "tcp", timing=QUICK) as rig:
        if mode == "http":  # the 443 frontend: TLS, h2 by ALPN, the certificate checked
            through = ["--through", rig.url("", https=True), "--cacert", str(rig.haproxy.workdir / "tls.crt")]
        else:
            through = ["--through", rig.url("")]
        control, _ = control_then_proof(f"haproxy-{mode}", through, rig.gw("gw1"), rig.gw("gw2"),
                                        "http1,http2,ws", control_s=4, proof_s=2)
        assert rig.haproxy.down_events() and rig.haproxy.down_events()[0][0] == "gw1"
    assert control.code == 1, control.out + control.err
    lost = control.last["lost"]
    assert 1 <= lost <= control.reached and control.last["cut"] == lost, control.out
    assert RECEIPT.search(control.out).groups() == (str(lost), str(lost), "0"), control.out
    assert control.line("control: the LB cut"), control.out
    timeline = control.line("timeline:")
    assert "LB down +" in timeline and "first cut +" in timeline and "(close_lb_requested)" in control.out, timeline


@pytest.mark.parametrize("front", ["envoy", "nginx"])
def test_envoy_and_nginx_cut_nothing_so_the_control_proves_nothing(tmp_path, front):
    """Envoy as the front LB stops sending to a gateway that fails its check and lets its streams
    run; nginx (no active check) never learns of the flip. The control loses nothing, exits 0 and
    says it proved nothing, and why."""
    kinds = "http1,http2,ws" if front == "envoy" else "http1,ws"
    with FrontRig(tmp_path, {"lb_buffer": "2s"}) as rig:
        rig.use(front)
        through = ["--through", rig.url("")]
        if front == "nginx":  # a kind the recipe does not pass (HTTP/2): exit 2 with the cause, no drain
            p = prove(*through, "--health", rig.gw("gw1").url(""), "--kinds", "http2")
            assert p.code == 2 and "http2: curl: (" in p.err, p.err
            assert rig.gw("gw1").status()["state"] == "OPEN"
        control, _ = control_then_proof(front, through, rig.gw("gw1"), rig.gw("gw2"), kinds,
                                        control_s=3 if front == "envoy" else 2, proof_s=2)
    assert control.code == 0, control.out + control.err
    assert control.last == {"lost": 0, "of": STREAMS, "cut": 0, "forced": 0}, control.out
    why = control.line("control: proved nothing: ")
    if front == "envoy":
        assert re.search(r"the LB marked the gateway down \(\+\d+\.\d+ s\) with the streams in flight and cut "
                         r"none: it does not cut at DOWN", why), control.out
    else:
        assert "no LB checker asked this gateway's /health_check.html" in why, control.out
    assert why.endswith("a run without --control proves nothing about this LB"), why
