"""Property-based fuzzing of the closed schemas against the validator, the gRPC
surface and the MCP surface (`engram mcp` over stdio, SDK client, envelopes or the
contract's protocol errors only; bounded memory and latency) (issue 7 item 3).

Cases: a pool of examples per tool drawn from its input schema (``schema_values``:
valid, and mutated by hypothesis with ``reliability_support.mutated``), each run once
as drawn, then pool examples with 1–3 cheap seeded hostile mutations
(``reliability_support.mutate``: the same hostile values plus dropped keys, wrong
types, string and number edits). Drawing a capture example costs ~15 ms (arrays of at
most ``schema_values.MAX_ITEMS`` items: the size bounds are the mutations' part), a
derived case microseconds, which is what makes ENGRAM_SOAK=1 (≥100k cases on the
validator and gRPC surfaces) feasible.
ENGRAM_SOAK_SEED=S reproduces a run (the seed is printed with -s);
ENGRAM_FUZZ_CASES=N overrides the number of cases per surface."""

from __future__ import annotations

import gc
import json
import os
import random
import time
import tracemalloc
import unicodedata
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from engram_core.api import memory_pb2, memory_pb2_grpc
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.operation import operation_digest, target_of
from engram_core.contract.schemas import INPUT_SCHEMAS
from engram_core.contract.validation import validate_arguments
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import (
    CONFIRMATION_METADATA_KEY,
    CONTEXT_METADATA_KEY,
    make_context,
    make_grant,
)
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.core_engines import EngineStores, one
from tests.support.reliability_support import SOAK, deep, derive_cases, draw_pool, mutated, scaled
from tests.support.schema_values import arguments

PURPOSE = "purpose:fuzz"
SCHEMA_CODES = {Code.INVALID_SCHEMA, Code.INVALID_DIGEST}
GRPC = {
    "engram_memory_search": (memory_pb2.SearchRequest, "Search"),
    "engram_memory_get": (memory_pb2.GetRequest, "Get"),
    "engram_memory_capture": (memory_pb2.CaptureRequest, "Capture"),
    "engram_memory_request_admission": (memory_pb2.RequestAdmissionRequest, "RequestAdmission"),
    "engram_memory_withdraw": (memory_pb2.WithdrawRequest, "Withdraw"),
    "engram_memory_forget": (memory_pb2.ForgetRequest, "Forget"),
}
SEED = int(os.environ.get("ENGRAM_SOAK_SEED") or (random.SystemRandom().randrange(2**31) if SOAK else 20261207))
_CASES = int(os.environ.get("ENGRAM_FUZZ_CASES", 0))
# examples drawn by hypothesis per tool; capture examples are the expensive ones
POOL = {tool: scaled(25, 1000 if tool == "engram_memory_capture" else 2000) for tool in INPUT_SCHEMAS}
CASES = {
    "validator": _CASES or scaled(300, 100_000),
    "grpc": _CASES or scaled(150, 100_000),
    # one MCP case is a stdio round trip through `engram mcp` and the core (~40 ms with the
    # fuzzer's payloads and tracemalloc on): 100k would take over an hour on 2 cores
    "mcp": _CASES or scaled(25, 25_000),
}
RAW_CASES = scaled(200, 20_000)
pytestmark = pytest.mark.timeout(3600 if SOAK or _CASES else 300)
LATENCY_S = {"validator": 1.0, "grpc": 10.0, "mcp": 10.0}
MEMORY_BOUND = 64 * 1024 * 1024
MEMORY_EVERY = max(5, CASES["mcp"] // 100)  # cases between two readings of the traced memory


# -- requests ------------------------------------------------------------------------------------------

def _with_purpose(args: dict[str, Any]) -> dict[str, Any]:
    """Bind most generated requests to the context's purpose so they reach the deeper checks."""
    if "purpose_ref" in args:
        args = {**args, "purpose_ref": PURPOSE}
    if isinstance(args.get("payload"), dict) and "purpose_ref" in args["payload"]:
        args = {**args, "payload": {**args["payload"], "purpose_ref": PURPOSE}}
    return args


def _nfc(value: Any) -> Any:
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, dict):
        return {k: _nfc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nfc(v) for v in value]
    return value


