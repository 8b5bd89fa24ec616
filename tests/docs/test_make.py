"""The Makefile's targets as `make help` lists them: every target a person runs has its one line (the
`## ` comment after its prerequisites), and every `make TARGET` the Markdown files show is a target."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.docs.test_doc_links import MARKDOWN
from tests.harness.envoy import REPO

MAKEFILE = (REPO / "Makefile").read_text()
# Named targets (not files, not pattern rules, not variables).
TARGETS = set(re.findall(r"^([a-z][a-z0-9-]*):(?!=)", MAKEFILE, re.M))


def test_every_target_has_its_help_line():
    described = set(re.findall(r"^([a-z][a-z0-9-]*):[^=\n]*## \S", MAKEFILE, re.M))
    assert TARGETS - described == set(), f"targets without a `## ` line: {sorted(TARGETS - described)}"


def test_make_help_lists_every_target_once():
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    listed = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert sorted(listed) == sorted(TARGETS), set(listed) ^ TARGETS


def test_every_make_command_in_the_docs_is_a_target():
    shown = set()
    for md in MARKDOWN:
        text = (REPO / md).read_text()
        shown |= set(re.findall(r"`make ([a-z][a-z0-9-]*)", text))  # `make bench`, in a sentence
        blocks = "".join(re.findall(r"^```.*?^```", text, re.S | re.M))
        shown |= set(re.findall(r"^\s*make ([a-z][a-z0-9-]*)", blocks, re.M))  # a command of a code block
    assert {"test", "bench", "scenarios", "check"} <= shown, "the docs name these targets"
    missing = shown - TARGETS
    assert not missing, f"`make` commands in the docs with no target: {sorted(missing)}"


def subset_commands() -> list[str]:
    text = (REPO / "tests" / "README.md").read_text().split("### Picking a subset", 1)[1]
    block = re.search(r"```sh\n(.*?)```", text, re.S)[1]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if "-m pytest" in line]


@pytest.mark.parametrize("command", subset_commands())
def test_each_subset_command_selects_what_it_says(command):
    """tests/README.md's subset commands, in their collect-only form: each selects tests, `-m lb` only tests/lb/."""
    r = subprocess.run(["bash", "-c", command.replace(" -q", "").replace(" -v", "")
                        + " --collect-only -q -p no:cacheprovider"], cwd=REPO, capture_output=True, text=True)
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert r.returncode == 0 and ids, r.stdout[-2000:] + r.stderr[-2000:]
    if "-m lb" in command:
        assert all(i.startswith("tests/lb/") for i in ids), ids[:5]
    if "not fleet and not hardening" in command:
        assert not any(i.startswith(("tests/fleet/", "tests/hardening/")) for i in ids)
    if "-m full" in command:
        assert all(i.startswith("tests/lb/test_refuse_lbs.py") for i in ids)


@pytest.mark.parametrize("npm, ci, fails", [
    (None, "", False),  # no npm here: says so and goes on (`make run` never asks for wasm-opt)
    (None, "true", True),  # under CI the optimized module's guards need it
    ("exit 1", "", True),  # an npm install that fails always fails
    ("exit 0", "", True),  # npm said yes but installed no wasm-opt
])
def test_make_wasm_opt_never_swallows_its_failure(tmp_path, npm, ci, fails):
    """`make wasm-opt` without a wasm-opt it can install: the cases, run by make itself (npm a stand-in on a
    PATH of its own, `WASM_OPT` a path that does not exist, so nothing is installed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if npm is not None:
        (bin_dir / "npm").write_text(f"#!/bin/sh\n{npm}\n")
        (bin_dir / "npm").chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "CI": ci}
    r = subprocess.run([shutil.which("make"), "-s", "wasm-opt", f"WASM_OPT={tmp_path}/none/wasm-opt"], cwd=REPO,
                       env=env, capture_output=True, text=True)
    assert (r.returncode != 0) == fails, r.stdout + r.stderr
    assert "wasm-opt" in r.stderr, "it says what happened"
