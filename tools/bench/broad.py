"""Issue 63: Engram beside the MCP reference memory server on the searches agents really send.

    .venv/bin/python -m tools.bench.broad --records 10000 [--data DIR] [--rounds 200] [--out FILE]
    .venv/bin/python -m tools.bench.broad --records 100000 --rounds 60 --baseline CHECKOUT
    .venv/bin/python -m tools.bench.broad --records 40 --rounds 3 --no-peer        # a smoke

Loads N records of the broad corpus (tools/bench/broad_corpus.py: each a decision naming six of
27 common engineering words) into one scope, once per ``--data`` directory, and the peer's JSONL
with the same N texts; serves the data with ``engram serve`` (semantic channel off: the records
have no vectors), then for each shape (``broad``: two of the 27 words, thousands of matches;
``long``: a capture's whole text; ``narrow``: two mid-frequency tags) runs rounds of one search
per path, in random order within each round, so that a shared, loaded machine slows every path
alike: ``grpc`` (a client signing a fresh host context per call, as the adapter does), ``mcp``
(``engram mcp`` over stdio, driven by the official SDK client) and ``peer`` (the reference
server's ``search_nodes``, the same SDK client, the same query). ``--baseline CHECKOUT`` adds
``grpc_baseline`` and ``mcp_baseline``: that checkout's core serving a copy of the data and its
adapter, for a before/after in the same run. Prints per shape and path p50/p90/mean, the peer
over Engram's MCP p50 ratio, and CPU per call of each process (client, adapter, core, peer, from
/proc), and what the first search of each shape returned (Engram's candidate count, the peer's
entity count). ``--floor`` adds ``floor`` (tools.bench.mcp_floor): the same SDK server and
transport replaying the shape's first MCP answer, no core behind it: the least this answer can
cost through MCP here. ``--py-spy PATH`` samples this checkout's core and adapter during each shape's
first ``--spy-seconds`` (py-spy is not a dependency: ``pip install --target DIR py-spy``), and
reports the share of samples per leaf function and per category (self time, idle left out);
the sampler's stops cost the sampled processes time and CPU, so take a run's timings and CPU
figures from a run without it (the result says ``py_spy: true``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engram_core.contract.tools import SEARCH_TOOL
from tools.bench import machine
from tools.bench.broad_corpus import SHAPES, TENANT, WORKSPACE, BroadCorpus, load
from tools.bench.corpus import PURPOSE
from tools.bench.report import print_and_save
from tools.bench.serving import Served
from tools.bench.stats import percentile

REPO = Path(__file__).resolve().parents[2]
_ADAPTER = "import sys; from engram_core.cli import main; sys.exit(main())"


def _ms(xs: list[float], q: float) -> float:
    return round(percentile(sorted(xs), q * 100) * 1000, 3)


def _child_pid(needle: bytes) -> int | None:
    """A child of this process whose command line holds ``needle`` (None if /proc cannot tell)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me and needle in cmdline:
            return int(entry.name)
    return None


_WAITING = ("(threading.py:", "(selectors.py:", "(concurrent/futures/thread.py:", "(queue.py:", "_serve (grpc/",
            "(asyncio/base_events.py:", "(anyio/")


def _folded_summary(path: Path, top: int = 12) -> dict[str, Any]:
    """py-spy's raw (folded) stacks: the share of samples per leaf function and per category
    (tools.bench.profiling's), leaves only (self time)."""
    from tools.bench.profiling import category

    leaves: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        if any(w in leaf for w in _WAITING):
            continue  # a thread waiting for work (py-spy counts some waits as active)
        leaves[leaf] = leaves.get(leaf, 0) + int(count)
        total += int(count)
    cats: dict[str, int] = {}
    for leaf, k in leaves.items():
        name, _, where = leaf.partition(" (")
        cat = category(("/" + where.rstrip(")").rsplit(":", 1)[0], 0, name))
        cats[cat] = cats.get(cat, 0) + k
    ranked = sorted(leaves.items(), key=lambda kv: -kv[1])[:top]
    return {"samples": total, "share_by_category": {c: round(k / max(total, 1), 3) for c, k in
                                                    sorted(cats.items(), key=lambda kv: -kv[1])},
            "top_leaves": [{"share": round(k / max(total, 1), 3), "function": f} for f, k in ranked]}


def _sampler(py_spy: str | None, pid: int | None, out: Path, seconds: float) -> Any:
    """``py-spy record`` of ``pid`` for ``seconds`` (idle samples left out), or None."""
    import subprocess

    if not py_spy or not pid:
        return None
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--format", "raw", "-o", str(out), "-d",
                             str(max(1, int(seconds))), "-r", "250"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


