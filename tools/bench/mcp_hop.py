"""The MCP hop: what ``engram mcp`` adds to a search, measured against gRPC in the same run.

    .venv/bin/python -m tools.bench.mcp_hop                       # 10k records, 500 rounds
    .venv/bin/python -m tools.bench.mcp_hop --baseline /path/to/other/checkout
    .venv/bin/python -m tools.bench.mcp_hop --writes              # a capture and its admission instead
    .venv/bin/python -m tools.bench.mcp_hop --baseline CHECKOUT --baseline-core   # before/after, core and adapter
    .venv/bin/python -m tools.bench.mcp_hop --records 100000 --baseline CHECKOUT --baseline-core --grpc-only

Loads N records into one scope (tools/bench/loader.py, once per --data directory), serves it
with ``engram serve``, then runs rounds of one lexical search each through gRPC (a synchronous
client signing a fresh host context per call, as the adapter does) and through ``engram mcp``
over stdio driven by the official SDK client, in random order within each round, so that a
shared, loaded machine slows every path alike. ``--baseline`` adds a second adapter run from
another checkout of this repository (its generated stubs included), for a before/after in the
same run. With ``--baseline-core`` the baseline's own ``engram serve`` serves a copy of the same
data directory, and the baseline paths (``grpc_baseline``, ``mcp_baseline``) go to it: the
before/after of a change to the core and the adapter together (a new --data directory is then
loaded by the baseline's own loader and kept as loaded beside it, ``DIR-as-loaded``, whose copy
the baseline serves in every run: a core refuses a store its migrations have not reached).
``--grpc-only`` leaves the MCP paths out. Prints p50/p90/p99/mean per path, the MCP paths' p50
minus gRPC's, the machine's facts and load average, and CPU per call: the client's (this
process), each adapter's and each core's (from /proc). With ``--writes`` each path has three
timings: ``PATH`` (the capture), ``PATH:admission``, and ``PATH:pair`` (the two of one round
together: a pair's own percentiles, not a sum of two medians). ``--writes --peer`` adds the MCP
reference memory server (``peer``: one ``create_entities`` per round, its file preloaded with N
items) to the rounds, and each pair path's ``peer_write_over_this_p50``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engram_core.contract.tools import ADMISSION_TOOL, CAPTURE_TOOL, SEARCH_TOOL
from tools.bench import machine
from tools.bench.corpus import PURPOSE, Corpus
from tools.bench.report import print_and_save
from tools.bench.serving import Served, run_in_tree
from tools.bench.stats import percentile

TENANT, WORKSPACE = "bench", "main"
REPO = Path(__file__).resolve().parents[2]
TOOL_OF_OP = {"search": SEARCH_TOOL, "capture": CAPTURE_TOOL, "request_admission": ADMISSION_TOOL}
_ADAPTER = "import sys; from engram_core.cli import main; sys.exit(main())"


def load(data: Path, records: int, corpus: Corpus) -> None:
    from engram_core.app.composition import open_core
    from tools.bench.loader import Progress, activate_scope, load_scope

    core, _, _ = open_core(data, semantic=False)
    try:
        activate_scope(core, TENANT, WORKSPACE)
        load_scope(core, corpus, TENANT, WORKSPACE, records, embed=False, progress=Progress(records, "loading"))
        core.store.checkpoint()
    finally:
        core.close()


def as_loaded(data: Path) -> Path:
    """Where a data directory loaded by a baseline is kept as loaded (``load_with``)."""
    return data.parent / f"{data.name}-as-loaded"


def load_with(tree: Path, data: Path, records: int) -> None:
    """Load ``data`` with another checkout's own loader, so that its core (older) and this
    checkout's (which migrates its copy forward) can both serve it."""
    run_in_tree(tree, "import sys; from pathlib import Path; from tools.bench.corpus import Corpus; "
                      "from tools.bench.mcp_hop import load; load(Path(sys.argv[1]), int(sys.argv[2]), Corpus())",
                str(data), str(records))


def _ms(xs: list[float], q: float) -> float:
    return round(percentile(sorted(xs), q * 100) * 1000, 2)


