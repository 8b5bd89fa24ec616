"""envoyfilter/tools/ledger.py, the application that counts what it executes, as a child process:
started as an operator starts it (python3 isolated from the test venv: standard library only), its
counts read back over HTTP."""
from __future__ import annotations

import sys
from pathlib import Path

import requests

from tests.harness.envoy import REPO, free_port
from tests.harness.process import Child

LEDGER = REPO / "envoyfilter" / "tools" / "ledger.py"


class Ledger(Child):
    """One ledger on 127.0.0.1:`port` (a free one by default)."""

    name = "ledger"

    def __init__(self, workdir: Path, port: int | None = None, label: str = "ledger"):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.label = label
        super().__init__(self.workdir / f"{label}.log")

    def argv(self) -> list[str]:
        return [sys.executable, "-I", str(LEDGER), "--listen", f"127.0.0.1:{self.port}"]

    def start(self, timeout: float = 15, **popen) -> "Ledger":
        self.spawn(self.argv(), **popen)
        self.wait_until(self._healthy, timeout, f"{self.label} answering /healthz")
        return self

    def _healthy(self) -> bool:
        try:
            return requests.get(self.url("/healthz"), timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def executions(self) -> dict[str, int]:
        """How often each id ran here."""
        r = requests.get(self.url("/executions"), timeout=5)
        r.raise_for_status()
        return r.json()["executions"]

    def forget(self) -> None:
        requests.delete(self.url("/executions"), timeout=5).raise_for_status()
