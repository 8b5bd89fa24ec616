"""A guard whose input is missing: under CI it fails, elsewhere it skips, saying why.

CI runs `bash .ci/run` (`make test`) with `CI=true`. There every input a guard needs (wasm-opt, the optimized
module, the health twin, ...) is built by `make test` itself, so one that is missing is a broken build, and a
guard that skipped would let a regression through as a skip. A local run may lack one (no npm for wasm-opt):
the guard skips, naming what is missing and the target that makes it.
"""
from __future__ import annotations

import os
from typing import NoReturn

import pytest

# What a CI service sets (`CI=true`); `.ci/run` sets it when it is unset.
TRUE = {"true", "1", "yes"}  # as the Makefile's ON_CI reads it


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in TRUE


def cannot_run(reason: str) -> NoReturn:
    """The guard cannot run here: fail under CI, skip elsewhere, with `reason` either way."""
    if on_ci():
        pytest.fail(f"{reason} (CI=true: a guard whose input is missing fails, it never skips)", pytrace=False)
    pytest.skip(f"{reason} (CI=true fails here instead)")
