"""Closed-loop workloads: C clients, each calling as fast as answers come back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from tools.bench.stats import run_summary

# An operation returns the named parts it timed itself (e.g. capture and admission of a pair),
# or None; the runner always times the whole call under the workload's name.
Op = Callable[[int, int], list[tuple[str, float]] | None]
AsyncOp = Callable[[int, int], Awaitable[list[tuple[str, float]] | None]]


def run_threads(name: str, op: Op, clients: int, *, duration_s: float, min_ops: int, max_ops: int) -> dict[str, Any]:
    """Run ``op`` from ``clients`` threads until ``duration_s`` passed and each did ``min_ops``
    (or each did ``max_ops``). Returns one run summary per timed name."""
    lat: dict[str, list[float]] = defaultdict(list)
    errors = [0]
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    ends: list[float] = []

    def worker(c: int) -> None:
        mine: dict[str, list[float]] = defaultdict(list)
        errs = 0
        start.wait()
        t_end = time.perf_counter() + duration_s
        i = 0
        while i < max_ops and (i < min_ops or time.perf_counter() < t_end):
            t0 = time.perf_counter()
            try:
                parts = op(c, i)
            except Exception:  # counted, reported; a benchmark with errors is flagged in the summary
                errs += 1
                parts = None
            else:
                mine[name].append(time.perf_counter() - t0)
                for part, secs in parts or ():
                    mine[part].append(secs)
            i += 1
        with lock:
            for k, v in mine.items():
                lat[k].extend(v)
            errors[0] += errs
            ends.append(time.perf_counter())

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = max(ends) - t0
    return {k: run_summary(v, wall, errors[0] if k == name else 0) for k, v in lat.items()} or {
        name: run_summary([], wall, errors[0])}


async def run_tasks(name: str, op: AsyncOp, clients: int, *, duration_s: float, min_ops: int,
                    max_ops: int) -> dict[str, Any]:
    """The asyncio twin of ``run_threads`` (MCP clients)."""
    lat: dict[str, list[float]] = defaultdict(list)
    errors = [0]
    t_end = time.perf_counter() + duration_s

    async def worker(c: int) -> None:
        i = 0
        while i < max_ops and (i < min_ops or time.perf_counter() < t_end):
            t0 = time.perf_counter()
            try:
                parts = await op(c, i)
            except Exception:
                errors[0] += 1
                parts = None
            else:
                lat[name].append(time.perf_counter() - t0)
                for part, secs in parts or ():
                    lat[part].append(secs)
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in range(clients)))
    wall = time.perf_counter() - t0
    return {k: run_summary(v, wall, errors[0] if k == name else 0) for k, v in lat.items()} or {
        name: run_summary([], wall, errors[0])}
