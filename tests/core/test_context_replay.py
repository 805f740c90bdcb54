"""A signed host context is single use (SPEC §2: the nonce is remembered for the context's
window; a replayed context is refused like a bad one). Issue 13 finding 8.

The attacker captured the gRPC metadata of a real call (an interceptor on the channel,
as anyone on the wire or in the client process would) and sends it again."""

from __future__ import annotations

import collections

import grpc
import pytest

from engram_core.api import context_pb2, host_pb2, memory_pb2, memory_pb2_grpc
from engram_core.app.composition import RunningCore
from engram_core.contract.errors import Code, EngramError
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.context_nonces import ContextNonceLedger
from engram_core.trust.hostctx import CLOCK_SKEW_MS, CONTEXT_METADATA_KEY, sign_context
from tests.support.core_engines import EngineStores
from tests.support.core_support import PURPOSE, Client, activate, capture_args, now_ms


class _Recorder(grpc.UnaryUnaryClientInterceptor):
    """Keeps the metadata of every call sent through the channel."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[tuple[str, bytes]]]] = []

    def intercept_unary_unary(self, continuation, client_call_details, request):
        self.sent.append((client_call_details.method, list(client_call_details.metadata or [])))
        return continuation(client_call_details, request)


def _recording(ana: Client) -> _Recorder:
    recorder = _Recorder()
    ana.memory = memory_pb2_grpc.MemoryServiceStub(grpc.intercept_channel(ana.channel, recorder))
    return recorder


def _replay(ana: Client, method: str, request, metadata) -> Code | dict:
    try:
        return message_to_value(getattr(memory_pb2_grpc.MemoryServiceStub(ana.channel), method)(
            request, metadata=metadata, timeout=10))
    except grpc.RpcError as err:
        return code_from_rpc_error(err)


def test_captured_search_metadata_replayed_is_refused(ana: Client) -> None:
    rid = ana.remember("Replay: the grebe runbook lives in ops/grebe.md.")
    recorder = _recording(ana)
    assert [r["record"]["record_id"] for r in ana.search("grebe")["records"]] == [rid]
    (_, captured), = recorder.sent
    request = value_to_message({"query": "grebe", "purpose_ref": PURPOSE}, memory_pb2.SearchRequest())
    assert _replay(ana, "Search", request, captured) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    # The same context for another operation: refused too, and nothing is written.
    args = capture_args("Replay: a capture riding on a captured context.")
    cap = value_to_message(args, memory_pb2.CaptureRequest())
    assert _replay(ana, "Capture", cap, captured) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert ana.search("riding")["records"] == []


def test_captured_forget_metadata_replayed_is_refused(ana: Client) -> None:
    rid = ana.remember("Replay: the merganser note to be forgotten once.")
    args = {"record_id": rid, "idempotency_key": "fg-replay-" + rid[4:30], "reason_ref": "reason:test"}
    recorder = _recording(ana)
    assert ana.call("forget", args, grant=True)["receipt"]["to_state"] == "tombstoned"
    (_, captured), = recorder.sent
    assert len(captured) == 2  # the context and the grant, exactly as sent
    request = value_to_message(args, memory_pb2.ForgetRequest())
    # Before: the stored outcome was handed to anyone replaying the bytes; now the context is spent.
    assert _replay(ana, "Forget", request, captured) == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_every_fresh_context_is_accepted(ana: Client) -> None:
    for _ in range(5):
        ana.search("anything")  # core_support signs a new context (new nonce) per call


def test_context_without_nonce_is_refused(ana: Client) -> None:
    ctx = context_pb2.HostContext(tenant="acme", workspace="alpha", principal="user:ana", purpose_ref=PURPOSE,
                                  audit_id="aud_no_nonce", issued_at_ms=now_ms(), expires_at_ms=now_ms() + 10_000,
                                  memory_enabled=True, call="engram_memory_search")
    signed = sign_context(ctx, ana.key)
    assert ana.fails("search", {"query": "x", "purpose_ref": PURPOSE}, context=signed) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_context_signed_before_a_restart_is_refused_after_it(stores: EngineStores, tmp_path) -> None:
    data = tmp_path / "data"
    running = stores.start_core(data)
    activate(running)
    ana = Client(running)
    # Signed before the restart (by more than the clock-skew allowance), never used, and still
    # inside its lifetime after it.
    early = ana.context("search", now_ms=now_ms() - SIGNED_BEFORE_START_MS)
    running.stop()
    # The restarted core has an empty ledger; a context it could not have seen claimed is refused.
    running = stores.start_core(data)
    try:
        ana = Client(running)
        assert ana.fails("search", {"query": "x", "purpose_ref": PURPOSE}, context=early) \
            == Code.TRUSTED_CONTEXT_UNAVAILABLE
        ana.search("x")  # a fresh one works
    finally:
        running.stop()


SIGNED_BEFORE_START_MS = CLOCK_SKEW_MS + 1_000


def test_adapter_and_cli_sign_a_fresh_short_context_per_call(core: RunningCore) -> None:
    """The legitimate signers: each call its own nonce, and the adapter's lifetime is short."""
    from adapters.mcp.config import AgentBinding, HostConfig
    from adapters.mcp.host_context import CONTEXT_TTL_MS, ContextSource
    from engram_core.cli.channel import admin_metadata
    from engram_core.trust.hostkeys import load_private_key_file

    key = load_private_key_file(core.host_key_path)
    nonces = collections.Counter()
    for _ in range(3):
        (_, raw), = admin_metadata(str(core.host_key_path))
        nonces[_body(raw).nonce] += 1
    config = HostConfig(core_address=core.address, embedded_data_dir=None, deadline_ms=10_000, signing_key=key,
                        signing_key_path=core.host_key_path, memory_enabled=True, confirmation_timeout_ms=60_000,
                        binding=AgentBinding(tenant="acme", workspace="alpha", principal="user:ana", agent_id="a",
                                             session="s", purpose_ref=PURPOSE))
    call = ContextSource(config, key).for_request(None)
    bodies = [_body(call.signed()) for _ in range(3)]
    nonces.update(b.nonce for b in bodies)
    assert all(n == 1 for n in nonces.values()) and len(nonces) == 6
    assert {b.audit_id for b in bodies} == {call.audit_id}  # one MCP call, one audit id
    assert all(b.expires_at_ms - b.issued_at_ms == CONTEXT_TTL_MS <= 15_000 for b in bodies)


