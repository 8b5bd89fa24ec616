"""tests/harness/forms.py: the marker expression (`-m`) chooses the form, and nothing else does."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import forms
from tests.harness.envoy import REPO


@pytest.mark.parametrize("markexpr, full, soak", [
    ("", False, False),
    ("full", True, False),
    ("full and lb", True, False),
    ("lb", False, False),
    ("lb or full", False, False),
    ("not full", False, False),
    ("soak", False, True),
    ("soak and hardening", False, True),
])
def test_the_expression_chooses_the_form(markexpr, full, soak):
    assert (forms.selects(markexpr, "full"), forms.selects(markexpr, "soak")) == (full, soak)


def test_minus_m_full_reaches_the_test_modules():
    """`pytest -m full` sets the form before the modules are imported: test_scenarios' timings are the shipped ones."""
    code = ("import sys, pytest; "
            "rc = pytest.main(['-q', '-p', 'no:cacheprovider', '--collect-only', '-m', 'full', 'tests/lb/test_scenarios.py']); "
            "from tests.lb import test_scenarios as t; from tests.harness.rig import SHIPPED; "
            "sys.exit(rc or (0 if t.TIMING is SHIPPED and t.FULL else 3))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
