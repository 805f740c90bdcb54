"""``engram serve`` in its own process, for benchmarks: clients never share the server's GIL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGRAM = str(Path(sys.executable).with_name("engram"))


class Served:
    """``engram serve`` on a data directory, in its own process (the clients do not share its GIL)."""

    def __init__(self, data_dir: Path, semantic: bool) -> None:
        env = {**os.environ, "ENGRAM_SEMANTIC": "on" if semantic else "off"}
        self.proc = subprocess.Popen([ENGRAM, "serve", "--data", str(data_dir), "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"engram serve did not start: {line!r}")
        self.address = line.split("listening on ", 1)[1].split()[0]
        self.key_path = self.host_key_path = data_dir / "host.key"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
