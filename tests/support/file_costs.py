"""The order files are handed to xdist workers in: most expensive first (issue 58).

``tools/test`` runs ``pytest -n auto --dist loadfile --no-loadscope-reorder``: whole files go to
workers in collection order, the next file to a worker when it is nearly done with its last. The
run's wall time is then at least its longest chain of files on one worker, so a file of a minute
and more handed out near the end leaves the other worker idle while it runs. Started first, the
long files run beside the many short ones, which fill in behind them.

The cost of a file is the sum of its tests' setup, call and teardown times in a recorded run
(``file_costs.json`` beside this module, seconds, written by a run with
``ENGRAM_TEST_COSTS=PATH``). A file not in the record (a new one) is costed at the record's
median per test times its number of tests. Costs only order the files: a stale record makes a run
slower, never wrong, and every worker orders the same collection the same way (xdist requires it).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("file_costs.json")
_DEFAULT_PER_TEST = 0.2  # seconds: an empty record's guess (unit tests are faster, core tests slower)


def file_of(nodeid: str) -> str:
    """The file a test id belongs to (xdist's ``loadfile`` scope)."""
    return nodeid.split("::", 1)[0]


def load(path: Path = RECORD) -> dict[str, dict[str, float]]:
    """The recorded costs: ``{file: {"seconds": s, "tests": n}}`` (empty if there is no record)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {str(f): {"seconds": float(v["seconds"]), "tests": int(v["tests"])} for f, v in data["files"].items()}


def order(items: Sequence[Any], record: dict[str, dict[str, float]]) -> list[Any]:
    """``items`` with whole files in descending cost; a file's own tests keep their order."""
    per_test = [v["seconds"] / v["tests"] for v in record.values() if v["tests"]]
    guess = statistics.median(per_test) if per_test else _DEFAULT_PER_TEST
    first: dict[str, int] = {}
    count: dict[str, int] = {}
    for i, item in enumerate(items):
        f = file_of(item.nodeid)
        first.setdefault(f, i)
        count[f] = count.get(f, 0) + 1

    def cost(f: str) -> float:
        known = record.get(f)
        return known["seconds"] if known is not None else guess * count[f]

    # Ties (and the order within a file) keep collection order: the sort is stable.
    return sorted(items, key=lambda item: (-cost(file_of(item.nodeid)), first[file_of(item.nodeid)]))


class Recorder:
    """Sums each file's setup, call and teardown times (on the controller under xdist, where every
    worker's reports arrive) and writes them as a record when the session ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}
        self.tests: dict[str, set[str]] = {}

    def add(self, nodeid: str, duration: float) -> None:
        f = file_of(nodeid)
        self.seconds[f] = self.seconds.get(f, 0.0) + duration
        self.tests.setdefault(f, set()).add(nodeid)

    def write(self) -> None:
        write({f: {"seconds": round(s, 2), "tests": len(self.tests[f])} for f, s in self.seconds.items()}, self.path)


def write(files: dict[str, dict[str, float]], path: Path = RECORD) -> None:
    """A record, one file a line, most expensive first (a diff of two records reads as one)."""
    ranked = sorted(files.items(), key=lambda kv: -kv[1]["seconds"])
    lines = [f" {json.dumps(f)}: {json.dumps(v)}" for f, v in ranked]
    path.write_text('{"files": {\n' + ",\n".join(lines) + "\n}}\n")
