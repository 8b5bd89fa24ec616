"""The ```sh blocks of a README, run by bash as written, offline: stand-ins
for `kubectl` and `helm` come first on PATH; `make`, `python3`, `sed`,
`openssl`, `curl`, `haproxy` run for real.

kubectl stand-in:
  * an offline form (`--dry-run=client`, `--local`) runs the real kubectl;
  * any other command first runs the real kubectl against an address where
    nothing listens: it must fail on the connection, never on its arguments
    (else the stand-in fails with kubectl's complaint). Then, what the cluster
    would do:
      `apply [--server-side] -f F...`: kubectl decodes what it would send
        (`patch --local`), each document recorded (no other apply flag has an
        offline form);
      `-n NS rollout status|restart|undo TARGET`: recorded;
      `exec POD -c istio-proxy -- pilot-agent request GET PATH`: the test's reply file PATH
        (`exec … curl` is refused: -distroless images have no curl);
      `get RESOURCE... -o json|name`: the test's reply file named after what
        is asked (`reply_name`), e.g. "get deploy istio-ingressgateway -o json";
      anything else (label, patch, delete, …): recorded, no output.
helm stand-in: a command naming `istio/gateway` must pin `--version` to the
chart's version in ../shared (SOURCE.md: Istio 1.30.3), and then renders that
chart; `upgrade [--install]` runs as `helm template` with the same arguments,
its objects recorded; a command that needs a cluster (`rollback`, `history`,
`uninstall`, `status`, `get`) runs against an address where nothing listens: it
must fail on the connection, never on its arguments, and is recorded; `get …`
is then answered with the test's reply file named after it ("helm get values
drain-gate -n istio-system -o yaml"); anything else runs the real helm.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from tests.harness import k8s
from tests.harness.envoy import REPO

UNREACHABLE = ["--server=http://127.0.0.1:1", "--request-timeout=5s"]
# What the helm stand-in says when a command needs the istio/gateway chart and ../shared is absent.
NO_GATEWAY_CHART = "offline: the istio/gateway chart is absent"
# The istio/gateway chart version every command pins (../shared/istio-gateway-chart/SOURCE.md).
GATEWAY_CHART_VERSION = "1.30.3"

STAND_INS = textwrap.dedent('''\
    import json, os, re, subprocess, sys
    BIN, LOG, REPLIES, GATEWAY_CHART, CHART_VERSION = {bin!r}, {log!r}, {replies!r}, {gateway_chart!r}, {version!r}
    UNREACHABLE = {unreachable!r}
    NAME, args = os.path.basename(sys.argv[0]), sys.argv[1:]
    REAL = os.path.join(BIN, NAME)

    def record(entry):
        with open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\\n")

    def real(argv, stdin=None):
        return subprocess.run([REAL, *argv], input=stdin, capture_output=True, text=True,
                              env={{**os.environ, "KUBECONFIG": "/dev/null"}})

    def reply(name):
        path = os.path.join(REPLIES, name)
        if not os.path.exists(path):
            sys.exit(f"no offline reply {{name!r}} for: {{NAME}} {{' '.join(args)}}")
        sys.stdout.write(open(path).read())

    def helm():
        argv = list(args)
        if "istio/gateway" in argv:
            if not os.path.isdir(GATEWAY_CHART):
                sys.exit({no_chart!r})
            version = argv[argv.index("--version") + 1] if "--version" in argv[:-1] else None
            if version != CHART_VERSION:
                sys.exit(f"helm {{' '.join(args)}}: istio/gateway without --version {{CHART_VERSION}} takes "
                         "whatever chart is newest")
            at = argv.index("--version")
            del argv[at:at + 2]
            argv[argv.index("istio/gateway")] = GATEWAY_CHART
        if argv[:1] in (["rollback"], ["history"], ["uninstall"], ["status"], ["get"]):
            r = real([*argv, "--kube-apiserver", "http://127.0.0.1:1"])
            if r.returncode == 0 or "127.0.0.1:1" not in r.stderr:
                sys.exit(f"helm {{' '.join(args)}}: not refused by the connection: {{r.stderr.strip()}}")
            record({{"verb": "helm " + argv[0], "args": args}})
            if argv[:1] == ["get"]:
                reply(("helm " + " ".join(args)).replace("/", "+"))
            return
        if argv[:1] != ["upgrade"]:
            os.execv(REAL, [REAL, *argv])
        r = real(["template", *[a for a in argv[1:] if a != "--install"]])
        if r.returncode:
            sys.exit(r.stderr)
        record({{"verb": "helm install", "args": args, "manifest": r.stdout}})

    def apply(stdin):
        flags = [a for a in args[1:] if a.startswith("--")]
        files = [args[i + 1] for i, a in enumerate(args) if a == "-f"]
        if set(flags) - {{"--server-side"}} or not files or len(args) != 1 + len(flags) + 2 * len(files):
            sys.exit("no offline form for: kubectl " + " ".join(args))
        for name in files:
            r = real(["patch", "--local", "-f", name, "--type", "merge", "-p", "{{}}", "-o", "json"], stdin)
            if r.returncode:
                sys.exit(r.stderr)
            # One JSON object per document of the file, one after the other (or a List).
            docs, text, at = [], r.stdout, 0
            while text[at:].strip():
                doc, at = json.JSONDecoder().raw_decode(text, len(text) - len(text[at:].lstrip()))
                docs += doc["items"] if doc.get("kind") == "List" else [doc]
            for obj in docs:
                record({{"verb": "apply", "flags": flags, "file": name,
                        "stdin": stdin if name == "-" else None, "object": obj}})

    def reply_name(args):
        """`get ...` without the namespace: what the test answers it with."""
        rest = list(args)
        if rest[:1] == ["-n"]:
            rest = rest[2:]
        return " ".join(rest).replace("/", "+")

    def kubectl():
        if "--dry-run=client" in args or "--local" in args:
            os.execv(REAL, [REAL, *args])
        stdin = sys.stdin.read()
        r = real([*UNREACHABLE, *args], stdin)
        if r.returncode == 0 or "127.0.0.1:1" not in r.stderr or "refused" not in r.stderr:
            sys.exit(f"kubectl {{' '.join(args)}}: not refused by the connection: {{r.stderr.strip()}}")
        line = " ".join(args)
        if args[:1] == ["apply"]:
            apply(stdin)
        elif re.fullmatch(r"-n \\S+ rollout (status|restart|undo) \\S+( --\\S+)*", line):
            record({{"verb": "rollout " + args[3], "namespace": args[1], "target": args[4]}})
        elif "exec" in args and "curl" in args:
            sys.exit(f"kubectl {{line}}: curl in the container (-distroless images have none): use pilot-agent request")
        elif "exec" in args and re.search(r"-- pilot-agent request GET (\\w+)$", line):
            reply(re.search(r"pilot-agent request GET (\\w+)$", line)[1])
        elif re.search(r"(^| )get .* -o (json|name)$", line):
            reply(reply_name(args))
        else:
            record({{"verb": "cluster", "args": args}})

    helm() if NAME == "helm" else kubectl()
''')


# The operator's pages: envoyfilter/README.md is their index, each topic a page of envoyfilter/docs/.
OPERATOR_PAGES = [REPO / "envoyfilter" / "README.md", *sorted((REPO / "envoyfilter" / "docs").glob("*.md"))]


def sh_blocks(readme: Path | list[Path], section: str | None = None, exclude: str | None = None) -> list[str]:
    """The ```sh blocks of `readme` (a page, or several in turn), of its `## section` only, or without
    its `## exclude`. A `section` no page has is an error, so is an `exclude` no page has."""
    pages = readme if isinstance(readme, list) else [readme]
    blocks, seen = [], False
    for page in pages:
        text = page.read_text()
        for title in (section, exclude):
            if title is not None:
                start = text.find(f"\n## {title}\n")
                if start < 0:
                    text = "" if title == section else text
                    continue
                seen = True
                end = text.find("\n## ", start + 1)
                part = text[start:] if end < 0 else text[start:end]
                text = part if title == section else text.replace(part, "")
        blocks += re.findall(r"```sh\n(.*?)```", text, re.S)
    if (section or exclude) and not seen:
        raise ValueError(f"no page of {[str(p) for p in pages]} has a section `## {section or exclude}`")
    return blocks


def commands(block: str) -> list[str]:
    """The commands of a block: continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def runnable(block: str) -> list[str]:
    """The commands of the block that can run here: without ../shared, those
    that need the istio/gateway chart are left out, each with a warning that says so."""
    out = []
    for command in commands(block):
        if re.search(r"(^|\s)istio/gateway(\s|$)", command) and not k8s.GATEWAY_CHART.is_dir():
            warnings.warn(f"left out, the istio/gateway chart is absent at {k8s.GATEWAY_CHART}: {command}")
        else:
            out.append(command)
    return out