# Payload times a capture keeps as drawn: from the policy's default floor (1971-01-01) to
# 2026-01-01, before any run's now; others are mapped into it.
_IN_WINDOW = (31_536_000_000, 1_767_225_600_000)


def _in_window(t: int) -> int:
    if _IN_WINDOW[0] <= t <= _IN_WINDOW[1]:
        return t
    return _IN_WINDOW[0] + t % (_IN_WINDOW[1] - _IN_WINDOW[0])


def _resolved(args: dict[str, Any]) -> dict[str, Any]:
    """A schema-valid capture made to pass the checks JSON Schema cannot express (cross-references
    resolve, ids unique, t_end ≥ t, real instants, sorted family refs), so valid captures reach the
    store instead of all failing on INVALID_SCHEMA (no schema-driven generator draws such a one)."""
    payload = dict(args["payload"])
    citations = list({c["citation_id"]: c for c in payload["citations"]}.values())
    citations = [{**c, "observed_at": "2026-11-30T12:00:00.000Z"} if "observed_at" in c else c for c in citations]
    known = [c["citation_id"] for c in citations]
    components = []
    for comp in {c["component_id"]: c for c in payload["components"]}.values():
        cids = [cid for cid in comp["citation_ids"] if cid in known] or known[:1]
        components.append({**comp, "citation_ids": cids})
    primary = components[0]
    payload.update(citations=citations, components=components, primary_component_id=primary["component_id"],
                   primary_event={**payload["primary_event"], "citation_id": primary["citation_ids"][0]})
    vt = payload["valid_time"]
    # Drawn integers are almost never inside the host's payload-time window (the capture
    # policy's floor and horizon), and a capture refused there never reaches the store.
    # Out-of-window times still arrive through the hostile mutations of these cases.
    t = _in_window(vt["t"])
    if t != vt["t"]:
        span = abs(vt.get("t_end", vt["t"]) - vt["t"]) % 86_400_000
        vt = {**vt, "t": t, **({"t_end": t + span} if "t_end" in vt else {})}
        payload["valid_time"] = vt
    if vt.get("t_end", vt["t"]) < vt["t"]:
        payload["valid_time"] = {**vt, "t_end": vt["t"]}
    payload["primary_event"] = {**payload["primary_event"], "at": _in_window(payload["primary_event"]["at"])}
    if "expires_at" in payload.get("retention", {}):
        # A week from now: inside any tenant's expiry cap the policies set (2099 was beyond them).
        week = time.gmtime(time.time() + 7 * 86_400)
        payload["retention"] = {**payload["retention"], "expires_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", week)}
    if "reconciliation" in payload:
        refs = payload["reconciliation"]["family_refs"]
        if refs:  # families the host never consented to: refused by policy before the store
            del payload["reconciliation"]
        else:
            payload["reconciliation"] = {"family_refs": []}
    evidence = {**args["evidence"], "citation_ids": [c for c in args["evidence"]["citation_ids"] if c in known]
                or known[:1]}
    return {**args, "payload": payload, "evidence": evidence}


