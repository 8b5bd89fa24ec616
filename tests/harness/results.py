"""One directory per scenario run, shared by the test files of `make scenarios`
(tests/lb/test_scenarios.py, tests/lb/test_passthrough.py): out/scenarios/<run>/,
with out/scenarios/latest pointing to it. Each file adds its section of
results.md (and its rows of results.json); the files are rewritten with every
section added so far in this process, whatever order the test files run in.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from tests.harness import forms
from tests.harness.envoy import REPO

OUT = REPO / "out" / "scenarios"
RUN_ID = os.environ.get("DRAIN_GATE_RUN_ID") or (
    datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + ("-shipped" if forms.FULL else "-quick")
)

_sections: dict[str, tuple[str, list[dict]]] = {}


def run_dir() -> Path:
    """This run's directory (made, and `latest` pointed at it, on the first call)."""
    d = OUT / RUN_ID
    if not d.exists():
        d.mkdir(parents=True, exist_ok=True)
        latest = OUT / "latest"
        if latest.is_symlink() or not latest.exists():
            latest.unlink(missing_ok=True)
            latest.symlink_to(RUN_ID)
    return d


def add_section(name: str, markdown: str, rows: list[dict]) -> None:
    """Sets section `name` of results.md / results.json and rewrites both."""
    _sections[name] = (markdown, rows)
    d = run_dir()
    (d / "results.md").write_text("\n".join(md for md, _ in _sections.values()))
    (d / "results.json").write_text(json.dumps([r for _, rows in _sections.values() for r in rows], indent=2))
