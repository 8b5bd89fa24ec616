"""The canary of a new image (envoyfilter/docs/rollout.md, "Canary a new image"):

- offline (helm template, the fleet's values as `helm get values` gives them):
  the canary command adds the canary pod's two objects and changes no other,
  and they select only the pod carrying drain-gate.io/canary=true; the command
  as it was (no fleet values) changes every pod (the control); the EnvoyFilter
  form refuses a canary; the README's block runs as written with the stand-ins;
- in real Envoy 1.40, with the listeners istiod builds for the canary pod and
  the chart's placeholder EnvoyFilter applied to them: a canary module that is
  fetched but does not load keeps a new pod out of the LB (503 WAIT) while its
  requests pass, and the fixed image announces it; on a pod in service it
  drains the pod, the LB check 200 until the last request ends, nothing cut.
  The control, the chart as it was (no placeholder): the LB check 200 while the
  pod answers every request 500.

  PYTHONPATH=. .venv/bin/python -m pytest tests/deploy/test_canary.py -v -p no:cacheprovider
"""
from __future__ import annotations

import base64
import json
import os
import tempfile
import time

import pytest
import requests
import yaml

from tests.deploy.test_istio_envoy import (  # noqa: F401
    CANARY_LABELS,
    CANARY_URL,
    _canary_plugins,
    _wasmplugin_gateway,
    canary_pod,
    lb_check,
    load,
    local_module,
    pulled_wasm,
    start_gateway,
)
from tests.harness import docs, istio, k8s
from tests.harness.envoy import WASM, Envoy, free_port, wait_for
from tests.harness.variants import Lds
from tests.harness.wire import status

README = istio.ENVOYFILTER / "docs" / "rollout.md"
NS = "istio-system"
DIGEST = "b" * 64
CANARY = ("--set", f"wasmPlugin.canary.url={CANARY_URL}", "--set", f"wasmPlugin.canary.sha256={DIGEST}")
CANARY_OBJECTS = {("WasmPlugin", "drain-gate-traffic-canary"), ("EnvoyFilter", "drain-gate-traffic-canary-placeholder")}
# A module istio-agent fetched that Envoy cannot load: the wasm header, a broken body.
CORRUPT = b"\0asm\x01\0\0\0" + bytes(range(256)) * 16


def oci_fleet_values() -> dict:
    """What `helm get values drain-gate` gives for a fleet on the oci:// route with
    one value of its own: the values it was installed with, the module included."""
    return {"form": "wasmplugin",
            "wasmPlugin": {"url": "oci://registry.example.com/drain-gate/drain-gate:0.1.0", "sha256": "a" * 64},
            "config": {"lb_buffer": "20s"},
            "wasm": {"base64": base64.b64encode(WASM.read_bytes()).decode()}}


def render(values: dict | None, tmp_path, *args: str) -> dict[tuple[str, str], dict]:
    files = []
    if values is not None:
        path = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(values))
        files = ["-f", str(path)]
    return k8s.by_kind(k8s.template(*files, *args))


def changed(before: dict, after: dict) -> set[tuple[str, str]]:
    """The objects one render has and the other lacks, or has otherwise."""
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


# -- the command: one pod, in the fleet's own form and values ------------------------------------
def test_the_canary_command_adds_the_canary_pods_objects_and_changes_no_other(tmp_path):
    fleet = render(oci_fleet_values(), tmp_path)
    canary = render(oci_fleet_values(), tmp_path, *CANARY)
    assert changed(fleet, canary) == CANARY_OBJECTS and not set(fleet) & CANARY_OBJECTS
    for key in CANARY_OBJECTS:
        assert not istio.selects_workload(canary[key], NS, istio.POD_LABELS), f"{key} reaches a fleet pod"
        assert istio.selects_workload(canary[key], NS, CANARY_LABELS), f"{key} misses the canary pod"
    # The canary pod's values give it the label the chart selects.
    canary_values = istio.load_one(istio.KUBERNETES / "gateway-values-canary.yaml")
    chart = istio.load_one(k8s.CHART / "values.yaml")["wasmPlugin"]["canaryLabel"]
    assert chart.items() <= canary_values["labels"].items()


