"""Where the time goes: cProfile over the servicer's per-call steps, in-process.

Each call does what ``MemoryServicer._call`` does (verify the signed context,
proto -> JSON, the service operation, JSON -> proto) minus the gRPC transport,
so self time can be attributed by module to: validation, policy decisions,
crypto (context/grant signatures, key unwrap, AES-GCM), DuckDB, fsync,
ranking/tokenizing, embedding (semantic), serialization (proto conversion,
canonical JSON and digests) and everything else.
"""

from __future__ import annotations

import cProfile
import pstats
import random
from pathlib import Path
from typing import Any

from engram_core.api import memory_pb2
from engram_core.app.composition import open_core
from engram_core.contract.tools import FORGET_TOOL
from engram_core.rpc.convert import message_of, message_to_value, value_to_message
from engram_core.services.memory import MemoryService
from engram_core.trust.hostctx import verify_context
from tools.bench.corpus import Corpus
from tools.bench.grpc_client import GrpcAgent

CATEGORIES = [
    ("validation", ("engram_core/contract/validation.py", "engram_core/contract/schemas.py", "fastjsonschema", "secrets_scan.py",
                    "<fastjsonschema")),
    ("policy", ("engram_core/policy/", "opa_bindings")),
    ("crypto", ("engram_core/crypto/", "cryptography", "hostctx.py", "hostkeys.py", "sealing.py")),
    ("fsync", ("fdatasync", "fsync")),
    ("duckdb", ("duckdb",)),
    ("embedding", ("embedding.py", "onnxruntime", "tokenizers", "numpy")),
    ("ranking", ("ranking.py", "reading.py", "lexical.py", "paging.py", "unicodedata", "re.py", "findall",
                 "blake2b")),
    ("serialization", ("rpc/convert.py", "protobuf", "google/", "canonical.py", "rfc8785", "json/", "hashlib",
                       "sha256", "base64")),
]


def category(func: tuple[str, int, str]) -> str:
    filename, _line, name = func
    where = f"{filename}:{name}"
    for cat, needles in CATEGORIES:
        if any(n in where for n in needles):
            return cat
    return "other"


def breakdown(stats: pstats.Stats, calls: int) -> dict[str, Any]:
    cats: dict[str, float] = {}
    top: list[tuple[float, str]] = []
    total = 0.0
    for func, (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        cats[category(func)] = cats.get(category(func), 0.0) + tt
        total += tt
        top.append((tt, f"{Path(func[0]).name}:{func[1]}({func[2]})"))
    top.sort(reverse=True)
    return {
        "calls": calls,
        "ms_per_call": round(total / calls * 1000, 3),
        "share": {k: round(v / total, 4) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
        "ms_per_call_by_category": {k: round(v / calls * 1000, 3) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
        "top_functions": [{"self_ms_per_call": round(t / calls * 1000, 3), "function": f} for t, f in top[:12]],
    }


def profile(data_dir: Path, *, tenant: str, workspace: str, record_ids: list[str], calls: int,
            semantic: bool, queries: list[str]) -> dict[str, Any]:
    # The channel as served (on when installed: admission embeds); ``semantic`` says whether
    # the loaded records have vectors, i.e. whether semantic search is profiled too.
    core, host_key_path, _ = open_core(data_dir)
    memory = MemoryService(core)
    agent = GrpcAgent("127.0.0.1:1", host_key_path, tenant=tenant, workspace=workspace, principal="agent:bench-prof")
    corpus = Corpus()
    rnd = random.Random(5)
    out: dict[str, Any] = {}
    admitted: list[str] = []
    pending: list[str] = []

    def servicer(op: str, args: dict[str, Any], cls: Any, response_cls: Any, gated: bool, grant: bytes | None = None):
        ctx = verify_context(agent.context("engram_memory_" + op), core.trusted, now_ms=core.now_ms())
        request = value_to_message(args, cls())  # the client's serialization, counted once
        value = message_to_value(request)
        fn = getattr(memory, op)
        result = fn(ctx, value, grant) if gated else fn(ctx, value)
        return message_to_value(message_of(result, response_cls))  # as MemoryServicer answers, and the client reads

    def grant_for(op_tool: str, args: dict[str, Any]) -> bytes:
        from engram_core.contract.operation import operation_digest
        from engram_core.trust.hostctx import make_grant
        from tools.bench.grpc_client import now_ms

        return make_grant(agent.key, tenant=tenant, workspace=workspace, principal=agent.principal, tool=op_tool,
                          target=args["record_id"], operation_digest=operation_digest(
                              tool=op_tool, tenant=tenant, workspace=workspace, principal=agent.principal,
                              arguments=args), approved_at_ms=now_ms())

    seq = iter(range(10**9))

    def capture() -> None:
        r = servicer("capture", corpus.capture_args(f"{tenant}.{workspace}.prof", next(seq)),
                     memory_pb2.CaptureRequest, memory_pb2.CaptureResponse, True)
        pending.append(r["candidate_id"])

    def admission() -> None:
        cid = pending.pop()
        r = servicer("request_admission", {"candidate_id": cid, "idempotency_key": f"bench-adm-{cid}"},
                     memory_pb2.RequestAdmissionRequest, memory_pb2.RequestAdmissionResponse, True)
        admitted.append(r["outcome"]["record_id"])

    def search(sem: bool):
        def go() -> None:
            args: dict[str, Any] = {"query": rnd.choice(queries), "purpose_ref": "purpose:engineering-notes"}
            if sem:
                args["capability_policy"] = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
            servicer("search", args, memory_pb2.SearchRequest, memory_pb2.SearchResponse, False)
        return go

    def get() -> None:
        servicer("get", {"record_id": rnd.choice(record_ids), "purpose_ref": "purpose:engineering-notes"},
                 memory_pb2.GetRequest, memory_pb2.GetResponse, False)

    def forget() -> None:
        rid = admitted.pop()
        args = {"record_id": rid, "idempotency_key": f"bench-fgt-{rid}"[:200], "reason_ref": "reason:bench"}
        servicer("forget", args, memory_pb2.ForgetRequest, memory_pb2.ForgetResponse, True,
                 grant_for(FORGET_TOOL, args))

    plan = [("capture", capture, calls * 2), ("request_admission", admission, calls * 2),
            ("search_lexical", search(False), calls)]
    if semantic and core.embedder is not None:
        plan.append(("search_semantic", search(True), calls))
    plan += [("get", get, calls), ("forget", forget, min(calls, 20))]
    try:
        for name, fn, n in plan:
            for _ in range(3):  # warm-up, not profiled
                fn()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(n):
                fn()
            prof.disable()
            out[name] = breakdown(pstats.Stats(prof), n)
    finally:
        agent.close()
        core.close()
    return out
