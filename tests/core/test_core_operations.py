"""The six operations end to end through the real gRPC server (SPEC §5–8)."""

from __future__ import annotations

import re

import pytest

from engram_core.contract.errors import Code
from tests.support.core_engines import EngineStores, one
from tests.support.core_support import PURPOSE, Client, capture_args, now_ms


def test_capture_admit_search_get_happy_path(ana: Client) -> None:
    cap = ana.capture("Decision: retries use exponential backoff with jitter, capped at 30 seconds.")
    assert cap["status"] == "committed_pending"
    assert cap["candidate_id"].startswith("cand_")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", cap["record_digest"])
    assert cap["cursor"].isdigit()
    adm = ana.admit(cap["candidate_id"])
    assert adm["replayed"] is False
    outcome = adm["outcome"]
    assert outcome["status"] == "accepted"
    assert re.fullmatch(r"mem_[a-z2-7]{52}", outcome["record_id"])
    assert int(outcome["cursor"]) == int(cap["cursor"]) + 1

    found = ana.search("exponential backoff jitter")
    ids = [p["record"]["record_id"] for p in found["records"]]
    assert outcome["record_id"] in ids
    top = found["records"][0]
    assert top["rank"] == 1 and 0 < top["score"] <= 1
    receipt = found["rank_receipt"]
    for field in ("request_digest", "authorization_receipt_digest", "profile", "profile_version",
                  "profile_config_digest", "valid_as_of", "system_as_of", "candidate_count", "ordered_ids_digest",
                  "revalidation_receipt_digest", "issued_at", "receipt_digest"):
        assert field in receipt, field
    assert receipt["profile"] == "offline_lexical_v5"

    got = ana.get(outcome["record_id"])
    assert got["record"]["record_id"] == outcome["record_id"]
    assert got["record"]["record_digest"] == cap["record_digest"]
    assert got["record"]["payload"]["components"][0]["text"].startswith("Decision: retries")
    assert got["read_receipt"]["record_id"] == outcome["record_id"]
    assert "/principal" in got["redacted_fields"] and "principal" not in got["record"]


def test_pending_candidate_is_not_searchable_or_readable(ana: Client) -> None:
    cap = ana.capture("Pending only: the zebra migration plan is drafted.")
    assert ana.search("zebra migration")["records"] == []
    assert ana.fails("get", {"record_id": "mem_" + "a" * 52, "purpose_ref": PURPOSE}) == Code.NOT_FOUND
    assert cap["candidate_id"] not in str(ana.search("zebra"))


def test_withdraw_with_confirmation(ana: Client) -> None:
    cap = ana.capture("Withdraw me: a note captured by mistake about quokkas.")
    args = {"candidate_id": cap["candidate_id"], "idempotency_key": "wd-" + cap["candidate_id"], "reason_ref": "reason:mistake"}
    out = ana.call("withdraw", args, grant=True)
    # Pending: the key is zeroed, but the KEK generation that wrapped it is still in the ring
    # (copies of the key files made meanwhile open it) until it retires.
    assert out["replayed"] is False and out["key_destruction"] == "pending"
    r = out["receipt"]
    assert (r["operation"], r["from_state"], r["to_state"]) == ("withdraw", "pending", "withdrawn")
    again = ana.call("withdraw", args, grant=True)
    assert again["replayed"] is True and again["receipt"] == r
    # admission of a withdrawn candidate is terminal
    assert ana.fails("request_admission", {"candidate_id": cap["candidate_id"], "idempotency_key": "adm-after-withdraw"}) \
        == Code.ALREADY_TERMINAL


