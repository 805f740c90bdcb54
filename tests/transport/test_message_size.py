"""A message over the core's gRPC limit (8 MiB) is refused by gRPC before any handler runs;
clients must read that as the contract's non-retriable INVALID_SCHEMA (the arguments exceed
their bounds; SPEC §4: ≤ 1,048,576 bytes), never as a retriable STORE_UNAVAILABLE that
invites an endless resend. Real server on loopback, real client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from engram_core.api import memory_pb2, memory_pb2_grpc
from engram_core.app.composition import RunningCore, start_core
from engram_core.contract.errors import RETRIABLE, Code
from engram_core.rpc.server import MAX_MESSAGE_BYTES
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.mcp_helpers import PURPOSE, WORKSPACE, Core, activate


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCore]:
    running = start_core(tmp_path_factory.mktemp("size"), semantic=False)
    activate(Core(running.address, Path(running.host_key_path)), "acme", WORKSPACE)
    yield running
    running.stop()


def _search(core: RunningCore, query: str) -> Code:
    ctx = make_context(load_private_key_file(core.host_key_path), call="engram_memory_search", tenant="acme",
                       workspace=WORKSPACE,
                       principal="agent-alice", purpose_ref=PURPOSE, now_ms=time.time_ns() // 1_000_000,
                       memory_enabled=True)
    with grpc.insecure_channel(core.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            memory_pb2_grpc.MemoryServiceStub(channel).Search(
                memory_pb2.SearchRequest(query=query, purpose_ref=PURPOSE),
                metadata=((CONTEXT_METADATA_KEY, ctx),), timeout=30)
    return code_from_rpc_error(err.value)


@pytest.mark.parametrize("size", [MAX_MESSAGE_BYTES + 1024, 9 * 1024 * 1024], ids=["just-over", "9MiB"])
def test_a_message_over_the_grpc_limit_is_invalid_schema_not_retriable(core, size):
    code = _search(core, "a" * size)
    assert code == Code.INVALID_SCHEMA
    assert code not in RETRIABLE


def test_within_the_grpc_limit_the_core_itself_answers_invalid_schema(core):
    assert _search(core, "a" * (2 * 1024 * 1024)) == Code.INVALID_SCHEMA  # query bound: 8,192 bytes
