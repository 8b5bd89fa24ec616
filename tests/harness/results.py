"""One directory per scenario run, shared by the test files of `make scenarios`
(tests/lb/test_scenarios.py, tests/lb/test_passthrough.py): out/scenarios/<run>/,
with out/scenarios/latest pointing to it. Each file adds its section of
results.md (and its rows of results.json); the files are rewritten with every
section added so far in the run, by this process or another worker of the same
pytest-xdist run, in the order of their names.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from tests.harness import forms
from tests.harness.envoy import REPO

OUT = REPO / "out" / "scenarios"


@functools.cache
def run_id() -> str:
    """The run's name: DRAIN_GATE_RUN_ID, else the time and the form. The workers of one pytest-xdist
    run share it: the first to ask names the run, in a file only one can create."""
    if os.environ.get("DRAIN_GATE_RUN_ID"):
        return os.environ["DRAIN_GATE_RUN_ID"]
    own = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + ("-shipped" if forms.FULL else "-quick")
    shared = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # the same in every worker of one run
    if not shared:
        return own
    OUT.mkdir(parents=True, exist_ok=True)
    named = OUT / f".xdist-{shared}"
    try:
        fd = os.open(named, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        deadline = time.monotonic() + 10
        while not (name := named.read_text().strip()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{named} stayed empty: the worker that names the run never wrote it")
            time.sleep(0.05)
        return name
    with os.fdopen(fd, "w") as f:
        f.write(own)
    return own


def run_dir() -> Path:
    """This run's directory (made, and `latest` pointed at it, on the first call)."""
    d = OUT / run_id()
    with _locked():
        if not d.exists():
            d.mkdir(parents=True, exist_ok=True)
            latest = OUT / "latest"
            if latest.is_symlink() or not latest.exists():
                latest.unlink(missing_ok=True)
                latest.symlink_to(run_id())
    return d


@contextlib.contextmanager
def _locked():
    """One process at a time (the workers of a pytest-xdist run) in out/scenarios."""
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def add_section(name: str, markdown: str, rows: list[dict]) -> None:
    """Sets section `name` of results.md / results.json and rewrites both from every section of the
    run, whichever process (pytest-xdist worker) added it."""
    d = run_dir()
    with _locked():
        sections = d / "sections"
        sections.mkdir(exist_ok=True)
        (sections / f"{name}.json").write_text(json.dumps({"markdown": markdown, "rows": rows}))
        every = [json.loads(f.read_text()) for f in sorted(sections.glob("*.json"))]
        (d / "results.md").write_text("\n".join(s["markdown"] for s in every))
        (d / "results.json").write_text(json.dumps([r for s in every for r in s["rows"]], indent=2))