def test_the_command_as_it_was_changes_every_pod(tmp_path):
    """The control: `--set form=wasmplugin` and the canary, without the fleet's values
    (--set-file of the module only), as the README had it."""
    module = k8s.wasm_base64_file(WASM.read_bytes(), tmp_path)
    as_it_was = ("--set-file", f"wasm.base64={module}", "--set", "form=wasmplugin", *CANARY)
    # An oci:// fleet: its WasmPlugins lose the image and its digest (every pod's module changes).
    fleet, after = render(oci_fleet_values(), tmp_path), render(None, tmp_path, *as_it_was)
    assert ("WasmPlugin", "drain-gate-traffic") in changed(fleet, after)
    assert after[("WasmPlugin", "drain-gate-traffic")]["spec"]["url"].startswith("file://")
    # A fleet in the default form (its own lb_buffer): switched to the WasmPlugin form, its
    # traffic EnvoyFilters gone, the health listener in another vm_id with the chart's lb_buffer.
    ef_values = {"config": {"lb_buffer": "20s"}, "wasm": {"base64": oci_fleet_values()["wasm"]["base64"]}}
    fleet, after = render(ef_values, tmp_path), render(None, tmp_path, *as_it_was)
    assert ("EnvoyFilter", "drain-gate-traffic") in set(fleet) - set(after)

    def health(objs):
        plugin = istio.plugin_config(objs[("EnvoyFilter", "drain-gate-health")], "drain-gate-health")
        return plugin["vm_config"]["vm_id"], json.loads(plugin["configuration"]["value"])["lb_buffer"]
    assert (health(fleet), health(after)) == (("drain-gate", "20s"), ("", "10s"))
    # With the fleet's own values the EnvoyFilter form has no canary to give: refused, naming it.
    (tmp_path / "ef.yaml").write_text(yaml.safe_dump(ef_values))
    r = k8s.template("-f", str(tmp_path / "ef.yaml"), *CANARY, check=False)
    assert r.returncode != 0 and "wasmPlugin.canary.url take effect with form wasmplugin only" in r.stderr


def test_the_fleets_pods_get_the_same_listeners_with_the_canary(tmp_path, pulled_wasm):  # noqa: F811
    """What istiod builds from the canary render for a fleet pod is what it
    built before (nothing selects it); only the canary pod's listeners differ."""
    fleet_only = _canary_plugins(pulled_wasm)[:1]
    before = _wasmplugin_gateway(tmp_path, load("wasmplugin/health-listener.yaml"),
                                 [istio.gateway_listener(8080)], fleet_only)
    assert canary_pod(tmp_path, _canary_plugins(pulled_wasm), labels=istio.POD_LABELS) == before
    assert canary_pod(tmp_path, _canary_plugins(pulled_wasm)) != before


def fleet_release(workdir) -> tuple[str, str]:
    """What `helm get values` and `helm get manifest` answer for the oci:// fleet."""
    values = yaml.safe_dump(oci_fleet_values())
    path = workdir / "fleet-release-values.yaml"
    path.write_text(values)
    return values, k8s.run("helm", "template", "drain-gate", str(k8s.CHART), "-n", NS, "-f", str(path)).stdout


def test_the_readmes_check_fails_on_a_canary_that_changes_the_fleet(tmp_path):
    """The README block's `! grep '^<' <(diff …)` (run as written, with the fleet's
    values, by tests/deploy/test_install_commands.py) fails on a render without them."""
    (block,) = [b for b in docs.sh_blocks(README, "Canary a new image (the `oci://` route)") if "helm get values" in b]
    (check,) = [c for c in docs.commands(block) if c.startswith("! grep")]
    _, running = fleet_release(tmp_path)
    bare = k8s.run("helm", "template", "drain-gate", str(k8s.CHART), "-n", NS, "--set", "form=wasmplugin",
                   "--set", "wasm.configMap.create=false", *CANARY).stdout
    out = tmp_path / "out" / "canary"
    out.mkdir(parents=True)
    (out / "fleet.yaml").write_text(running)
    shell = docs.OfflineShell(tmp_path / "docs")
    (out / "canary.yaml").write_text(running)
    assert shell.run(check.replace("out/canary/", f"{out}/")).returncode == 0, "a render equal to the fleet's"
    (out / "canary.yaml").write_text(bare)
    r = shell.run(check.replace("out/canary/", f"{out}/"))
    assert r.returncode != 0 and "oci://registry.example.com/drain-gate/drain-gate:0.1.0" in r.stdout


