"""The API keeps its written contract: src/openapi.yaml describes every path,
method, status, header and JSON body of the health listener, and schemathesis
finds no real answer that departs from it.

Admin calls change the state, so each run uses an Envoy where that is
harmless or informative: one where a drain completes inside the request
(`wait=closed` never holds), one where admin calls come from outside
`admin_allow` with a token configured (401), and one that starts in a soft
drain where held waits are excluded.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.harness.envoy import REPO, VM_TROUBLE
from tests.harness.wire import fresh_get, post, state

SPEC = REPO / "src" / "openapi.yaml"
ST = Path(os.environ.get("SCHEMATHESIS", REPO / ".venvs" / "schemathesis" / "bin" / "st"))
EXAMPLES = os.environ.get("CONTRACT_EXAMPLES", "25")
CHECKS = ",".join([
    "status_code_conformance", "content_type_conformance", "response_headers_conformance",
    "response_schema_conformance", "negative_data_rejection", "allow_header_conformance",
])
TOKEN = "contract-token-0123456789"


@pytest.fixture(scope="module", autouse=True)
def _schemathesis_installed():
    if not ST.exists():
        pytest.fail(f"{ST} is missing: run `make contract-deps` (part of `make test`)")


def schemathesis(gw, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    args = [str(ST), "run", str(SPEC), "--url", f"http://127.0.0.1:{gw.ports.health}",
            "--checks", CHECKS, "--max-examples", EXAMPLES, "--generation-deterministic", "--phases", "examples,coverage,fuzzing",
            "--request-timeout", "10", "--no-color", "--workers", "1",
            "--suppress-health-check", "all", *extra]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
    assert p.returncode == 0, f"schemathesis found non-conforming answers:\n{p.stdout[-12000:]}\n{p.stderr[-3000:]}"
    return p


def test_every_answer_conforms_when_a_drain_completes_at_once(gateway, tmp_path):
    gw = gateway({"min_drain": "0s", "lb_buffer": "0s"})
    schemathesis(gw, tmp_path)
    assert state(gw) in ("CLOSED", "FAULT"), "the admin calls really ran"
    assert not VM_TROUBLE.search(gw.log())


def test_every_answer_conforms_for_callers_outside_admin_allow(gateway, tmp_path):
    gw = gateway({"admin_allow": ["127.0.0.2/32"], "admin_token": TOKEN, "drain_timeout": "60m", "lb_buffer": "60m"})
    schemathesis(gw, tmp_path, "--generation-with-security-parameters", "false")
    assert state(gw) == "OPEN", "no admin call got through"


def test_every_answer_conforms_in_a_soft_drain(gateway, tmp_path):
    gw = gateway({"draining_lb_status": 404, "min_drain": "30m", "drain_timeout": "60m", "lb_buffer": "60m"})
    assert post(gw, "/drain").json()["state"] == "DRAINING"
    # Held waits would hold for up to an hour here: leave them to the first run.
    schemathesis(gw, tmp_path, "--exclude-operation-id", "drain", "--exclude-operation-id", "prestop")


METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"]


def test_unlisted_methods_and_paths_answer_as_the_spec_says(gateway):
    """What schemathesis does not generate: every method the spec does not list
    for a path gets 405 with `Allow` naming exactly the listed ones, and a path
    the spec does not list gets 404 — both with the spec's Error body."""
    spec = yaml.safe_load(SPEC.read_text())
    errors = spec["components"]["schemas"]["Error"]["properties"]["error"]["enum"]
    gw = gateway({"min_drain": "30m", "drain_timeout": "60m", "lb_buffer": "60m"})
    checked = 0
    for path, ops in spec["paths"].items():
        listed = [m for m in METHODS if m.lower() in ops]
        assert listed, path
        for method in METHODS:
            if method in listed:
                continue
            code, headers, body = fresh_get(gw.ports.health, path, method=method)
            assert code == 405, (method, path, code, body)
            assert headers["allow"] == ", ".join(listed), (method, path, headers)
            assert headers["cache-control"] == "no-store"
            if method != "HEAD":
                doc = json.loads(body)
                assert set(doc) == {"error", "message"} and doc["error"] == "method_not_allowed" in errors
            checked += 1
    for path in ["/", "/nope", "/health/", "/HEALTH", "/drain/status/x", "/drain/", "//health", "/health_check.htm"]:
        assert path not in spec["paths"]
        for method in ["GET", "POST"]:
            code, headers, body = fresh_get(gw.ports.health, path, method=method)
            assert code == 404, (method, path, code)
            assert headers["content-type"] == "application/json" and headers["cache-control"] == "no-store"
            assert json.loads(body)["error"] == "not_found"
    assert checked >= 14 * 5
    assert state(gw) == "OPEN"
