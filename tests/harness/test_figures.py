"""Each figure a run writes into a page (tests/harness/figures.py) says which run it was: its date and the commit
it ran on, so a figure is never read as the current code's when it is an older run's."""
from __future__ import annotations

import re

import pytest

from tests.harness import figures

PAGES = {"make-test": figures.TESTS_README, "lds-soak": figures.RELIABILITY}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_a_written_figure_names_its_run(name):
    figure = figures.read(PAGES[name], name)
    assert figure is not None, f"{PAGES[name].name} has lost the markers of the figure {name!r}"
    assert re.search(r"\b\d{4}-\d{2}-\d{2}\b", figure), f"{name}: no date of the run"
    assert re.search(r"\bcommit [0-9a-f]{7,40}\b", figure), f"{name}: no commit of the run"


def test_the_make_test_figure_is_written_in_its_place(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("took: <!-- figure: make-test -->old<!-- /figure: make-test -->.\n")
    figures.write(page, "make-test", "1 min 2 s on 2 cores, a fresh clone (2026-12-06, commit 0123456789ab)")
    assert figures.read(page, "make-test") == "1 min 2 s on 2 cores, a fresh clone (2026-12-06, commit 0123456789ab)"
    assert page.read_text().endswith("<!-- /figure: make-test -->.\n")
