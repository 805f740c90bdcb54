"""Ranking determinism, rank receipts, and channel selection (SPEC §5, §11)."""

from __future__ import annotations

import pytest

from engram_core.contract.errors import Code
from engram_core.rpc.server import RunningCore
from engram_core.services.lexical import ANALYZER_ID
from engram_core.services.ranking import (
    OFFLINE_LEXICAL_V2,
    OFFLINE_LEXICAL_V3,
    OFFLINE_LEXICAL_V4,
    OFFLINE_LEXICAL_V5,
)
from tests.support.search_support import SEMANTIC, Client, activate

RECEIPT_FIELDS = {"request_digest", "authorization_receipt_digest", "profile", "profile_version",
                  "profile_config_digest", "valid_as_of", "system_as_of", "candidate_count", "ordered_ids_digest",
                  "revalidation_receipt_digest", "issued_at", "receipt_digest"}


@pytest.fixture(scope="module")
def lanterns(core: RunningCore) -> list[str]:
    ana = Client(core)
    texts = ["The lantern service caches tiles for 10 minutes.",
             "Lantern deploys go through the canary pipeline.",
             "We chose gRPC for lantern because of streaming.",
             "Lantern lantern lantern: the on-call rota is weekly.",
             "The map renderer is unrelated to anything else."]
    return [ana.remember(t) for t in texts]


@pytest.mark.parametrize("channels", [{}, {"capability_policy": SEMANTIC}], ids=["lexical", "semantic"])
def test_same_query_same_snapshot_gives_same_order_scores_and_digests(request: pytest.FixtureRequest, stores,
                                                                       channels: dict) -> None:
    # ``stores`` named here runs it on each engine leg; the core has the semantic channel only when asked
    running, clock = request.getfixturevalue("semantic_clocked" if channels else "clocked")
    # tools/setup installs the semantic extra: its absence is a broken set-up, not a reason to skip
    assert not channels or running.core.embedder is not None, "the 'semantic' extra is missing: run tools/setup"
    ana = Client(running, clock=clock)
    for text in ("The lantern service caches tiles.", "Lantern deploys use canaries.", "Lantern lantern rota.",
                 "We chose gRPC for lantern.", "Unrelated map renderer."):
        ana.remember(text)
    first, second = ana.search("lantern", **channels), ana.search("lantern", **channels)
    strip = [(p["record"]["record_id"], p["score"], p["rank"]) for p in first["records"]]
    assert strip == [(p["record"]["record_id"], p["score"], p["rank"]) for p in second["records"]]
    assert first["rank_receipt"]["ordered_ids_digest"] == second["rank_receipt"]["ordered_ids_digest"]
    for key in ("profile_config_digest", "request_digest", "system_as_of", "valid_as_of", "candidate_count"):
        assert first["rank_receipt"][key] == second["rank_receipt"][key]
    assert [p["rank"] for p in first["records"]] == list(range(1, len(first["records"]) + 1))
    scores = [p["score"] for p in first["records"]]
    assert scores == sorted(scores, reverse=True)


def test_rank_receipt_binds_every_contract_field(ana: Client, lanterns: list[str]) -> None:
    res = ana.search("lantern")
    receipt = res["rank_receipt"]
    assert set(receipt) == RECEIPT_FIELDS
    assert receipt["profile"] == "offline_lexical_v5" and receipt["profile_version"] == "5"
    assert receipt["profile_config_digest"] == OFFLINE_LEXICAL_V5.config_digest()
    # Each version pins its neighbours and its expansion in the digest: a receipt or cursor of
    # another never passes.
    digests = {p.config_digest() for p in (OFFLINE_LEXICAL_V2, OFFLINE_LEXICAL_V3, OFFLINE_LEXICAL_V4,
                                           OFFLINE_LEXICAL_V5)}
    assert len(digests) == 4
    assert OFFLINE_LEXICAL_V3.config()["neighbours"]["span"] == 3
    assert "session" not in OFFLINE_LEXICAL_V3.config()["neighbours"]
    assert OFFLINE_LEXICAL_V4.config()["neighbours"]["session"]["window_ms"] == 2 * 3_600_000
    # Only lexical hits are candidates (SPEC §11): each note was captured in a session of its own.
    assert receipt["candidate_count"] == 4
    assert res["response_digest"].startswith("sha256:") and len(res["response_digest"]) == 71
    assert lanterns[4] not in [p["record"]["record_id"] for p in res["records"]]


def test_top_lexical_hit_scores_best_normalized(ana: Client, lanterns: list[str]) -> None:
    res = ana.search("lantern")
    # 0.85 * 1.0 (best lexical) + 0.15 * recency(≈1 for a minute-old record)
    assert 0.99 < res["records"][0]["score"] <= 1.0


