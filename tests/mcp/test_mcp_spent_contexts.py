"""Nothing the adapter signs is left able to act (issue 57, hole 7).

The review read the adapter-to-core traffic of an agent's search with an unknown field: the
adapter had shown two contexts signed for the search to the tool listing and to RecordRefusal,
which did not spend them, and each then searched successfully as the bound user. Here a real
gRPC hop between the real adapter (in process, as `engram mcp` builds it; the SDK's own client) and the real
core forwards every call unchanged and keeps what it saw, as a proxy's log would; every context
it saw is then sent again to the core, for the call it came with and as the search it might be
signed for, and each must be refused as spent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from engram_core.api import context_pb2, memory_pb2
from engram_core.contract.errors import Code
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY
from tests.support.mcp_helpers import (
    PURPOSE,
    Core,
    adapter_client,
    binding_for,
    capture_args,
    decline,
    error_code,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio

LISTING = "/engram.v1.HostService/ListCapabilities"
REFUSAL = "/engram.v1.HostService/RecordRefusal"
CHECK = "/engram.v1.HostService/CheckGated"
SEARCH = "/engram.v1.MemoryService/Search"


@dataclass(frozen=True)
class Seen:
    method: str
    request: bytes
    context: bytes


@dataclass
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, Any], ...]


@dataclass
class RecordingHop(grpc.GenericRpcHandler):
    """Forwards every unary call to ``upstream`` byte for byte (its answer and its error, status
    details included) and keeps the method, request bytes and signed context of each."""

    upstream: grpc.Channel
    seen: list[Seen] = field(default_factory=list)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            metadata = [(k, v) for k, v in context.invocation_metadata() if k.startswith("engram-")]
            signed = next((v for k, v in metadata if k == CONTEXT_METADATA_KEY), b"")
            self.seen.append(Seen(method, request, signed))
            call = self.upstream.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                return call(request, metadata=metadata, timeout=context.time_remaining() or 30)
            except grpc.RpcError as err:
                context.abort_with_status(_Status(err.code(), err.details() or "",
                                                  tuple(err.trailing_metadata() or ())))
                raise  # abort_with_status raised already

        return grpc.unary_unary_rpc_method_handler(forward)


@pytest.fixture(scope="module")
def hop(core: Core) -> Iterator[tuple[RecordingHop, str]]:
    upstream = grpc.insecure_channel(core.address)
    recording = RecordingHop(upstream)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((recording,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield recording, f"127.0.0.1:{port}"
    finally:
        server.stop(1).wait()
        upstream.close()


def _body(signed: bytes) -> context_pb2.HostContext:
    return context_pb2.HostContext.FromString(context_pb2.SignedEnvelope.FromString(signed).body)


def _call_of(signed: bytes) -> str:
    return _body(signed).call


def _replayed(core: Core, method: str, request: bytes, signed: bytes) -> Code | None:
    """The core's answer to ``request`` sent again under ``signed``: None if it was served."""
    with grpc.insecure_channel(core.address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            call(request, metadata=[(CONTEXT_METADATA_KEY, signed)], timeout=10)
        except grpc.RpcError as err:
            return code_from_rpc_error(err)
    return None


def _assert_all_spent(core: Core, seen: list[Seen]) -> None:
    search = memory_pb2.SearchRequest(query="spent", purpose_ref=PURPOSE).SerializeToString()
    assert seen and all(s.context for s in seen)
    for s in seen:
        # The call it came with, and the search it might be signed for: both refused as spent.
        assert _replayed(core, s.method, s.request, s.context) == Code.TRUSTED_CONTEXT_UNAVAILABLE, \
            (s.method, _call_of(s.context))
        assert _replayed(core, SEARCH, search, s.context) == Code.TRUSTED_CONTEXT_UNAVAILABLE, \
            (s.method, _call_of(s.context))
    # Still inside their lifetimes after the replays: refused as spent, not for their age.
    assert time.time_ns() // 1_000_000 < min(_body(s.context).expires_at_ms for s in seen)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_refused_search_leaves_no_context_that_can_act(core, hop, tmp_path, mode) -> None:
    recording, address = hop
    config = write_config(tmp_path / "acme.toml", address=address, signing_key=core.host_key_path,
                          binding=binding_for("acme"))
    async with adapter_client(config, mode=mode) as client:
        before = len(recording.seen)
        bad = await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE, "colour": "red"})
        assert error_code(bad) == "INVALID_SCHEMA"
        during = recording.seen[before:]
        # What the review saw: the listing (is the tool granted?) and the refusal's audit row.
        assert [s.method for s in during] == [LISTING, REFUSAL]
        _assert_all_spent(core, during)
        # Each was signed for the call that received it, never for the search.
        assert [_call_of(s.context) for s in during] == ["tools/list", "host"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_declined_forget_leaves_no_context_that_can_act(core, hop, tmp_path, mode) -> None:
    """The confirmation path shows contexts to the listing, CheckGated and RecordRefusal."""
    recording, address = hop
    config = write_config(tmp_path / "acme.toml", address=address, signing_key=core.host_key_path,
                          binding=binding_for("acme"))
    async with adapter_client(config, mode=mode, elicitation=decline) as client:
        start = len(recording.seen)  # after the adapter's start-up probe
        cap = value_of(await client.call_tool("engram_memory_capture",
                                              capture_args(unique("key"), f"Spent: the {unique('smew')} note")))
        adm = value_of(await client.call_tool("engram_memory_request_admission",
                                              {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")}))
        before = len(recording.seen)
        refused = await client.call_tool("engram_memory_forget", {
            "record_id": adm["outcome"]["record_id"], "idempotency_key": unique("f"), "reason_ref": "r:1"})
        assert error_code(refused) == "gate_failed"
        during = recording.seen[before:]
        assert CHECK in [s.method for s in during] and during[-1].method == REFUSAL
        _assert_all_spent(core, recording.seen[start:])  # the capture's and admission's too
