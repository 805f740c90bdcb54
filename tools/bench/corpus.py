"""Deterministic synthetic memories and queries for the benchmark.

Records read like engineering decisions (so the semantic channel has meaning to
work with) and carry identifiers drawn from a Zipf-distributed pseudo-word
vocabulary (so lexical document frequencies spread the way real corpora do:
a few very common terms, a long tail of rare ones). Same seed, same corpus.
"""

from __future__ import annotations

import random
from typing import Any

PURPOSE = "purpose:engineering-notes"
T0_MS = 1_700_000_000_000  # valid times spread over ~2 years after this instant
DAY_MS = 86_400_000

TEAMS = ["payments", "search", "infra", "mobile", "data", "identity", "billing", "growth", "platform", "security"]
VERBS = ["move", "migrate", "cache", "shard", "replicate", "rate-limit", "retry", "batch", "compress", "index",
         "partition", "deprecate", "encrypt", "throttle", "pin", "vendor", "split", "merge", "queue", "archive"]
COMPONENTS = ["ledger service", "session store", "search index", "checkout api", "event bus", "audit log",
              "feature flags", "user profiles", "invoice renderer", "push gateway", "report builder",
              "token issuer", "webhook relay", "image pipeline", "metrics store", "job scheduler",
              "config service", "notification fanout", "fraud scorer", "export worker"]
TECH = ["postgres", "duckdb", "redis", "kafka", "cassandra", "sqlite", "s3", "nats", "clickhouse", "elasticsearch",
        "grpc", "graphql", "rust", "go", "python", "kotlin", "envoy", "nginx", "terraform", "kubernetes"]
REASONS = ["latency doubled under load", "the vendor contract ended", "costs grew faster than traffic",
           "a load test failed at peak", "on-call pages were too frequent", "the schema kept drifting",
           "we needed exactly-once delivery", "the audit team asked for immutability",
           "cold starts hurt mobile users", "replication lag broke reads", "the old client leaked memory",
           "compliance required regional storage", "tail latency hurt checkout", "backfills took days"]
CONTEXT = ["Alternatives considered: {t2} was rejected after a spike.", "Owner: {team} team; revisit next quarter.",
           "Rollout behind a flag, one region first.", "Measured before and after with the same dashboard.",
           "The previous attempt used {t2} and was rolled back.", "Follow-up work is tracked in {ident}."]
_SYLL = ["ka", "lo", "mi", "ra", "ve", "zu", "to", "pe", "ni", "sa", "qu", "do", "fe", "gi", "bo", "xe", "ju", "wa"]


def vocabulary(size: int = 8000, seed: int = 7) -> list[str]:
    rnd = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < size:
        w = "".join(rnd.choice(_SYLL) for _ in range(rnd.randint(2, 4))) + str(rnd.randint(0, 99))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


class Corpus:
    def __init__(self, seed: int = 20261201) -> None:
        self.seed = seed
        self.words = vocabulary()
        self._weights = [1.0 / (i + 1) for i in range(len(self.words))]

    def _ident(self, rnd: random.Random, k: int) -> list[str]:
        return rnd.choices(self.words, weights=self._weights, k=k)

    def text(self, scope_salt: str, i: int) -> tuple[str, str]:
        """(decision text, context text) of the i-th memory in a scope."""
        rnd = random.Random(f"{self.seed}/{scope_salt}/{i}")
        team, tech, t2 = rnd.choice(TEAMS), rnd.choice(TECH), rnd.choice(TECH)
        ids = self._ident(rnd, rnd.randint(4, 10))
        decision = (f"The {team} team decided to {rnd.choice(VERBS)} the {rnd.choice(COMPONENTS)} to {tech} "
                    f"because {rnd.choice(REASONS)}. Tags: {' '.join(ids)} rec{scope_salt}x{i}.")
        context = rnd.choice(CONTEXT).format(t2=t2, team=team, ident=self._ident(rnd, 1)[0])
        return decision, context

    def capture_args(self, scope_salt: str, i: int, *, key: str | None = None) -> dict[str, Any]:
        decision, context = self.text(scope_salt, i)
        t = T0_MS + (i * 7919 % 730) * DAY_MS
        src = f"ticket:{scope_salt.upper()}-{i}"
        payload = {
            "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": t},
            "components": [
                {"component_id": "c1", "kind": "decision", "text": decision, "citation_ids": ["cit1"]},
                {"component_id": "c2", "kind": "context", "text": context, "citation_ids": ["cit1"]},
            ],
            "primary_component_id": "c1",
            "primary_event": {"at": t, "type_ref": "event:decision", "citation_id": "cit1"},
            "citations": [{"citation_id": "cit1", "source_ref": src,
                           "locator": {"scheme": "path", "value": f"docs/adr/{i}.md"},
                           "content_digest": "sha256:" + "a" * 64}],
        }
        return {
            "idempotency_key": key or f"bench-cap-{scope_salt}-{i:08d}",
            "payload": payload,
            "evidence": {"evidence_ref": f"ev:{i}", "evidence_digest": "sha256:" + "b" * 64, "citation_ids": ["cit1"]},
        }

    def queries(self, n: int, seed: int = 11) -> list[str]:
        """Agent-like queries: a component or technology plus one or two tags (mid-frequency words)."""
        rnd = random.Random(f"{self.seed}/q/{seed}")
        out = []
        for _ in range(n):
            tags = " ".join(rnd.choice(self.words[20:2000]) for _ in range(rnd.randint(1, 2)))
            out.append(rnd.choice([f"{rnd.choice(COMPONENTS)} {rnd.choice(TECH)} {tags}",
                                   f"why {rnd.choice(VERBS)} {rnd.choice(COMPONENTS)}",
                                   f"{rnd.choice(TECH)} {tags}"]))
        return out

    def peer_item(self, i: int) -> tuple[str, str, str]:
        """(entity name, entity type, observation) for the peer server: the same text."""
        decision, context = self.text("peer", i)
        return f"memory-{i:07d}", "decision", f"{decision} {context}"