# -- in real Envoy: a canary module that is fetched but does not load -------------------------
@pytest.fixture
def corrupt(tmp_path):
    path = tmp_path / "cache" / "corrupt.wasm"
    path.parent.mkdir()
    path.write_bytes(CORRUPT)
    return path


def _rename_into(path, text: str) -> None:
    """Replaces `path` atomically (Envoy's file-based xDS sees a move into place)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".next-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def test_a_new_canary_pod_whose_module_does_not_load_stays_out_until_one_loads(start_gateway, tmp_path, corrupt,
                                                                              pulled_wasm):  # noqa: F811
    env = start_gateway(istio.ENVOY_MATRIX[-1], canary_pod(tmp_path, _canary_plugins(corrupt)), ready_path=None)
    # The kubelet's view first (no LB check yet: a new pod nobody has sent anything).
    wait_for(lambda: _readiness(env) == (503, "filter_config"), 30,
             what="readiness waiting for the canary filter's configuration")
    assert status(env)["traffic"]["placeholders"] >= 1
    r = requests.get(f"http://127.0.0.1:{env.at[8080]}/", timeout=5)
    assert (r.status_code, r.text) == (200, "hello\n"), "the placeholder passes requests on"
    wait_for(lambda: status(env)["traffic"]["placeholders_serving"] >= 1, 5, what="the request seen")
    assert lb_check(env) == ("HTTP/1.0 503 Service Unavailable", b"WAIT\n")
    ready = requests.get(env.health("/health"), timeout=5)
    assert (ready.status_code, ready.json()["waiting_for"]) == (503, "filter_config")
    st = status(env)
    assert (st["state"], st["waiting_for"], st["count"]["reliable"]) == ("OPEN", "filter_config", True)
    # A fixed image: istio-agent delivers a module that loads; the placeholder goes, the pod is announced.
    canary = _canary_plugins(pulled_wasm)[1]
    ecds = next(p for p in tmp_path.glob("ecds-*.yaml") if "drain-gate-traffic-canary" in p.read_text())
    _rename_into(ecds, yaml.safe_dump({"version_info": "2", "resources": [canary[1]]}))
    wait_for(lambda: lb_check(env)[0] == "HTTP/1.0 200 OK", 10, what="announced once the canary loaded")
    assert status(env)["traffic"]["placeholders"] == 0
    assert requests.get(env.health("/health"), timeout=5).status_code == 200


def test_without_the_placeholder_the_pod_answers_500_behind_a_check_of_200(start_gateway, tmp_path, corrupt):
    """The control: the chart as it was, the canary's filter with no default."""
    env = start_gateway(istio.ENVOY_MATRIX[-1], canary_pod(tmp_path, _canary_plugins(corrupt), placeholder=False))
    assert requests.get(f"http://127.0.0.1:{env.at[8080]}/", timeout=5).status_code == 500
    assert lb_check(env) == ("HTTP/1.0 200 OK", b"OK\n")
    assert status(env)["traffic"]["placeholders"] == 0


def _readiness(env) -> tuple[int, str | None] | None:
    try:
        r = requests.get(env.health("/health"), timeout=2)
    except requests.RequestException:
        return None
    return r.status_code, r.json().get("waiting_for")


