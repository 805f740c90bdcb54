"""``engram serve`` in its own process, for benchmarks: clients never share the server's GIL."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGRAM = str(Path(sys.executable).with_name("engram"))


def run_in_tree(tree: Path, code: str, *argv: str) -> None:
    """Run ``code`` (``python -c``, with ``argv`` as ``sys.argv[1:]``) on another checkout's
    code: this interpreter, that checkout first on the path and as the working directory. The
    venv's ``engram`` and its editable install are always this checkout's."""
    subprocess.run([sys.executable, "-c", code, *argv], cwd=tree, check=True,
                   env={**os.environ, "PYTHONPATH": str(tree)})


class Served:
    """``engram serve`` on a data directory, in its own process (the clients do not share its GIL)."""

    def __init__(self, data_dir: Path, semantic: bool, *, metrics: bool = False, tree: Path | None = None,
                 store: str | None = None) -> None:
        """``metrics``: serve the Prometheus endpoint too, its URL in ``metrics_url``. ``tree``:
        another checkout of this repository (its generated stubs included) whose core to run,
        for a before/after in one run; by default this checkout's ``engram``. ``store``: a
        PostgreSQL store (``--store``) with ``data_dir`` its key directory."""
        env = {**os.environ, "ENGRAM_SEMANTIC": "on" if semantic else "off"}
        cli = [ENGRAM]
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
            cli = [sys.executable, "-c", "import sys; from engram_core.cli import main; sys.exit(main())"]
        where = ["--store", store, "--key-dir", str(data_dir)] if store else ["--data", str(data_dir)]
        argv = [*cli, "serve", *where, "--listen", "127.0.0.1:0"]
        if metrics:
            argv += ["--metrics", "127.0.0.1:0"]
        # Its log goes to a file (ENGRAM_BENCH_LOG_DIR, else nowhere): a failed call's cause is there.
        log_dir = os.environ.get("ENGRAM_BENCH_LOG_DIR")
        self.log_path = Path(log_dir) / f"serve-{os.getpid()}-{id(self)}.log" if log_dir else None
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        stderr = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                                     cwd=tree or REPO)
        if self.log_path:
            stderr.close()  # type: ignore[union-attr]  # the child holds it
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"engram serve did not start: {line!r}")
        self.address = line.split("listening on ", 1)[1].split()[0]
        self.key_path = self.host_key_path = data_dir / "host.key"
        self.metrics_url = ""
        if metrics:  # the start-up summary, the next line, names it
            opened = self.proc.stdout.readline() if self.proc.stdout else ""
            if "metrics http://" not in opened:
                self.stop()
                raise RuntimeError(f"engram serve did not report its metrics endpoint: {opened!r}")
            self.metrics_url = "http://" + opened.split("metrics http://", 1)[1].split()[0].rstrip(",")
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 600.0) -> None:
        """Until readiness (gRPC health of MemoryService) says SERVING: the core listens before
        its search index is built (seconds at 100k records), and a measurement started at
        "listening" would count that build's CPU and wait in its first calls."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout_s
        request = health_pb2.HealthCheckRequest(service="engram.v1.MemoryService")
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"engram serve exited ({self.proc.returncode}) before it was ready")
                try:
                    if stub.Check(request, timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"engram serve was not ready within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