def _prepared(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    args = _nfc(_with_purpose(args))
    if tool == "engram_memory_capture":
        args = _resolved(args)
    if len(args.get("idempotency_key", "x" * 16).encode()) < 16:
        args = {**args, "idempotency_key": args["idempotency_key"] + "-padded-to-16-bytes"}
    return args


def _tool_strategy(tool: str) -> st.SearchStrategy[Any]:
    base = arguments(tool).map(lambda a, t=tool: _prepared(t, a))
    return st.one_of(base, mutated(base))


def _fresh(tool: str, args: Any, n: int) -> Any:
    """Every other re-used valid example gets a fresh idempotency key (a new effect, not a replay)."""
    if n % 2 and isinstance(args, dict) and isinstance(args.get("idempotency_key"), str):
        return {**args, "idempotency_key": f"fuzz-fresh-{SEED}-{n:012d}"}
    return args


class KnownIds:
    """Ids the surface really handed out (captured candidates, admitted records). Half of the
    admission/withdraw/get/forget cases get one of them instead of the drawn id, so the fuzzing
    reaches real admissions, withdrawals, reads and forgets, not only NOT_FOUND."""

    FIELD = {"engram_memory_request_admission": "candidate_id", "engram_memory_withdraw": "candidate_id",
             "engram_memory_get": "record_id", "engram_memory_forget": "record_id"}

    def __init__(self, surface: str) -> None:
        self.rng = random.Random(f"{SEED}-{surface}-ids")
        self.ids: dict[str, list[str]] = {"candidate_id": [], "record_id": []}

    def substitute(self, tool: str, args: Any) -> Any:
        field = self.FIELD.get(tool)
        known = self.ids.get(field or "")
        if known and isinstance(args, dict) and field in args and self.rng.random() < 0.5:
            return {**args, field: self.rng.choice(known)}
        return args

    def learn(self, value: dict[str, Any]) -> None:
        outcome = value.get("outcome", value)
        for field in ("candidate_id", "record_id"):
            if isinstance(outcome.get(field), str):
                self.ids[field] = [*self.ids[field][-63:], outcome[field]]


@pytest.fixture(scope="module")
def pool() -> dict[str, list[Any]]:
    started = time.perf_counter()
    drawn = {tool: draw_pool(_tool_strategy(tool), POOL[tool], SEED + i) for i, tool in enumerate(sorted(INPUT_SCHEMAS))}
    sizes = ", ".join(f"{tool.removeprefix('engram_memory_')} {len(v)}" for tool, v in drawn.items())
    print(f"\nfuzz seed {SEED}; schema pool: {sizes} ({time.perf_counter() - started:.0f} s)")
    return drawn


def _valid(tool: str, args: Any) -> bool:
    try:
        validate_arguments(tool, args)
        return True
    except EngramError:
        return False


class Tally:
    """What one surface saw: cases sent, cases the client could not express, answers."""

    def __init__(self, surface: str) -> None:
        self.surface, self.started = surface, time.perf_counter()
        self.sent = self.unsendable = self.valid = self.drawn = 0
        self.codes: Counter[str] = Counter()
        self.by_tool: Counter[tuple[str, str]] = Counter()
        self.slowest = 0.0
        self.slowest_case = ""
        self.progress_every = 0

    def cases(self, pool: dict[str, list[Any]], target: int) -> Iterator[tuple[str, Any, str]]:
        self.progress_every = target // 10 if target >= 10_000 else 0
        for tool, args, origin in derive_cases(pool, random.Random(f"{SEED}-{self.surface}"), _fresh):
            if self.sent >= target:
                return
            assert self.unsendable <= 4 * target + 1000, "almost nothing the client can express"
            yield tool, args, origin

    def record(self, tool: str, code: str, valid: bool, origin: str, elapsed: float) -> None:
        self.sent += 1
        self.by_tool[(tool.removeprefix("engram_memory_"), code)] += 1
        self.valid += valid
        self.drawn += origin == "drawn"
        self.codes[code] += 1
        if elapsed > self.slowest:
            self.slowest, self.slowest_case = elapsed, f"{tool.removeprefix('engram_memory_')} {origin} {code}"
        assert elapsed < LATENCY_S[self.surface], (self.surface, tool, origin, code, elapsed)
        if self.progress_every and self.sent % self.progress_every == 0:
            print(f"\n  fuzz {self.surface}: {self.sent} sent, {time.perf_counter() - self.started:.0f} s", flush=True)

    def report(self, extra: str = "") -> None:
        took = time.perf_counter() - self.started
        print(f"\nfuzz {self.surface}: {self.sent} cases sent ({self.drawn} as drawn, {self.sent - self.drawn} "
              f"with cheap mutations; {self.valid} valid, {self.sent - self.valid} invalid), {self.unsendable} not "
              f"expressible by the client (not sent); answers {dict(self.codes.most_common())}; slowest "
              f"{self.slowest:.3f} s ({self.slowest_case}); {took:.0f} s ({self.sent / took:.0f} cases/s){extra}")
        for tool in sorted({t for t, _ in self.by_tool}):
            answers = {code: n for (t, code), n in self.by_tool.most_common() if t == tool}
            print(f"  {tool}: {answers}")


# -- the validator ---------------------------------------------------------------------------------------

def _validated(tool: str, args: Any) -> tuple[str, float]:
    """The validator's answer to ``args`` and the CPU time it took this thread."""
    started = time.thread_time()
    try:
        validate_arguments(tool, args)
        code = "ok"
    except EngramError as exc:
        assert exc.code in SCHEMA_CODES, (tool, exc)
        code = exc.code.value
    return code, time.thread_time() - started


def test_validator_is_total_and_precise(pool) -> None:
    tally = Tally("validator")
    for tool, args, origin in tally.cases(pool, CASES["validator"]):
        # This thread's CPU time, not the wall clock: the bound is on the validator's work, which
        # other processes on a loaded machine do not change (wall time does), or change less. The
        # slowest cases are refusals of large nested lists (0.1-0.2 s since the explainer sees
        # lists cut where the schema bounds them, validation._pruned).
        code, took = _validated(tool, args)
        if took >= LATENCY_S["validator"]:
            # Validating is deterministic: a case over the bound is timed again, and only the
            # validator's own work counts (the lesser time). A case of 0.1-0.2 s in a process of
            # its own once measured over 1 s here, with this process's heap and the machine's other
            # work on the same cores; a case really that slow is that slow twice.
            code, again = _validated(tool, args)
            took = min(took, again)
        tally.record(tool, code, code == "ok", origin, took)
    tally.report()
    assert tally.codes["ok"] > 0 and tally.codes["INVALID_SCHEMA"] > 0, tally.codes


# -- the gRPC surface ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_core(module_stores: EngineStores, tmp_path_factory):
    running = module_stores.start_core(tmp_path_factory.mktemp("fuzz"))
    from tests.support.core_support_fuzz import activate_scope

    activate_scope(running)
    yield running
    running.stop()


COUNTED = ("candidates", "journal", "idempotency", "records")
_COUNT_SQL = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in COUNTED)


