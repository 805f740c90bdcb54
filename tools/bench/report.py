"""Targets (issue 8) and Markdown tables from a summary.json.

    .venv/bin/python -m tools.bench.report tools/bench/results/<run>/summary.json > tables.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def print_and_save(result: dict[str, Any], out: str | Path | None, *, indent: int = 1) -> None:
    """A run's result as JSON on stdout, and in ``out`` too when one is named (its directory
    made if missing)."""
    text = json.dumps(result, indent=indent)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")


def _pt(doc: dict[str, Any], size: int | str, surface: str, op: str, clients: int = 1) -> dict[str, Any] | None:
    return doc.get("sizes", {}).get(str(size), {}).get(surface, {}).get(op, {}).get(str(clients))


def _peer(doc: dict[str, Any], size: int | str, op: str) -> dict[str, Any] | None:
    return doc.get("peer", {}).get("sizes", {}).get(str(size), {}).get(op)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    sizes = sorted(int(s) for s in doc.get("sizes", {}))
    big = max(sizes) if sizes else None
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, measured: Any, met: bool | None, note: str = "") -> None:
        out.append({"target": name, "wanted": target, "measured": measured, "met": met, "note": note})

    s = _pt(doc, big, "grpc", "search_lexical") if big else None
    if s:
        add(f"search p50 at {big:,} records (gRPC, 1 client, lexical)", "<= 10 ms", s["p50_ms"], s["p50_ms"] <= 10,
            "" if big == 100_000 else "largest size measured is not 100k")
        add(f"search p99 at {big:,} records (gRPC, 1 client, lexical)", "<= 50 ms", s["p99_ms"], s["p99_ms"] <= 50)
    for size in sizes:
        p = _pt(doc, size, "grpc", "pair", 4)
        if p:
            add(f"capture+admission pairs/s, 4 gRPC clients, {size:,} records", ">= 300", p["throughput_per_s"],
                p["throughput_per_s"] >= 300)
    if big:
        prof = doc["sizes"][str(big)].get("profile", {})
        for op, b in prof.items():
            share = b["share"].get("policy", 0.0)
            add(f"policy share of call time: {op} ({big:,})", "<= 15%", f"{share * 100:.1f}%", share <= 0.15)
    for size, want in ((10_000, 3.0), (100_000, 10.0)):
        peer = _peer(doc, size, "search_nodes")
        for surface in ("mcp", "grpc"):
            e = _pt(doc, size, surface, "search_lexical")
            if peer and e:
                r = _ratio(peer["p50_ms"], e["p50_ms"])
                add(f"search vs peer at {size:,} items, p50 ratio (Engram {surface.upper()} vs peer MCP)",
                    f">= {want:g}x", r, r is not None and r >= want)
    peer_w = _peer(doc, 10_000, "write_create_entities")
    for surface in ("mcp", "grpc"):
        e = _pt(doc, 10_000, surface, "pair")
        if peer_w and e:
            add(f"capture+admission pair p50 vs one peer write at 10k ({surface.upper()})",
                f"<= {peer_w['p50_ms']} ms", e["p50_ms"], e["p50_ms"] <= peer_w["p50_ms"])
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}" if v >= 100 else f"{v:.2f}"
    return str(v)


def latency_table(doc: dict[str, Any], surface: str) -> str:
    rows = ["| records | op | clients | p50 ms | p95 ms | p99 ms | ops/s | p50 spread (min–max over runs) | n | errors |",
            "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    order = ["capture", "request_admission", "pair", "search_lexical", "search_semantic", "get", "forget"]
    for size, res in doc.get("sizes", {}).items():
        ops = res.get(surface, {})
        for op in order:
            for c, pt in sorted(ops.get(op, {}).items(), key=lambda kv: int(kv[0])):
                rows.append(f"| {int(size):,} | {op} | {c} | {_fmt(pt.get('p50_ms'))} | {_fmt(pt.get('p95_ms'))} | "
                            f"{_fmt(pt.get('p99_ms'))} | {_fmt(pt.get('throughput_per_s'))} | "
                            f"{_fmt(pt.get('p50_ms_min'))}–{_fmt(pt.get('p50_ms_max'))} | {pt['n']} | {pt['errors']} |")
    return "\n".join(rows)


def peer_table(doc: dict[str, Any]) -> str:
    rows = ["| items | peer op | peer p50 ms | peer p99 ms | Engram op | Engram MCP p50 ms | ratio MCP | "
            "Engram gRPC p50 ms | ratio gRPC |", "|---:|---|---:|---:|---|---:|---:|---:|---:|"]
    pairs = [("write_create_entities", "pair"), ("write_add_observations", "pair"), ("search_nodes", "search_lexical")]
    for size in doc.get("peer", {}).get("sizes", {}):
        for pop, eop in pairs:
            p = _peer(doc, size, pop)
            m, g = _pt(doc, size, "mcp", eop), _pt(doc, size, "grpc", eop)
            if not p:
                continue
            rows.append(f"| {int(size):,} | {pop} | {_fmt(p['p50_ms'])} | {_fmt(p['p99_ms'])} | {eop} | "
                        f"{_fmt(m and m['p50_ms'])} | {_fmt(_ratio(p['p50_ms'], m and m['p50_ms']))} | "
                        f"{_fmt(g and g['p50_ms'])} | {_fmt(_ratio(p['p50_ms'], g and g['p50_ms']))} |")
    return "\n".join(rows)


def profile_table(doc: dict[str, Any]) -> str:
    cats = ["validation", "policy", "crypto", "fsync", "duckdb", "ranking", "embedding", "serialization", "other"]
    rows = ["| records | op | ms/call (profiled) | " + " | ".join(cats) + " |",
            "|---:|---|---:|" + "---:|" * len(cats)]
    for size, res in doc.get("sizes", {}).items():
        for op, b in res.get("profile", {}).items():
            rows.append(f"| {int(size):,} | {op} | {_fmt(b['ms_per_call'])} | "
                        + " | ".join(f"{b['share'].get(c, 0) * 100:.0f}%" for c in cats) + " |")
    return "\n".join(rows)


def targets_table(doc: dict[str, Any]) -> str:
    rows = ["| target | wanted | measured | met |", "|---|---|---|---|"]
    for t in doc.get("targets", []):
        rows.append(f"| {t['target']} | {t['wanted']} | {_fmt(t['measured'])} | "
                    f"{'yes' if t['met'] else 'no' if t['met'] is False else '–'} |")
    return "\n".join(rows)


def machine_table(doc: dict[str, Any]) -> str:
    m = doc.get("machine", {})
    rows = ["| fact | value |", "|---|---|"]
    for k in ("cpu_model", "logical_cores", "usable_cores", "memory_gib", "os", "python", "duckdb", "grpcio", "node",
              "loadavg_at_start", "loadavg_at_end"):
        rows.append(f"| {k} | {m.get(k)} |")
    for size, res in doc.get("sizes", {}).items():
        ld = res.get("load", {})
        rows.append(f"| {int(size):,} records: git, load avg after, loaded in | {res.get('git', doc.get('git'))}, "
                    f"{res.get('loadavg_after')}, {ld.get('seconds')} s ({ld.get('records_total'):,} records in "
                    f"{ld.get('scopes')} scopes, vectors: {ld.get('vectors')}) |")
    if "peer" in doc:
        rows.append(f"| peer | {doc['peer'].get('package')} {doc['peer'].get('version')} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    doc = json.loads(open(argv[0], encoding="utf-8").read())
    doc.setdefault("targets", targets(doc))
    print("## Machine\n\n" + machine_table(doc))
    print("\n## Targets\n\n" + targets_table(doc))
    print("\n## gRPC\n\n" + latency_table(doc, "grpc"))
    print("\n## MCP (stdio)\n\n" + latency_table(doc, "mcp"))
    print("\n## Peer\n\n" + peer_table(doc))
    print("\n## Profile (share of self time)\n\n" + profile_table(doc))
    if "scanner" in doc:
        from tools.bench.scanner import table

        print("\n## Secret scanner (one text per shape; wall and CPU ms)\n\n" + table(doc["scanner"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
