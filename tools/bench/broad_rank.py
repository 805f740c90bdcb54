"""The ranking alone, this checkout's against another's, in one process on one index (issue 63).

    .venv/bin/python -m tools.bench.broad_rank --data DIR --tree CHECKOUT [--reps 20] [--rounds 5]

Opens ``DIR`` (loaded by ``tools.bench.broad``) with this checkout's core, runs one search per
query of each shape (broad, long, narrow) to capture the arguments ``SearchIndex.rank`` gets,
then times ``rank`` of this checkout's ``engram_core/store/search_index`` and of
``CHECKOUT``'s (loaded as a separate package, ``_other_search_index``, its own modules importing
each other; called on an index of its classes over the same scopes' arrays) alternately
call by call (``--rounds`` times ``--reps`` pairs per query), and checks that both return the same page (rows,
scores, hit count, best BM25). On a machine whose speed moves within a minute this separates
what a ranking change does from everything else a search does. Prints per shape the median
milliseconds of each and the median and quartiles of the pairs' ratios (other / this).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class _OtherPackage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``_other_search_index.*`` from another checkout's ``store/search_index/`` with its
    own imports of its package turned to that name: its modules import each other absolutely
    (``engram_core.store.search_index.postings``), which would otherwise load this checkout's."""

    def __init__(self, package: Path) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _OTHER and not fullname.startswith(_OTHER + "."):
            return None
        name = fullname[len(_OTHER) + 1:]
        file = self.package / "__init__.py" if not name else self.package / f"{name}.py"
        return importlib.util.spec_from_file_location(
            fullname, file, loader=self, submodule_search_locations=[str(self.package)] if not name else None)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        source = Path(module.__spec__.origin).read_text().replace("engram_core.store.search_index", _OTHER)
        exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)


_OTHER = "_other_search_index"


def _module_of(tree: Path) -> Any:
    single = tree / "engram_core/store/search_index.py"  # before issue 62 made it a package
    if single.exists():
        spec = importlib.util.spec_from_file_location(_OTHER, single)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    sys.meta_path.insert(0, _OtherPackage(tree / "engram_core/store/search_index"))
    return importlib.import_module(_OTHER)


def _other_index(other: Any, index: Any) -> Any:
    """An index of ``other``'s classes over ``index``'s scopes: each scope's arrays shared (ranking
    only reads them), its kept term contributions its own, so each ranking is timed with its own
    ``ScopeIndex`` methods (a package's scope code is in ``postings.py``) and its own cache."""
    if not hasattr(other, "postings"):  # a single module: its rank is timed on this index's scopes
        return index
    scopes = {}
    for key, scope in index._scopes.items():
        kind = getattr(other.postings, "ScopeIndex", None) or other.postings.Scope  # named Scope before 2026-12-07
        twin = kind.__new__(kind)
        twin.__dict__.update(scope.__dict__)
        twin.forget_contributions()
        scopes[key] = twin
    return other.SearchIndex(scopes, dict(index._scope_of))


def measure(data: Path, tree: Path, *, reps: int, rounds: int, queries: int) -> dict[str, Any]:
    from engram_core.app.composition import open_core
    from engram_core.services.memory import MemoryService
    from engram_core.store import search_index as this
    from engram_core.trust.hostctx import make_context, verify_context
    from engram_core.trust.hostkeys import load_private_key_file
    from tools.bench.broad_corpus import SHAPES, TENANT, WORKSPACE, BroadCorpus
    from tools.bench.broad_inprocess import _records_of
    from tools.bench.corpus import PURPOSE

    other = _module_of(tree)
    core, host_key_path, _ = open_core(data, semantic=False)
    memory = MemoryService(core)
    key = load_private_key_file(host_key_path)
    captured: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    rank = this.SearchIndex.rank

    def spy(index: Any, *args: Any, **kwargs: Any) -> Any:
        captured.append((index, args, kwargs))
        return rank(index, *args, **kwargs)

    out: dict[str, Any] = {"data": str(data), "other": str(tree), "reps": reps, "rounds": rounds, "shapes": {}}
    corpus = BroadCorpus()
    records = _records_of(data)
    # A package's rankings keep their term contributions apart (``_other_index``), each within
    # its own checkout's budget; a single module's share this index's scopes: room for both there.
    budget = this.tuning.CONTRIBUTION_BYTES
    if not hasattr(other, "postings"):
        this.tuning.CONTRIBUTION_BYTES = 4 * budget
    try:
        this.SearchIndex.rank = spy  # type: ignore[method-assign]
        for shape in SHAPES:
            captured.clear()
            for q in corpus.shape_queries(shape, queries, records):
                signed = make_context(key, call="engram_memory_search", tenant=TENANT, workspace=WORKSPACE,
                                      principal="user:bench", agent_id="agent-bench", session="bench",
                                      purpose_ref=PURPOSE, now_ms=time.time_ns() // 1_000_000, memory_enabled=True)
                memory.search(verify_context(signed, core.trusted, now_ms=core.now_ms()),
                              {"query": q, "purpose_ref": PURPOSE, "limit": 10})
            calls = [(index, _other_index(other, index), args, kwargs) for index, args, kwargs in captured]
            for index, twin, args, kwargs in calls:  # the same page from both, and warm caches
                a, b = rank(index, *args, **kwargs), other.SearchIndex.rank(twin, *args, **kwargs)
                if (a.total, a.rows, a.best_bm25, a.own_best_bm25) != (b.total, b.rows, b.best_bm25, b.own_best_bm25):
                    raise SystemExit(f"{shape}: the two rankings differ: {a} != {b}")
            # Pairs of one call each, alternated, the order flipped every round: both share the
            # machine's state of that moment (its speed moves by 1.3-1.5x within minutes).
            times: dict[str, list[float]] = {"this": [], "other": []}
            ratios: list[float] = []
            for r in range(rounds):
                for index, twin, args, kwargs in calls:
                    for _ in range(reps):
                        pair = {}
                        for name, fn, on in (("other", other.SearchIndex.rank, twin),
                                             ("this", rank, index))[:: 1 if r % 2 else -1]:
                            t = time.perf_counter()
                            fn(on, *args, **kwargs)
                            pair[name] = (time.perf_counter() - t) * 1000
                        times["other"].append(pair["other"])
                        times["this"].append(pair["this"])
                        ratios.append(pair["other"] / pair["this"])
            q = statistics.quantiles(ratios, n=4)
            out["shapes"][shape] = {
                "this_ms": round(statistics.median(times["this"]), 4),
                "other_ms": round(statistics.median(times["other"]), 4),
                "other_over_this": round(statistics.median(ratios), 3),
                "ratio_quartiles": [round(x, 3) for x in q],
                "pairs": len(ratios),
                "hits_first_query": calls[0][0].rank(*calls[0][2], **calls[0][3]).total,
            }
            print(f"{shape:7} this {out['shapes'][shape]['this_ms']:8.3f} ms  other "
                  f"{out['shapes'][shape]['other_ms']:8.3f} ms  other/this {out['shapes'][shape]['other_over_this']}"
                  f" (quartiles {out['shapes'][shape]['ratio_quartiles']})", file=sys.stderr, flush=True)
    finally:
        this.SearchIndex.rank = rank  # type: ignore[method-assign]
        this.tuning.CONTRIBUTION_BYTES = budget
        core.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.broad_rank", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--tree", type=Path, required=True, help="the other checkout (e.g. a worktree of the code before)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--queries", type=int, default=8, help="queries per shape")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    result = measure(a.data, a.tree.resolve(), reps=a.reps, rounds=a.rounds, queries=a.queries)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
