"""Negative lookups without a database read (store/key_digests.py): no false negatives, ever —
across merges under concurrent readers, and across a reopen, where the digests come from DuckDB's
``md5_number_upper`` and must equal Python's for any UTF-8 key."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.store import key_digests
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.key_digests import KeyDigests
from engram_core.store.port import IdempotencyRow

KEYS = ["idempotency-key-0001", "ключ-ünïcode-ключ-0002", "emoji-🔑-key-000003", "a\tb\nc-key-0000004"]


def test_added_keys_are_found_through_merges_while_readers_look(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(key_digests, "MERGE_AT", 64)
    digests = KeyDigests()
    added: list[str] = []
    missed: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            for k in list(added):
                if not digests.may_contain("t", "w", k):
                    missed.append(k)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(3000):
        digests.add("t", "w", f"key-{i}")
        added.append(f"key-{i}")
    stop.set()
    for t in threads:
        t.join()
    assert missed == []
    assert len(digests) == 3000
    assert not digests.may_contain("t", "w", "never-added")
    assert not digests.may_contain("t", "other", "key-1")  # parts are kept apart


def test_a_reopened_store_finds_every_key_and_payload_it_holds(tmp_path: Path) -> None:
    store = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    row = IdempotencyRow("engram_memory_capture", "cand_1", "sha256:" + "0" * 64, {"status": "committed_pending"})
    with store.write(batched=True) as tx:
        for k in KEYS:
            tx.idempotency_put(Scope("acme", "alpha"), "user:ana", k, row, 1)
        tx.add_tombstone(Scope("acme", "alpha"), "sha256:" + "5" * 64, "mem_x", 1, 1)
    store.close()
    reopened = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    try:
        for k in KEYS:  # the digests now come from DuckDB: they must agree with Python's
            assert reopened.engine.idempotency_keys.may_contain("acme", "alpha", "user:ana", k)
        with reopened.read() as tx:
            assert all(tx.idempotency_get(Scope("acme", "alpha"), "user:ana", k) == row for k in KEYS)
            assert tx.idempotency_get(Scope("acme", "alpha"), "user:bob", KEYS[0]) is None
            assert tx.payload_standing(Scope("acme", "alpha"), "sha256:" + "5" * 64) == (None, True)
            assert tx.payload_standing(Scope("acme", "beta"), "sha256:" + "5" * 64) == (None, False)
    finally:
        reopened.close()


def test_a_used_confirmation_stays_used_across_a_reopen(tmp_path: Path) -> None:
    """A grant is single use (SPEC §8): 'never used' is answered from memory, so the digests
    a reopened store loads must refuse every grant spent before (an attacker replaying one
    after a restart), in a batched and in an exclusive transaction alike."""
    grants = ["grant_" + k for k in KEYS]
    store = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    with store.write(batched=True) as tx:
        assert all(tx.use_confirmation(g, Scope("acme", "alpha"), 1) for g in grants)
    with store.write() as tx:
        assert not any(tx.use_confirmation(g, Scope("acme", "alpha"), 2) for g in grants)  # same process
    store.close()
    reopened = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    try:
        assert all(reopened.engine.used_grants.may_contain(g) for g in grants)
        with reopened.write(batched=True) as tx:
            assert not any(tx.use_confirmation(g, Scope("acme", "alpha"), 3) for g in grants)
            assert tx.use_confirmation("grant_fresh_after_reopen", Scope("acme", "alpha"), 3)
        with reopened.write() as tx:
            assert not tx.use_confirmation("grant_fresh_after_reopen", Scope("acme", "alpha"), 4)
    finally:
        reopened.close()