def _body(signed: bytes) -> context_pb2.HostContext:
    env = context_pb2.SignedEnvelope.FromString(signed)
    return context_pb2.HostContext.FromString(env.body)


# ---- the ledger's bounds --------------------------------------------------------------

def test_ledger_keeps_a_nonce_until_its_context_expires_then_forgets_it() -> None:
    ledger = ContextNonceLedger(started_at_ms=1_000, skew_ms=0)
    ledger.claim("k", "n1", issued_at_ms=1_000, expires_at_ms=2_000, now_ms=1_000)
    with pytest.raises(EngramError) as err:
        ledger.claim("k", "n1", issued_at_ms=1_000, expires_at_ms=2_000, now_ms=1_999)
    assert err.value.code == Code.TRUSTED_CONTEXT_UNAVAILABLE
    ledger.claim("other-key", "n1", issued_at_ms=1_000, expires_at_ms=2_000, now_ms=1_999)  # per signing key
    ledger.claim("k", "n2", issued_at_ms=2_000, expires_at_ms=3_000, now_ms=2_000)
    assert len(ledger) == 1  # both n1 entries purged at their expiry


def test_full_ledger_fails_closed_and_never_evicts_a_live_nonce() -> None:
    ledger = ContextNonceLedger(started_at_ms=0, skew_ms=0, capacity=3)
    for i in range(3):
        ledger.claim("k", f"n{i}", issued_at_ms=0, expires_at_ms=10_000, now_ms=0)
    with pytest.raises(EngramError) as err:
        ledger.claim("k", "n3", issued_at_ms=0, expires_at_ms=10_000, now_ms=5_000)
    assert err.value.code == Code.RATE_LIMITED
    with pytest.raises(EngramError) as err:  # n0 was not evicted to make room: still a replay
        ledger.claim("k", "n0", issued_at_ms=0, expires_at_ms=10_000, now_ms=5_000)
    assert err.value.code == Code.TRUSTED_CONTEXT_UNAVAILABLE
    ledger.claim("k", "n3", issued_at_ms=10_000, expires_at_ms=20_000, now_ms=10_000)  # room after expiry
    assert len(ledger) == 1


