"""Fixtures shared by the integration tests: the demo backend and real Envoys."""
from __future__ import annotations

import contextlib
import subprocess

import pytest

from tests.harness import backend as demo_backend
from tests.harness.envoy import WASM, Envoy, Ports, render


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


class Stream:
    """A long response read by curl in the background (exit code + chunks)."""

    def __init__(self, url: str, *args: str, max_time: float = 60):
        self.proc = subprocess.Popen(
            ["curl", "-sSN", "--max-time", str(max_time), *args, url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out = ""
        self.err = ""

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 60) -> int:
        self.out, self.err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode

    def kill(self) -> None:
        if self.running():
            self.proc.kill()
            self.proc.communicate()

    @property
    def chunks(self) -> int:
        return self.out.count("chunk ")


@pytest.fixture
def stream():
    """Factory for background curl streams; all are killed at test end."""
    started: list[Stream] = []

    def start(url: str, *args: str, max_time: float = 60) -> Stream:
        s = Stream(url, *args, max_time=max_time)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()
