"""envoyfilter/tools/prove.py, the staging proof an operator runs against their own LB, run here
as an operator runs it (a subprocess, standard library and curl only) against every LB the tests
run, each recipe as written: HAProxy 2.6 in mode http (haproxy.cfg's TLS frontend: h2 by ALPN,
the stream's certificate checked with --cacert) and mode tcp (haproxy-tcp.cfg: h2c prior
knowledge), Envoy as the front LB (lb/envoy-front.yaml) and nginx (lb/nginx-drain-gate.conf),
two gateways behind each, the demo backend answering go-httpbin's /drip and /websocket/echo.

Behind each LB the command of envoyfilter/docs/lb.md ("Prove your LB in staging") with the rig's
addresses: the control (the flip at drain start) on gw1, then the proof (the preStop's drain) on
gw2, which then carries every stream:
- HAProxy (`on-marked-down shutdown-sessions`): the control loses streams of every kind, each one
  the drained gateway counts as the LB's cut; the proof loses nothing, cuts nothing: exit 0.
- Envoy and nginx cut nothing at a failed check: the control says so, and why (Envoy: it marked
  the gateway down with the streams in flight and cut none; nginx: no check ever reached the
  gateway); the proof loses nothing: exit 3, proved nothing.
Behind HAProxy too: a proof on a gateway that one kind's streams never reached says that kind
proved nothing (exit 3), the kinds matching HAProxy's own log; a drain ended in FAULT mid-way
(POST /fault) reports what the LB then cut (exit 1).
Bad input exits 2 with the cause and drains nothing: arguments, unreachable URLs, a port that is
not drain-gate's, a gateway not OPEN or in a preStop hold (left as it was), no stream on the
gateway. SIGINT in a drain reopens the gateway (exit 130), even when prove.py started with SIGINT
ignored (a script's background job). With no LB in front, a drain ended in FAULT or whose health
port was lost mid-drain, with nothing lost, proved nothing (exit 3).

Timings are the quick ones (HAProxy inter 1s, lb_buffer 3s; Envoy front inter 500ms, lb_buffer
2s) with short streams, the control's and the proof's alike, outlasting the kind-by-kind start and
the LB's detection window: 5 s behind HAProxy, 4 s behind Envoy, 3 s behind nginx (it has none).
"""
from __future__ import annotations

import ast
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
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
LAST = re.compile(r"^(control|proof): lost (\d+) of (\d+), gateway cut (\d+), forced (\d+)$", re.M)
REACHED = re.compile(r"^(control|proof): (\d+) of (\d+) streams reached the gateway \(([^;]*);", re.M)
RECEIPT = re.compile(r"^(control|proof): receipt: cut (\d+) \(by the LB (\d+), other (\d+)\)", re.M)
KIND = re.compile(r"^(control|proof): (http1|http2|ws): +sent (\d+), on the gateway (\d+), completed (\d+), "
                  r"lost (\d+)", re.M)
VERDICT = re.compile(r"^prove: .*\(exit (\d+)\)", re.M)
STREAMS = 9  # three of each kind: with two gateways behind the LB, >= 1 of each reaches each one
# Launched so: SIGINT ignored on entry, as in a script's background job.
SIGINT_IGNORED = {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)}


