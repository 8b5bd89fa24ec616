"""`ci.cannot_run`: a guard whose input is missing fails under CI and skips elsewhere, saying why either way."""
from __future__ import annotations

import pytest
from _pytest.outcomes import Failed, Skipped

from tests.harness import ci
from tests.harness.envoy import REPO


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_under_ci_a_guard_that_cannot_run_fails(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    assert ci.on_ci()
    with pytest.raises(Failed, match="the twin is missing.*CI=true"):
        ci.cannot_run("the twin is missing")


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_elsewhere_it_skips_saying_why(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not ci.on_ci()
    with pytest.raises(Skipped, match="the twin is missing"):
        ci.cannot_run("the twin is missing")


def test_ci_run_sets_ci():
    """`.ci/run` is what CI runs: it sets CI=true where the service did not."""
    run = (REPO / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in run and run.index("export CI") < run.index("make test")
