"""The adapter `engram mcp --host-config FILE` runs for stdio, against a real core, driven by
the SDK's own client in both protocol versions (SPEC §2, §3, §5, §8).

Discovery, every tool's happy path with a forget confirmed by elicitation, and the embedded core
go through a real `engram mcp` process over stdio; the other tests drive the same adapter in this
process (``adapter_client``: built from the same host config, served over the SDK's memory
streams), which ``test_mcp_in_process.py`` shows behaves as the process does, so that the suite
does not start an adapter process per test (issue 58)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import mcp_types as types
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp.shared.exceptions import MCPError

from engram_core.contract.errors import REFUSALS, Code
from engram_core.contract.schemas import INPUT_SCHEMAS, TOOL_NAMES, output_schema
from engram_core.observability.logs import CALL_LOGGER
from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import (
    PURPOSE,
    WORKSPACE,
    Core,
    activate,
    adapter_client,
    approve,
    binding_for,
    cancel,
    capture_args,
    deactivate,
    decline,
    envelope_of,
    error_code,
    free_port,
    stdio_client,
    token,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio

MODES = ["auto", "legacy"]  # auto negotiates 2026-07-28; legacy is 2025-11-25


@pytest.fixture(scope="module")
def cfg_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cfg")


@pytest.fixture(scope="module")
def acme(core, cfg_dir) -> Path:
    return write_config(
        cfg_dir / "acme.toml",
        address=core.address,
        signing_key=core.host_key_path,
        binding=binding_for("acme"),
    )


@pytest.fixture(scope="module")
def globex(core, cfg_dir) -> Path:
    return write_config(
        cfg_dir / "globex.toml",
        address=core.address,
        signing_key=core.host_key_path,
        binding=binding_for("globex"),
    )


async def _admitted_record(client, text: str) -> str:
    cap = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("cap-key"), text)))
    adm = value_of(
        await client.call_tool(
            "engram_memory_request_admission",
            {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")},
        )
    )
    assert adm["outcome"]["status"] == "accepted"
    return adm["outcome"]["record_id"]


def _first(ids: list[str]) -> str | None:
    """The best hit of a search for a word one record holds. Records captured next to it in the
    same host-bound session (the earlier tests', through the same binding) may follow it, lent
    part of its score (docs/search.md, "Neighbours"); none can come before it."""
    return ids[0] if ids else None


def _forget(record_id: str) -> dict:
    return {"record_id": record_id, "idempotency_key": unique("fgt"), "reason_ref": "reason:obsolete"}


async def _search_ids(client, word: str) -> list[str]:
    found = value_of(await client.call_tool("engram_memory_search", {"query": word, "purpose_ref": PURPOSE}))
    return [r["record"]["record_id"] for r in found["records"]]


# ---- discovery ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_tools_list_shows_the_six_granted_tools_with_closed_schemas(acme, mode):
    async with stdio_client(acme, mode=mode) as client:
        listed = await client.list_tools()
        assert [t.name for t in listed.tools] == list(TOOL_NAMES)
        for tool in listed.tools:
            assert tool.input_schema == INPUT_SCHEMAS[tool.name]
            assert tool.input_schema["additionalProperties"] is False
            assert tool.output_schema == output_schema(tool.name)
            assert tool.description
        assert PURPOSE in (client.instructions or "")


async def test_guide_is_served_as_prompt_and_resource(acme):
    async with adapter_client(acme) as client:
        prompts = await client.list_prompts()
        assert [p.name for p in prompts.prompts] == ["engram_memory_guide"]
        prompt = await client.get_prompt("engram_memory_guide")
        text = prompt.messages[0].content.text
        assert PURPOSE in text and "Search before capture" in text
        resource = await client.read_resource("engram://guide")
        assert resource.contents[0].text == text


async def test_memory_not_enabled_by_host_lists_nothing_and_calls_are_unknown_tools(core, cfg_dir):
    config = write_config(
        cfg_dir / "off.toml",
        address=core.address,
        signing_key=core.host_key_path,
        memory_enabled=False,
        binding=binding_for("acme"),
    )
    async with adapter_client(config) as client:
        assert (await client.list_tools()).tools == []
        with pytest.raises(MCPError) as err:
            await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE})
        assert (err.value.code, err.value.message) == (-32602, "Unknown tool")


async def test_scope_not_activated_lists_nothing_and_calls_are_unknown_tools(core, cfg_dir):
    config = write_config(
        cfg_dir / "initech.toml",
        address=core.address,
        signing_key=core.host_key_path,
        binding=binding_for("initech"),
    )
    async with adapter_client(config) as client:
        assert (await client.list_tools()).tools == []
        with pytest.raises(MCPError) as err:
            await client.call_tool(
                "engram_memory_get", {"record_id": "mem_" + "a" * 52, "purpose_ref": PURPOSE}
            )
        assert (err.value.code, err.value.message) == (-32602, "Unknown tool")


async def test_a_read_tool_not_granted_is_unknown_whatever_its_arguments(core, cfg_dir):
    """search and get go to the core without asking for the tool list first; a refusal still
    answers exactly as the list would: a tool not granted is unknown, bad arguments or a
    purpose mismatch included."""
    activate(core, "umbrella", WORKSPACE, tools=["engram_memory_capture", "engram_memory_search"])
    config = write_config(cfg_dir / "umbrella.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("umbrella"))
    async with adapter_client(config) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert listed == {"engram_memory_capture", "engram_memory_search"}
        for args in ({"record_id": "mem_" + "a" * 52, "purpose_ref": PURPOSE},
                     {"record_id": "not-an-id", "purpose_ref": PURPOSE},
                     {"record_id": "mem_" + "a" * 52, "purpose_ref": "purpose:other"}):
            with pytest.raises(MCPError) as err:
                await client.call_tool("engram_memory_get", args)
            assert (err.value.code, err.value.message) == (-32602, "Unknown tool")
        found = value_of(await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE}))
        assert found["records"] == []
        bad = envelope_of(await client.call_tool("engram_memory_search", {"query": "", "purpose_ref": PURPOSE}))
        assert bad["ok"] is False and bad["error"]["code"] == "INVALID_SCHEMA"


async def test_writes_go_straight_once_listed_and_follow_a_changed_grant(core, cfg_dir, caplog):
    """Once the tool list granted capture and admission without a confirmation, they go to the
    core without asking for the list again (the core logs every call it serves, under the call's
    audit id); a grant withdrawn since then still makes the tool unknown, whatever its arguments,
    and a grant given back makes it callable again."""
    everything = list(TOOL_NAMES)
    activate(core, "pelican", WORKSPACE, tools=everything)
    config = write_config(cfg_dir / "pelican.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("pelican"))
    caplog.set_level(logging.INFO, logger=CALL_LOGGER.name)
    async with adapter_client(config) as client:
        assert {t.name for t in (await client.list_tools()).tools} == set(everything)
        captured = envelope_of(await client.call_tool(
            "engram_memory_capture", capture_args(unique("straight-cap"), "Pelican straight capture")))
        admitted = envelope_of(await client.call_tool(
            "engram_memory_request_admission",
            {"candidate_id": captured["output"]["value"]["candidate_id"], "idempotency_key": unique("straight-adm")}))
        assert admitted["output"]["value"]["outcome"]["status"] == "accepted"
        served = [(r.engram_fields["audit_id"], r.engram_fields["operation"])
                  for r in caplog.records if r.name == CALL_LOGGER.name]
        for env, operation in ((captured, "memory.capture"), (admitted, "memory.request_admission")):
            assert [op for audit_id, op in served if audit_id == env["auditId"]] == [operation]

        deactivate(core, "pelican", WORKSPACE, ["engram_memory_capture"])
        for args in (capture_args(unique("gone-cap"), "Pelican after the grant went"),
                     capture_args(unique("gone-cap"), "Pelican", purpose="purpose:other"),
                     {"payload": {}}):
            with pytest.raises(MCPError) as err:
                await client.call_tool("engram_memory_capture", args)
            assert (err.value.code, err.value.message) == (-32602, "Unknown tool")

        activate(core, "pelican", WORKSPACE, tools=everything)
        again = value_of(await client.call_tool(
            "engram_memory_capture", capture_args(unique("back-cap"), "Pelican with the grant back")))
        assert again["status"] == "committed_pending"


# ---- protocol errors ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_tool_is_32602_and_purpose_mismatch_is_32603(acme, mode):
    async with adapter_client(acme, mode=mode) as client:
        with pytest.raises(MCPError) as err:
            await client.call_tool("engram_memory_admin_activate", {})
        assert (err.value.code, err.value.message) == (-32602, "Unknown tool")
        mismatched = [
            ("engram_memory_search", {"query": "x", "purpose_ref": "purpose:other"}),
            ("engram_memory_get", {"record_id": "mem_" + "a" * 52, "purpose_ref": "purpose:other"}),
            ("engram_memory_capture", capture_args(unique("key"), "text", purpose="purpose:other")),
        ]
        for name, args in mismatched:
            with pytest.raises(MCPError) as err:
                await client.call_tool(name, args)
            assert (err.value.code, err.value.message) == (-32603, "Trusted invocation context unavailable")


async def test_incomplete_binding_is_32603(core, cfg_dir):
    config = write_config(
        cfg_dir / "empty-tenant.toml",
        address=core.address,
        signing_key=core.host_key_path,
        binding={**binding_for("acme"), "tenant": ""},
    )
    async with adapter_client(config) as client:
        for call in (
            client.list_tools(),
            client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE}),
        ):
            with pytest.raises(MCPError) as err:
                await call
            assert (err.value.code, err.value.message) == (-32603, "Trusted invocation context unavailable")


async def test_context_signed_by_an_untrusted_key_is_32603(core, cfg_dir):
    rogue = cfg_dir / "rogue.key"
    rogue.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    config = write_config(
        cfg_dir / "rogue.toml", address=core.address, signing_key=rogue, binding=binding_for("acme")
    )
    async with adapter_client(config) as client:
        for call in (
            client.list_tools(),
            client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE}),
        ):
            with pytest.raises(MCPError) as err:
                await call
            assert (err.value.code, err.value.message) == (-32603, "Trusted invocation context unavailable")


async def test_unreachable_core_is_an_error_envelope_never_an_empty_success(cfg_dir, core):
    config = write_config(
        cfg_dir / "nowhere.toml",
        address=f"127.0.0.1:{free_port()}",
        signing_key=core.host_key_path,
        binding=binding_for("acme"),
        deadline_ms=2000,
    )
    async with adapter_client(config) as client:
        with pytest.raises(MCPError) as err:
            await client.list_tools()
        # transient, so the retriable signal, not -32603's "stop" (issue 31 item 1)
        assert err.value.code == -32010 and err.value.data["retriable"] is True
        result = await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE})
        env = envelope_of(result)
        assert env["ok"] is False and env["error"]["retriable"] is True


# ---- malformed arguments are envelopes --------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_extra_field_and_null_are_invalid_schema_and_reach_nothing(acme, mode):
    word = token("never-stored")
    async with adapter_client(acme, mode=mode, elicitation=approve) as client:
        bad = [
            ("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE, "tenant": "globex"}),
            ("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE, "limit": None}),
            ("engram_memory_capture", {**capture_args(unique("key"), word), "confirmed": True}),
            ("engram_memory_forget", {**_forget("mem_" + "a" * 52), "confirmed": True}),
            ("engram_memory_capture", {**capture_args(unique("key"), word), "evidence": None}),
        ]
        catalogue = set(REFUSALS[Code.INVALID_SCHEMA].values())
        for name, args in bad:
            env = envelope_of(await client.call_tool(name, args))
            assert env["ok"] is False
            assert env["error"]["code"] == "INVALID_SCHEMA" and env["error"]["retriable"] is False
            assert env["error"]["message"] in catalogue  # a constant message, never one built from input
            assert "globex" not in env["error"]["message"] and "confirmed" not in env["error"]["message"]
        assert await _search_ids(client, word) == []


# ---- lifecycle through the adapter --------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_every_tool_happy_path_and_forget_with_approval(acme, mode):
    word = token("okapi")
    async with stdio_client(acme, mode=mode, elicitation=approve) as client:
        record_id = await _admitted_record(client, f"We chose {word} for the store because it is embedded")
        assert _first(await _search_ids(client, word)) == record_id
        got = value_of(
            await client.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE})
        )
        assert got["record"]["record_id"] == record_id

        pending = value_of(
            await client.call_tool("engram_memory_capture", capture_args(unique("key"), f"draft {word}"))
        )
        withdrawn = value_of(
            await client.call_tool(
                "engram_memory_withdraw",
                {
                    "candidate_id": pending["candidate_id"],
                    "idempotency_key": unique("wd"),
                    "reason_ref": "reason:draft",
                },
            )
        )
        assert withdrawn["receipt"]["to_state"] == "withdrawn"

        forgot = value_of(await client.call_tool("engram_memory_forget", _forget(record_id)))
        assert forgot["receipt"]["operation"] == "tombstone" and forgot["receipt"]["to_state"] == "tombstoned"
        assert (
            error_code(
                await client.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE})
            )
            == "NOT_FOUND"
        )
        assert await _search_ids(client, word) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("answer", [decline, cancel], ids=["decline", "cancel"])
async def test_forget_declined_or_cancelled_is_gate_failed_and_record_stays(acme, mode, answer):
    word = token("quokka")
    async with adapter_client(acme, mode=mode, elicitation=answer) as client:
        record_id = await _admitted_record(client, f"Keep {word}")
        assert error_code(await client.call_tool("engram_memory_forget", _forget(record_id))) == "gate_failed"
        assert _first(await _search_ids(client, word)) == record_id


@pytest.mark.parametrize("mode", MODES)
async def test_client_without_elicitation_gets_gate_failed(acme, mode):
    word = token("tapir")
    async with adapter_client(acme, mode=mode) as client:  # declares no elicitation capability
        record_id = await _admitted_record(client, f"Keep {word}")
        assert error_code(await client.call_tool("engram_memory_forget", _forget(record_id))) == "gate_failed"
        assert _first(await _search_ids(client, word)) == record_id


async def test_idempotency_replay_conflict_and_forgotten_content(acme):
    word = token("narwhal")
    text = f"The narwhal decision {word}"
    async with adapter_client(acme, elicitation=approve) as client:
        key = unique("cap-key")
        first = value_of(await client.call_tool("engram_memory_capture", capture_args(key, text)))
        replay = value_of(await client.call_tool("engram_memory_capture", capture_args(key, text)))
        assert first["status"] == "committed_pending" and replay["status"] == "duplicate_exact"
        assert replay["candidate_id"] == first["candidate_id"]
        assert (
            error_code(
                await client.call_tool("engram_memory_capture", capture_args(key, text + " but different"))
            )
            == "DIGEST_CONFLICT"
        )

        adm = value_of(
            await client.call_tool(
                "engram_memory_request_admission",
                {"candidate_id": first["candidate_id"], "idempotency_key": unique("adm")},
            )
        )
        record_id = adm["outcome"]["record_id"]
        value_of(await client.call_tool("engram_memory_forget", _forget(record_id)))

        again = value_of(
            await client.call_tool("engram_memory_capture", capture_args(unique("cap-key"), text))
        )
        assert again["status"] == "committed_pending"
        readmitted = value_of(
            await client.call_tool(
                "engram_memory_request_admission",
                {"candidate_id": again["candidate_id"], "idempotency_key": unique("adm")},
            )
        )
        assert readmitted["outcome"]["status"] == "pending_adjudication"
        assert await _search_ids(client, word) == []


async def test_two_tenants_sharing_a_core_cannot_see_each_other(acme, globex):
    word = token("axolotl")
    async with adapter_client(acme) as a:
        record_id = await _admitted_record(a, f"Acme only {word}")
    async with adapter_client(globex) as g:
        assert await _search_ids(g, word) == []
        assert (
            error_code(
                await g.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE})
            )
            == "NOT_FOUND"
        )


# ---- the 2026-07-28 round trip cannot be replayed or forged ----------------------------------


async def test_request_state_is_single_use_and_tamper_proof(acme):
    word = token("pangolin")
    async with adapter_client(acme, elicitation=approve) as client:
        record_id = await _admitted_record(client, f"Keep {word}")
        args = _forget(record_id)
        first = await client.session.call_tool("engram_memory_forget", args, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.request_state
        (key,) = first.input_requests
        yes = {key: types.ElicitResult(action="accept", content={"approve": True})}

        forged = await client.session.call_tool(
            "engram_memory_forget",
            args,
            input_responses=yes,
            request_state=first.request_state[:-4] + "AAAA",
            allow_input_required=True,
        )
        assert error_code(forged) == "gate_failed"

        other = await client.session.call_tool(
            "engram_memory_forget",
            {**args, "reason_ref": "reason:other"},
            input_responses=yes,
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert error_code(other) == "gate_failed"  # state is bound to the exact arguments
        assert _first(await _search_ids(client, word)) == record_id

        second = await client.session.call_tool("engram_memory_forget", args, allow_input_required=True)
        done = await client.session.call_tool(
            "engram_memory_forget",
            args,
            input_responses=yes,
            request_state=second.request_state,
            allow_input_required=True,
        )
        assert value_of(done)["receipt"]["to_state"] == "tombstoned"
        replayed = await client.session.call_tool(
            "engram_memory_forget",
            args,
            input_responses=yes,
            request_state=second.request_state,
            allow_input_required=True,
        )
        assert error_code(replayed) == "gate_failed"


async def test_core_deadline_comes_back_as_a_retriable_envelope(stores: EngineStores, tmp_path, cfg_dir):
    """A core that does not answer within the host's deadline: the agent gets a retriable
    DEADLINE_EXCEEDED envelope. The core is held busy for real (the writer chain's audit lock,
    which the search's own audit row needs, is held), not raced against a 1 ms deadline: that
    version also sent the SDK's own tools/list (for the output schema) past the deadline now and
    then, and failed in CI."""
    running = stores.start_core(tmp_path / "data")
    try:
        activate(Core(address=running.address, host_key_path=Path(running.host_key_path)), "acme", WORKSPACE)
        config = write_config(
            cfg_dir / "tight.toml",
            address=running.address,
            signing_key=running.host_key_path,
            binding=binding_for("acme"),
            deadline_ms=300,
        )
        async with adapter_client(config) as client:
            # The output schemas, fetched while the core answers. On a loaded machine the first
            # call (a fresh channel to the core) can miss 300 ms itself and comes back as the
            # retriable "temporarily unavailable" this test is not about: it is asked again.
            for attempt in range(20):
                try:
                    await client.list_tools()
                    break
                except MCPError:
                    if attempt == 19:
                        raise
            held, release = threading.Event(), threading.Event()

            def hold_the_store() -> None:
                with running.core.store._audit_lock:  # a read's row joins the writer chain under it
                    held.set()
                    release.wait(10)

            holder = threading.Thread(target=hold_the_store)
            holder.start()
            assert held.wait(5)
            try:
                env = envelope_of(
                    await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE})
                )
            finally:
                release.set()
                holder.join()
            assert env["error"]["code"] == "DEADLINE_EXCEEDED" and env["error"]["retriable"] is True
            # Once the core answers again, so does the same session.
            assert value_of(await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE}))[
                "records"] == []
    finally:
        running.stop()


async def test_embedded_core_starts_in_process_and_memory_stays_off_until_activated(tmp_path):
    config = tmp_path / "embedded.toml"
    body = "\n".join(f'{k} = "{v}"' for k, v in binding_for("acme").items())
    config.write_text(
        f'[core]\nembedded = true\ndata_dir = "{tmp_path / "data"}"\n\n[host]\nmemory_enabled = true\n\n[binding]\n{body}\n'
    )
    async with stdio_client(config) as client:
        assert (await client.list_tools()).tools == []
    assert (tmp_path / "data" / "host.key").exists()