def test_a_canary_that_does_not_load_on_a_pod_in_service_drains_it_and_cuts_nothing(backend_port, stream, tmp_path,
                                                                                   corrupt, monkeypatch):
    """A pod in service (its LB check answered 200, a long request in flight) gets
    the canary's filter with a module that does not load, as istiod pushes it
    (file-based LDS and ECDS stand in for ADS). The listener with the placeholder
    serves; its first request starts a drain that holds CLOSING: the LB check stays
    200 while both requests run and turns 503 at the end of the last."""
    monkeypatch.setenv("ENVOY_BIN", istio.envoy_bin(istio.ENVOY_MATRIX[-1]))
    at = {8080: free_port(), istio.HEALTH_PORT: free_port()}
    admin = free_port()
    health = load("wasmplugin/health-listener.yaml")
    plugins = _canary_plugins(corrupt)
    (tmp_path / "before").mkdir()
    before = _wasmplugin_gateway(tmp_path / "before", health, [istio.gateway_listener(8080)], plugins[:1],
                                 CANARY_LABELS)
    with_canary = canary_pod(tmp_path, plugins)
    ecds = tmp_path / "ecds"
    lds = Lds(istio.gateway_bootstrap(before, at, admin, backend_port, WASM, ecds_dir=ecds), tmp_path / "lds")
    # pilot-agent's drainDuration (45 s) keeps a replaced chain's connections; 30 s outlasts the test.
    env = Envoy(lds.doc, istio.harness_ports(at, admin, backend_port), concurrency=2, workdir=tmp_path / "envoy",
                drain_time_s=30)
    with env:
        env.start(timeout=60)
        wait_for(lambda: lb_check(env)[0] == "HTTP/1.0 200 OK", 5, what="an LB check answered 200: announced")
        old = stream(f"http://127.0.0.1:{at[8080]}/stream?seconds=6&interval_ms=250")
        wait_for(lambda: status(env)["active"] == 1, 10, what="the request on the chain before counted")
        lds.push(istio.gateway_bootstrap(with_canary, at, admin, backend_port, WASM, ecds_dir=ecds)[
            "static_resources"]["listeners"])
        wait_for(lambda: status(env)["traffic"]["placeholders"] >= 1, 20, what="the new chain with the placeholder")
        assert (status(env)["state"], lb_check(env)[0]) == ("OPEN", "HTTP/1.0 200 OK"), "only present: no change"
        # The new chain serves as soon as the ECDS update is refused; a new connection reaches it.
        new = wait_for(lambda: _through_placeholder(env, stream, at[8080]), 20, what="a request through the placeholder")
        wait_for(lambda: status(env)["state"] == "DRAINING", 5, what="the drain the placeholder started")
        assert status(env)["progress"]["reason"] == "filter_not_loaded"
        # A drain counts exactly (a lease given back by the next tick): both requests, the old chain's and the new's.
        wait_for(lambda: status(env)["active"] == 2, 2, what="both requests counted")
        held = 0
        while old.running() or new.running():
            if status(env)["active"] > 0:
                assert lb_check(env)[0] == "HTTP/1.0 200 OK"
                held += 1
            time.sleep(0.1)
        assert held >= 10
        assert old.wait(10) == 0 and old.chunks == 24, old.err
        assert new.wait(10) == 0 and new.chunks == 12, new.err
        wait_for(lambda: lb_check(env)[0] == "HTTP/1.0 503 Service Unavailable", 2, what="the flip at the last end")
        st = status(env)
        assert (st["state"], st["progress"]["forced"], st["progress"]["active_at_closing"]) == ("CLOSING", False, 0)
        time.sleep(st["progress"]["lb_buffer_ms"] / 1000 + 0.5)
        assert status(env)["state"] == "CLOSING", "held: a maintenance drain, never closed by lb_buffer"


def _through_placeholder(env, stream, port: int):
    """A streaming request on a new connection, once it went through the
    placeholder (else None: the request reached the chain before)."""
    serving = status(env)["traffic"]["placeholders_serving"]
    s = stream(f"http://127.0.0.1:{port}/stream?seconds=3&interval_ms=250")
    try:
        wait_for(lambda: status(env)["traffic"]["placeholders_serving"] > serving, 1, what="")
    except TimeoutError:
        s.wait(10)
        return None
    return s
