"""`engram serve` in a subprocess with its stderr (the log) kept in a file, as an operator runs it,
its store on the test's engine leg (``stores``: tests/support/core_engines.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.core_engines import EngineStores

ENGRAM = str(Path(sys.executable).with_name("engram"))


@dataclass
class Served:
    proc: subprocess.Popen
    address: str
    host_key_path: Path
    data_dir: Path
    log_path: Path
    opened: str
    metrics_address: str = ""

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the readiness health (MemoryService) answers SERVING."""
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() < deadline:
                try:
                    req = health_pb2.HealthCheckRequest(service="engram.v1.MemoryService")
                    if stub.Check(req, timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.05)
        raise AssertionError("core never became ready")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack to the log
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text()

    def json_lines(self) -> list[dict[str, Any]]:
        """Every stderr line, each of which must be one JSON object."""
        return [json.loads(line) for line in self.log_text().splitlines() if line.strip()]


def serve(stores: EngineStores, data_dir: Path, *extra: str, env: dict[str, str] | None = None,
          log_name: str = "serve.log") -> Served:
    log_path = data_dir.parent / log_name
    with open(log_path, "w") as log:
        proc = subprocess.Popen([ENGRAM, "serve", *stores.serve_args(data_dir), "--listen", "127.0.0.1:0", *extra],
                                stdout=subprocess.PIPE, stderr=log, text=True,
                                env={**stores.process_env(), "ENGRAM_SEMANTIC": "off", "PYTHONFAULTHANDLER": "1",
                                     **(env or {})})
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if "listening on" not in first:
        proc.kill()
        raise AssertionError(f"engram serve did not start: {first!r} {log_path.read_text()[-2000:]}")
    opened = proc.stdout.readline()
    address = first.split("listening on ", 1)[1].split()[0]
    metrics = ""
    if "metrics http://" in opened:
        metrics = opened.split("metrics http://", 1)[1].split("/metrics", 1)[0]
    return Served(proc=proc, address=address, host_key_path=data_dir / "host.key", data_dir=data_dir,
                  log_path=log_path, opened=opened, metrics_address=metrics)
