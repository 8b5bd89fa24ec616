"""Child processes of the tests (Envoy, HAProxy, the demo backend): started in
their own session with their output in a log file, waited on with deadlines,
and stopped with everything they started on every exit path."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def wait_for(predicate, timeout: float, interval: float = 0.02, what: str = "condition"):
    """Polls `predicate` until it returns a truthy value; raises on the deadline."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"{what} not met within {timeout}s (last: {last!r})")


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on host:port now."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
        return True
    return False


def stop_on_signals() -> None:
    """Ctrl-C (SIGINT) and SIGTERM end a long run as KeyboardInterrupt, so that what it started
    (each child in its own session) is stopped on the way out, by its `finally` and ExitStack.
    Installed explicitly: Python installs its SIGINT handler only when SIGINT is not ignored at
    start, and a script's background job starts with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@contextlib.contextmanager
def signals_to_the_main_thread():
    """Threads started in this block never take SIGINT or SIGTERM, so the kernel delivers them to
    the main thread: taken by another thread, a signal would leave the main thread blocked where
    it waits (on a child, say) until that wait ended by itself."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def stop_group(proc: subprocess.Popen | None, grace: float = 10) -> None:
    """Stops a child started with start_new_session=True, and everything it started."""
    if proc and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(grace)


class Child:
    """One child process whose stdout and stderr are appended to `log_path`. A
    subclass's start() spawns and waits for it; as a context manager it is started
    on entry and stopped on every exit path."""

    name = "child"

    def __init__(self, log_path: Path):
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self._log = None

    def spawn(self, argv: list[str], **popen) -> None:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     **popen)

    def wait_until(self, probe, timeout: float, what: str) -> None:
        """Polls `probe` (False while not yet) until it is true; fails at once if the child exits,
        and with the log's tail on the deadline."""
        try:
            wait_for(lambda: self.alive() and probe(), timeout, 0.05, what)
        except TimeoutError as e:
            raise TimeoutError(f"{e}:\n{self.log_tail()}") from None

    def alive(self) -> bool:
        """True while the child runs; raises with the log's tail once it has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
        return True

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        stop_group(self.proc)
        if self._log:
            self._log.close()
            self._log = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-n:])