async def measure(a: argparse.Namespace, data: Path, work: Path) -> dict[str, Any]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from tools.bench.grpc_client import GrpcAgent
    from tools.bench.mcp_client import approve, value_of, write_config

    corpus = BroadCorpus()
    rnd = random.Random(63)
    baseline = Path(a.baseline).resolve() if a.baseline else None
    # This checkout's own core (not the venv's installed ``engram``: it may be another checkout's).
    cores: dict[str, Served] = {"grpc": Served(data, semantic=False, tree=REPO)}
    trees: dict[str, Path] = {"mcp": REPO}
    if baseline is not None:
        # Beside the data, on the same filesystem: a copy in the system's temporary directory (on
        # the disk here, while --data may be on tmpfs) made the baseline's core pay a disk sync
        # per search for its audit row, ~1 ms, a bias in this checkout's favour.
        copy = data.parent / f"{data.name}-baseline"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(data, copy)
        cores["grpc_baseline"] = Served(copy, semantic=False, tree=baseline)
        trees["mcp_baseline"] = baseline
    facts, load_before = machine.facts(), machine.loadavg()
    peer_version = None
    try:
        agents = {name: GrpcAgent(core.address, core.key_path, tenant=TENANT, workspace=WORKSPACE)
                  for name, core in cores.items()}
        async with contextlib.AsyncExitStack() as stack:
            clients: dict[str, Any] = {}
            pids: dict[str, int | None] = {name: core.proc.pid for name, core in cores.items()}
            for n, (name, tree) in enumerate(trees.items()):
                core = cores[name.replace("mcp", "grpc")]
                cfg = write_config(work / f"broad-{n}.toml", address=core.address, signing_key=core.key_path,
                                   tenant=TENANT, workspace=WORKSPACE, n=n)
                params = StdioServerParameters(command=sys.executable, cwd=str(tree),
                                               env={**os.environ, "PYTHONPATH": str(tree)},
                                               args=["-c", _ADAPTER, "mcp", "--host-config", str(cfg)])
                clients[name] = await stack.enter_async_context(Client(params, elicitation_callback=approve))
                await clients[name].list_tools()
                pids[name] = _child_pid(f"broad-{n}.toml".encode())
            if not a.no_peer:
                from tools.bench.peer import install, preload

                entry, peer_version = install()
                memfile = work / f"peer-{a.records}.jsonl"
                if not memfile.exists():
                    preload(memfile, corpus, a.records)
                params = StdioServerParameters(command="node", args=[str(entry)],
                                               env={**os.environ, "MEMORY_FILE_PATH": str(memfile)})
                clients["peer"] = await stack.enter_async_context(Client(params))
                await clients["peer"].list_tools()
                pids["peer"] = _child_pid(str(entry).encode())
            floor_answer = work / "floor-answer.json"
            if a.floor:
                floor_answer.write_text("{}")
                params = StdioServerParameters(command=sys.executable, cwd=str(REPO),
                                               env={**os.environ, "PYTHONPATH": str(REPO)},
                                               args=["-m", "tools.bench.mcp_floor", str(floor_answer)])
                clients["floor"] = await stack.enter_async_context(Client(params))
                await clients["floor"].list_tools()
                pids["floor"] = _child_pid(str(floor_answer).encode())
            paths = [*agents, *clients]
            shapes: dict[str, Any] = {}

            async def call(path: str, query: str) -> dict[str, Any]:
                if path in agents:
                    return agents[path].call("search", {"query": query, "purpose_ref": PURPOSE})
                if path == "peer":
                    r = await clients[path].call_tool("search_nodes", {"query": query})
                    if r.is_error:
                        raise RuntimeError(str(r.content))
                    return r.structured_content or {}
                return value_of(await clients[path].call_tool(SEARCH_TOOL, {"query": query, "purpose_ref": PURPOSE}))

            for shape in a.shapes:
                queries = corpus.shape_queries(shape, 50, a.records)
                if a.floor:  # the floor replays this shape's first real answer, byte for byte
                    r = await clients["mcp"].call_tool(SEARCH_TOOL, {"query": queries[0], "purpose_ref": PURPOSE})
                    floor_answer.write_text(json.dumps(r.structured_content))
                first = {p: await call(p, queries[0]) for p in paths}
                for _ in range(a.warmup):
                    for p in paths:
                        await call(p, rnd.choice(queries))
                wall: dict[str, list[float]] = {p: [] for p in paths}
                client_cpu = dict.fromkeys(paths, 0.0)
                cpu0 = {name: machine.process_cpu_s(pid) for name, pid in pids.items() if pid}
                spies = {name: (_sampler(a.py_spy, pids.get(name), work / f"spy-{shape}-{name}.txt", a.spy_seconds),
                                work / f"spy-{shape}-{name}.txt") for name in ("grpc", "mcp")}
                for _ in range(a.rounds):
                    rnd.shuffle(paths)
                    q = rnd.choice(queries)
                    for p in paths:
                        t0, c0 = time.perf_counter(), time.process_time()
                        await call(p, q)
                        wall[p].append(time.perf_counter() - t0)
                        client_cpu[p] += time.process_time() - c0
                cpu = {name: (machine.process_cpu_s(pid) - cpu0[name]) * 1000 / a.rounds
                       for name, pid in pids.items() if pid}
                sampled = {}
                for name, (proc, path) in spies.items():
                    if proc is not None and proc.wait() == 0 and path.exists():
                        sampled["core" if name == "grpc" else "adapter"] = _folded_summary(path)
                out: dict[str, Any] = {}
                for p in sorted(wall):
                    xs = wall[p]
                    fig: dict[str, Any] = {"p50_ms": _ms(xs, 0.5), "p90_ms": _ms(xs, 0.9),
                                           "mean_ms": round(statistics.mean(xs) * 1000, 3),
                                           "client_cpu_ms_per_call": round(client_cpu[p] / a.rounds * 1000, 3)}
                    if p == "peer":
                        fig["peer_cpu_ms_per_call"] = round(cpu.get("peer", float("nan")), 3)
                        fig["first_query_entities"] = len(first[p].get("entities", []))
                    elif p == "floor":
                        fig["floor_server_cpu_ms_per_call"] = round(cpu.get("floor", float("nan")), 3)
                        fig["first_query_candidates"] = first[p].get("rank_receipt", {}).get("candidate_count")
                    else:
                        core = p.replace("mcp", "grpc")
                        # A core serves its gRPC path and its MCP path: two searches a round.
                        served = sum(1 for q_ in paths if q_.replace("mcp", "grpc") == core)
                        fig["core_cpu_ms_per_call"] = round(cpu.get(core, float("nan")) / served, 3)
                        if p.startswith("mcp"):
                            fig["adapter_cpu_ms_per_call"] = round(cpu.get(p, float("nan")), 3)
                        fig["first_query_candidates"] = first[p].get("rank_receipt", {}).get("candidate_count")
                    out[p] = fig
                if "peer" in out:
                    for p in out:
                        if p.startswith(("mcp", "grpc")) or p == "floor":
                            out[p]["peer_over_this_p50"] = round(out["peer"]["p50_ms"] / out[p]["p50_ms"], 2)
                if "grpc_baseline" in out:
                    for p in ("grpc", "mcp"):
                        if p in out and f"{p}_baseline" in out:
                            out[p]["baseline_over_this_p50"] = round(out[f"{p}_baseline"]["p50_ms"] / out[p]["p50_ms"],
                                                                     2)
                if sampled:
                    out["py_spy"] = sampled
                shapes[shape] = out
                print(f"{shape:7} " + "  ".join(f"{p} {f['p50_ms']:.2f}" for p, f in out.items() if p in wall),
                      file=sys.stderr, flush=True)
        for agent in agents.values():
            agent.close()
    finally:
        for core in cores.values():
            core.stop()
    return {"machine": facts, "records": a.records, "rounds": a.rounds, "loadavg_before": load_before,
            "loadavg_after": machine.loadavg(), "peer_version": peer_version, "semantic": "off",
            "baseline": str(baseline) if baseline else None, "py_spy": bool(a.py_spy), "shapes": shapes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.broad", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=200, help="measured rounds per shape (one search per path each)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--data", default=None, help="data directory to load once and reuse (default: a temporary one)")
    p.add_argument("--baseline", default=None, help="another checkout: its core (on a copy of the data) and adapter")
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--floor", action="store_true",
                   help="add the MCP hop's floor (tools.bench.mcp_floor): each shape's first answer replayed")
    p.add_argument("--py-spy", default=None, help="py-spy's path: a sampling profile of this core and adapter per shape")
    p.add_argument("--spy-seconds", type=float, default=10, help="how long py-spy samples, from each shape's start")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    a.shapes = a.shapes.split(",")
    with tempfile.TemporaryDirectory(prefix="engram-broad-") as tmp:
        data = Path(a.data) if a.data else Path(tmp) / "data"
        if not data.exists():
            load(data, a.records)
        result = asyncio.run(measure(a, data, Path(tmp)))
    result["command"] = "python -m tools.bench.broad " + " ".join(argv if argv is not None else sys.argv[1:])
    print_and_save(result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
