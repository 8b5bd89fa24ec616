"""Fixtures shared by the integration tests: the demo backend and real Envoys."""
from __future__ import annotations

import contextlib

import pytest

from tests.harness import backend as demo_backend
from tests.harness import forms
from tests.harness.clients import CurlStream
from tests.harness.envoy import WASM, Envoy, Ports, render

# Each directory of tests/ is a kind of proof, and its tests carry that kind's marker (pyproject.toml):
# `pytest -m lb`, `-m "envoy or deploy"`, `-m "not fleet"`.
KINDS = ("envoy", "lb", "deploy", "fleet", "bench", "hardening", "observability", "docs", "harness")


def pytest_configure(config):
    forms.configure(config.option.markexpr or "")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = item.path.relative_to(config.rootpath).parts
        if len(parts) > 2 and parts[0] == "tests" and parts[1] in KINDS:
            item.add_marker(parts[1])


@pytest.fixture(scope="session", autouse=True)
def _wasm_built():
    if not WASM.exists():
        pytest.exit(f"{WASM} is missing: run `make build` (or `make test`)", returncode=2)


@pytest.fixture(scope="session")
def backend_port() -> int:
    ports = Ports()
    srv = demo_backend.serve(ports.backend)
    yield ports.backend
    srv.shutdown()


@pytest.fixture
def gateway(backend_port, tmp_path):
    """Factory: gateway(config={...}, transform=None, concurrency=2, ...) -> a started Envoy.

    `transform(doc, workdir) -> doc` may rewrite the rendered bootstrap first
    (see tests.harness.variants); `drain_time_s` is Envoy's `--drain-time-s`
    (how long a replaced listener keeps its connections); other keywords go
    to `render`. Every Envoy it
    starts is stopped when the test ends, whatever happens.
    """
    stack = contextlib.ExitStack()

    def start(config: dict | None = None, *, transform=None, concurrency: int = 2,
              wait_ready: bool = True, drain_time_s: int = 1, **kw) -> Envoy:
        ports = Ports(backend=backend_port)
        workdir = tmp_path / f"envoy-{ports.health}"
        workdir.mkdir(parents=True, exist_ok=True)
        doc = render(ports, config, **kw)
        if transform is not None:
            doc = transform(doc, workdir)
        envoy = Envoy(doc, ports, concurrency=concurrency, workdir=workdir, drain_time_s=drain_time_s)
        stack.callback(envoy.stop)
        return envoy.start(wait_ready=wait_ready)

    with stack:
        yield start


@pytest.fixture
def custom_gateway(gateway):
    """The `gateway` factory under the name the hardening tests use for bootstrap variants."""
    return gateway


@pytest.fixture
def stream():
    """Factory for background curl streams (`CurlStream`, the URL asked as it is); all are killed at test end."""
    started: list[CurlStream] = []

    def start(url: str, *args: str, max_time: float = 60) -> CurlStream:
        s = CurlStream(url, *args, max_time=max_time)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()
