"""Every command of envoyfilter/docs/forms.md's "Gateway API" section, run as
written by bash, in its offline form (tests/harness/docs.py): `make`,
`python3`, `sed` and `openssl` run for real; `helm upgrade --install` runs as
`helm template`; `kubectl` is a stand-in that has kubectl itself check the
arguments and decode what `apply` would send (no cluster) and records it, and
records the Deployment a `rollout` names. The test then checks what was
recorded: schema-valid objects, every file of envoyfilter/gateway-api/
applied, every apply server-side, the chart release in the Gateway's
namespace with its one PodDisruptionBudget from the ConfigMap, the rollout
aimed at the Deployment istiod renders, one token in both distroless places.
"""
from __future__ import annotations

import base64
import json
import re

import pytest
import yaml

from tests.harness import docs, istio, k8s
from tests.harness.envoy import REPO, WASM

README = istio.ENVOYFILTER / "docs" / "forms.md"
# Client-side apply stores the whole object in this annotation, capped by the API server.
LAST_APPLIED_LIMIT = 262_144
PLACEHOLDER = "<drain-gate-admin-token>"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> list[dict]:
    """Runs every block of the section; what the stand-ins recorded."""
    shell = docs.OfflineShell(tmp_path_factory.mktemp("docs"))
    blocks = docs.sh_blocks(README, section="Gateway API")
    assert len(blocks) >= 4, "the section's commands are in ```sh blocks"
    for block in blocks:
        r = shell.run(block)
        assert r.returncode == 0, f"{block}\nfailed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return shell.recorded()


def untokened(text: str) -> str:
    """A file piped through the distroless `sed` commands, back as written."""
    for token in set(re.findall(r"\b[0-9a-f]{48}\b", text)):
        text = text.replace(f'"admin_token":"{token}"', '"admin_token":""').replace(token, PLACEHOLDER)
    return text


def applied(recorded: list[dict]) -> list[dict]:
    return [e for e in recorded if e["verb"] == "apply"]


def test_the_stand_in_refuses_what_it_cannot_check(tmp_path):
    """A command the section might add without an offline form, or with
    arguments kubectl refuses, fails the block."""
    shell = docs.OfflineShell(tmp_path)
    for command, complaint in (
            ("kubectl delete -f x.yaml", "not refused by the connection"),
            (f"kubectl apply --force -f {istio.GATEWAY_API / 'gateway.yaml'}", "no offline form"),
            ("kubectl -n istio-ingress rollout status deploy/ingress-istio --timeoutt=1m", "unknown flag")):
        r = shell.run(command)
        assert r.returncode != 0 and complaint in r.stderr, (command, r.stderr)
    assert shell.recorded() == []


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
    # One rule for every object: server-side, so none can be too big for the last-applied annotation.
    for e in applied(recorded):
        assert "--server-side" in e["flags"], f"{e['file']} applied client-side"
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
    plugin = json.loads(istio.plugin_config(health)["configuration"]["value"])
    token = plugin["admin_token"]
    assert re.fullmatch(r"[0-9a-f]{48}", token), token
    assert f"Bearer {token}" in options["data"]["deployment"] and PLACEHOLDER not in options["data"]["deployment"]
    hook = yaml.safe_load(options["data"]["deployment"])["spec"]["template"]["spec"]["containers"][0]["lifecycle"]
    assert hook["preStop"]["exec"] is None and "httpGet" in hook["preStop"], "the distroless ConfigMap"


def test_the_chart_release_renders_the_form_in_the_gateway_namespace(recorded):
    """The chart route: one release in the Gateway's namespace with the
    Gateway, its ConfigMap (which asks istiod for the one PDB), the
    EnvoyFilters and the module; the same objects as the files of the
    kubectl route, but for Helm's labels."""
    gw = istio.load_one(istio.GATEWAY_API / "gateway.yaml")
    (release,) = [e for e in recorded if e["verb"] == "helm install"]
    assert release["args"][release["args"].index("-n") + 1] == gw["metadata"]["namespace"]
    objs = k8s.by_kind(k8s.docs(release["manifest"]))
    assert set(objs) == {("ConfigMap", "drain-gate-wasm"), ("ConfigMap", "ingress-drain-gate"), ("Gateway", "ingress"),
                         ("EnvoyFilter", "drain-gate-health"), ("EnvoyFilter", "drain-gate-traffic"),
                         ("EnvoyFilter", "drain-gate-tcp")}
    assert base64.b64decode(objs[("ConfigMap", "drain-gate-wasm")]["binaryData"]["drain_gate.wasm"]) == WASM.read_bytes()
    for rel, key in (("gateway.yaml", ("Gateway", "ingress")), ("options.yaml", ("ConfigMap", "ingress-drain-gate")),
                     ("health-listener.yaml", ("EnvoyFilter", "drain-gate-health")),
                     ("traffic-filter.yaml", ("EnvoyFilter", "drain-gate-traffic"))):
        shipped, rendered = istio.load_one(istio.GATEWAY_API / rel), objs[key]
        assert rendered == shipped, rel
    assert "podDisruptionBudget" in objs[("ConfigMap", "ingress-drain-gate")]["data"]