async def measure(a: argparse.Namespace, data: Path, corpus: Corpus) -> dict[str, Any]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from tools.bench.grpc_client import GrpcAgent
    from tools.bench.mcp_client import approve, value_of, write_config

    queries = corpus.queries(200)
    rnd = random.Random(7)
    baseline = Path(a.baseline).resolve() if a.baseline else None
    trees = {} if a.grpc_only else {"mcp": REPO} | ({"mcp_baseline": baseline} if baseline else {})
    semantic = a.semantic == "on"  # on: as tools.bench serves it (an admission embeds its record)
    copy = None
    if baseline is not None and a.baseline_core:
        # The baseline serves a fresh copy of the data as loaded (``as_loaded``), never one this
        # checkout's core has opened: its migrations move a store forward, and an older core
        # refuses a store newer than itself.
        copy = data.parent / f"{data.name}-baseline"
        shutil.rmtree(copy, ignore_errors=True)
        pristine = as_loaded(data)
        shutil.copytree(pristine if pristine.exists() else data, copy)
    served = Served(data, semantic=semantic)
    cores = {"mcp": served, "grpc": served}
    if copy is not None:
        cores["mcp_baseline"] = cores["grpc_baseline"] = Served(copy, semantic=semantic, tree=baseline)
    else:
        cores["mcp_baseline"] = served
    # Before the run: the facts carry the load average at their start, and cores are not yet busy.
    facts, load_before = machine.facts(), machine.loadavg()
    try:
        agents = {name: GrpcAgent(core.address, core.key_path, tenant=TENANT, workspace=WORKSPACE)
                  for name, core in cores.items() if name.startswith("grpc")}
        async with contextlib.AsyncExitStack() as stack:
            clients: dict[str, Any] = {}
            for n, (name, tree) in enumerate(trees.items()):
                core = cores[name]
                cfg = write_config(data.parent / f"hop-{n}.toml", address=core.address,
                                   signing_key=core.key_path, tenant=TENANT, workspace=WORKSPACE, n=n)
                env = {**os.environ, "PYTHONPATH": str(tree)}
                params = StdioServerParameters(command=sys.executable, cwd=str(tree), env=env,
                                               args=["-c", _ADAPTER, "mcp", "--host-config", str(cfg)])
                clients[name] = await stack.enter_async_context(Client(params, elicitation_callback=approve))
                await clients[name].list_tools()
            pids = {name: _adapter_pid(name, n) for n, name in enumerate(clients)}
            if a.peer:  # the reference server's write, alternated with the pairs (its item: a capture's text)
                from tools.bench.peer import install, preload

                entry, _ = install()
                memfile = data.parent / f"peer-{a.records}.jsonl"
                preload(memfile, corpus, a.records)  # afresh: the peer's file grows with every run's writes
                params = StdioServerParameters(command="node", args=[str(entry)],
                                               env={**os.environ, "MEMORY_FILE_PATH": str(memfile)})
                clients["peer"] = await stack.enter_async_context(Client(params))
                await clients["peer"].list_tools()
            core_pids = {name: core.proc.pid for name, core in cores.items() if name.startswith("grpc")}
            paths = [*agents, *clients]
            wall: dict[str, list[float]] = {p: [] for p in paths}
            client_cpu = dict.fromkeys(paths, 0.0)

            wall.update({f"{p}:{leg}": [] for p in paths for leg in ("admission", "pair")} if a.writes else {})
            made = [0]
            # Keys and texts of this run alone: a reused --data holds an earlier run's captures,
            # and the same key (or content) again would measure replays, not writes.
            salt = f"hop{time.time_ns():x}"

            async def call(path: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
                if path == "peer":
                    _, etype, obs = corpus.peer_item(a.records + made[0])
                    r = await clients["peer"].call_tool("create_entities", {"entities": [
                        {"name": f"{salt}-{made[0]}", "entityType": etype, "observations": [obs]}]})
                    if r.is_error:
                        raise RuntimeError(str(r.content))
                    return {}
                if path in agents:
                    return agents[path].call(op, args)
                return value_of(await clients[path].call_tool(TOOL_OF_OP[op], args))

            async def one(path: str, record: bool) -> None:
                t0, c0 = time.perf_counter(), time.process_time()
                if path == "peer":  # one write of the peer's: the pair's counterpart
                    made[0] += 1
                    await call(path, "create_entities", {})
                    if record:
                        wall[path].append(time.perf_counter() - t0)
                        wall[f"{path}:pair"].append(time.perf_counter() - t0)
                        client_cpu[path] += time.process_time() - c0
                    return
                if a.writes:  # a capture, then the admission of its candidate: two timings
                    made[0] += 1
                    cap = await call(path, "capture", corpus.capture_args(salt, made[0]))
                    if cap.get("status") != "committed_pending":
                        raise SystemExit(f"capture {made[0]}: {cap.get('status')}, not a new candidate")
                    t1 = time.perf_counter()
                    adm = await call(path, "request_admission", {"candidate_id": cap["candidate_id"],
                                                                 "idempotency_key": f"{salt}-admission-{made[0]:010d}"})
                    if adm.get("replayed"):
                        raise SystemExit(f"admission {made[0]} was a replay: the keys are not this run's")
                    if record:
                        t2 = time.perf_counter()
                        wall[path].append(t1 - t0)
                        wall[f"{path}:admission"].append(t2 - t1)
                        wall[f"{path}:pair"].append(t2 - t0)
                        client_cpu[path] += time.process_time() - c0
                    return
                await call(path, "search", {"query": rnd.choice(queries), "purpose_ref": PURPOSE})
                if record:
                    wall[path].append(time.perf_counter() - t0)
                    client_cpu[path] += time.process_time() - c0

            for _ in range(a.warmup):
                for path in paths:
                    await one(path, False)
            adapter_cpu0 = {name: machine.process_cpu_s(pid) for name, pid in pids.items() if pid}
            core_cpu0 = {name: machine.process_cpu_s(pid) for name, pid in core_pids.items()}
            for _ in range(a.rounds):
                rnd.shuffle(paths)
                for path in paths:
                    await one(path, True)
            calls = a.rounds * (2 if a.writes else 1)
            adapter_cpu = {name: (machine.process_cpu_s(pid) - adapter_cpu0[name]) / calls * 1000
                           for name, pid in pids.items() if pid}
            # A core serves its gRPC path and the MCP paths sent to it: CPU per call of all of them.
            served_paths = {name: sum(1 for p in paths if cores.get(p) is cores[name]) for name in core_pids}
            core_cpu = {name: (machine.process_cpu_s(pid) - core_cpu0[name]) / (calls * served_paths[name]) * 1000
                        for name, pid in core_pids.items()}
        for agent in agents.values():
            agent.close()
    finally:
        for core in {id(c): c for c in cores.values()}.values():
            core.stop()
    out: dict[str, Any] = {"machine": facts, "records": a.records, "rounds": a.rounds,
                           "semantic": a.semantic, "calls": "capture, admission" if a.writes else "search",
                           "loadavg_before": load_before,
                           "loadavg_after": machine.loadavg(), "paths": {}}
    for path, xs in wall.items():
        base, _, leg = path.partition(":")
        if base == "peer" and leg == "admission":
            continue
        reference = "grpc_baseline" if base.endswith("baseline") and "grpc_baseline" in wall else "grpc"
        grpc = wall[f"{reference}:{leg}" if leg else reference]
        out["paths"][path] = {
            "p50_ms": _ms(xs, 0.5), "p90_ms": _ms(xs, 0.9), "p99_ms": _ms(xs, 0.99),
            "mean_ms": round(statistics.mean(xs) * 1000, 2),
            "p50_minus_grpc_ms": round(_ms(xs, 0.5) - _ms(grpc, 0.5), 2),
            "client_cpu_ms_per_call": round(client_cpu[base] / calls * 1000, 2),
            "adapter_cpu_ms_per_call": round(adapter_cpu[base], 2) if base in adapter_cpu else None,
        }
        core_of = base.replace("mcp", "grpc")
        if core_of in core_cpu:
            out["paths"][path]["core_cpu_ms_per_call"] = round(core_cpu[core_of], 2)
    if "peer" in wall:  # the done-when of issue 63: a pair no slower than one peer write, same run
        for path, fig in out["paths"].items():
            if path.endswith(":pair") and not path.startswith("peer"):
                fig["peer_write_over_this_p50"] = round(_ms(wall["peer"], 0.5) / fig["p50_ms"], 2)
    return out


def _adapter_pid(name: str, n: int) -> int | None:
    """The adapter child of this process serving config hop-N.toml (None if /proc cannot tell)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me and f"hop-{n}.toml".encode() in b" ".join(cmdline):
            return int(entry.name)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.mcp_hop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=500, help="measured rounds (one search per path each)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--data", default=None, help="data directory to load once and reuse (default: a temporary one)")
    p.add_argument("--baseline", default=None, help="another checkout of this repository: its adapter is measured too")
    p.add_argument("--baseline-core", action="store_true",
                   help="with --baseline: its core serves a copy of the data for its paths (grpc_baseline, mcp_baseline)")
    p.add_argument("--grpc-only", action="store_true", help="no MCP paths: the gRPC path(s) alone")
    p.add_argument("--peer", action="store_true",
                   help="with --writes: the reference memory server's create_entities too, alternated with the pairs "
                        "(node and npm needed), and each pair path's p50 over the peer's")
    p.add_argument("--writes", action="store_true",
                   help="rounds of a capture and its admission per path instead of a search")
    p.add_argument("--semantic", choices=("on", "off"), default="on",
                   help="whether the cores serve the semantic channel (on: admissions embed their records)")
    p.add_argument("--out", default=None, help="write the result as JSON here too")
    a = p.parse_args(argv)
    if a.peer and not a.writes:
        p.error("--peer compares writes: give --writes")
    corpus = Corpus()
    with tempfile.TemporaryDirectory(prefix="engram-hop-") as tmp:
        data = Path(a.data) if a.data else Path(tmp) / "data"
        if not data.exists():
            if a.baseline and a.baseline_core:
                load_with(Path(a.baseline).resolve(), as_loaded(data), a.records)
                shutil.copytree(as_loaded(data), data)
            else:
                load(data, a.records, corpus)
        result = asyncio.run(measure(a, data, corpus))
    print_and_save(result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