@dataclass
class Proof:
    code: int
    out: str
    err: str
    seconds: float

    def last(self, role: str) -> dict[str, int]:
        """A drain's last line: `<role>: lost L of N, gateway cut C, forced F`."""
        found = [m for m in LAST.finditer(self.out) if m[1] == role]
        assert len(found) == 1, self.out + self.err
        return dict(zip(("lost", "of", "cut", "forced"), map(int, found[0].groups()[1:])))

    def reached(self, role: str) -> dict[str, int]:
        """How many streams of each kind the gateway counted: {"http1": 2, ...}."""
        found = [m for m in REACHED.finditer(self.out) if m[1] == role]
        assert len(found) == 1, self.out + self.err
        return {k: int(n) for k, n in (x.split() for x in found[0][4].split(", "))}

    def kinds(self, role: str) -> dict[str, dict[str, int]]:
        """Each kind's line of a drain: sent, on the gateway, completed, lost."""
        return {m[2]: dict(zip(("sent", "on", "completed", "lost"), map(int, m.groups()[2:])))
                for m in KIND.finditer(self.out) if m[1] == role}

    def receipt(self, role: str) -> tuple[int, int, int]:
        (m,) = [m for m in RECEIPT.finditer(self.out) if m[1] == role]
        return int(m[2]), int(m[3]), int(m[4])

    @property
    def verdict(self) -> str:
        """The last line, which names the exit code."""
        last = self.out.rstrip().splitlines()[-1] if self.out.strip() else ""
        m = VERDICT.match(last)
        assert m and int(m[1]) == self.code, self.out + self.err
        return last

    def line(self, prefix: str) -> str:
        (line,) = [x for x in self.out.splitlines() if x.startswith(prefix)] or [""]
        return line


def argv(*args: str) -> list[str]:
    """prove.py as an operator runs it: python3, isolated from this venv's packages."""
    return [sys.executable, "-I", str(PROVE), *args]


def prove(*args: str, name: str | None = None, timeout: float = 150) -> Proof:
    t = time.monotonic()
    r = subprocess.run(argv(*args), capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "COLUMNS": "80"})
    p = Proof(r.returncode, r.stdout, r.stderr, time.monotonic() - t)
    if name:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.txt").write_text(f"$ prove.py {' '.join(args)}\n{p.out}{p.err}exit {p.code} ({p.seconds:.1f} s)\n")
    return p


class Running:
    """prove.py in the background, its output collected, stopped on every exit path."""

    def __init__(self, *args: str, **popen):
        self.proc = subprocess.Popen(argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     **popen)
        self.out = self.err = ""

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def wait(self, timeout: float) -> Proof:
        t = time.monotonic()
        self.out, self.err = self.proc.communicate(timeout=timeout)
        return Proof(self.proc.returncode, self.out, self.err, time.monotonic() - t)


# -- the tool itself ---------------------------------------------------------------------
def test_help_fits_one_screen():
    p = prove("--help")
    lines = p.out.splitlines()
    assert p.code == 0 and len(lines) <= 40 and max(map(len, lines)) <= 80, p.out
    for word in ("--through", "--health", "--control-health", "--control ", "--ledger", "--fingerprint", "--json",
                 "go-httpbin", "--fingerprint: 0 measured",
                 "DRAIN_GATE_ADMIN_TOKEN", "exit: 0 proven", "1 lost, cut or ran twice", "2 bad input",
                 "3 proved nothing", "130 interrupted", "only that", "nothing was cut"):
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
    (["--streams", "2"], "--streams 2: at least one per kind (3)"),
    (["--seconds", "0"], "--seconds 0: between 1 and 600"),
    (["--seconds", "601"], "--seconds 601: between 1 and 600"),
    (["--through", "ftp://203.0.113.10/"], "--through ftp://203.0.113.10/: not an http(s) URL"),
    (["--health", "203.0.113.212:18180"], "--health 203.0.113.212:18180: not an http(s) URL"),
    (["--control-health", "203.0.113.213:18180"], "--control-health 203.0.113.213:18180: not an http(s) URL"),
    (["--control-health", "http://127.0.0.1:1/"], "--control-health and --health: the control drains one "
                                                  "gateway, the proof another"),
    (["--control-health", "http://127.0.0.1:2", "--control"], "--control with --control-health"),
    (["--cacert", "/nonexistent/ca.pem"], "--cacert /nonexistent/ca.pem: no such file"),
    (["--ledger", "ledger.example:8000"], "--ledger ledger.example:8000: not an http(s) URL"),
])
def test_bad_arguments_exit_2_naming_the_option(args, cause):
    base = {"--through": "http://203.0.113.10/", "--health": "http://127.0.0.1:1"}
    flags = [a for a in args if a == "--control"]
    args = [a for a in args if a != "--control"]
    base.update(dict(zip(args[::2], args[1::2])))
    p = prove(*[x for kv in base.items() for x in kv], *flags)
    assert p.code == 2 and cause in p.err and not p.out, (p.out, p.err)