def test_semantic_profile_finds_paraphrases_lexical_cannot(ana: Client) -> None:
    rid = ana.remember("Release trains for the kestrel portal leave every second Thursday.")
    lexical = ana.ids("how often do we ship new versions")
    semantic = ana.search("how often do we ship new versions of the kestrel portal", capability_policy=SEMANTIC)
    assert rid not in lexical
    assert rid in [p["record"]["record_id"] for p in semantic["records"]]
    receipt = semantic["rank_receipt"]
    assert receipt["profile"] == "semantic_v6"
    assert receipt["profile_config_digest"] != OFFLINE_LEXICAL_V5.config_digest()


def test_semantic_profile_adds_vector_hits_without_any_shared_word(ana: Client) -> None:
    rid = ana.remember("Our quarterly budget for cloud compute was cut by a fifth.")
    res = ana.search("reduced spending on servers", capability_policy=SEMANTIC)
    assert rid in [p["record"]["record_id"] for p in res["records"]]


def test_semantic_channel_missing_is_ranking_unavailable_not_a_fallback(lexical_core: RunningCore) -> None:
    bob = Client(lexical_core)
    bob.remember("The osprey queue drains nightly.")
    assert bob.ids("osprey")  # lexical works
    args = bob.search_args("osprey", capability_policy=SEMANTIC)
    assert bob.fails("search", args) == Code.RANKING_UNAVAILABLE
    args = bob.search_args("osprey", capability_policy={**SEMANTIC, "network": "allow"})
    assert bob.fails("search", args) == Code.RANKING_UNAVAILABLE


def test_embedder_that_needs_the_network_is_unavailable_under_forbid(core: RunningCore) -> None:
    from engram_core.services.reading import ReadService

    class NetworkEmbedder:
        model_id, dimensions, needs_network = "remote-model", 3, True

    core.core.embedder, saved = NetworkEmbedder(), core.core.embedder
    try:
        svc = ReadService(core.core)
    finally:
        core.core.embedder = saved
    with pytest.raises(Exception) as err:
        svc._profile_for({"capability_policy": SEMANTIC})
    assert getattr(err.value, "code", None) == Code.RANKING_UNAVAILABLE
    assert svc._profile_for({"capability_policy": {**SEMANTIC, "network": "allow"}}).name == "semantic_v6"
    assert svc._profile_for({}).name == "offline_lexical_v5"


def test_profile_config_pins_tokenizer_model_and_fusion(core: RunningCore) -> None:
    from engram_core.services.reading import ReadService

    cfg = ReadService(core.core).profiles["semantic"].config()
    assert cfg["analyzer"] == ANALYZER_ID and cfg["semantic"]["model_id"].startswith("all-MiniLM-L6-v2-onnx-dynamic-int8@sha256:9e80251537633bab+")
    assert cfg["semantic"]["k"] == 1 and cfg["semantic"]["fusion"] == "weighted_rrf"
    assert cfg["recency"] == {"half_life_ms": 30 * 86_400_000, "weight": "0.15"}
    assert cfg["field_weights"] == {"citations": "0.5", "context": "1.0", "decision": "2.0", "evidence": "1.5",
                                    "primary": "3.0"}


def test_score_says_how_much_of_the_query_the_best_hit_holds(lexical_core: RunningCore) -> None:
    # Issue 17: the best hit always scored 1.000, so "nothing relevant" looked like a match.
    activate(lexical_core, workspace="relevance")
    bob = Client(lexical_core, workspace="relevance")
    heron = bob.remember("The heron pipeline drains the billing queue nightly.")
    bob.remember("Heron dashboards live in the shared folder.")
    bob.remember("The billing queue is sharded by tenant.")
    whole = bob.search("heron pipeline nightly")["records"]
    assert whole[0]["record"]["record_id"] == heron and whole[0]["score"] > 0.8
    partial = bob.search("heron kubernetes zeppelin rollout")["records"]
    assert partial and partial[0]["score"] < 0.5  # found, but most of the query is in no record
    # one factor per search: order and paging unchanged, later pages scaled alike
    pages = []
    page = bob.search("heron billing queue", limit=1)
    while True:
        pages += [p["score"] for p in page["records"]]
        if "next_page_cursor" not in page:
            break
        page = bob.search("heron billing queue", limit=1, page_cursor=page["next_page_cursor"])
    assert len(pages) == 3 and pages == sorted(pages, reverse=True)
    again = [p["score"] for p in bob.search("heron billing queue")["records"]]  # a later valid_as_of: recency moves
    assert all(abs(a - b) < 1e-6 for a, b in zip(pages, again, strict=True))


def test_semantic_score_is_the_stronger_evidence(ana: Client) -> None:
    ana.remember("Our yearly budget for cloud compute was reduced by a fifth.")
    related = ana.search("reduced spending on servers", capability_policy=SEMANTIC)["records"]
    unrelated = ana.search("zebra migration patterns in the serengeti", capability_policy=SEMANTIC)["records"]
    top_unrelated = unrelated[0]["score"] if unrelated else 0.0
    assert related and related[0]["score"] > top_unrelated
