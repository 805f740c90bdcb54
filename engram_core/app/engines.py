"""Which storage engine keeps a store, chosen from configuration (docs/architecture.md).

``engram serve --data DIR`` means the DuckDB engine with its file in DIR. An engine is a name in
``ENGINES`` and a function that opens it; a store URL (``--store postgresql://…``, the
scale-out step) selects the engine registered under its scheme. Adding an engine is one entry
here and its subpackage under ``engram_core/store/``; nothing else names an engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engram_core.crypto.keyvault import KeyVault
from engram_core.store.port import Store

DEFAULT_ENGINE = "duckdb"


@dataclass(frozen=True)
class StoreConfig:
    """Where a core's store lives and which engine keeps it.

    ``data_dir`` is the core's own directory (host key, key vault, audit spool, secrets) and,
    for the default engine, where its database file lives. ``url`` names a store kept
    elsewhere; its scheme is the engine (``postgresql://…`` → ``"postgresql"``)."""

    data_dir: Path
    engine: str = DEFAULT_ENGINE
    url: str | None = None

    @classmethod
    def from_options(cls, data_dir: Path, store_url: str | None = None) -> StoreConfig:
        """The configuration ``--data DIR [--store URL]`` describes. ValueError when the URL
        names no engine this build has (the message names the ones it has)."""
        if store_url is None:
            return cls(data_dir=data_dir)
        engine = urlsplit(store_url).scheme
        if engine not in ENGINES:
            raise ValueError(f"no store engine for {engine or store_url!r} in this build "
                             f"(engines: {', '.join(sorted(ENGINES))})")
        return cls(data_dir=data_dir, engine=engine, url=store_url)


# Opens the engine's store: (config, key vault, build the search index now, audit devices) -> Store.
EngineOpener = Callable[[StoreConfig, KeyVault, bool, Any], Store]


def _open_duckdb(config: StoreConfig, vault: KeyVault, load_index: bool, audit_devices: Any) -> Store:
    from engram_core.store.duckdb.engine import DuckDBEngine
    from engram_core.store.kernel import StoreKernel

    # Search projections are sealed under record keys: the kernel and the engine's migration 6 need the vault.
    store = StoreKernel(DuckDBEngine(config.data_dir, keys=vault), vault, spool_dir=config.data_dir,
                        load_index=load_index)
    if audit_devices is not None:
        store.attach_audit_devices(audit_devices)
    return store


ENGINES: dict[str, EngineOpener] = {DEFAULT_ENGINE: _open_duckdb}


def open_store(config: StoreConfig, *, vault: KeyVault, load_index: bool = True, audit_devices: Any = None) -> Store:
    """The store ``config`` names, opened by its engine (fenced, migrated; the search index
    built unless ``load_index`` is False, in which case the server builds it after it listens)."""
    return ENGINES[config.engine](config, vault, load_index, audit_devices)
