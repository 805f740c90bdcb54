"""``CoreProcess`` (tests/support/crash_harness.py) whose `engram serve` starts are forked from a
process that has imported Engram already (tests/support/forked_serve.py): the same store, the
same command line, environment, log per start, readiness poll, SIGKILL and SIGTERM, without the
~1 s of imports per start."""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path
from typing import Any

from tests.support.crash_harness import ENGRAM, CoreProcess
from tests.support.forked_serve import ServeForker

# The readiness poll's channel retries a refused connection every 20 ms (crash_harness's
# PROMPT_RECONNECT: 50-100 ms): a forked start is ready in well under a second.
PROMPT_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                    ("grpc.max_reconnect_backoff_ms", 20)]

_forker: ServeForker | None = None
_forker_lock = threading.Lock()


def shared_forker() -> ServeForker:
    """The test process's one forker, started on first use: its imports (the cost of an exec'd
    start) are paid once per test process, not once per test or engine leg. It ends with the test
    process (at exit, or when its stdin, a pipe from this process, closes)."""
    global _forker
    with _forker_lock:
        if _forker is None or not _forker.alive():
            _forker = ServeForker(dict(os.environ))  # each child gets its start's own environment
            atexit.register(_forker.close)
        return _forker


class ForkedCoreProcess(CoreProcess):
    """``stop`` ends the core (SIGTERM); the forker stays for the next test."""

    def __init__(self, data_dir: Path, stores: Any) -> None:
        super().__init__(data_dir, stores)
        self.forker = shared_forker()

    reconnect = PROMPT_RECONNECT
    poll_s = 0.02

    def _spawn(self, argv: list[str]) -> Any:  # a ForkedProcess: what CoreProcess uses of a Popen
        assert self.log is not None
        return self.forker.spawn(argv, self._env(), self.log, argv0=ENGRAM)
