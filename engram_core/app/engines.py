"""Which storage engine keeps a store, chosen from configuration (docs/architecture.md).

``engram serve --data DIR`` means the DuckDB engine with its file in DIR. An engine is a name in
``ENGINES`` and a function that opens it; a store URL (``--store postgresql://… --key-dir DIR``,
several cores over one database) selects the engine registered under its scheme, and
``VAULTS`` the key vault an engine keeps its own (PostgreSQL: wrapped keys in the database). Adding an engine is one entry
here and its subpackage under ``engram_core/store/``; nothing else names an engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engram_core.contract.errors import Code, EngramError
from engram_core.crypto.keyvault import KeyVault, open_key_directory
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
    # A store other cores share loads each scope's search index on first use; at most this many
    # records indexed across the loaded scopes, least recently used evicted (0: no budget).
    index_max_records: int = 0
    # Whether the core serves the semantic channel. Without it no search reads the vectors, and
    # their int8 sketch is not built at open (0.5 s per 100k vectors; a search would build it).
    vector_search: bool = True

    @classmethod
    def from_options(cls, data_dir: Path, store_url: str | None = None, *, index_max_records: int = 0,
                     vector_search: bool = True) -> StoreConfig:
        """The configuration ``--data DIR`` or ``--store URL --key-dir DIR`` describes (``data_dir``:
        the data directory, or the key directory of a store kept elsewhere). ValueError when the
        URL names no engine this build has (the message names the ones it has), or when it is a
        PostgreSQL connection string carrying a password (``store_conninfo``)."""
        if store_url is None:
            return cls(data_dir=data_dir, vector_search=vector_search)
        if "://" not in store_url:  # a libpq key=value string or a service name: PostgreSQL's
            return cls(data_dir=data_dir, engine=POSTGRESQL, url=store_conninfo(store_url),
                       index_max_records=index_max_records, vector_search=vector_search)
        engine = urlsplit(store_url).scheme
        if engine in POSTGRESQL_SCHEMES:
            return cls(data_dir=data_dir, engine=POSTGRESQL, url=store_conninfo(store_url),
                       index_max_records=index_max_records, vector_search=vector_search)
        if engine not in ENGINES:
            raise ValueError(f"no store engine for {engine or store_url!r} in this build "
                             f"(engines: {', '.join(sorted(ENGINES))})")
        return cls(data_dir=data_dir, engine=engine, url=store_url, vector_search=vector_search)


# Opens the engine's store: (config, key vault, build the search index now, audit devices) -> Store.
EngineOpener = Callable[[StoreConfig, KeyVault, bool, Any], Store]


def _open_duckdb(config: StoreConfig, vault: KeyVault, load_index: bool, audit_devices: Any) -> Store:
    from engram_core.store.duckdb.engine import DuckDBEngine
    from engram_core.store.kernel import StoreKernel

    # Search projections are sealed under record keys: the kernel and the engine's migration 6 need the vault.
    store = StoreKernel(DuckDBEngine(config.data_dir, keys=vault), vault, spool_dir=config.data_dir,
                        load_index=load_index, sketch_vectors=config.vector_search)
    if audit_devices is not None:
        store.attach_audit_devices(audit_devices)
    return store


MEMORY = "memory"


def _open_memory(config: StoreConfig, vault: KeyVault, load_index: bool, audit_devices: Any) -> Store:
    """``--store memory://``: the in-memory engine (store/memory), a reference and a test bed with
    no durability: everything is gone when the core stops (keys stay in the data directory)."""
    from engram_core.store.kernel import StoreKernel
    from engram_core.store.memory import MemoryEngine

    store = StoreKernel(MemoryEngine(), vault, spool_dir=config.data_dir, load_index=load_index,
                        sketch_vectors=config.vector_search)
    if audit_devices is not None:
        store.attach_audit_devices(audit_devices)
    return store


POSTGRESQL = "postgresql"
POSTGRESQL_SCHEMES = ("postgresql", "postgres")  # the URL schemes libpq accepts


def store_conninfo(store: str) -> str:
    """The libpq connection string of ``engram serve --store``: a URL
    (``postgresql://USER@HOST:PORT/DB``), a key=value string, or a bare service name
    (``pg_service.conf``). ValueError for one carrying a password (PGPASSFILE or the libpq
    environment give it, never a command line) or one libpq cannot parse."""
    from engram_core.store.postgres.pool import check_conninfo

    text = store.strip()
    if not text:
        raise ValueError("--store: empty connection string")
    if "://" not in text and "=" not in text:
        text = f"service={text}"
    try:
        check_conninfo(text)
    except ValueError as exc:
        raise ValueError(f"--store: {exc}") from None
    return text


def _open_postgresql(config: StoreConfig, vault: KeyVault, load_index: bool, audit_devices: Any) -> Store:
    from engram_core.store.kernel import StoreKernel
    from engram_core.store.postgres.engine import PostgresEngine

    assert config.url is not None
    # The engine the vault's opening migrated with (``_postgresql_vault``) is the store's: the
    # schema is checked and migrated once per open. A vault opened otherwise gets one opened here.
    engine = getattr(vault, "store_engine_at_open", None)
    if engine is not None:
        vault.store_engine_at_open = None  # type: ignore[attr-defined]  # handed over once
    else:
        engine = PostgresEngine(config.url)  # 20 connections: engram serve's 16 gRPC workers + 4
    try:
        # The engine's capabilities say how the kernel keeps it (no audit spool, scopes loaded on first read).
        store = StoreKernel(engine, vault, spool_dir=config.data_dir, load_index=load_index,
                            index_max_records=config.index_max_records, sketch_vectors=config.vector_search)
    except BaseException:
        engine.close()
        raise
    if audit_devices is not None:
        store.attach_audit_devices(audit_devices)
    return store


def _postgresql_vault(config: StoreConfig) -> KeyVault:
    """Data keys wrapped in the database, the KEK ring in the key directory (``data_dir``)."""
    from engram_core.store.postgres.engine import PostgresEngine
    from engram_core.store.postgres.keyvault import PgKeyVault

    assert config.url is not None
    # The vault's tables come with the engine's migrations: applied here when pending and this
    # role may (else one line names `engram admin migrate --store`); a current schema is only read.
    # The engine that migrates is the store's own (20 connections: engram serve's 16 gRPC workers
    # + 4), handed to ``_open_postgresql`` through the vault, so a core's open migrates (or checks
    # the ledger) once; its ``migrations_applied_at_open`` is what the start-up summary and the
    # ``migration`` event report.
    engine = PostgresEngine(config.url)
    try:
        vault = PgKeyVault(config.url, config.data_dir)
    except BaseException:
        engine.close()
        raise
    vault.store_engine_at_open = engine  # type: ignore[attr-defined]
    return vault


def _postgresql_key_source(config: StoreConfig) -> KeyVault:
    """The wrapped keys of an existing PostgreSQL store, read with its ring: never migrated here
    (a restore reads its source as it is; one that is not an Engram store is STORE_UNAVAILABLE).
    A ring that is not the store's (an older copy, another store's) is RESTORE_REFUSED: the key
    directory does not match, and retrying it would never succeed (docs/admin.md)."""
    from engram_core.store.postgres.keyvault import PgKeyVault, RingMismatch

    assert config.url is not None
    try:
        return PgKeyVault(config.url, config.data_dir, pool_size=1, read_only=True)
    except RingMismatch as exc:
        raise EngramError(Code.RESTORE_REFUSED, f"key directory does not match the key store: {exc.detail}") from None


def _migrate_postgresql(config: StoreConfig) -> dict[str, Any]:
    from engram_core.store.postgres.engine import PostgresEngine

    assert config.url is not None
    engine = PostgresEngine(config.url, pool_size=1)  # opening applies what is pending
    try:
        return {"applied": engine.migrations_applied_at_open, "ledger": engine.migration_ledger(),
                "code": engine.migration_code(), "store": engine.location}
    finally:
        engine.close()


ENGINES: dict[str, EngineOpener] = {DEFAULT_ENGINE: _open_duckdb, POSTGRESQL: _open_postgresql,
                                    MEMORY: _open_memory}
# Engines whose key vault is their own (else the data directory's FileKeyVault).
VAULTS: dict[str, Callable[[StoreConfig], KeyVault]] = {POSTGRESQL: _postgresql_vault}
# Another store's vault opened as a restore's source of keys, for engines with a vault of their own.
KEY_SOURCES: dict[str, Callable[[StoreConfig], KeyVault]] = {POSTGRESQL: _postgresql_key_source}
# Engines whose schema an operator migrates apart from serving, with a role of its own (the owner).
MIGRATORS: dict[str, Callable[[StoreConfig], dict[str, Any]]] = {POSTGRESQL: _migrate_postgresql}


def migrate_schema(store: str) -> dict[str, Any]:
    """Apply the pending schema migrations of the store at ``store`` (a store URL) and return
    ``applied`` (versions applied now), ``ledger``, ``code`` (as ``engram admin migrate`` through a
    core) and ``store`` (where, redacted). Nothing but the schema: no key material is read or made
    (the PostgreSQL migrations are SQL alone), so the owner's role migrates with no key directory
    and the cores serve with a role that may not change the schema (docs/deployment.md).
    ValueError for a URL of an engine migrated only by the core that opens it (DuckDB: one
    process owns the file), one carrying a password, or one libpq cannot parse."""
    config = StoreConfig.from_options(Path(), store)  # no directory: migrations need no keys
    migrator = MIGRATORS.get(config.engine)
    if migrator is None:
        raise ValueError(f"--store: the {config.engine} engine is migrated by the core that opens it "
                         "(engram serve --data DIR, or engram admin migrate through that core)")
    return migrator(config)


def open_key_source(directory: Path, store: str | None = None) -> KeyVault | None:
    """Another store's key vault, a restore's source of data keys: the file vault kept in
    ``directory`` or, with ``store`` (a store URL), the vault that store's engine keeps its keys
    in, under the KEK ring of ``directory``. None when ``directory`` holds no ring (or, for a file
    vault, no slot file): nothing is created in a directory a restore only reads. ValueError for
    a store URL this build has no vault for, or one carrying a password."""
    if not store:
        return open_key_directory(directory)
    config = StoreConfig.from_options(directory, store)
    if config.engine not in KEY_SOURCES:
        raise ValueError(f"the {config.engine} engine keeps its keys in its key directory: name only that")
    if not (directory / "store.kek").is_file():
        return None
    return KEY_SOURCES[config.engine](config)


def open_store(config: StoreConfig, *, vault: KeyVault, load_index: bool = True, audit_devices: Any = None) -> Store:
    """The store ``config`` names, opened by its engine (fenced, migrated; the search index
    built unless ``load_index`` is False, in which case the server builds it after it listens)."""
    return ENGINES[config.engine](config, vault, load_index, audit_devices)
