"""Derivative rules through MCP (SPEC §5 retention.derivative_rule; issue 18).

A derivative cites another record as its source (``source_ref`` = the source's record_id).
Forgetting the source applies the source's rule in the forget transaction: ``make-ineligible``
makes its derivatives (and theirs, in turn) ineligible and the coverage receipt lists them;
``retain`` leaves them searchable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engram_core.contract.canonical import with_receipt_digest
from engram_core.contract.scope import Scope
from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import (
    PURPOSE,
    WORKSPACE,
    Core,
    activate,
    adapter_client,
    approve,
    binding_for,
    capture_args,
    error_code,
    token,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def governed(module_stores: EngineStores, tmp_path_factory):
    """A core whose bundle lets agents ask for `retain` (data only, no Python change)."""
    from engram_core.app.composition import default_policies_dir

    root = tmp_path_factory.mktemp("derivatives")
    bundle = root / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    data = json.loads((bundle / "data.json").read_text())
    data["engram"]["config"]["tenants"]["*"]["retain_allowed"] = True
    (bundle / "data.json").write_text(json.dumps(data))
    running = module_stores.start_core(root / "data", policies_dir=bundle, semantic=False)
    try:
        core = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(core, "acme", WORKSPACE)
        config = write_config(root / "acme.toml", address=core.address, signing_key=core.host_key_path,
                              binding=binding_for("acme"))
        yield running, config
    finally:
        running.stop()


def _args(text: str, *, source: str | None = None, rule: str | None = None) -> dict[str, Any]:
    args = capture_args(unique("cap-key"), text)
    if source is not None:
        args["payload"]["citations"][0]["source_ref"] = source
    if rule is not None:
        args["payload"]["retention"] = {"derivative_rule": rule}
    return args


async def _remember(client, text: str, **kw: Any) -> str:
    cap = value_of(await client.call_tool("engram_memory_capture", _args(text, **kw)))
    adm = value_of(await client.call_tool("engram_memory_request_admission",
                                          {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")}))
    assert adm["outcome"]["status"] == "accepted", adm
    return adm["outcome"]["record_id"]


async def _forget(client, record_id: str) -> dict[str, Any]:
    return value_of(await client.call_tool("engram_memory_forget", {
        "record_id": record_id, "idempotency_key": unique("fgt"), "reason_ref": "reason:obsolete"}))


async def _search_ids(client, word: str) -> list[str]:
    """The hits that hold ``word``, best first. A record captured beside one of them in this
    host-bound session can come back too, lent a share of its score (docs/search.md,
    "Neighbours"), whenever the two texts' valid times (``capture_args``: a hash of the text over
    194 days) fall within the 2-hour link: rarely, but not never; it holds no word searched for."""
    found = value_of(await client.call_tool("engram_memory_search", {"query": word, "purpose_ref": PURPOSE}))
    return [r["record"]["record_id"] for r in found["records"] if word in json.dumps(r["record"])]


def _state(running, record_id: str) -> str:
    with running.core.store.read() as tx:
        return tx.record(Scope("acme", WORKSPACE), record_id).state


def _expected_coverage(running, record_id: str, cursor: str, rule: str, derivatives: list[dict[str, Any]],
                       postings: int) -> str:
    """The coverage receipt as the core must have made it, rebuilt from the journal."""
    return with_receipt_digest({
        "kind": "coverage", "record_id": record_id, "postings_removed": postings, "vectors_removed": True,
        "body_dropped": True, "key_destroyed": True, "tombstone_ledgered": True, "cursor": cursor,
        "derivative_rule": rule, "derivatives": derivatives,
    })["receipt_digest"]


async def test_forgetting_a_make_ineligible_source_makes_its_derivatives_ineligible(governed) -> None:
    running, config = governed
    word, dword, d2word = token("heron"), token("egret"), token("ibis")
    async with adapter_client(config, elicitation=approve) as client:
        source = await _remember(client, f"We deploy with {word} blue-green")
        derived = await _remember(client, f"Rollbacks take one minute {dword} thanks to blue-green", source=source)
        derived2 = await _remember(client, f"On-call runbook {d2word} relies on fast rollbacks", source=derived)
        unrelated = await _remember(client, f"Unrelated {dword}{d2word} note")
        with running.core.store.read() as tx:
            postings = tx.postings_count(source)
        assert await _search_ids(client, dword) == [derived]

        forgot = await _forget(client, source)

        assert forgot["projection_invalidation"] == "complete"
        for rid, word_ in ((derived, dword), (derived2, d2word)):
            assert _state(running, rid) == "trust_invalid"
            assert await _search_ids(client, word_) == []
            assert error_code(await client.call_tool(
                "engram_memory_get", {"record_id": rid, "purpose_ref": PURPOSE})) == "NOT_FOUND"
        assert _state(running, unrelated) == "accepted_current"
        tomb = int(forgot["receipt"]["cursor"])
        with running.core.store.read() as tx:
            events = [e for e in tx.events(Scope("acme", WORKSPACE), tomb + 1, None)]
        # Same transaction: the derivatives' events directly follow the tombstone event.
        assert [(e.cursor, e.operation, e.target, e.body["source"]) for e in events] == [
            (tomb + 1, "trust_invalidate", derived, source), (tomb + 2, "trust_invalidate", derived2, derived)]
        listed = [{"record_id": e.target, "source": e.body["source"], "from_state": "accepted_current",
                   "to_state": "trust_invalid", "cursor": str(e.cursor), "event_digest": e.event_digest}
                  for e in events]
        assert forgot["coverage_receipt_digest"] == _expected_coverage(
            running, source, str(tomb), "make-ineligible", listed, postings)


async def test_forgetting_a_retain_source_leaves_its_derivatives(governed) -> None:
    running, config = governed
    word, dword = token("plover"), token("curlew")
    async with adapter_client(config, elicitation=approve) as client:
        source = await _remember(client, f"Cache layer {word} uses LRU", rule="retain")
        derived = await _remember(client, f"Eviction metrics {dword} come from the LRU cache", source=source)
        with running.core.store.read() as tx:
            postings = tx.postings_count(source)
        forgot = await _forget(client, source)
        assert _state(running, derived) == "accepted_current"
        assert await _search_ids(client, dword) == [derived]
        assert forgot["coverage_receipt_digest"] == _expected_coverage(
            running, source, forgot["receipt"]["cursor"], "retain", [], postings)
