"""envoyfilter/tools/ledger.py, the application that counts what it executes (the backend of
tests/lb/test_no_duplicates.py and of the duplicates check in staging), run as an operator runs it
(python3 -I: the standard library only): executions counted per id, an Idempotency-Key's answer
replayed and 409 while its first request runs, SIGINT and SIGTERM stop it (SIGINT also when it was
started with SIGINT ignored, as a script's background job is). And envoyfilter/kubernetes/prove-ledger.yaml:
valid objects, the ConfigMap its header's command makes (kubectl, offline) is the one it mounts, and
its header's commands are the ones the operator's pages show."""
from __future__ import annotations

import ast
import signal
import subprocess
import sys
import threading

import pytest
import requests

from tests.harness import docs, istio, k8s
from tests.harness.ledger import LEDGER, Ledger
from tests.harness.process import wait_for

PROVE_LEDGER = istio.KUBERNETES / "prove-ledger.yaml"


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path) as led:
        yield led


def call(led: Ledger, method: str, path: str, **kw) -> requests.Response:
    return requests.request(method, led.url(path), timeout=10, **kw)


def test_standard_library_only():
    tree = ast.parse(LEDGER.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert names and names <= set(sys.stdlib_module_names) | {"__future__"}, names - set(sys.stdlib_module_names)


def test_every_request_is_one_execution_of_its_id(ledger):
    """Any method, counted as it arrives, whatever it is answered; a DELETE of /executions forgets."""
    assert call(ledger, "GET", "/ledger/a").json() == {"id": "a", "executions": 1}
    r = call(ledger, "POST", "/ledger/a?status=503", data=b"x" * 5000)
    assert (r.status_code, r.json()) == (503, {"id": "a", "executions": 2})
    assert call(ledger, "PUT", "/ledger/b?hold_ms=50").status_code == 200
    assert call(ledger, "HEAD", "/ledger/c").status_code == 200
    assert call(ledger, "GET", "/executions").json() == {"executions": {"a": 2, "b": 1, "c": 1}, "total": 4,
                                                         "duplicates": ["a"]}
    assert call(ledger, "GET", "/ledger/a?hold_ms=x").status_code == 400
    assert call(ledger, "GET", "/ledger/a?status=99").status_code == 400
    assert call(ledger, "GET", "/elsewhere").status_code == 404
    assert call(ledger, "GET", "/executions").json()["executions"] == {"a": 2, "b": 1, "c": 1}, "refused: not run"
    assert call(ledger, "DELETE", "/executions").json() == {"executions": {}, "total": 0, "duplicates": []}


def test_an_idempotency_key_runs_once_and_replays_its_answer(ledger):
    key = {"Idempotency-Key": "k-1"}
    first = call(ledger, "POST", "/ledger/pay?status=201", headers=key)
    assert (first.status_code, first.json()) == (201, {"id": "pay", "executions": 1})
    again = call(ledger, "POST", "/ledger/pay?status=201", headers=key)
    assert (again.status_code, again.content) == (201, first.content)
    # The same key under another path replays the first answer too: one request per key.
    assert call(ledger, "POST", "/ledger/other", headers=key).status_code == 201
    assert call(ledger, "GET", "/executions").json()["executions"] == {"pay": 1}
    assert call(ledger, "POST", "/ledger/pay?status=201", headers={"Idempotency-Key": "k-2"}).json()["executions"] == 2


def test_a_key_still_running_is_answered_409(ledger):
    key = {"Idempotency-Key": "slow"}
    first: list[requests.Response] = []
    t = threading.Thread(target=lambda: first.append(call(ledger, "POST", "/ledger/slow?hold_ms=1500", headers=key)))
    t.start()
    try:
        wait_for(lambda: ledger.executions().get("slow"), 5, 0.02, "the first request running")
        r = call(ledger, "POST", "/ledger/slow?hold_ms=1500", headers=key)
        assert r.status_code == 409 and "still running" in r.json()["error"], r.text
    finally:
        t.join(10)
    assert first and first[0].status_code == 200, first
    assert call(ledger, "POST", "/ledger/slow?hold_ms=1500", headers=key).content == first[0].content
    assert ledger.executions() == {"slow": 1}


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_stop_it_even_started_with_sigint_ignored(tmp_path, sig):
    """Started as a script's background job is (SIGINT ignored, which Python then leaves so), it still
    stops on SIGINT: it installs its handlers itself. The control, a Python started the same way,
    goes on through the same SIGINT."""
    led = Ledger(tmp_path).start(preexec_fn=_ignore_sigint)
    control = subprocess.Popen([sys.executable, "-I", "-c", "print('ready', flush=True); import time; time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint)
    try:
        assert control.stdout.readline().strip() == "ready"
        control.send_signal(signal.SIGINT)
        led.proc.send_signal(sig)
        assert led.proc.wait(10) == 0, led.log_tail()
        assert control.poll() is None, "the control stopped: SIGINT was not ignored, the test proves nothing"
    finally:
        led.stop()
        control.kill()
        control.wait(10)


def test_a_port_it_cannot_listen_on_exits_2(tmp_path, ledger):
    r = subprocess.run([sys.executable, "-I", str(LEDGER), "--listen", f"127.0.0.1:{ledger.port}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith(f"ledger: cannot listen on 127.0.0.1:{ledger.port}"), r


# -- kubernetes/prove-ledger.yaml ------------------------------------------------------------

def header_commands() -> list[str]:
    """The commands of the file's header comment (continuation lines joined, a trailing comment dropped)."""
    lines = []
    for line in PROVE_LEDGER.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    first = next(i for i, x in enumerate(lines) if x.startswith("kubectl "))
    return [plain(c) for c in docs.commands("\n".join(lines[first:]))]


def plain(command: str) -> str:
    """A command without its trailing comment, its spaces single."""
    return " ".join(command.split("  #", 1)[0].split())


def test_prove_ledger_yaml_is_valid_and_mounts_the_configmap_its_header_makes():
    objs = {d["kind"]: d for d in istio.load_docs(PROVE_LEDGER)}
    assert set(objs) == {"Deployment", "Service"}
    for obj in objs.values():
        assert istio.k8s_errors(obj) == [], obj["kind"]
    dep, svc = objs["Deployment"], objs["Service"]
    ns = dep["metadata"]["namespace"]
    assert svc["metadata"]["namespace"] == ns and dep["spec"]["replicas"] == 1, "one process holds the counts"
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = pod["volumes"]
    (mount,) = container["volumeMounts"]
    assert mount["name"] == volume["name"]
    # What the header's command makes, offline.
    made = k8s.run("kubectl", "create", "configmap", volume["configMap"]["name"], "-n", ns,
                   "--from-file=envoyfilter/tools/ledger.py", "--dry-run=client", "-o", "yaml").stdout
    (cm,) = k8s.docs(made)
    assert istio.k8s_errors(cm) == []
    assert cm["data"] == {"ledger.py": LEDGER.read_text()}
    assert container["command"][:2] == ["python3", f"{mount['mountPath']}/ledger.py"]
    listen = container["command"][container["command"].index("--listen") + 1]
    assert listen.endswith(f":{container['ports'][0]['containerPort']}")
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": container["ports"][0]["name"]}
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == container["ports"][0]["name"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    (ns_obj,) = k8s.docs(k8s.run("kubectl", "create", "namespace", ns, "--dry-run=client", "-o", "yaml").stdout)
    assert istio.k8s_errors(ns_obj) == []
    cmds = header_commands()
    assert f"kubectl create namespace {ns} --dry-run=client -o yaml | kubectl apply --server-side -f -" in cmds, cmds
    assert (f"kubectl create configmap {volume['configMap']['name']} -n {ns} --from-file=envoyfilter/tools/ledger.py "
            "--dry-run=client -o yaml | kubectl apply --server-side -f -") in cmds, cmds


def test_prove_ledger_header_commands_are_the_ones_the_docs_show():
    """Every command of the header, in its order, in one ```sh block of the operator's pages (which
    tests/deploy/test_install_commands.py runs offline)."""
    cmds = header_commands()
    assert len(cmds) == 5, cmds
    shown = [[plain(c) for c in docs.commands(b)] for b in docs.sh_blocks(docs.OPERATOR_PAGES)
             if "prove-ledger.yaml" in b]
    assert shown, "no page shows how to run kubernetes/prove-ledger.yaml"
    assert any([c for c in block if c in cmds] == cmds for block in shown), (cmds, shown)
