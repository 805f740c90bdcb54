"""Quotas decided by policy over the core's usage counters (issue 18; SPEC §3 RATE_LIMITED)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from engram_core.clock import FixedClock
from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.services.quotas import QuotaCounters
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, Failed, capture_args
from tests.support.governance_support import start_with_bundle

TINY = {"principal": {"minute": {"captures": 3, "searches": 5}}, "scope": {"minute": {"captures": 5}}}


def _tiny(cfg: dict) -> None:
    cfg["tenants"]["*"]["quotas"] = TINY


def _retry_delay_ms(err: grpc.RpcError) -> int:
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(err)
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.seconds * 1000 + info.retry_delay.nanos // 1_000_000
    raise AssertionError("no RetryInfo")


def test_flooding_principal_is_rate_limited_others_are_not(tmp_path: Path, stores: EngineStores) -> None:
    core = start_with_bundle(tmp_path, stores, edit=_tiny, scopes=(("acme", "alpha"), ("globex", "alpha")))
    try:
        ana, bo = Client(core, principal="user:ana"), Client(core, principal="user:bo")
        globex = Client(core, tenant="globex", principal="user:ana")
        for i in range(3):
            ana.capture(f"Flood capture number {i}.")
        with pytest.raises(Failed) as refused:
            ana.call("capture", capture_args("One too many."))
        assert refused.value.code == Code.RATE_LIMITED
        assert refused.value.err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert 0 < _retry_delay_ms(refused.value.err) <= 60_000
        # The refusal changed nothing and did not count: still refused, nothing stored.
        assert ana.fails("capture", capture_args("Still too many.")) == Code.RATE_LIMITED
        with core.core.store.read() as tx:
            assert len([c for c in tx.candidates_in_state(Scope("acme", "alpha"), "pending") if c.principal == "user:ana"]) == 3
        # Another principal of the same tenant and scope, and another tenant, go on.
        assert bo.capture("Bo is not flooding.")["status"] == "committed_pending"
        assert globex.capture("Globex is elsewhere.")["status"] == "committed_pending"
        # Other operations of the flooding principal have their own counters.
        assert ana.search("flood")["records"] == []
        # The scope's own counter: 3 (ana) + 1 (bo) + 1 more reaches 5, then everyone in it waits.
        assert bo.capture("Bo's second capture.")["status"] == "committed_pending"
        assert bo.fails("capture", capture_args("Scope is full now.")) == Code.RATE_LIMITED
        assert globex.capture("Still fine in globex.")["status"] == "committed_pending"
    finally:
        core.stop()


def test_counters_slide_with_the_injected_clock() -> None:
    clock = FixedClock(1_700_000_000_000)
    q = QuotaCounters(clock.now_ms)
    q.add(Scope("t", "w"), "p", "captures")
    clock.advance(30_000)
    q.add(Scope("t", "w"), "p", "captures")
    q.add(Scope("t", "w"), "other", "bytes_stored", 500)
    u = q.usage(Scope("t", "w"), "p")
    assert u["principal"]["minute"]["captures"] == 2 and u["principal"]["hour"]["captures"] == 2
    assert u["scope"]["minute"]["bytes_stored"] == 500 and u["principal"]["minute"]["bytes_stored"] == 0
    assert u["principal"]["minute"]["retry_after_ms"] == 30_000  # the first capture leaves the minute then
    clock.advance(30_000)
    u = q.usage(Scope("t", "w"), "p")
    assert u["principal"]["minute"]["captures"] == 1 and u["principal"]["hour"]["captures"] == 2
    assert q.usage(Scope("t", "other-w"), "p")["principal"]["minute"]["captures"] == 0
    clock.advance(3_600_000)
    assert q.usage(Scope("t", "w"), "p")["principal"]["hour"]["captures"] == 0


def _check(c: Client, tool: str, target: str, key: str) -> str:
    from engram_core.api import host_pb2
    from engram_core.rpc.status import code_from_rpc_error
    from engram_core.trust.hostctx import CONTEXT_METADATA_KEY

    try:
        return c.host.CheckGated(host_pb2.CheckGatedRequest(tool=tool, target=target, idempotency_key=key,
                                                            reason_ref="reason:cleanup"),
                                 metadata=[(CONTEXT_METADATA_KEY, c.context(tool.removeprefix("engram_memory_")))],
                                 timeout=10).status
    except grpc.RpcError as err:
        return code_from_rpc_error(err).value


def test_forget_checks_and_forgets_are_counted(tmp_path: Path, stores: EngineStores) -> None:
    """Issue 26.7: a principal already RATE_LIMITED made 300 forget checks (each an audit row).
    Forget and withdraw, and the check a host makes before asking a human, now count against
    quotas of their own."""
    limits = {"principal": {"minute": {"forgets": 3, "withdrawals": 2, "searches": 1}}}
    core = start_with_bundle(tmp_path, stores, edit=lambda cfg: cfg["tenants"]["*"].update(quotas=limits))
    try:
        ana, bo = Client(core, principal="user:ana"), Client(core, principal="user:bo")
        rid = ana.remember("A record ana may forget one day.")
        ana.search("record")
        assert ana.fails("search", {"query": "record", "purpose_ref": ana.purpose_ref}) == Code.RATE_LIMITED
        forget = "engram_memory_forget"
        assert [_check(ana, forget, rid, f"forget-key-{i:04d}-abcdef") for i in range(4)] == \
            ["ready", "ready", "ready", "RATE_LIMITED"]
        args = {"record_id": rid, "idempotency_key": "forget-key-0000-abcdef", "reason_ref": "reason:cleanup"}
        assert ana.fails("forget", args, grant=True) == Code.RATE_LIMITED
        assert ana.get(rid)["record"]["record_id"] == rid  # nothing was forgotten
        # Withdrawals count on their own; another principal has its own counters.
        pending = ana.capture("A candidate ana may withdraw.")["candidate_id"]
        withdraw = "engram_memory_withdraw"
        assert [_check(ana, withdraw, pending, f"withdraw-key-{i:04d}-ab") for i in range(3)] == \
            ["ready", "ready", "RATE_LIMITED"]
        assert _check(bo, forget, rid, "bo-forget-key-0001-abc") == "ready"
    finally:
        core.stop()
