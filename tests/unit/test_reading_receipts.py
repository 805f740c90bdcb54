"""The read path's composed shortcuts give exactly what the plain construction gives (issue 63):
a redaction receipt's digest composed from shared parts, and the query expansion gathered per
word (same terms, same weights, same order)."""

from __future__ import annotations

import random

import pytest

from engram_core.contract.canonical import canonical, with_receipt_digest
from engram_core.services import lexical
from engram_core.services.ranking import Expansion
from engram_core.services.reading import Redaction, expanded_terms, hashed_relatives
from tools.bench.read_parts import plain_expansion  # the construction before, which the benchmark times too


@pytest.mark.parametrize("allow", [set(), {"/record_id"}, {"/record_id", "/payload", "/state", "/cursor"},
                                   {"/record_id", "/payload", "/record_digest", "/accepted_at", "/principal",
                                    "/agent_id", "/trust_class", "/payload_digest", "/candidate_id"}])
def test_a_redaction_receipt_is_the_plain_receipts_digest(allow: set[str]) -> None:
    red = Redaction(allow, "sha256:" + "ab" * 32)
    for record_id in ("rec_ABC234", "rec_" + "Z" * 52, 'odd"id\\é'):
        plain = with_receipt_digest({
            "kind": "redaction", "record_id": record_id, "allow_fields": canonical(sorted(allow)),
            "redacted_fields": canonical(red.omitted), "policy_receipt_digest": "sha256:" + "ab" * 32,
        })["receipt_digest"]
        assert red.receipt(record_id) == plain


def test_the_expansion_gathers_the_same_terms_in_the_same_order() -> None:
    hasher = lexical.TermHasher(b"k" * 32)
    relatives = hashed_relatives(hasher)
    words = ("cook bake make made prepare injured hurt wound break decide decision deploy release "
             "database schema migrate team meeting plan build test fix bug error crash what when 2024 "
             "caroline kubernetes pipeline the a of and run running ran walk walked").split()
    rnd = random.Random(63)
    queries = ["What did Caroline cook?", "what 2024", "", "cook cook made bake"]
    queries += [" ".join(rnd.choice(words) for _ in range(rnd.randint(1, 50))) for _ in range(60)]
    for query in queries:
        terms = hasher.query_terms(query)
        got = expanded_terms(Expansion(), relatives, query, terms)
        want = plain_expansion(Expansion(), relatives, query, terms)
        assert list(got.items()) == list(want.items()), query
