"""Property-based fuzzing of the closed schemas against the validator, the gRPC
surface and the MCP surface (`engram mcp` over stdio, SDK client, envelopes or the
contract's protocol errors only; bounded memory and latency) (issue 7 item 3).
ENGRAM_SOAK=1 runs ≥100k cases per surface."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from reliability_support import SOAK, mutated, scaled

from engram_core.api import memory_pb2, memory_pb2_grpc
from engram_core.errors import Code, EngramError
from engram_core.hostctx import CONTEXT_METADATA_KEY, make_context
from engram_core.hostkeys import load_private_key_file
from engram_core.rpc.convert import value_to_message
from engram_core.rpc.server import start_core
from engram_core.rpc.status import code_from_rpc_error
from engram_core.schemas import INPUT_SCHEMAS
from engram_core.validation import validate_arguments

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
VALID = {tool: from_schema(schema) for tool, schema in INPUT_SCHEMAS.items()}
TOOLS = st.sampled_from(sorted(INPUT_SCHEMAS))
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=not SOAK, database=None)


def _with_purpose(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Bind most generated requests to the context's purpose so they reach the deeper checks."""
    if isinstance(args, dict):
        if "purpose_ref" in args:
            args = {**args, "purpose_ref": PURPOSE}
        if isinstance(args.get("payload"), dict) and "purpose_ref" in args["payload"]:
            args = {**args, "payload": {**args["payload"], "purpose_ref": PURPOSE}}
    return args


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, Any]:
    tool = draw(TOOLS)
    base = VALID[tool].map(lambda a, t=tool: _with_purpose(t, a))
    args = draw(st.one_of(base, mutated(base)))
    return tool, args


@settings(FUZZ, max_examples=scaled(300, 100_000))
@given(requests())
def test_validator_is_total_and_precise(case: tuple[str, Any]) -> None:
    tool, args = case
    started = time.perf_counter()
    try:
        validate_arguments(tool, args)
    except EngramError as exc:
        assert exc.code in SCHEMA_CODES
    assert time.perf_counter() - started < 1.0


@pytest.fixture(scope="module")
def fuzz_core(tmp_path_factory):
    running = start_core(tmp_path_factory.mktemp("fuzz"))
    from core_support_fuzz import activate_scope

    activate_scope(running)
    yield running
    running.stop()


def _counts(core) -> tuple[int, ...]:
    with core.core.store.read() as tx:
        return tuple(tx._one(f"SELECT count(*) FROM {t}")[0] for t in ("candidates", "journal", "idempotency", "records"))


def test_grpc_surface_never_internal(fuzz_core) -> None:
    key = load_private_key_file(fuzz_core.host_key_path)
    channel = grpc.insecure_channel(fuzz_core.address)
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    seen: dict[str, int] = {}

    @settings(FUZZ, max_examples=scaled(150, 100_000))
    @given(requests())
    def run(case: tuple[str, Any]) -> None:
        tool, args = case
        try:
            validate_arguments(tool, args)
            valid = True
        except EngramError:
            valid = False
        cls, method = GRPC[tool]
        try:
            request = value_to_message(args, cls())
        except Exception:
            return  # not expressible in protobuf (wrong types, nulls, surrogates): the client cannot send it
        before = None if valid else _counts(fuzz_core)
        ctx = make_context(key, tenant="fuzz", workspace="w", principal="user:fuzz", purpose_ref=PURPOSE,
                           now_ms=time.time_ns() // 1_000_000)
        try:
            getattr(stub, method)(request, metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=10)
            code = "ok"
        except grpc.RpcError as err:
            assert err.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), err.details()
            code = code_from_rpc_error(err).value
            assert code != Code.MUTATION_OUTCOME_UNKNOWN.value
        seen[code] = seen.get(code, 0) + 1
        if not valid:
            assert code in {c.value for c in SCHEMA_CODES} | {Code.TRUSTED_CONTEXT_UNAVAILABLE.value}, code
            assert _counts(fuzz_core) == before

    run()
    channel.close()
    assert seen.get("INVALID_SCHEMA", 0) > 0 and len(seen) > 1, seen


def test_raw_garbage_bytes_never_internal(fuzz_core) -> None:
    key = load_private_key_file(fuzz_core.host_key_path)
    channel = grpc.insecure_channel(fuzz_core.address)

    @settings(FUZZ, max_examples=scaled(200, 20_000))
    @given(st.sampled_from(sorted(GRPC)), st.binary(max_size=512))
    def run(tool: str, raw: bytes) -> None:
        call = channel.unary_unary(f"/engram.v1.MemoryService/{GRPC[tool][1]}")
        ctx = make_context(key, tenant="fuzz", workspace="w", principal="user:fuzz", purpose_ref=PURPOSE,
                           now_ms=time.time_ns() // 1_000_000)
        try:
            call(raw, metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=10)
        except grpc.RpcError as err:
            assert err.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), err.details()

    run()
    channel.close()