def test_ledger_memory_stays_bounded_under_a_stream_of_calls() -> None:
    ledger = ContextNonceLedger(started_at_ms=0, skew_ms=0, capacity=1_000)
    for i in range(20_000):  # 20k calls, each context living 100 ms, one call per ms
        ledger.claim("k", f"n{i}", issued_at_ms=i, expires_at_ms=i + 100, now_ms=i)
        assert len(ledger) <= 100
    assert len(ledger._heap) <= 101


# ---- issue 26 items 2 and 6: a context acts only in the call it was signed for; replay
# protection survives a restart; one key's flood fills only its own lane ----------------

def test_a_context_signed_for_the_tool_listing_cannot_act(ana: Client) -> None:
    """The tool listing, CheckGated and RecordRefusal did not spend a nonce (a fronting host's one
    context per request also serves them); a context signed for the listing, seen there, was
    then good for one search, get or capture. Now it acts nowhere (and the listing spends it)."""
    rid = ana.remember("Call binding: the wigeon note.")
    listing = ana.context()  # signed for tools/list
    assert sorted(ana.host.ListCapabilities(host_pb2.ListCapabilitiesRequest(),
                                            metadata=[(CONTEXT_METADATA_KEY, listing)]).tools)
    assert ana.fails("search", {"query": "wigeon", "purpose_ref": PURPOSE}, context=listing) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert ana.fails("get", {"record_id": rid, "purpose_ref": PURPOSE}, context=listing) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert ana.fails("capture", capture_args("Call binding: riding on a listing context."), context=listing) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE
    # A context signed for get cannot search, nor one for search capture.
    assert ana.fails("search", {"query": "wigeon", "purpose_ref": PURPOSE}, context=ana.context("get")) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE
    # A tool call's own context serves the listing first (as the adapter does), then its call, once.
    search_ctx = ana.context("search")
    ana.host.ListCapabilities(host_pb2.ListCapabilitiesRequest(), metadata=[(CONTEXT_METADATA_KEY, search_ctx)])
    found = ana.call("search", {"query": "wigeon", "purpose_ref": PURPOSE}, context=search_ctx)["records"]
    assert found[0]["record"]["record_id"] == rid  # (records captured beside it in the session may follow)
    assert ana.fails("search", {"query": "wigeon", "purpose_ref": PURPOSE}, context=search_ctx) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_a_context_used_before_a_quick_restart_is_refused_after_it(stores: EngineStores, tmp_path) -> None:
    data = tmp_path / "data"
    running = stores.start_core(data, semantic=False)
    activate(running)
    ana = Client(running)
    used = ana.context("search")
    ana.call("search", {"query": "x", "purpose_ref": PURPOSE}, context=used)
    running.stop()
    running = stores.start_core(data, semantic=False)  # within the clock-skew allowance of the first start
    try:
        ana = Client(running)
        assert ana.fails("search", {"query": "x", "purpose_ref": PURPOSE}, context=used) \
            == Code.TRUSTED_CONTEXT_UNAVAILABLE
        ana.search("x")  # a fresh one works
    finally:
        running.stop()


