"""Refusals an agent can act on (issue 15, issue 13 finding 10): a constant message per code and
reason class that never echoes input; the exact reason (reason codes, JSON pointer) in the
adapter's and the core's logs; an audit row for every refusal, decided in the core or in the
adapter, so the envelope's auditId names a real row. Real core, the real adapter (in process, as
`engram mcp` builds it), SDK client."""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path
from typing import Any

import grpc
import mcp_types as types
import pytest

from engram_core.api import host_pb2, host_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.contract.errors import REFUSALS, Code
from engram_core.rpc.convert import value_to_message
from engram_core.rpc.status import error_from_rpc_error
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.mcp_helpers import (
    PURPOSE,
    activate,
    adapter_client,
    approve,
    audit_rows,
    bearer,
    binding_for,
    capture_args,
    decline,
    envelope_of,
    http_client,
    http_token,
    start_http_adapter,
    stop,
    token,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio

MODES = ["auto", "legacy"]
# A GitHub token shape the scanner knows (built here so no real-looking secret sits in the repo).
SECRET = "ghp_" + "Zq8Lm2Xv7Rt4Wn6Yp1Ks3Hd5Jf9Gc0Bb4Ee7Aa"


@pytest.fixture(scope="module")
def acme(core, tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("refusals") / "acme.toml", address=core.address,
                        signing_key=core.host_key_path, binding=binding_for("acme"))


def refusal_of(row: dict[str, Any]) -> dict[str, Any]:
    found = [d for d in row["decisions"] if d.get("path") == "refusal"]
    assert len(found) == 1, row
    return found[0]


def _base(text: str) -> dict[str, Any]:
    return capture_args(unique("cap-key"), text)


def _mutated(text: str, fn) -> dict[str, Any]:
    args = copy.deepcopy(_base(text))
    fn(args)
    return args


def _nine_mistakes(word: str) -> list[tuple[str, str, dict[str, Any], str, str]]:
    """(what, tool, arguments, reason class, pointer) for the mistakes of issue 15."""
    def rename_text(a):
        comp = a["payload"]["components"][0]
        comp["content"] = comp.pop("text")

    def fact(a):
        a["payload"]["components"][0]["kind"] = "fact"

    def dangling(a):
        a["payload"]["components"][0]["citation_ids"] = ["cit-missing"]

    def t_string(a):
        a["payload"]["valid_time"]["t"] = "2025-12-01T00:00:00.000Z"

    def short_key(a):
        a["idempotency_key"] = "key-10-chr"

    return [
        ("wrong field name", "engram_memory_capture", _mutated(word, rename_text), "unknown_field",
         "/payload/components/0"),
        ("missing purpose_ref", "engram_memory_search", {"query": word}, "missing_field", ""),
        ("limit 100", "engram_memory_search", {"query": word, "purpose_ref": PURPOSE, "limit": 100},
         "limit_out_of_range", "/limit"),
        ('kind "fact"', "engram_memory_capture", _mutated(word, fact), "value_not_allowed",
         "/payload/components/0/kind"),
        ("dangling citation", "engram_memory_capture", _mutated(word, dangling), "citation_unresolved",
         "/payload/components/0/citation_ids"),
        ("t as a string", "engram_memory_capture", _mutated(word, t_string), "wrong_type",
         "/payload/valid_time/t"),
        ('Mem0-style {"text": ...}', "engram_memory_capture", {"text": f"remember {word}"}, "wrong_shape", ""),
        ("10-character idempotency key", "engram_memory_capture", _mutated(word, short_key),
         "idempotency_key_length", "/idempotency_key"),
        ("null for an optional field", "engram_memory_search",
         {"query": word, "purpose_ref": PURPOSE, "limit": None}, "null_value", "/limit"),
    ]


async def test_nine_mistakes_get_nine_distinct_constant_messages_each_audited(core, acme) -> None:
    word = token("wombat")
    mistakes = _nine_mistakes(word)
    answers = []
    async with adapter_client(acme, elicitation=approve) as client:
        for what, tool, args, _, _ in mistakes:
            env = envelope_of(await client.call_tool(tool, args))
            assert env["ok"] is False and env["error"]["code"] == "INVALID_SCHEMA", (what, env)
            assert env["error"]["retriable"] is False
            answers.append(env)
    messages = [a["error"]["message"] for a in answers]
    assert len(set(messages)) == len(mistakes), messages
    rows = audit_rows(core)
    for (what, _tool, _args, cls, pointer), env in zip(mistakes, answers, strict=True):
        assert env["error"]["message"] == REFUSALS[Code.INVALID_SCHEMA][cls], what
        for echoed in (word, "fact", "content", "key-10-chr", "cit-missing", "2025-12-01"):
            assert echoed not in env["error"]["message"], (what, echoed)
        # the auditId names a real row holding the exact reason
        (row,) = rows[env["auditId"]]
        assert row["outcome"] == "INVALID_SCHEMA"
        refusal = refusal_of(row)
        assert refusal["reason_class"] == cls and refusal["origin"] == "host", (what, refusal)
        assert refusal.get("pointer", "") == pointer, (what, refusal)
        assert word not in json.dumps(row)  # no input in the audit log


async def test_a_secret_in_the_text_is_a_credential_refusal_not_a_permissions_one(core, acme, caplog) -> None:
    caplog.set_level(logging.INFO, logger="engram.call")
    async with adapter_client(acme, elicitation=approve) as client:
        env = envelope_of(await client.call_tool(
            "engram_memory_capture", _base(f"The deploy token is {SECRET} for the staging cluster")))
    assert env["error"]["code"] == "UNAUTHORIZED" and env["error"]["retriable"] is False
    assert env["error"]["message"] == REFUSALS[Code.UNAUTHORIZED]["credential"]
    assert SECRET not in env["error"]["message"]
    (row,) = audit_rows(core)[env["auditId"]]
    refusal = refusal_of(row)
    assert row["outcome"] == "UNAUTHORIZED" and row["operation"] == "engram_memory_capture"
    assert "SECRET_FINDINGS" in refusal["reason_codes"] and refusal["origin"] == "core"
    assert SECRET not in json.dumps(row)
    # the core's log line names the tool, scope, audit id and the policy's reason code
    lines = [r.getMessage() for r in caplog.records if r.name == "engram.call" and env["auditId"] in r.getMessage()
             and r.getMessage().startswith("memory.capture")]
    assert len(lines) == 1, lines
    for part in ("memory.capture", "acme/ws-main", "outcome=UNAUTHORIZED", "SECRET_FINDINGS", "class=credential"):
        assert part in lines[0], (part, lines[0])
    assert SECRET not in lines[0]


def test_grpc_refusals_carry_the_class_and_are_audited(core) -> None:
    """The same refusal over gRPC: the constant message of its class in the status, the class in
    ErrorInfo, and the row under the context's audit id."""
    audit_id = "aud_" + token("")[:24]
    ctx = _signed(core, audit_id, "engram_memory_capture")
    with grpc.insecure_channel(core.address) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Capture(value_to_message(_base(f"password token {SECRET}"), memory_pb2.CaptureRequest()),
                         metadata=((CONTEXT_METADATA_KEY, ctx),), timeout=10)
    error = error_from_rpc_error(err.value)
    assert (error.code, error.reason_class) == (Code.UNAUTHORIZED, "credential")
    assert err.value.details() == REFUSALS[Code.UNAUTHORIZED]["credential"]
    (row,) = audit_rows(core)[audit_id]
    assert "SECRET_FINDINGS" in refusal_of(row)["reason_codes"]


def _signed(core, audit_id: str, call: str = "engram_memory_search") -> bytes:
    key = load_private_key_file(core.host_key_path)
    return make_context(key, call=call, tenant="acme", workspace="ws-main", principal="agent-alice",
                        agent_id="agent-1",
                        session="sess-1", purpose_ref=PURPOSE, audit_id=audit_id,
                        now_ms=time.time_ns() // 1_000_000, memory_enabled=True)


@pytest.mark.parametrize("request_fields", [
    {"reason_class": "the password is hunter2"},  # free text instead of a catalogue class
    {"reason_codes": ["ok", "token ghp_abc def"]},  # a reason code that is not a code
    {"code": "STORE_UNAVAILABLE"},  # a transient failure is not a refusal
    {"code": "made up"},
    {"operation": "admin.restore"},  # only the agent tools
    {"target": "x" * 600},
    # Issue 26.7: a token shaped like a reason code sat in plain text in the audit table.
    {"reason_codes": [SECRET]},
    {"reason_codes": ["MADE_UP_REASON"]},  # code-shaped, but no catalogue value
    {"reason_codes": ["PURPOSE_MISMATCH"]},  # a catalogue value of another code
])
def test_record_refusal_takes_catalogue_values_only(core, request_fields) -> None:
    """What a host (or anyone holding a signed context) can write into the audit log through
    RecordRefusal is bounded to the catalogue: never free text."""
    audit_id = "aud_" + token("")[:24]
    request = {"operation": "engram_memory_forget", "code": "gate_failed", "reason_class": "declined",
               **request_fields}
    with grpc.insecure_channel(core.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            host_pb2_grpc.HostServiceStub(channel).RecordRefusal(
                host_pb2.RecordRefusalRequest(**request),
                metadata=((CONTEXT_METADATA_KEY, _signed(core, audit_id, "engram_memory_forget")),),
                timeout=10)
    assert error_from_rpc_error(err.value).code is Code.INVALID_SCHEMA
    rows = audit_rows(core).get(audit_id, [])
    assert all(r["outcome"] == "INVALID_SCHEMA" for r in rows)
    assert "hunter2" not in json.dumps(rows) and "ghp_abc" not in json.dumps(rows)
    assert SECRET not in json.dumps(rows) and "MADE_UP_REASON" not in json.dumps(rows)


def test_record_refusal_scans_what_it_stores(core) -> None:
    """A target is stored as its digest, but like every stored string it is scanned first: a
    credential there is refused (UNAUTHORIZED, SECRET_FINDINGS) and its bytes are in no row."""
    audit_id = "aud_" + token("")[:24]
    with grpc.insecure_channel(core.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            host_pb2_grpc.HostServiceStub(channel).RecordRefusal(
                host_pb2.RecordRefusalRequest(operation="engram_memory_forget", code="gate_failed",
                                              reason_class="declined", reason_codes=["CONFIRMATION_DECLINED"],
                                              target=SECRET),
                metadata=((CONTEXT_METADATA_KEY, _signed(core, audit_id)),), timeout=10)
    assert error_from_rpc_error(err.value).code is Code.UNAUTHORIZED
    (row,) = audit_rows(core)[audit_id]
    assert row["outcome"] == "UNAUTHORIZED" and "SECRET_FINDINGS" in refusal_of(row)["reason_codes"]
    assert SECRET not in json.dumps(row)


def test_record_refusal_pointer_keeps_schema_names_only(core) -> None:
    audit_id = "aud_" + token("")[:24]
    with grpc.insecure_channel(core.address) as channel:
        host_pb2_grpc.HostServiceStub(channel).RecordRefusal(
            host_pb2.RecordRefusalRequest(operation="engram_memory_capture", code="INVALID_SCHEMA",
                                          reason_class="unknown_field", reason_codes=["unknown_field"],
                                          pointer=f"/payload/{SECRET}/components/3/text"),
            metadata=((CONTEXT_METADATA_KEY, _signed(core, audit_id, "engram_memory_capture")),), timeout=10)
    (row,) = audit_rows(core)[audit_id]
    assert refusal_of(row)["pointer"] == "/payload/*/components/3/text"
    assert SECRET not in json.dumps(row)


async def test_digest_conflict_is_audited(core, acme) -> None:
    key = unique("conflict-key")
    async with adapter_client(acme, elicitation=approve) as client:
        value_of(await client.call_tool("engram_memory_capture", capture_args(key, f"first {token('ibis')}")))
        env = envelope_of(await client.call_tool("engram_memory_capture",
                                                 capture_args(key, f"second {token('ibis')}")))
    assert env["error"]["code"] == "DIGEST_CONFLICT"
    (row,) = audit_rows(core)[env["auditId"]]
    assert row["outcome"] == "DIGEST_CONFLICT" and refusal_of(row)["origin"] == "core"


# ---- confirmation: ask only about targets that exist; say when the client cannot ask ---------


class Asked:
    """An elicitation callback that counts the questions and answers with ``answer``."""

    def __init__(self, answer) -> None:
        self.count, self._answer = 0, answer

    async def __call__(self, context: Any, params: Any) -> types.ElicitResult:
        self.count += 1
        return await self._answer(context, params)


async def _record(client, word: str) -> str:
    cap = value_of(await client.call_tool("engram_memory_capture", _base(f"The {word} record is kept")))
    adm = value_of(await client.call_tool("engram_memory_request_admission",
                                          {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")}))
    return adm["outcome"]["record_id"]


def _forget(record_id: str) -> dict[str, Any]:
    return {"record_id": record_id, "idempotency_key": unique("fgt-key"), "reason_ref": "reason:obsolete"}


@pytest.mark.parametrize("mode", MODES)
async def test_forget_and_withdraw_of_unknown_or_foreign_targets_ask_nobody(core, acme, tmp_path, mode) -> None:
    globex = write_config(tmp_path / "globex.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("globex"))
    async with adapter_client(globex, mode=mode, elicitation=approve) as other:
        foreign = await _record(other, token("foreign"))
    asked = Asked(approve)
    async with adapter_client(acme, mode=mode, elicitation=asked) as client:
        answers = []
        for tool, args in [
            ("engram_memory_forget", _forget("mem_" + "q" * 52)),  # never existed
            ("engram_memory_forget", _forget(foreign)),  # another tenant's record
            ("engram_memory_withdraw", {"candidate_id": "cand_" + "q" * 26, "idempotency_key": unique("wd-key"),
                                        "reason_ref": "reason:obsolete"}),
        ]:
            env = envelope_of(await client.call_tool(tool, args))
            assert env["ok"] is False and env["error"]["code"] == "NOT_FOUND", (tool, env)
            answers.append(env)
        assert asked.count == 0
        # unknown and foreign are the same answer, and each is audited as that tool's refusal
        assert answers[0]["error"] == answers[1]["error"]
        rows = audit_rows(core)
        for env, tool in zip(answers, ["engram_memory_forget", "engram_memory_forget", "engram_memory_withdraw"],
                             strict=True):
            (row,) = rows[env["auditId"]]
            assert (row["operation"], row["outcome"]) == (tool, "NOT_FOUND")
        # an existing target is still asked about, once
        record_id = await _record(client, token("kept"))
        value_of(await client.call_tool("engram_memory_forget", _forget(record_id)))
        assert asked.count == 1


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_cannot_elicit_gets_gate_failed_saying_so_and_audited(core, acme, mode) -> None:
    async with adapter_client(acme, mode=mode, elicitation=approve) as asker:
        record_id = await _record(asker, token("mute"))
    async with adapter_client(acme, mode=mode) as mute:  # no elicitation callback: declares nothing
        env = envelope_of(await mute.call_tool("engram_memory_forget", _forget(record_id)))
    assert env["error"] == {"code": "gate_failed", "message": REFUSALS[Code.GATE_FAILED]["cannot_elicit"],
                            "retriable": False}
    (row,) = audit_rows(core)[env["auditId"]]
    refusal = refusal_of(row)
    assert (row["operation"], row["outcome"]) == ("engram_memory_forget", "gate_failed")
    assert refusal["reason_class"] == "cannot_elicit" and "ELICITATION_UNSUPPORTED" in refusal["reason_codes"]
    assert refusal["origin"] == "host"


@pytest.mark.parametrize("mode", MODES)
async def test_a_declined_confirmation_says_declined_and_is_audited(core, acme, mode) -> None:
    async with adapter_client(acme, mode=mode, elicitation=decline) as client:
        record_id = await _record(client, token("declined"))
        env = envelope_of(await client.call_tool("engram_memory_forget", _forget(record_id)))
    assert env["error"]["code"] == "gate_failed"
    assert env["error"]["message"] == REFUSALS[Code.GATE_FAILED]["declined"]
    (row,) = audit_rows(core)[env["auditId"]]
    assert refusal_of(row)["reason_class"] == "declined"


async def test_the_adapter_log_names_tool_scope_audit_id_and_reason(core, tmp_path) -> None:
    """Over HTTP (a subprocess whose stderr the test reads): one line per refusal."""
    activate(core, "acme", "ws-main")
    secret, http = http_token(tmp_path)
    config = write_config(tmp_path / "http.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("acme"), extra=http)
    adapter = start_http_adapter(config)
    try:
        async with http_client(adapter.url, headers=bearer(secret)) as client:
            env = envelope_of(await client.call_tool("engram_memory_search",
                                                     {"query": "x", "purpose_ref": PURPOSE, "limit": 100}))
    finally:
        stop(adapter)
    stderr = adapter.process.stderr.read().decode() if adapter.process.stderr else ""
    lines = [line for line in stderr.splitlines() if env["auditId"] in line and "call refused" in line]
    assert len(lines) == 1, stderr
    for part in ("call refused", "decided_by=adapter", "tool=engram_memory_search", "tenant=acme",
                 "workspace=ws-main", "code=INVALID_SCHEMA", "reason_class=limit_out_of_range", "pointer=/limit"):
        assert part in lines[0], (part, lines[0])


# ---- identical content is one record (duplicate_exact names it) ------------------------------


async def test_identical_content_admitted_again_is_duplicate_exact_naming_the_current_record(core, acme) -> None:
    """Issue 15: the same content captured again under a new key is not a second record. The
    admission answers duplicate_exact with the current record's id, a retry of that admission
    (same key) replays it, a new request on the same candidate answers the same, and search
    returns the content once. Once that record is forgotten, equal content is not a duplicate
    of anything current (the forgotten-content protection holds it for adjudication)."""
    word = token("narwhal")
    text = f"The {word} service retries idempotent calls three times"
    async with adapter_client(acme, elicitation=approve) as client:
        cap1 = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("dup-a"), text)))
        adm1 = value_of(await client.call_tool("engram_memory_request_admission",
                                               {"candidate_id": cap1["candidate_id"],
                                                "idempotency_key": unique("adm-a")}))["outcome"]
        assert adm1["status"] == "accepted"
        cap2 = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("dup-b"), text)))
        assert cap2["status"] == "committed_pending" and cap2["candidate_id"] != cap1["candidate_id"]
        key = unique("adm-b")
        answer = value_of(await client.call_tool("engram_memory_request_admission",
                                                 {"candidate_id": cap2["candidate_id"], "idempotency_key": key}))
        assert answer["replayed"] is False
        assert answer["outcome"]["status"] == "duplicate_exact"
        assert answer["outcome"]["record_id"] == adm1["record_id"]
        again = value_of(await client.call_tool("engram_memory_request_admission",
                                                {"candidate_id": cap2["candidate_id"], "idempotency_key": key}))
        assert again["replayed"] is True and again["outcome"] == answer["outcome"]
        other_key = value_of(await client.call_tool("engram_memory_request_admission",
                                                    {"candidate_id": cap2["candidate_id"],
                                                     "idempotency_key": unique("adm-c")}))
        assert other_key["outcome"]["status"] == "duplicate_exact"
        assert other_key["outcome"]["record_id"] == adm1["record_id"]
        hits = value_of(await client.call_tool("engram_memory_search", {"query": word, "purpose_ref": PURPOSE}))
        # The content comes back once. Another test's record captured beside it in this host-bound
        # session may come back too, lent a share of its score (docs/search.md, "Neighbours"): the
        # texts' valid times (capture_args: spread over 194 days by a hash of the text) fall within
        # the 2-hour link of one of its six nearest neighbours' about once in two hundred runs.
        holding = [h["record"]["record_id"] for h in hits["records"] if word in json.dumps(h["record"])]
        assert holding == [adm1["record_id"]] and hits["records"][0]["record"]["record_id"] == adm1["record_id"]
        # the duplicate candidate is gone for good: it cannot be withdrawn, and nothing is asked
        withdraw = envelope_of(await client.call_tool("engram_memory_withdraw", {
            "candidate_id": cap2["candidate_id"], "idempotency_key": unique("wd-dup"), "reason_ref": "reason:dup"}))
        assert withdraw["error"]["code"] == "ALREADY_TERMINAL"
        # forget the record: equal content is then forgotten content, never silently admitted
        value_of(await client.call_tool("engram_memory_forget", _forget(adm1["record_id"])))
        cap3 = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("dup-d"), text)))
        after = value_of(await client.call_tool("engram_memory_request_admission",
                                                {"candidate_id": cap3["candidate_id"],
                                                 "idempotency_key": unique("adm-d")}))
        assert after["outcome"]["status"] == "pending_adjudication"


