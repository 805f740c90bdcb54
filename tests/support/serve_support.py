"""`engram serve` as a subprocess, as an operator starts it."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.mcp_helpers import ENGRAM, REPO


@dataclass
class Served:
    proc: subprocess.Popen[str]
    address: str
    data_dir: Path
    opened: str

    @property
    def host_key(self) -> Path:
        return self.data_dir / "host.key"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve(data_dir: Path, *flags: str, listen: str = "127.0.0.1:0") -> Served:
    proc = subprocess.Popen([ENGRAM, "serve", "--data", str(data_dir), "--listen", listen, *flags], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ENGRAM_SEMANTIC": "off"})
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    if "listening on" not in first:
        proc.kill()
        raise AssertionError(f"engram serve did not start: {first!r} {proc.stderr.read()[-2000:]}")
    opened = proc.stdout.readline()
    return Served(proc=proc, address=first.split("listening on ", 1)[1].split()[0], data_dir=data_dir,
                  opened=opened)


def admin(served: Served, *args: str, tls: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, "admin", "--core", served.address, "--host-key", str(served.host_key),
                           "--timeout", "10", *tls, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