@pytest.mark.parametrize("args, cause", [
    (["--fingerprint", "--control"], "--fingerprint needs --ledger: what the LB resends is counted by the ledger"),
    (["--fingerprint", "--ledger", "http://203.0.113.10/"], "--fingerprint needs a control (--control-health, or "
                                                            "--control)"),
    (["--json", "--ledger", "http://203.0.113.10/", "--control"], "--json prints the fingerprint: add --fingerprint"),
])
def test_fingerprint_arguments_exit_2_naming_what_is_missing(args, cause):
    p = prove("--through", "http://203.0.113.10/", "--health", "http://127.0.0.1:1", *args)
    assert p.code == 2 and cause in p.err and not p.out, (p.out, p.err)


# -- against real gateways, no LB in front ---------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The demo backend and three gateways with no LB in front: a gateway's own traffic port
    serves as --through (it passes every kind)."""
    wd = tmp_path_factory.mktemp("prove-pair")
    with contextlib.ExitStack() as stack:
        backend = Backend(wd).start()
        stack.callback(backend.stop)
        gws = []
        for name in ("gwA", "gwB", "gwC"):
            gw = Gateway(name, backend.port, {"lb_buffer": "1s"}, wd)
            stack.callback(gw.stop)
            gws.append(gw.start())
        yield backend, gws


@pytest.fixture
def gws(pair):
    """gwA and gwB, OPEN (a test that drained one must leave it so; the last tests drain them)."""
    _, gws = pair
    for gw in gws[:2]:
        assert gw.status()["state"] == "OPEN", f"{gw.name} left drained by an earlier test"
    return gws


def traffic(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.ports.traffic}"


def test_unreachable_or_wrong_urls_exit_2_with_the_cause(gws):
    gw, other, _ = gws
    before = gw.status()["receipt"]["drain_started_at"]
    p = prove("--through", traffic(gw), "--health", "http://127.0.0.1:1")
    assert p.code == 2 and "--health http://127.0.0.1:1: unreachable" in p.err, p.err
    p = prove("--through", traffic(gw), "--health", gw.url(""), "--control-health", "http://127.0.0.1:1")
    assert p.code == 2 and "--control-health http://127.0.0.1:1: unreachable" in p.err, p.err
    p = prove("--through", traffic(gw), "--health", traffic(gw))
    assert p.code == 2 and "without drain-gate's status (is it a gateway's :18180?)" in p.err, p.err
    p = prove("--through", "http://127.0.0.1:1", "--health", gw.url(""))
    assert p.code == 2 and "--through http://127.0.0.1:1: http1: curl: (7) Failed to connect" in p.err, p.err
    p = prove("--through", "http://127.0.0.1:1", "--health", gw.url(""), "--kinds", "ws")
    assert p.code == 2 and "--through http://127.0.0.1:1: ws" in p.err and "refused" in p.err, p.err
    assert gw.status()["receipt"]["drain_started_at"] == before, "nothing was drained"
    assert other.status()["state"] == "OPEN"


def test_a_gateway_not_open_exits_2_and_is_left_as_it_was(gws):
    """The proof's gateway or the control's: neither is drained."""
    gw, other, _ = gws
    assert gw.post("/drain?hold=closing").json()["state"] == "CLOSING"
    try:
        p = prove("--through", traffic(gw), "--health", gw.url(""))
        assert p.code == 2 and "the gateway behind --health is CLOSING, not OPEN" in p.err, p.err
        p = prove("--through", traffic(other), "--health", other.url(""), "--control-health", gw.url(""))
        assert p.code == 2 and "the gateway behind --control-health is CLOSING, not OPEN" in p.err, p.err
        assert gw.status()["state"] == "CLOSING", "prove.py left a drain it did not start alone"
        assert other.status()["state"] == "OPEN", "the proof's gateway was drained"
    finally:
        assert gw.post("/reopen").status_code == 200


def test_no_stream_through_the_gateway_exits_2_saying_so(gws):
    """The streams go to gwA, --health is gwB's: none reached it, and it is never drained."""
    gw_a, gw_b, _ = gws
    before = gw_b.status()["receipt"]["drain_started_at"]
    p = prove("--through", traffic(gw_a), "--health", gw_b.url(""), "--streams", "6", "--seconds", "3")
    assert p.code == 2, (p.out, p.err)
    assert "none of the 6 streams reached the gateway behind --health" in p.err, p.err
    assert "it was not drained" in p.err, p.err
    assert p.reached("proof") == {"http1": 0, "http2": 0, "ws": 0}, p.out
    assert gw_b.status()["receipt"]["drain_started_at"] == before, "nothing was drained"