def _counts(core) -> tuple[int, ...]:
    with core.core.store.read() as tx:
        return tuple(one(tx, _COUNT_SQL))


class StoresNothing:
    """Row counts around invalid requests. Consecutive invalid requests share a reading: the
    count after one is the count before the next (nothing else writes to the fuzz core)."""

    def __init__(self, core) -> None:
        self.core, self.known = core, None

    def before(self, valid: bool) -> None:
        if valid:
            self.known = None
        elif self.known is None:
            self.known = _counts(self.core)

    def after(self, valid: bool, case: Any) -> None:
        if not valid:
            assert _counts(self.core) == self.known, case


CONFIRMED = ("engram_memory_withdraw", "engram_memory_forget")


def _grant(key, tool: str, args: dict[str, Any]) -> bytes:
    """A host confirmation bound to this exact request, so gated calls reach the lifecycle checks."""
    scope = {"tenant": "fuzz", "workspace": "w", "principal": "user:fuzz"}
    return make_grant(key, **scope, tool=tool, target=target_of(tool, args),
                      operation_digest=operation_digest(tool=tool, **scope, arguments=args),
                      approved_at_ms=time.time_ns() // 1_000_000)


def test_grpc_surface_never_internal(fuzz_core, pool) -> None:
    key = load_private_key_file(fuzz_core.host_key_path)
    channel = grpc.insecure_channel(fuzz_core.address)
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    tally = Tally("grpc")
    nothing = StoresNothing(fuzz_core)
    ids = KnownIds("grpc")
    for tool, args, origin in tally.cases(pool, CASES["grpc"]):
        args = ids.substitute(tool, args)
        cls, method = GRPC[tool]
        try:
            request = value_to_message(args, cls())
        except Exception:
            tally.unsendable += 1  # not expressible in protobuf (wrong types, surrogates, extra keys, ...)
            continue
        # what the core receives is the message: a null reads as an absent field, "12" as 12
        sent = message_to_value(request)
        valid = _valid(tool, sent)
        nothing.before(valid)
        metadata = [(CONTEXT_METADATA_KEY, make_context(key, call=tool, tenant="fuzz", workspace="w",
                                                        principal="user:fuzz",
                                                        purpose_ref=PURPOSE, now_ms=time.time_ns() // 1_000_000))]
        if valid and tool in CONFIRMED:
            metadata.append((CONFIRMATION_METADATA_KEY, _grant(key, tool, sent)))  # the human said yes
        started = time.perf_counter()
        try:
            ids.learn(message_to_value(getattr(stub, method)(request, metadata=metadata, timeout=10)))
            code = "ok"
        except grpc.RpcError as err:
            assert err.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (tool, err.details())
            code = code_from_rpc_error(err).value
            assert code != Code.MUTATION_OUTCOME_UNKNOWN.value, (tool, err.details())
        elapsed = time.perf_counter() - started
        if not valid:
            assert code in {c.value for c in SCHEMA_CODES} | {Code.TRUSTED_CONTEXT_UNAVAILABLE.value}, (tool, code)
        else:  # precise: what the closed schema accepts is never refused as malformed
            assert code not in {c.value for c in SCHEMA_CODES}, (tool, code, sent)
        nothing.after(valid, (tool, code))
        tally.record(tool, code, valid, origin, elapsed)
    channel.close()
    tally.report()
    assert tally.codes["INVALID_SCHEMA"] > 0 and tally.codes["ok"] > 0, tally.codes
    # Valid captures must reach the store, or admissions, withdrawals and forgets never get a real
    # id (wave 3's payload-time window once refused every drawn capture, and nothing said so).
    assert tally.by_tool[("capture", "ok")] > 0, dict(tally.by_tool)


def test_raw_garbage_bytes_never_internal(fuzz_core) -> None:
    key = load_private_key_file(fuzz_core.host_key_path)
    channel = grpc.insecure_channel(fuzz_core.address)
    codes: Counter[str] = Counter()
    started = time.perf_counter()

    @settings(deadline=None, suppress_health_check=list(HealthCheck), database=None, max_examples=RAW_CASES)
    @seed(SEED)
    @given(st.sampled_from(sorted(GRPC)), st.binary(max_size=512))
    def run(tool: str, raw: bytes) -> None:
        call = channel.unary_unary(f"/engram.v1.MemoryService/{GRPC[tool][1]}")
        ctx = make_context(key, call=tool, tenant="fuzz", workspace="w", principal="user:fuzz", purpose_ref=PURPOSE,
                           now_ms=time.time_ns() // 1_000_000)
        try:
            call(raw, metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=10)
            codes["ok"] += 1
        except grpc.RpcError as err:
            assert err.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), err.details()
            codes[err.code().name] += 1

    run()
    channel.close()
    print(f"\nfuzz raw bytes: {sum(codes.values())} cases; gRPC status {dict(codes.most_common())}; "
          f"{time.perf_counter() - started:.0f} s")


class TracedMemory:
    """Python memory of this process (the in-process core, the gRPC server, the SDK client) traced
    with tracemalloc and read at quiet points (between cases, after a collection), so a case's own
    transient payload (up to ~2 MB of JSON, tens of MB as objects) is not mistaken for growth.

    The objects alive before tracing starts are frozen (``gc.freeze``): a reading's collection then
    walks only what was allocated since, which is all tracemalloc counts, instead of the whole
    heap of cores, engines and libraries (0.1-0.4 s a reading, a quarter of the MCP loop)."""

    def __init__(self) -> None:
        gc.collect()  # garbage from before must not be frozen with the rest
        gc.freeze()
        tracemalloc.start()
        self.readings: list[int] = []

    def check(self) -> None:
        gc.collect()
        self.readings.append(tracemalloc.get_traced_memory()[0])
        growth = self.readings[-1] - self.readings[0]
        if growth >= MEMORY_BOUND:
            top = tracemalloc.take_snapshot().statistics("lineno")[:15]
            pytest.fail(f"traced memory grew {growth / 2**20:.1f} MiB: " + "\n".join(map(str, top)))

    def stop(self) -> None:
        self.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        gc.unfreeze()

    def __str__(self) -> str:
        first, last = self.readings[0], self.readings[-1]
        return (f"traced memory {first / 2**20:.1f} -> {last / 2**20:.1f} MiB between cases (max "
                f"{max(self.readings) / 2**20:.1f}), peak within a case {self.peak / 2**20:.1f} MiB")


# -- MCP surface: `engram mcp` over stdio, driven by the SDK's client ---------------------------------
MCP_PROTOCOL_ERRORS = {-32602, -32603, -32600}
UNSENDABLE = object()


def _as_sent(tool: str, args: Any) -> Any:
    """The arguments as the SDK client puts them on the wire (its own pydantic dump: inf/NaN
    become null, null arguments are left out), or UNSENDABLE if it cannot send them at all (not
    an object, lone surrogates, nesting past pydantic's serialization depth)."""
    import mcp_types
    from pydantic_core import PydanticSerializationError

    try:
        params = mcp_types.CallToolRequestParams(name=tool, arguments=args).model_dump(
            by_alias=True, mode="json", exclude_none=True)
        json.dumps(params, ensure_ascii=False).encode("utf-8")
        # What the client's stdio writer then does with the whole JSON-RPC message: its wrapper
        # adds levels, so arguments nested 252-254 deep pass the line above and fail here (a
        # soak run's seed drew one; the writer task died and closed the session).
        mcp_types.JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/call", params=params).model_dump_json(
            by_alias=True, exclude_unset=True)
        return params.get("arguments")
    except (ValueError, TypeError, PydanticSerializationError):  # pydantic's ValidationError is a ValueError
        return UNSENDABLE


def _adapter_pids() -> list[int]:
    """The `engram mcp` subprocesses of this test process serving the fuzz session's config
    (Linux /proc): adapters other test modules of the same process started are not this one."""
    pids = []
    for children in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"mcp" in cmdline and b"fuzz.toml" in cmdline:
                    pids.append(int(pid))
            except OSError:
                pass
    return pids


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(scope="module")
def mcp_session(fuzz_core, tmp_path_factory):
    from anyio.from_thread import start_blocking_portal

    from tests.support.core_support_fuzz import activate_scope
    from tests.support.mcp_helpers import Core, binding_for, stdio_client, write_config

    activate_scope(fuzz_core, "fuzzmcp", "ws-main")
    config = write_config(tmp_path_factory.mktemp("mcpcfg") / "fuzz.toml", address=fuzz_core.address,
                          signing_key=Core(fuzz_core.address, fuzz_core.host_key_path).host_key_path,
                          binding=binding_for("fuzzmcp", purpose=PURPOSE))
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(stdio_client(config)) as client:
        yield portal, client


def test_mcp_surface_answers_envelopes_or_protocol_errors(fuzz_core, mcp_session, pool) -> None:
    from mcp.shared.exceptions import MCPError

    from tests.support.mcp_helpers import envelope_of

    portal, client = mcp_session
    tally = Tally("mcp")
    nothing = StoresNothing(fuzz_core)
    adapters = _adapter_pids()
    assert len(adapters) == 1, adapters
    adapter_rss = [_rss(adapters[0])]
    memory = TracedMemory()
    ids = KnownIds("mcp")
    try:
        for tool, args, origin in tally.cases(pool, CASES["mcp"]):
            sent = _as_sent(tool, ids.substitute(tool, args))
            if sent is UNSENDABLE:
                tally.unsendable += 1
                continue
            valid = _valid(tool, sent)
            nothing.before(valid)
            started, result = time.perf_counter(), None
            try:
                result = portal.call(client.call_tool, tool, sent, LATENCY_S["mcp"] * 3)
            except MCPError as err:
                assert err.code in MCP_PROTOCOL_ERRORS, (tool, origin, err.code, err.message)
                code = f"jsonrpc{err.code}"
            else:
                env = envelope_of(result)
                code = "ok" if env["ok"] else env["error"]["code"]
                assert code not in (Code.MUTATION_OUTCOME_UNKNOWN.value, Code.STORE_UNAVAILABLE.value), env
                if env["ok"]:
                    ids.learn(env["output"]["value"])
                if not valid:
                    assert code in {c.value for c in SCHEMA_CODES}, (tool, env)
                else:  # precise: what the closed schema accepts is never refused as malformed
                    assert code not in {c.value for c in SCHEMA_CODES}, (tool, env, sent)
            elapsed = time.perf_counter() - started
            nothing.after(valid, (tool, code))
            tally.record(tool, code, valid, origin, elapsed)
            if tally.sent % MEMORY_EVERY == 0:
                del args, sent, result
                memory.check()
                adapter_rss.append(_rss(adapters[0]))
        memory.check()
    finally:
        memory.stop()
    adapter_rss.append(_rss(adapters[0]))
    tally.report(f"; {memory}; adapter RSS {adapter_rss[0] / 2**20:.0f} -> {max(adapter_rss) / 2**20:.0f} MiB (peak)")
    assert tally.codes["INVALID_SCHEMA"] > 0, tally.codes
    assert max(adapter_rss) - adapter_rss[0] < 256 * 2**20, adapter_rss  # the adapter process stays bounded too


def test_mcp_deeply_nested_arguments_get_an_envelope(mcp_session) -> None:
    """Regression (found by this fuzzing): arguments nested past the SDK stdio transport's JSON
    parser limit (200 levels; the SDK client sends up to ~254) were dropped without an answer, so
    the client waited forever. They are malformed arguments: an INVALID_SCHEMA envelope (SPEC §3)."""
    from tests.support.mcp_helpers import envelope_of

    portal, client = mcp_session
    for depth in (150, 199, 200, 250):
        args = {"query": "x", "purpose_ref": PURPOSE, "unexpected_field": deep(depth)}
        result = portal.call(client.call_tool, "engram_memory_search", args, 20)
        assert envelope_of(result)["error"]["code"] == "INVALID_SCHEMA", depth


def test_arguments_the_sdk_clients_writer_cannot_serialize_are_not_sent() -> None:
    """Regression (a soak run's seed): arguments nested 254 deep passed the check of the call's
    params but not the client's own dump of the whole JSON-RPC message; sent anyway, they killed
    the client's writer task and closed the session for every later case."""
    assert _as_sent("engram_memory_search", {"query": "x", "unexpected_field": deep(250)}) is not UNSENDABLE
    assert _as_sent("engram_memory_search", {"query": "x", "unexpected_field": deep(254)}) is UNSENDABLE


def test_empty_family_refs_are_not_malformed(fuzz_core, mcp_session) -> None:
    """Regression (found by this fuzzing): `"reconciliation": {"family_refs": []}` is schema-valid,
    but the empty list did not survive protobuf (proto3 cannot tell it from an absent field), so
    the core answered INVALID_SCHEMA on both surfaces."""
    from tests.support.core_support import Client, capture_args
    from tests.support.mcp_helpers import envelope_of

    args = capture_args("Empty family refs are a valid reconciliation.", purpose_ref=PURPOSE,
                        reconciliation={"family_refs": []})
    validate_arguments("engram_memory_capture", args)
    client = Client(fuzz_core, tenant="fuzz", workspace="w", purpose_ref=PURPOSE)
    assert client.call("capture", args)["status"] == "committed_pending"
    portal, mcp = mcp_session
    result = portal.call(mcp.call_tool, "engram_memory_capture", args, 20)
    assert envelope_of(result)["output"]["value"]["status"] == "committed_pending"
