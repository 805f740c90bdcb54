"""Packet limits (SPEC §5) and redaction by policy (SPEC §9, §12 of the brief: allow-list by omission)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.app.composition import RunningCore, default_policies_dir
from engram_core.contract.errors import Code
from tests.support.core_engines import EngineStores
from tests.support.search_support import Client, activate

NARROW = "purpose:audit-narrow"
NARROW_FIELDS = ["/payload_digest", "/record_id", "/state"]


def test_page_over_max_packet_bytes_is_result_too_large(ana: Client) -> None:
    for i in range(4):
        ana.remember(f"Albatross design note {i}: " + "wing " * 250)
    assert len(ana.ids("albatross", limit=4, max_packet_bytes=65_536)) == 4
    assert ana.fails("search", ana.search_args("albatross", limit=4, max_packet_bytes=4_096)) == Code.RESULT_TOO_LARGE
    assert len(ana.ids("albatross", limit=1, max_packet_bytes=4_096)) == 1


def test_one_record_over_max_packet_bytes_is_projection_oversized(ana: Client) -> None:
    rid = ana.remember("Petrel specification: " + "spec " * 1_200)
    args = ana.search_args("petrel", max_packet_bytes=4_096)
    assert ana.fails("search", args) == Code.PROJECTION_OVERSIZED
    assert ana.fails("get", {"record_id": rid, "purpose_ref": ana.purpose_ref, "max_packet_bytes": 4_096}) \
        == Code.PROJECTION_OVERSIZED
    assert ana.ids("petrel", max_packet_bytes=16_384) == [rid]


@pytest.mark.parametrize("bad", [{"limit": 0}, {"limit": 51}, {"max_packet_bytes": 4_095},
                                 {"max_packet_bytes": 1_048_577}])
def test_limit_and_packet_bounds(ana: Client, bad: dict) -> None:
    assert ana.fails("search", ana.search_args("anything", **bad)) == Code.INVALID_SCHEMA


def test_limit_bounds_the_page(ana: Client) -> None:
    for i in range(6):
        ana.remember(f"Gannet fact {i}.")
    assert len(ana.ids("gannet", limit=5)) == 5
    assert len(ana.ids("gannet", limit=50)) == 6


@pytest.fixture(scope="module")
def narrow_core(tmp_path_factory: pytest.TempPathFactory, module_stores: EngineStores) -> Iterator[RunningCore]:
    root = tmp_path_factory.mktemp("redaction")
    bundle = root / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    data = json.loads((bundle / "data.json").read_text())
    data["engram"]["config"]["redaction"]["purposes"] = {
        NARROW: {"allow_fields": NARROW_FIELDS, "max_packet_bytes": 8_192}}
    (bundle / "data.json").write_text(json.dumps(data))
    running = module_stores.start_core(root / "data", policies_dir=bundle, semantic=False)
    activate(running)
    yield running
    running.stop()


def test_redaction_omits_fields_outside_the_purpose_allow_list(narrow_core: RunningCore) -> None:
    wide, narrow = Client(narrow_core), Client(narrow_core, purpose_ref=NARROW)
    rid = narrow.remember("The skua cache is warmed at boot.")
    w, n = wide.search("skua")["records"][0], narrow.search("skua")["records"][0]
    assert set(n["record"]) == {"payload_digest", "record_id", "state"}
    assert n["redacted_fields"] == ["/accepted_at", "/agent_id", "/candidate_id", "/cursor", "/payload",
                                    "/principal", "/record_digest", "/trust_class"]
    assert "payload" in w["record"] and w["redacted_fields"] == ["/agent_id", "/candidate_id", "/principal"]
    assert n["redaction_receipt_digest"] != w["redaction_receipt_digest"]
    got = narrow.get(rid)
    assert set(got["record"]) == {"payload_digest", "record_id", "state"}
    assert got["redacted_fields"] == n["redacted_fields"]
    # The receipt binds the redaction decision of each call, so get and search receipts differ.
    assert got["redaction_receipt_digest"].startswith("sha256:")


def test_policy_packet_cap_applies_below_the_requested_size(narrow_core: RunningCore) -> None:
    narrow = Client(narrow_core, purpose_ref=NARROW)
    for i in range(40):
        narrow.remember(f"Fulmar item {i}.")
    # Requested 1 MiB, the purpose caps packets at 8 KiB: 40 small records do not fit.
    args = narrow.search_args("fulmar", limit=40, max_packet_bytes=1_048_576)
    assert narrow.fails("search", args) == Code.RESULT_TOO_LARGE
    assert len(narrow.ids("fulmar", limit=5)) == 5


def test_record_id_is_always_present(narrow_core: RunningCore, tmp_path: Path) -> None:
    narrow = Client(narrow_core, purpose_ref=NARROW)
    narrow.remember("Kittiwake notes.")
    assert all("record_id" in p["record"] for p in narrow.search("kittiwake")["records"])