def test_a_refused_maintenance_call_is_audited(core) -> None:
    """Maintenance refusals too: an agent context asking AdminService is refused and audited."""
    from engram_core.api import admin_pb2, admin_pb2_grpc

    audit_id = "aud_" + token("")[:24]
    with grpc.insecure_channel(core.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            admin_pb2_grpc.AdminServiceStub(channel).Export(
                admin_pb2.ExportRequest(tenant="acme", workspace="ws-main", what="audit"),
                metadata=((CONTEXT_METADATA_KEY, _signed(core, audit_id, "admin")),), timeout=10)
    error = error_from_rpc_error(err.value)
    assert (error.code, error.reason_class) == (Code.UNAUTHORIZED, "host_only")
    (row,) = audit_rows(core)[audit_id]
    assert (row["operation"], row["outcome"]) == ("admin.export", "UNAUTHORIZED")
    assert "HOST_PRINCIPAL_REQUIRED" in refusal_of(row)["reason_codes"]


async def test_a_secret_written_as_a_field_name_reaches_no_message_log_or_audit_row(core, acme) -> None:
    """An unknown field is pointed at by its parent object, never named: a key can carry a secret."""
    args = _base("harmless text")
    args["payload"][SECRET] = "x"
    args["evidence"]["citation_ids"] = ["cit1"]
    async with adapter_client(acme, elicitation=approve) as client:
        env = envelope_of(await client.call_tool("engram_memory_capture", args))
    assert env["error"]["code"] == "INVALID_SCHEMA"
    assert env["error"]["message"] == REFUSALS[Code.INVALID_SCHEMA]["unknown_field"]
    (row,) = audit_rows(core)[env["auditId"]]
    assert refusal_of(row)["pointer"] == "/payload"
    assert SECRET not in json.dumps(row) and SECRET not in json.dumps(env)
    spool = Path(core.host_key_path).parent
    for path in spool.iterdir():
        if path.is_file() and path.suffix in ("", ".spool", ".duckdb", ".wal"):
            assert SECRET.encode() not in path.read_bytes(), path