class OfflineShell:
    """Runs README blocks with the stand-ins; `recorded()` is what they saw.
    `replies` is the directory of the cluster's answers (config_dump, stats,
    deployment) that the test writes before a block reads them."""

    def __init__(self, workdir: Path):
        self.bin, self.replies, self.log = workdir / "bin", workdir / "replies", workdir / "kubectl.jsonl"
        self.bin.mkdir(parents=True)
        self.replies.mkdir()
        script = STAND_INS.format(bin=str(k8s.K8S_BIN), log=str(self.log), replies=str(self.replies),
                                  gateway_chart=str(k8s.GATEWAY_CHART), version=GATEWAY_CHART_VERSION,
                                  unreachable=UNREACHABLE, no_chart=NO_GATEWAY_CHART)
        for name in ("kubectl", "helm"):
            k8s.tool(name)  # present, or a clear error naming `make k8s-tools`
            path = self.bin / name
            path.write_text(f"#!{sys.executable}\n{script}")
            path.chmod(0o755)

    def run(self, block: str, substitutions: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """bash -euo pipefail on the block's runnable() commands (after the
        regex `substitutions`); skips when none can run here."""
        kept = runnable(block)
        if not kept:
            pytest.skip(f"every command needs the istio/gateway chart, absent at {k8s.GATEWAY_CHART}")
        block = "\n".join(kept)
        for pattern, replacement in (substitutions or {}).items():
            block = re.sub(pattern, lambda _: replacement, block)
        env = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "KUBECONFIG": "/dev/null"}
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env, capture_output=True,
                           stdin=subprocess.DEVNULL, text=True, timeout=300)
        assert NO_GATEWAY_CHART not in r.stderr, "runnable() leaves out what needs the istio/gateway chart"
        return r

    def reply(self, name: str, text: str) -> None:
        """What the cluster answers `kubectl [-n NS] NAME` (a `get`; "/" written "+"), or
        the helm command `NAME` ("helm get ...")."""
        (self.replies / name.replace("/", "+")).write_text(text)

    def recorded(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []
