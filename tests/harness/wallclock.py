"""Steps the wall clock of one process, and only its wall clock.

`tests/fixtures/wallshift.c`, preloaded (LD_PRELOAD), answers CLOCK_REALTIME
with the real time plus an offset the test rewrites at will; the monotonic
clock stays the kernel's. Nothing else on the machine sees the step.
"""
from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "wallshift.c"


class WallClock:
    """Builds the library into `workdir`; `env()` preloads it, `step(ms)` moves the clock."""

    def __init__(self, workdir: Path):
        workdir.mkdir(parents=True, exist_ok=True)
        self.library = workdir / "wallshift.so"
        self.offset_file = workdir / "wall-offset"
        built = subprocess.run(
            ["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(self.library), str(SOURCE)],
            capture_output=True, text=True,
        )
        if built.returncode != 0:
            raise RuntimeError(f"cannot build {SOURCE.name}:\n{built.stderr}")
        self.offset_file.write_bytes(struct.pack("<q", 0))

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "WALLSHIFT_FILE": str(self.offset_file)}

    @property
    def offset_ms(self) -> int:
        return struct.unpack("<q", self.offset_file.read_bytes())[0]

    def step(self, ms: int) -> None:
        """Moves the wall clock by `ms` (negative: back), at once."""
        fd = os.open(self.offset_file, os.O_WRONLY)
        try:
            os.pwrite(fd, struct.pack("<q", self.offset_ms + ms), 0)
        finally:
            os.close(fd)
