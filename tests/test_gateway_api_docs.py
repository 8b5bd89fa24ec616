"""Every command of envoyfilter/README.md's "Gateway API" section, run as
written by bash, in its offline form: `make`, `python3`, `sed` and `openssl`
run for real; `kubectl` is a stand-in that has kubectl itself decode what
`apply` would send (`kubectl patch --local`, no cluster) and records it, and
records the Deployment a `rollout` names. The test then checks what was
recorded: schema-valid objects, every file of envoyfilter/gateway-api/
applied, the oversized module ConfigMap applied server-side, the rollout
aimed at the Deployment istiod renders, one token in both distroless places.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.harness import istio
from tests.harness.envoy import REPO, WASM

README = istio.ENVOYFILTER / "README.md"
# Client-side apply stores the whole object in this annotation, capped by the API server.
LAST_APPLIED_LIMIT = 262_144
PLACEHOLDER = "<drain-gate-admin-token>"

# The stand-in: `kubectl apply [--server-side] -f F...` and `kubectl -n NS
# rollout status|restart deploy/NAME`; anything else has no offline form here
# and fails the command.
STAND_IN = textwrap.dedent('''\
    import json, subprocess, sys
    REAL, LOG = {real!r}, {log!r}
    args = sys.argv[1:]

    def record(entry):
        with open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\\n")

    if args[:1] == ["apply"]:
        flags = [a for a in args[1:] if a.startswith("--")]
        files = [args[i + 1] for i, a in enumerate(args) if a == "-f"]
        if set(flags) - {{"--server-side"}} or not files or len(args) != 1 + len(flags) + 2 * len(files):
            sys.exit("no offline form for: kubectl " + " ".join(args))
        for name in files:
            stdin = sys.stdin.read() if name == "-" else None
            r = subprocess.run([REAL, "patch", "--local", "-f", name, "--type", "merge", "-p", "{{}}", "-o", "json"],
                               input=stdin, capture_output=True, text=True, env={{"KUBECONFIG": "/dev/null"}})
            if r.returncode:
                sys.exit(r.stderr)
            doc = json.loads(r.stdout)
            for obj in doc["items"] if doc.get("kind") == "List" else [doc]:
                record({{"verb": "apply", "flags": flags, "file": name, "stdin": stdin, "object": obj}})
    elif len(args) == 5 and args[0] == "-n" and args[2] == "rollout" and args[3] in ("status", "restart"):
        record({{"verb": "rollout " + args[3], "namespace": args[1], "target": args[4]}})
    else:
        sys.exit("no offline form for: kubectl " + " ".join(args))
''')


def section_blocks() -> list[str]:
    text = README.read_text()
    start = text.index("\n## Gateway API\n")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```sh\n(.*?)```", text[start:end], re.S)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> list[dict]:
    """Runs every block of the section; what the kubectl stand-in recorded."""
    tmp = tmp_path_factory.mktemp("docs")
    log = tmp / "kubectl.jsonl"
    (tmp / "bin").mkdir()
    stand_in = tmp / "bin" / "kubectl"
    stand_in.write_text(f"#!{sys.executable}\n" + STAND_IN.format(real=str(istio.KUBECTL), log=str(log)))
    stand_in.chmod(0o755)
    assert istio.KUBECTL.exists(), "run `make k8s-tools`"
    env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"}
    blocks = section_blocks()
    assert len(blocks) >= 3, "the section's commands are in ```sh blocks"
    for block in blocks:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{block}\nfailed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return [json.loads(line) for line in log.read_text().splitlines()]


def untokened(text: str) -> str:
    """A file piped through the distroless `sed` commands, back as written."""
    for token in set(re.findall(r"\b[0-9a-f]{48}\b", text)):
        text = text.replace(f',"admin_token":"{token}"', "").replace(token, PLACEHOLDER)
    return text


def applied(recorded: list[dict]) -> list[dict]:
    return [e for e in recorded if e["verb"] == "apply"]


def test_the_stand_in_refuses_what_it_cannot_check(tmp_path):
    """A command the section might add without an offline form fails the test."""
    log = tmp_path / "log"
    stand_in = tmp_path / "kubectl"
    stand_in.write_text(STAND_IN.format(real=str(istio.KUBECTL), log=str(log)))
    for args in (["delete", "-f", "x.yaml"], ["apply", "--force", "-f", str(istio.GATEWAY_API / "gateway.yaml")],
                 ["-n", "istio-ingress", "rollout", "undo", "deploy/ingress-istio"]):
        r = subprocess.run([sys.executable, str(stand_in), *args], capture_output=True, text=True)
        assert r.returncode != 0 and "no offline form" in r.stderr, args
    assert not log.exists()


def test_every_applied_object_is_schema_valid(recorded):
    gateway_crd = [istio.GATEWAY_API_FIXTURES / "gateways.crd.yaml"]
    validators = {**istio.crd_validators(), **istio.crd_validators(gateway_crd)}
    cel = {**istio.crd_schemas(), **istio.crd_schemas(gateway_crd)}
    objects = [e["object"] for e in applied(recorded)]
    assert {o["kind"] for o in objects} == {"ConfigMap", "EnvoyFilter", "WasmPlugin", "Gateway"}
    for obj in objects:
        name = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] == "ConfigMap":
            assert istio.k8s_errors(obj) == [], name
        else:
            assert istio.crd_errors(obj, validators) == [], name
            assert istio.cel_errors(obj, cel) == [], name


def test_every_file_is_applied_in_the_gateway_namespace(recorded):
    namespace = istio.load_one(istio.GATEWAY_API / "gateway.yaml")["metadata"]["namespace"]
    by_path = {e["file"] for e in applied(recorded) if e["file"] != "-"}
    from_stdin = [untokened(e["stdin"]) for e in applied(recorded) if e["file"] == "-"]
    for path in sorted(istio.GATEWAY_API.rglob("*.yaml")):
        rel = path.relative_to(REPO).as_posix()
        assert rel in by_path or path.read_text() in from_stdin, f"{rel} never applied"
    for e in applied(recorded):
        assert e["object"]["metadata"]["namespace"] == namespace, e["file"]


def test_the_module_configmap_is_applied_server_side(recorded):
    (module,) = [e for e in applied(recorded) if e["object"]["metadata"]["name"] == "drain-gate-wasm"]
    assert base64.b64decode(module["object"]["binaryData"]["drain_gate.wasm"]) == WASM.read_bytes()
    for e in applied(recorded):
        if len(json.dumps(e["object"])) > LAST_APPLIED_LIMIT:
            assert "--server-side" in e["flags"], f"{e['file']} is too big for client-side apply"
    assert len(json.dumps(module["object"])) > LAST_APPLIED_LIMIT, "the control: this one is too big"


def test_rollouts_name_the_deployment_istiod_renders(recorded):
    deployment = istio.gateway_api_rendered()["Deployment"]["metadata"]
    rollouts = [e for e in recorded if e["verb"].startswith("rollout")]
    assert {e["verb"] for e in rollouts} == {"rollout status", "rollout restart"}
    for e in rollouts:
        assert (e["namespace"], e["target"]) == (deployment["namespace"], f"deploy/{deployment['name']}")


def test_distroless_commands_put_one_token_in_both_places(recorded):
    stdin = [e for e in applied(recorded) if e["file"] == "-"]
    (health,) = [e["object"] for e in stdin if e["object"]["kind"] == "EnvoyFilter"]
    (options,) = [e["object"] for e in stdin if e["object"]["kind"] == "ConfigMap"]
    hcm = health["spec"]["configPatches"][0]["patch"]["value"]["filter_chains"][0]["filters"][0]["typed_config"]
    plugin = json.loads(hcm["http_filters"][0]["typed_config"]["config"]["configuration"]["value"])
    token = plugin["admin_token"]
    assert re.fullmatch(r"[0-9a-f]{48}", token), token
    assert f"Bearer {token}" in options["data"]["deployment"] and PLACEHOLDER not in options["data"]["deployment"]
    assert "exec:" not in options["data"]["deployment"], "the distroless ConfigMap"