def test_launched_so_sigint_is_ignored_on_entry():
    """What the SIGINT tests rely on: a Python started so finds SIGINT ignored."""
    r = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"],
                       capture_output=True, text=True, **SIGINT_IGNORED)
    assert r.stdout.strip() == "True", r.stdout


def test_sigint_in_a_drain_reopens_the_gateway_even_when_started_with_sigint_ignored(gws):
    """A script's background job starts with SIGINT ignored: prove.py still stops on it, exit 130,
    the gateway OPEN again."""
    gw, _, _ = gws
    with Running("--through", traffic(gw), "--health", gw.url(""), "--streams", "3", "--seconds", "30",
                 **SIGINT_IGNORED) as run:
        wait_for(lambda: gw.status()["state"] == "DRAINING", 20, 0.05, "prove.py's drain")
        run.proc.send_signal(signal.SIGINT)
        p = run.wait(40)
    assert p.code == 130, (p.out, p.err)
    assert "prove: interrupted: the gateway is OPEN again" in p.out, (p.out, p.err)
    assert gw.status()["state"] == "OPEN"
    # Its streams ended with it.
    wait_for(lambda: wire.status(gw.envoy)["active"] == 0, 10, 0.1, "the interrupted run's streams gone")


def test_a_gateway_in_a_prestop_hold_exits_2_and_keeps_its_hold(gws):
    """A held GET /prestop (the pod is terminating) with a stream in flight keeps the gateway
    DRAINING: prove.py refuses it and leaves the hold alone (no /reopen?force). gwB stays drained
    from here on."""
    _, gw, _ = gws
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


def test_a_drain_ended_in_fault_with_nothing_lost_proved_nothing(pair):
    """POST /fault mid-drain, no LB in front to cut: every stream completes, and the run says the
    drain ended in FAULT and proved nothing (exit 3). gwA stays in FAULT from here on."""
    _, (gw, _, _) = pair
    with Running("--through", traffic(gw), "--health", gw.url(""), "--streams", "3", "--seconds", "4") as run:
        wait_for(lambda: gw.status()["state"] == "DRAINING", 20, 0.05, "prove.py's drain")
        assert gw.post("/fault").json()["state"] == "FAULT"
        p = run.wait(60)
    assert p.code == 3, (p.out, p.err)
    assert p.last("proof") == {"lost": 0, "of": 3, "cut": 0, "forced": 0}, p.out
    assert p.line("proof: the drain ended in FAULT"), p.out
    assert "the drain ended in FAULT, not CLOSED" in p.verdict and p.verdict.startswith("prove: proved nothing"), p.out


