"""Loopback ports for the tests' listeners that nothing takes before the listener binds.

A port bound to 0 and closed again comes from the kernel's ephemeral range, where
every outgoing connection takes its source port: until the listener binds it, a
connection or a parallel test can take it. `free_port` hands out a port of POOL
(above the fixed ports the project binds, 15000-18180; below Kubernetes'
NodePorts, 30000-32767; cut below the ephemeral range) that

- is locked for this process until it ends: an exclusive POSIX record lock on the
  port's byte of LOCK_FILE, so no other process (a parallel pytest run, another
  checkout's) hands it out meanwhile; one descriptor holds every lock;
- this process has not handed out before;
- binds on every address now (IPv6 ones too for an IPv6 listener).

Only this module opens LOCK_FILE: closing any descriptor of it would drop the
process's locks (POSIX record locks belong to the process).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import threading
from pathlib import Path

POOL = range(20000, 30000)
LOCK_FILE = Path("/tmp/drain-gate-ports.lock")

_mutex = threading.Lock()
_handed_out: set[int] = set()
_rng = random.Random()
_fd: int | None = None


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last)."""
    first, last = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(first), int(last)


def pool() -> range:
    """POOL, cut below the ephemeral range."""
    ports = range(POOL.start, min(POOL.stop, ephemeral_range()[0]))
    if not ports:
        raise RuntimeError(f"the ephemeral range {ephemeral_range()} leaves no port of {POOL} below it")
    return ports


def _lock(port: int) -> bool:
    """Takes the lock of `port` for this process; False when another process holds it."""
    try:
        fcntl.lockf(_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
    except (BlockingIOError, PermissionError):  # EAGAIN, EACCES: held elsewhere
        return False
    return True


def _binds(port: int, ipv6: bool) -> bool:
    """Whether `port` binds on every IPv4 address (and, for an IPv6 listener, every
    IPv6 one) now, without SO_REUSEADDR: a socket in TIME_WAIT on it counts as taken."""
    for family, anywhere in [(socket.AF_INET, "0.0.0.0")] + [(socket.AF_INET6, "::")] * ipv6:
        with socket.socket(family) as s:
            try:
                s.bind((anywhere, port))
            except OSError:
                return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port of `pool()`, locked for this process, not handed out before, bindable
    now for a listener on `host` (IPv4 or IPv6 loopback)."""
    global _fd
    with _mutex:
        if _fd is None:
            _fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
            with contextlib.suppress(OSError):
                os.fchmod(_fd, 0o666)  # shared by every user's runs
        ports = pool()
        start = _rng.randrange(len(ports))
        for i in range(len(ports)):
            port = ports[(start + i) % len(ports)]
            if port in _handed_out or not _lock(port):
                continue
            if _binds(port, ipv6=":" in host):
                _handed_out.add(port)
                return port
            fcntl.lockf(_fd, fcntl.LOCK_UN, 1, port)
        raise RuntimeError(f"every port of {ports} is taken")
