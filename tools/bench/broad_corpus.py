"""The search shapes agents really send (issue 63): a corpus where a query matches thousands.

Every record is an engineering decision naming six of 27 common engineering words (``WORDS``),
so a two-word query of those words (``broad``) matches about two records in five; ``long`` is a
capture's whole text (decision and context) as the query, what the content gate's duplicate
check asks; ``narrow`` is two mid-frequency tags of the Zipf vocabulary (a few dozen records).
The peer (``peer_item``) holds the same texts as the measured scope, so a long query finds its
record there too. Same seed, same corpus, same queries.
"""

from __future__ import annotations

import random
from pathlib import Path

from tools.bench.corpus import COMPONENTS, CONTEXT, REASONS, TEAMS, TECH, Corpus

TENANT, WORKSPACE = "bench", "main"
SALT = f"{TENANT}.{WORKSPACE}"  # what loader.load_scope salts the scope's texts with
WORDS = ["cache", "retry", "shard", "ledger", "replica", "policy", "queue", "index", "timeout", "lock", "batch",
         "schema", "token", "session", "quorum", "backoff", "snapshot", "partition", "failover", "checksum",
         "throttle", "migration", "rollback", "lease", "journal", "compaction", "tombstone"]
SHAPES = ("broad", "long", "narrow")


class BroadCorpus(Corpus):
    def text(self, scope_salt: str, i: int) -> tuple[str, str]:
        rnd = random.Random(f"{self.seed}/broad/{scope_salt}/{i}")
        team, tech, t2 = rnd.choice(TEAMS), rnd.choice(TECH), rnd.choice(TECH)
        w = rnd.sample(WORDS, 6)
        ids = self._ident(rnd, rnd.randint(2, 4))
        decision = (f"The {team} team settled the {w[0]} and the {w[1]} of the {rnd.choice(COMPONENTS)} on {tech}: "
                    f"its {w[2]} moves behind the {w[3]}, the {w[4]} keeps its {w[5]}, because "
                    f"{rnd.choice(REASONS)}. Tags: {' '.join(ids)} rec{scope_salt}x{i}.")
        context = rnd.choice(CONTEXT).format(t2=t2, team=team, ident=self._ident(rnd, 1)[0])
        return decision, context

    def peer_item(self, i: int) -> tuple[str, str, str]:
        decision, context = self.text(SALT, i)
        return f"memory-{i:07d}", "decision", f"{decision} {context}"

    def shape_queries(self, shape: str, n: int, records: int, seed: int = 63) -> list[str]:
        rnd = random.Random(f"{self.seed}/broadq/{shape}/{seed}")
        out = []
        for _ in range(n):
            if shape == "broad":
                out.append(" ".join(rnd.sample(WORDS, 2)))
            elif shape == "long":
                decision, context = self.text(SALT, rnd.randrange(records))
                out.append(f"{decision} {context}")
            elif shape == "narrow":
                out.append(" ".join(rnd.choice(self.words[100:1500]) for _ in range(2)))
            else:
                raise ValueError(shape)
        return out


def load(data: Path, records: int, *, progress: bool = True) -> None:
    """``records`` accepted records of the broad corpus in one scope (tools/bench/loader.py)."""
    from engram_core.app.composition import open_core
    from tools.bench.loader import Progress, activate_scope, load_scope

    core, _, _ = open_core(data, semantic=False)
    try:
        activate_scope(core, TENANT, WORKSPACE)
        load_scope(core, BroadCorpus(), TENANT, WORKSPACE, records, embed=False,
                   progress=Progress(records, f"loading {records:,} broad", enabled=progress))
        core.store.checkpoint()
    finally:
        core.close()
    (data / "broad-records").write_text(str(records))  # long queries are texts of records 0..N-1