def test_forget_tombstones_and_hides(ana: Client) -> None:
    rid = ana.remember("Forget me: the walrus service listens on port 7443.")
    assert any(p["record"]["record_id"] == rid for p in ana.search("walrus port")["records"])
    args = {"record_id": rid, "idempotency_key": "fg-" + rid[:40], "reason_ref": "reason:user-request"}
    out = ana.call("forget", args, grant=True)
    assert out["receipt"]["to_state"] == "tombstoned" and out["receipt"]["from_state"] == "accepted_current"
    assert out["projection_invalidation"] == "complete" and out["coverage_receipt_digest"].startswith("sha256:")
    assert ana.fails("get", {"record_id": rid, "purpose_ref": PURPOSE}) == Code.NOT_FOUND
    assert all(p["record"]["record_id"] != rid for p in ana.search("walrus port")["records"])
    assert ana.call("forget", args, grant=True)["replayed"] is True
    other = dict(args, idempotency_key="fg2-" + rid[:40])
    assert ana.fails("forget", other, grant=True) == Code.ALREADY_TERMINAL


def test_recapture_of_forgotten_content_goes_to_adjudication(ana: Client) -> None:
    text = "Forgotten content: the heron cluster uses rack 12."
    t = now_ms() - 120_000
    first = ana.call("capture", capture_args(text, t=t))
    rid = ana.admit(first["candidate_id"])["outcome"]["record_id"]
    ana.call("forget", {"record_id": rid, "idempotency_key": "fg-heron-0000001", "reason_ref": "r:x"}, grant=True)
    second = ana.call("capture", capture_args(text, t=t))
    assert second["status"] == "committed_pending"
    outcome = ana.admit(second["candidate_id"])["outcome"]
    assert outcome["status"] == "pending_adjudication" and "record_id" not in outcome


def test_capture_replay_and_digest_conflict(ana: Client) -> None:
    args = capture_args("Idempotent capture about the otter cache.", key="idem-key-otter-0001")
    first = ana.call("capture", args)
    replay = ana.call("capture", args)
    assert replay["status"] == "duplicate_exact"
    assert {k: v for k, v in replay.items() if k != "status"} == {k: v for k, v in first.items() if k != "status"}
    changed = capture_args("Different content, same key.", key="idem-key-otter-0001")
    assert ana.fails("capture", changed) == Code.DIGEST_CONFLICT
    # same key used by another tool is a conflict too
    assert ana.fails("request_admission", {"candidate_id": first["candidate_id"],
                                           "idempotency_key": "idem-key-otter-0001"}) == Code.DIGEST_CONFLICT


def test_admission_replay(ana: Client) -> None:
    cap = ana.capture("Admission replay about the lynx scheduler.")
    a1 = ana.admit(cap["candidate_id"], key="adm-lynx-000000001")
    a2 = ana.admit(cap["candidate_id"], key="adm-lynx-000000001")
    assert a2["replayed"] is True and a2["outcome"] == a1["outcome"]
    a3 = ana.admit(cap["candidate_id"], key="adm-lynx-000000002")
    assert a3["outcome"]["status"] == "duplicate_exact" and a3["outcome"]["record_id"] == a1["outcome"]["record_id"]


def test_secret_in_capture_is_refused_and_nothing_stored(ana: Client) -> None:
    before = ana.core.core.store.read
    with before() as tx:
        n = one(tx, "SELECT count(*) FROM candidates")[0]
    code = ana.fails("capture", capture_args("Deploy with AWS key AKIAIOSFODNN7EXAMPLE and go."))
    assert code == Code.UNAUTHORIZED
    with before() as tx:
        assert one(tx, "SELECT count(*) FROM candidates")[0] == n


def test_retain_needs_host_permission(ana: Client) -> None:
    args = capture_args("Retention request for the puffin notes.", retention={"derivative_rule": "retain"})
    assert ana.fails("capture", args) == Code.UNAUTHORIZED


def test_expires_at_must_be_after_capture(ana: Client) -> None:
    args = capture_args("Expiry in the past.", retention={"expires_at": "2020-01-01T00:00:00.000Z"})
    assert ana.fails("capture", args) == Code.INVALID_SCHEMA
    far = capture_args("Expiry beyond the cap.", retention={"expires_at": "2999-01-01T00:00:00.000Z"})
    assert ana.fails("capture", far) == Code.UNAUTHORIZED


