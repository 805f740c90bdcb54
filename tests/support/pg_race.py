"""A core of its own for the cross-process races of test_postgres_engine.py (run by
``multiprocessing`` with the spawn method: a fresh interpreter, its own pool and vault)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from engram_core.contract.scope import Scope
from engram_core.store.port import IdempotencyRow

T, W, P = "acme", "alpha", "user:ana"


def idempotent_effects(conninfo: str, key_dir: str, passfile: str, name: str, rounds: int, barrier: Any,
                       results: Any) -> None:
    """For each round: wait at the barrier with the other core, then apply the round's mutation
    under its idempotency key (an effect) unless the key is already there (a replay, as SPEC §7's
    guard does); report what happened in each round."""
    os.environ["PGPASSFILE"] = passfile
    from engram_core.store.kernel import StoreKernel
    from engram_core.store.postgres.engine import PostgresEngine
    from engram_core.store.postgres.keyvault import PgKeyVault

    engine = PostgresEngine(conninfo, pool_size=2)  # first: it migrates the schema the vault's tables are in
    vault = PgKeyVault(conninfo, Path(key_dir), pool_size=1)
    store = StoreKernel(engine, vault, spool_dir=None)
    outcome: list[str] = []
    try:
        for n in range(rounds):
            key = f"key-race-{n:04d}"
            row = IdempotencyRow("engram_memory_capture", f"cand_{n}", "sha256:" + "0" * 64,
                                 {"status": "committed_pending", "by": name})
            barrier.wait(60)
            with store.write(batched=True) as tx:
                prior = tx.idempotency_get(Scope(T, W), P, key)
                if prior is None:
                    tx.append_event(Scope(T, W), event_id=f"evt_{key}_{name}", operation="capture", target=key,
                                    from_state="", to_state="pending", at_ms=n, body={"by": name})
                    tx.idempotency_put(Scope(T, W), P, key, row, n)
            outcome.append("effect" if prior is None else "replay:" + str(prior.outcome["by"]))
    finally:
        store.close()
        vault.close()
    results.put((name, outcome))