class Forwarder:
    """A TCP relay in front of a gateway's health port, which the test can take away (as a
    kubectl port-forward that dies): it then refuses every connection and cuts those it relayed."""

    def __init__(self, port: int):
        self.target, self.conns = port, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()


def test_a_health_port_lost_mid_drain_still_reports_what_the_streams_saw(pair):
    """--health through a relay that goes away mid-drain: the streams run on, the run waits for
    them, reports what they saw and that it lost the health port, and exits 3 (nothing lost). The
    drain goes on without it, to CLOSED. gwC stays CLOSED from here on."""
    _, (_, _, gw) = pair
    relay = Forwarder(gw.ports.health)
    try:
        with Running("--through", traffic(gw), "--health", f"http://127.0.0.1:{relay.port}", "--streams", "3",
                     "--seconds", "4") as run:
            wait_for(lambda: gw.status()["state"] == "DRAINING", 20, 0.05, "prove.py's drain")
            relay.close()
            p = run.wait(60)
    finally:
        relay.close()
    assert p.code == 3, (p.out, p.err)
    assert p.last("proof")["lost"] == 0 and p.last("proof")["of"] == 3, p.out
    assert p.line("proof: lost the health port mid-drain"), p.out
    assert "the drain was not followed to its end" in p.verdict, p.out
    assert gw.wait_state("CLOSED", 30)["state"] == "CLOSED"


# -- behind the LBs ---------------------------------------------------------------------------
def readme_command(*flags: str) -> str:
    """prove.py's command in envoyfilter/docs/lb.md ("Prove your LB in staging") that has `flags`
    among its options (none: the streams alone)."""
    found = [c for b in docs.sh_blocks(README) for c in docs.commands(b) if "envoyfilter/tools/prove.py" in c
             and {a for a in shlex.split(c) if a.startswith("--")} & {"--ledger", "--fingerprint", "--json"}
             == set(flags)]
    assert len(found) == 1, found
    return found[0]


def test_the_readme_runs_the_control_then_the_proof_in_one_command():
    argv = shlex.split(readme_command())
    assert argv[:2] == ["python3", "envoyfilter/tools/prove.py"], argv
    assert "--control-health" in argv and "--health" in argv and "--control" not in argv, argv


def as_run_here(command: str, through: list[str], control: str, proof: str, *extra: str) -> list[str]:
    """The README command with a rig's addresses (`through`: the URL and its options) and `extra`."""
    argv = shlex.split(command)
    out, args = [], iter(argv[2:])
    urls = {"--through": through, "--control-health": ["--control-health", control], "--health": ["--health", proof],
            "--ledger": ["--ledger", through[1]]}
    for a in args:
        assert a not in urls or next(args, None), a
        out += urls.get(a, [a])
    return out + list(extra)


def control_then_proof(name: str, through: list[str], gw1: Gateway, gw2: Gateway, kinds: str,
                       seconds: int) -> Proof:
    """The README's command behind a rig's LB: the control on gw1, then the proof on gw2."""
    p = prove(*as_run_here(readme_command(), through, gw1.url(""), gw2.url(""), "--streams", str(STREAMS),
                           "--kinds", kinds, "--seconds", str(seconds)), name=name)
    assert p.code in (0, 3), (p.out, p.err)
    assert "--seconds" not in readme_command()
    for role in ("control", "proof"):
        assert p.last(role)["of"] == STREAMS, p.out
        assert f"{role}: the gateway is CLOSED now" in p.out, p.out
        assert set(p.reached(role)) == set(kinds.split(",")), p.out
    assert gw1.status()["state"] == gw2.status()["state"] == "CLOSED"
    # The proof: the preStop's drain waited for every stream, nothing lost, nothing cut, each kind
    # on its gateway (the control's was out of the LB by then).
    assert p.last("proof") == {"lost": 0, "of": STREAMS, "cut": 0, "forced": 0}, p.out
    assert all(n >= 1 for n in p.reached("proof").values()), p.out
    assert "(active_zero)" in p.line("proof: receipt:"), p.out
    return p