def test_unconsented_family_is_unauthorized(ana: Client) -> None:
    args = capture_args("Family consent.", reconciliation={"family_refs": ["family:unknown"]})
    assert ana.fails("capture", args) == Code.UNAUTHORIZED


def test_expired_record_is_ineligible_from_expires_at(ana: Client) -> None:
    from datetime import UTC, datetime

    soon = now_ms() + 1500
    iso = datetime.fromtimestamp(soon / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{soon % 1000:03d}Z"
    cap = ana.call("capture", capture_args("Short-lived note about the ibis deploy.", retention={"expires_at": iso}))
    rid = ana.admit(cap["candidate_id"])["outcome"]["record_id"]
    assert ana.get(rid)["record"]["record_id"] == rid
    import time

    time.sleep(max(0, (soon - now_ms()) / 1000) + 0.05)
    assert ana.fails("get", {"record_id": rid, "purpose_ref": PURPOSE}) == Code.NOT_FOUND
    assert all(p["record"]["record_id"] != rid for p in ana.search("ibis deploy")["records"])


@pytest.mark.parametrize("query", ["", "x" * 8193])
def test_search_query_bounds(ana: Client, query: str) -> None:
    assert ana.fails("search", {"query": query, "purpose_ref": PURPOSE}) == Code.INVALID_SCHEMA


def test_limit_and_paging(ana: Client) -> None:
    ids = {ana.remember(f"Paging note {i}: the condor pipeline stage {i} is idempotent.") for i in range(5)}
    seen: list[str] = []
    page = ana.search("condor pipeline", limit=2)
    while True:
        seen += [p["record"]["record_id"] for p in page["records"]]
        if "next_page_cursor" not in page:
            break
        page = ana.search("condor pipeline", limit=2, page_cursor=page["next_page_cursor"])
    assert len(seen) == len(set(seen)) and ids <= set(seen)
    first = ana.search("condor pipeline", limit=2)
    cursor = first["next_page_cursor"]
    tampered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
    assert ana.fails("search", {"query": "condor pipeline", "purpose_ref": PURPOSE, "limit": 2,
                                "page_cursor": tampered}) == Code.STALE_PAGE
    assert ana.fails("search", {"query": "other query", "purpose_ref": PURPOSE, "limit": 2,
                                "page_cursor": cursor}) == Code.STALE_PAGE


def test_search_is_deterministic(ana: Client) -> None:
    ana.remember("Determinism: the kestrel queue drains in FIFO order.")
    a, b = ana.search("kestrel queue"), ana.search("kestrel queue")
    assert [p["record"]["record_id"] for p in a["records"]] == [p["record"]["record_id"] for p in b["records"]]
    assert a["rank_receipt"]["ordered_ids_digest"] == b["rank_receipt"]["ordered_ids_digest"]


def test_semantic_channel_unavailable_is_an_error_not_a_fallback(stores: EngineStores, tmp_path) -> None:
    from tests.support.core_support import activate

    running = stores.start_core(tmp_path / "lexical-only", semantic=False)
    try:
        activate(running)
        c = Client(running)
        c.remember("Channel selection: the grebe cache is warm.")
        code = c.fails("search", {"query": "grebe cache", "purpose_ref": PURPOSE,
                                  "capability_policy": {"minimum_channels": "lexical_and_semantic",
                                                        "network": "forbid"}})
        assert code == Code.RANKING_UNAVAILABLE
        assert c.search("grebe cache")["rank_receipt"]["profile"] == "offline_lexical_v5"
    finally:
        running.stop()


def test_packet_limits(ana: Client) -> None:
    rid = ana.remember("Big record: " + "the albatross payload is large. " * 400)
    assert ana.fails("get", {"record_id": rid, "purpose_ref": PURPOSE, "max_packet_bytes": 4096}) == Code.PROJECTION_OVERSIZED
    assert ana.fails("search", {"query": "albatross payload", "purpose_ref": PURPOSE, "max_packet_bytes": 4096}) \
        == Code.PROJECTION_OVERSIZED
