"""The in-memory engine (``engram_core/store/memory``) as a core opens it: ``--store memory://``
selects it through the engine registry, and what it holds lives as long as the core (no
durability: a core opened again starts empty). Its conformance is test_store_conformance.py's."""

from __future__ import annotations

from pathlib import Path

from engram_core.app.composition import open_core
from engram_core.app.engines import StoreConfig
from engram_core.contract.scope import Scope


def test_a_memory_store_url_opens_the_in_memory_engine_and_keeps_nothing_past_the_core(tmp_path: Path) -> None:
    assert StoreConfig.from_options(tmp_path, "memory://").engine == "memory"
    core, _, _ = open_core(tmp_path / "data", semantic=False, store_url="memory://")
    try:
        assert core.store.describe()["engine"] == "memory"
        assert core.store.capabilities.sole_writer and not core.store.capabilities.spools_audit
        with core.store.write() as tx:
            tx.set_activation(Scope("acme", "alpha"), activated=True, tools=("engram_memory_search",))
        with core.store.read() as tx:
            row = tx.scope(Scope("acme", "alpha"))
        assert row is not None and row.activated and row.tools == ("engram_memory_search",)
    finally:
        core.close()
    again, _, _ = open_core(tmp_path / "data", semantic=False, store_url="memory://")
    try:
        with again.store.read() as tx:
            assert tx.scope(Scope("acme", "alpha")) is None
    finally:
        again.close()