@pytest.mark.parametrize("mode", ["http", "tcp"])
def test_haproxy_control_cuts_every_kind_and_the_proof_loses_nothing(tmp_path, mode):
    """Behind HAProxy the control's flip is followed by the DOWN and its shutdown-sessions: every
    kind cut, each stream it lost on gw1 one the gateway counts as cut, and as the LB's; then the
    proof: exit 0, proven."""
    with Rig(tmp_path, gateways=2, tls=mode == "http", tcp=mode == "tcp", timing=QUICK) as rig:
        if mode == "http":  # the 443 frontend: TLS, h2 by ALPN, the certificate checked
            through = ["--through", rig.url("", https=True), "--cacert", str(rig.haproxy.workdir / "tls.crt")]
        else:
            through = ["--through", rig.url("")]
        p = control_then_proof(f"haproxy-{mode}", through, rig.gw("gw1"), rig.gw("gw2"), "http1,http2,ws",
                               seconds=5)
        assert rig.haproxy.down_events() and rig.haproxy.down_events()[0][0] == "gw1"
    assert p.code == 0, p.out + p.err
    lost = p.last("control")["lost"]
    assert 1 <= lost <= sum(p.reached("control").values()) and p.last("control")["cut"] == lost, p.out
    assert p.receipt("control") == (lost, lost, 0), p.out
    assert all(k["lost"] >= 1 for k in p.kinds("control").values()), p.out
    assert p.line("control: the LB cut ").endswith("(http1, http2, ws) once the check said 503: it cuts at DOWN")
    timeline = p.line("control: timeline:")
    assert "LB down +" in timeline and "first cut +" in timeline and "(close_lb_requested)" in p.out, timeline
    assert p.verdict.startswith("prove: proven (exit 0)"), p.out


@pytest.mark.parametrize("front", ["envoy", "nginx"])
def test_envoy_and_nginx_cut_nothing_so_the_control_proves_nothing(tmp_path, front):
    """Envoy as the front LB stops sending to a gateway that fails its check and lets its streams
    run; nginx (no active check) never learns of the flip. The control alone (--control) loses
    nothing and says it proved nothing, and why: exit 3. Then, gw1 replaced, the README's command:
    exit 3 as well, though the proof lost nothing."""
    kinds = "http1,http2,ws" if front == "envoy" else "http1,ws"
    seconds = "4" if front == "envoy" else "3"
    with FrontRig(tmp_path, {"lb_buffer": "2s"}) as rig:
        rig.use(front)
        through = ["--through", rig.url("")]
        if front == "nginx":  # a kind the recipe does not pass (HTTP/2): exit 2 with the cause, no drain
            p = prove(*through, "--health", rig.gw("gw1").url(""), "--kinds", "http2")
            assert p.code == 2 and "http2: curl: (" in p.err, p.err
            assert rig.gw("gw1").status()["state"] == "OPEN"
        alone = prove(*through, "--health", rig.gw("gw1").url(""), "--control", "--streams", str(STREAMS),
                      "--kinds", kinds, "--seconds", seconds, name=f"{front}-control")
        rig.gw("gw1").stop()  # its pod replaced
        rig.gw("gw1").start()
        if front == "envoy":
            rig.lb.wait_status("gw1", "UP", 30)
        p = control_then_proof(front, through, rig.gw("gw1"), rig.gw("gw2"), kinds, seconds=int(seconds))
    for run in (alone, p):
        assert run.code == 3, run.out + run.err
        assert run.last("control") == {"lost": 0, "of": STREAMS, "cut": 0, "forced": 0}, run.out
        why = run.verdict
        assert why.startswith("prove: proved nothing (exit 3): the control cut nothing: "), why
        if front == "envoy":
            assert re.search(r"the LB marked the gateway down \(\+\d+\.\d+ s\) with the streams in flight and "
                             r"cut none: it does not cut at DOWN", why), run.out
        else:
            assert "no LB checker asked this gateway's /health_check.html" in why, run.out
    assert "proof:" not in alone.out, alone.out


