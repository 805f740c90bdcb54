"""The peer: the MCP reference memory server (npm ``@modelcontextprotocol/server-memory``).

Installed with npm into a cache directory (node and npm must be on PATH), run over
stdio, driven by the same SDK client as Engram. Equivalent work: writing an item
(``create_entities`` with one entity and its observation, ``add_observations``) and
searching (``search_nodes``) with N items present. The peer keeps a JSONL file
that it reads whole on every call and rewrites whole on every write; it has no
governance (no auth, policy, sealing, journal, audit, idempotency or forgetting
guarantees).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tools.bench.corpus import Corpus
from tools.bench.stats import combine
from tools.bench.workload import run_tasks

PACKAGE = "@modelcontextprotocol/server-memory"
DEFAULT_CACHE = Path(os.environ.get("ENGRAM_BENCH_CACHE", Path.home() / ".cache" / "engram-bench"))


def install(cache: Path = DEFAULT_CACHE, version: str | None = None) -> tuple[Path, str]:
    """npm-install the peer into ``cache/peer`` (reused when present); returns (entry script, version)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise RuntimeError("node and npm are needed for the peer comparison")
    root = cache / "peer"
    pkg_dir = root / "node_modules" / "@modelcontextprotocol" / "server-memory"
    if not (pkg_dir / "package.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        spec = f"{PACKAGE}@{version}" if version else PACKAGE
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(root), spec], check=True,
                       stdout=subprocess.DEVNULL)
    meta = json.loads((pkg_dir / "package.json").read_text())
    entry = meta.get("bin")
    entry = entry if isinstance(entry, str) else next(iter((entry or {}).values()), "dist/index.js")
    return pkg_dir / entry, meta["version"]


def preload(path: Path, corpus: Corpus, n: int) -> None:
    """Write n items in the peer's own JSONL format (what n create_entities calls would leave)."""
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            name, etype, obs = corpus.peer_item(i)
            f.write(json.dumps({"type": "entity", "name": name, "entityType": etype, "observations": [obs]}) + "\n")


async def bench_peer(entry: Path, work: Path, corpus: Corpus, sizes: list[int], *, runs: int, duration_s: float,
                     min_ops: int, max_ops: int, queries: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        out[str(n)] = await _bench_size(entry, work, corpus, n, runs=runs, duration_s=duration_s, min_ops=min_ops,
                                        max_ops=max_ops, queries=queries)
    return out


async def _bench_size(entry: Path, work: Path, corpus: Corpus, n: int, *, runs: int, duration_s: float, min_ops: int,
                      max_ops: int, queries: list[str]) -> dict[str, Any]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    memfile = work / f"peer-{n}.jsonl"
    preload(memfile, corpus, n)
    params = StdioServerParameters(command="node", args=[str(entry)], env={**os.environ,
                                                                            "MEMORY_FILE_PATH": str(memfile)})
    res: dict[str, list[dict[str, Any]]] = {"write_create_entities": [], "write_add_observations": [],
                                             "search_nodes": []}
    counter = iter(range(10**9))
    rnd = random.Random(n)
    async with Client(params) as client:
        await client.list_tools()

        async def create(c: int, i: int):
            k = next(counter)
            _, etype, obs = corpus.peer_item(n + k)
            r = await client.call_tool("create_entities", {"entities": [
                {"name": f"bench-{n}-{k}", "entityType": etype, "observations": [obs]}]})
            if r.is_error:
                raise RuntimeError(str(r.content))

        async def observe(c: int, i: int):
            r = await client.call_tool("add_observations", {"observations": [
                {"entityName": f"memory-{rnd.randrange(n):07d}", "contents": [f"note {next(counter)} {rnd.random()}"]}]})
            if r.is_error:
                raise RuntimeError(str(r.content))

        async def search(c: int, i: int):
            r = await client.call_tool("search_nodes", {"query": rnd.choice(queries)})
            if r.is_error:
                raise RuntimeError(str(r.content))

        for fn in (create, observe, search):  # warm-up
            for _ in range(3):
                await fn(0, 0)
        for _ in range(runs):
            for name, fn in (("write_create_entities", create), ("write_add_observations", observe),
                             ("search_nodes", search)):
                r = await run_tasks(name, fn, 1, duration_s=duration_s, min_ops=min_ops, max_ops=max_ops)
                res[name].append(r[name])
    memfile.unlink(missing_ok=True)
    return {k: combine(v) for k, v in res.items()}
