"""Facts about the machine a benchmark ran on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _version(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def facts() -> dict[str, Any]:
    import duckdb
    import grpc

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": _mem_total_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "duckdb": duckdb.__version__,
        "grpcio": grpc.__version__,
        "node": _version(["node", "--version"]),
        "loadavg_at_start": [round(x, 2) for x in load] if load else None,
        # A CPU-bound thread on the CPU that takes these delays fsyncs (tools/bench/fsync_beside_cpu.py).
        "block_interrupts_by_cpu": block_interrupts_by_cpu(),
    }


def block_interrupts_by_cpu() -> dict[str, list[int]]:
    """The block devices' completion interrupts taken by each CPU so far (/proc/interrupts;
    virtio-blk request queues and NVMe queues), by interrupt name."""
    try:
        lines = Path("/proc/interrupts").read_text().splitlines()
    except OSError:
        return {}
    cpus = len(lines[0].split()) if lines else 0
    out = {}
    for line in lines[1:]:
        parts = line.split()
        name = parts[-1] if parts else ""
        if ("virtio" in name and "-req" in name) or name.startswith("nvme"):
            out[name] = [int(v) for v in parts[1:1 + cpus] if v.isdigit()]
    return out


def loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, all threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root_pid: int) -> float:
    """CPU seconds of a process and its direct children: its own, its reaped children's, and its
    live children's (a PostgreSQL postmaster: every backend, checkpointer and WAL writer)."""
    def stat(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    hz = os.sysconf("SC_CLK_TCK")
    fields = stat(root_pid)
    total = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = stat(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile (its time now counts as reaped, or soon will)
        if int(child[1]) == root_pid:  # ppid
            total += int(child[11]) + int(child[12])
    return total / hz


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat, all cores)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / hz, sum(fields) / hz