@pytest.fixture(scope="module")
def haproxy(tmp_path_factory):
    """HAProxy (haproxy.cfg, mode http) in front of two gateways, `balance roundrobin`: the next
    two tests drain one each."""
    with Rig(tmp_path_factory.mktemp("prove-haproxy"), gateways=2, timing=QUICK) as rig:
        yield rig


def test_a_kind_with_no_stream_on_the_drained_gateway_proved_nothing(haproxy):
    """One stream of each kind, opened one after the other: HAProxy's round robin sends them to
    gw1 and gw2 in turn, so one kind has no stream on gw1. The run drains gw1, finds every stream
    completed, and says that kind proved nothing: exit 3. HAProxy's log agrees on which kind."""
    rig, gw = haproxy, haproxy.gw("gw1")
    # 6 s: a stream outlasts the wait for each kind to show on the gateway (at most 2 s a kind).
    p = prove("--through", rig.url(""), "--health", gw.url(""), "--kinds", "http1,ws", "--streams", "2",
              "--seconds", "6", name="haproxy-missing-kind")
    assert p.code == 3, (p.out, p.err)
    assert p.last("proof") == {"lost": 0, "of": 2, "cut": 0, "forced": 0}, p.out
    # HAProxy logs a request as it ends: the ws stream after the ws probe.
    served = wait_for(lambda: (lambda ws: ws and {"http1": rig.haproxy.server_of("/drip?duration=6s"), "ws": ws[-1]})(
        [r.server for r in rig.haproxy.requests() if "/websocket/echo" in r.request][1:]), 10, 0.1, "the log")
    assert sorted(served.values()) == ["gw1", "gw2"], served
    assert p.reached("proof") == {k: int(s == "gw1") for k, s in served.items()}, (served, p.out)
    (missing,) = [k for k, s in served.items() if s == "gw2"]
    assert p.verdict == (f"prove: proved nothing (exit 3): {missing}: no stream of it crossed the drained gateway "
                         "(more --streams)"), p.out
    assert gw.status()["state"] == "CLOSED"


def test_a_drain_ended_in_fault_reports_what_the_lb_cut(haproxy):
    """POST /fault on gw2 mid-drain: its check says 503, HAProxy marks it down and cuts its
    streams. The run follows the drain to FAULT, waits for the streams, reports every one lost,
    and exits 1: losses trump. gw1 is out of the LB first (drained by the last test, or here)."""
    rig, gw = haproxy, haproxy.gw("gw2")
    if rig.gw("gw1").status()["state"] == "OPEN":
        rig.gw("gw1").post("/drain")
    rig.wait_lb("gw1", "DOWN", 30)
    with Running("--through", rig.url(""), "--health", gw.url(""), "--kinds", "http1,ws", "--streams", "4",
                 "--seconds", "10") as run:
        wait_for(lambda: gw.status()["state"] == "DRAINING", 30, 0.05, "prove.py's drain")
        assert gw.post("/fault").json()["state"] == "FAULT"
        p = run.wait(90)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "haproxy-fault.txt").write_text(p.out + p.err + f"exit {p.code}\n")
    assert p.code == 1, (p.out, p.err)
    assert p.last("proof")["lost"] == 4 and p.last("proof")["of"] == 4, p.out
    assert {k: v["lost"] for k, v in p.kinds("proof").items()} == {"http1": 2, "ws": 2}, p.out
    assert p.line("proof: the drain ended in FAULT"), p.out
    assert p.verdict.startswith("prove: LOST (exit 1): the drain lost 4 of 4 stream(s)"), p.out
    assert "the drain ended in FAULT, not CLOSED" in p.verdict, p.out
    assert rig.haproxy.down_events()[-1][0] == "gw2"
