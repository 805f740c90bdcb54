"""Crash-safety harness: run `engram serve` as a subprocess under a mixed
workload, SIGKILL it at a random point, restart, and check that every
acknowledged mutation survived and nothing is half-applied (SPEC §7).

Used by tests/core/test_crash_safety.py (a few kill points) and by the
reliability suite with more points, on each engine: the process is `engram serve --data DIR`
or `engram serve --store URL --key-dir DIR` (tests/support/core_engines.py), killed and restarted over
the same store and key directory.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import host_pb2, host_pb2_grpc

ENGRAM = str(Path(sys.executable).parent / "engram")

# A channel that keeps retrying the connection every 50 ms while the server is not listening yet.
# gRPC's default backs off after each refused connection (1 s, 1.6 s, 2.6 s, ...), failing calls
# fast meanwhile: a core that starts listening just after a retry was seen seconds late, once per
# start (the crash soak starts one 16 times per engine).
PROMPT_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 100)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CoreProcess:
    def __init__(self, data_dir: Path, stores: Any = None) -> None:
        self.data_dir = data_dir
        self.stores = stores  # core_engines.EngineStores; None: DuckDB in data_dir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.log: Path | None = None  # the last start's output (stdout and stderr)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> None:
        """Start the core and wait until it serves. The bound is for a start that hangs, not a
        speed bound: a start is seconds (the policy bundle compiled, the model loaded, the
        journal replayed), and at soak size on a loaded 2-core machine, niced, one took over 30."""
        where = self.stores.serve_args(self.data_dir) if self.stores else ["--data", str(self.data_dir)]
        self.starts += 1
        # A file, not a pipe nobody reads (a full pipe would stop the core mid-write), kept per
        # start so that a start that fails says why.
        self.log = self.data_dir.parent / f"core-{self.port}-start-{self.starts:03d}.log"
        self.proc = self._spawn(["serve", *where, "--listen", self.address])
        started = time.monotonic()
        deadline = started + timeout
        with grpc.insecure_channel(self.address, options=self.reconnect) as ch:
            stub = host_pb2_grpc.HostServiceStub(ch)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"core exited with {self.proc.returncode}:\n{self._log_tail()}")
                try:
                    if stub.Health(host_pb2.HealthRequest(), timeout=1).status == "SERVING":
                        return
                except grpc.RpcError:
                    time.sleep(self.poll_s)
        raise RuntimeError(f"core did not become healthy in {time.monotonic() - started:.0f} s (start "
                           f"{self.starts}):\n{self._log_tail()}")

    # How the readiness poll retries: an exec'd start takes seconds, a forked one (forked_core.py)
    # well under one.
    reconnect = PROMPT_RECONNECT
    poll_s = 0.05

    def _env(self) -> dict[str, str]:
        """The started core's environment (the engine's, or this process's)."""
        return self.stores.process_env() if self.stores else dict(os.environ)

    def _spawn(self, argv: list[str]) -> subprocess.Popen:
        """`engram ARGV...`, its stdout and stderr in ``self.log``."""
        assert self.log is not None
        with self.log.open("w") as out:
            return subprocess.Popen([ENGRAM, *argv], stdout=out, stderr=subprocess.STDOUT, text=True, env=self._env())

    def _log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log is not None and self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Acked:
    """Mutations the server acknowledged, with their arguments for retry."""

    captures: list[tuple[dict, dict]] = field(default_factory=list)       # (args, result)
    admissions: list[tuple[dict, dict]] = field(default_factory=list)
    forgets: list[tuple[dict, dict]] = field(default_factory=list)
    withdrawals: list[tuple[dict, dict]] = field(default_factory=list)
    # Records whose forget was sent, acknowledged or not: a forget in flight at the kill may
    # have committed with its reply lost, so such a record may rightly be gone.
    forget_sent: set[str] = field(default_factory=set)


def run_workload(client, acked: Acked, stop: threading.Event, rng: random.Random, capture_args) -> None:
    """Mixed mutations until the server dies (any transport failure ends the loop)."""
    n = 0
    while not stop.is_set():
        n += 1
        try:
            args = capture_args(f"Crash workload item {rng.random()} about the heron {n}.",
                                key=f"crash-cap-{rng.getrandbits(64):016x}")
            cap = client.call("capture", args, timeout=5)
            acked.captures.append((args, cap))
            choice = rng.random()
            if choice < 0.15:
                w = {"candidate_id": cap["candidate_id"], "idempotency_key": f"crash-wd-{rng.getrandbits(64):016x}",
                     "reason_ref": "reason:crash-test"}
                acked.withdrawals.append((w, client.call("withdraw", w, grant=True, timeout=5)))
                continue
            a = {"candidate_id": cap["candidate_id"], "idempotency_key": f"crash-adm-{rng.getrandbits(64):016x}"}
            out = client.call("request_admission", a, timeout=5)
            acked.admissions.append((a, out))
            if choice > 0.8 and out["outcome"]["status"] == "accepted":
                f = {"record_id": out["outcome"]["record_id"], "idempotency_key": f"crash-fg-{rng.getrandbits(64):016x}",
                     "reason_ref": "reason:crash-test"}
                acked.forget_sent.add(f["record_id"])
                acked.forgets.append((f, client.call("forget", f, grant=True, timeout=5)))
        except Exception:
            return
