"""free_port (tests/harness/ports.py): processes allocating at the same time never
get the same port, no port comes from the kernel's ephemeral range, and a port
something is bound to is never handed out."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.harness import ports
from tests.harness.envoy import REPO

# Each child allocates on the line "go", prints its ports, and holds them until its stdin closes.
CHILD = """
import json, sys
from tests.harness.ports import free_port
sys.stdin.readline()
print(json.dumps([free_port() for _ in range(int(sys.argv[1]))]), flush=True)
sys.stdin.read()
"""
PROJECT_PORTS = {15000, 15020, 15021, 15090, 18080, 18081, 18180, 30080, 30180, 31443, 32021}


def test_concurrent_processes_never_share_a_port_and_stay_out_of_the_ephemeral_range():
    n, children = 1000, 3
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(n)], cwd=REPO, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(children)]
    try:
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        got = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(30)
    assert [p.returncode for p in procs] == [0] * children
    every = [port for ps in got for port in ps]
    assert len(every) == n * children
    assert len(set(every)) == len(every), "two processes were handed the same port"
    low, high = ports.ephemeral_range()
    assert not [p for p in every if low <= p <= high], "a port of the ephemeral range"
    assert all(1024 < p < low for p in every)
    assert not PROJECT_PORTS & set(every)


def test_a_bound_port_is_never_handed_out(monkeypatch):
    taken, free = ports.free_port(), ports.free_port()
    monkeypatch.setattr(ports, "_handed_out", ports._handed_out - {taken, free})
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        monkeypatch.setattr(ports, "pool", lambda: range(taken, taken + 1))
        with pytest.raises(RuntimeError, match="taken"):
            ports.free_port()
        monkeypatch.setattr(ports, "pool", lambda: [taken, free])
        assert ports.free_port() == free