# -- MCP surface: `engram mcp` over stdio, driven by the SDK's client ---------------------------------
MCP_PROTOCOL_ERRORS = {-32602, -32603, -32600}


@pytest.fixture(scope="module")
def mcp_session(fuzz_core, tmp_path_factory):
    from anyio.from_thread import start_blocking_portal
    from core_support_fuzz import activate_scope
    from mcp_helpers import Core, binding_for, stdio_client, write_config

    activate_scope(fuzz_core, "fuzzmcp", "ws-main")
    config = write_config(tmp_path_factory.mktemp("mcpcfg") / "fuzz.toml", address=fuzz_core.address,
                          signing_key=Core(fuzz_core.address, fuzz_core.host_key_path).host_key_path,
                          binding=binding_for("fuzzmcp", purpose=PURPOSE))
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(stdio_client(config)) as client:
        yield portal, client


def test_mcp_surface_answers_envelopes_or_protocol_errors(fuzz_core, mcp_session) -> None:
    import tracemalloc

    from mcp.shared.exceptions import MCPError
    from mcp_helpers import envelope_of

    portal, client = mcp_session
    seen: dict[str, int] = {}
    tracemalloc.start()
    baseline = None

    @settings(FUZZ, max_examples=scaled(25, 100_000))
    @given(requests())
    def run(case: tuple[str, Any]) -> None:
        nonlocal baseline
        tool, args = case
        try:
            validate_arguments(tool, args)
            valid = True
        except EngramError:
            valid = False
        before = None if valid else _counts(fuzz_core)
        started = time.perf_counter()
        try:
            result = portal.call(client.call_tool, tool, args)
        except MCPError as err:
            assert err.code in MCP_PROTOCOL_ERRORS, (err.code, err.message)
            code = f"jsonrpc{err.code}"
        except (TypeError, ValueError):
            return  # not JSON-expressible (NaN/inf, lone surrogates): the client cannot send it
        else:
            env = envelope_of(result)
            code = "ok" if env["ok"] else env["error"]["code"]
            assert code not in (Code.MUTATION_OUTCOME_UNKNOWN.value, Code.STORE_UNAVAILABLE.value), env
            if not valid:
                assert code in {c.value for c in SCHEMA_CODES}, (tool, env)
        assert time.perf_counter() - started < 10
        if not valid:
            assert _counts(fuzz_core) == before
        seen[code] = seen.get(code, 0) + 1
        current = tracemalloc.get_traced_memory()[0]
        baseline = baseline or current
        assert current - baseline < 64 * 1024 * 1024  # bounded memory in the core under fuzzing

    try:
        run()
    finally:
        tracemalloc.stop()
    assert seen.get("INVALID_SCHEMA", 0) > 0, seen


def test_mcp_deeply_nested_arguments_get_an_envelope(mcp_session) -> None:
    """Regression (found by this fuzzing): arguments nested past the SDK stdio transport's JSON
    parser limit (200 levels; the SDK client sends up to ~254) were dropped without an answer, so
    the client waited forever. They are malformed arguments: an INVALID_SCHEMA envelope (SPEC §3)."""
    from mcp_helpers import envelope_of
    from reliability_support import deep

    portal, client = mcp_session
    for depth in (150, 199, 200, 250):
        args = {"query": "x", "purpose_ref": PURPOSE, "unexpected_field": deep(depth)}
        result = portal.call(client.call_tool, "engram_memory_search", args, 20)
        assert envelope_of(result)["error"]["code"] == "INVALID_SCHEMA", depth


def test_empty_family_refs_are_not_malformed(fuzz_core, mcp_session) -> None:
    """Regression (found by this fuzzing): `"reconciliation": {"family_refs": []}` is schema-valid,
    but the empty list did not survive protobuf (proto3 cannot tell it from an absent field), so
    the core answered INVALID_SCHEMA on both surfaces."""
    from core_support import Client, capture_args
    from mcp_helpers import envelope_of

    args = capture_args("Empty family refs are a valid reconciliation.", purpose_ref=PURPOSE,
                        reconciliation={"family_refs": []})
    validate_arguments("engram_memory_capture", args)
    client = Client(fuzz_core, tenant="fuzz", workspace="w", purpose_ref=PURPOSE)
    assert client.call("capture", args)["status"] == "committed_pending"
    portal, mcp = mcp_session
    result = portal.call(mcp.call_tool, "engram_memory_capture", args, 20)
    assert envelope_of(result)["output"]["value"]["status"] == "committed_pending"