def test_one_keys_flood_fills_its_own_lane_only_and_is_audited(fresh_core: RunningCore, tmp_path) -> None:
    """Another tenant's host key (trusted) floods the core with contexts: its lane of the nonce
    ledger fills and its calls are refused RATE_LIMITED, each refusal audited; every other key's
    calls, and maintenance by the local host key (untrusting the flooder), go on."""
    import json

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from engram_core.api import admin_pb2, host_pb2_grpc
    from engram_core.trust.context_nonces import ContextNonceLedger
    from engram_core.trust.hostctx import make_context
    from engram_core.trust.hostkeys import key_id, public_pem

    core = fresh_core.core
    core.context_nonces = ContextNonceLedger(started_at_ms=now_ms() - 60_000, skew_ms=0, capacity=20)
    ana = Client(fresh_core)
    rogue = Ed25519PrivateKey.generate()
    rogue_id = key_id(rogue.public_key())
    host_md = [(CONTEXT_METADATA_KEY, make_context(ana.key, call="admin", tenant="_host", workspace="_admin",
                                                    principal="host:operator", now_ms=now_ms(), host_principal=True,
                                                    maintenance_scopes=("read", "maintain"), memory_enabled=False))]
    # Another tenant's host: trusted for globex only (issue 26.3's binding), as the finding had it.
    ana.admin.TrustHostKey(admin_pb2.HostKeyRequest(public_key_pem=public_pem(rogue.public_key()), tenants=["globex"]),
                           metadata=host_md, timeout=10)
    stub = host_pb2_grpc.HostServiceStub(ana.channel)
    codes = []
    for i in range(25):  # 300 s contexts, as in the finding
        md = [(CONTEXT_METADATA_KEY, make_context(rogue, call="host", tenant="globex", workspace="alpha",
                                                   principal="host:globex", now_ms=now_ms(), ttl_ms=300_000,
                                                   host_principal=True, audit_id=f"aud_flood_{i:04d}"))]
        try:
            stub.AuthorizationEpoch(host_pb2.AuthorizationEpochRequest(), metadata=md, timeout=10)
            codes.append("ok")
        except grpc.RpcError as err:
            codes.append(code_from_rpc_error(err).value)
    assert codes[:20] == ["ok"] * 20 and codes[20:] == ["RATE_LIMITED"] * 5
    # Everyone else goes on: the agents' calls (the local key's lane) and maintenance.
    rid = ana.remember("The flood leaves this gadwall note reachable.")
    assert ana.get(rid)["record"]["record_id"] == rid
    md = [(CONTEXT_METADATA_KEY, make_context(ana.key, call="admin", tenant="_host", workspace="_admin",
                                               principal="host:operator", now_ms=now_ms(), host_principal=True,
                                               maintenance_scopes=("read", "maintain"), memory_enabled=False))]
    ana.admin.UntrustHostKey(admin_pb2.HostKeyRequest(key_id=rogue_id), metadata=md, timeout=10)
    # The refused calls are in the audit log, under their own audit ids.
    with core.store.read() as tx:
        refused = [r for r in tx.audit_rows(None, 0, None) if r["audit_id"].startswith("aud_flood_")
                   and r["outcome"] == "RATE_LIMITED"]
    assert len(refused) == 5
    assert all("NONCE_LEDGER_FULL" in json.dumps(r["decisions"]) for r in refused)


# ---- issue 57 hole 7: every call that sees a context spends it -------------------------------

def _host_call(ana: Client, method: str, request, context: bytes) -> Code | object:
    try:
        return getattr(ana.host, method)(request, metadata=[(CONTEXT_METADATA_KEY, context)], timeout=10)
    except grpc.RpcError as err:
        return code_from_rpc_error(err)


_REFUSAL = dict(code="INVALID_SCHEMA", reason_class="unknown_field", reason_codes=["unknown_field"])


