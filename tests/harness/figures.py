"""Figures a run writes into a README itself, so that each appears once and is the run's own: the
text between `<!-- figure: NAME -->` and `<!-- /figure: NAME -->`, never edited by hand.

`python3 tests/harness/figures.py make-test` (`make test-timed`) runs `make test` and writes how long it
took into tests/README.md. Standard library only: it runs before `make test` has installed anything.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS_README = REPO / "tests" / "README.md"
# The reliability proofs' page: the LDS soak's table.
RELIABILITY = REPO / "tests" / "docs" / "envoy.md"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- figure: {name} -->", f"<!-- /figure: {name} -->"


def read(readme: Path, name: str) -> str | None:
    """What stands between the markers of `name`, or None when they are missing."""
    begin, end = markers(name)
    text = readme.read_text()
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0]


def write(readme: Path, name: str, figure: str) -> None:
    """Replaces what stands between the markers of `name` with `figure`."""
    begin, end = markers(name)
    text = readme.read_text()
    if begin not in text or end not in text:
        raise KeyError(f"{readme} has no markers for the figure {name!r}")
    head, rest = text.split(begin, 1)
    readme.write_text(f"{head}{begin}{figure}{end}{rest.split(end, 1)[1]}")


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def time_make_test() -> int:
    """Times `make test` and writes what it was: the cores, whether the checkout had built before (a fresh clone
    has no `target/` and no `.venv`: installs and builds included), whether `../shared` stood beside it, the
    date and the commit."""
    fresh = not (REPO / "target").exists() and not (REPO / ".venv").exists()
    shared = (REPO.parent / "shared").is_dir()
    started = time.monotonic()
    rc = subprocess.run(["make", "test"], cwd=REPO).returncode
    took = time.monotonic() - started
    if rc != 0:
        print(f"make test failed after {minutes(took)}: nothing written", file=sys.stderr)
        return rc
    how = "a fresh clone (installs and builds included)" if fresh else "a checkout that had built before"
    beside = "`../shared` beside it" if shared else "no `../shared` beside it"
    write(TESTS_README, "make-test", f"{minutes(took)} on {os.cpu_count()} cores, {how}, {beside} "
                                      f"({time.strftime('%Y-%m-%d')}, commit {commit()}, `make test-timed`)")
    print(f"make test took {minutes(took)}: written into {TESTS_README.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["make-test"]:
        sys.exit("usage: figures.py make-test")
    sys.exit(time_make_test())
