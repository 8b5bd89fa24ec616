"""What every guard of the shipped module needs first: the module as the Makefile ships it (after wasm-opt).
Without it a guard cannot run: it fails under CI (`CI=true`) and skips elsewhere, saying why."""
from __future__ import annotations

from pathlib import Path

from tests.bench import cost
from tests.harness import ci


def optimized(wasm: Path, target: str, measures: str = "the baseline counts the optimized module") -> Path:
    """`wasm`, built and optimized (`make <target>` builds it); otherwise the guard cannot run."""
    if not wasm.exists():
        ci.cannot_run(f"{wasm} is missing: `make {target}` builds it")
    why = cost.not_optimized(wasm)
    if why:
        ci.cannot_run(f"{why}; {measures}: `make wasm-opt {target}` (`make test` installs wasm-opt)")
    return wasm