def test_a_context_shown_to_record_refusal_cannot_act_afterwards(ana: Client) -> None:
    """The review's replay: a context that reached only RecordRefusal (an adapter-decided refusal,
    read off the adapter-to-core traffic) then got once and captured once as its tool. Now
    RecordRefusal spends it: the tool call, and RecordRefusal itself, refuse it as a replay."""
    rid = ana.remember("Spent contexts: the shoveler note.")
    get_ctx = ana.context("get")
    recorded = _host_call(ana, "RecordRefusal", host_pb2.RecordRefusalRequest(
        operation="engram_memory_get", **_REFUSAL), get_ctx)
    assert isinstance(recorded, host_pb2.RecordRefusalResponse)
    assert ana.fails("get", {"record_id": rid, "purpose_ref": PURPOSE}, context=get_ctx) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE
    capture_ctx = ana.context("capture")
    assert isinstance(_host_call(ana, "RecordRefusal", host_pb2.RecordRefusalRequest(
        operation="engram_memory_capture", **_REFUSAL), capture_ctx), host_pb2.RecordRefusalResponse)
    args = capture_args("Spent contexts: a capture riding on a refusal's context.")
    assert ana.fails("capture", args, context=capture_ctx) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert _host_call(ana, "RecordRefusal", host_pb2.RecordRefusalRequest(
        operation="engram_memory_capture", **_REFUSAL), capture_ctx) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert ana.search("riding")["records"] == []
    # The refusal's row names the claim, so a restart seeds it (Attack 4 in docs/security.md).
    audit_id = _body(capture_ctx).audit_id
    with ana.core.core.store.read() as tx:
        rows = [r for r in tx.audit_rows(None, 0, None) if r["audit_id"] == audit_id]
    assert rows and all(r["context_nonce"] for r in rows)


def test_the_host_calls_spend_the_contexts_signed_for_them(ana: Client) -> None:
    """What the adapter signs for the listing (``tools/list``) and for CheckGated and
    RecordRefusal (``host``) is spent by the call it is sent to: shown again, anywhere, refused."""
    rid = ana.remember("Spent contexts: the pochard note, checked before a forget.")
    listing = ana.context()
    assert _host_call(ana, "ListCapabilities", host_pb2.ListCapabilitiesRequest(), listing).tools
    assert _host_call(ana, "ListCapabilities", host_pb2.ListCapabilitiesRequest(), listing) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE
    args = {"record_id": rid, "idempotency_key": "fg-spent-" + rid[4:30], "reason_ref": "reason:test"}
    check = host_pb2.CheckGatedRequest(tool="engram_memory_forget", target=rid,
                                       idempotency_key=args["idempotency_key"], reason_ref=args["reason_ref"])
    host_ctx = ana.context(call="host")  # the agent's binding, signed for a host call
    assert _host_call(ana, "CheckGated", check, host_ctx).status == "ready"
    assert _host_call(ana, "CheckGated", check, host_ctx) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert ana.fails("forget", args, context=host_ctx, grant=True) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    # A tool call's own context (a fronting host's one per request) is left for its call to spend:
    # CheckGated, then the forget it served, once.
    forget_ctx = ana.context("forget")
    assert _host_call(ana, "CheckGated", check, forget_ctx).status == "ready"
    assert ana.call("forget", args, context=forget_ctx, grant=True)["receipt"]["to_state"] == "tombstoned"
    assert ana.fails("forget", args, context=forget_ctx, grant=True) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert _host_call(ana, "RecordRefusal", host_pb2.RecordRefusalRequest(
        operation="engram_memory_forget", **_REFUSAL), forget_ctx) == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_a_context_sent_with_an_undecodable_request_is_spent(ana: Client) -> None:
    """A request whose bytes do not decode is refused INVALID_SCHEMA after its context verified;
    that context is spent with it, so the bytes on the wire cannot be sent again as a search."""
    search_ctx = ana.context("search")
    raw = memory_pb2.SearchRequest(query="x").SerializeToString() + b"\x0a\xff"  # truncated field
    call = ana.channel.unary_unary("/engram.v1.MemoryService/Search", request_serializer=None,
                                   response_deserializer=None)
    with pytest.raises(grpc.RpcError) as err:
        call(raw, metadata=[(CONTEXT_METADATA_KEY, search_ctx)], timeout=10)
    assert code_from_rpc_error(err.value) == Code.INVALID_SCHEMA
    assert ana.fails("search", {"query": "x", "purpose_ref": PURPOSE}, context=search_ctx) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE
