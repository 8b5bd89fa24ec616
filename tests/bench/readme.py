"""A block of a page under tests/docs/ that a run writes: what stands between a BEGIN and an END marker line."""
from __future__ import annotations

from pathlib import Path


def block(text: str, begin: str, end: str) -> str | None:
    """What stands between `begin` and `end` in `text` (`None`: a marker is missing)."""
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def write(path: Path, begin: str, end: str, body: str) -> None:
    """Replaces what stands between the markers in `path` with `body`."""
    head, rest = path.read_text().split(begin, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}")
