"""TCP and TLS backends for the connection-counting tests, and a client that
holds one connection open and proves, on demand, that it still carries bytes.

The backends are socat (Debian): `PIPE` echoes every byte back; the TLS one
terminates TLS itself with a throwaway self-signed certificate (openssl), as a
service behind a gateway's TLS-passthrough server does.
"""
from __future__ import annotations

import socket
import ssl
from pathlib import Path

from tests.harness.envoy import free_port
from tests.harness.haproxy import make_cert
from tests.harness.process import Child, accepts


class Echo(Child):
    """A TCP (or TLS, `tls=True`) echo server on loopback, one process per connection."""

    def __init__(self, workdir: Path, tls: bool = False):
        self.tls = tls
        self.name = "TLS echo" if tls else "TCP echo"
        self.workdir = workdir
        self.port = free_port()
        super().__init__(workdir / f"echo-{'tls' if tls else 'tcp'}-{self.port}.log")

    def start(self) -> "Echo":
        listen = f"{self.port},bind=127.0.0.1,reuseaddr,fork"
        if self.tls:
            address = f"OPENSSL-LISTEN:{listen},cert={make_cert(self.workdir)},verify=0"
        else:
            address = f"TCP-LISTEN:{listen}"
        self.spawn(["socat", address, "PIPE"])
        self.wait_until(lambda: accepts(self.port), 15, f"{self.name} listening")
        return self


class Held:
    """One client connection to 127.0.0.1:`port` (TLS when `tls`), held open until `close()`."""

    def __init__(self, port: int, tls: bool = False, server_name: str = "backend.test", timeout: float = 10):
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE  # the backend's throwaway certificate
            raw = ctx.wrap_socket(raw, server_hostname=server_name)
        self.sock = raw
        self.sent = 0

    def echoes(self, timeout: float = 5) -> bool:
        """Sends a line and reads it back: False once the connection was cut."""
        self.sent += 1
        line = f"ping {self.sent}\n".encode()
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(line)
            got = b""
            while len(got) < len(line):
                chunk = self.sock.recv(len(line) - len(got))
                if not chunk:
                    return False
                got += chunk
            return got == line
        except (OSError, ssl.SSLError):
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "Held":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
