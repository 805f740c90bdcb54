"""`engram serve` processes forked from one that has imported Engram already, for the crash tests,
which start a core over and over (tests/reliability/test_crash_soak.py: 11 per engine).

Of a start's ~1.4 s to listening (quiet; 2 s and more under load) about two thirds is the
interpreter importing the ~800 modules `engram serve` loads and reading package data that is the
same at every start (the secret scanner's fold table, WordNet's files); the rest, ~0.5 s (the
store opened and recovered, the audit spool replayed, the policy bundle compiled and warmed, the
listener bound, the search index built), is what a crash test is about. ``ServeForker`` starts a
Python process once (``python forked_serve.py``: only Engram's own and its packages' modules, no
test code) that imports what `engram serve` imports and then, for each start, forks: the child
points its stdin at /dev/null and its stdout and stderr at the start's log, takes the
environment it is given and returns from the fork loop to run ``engram_core.cli.main(["serve",
...])`` and ``sys.exit`` with its answer, which is what the console script does. Each child is a
process of its own with nothing open but what its `engram serve` opens, killed with a real
SIGKILL; nothing is shared with the next but the files, as with an exec'd start.

Fork-safe by construction: the forking process has imported modules, built a table and mapped
WordNet's files read-only, no more: it has opened no store, no gRPC channel or server (gRPC's core starts no thread before one is
made) and has not loaded the OPA bridge (a Go runtime, which a fork would break): that is loaded
by each child when its policy engine is built. ``random`` reseeds itself in a forked child, and
Engram draws its secrets from ``os.urandom``.

The forker reaps a child only when asked for its status, so a pid it handed out cannot be reused
while the test may still signal it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

# What `engram serve` imports on either engine (a module left out is imported by the child, as
# an exec'd start would: only slower).
PRELOAD = (
    "engram_core.cli", "engram_core.cli.serve", "engram_core.cli.serve_main", "engram_core.cli.first_serve",
    "engram_core.cli.observability", "engram_core.app.composition", "engram_core.app.engines",
    "engram_core.rpc.server", "engram_core.observability.tracing", "engram_core.observability.logs",
    "engram_core.observability.metrics", "engram_core.observability.wiring", "engram_core.services.keyring",
    "engram_core.policy.embedded", "engram_core.policy.serving", "engram_core.secret_scan.scan",
    "engram_core.app.observed_ports", "engram_core.store.kernel", "engram_core.store.audit_device",
    "engram_core.store.duckdb.engine", "engram_core.store.postgres.engine", "engram_core.store.postgres.keyvault",
    "engram_core.store.postgres.pool", "engram_core.store.postgres.leases", "engram_core.store.postgres.migrations",
    "engram_core.store.postgres.shared_state", "engram_core.store.postgres.tx",
    "grpc._server", "grpc._interceptor", "numpy.ma",
)


# -- the forking process (this file run as a script) ------------------------------------------------
def _preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from engram_core.cli import build_parser
    from engram_core.secret_scan.scan import module_ready
    from engram_core.services import thesaurus
    from engram_core.services.ranking import OFFLINE_LEXICAL_V5

    build_parser()  # imports every command group's registration, as main() does first
    # Package data every start reads the same, cached per process (functools): each child finds
    # them loaded. The secret scanner's fold table; WordNet's files, checked against their
    # pinned digest and mapped read-only.
    module_ready()
    expansion = OFFLINE_LEXICAL_V5.expansion
    assert expansion is not None
    thesaurus.load(expansion.senses, expansion.relations)


def _fork_loop(requests: IO[str], replies: IO[str]) -> dict[str, Any] | None:
    """Serve requests until stdin closes (None). In a forked child: its request, to run."""
    for line in requests:
        req = json.loads(line)
        if req["op"] == "spawn":
            replies.flush()
            pid = os.fork()
            if pid == 0:
                return req
            reply: dict[str, Any] = {"pid": pid}
        elif req["op"] == "poll":
            done, status = os.waitpid(req["pid"], os.WNOHANG)
            reply = {"returncode": os.waitstatus_to_exitcode(status) if done else None}
        else:
            reply = {"error": f"unknown op {req['op']!r}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return None


def _become_serve(req: dict[str, Any]) -> None:
    """In the child: the start's own stdio and environment, as the console script would have."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = [req["argv0"], *req["argv"]]


def _main() -> None:
    # Run as a script, this file's directory is first on sys.path: none of the test helpers
    # there may stand in for a module `engram serve` imports.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    _preload()
    replies = os.fdopen(os.dup(1), "w")
    req = _fork_loop(sys.stdin, replies)
    if req is None:
        return
    replies.close()
    _become_serve(req)
    from engram_core.cli import main

    sys.exit(main(req["argv"]))


# -- the test side ----------------------------------------------------------------------------------
class ForkedProcess:
    """What the crash tests use of ``subprocess.Popen``, for a child of the forker: it is not the
    test process's child, so its status comes from the forker and its end is seen on a pidfd."""

    def __init__(self, forker: ServeForker, pid: int) -> None:
        self._forker = forker
        self.pid = pid
        self._pidfd = os.pidfd_open(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self.returncode = self._forker.reap(self.pid)
            os.close(self._pidfd)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"forked engram serve {self.pid}", timeout or 0)
            self.poll()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped: the pid is still this process's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ServeForker:
    """One forking process (see the module's docstring); ``spawn`` starts an `engram serve`."""

    def __init__(self, env: dict[str, str]) -> None:
        """``env``: the forking interpreter's (a child's PYTHON* variables take effect only there)."""
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=env)

    def _ask(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            self._proc.stdin.write(json.dumps(req) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the serve forker exited with {self._proc.wait()}")
        return json.loads(line)

    def spawn(self, argv: list[str], env: dict[str, str], log: Path, argv0: str = "engram") -> ForkedProcess:
        """`engram ARGV...` in a forked child, its stdout and stderr in ``log``."""
        reply = self._ask({"op": "spawn", "argv": argv, "env": env, "log": str(log), "argv0": argv0,
                           "cwd": os.getcwd()})
        return ForkedProcess(self, reply["pid"])

    def reap(self, pid: int) -> int:
        started = time.monotonic()
        while (code := self._ask({"op": "poll", "pid": pid})["returncode"]) is None:
            assert time.monotonic() - started < 10, f"pid {pid} ended (its pidfd says) but is not reaped"
            time.sleep(0.005)
        return code

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


if __name__ == "__main__":
    _main()
