"""Which form a pytest run takes, chosen by its marker expression (`-m`; the markers are declared in
pyproject.toml), read once, here:

  quick  the default: shorter timings, one round, what `make test` runs;
  full   `-m full`: the tests marked `full` (those that have a longer form: the LB scenarios) with the
         shipped timings and every round, and the ones only that form has (`make scenarios`);
  soak   `-m soak`: the tests marked `soak` at their soak size (`make soak`).

A form is on when the expression selects tests carrying its marker, and only those: `-m full` and
`-m "full and lb"` are the full form; no `-m`, `-m lb`, `-m "lb or full"` or `-m "not full"` the quick
one. Outside pytest (the `python -m tests.…` drivers) every form is off.
"""
from __future__ import annotations

FULL = False
SOAK = False


def selects(markexpr: str, marker: str) -> bool:
    """Whether `markexpr` selects tests marked `marker` (whatever else they carry), and only those."""
    if not markexpr.strip():
        return False
    from _pytest.mark.expression import Expression

    expr = Expression.compile(markexpr)
    return expr.evaluate(lambda name: True) and not expr.evaluate(lambda name: name != marker)


def configure(markexpr: str) -> None:
    """Called by tests/conftest.py before any test module is imported."""
    global FULL, SOAK
    FULL = selects(markexpr, "full")
    SOAK = selects(markexpr, "soak")
