"""The key vault several cores share (engram_core/store/postgres/keyvault.py), on the real cluster:
two vaults are two cores over one database and one key directory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.crypto.keyvault import KekRing, WrappedKey
from engram_core.store.postgres.engine import PostgresEngine
from engram_core.store.postgres.keyvault import PgKeyVault
from tests.support.pg_cluster import Database, wait_until
from tests.support.pg_wire import RoundTripProxy
from tests.support.store_targets import PostgresTarget


@pytest.fixture
def cores(tmp_path: Path, pg_database: Database) -> Iterator[tuple[PgKeyVault, PgKeyVault]]:
    PostgresEngine(pg_database.conninfo, pool_size=1).close()  # the schema
    a = PgKeyVault(pg_database.conninfo, tmp_path, pool_size=1)
    b = PgKeyVault(pg_database.conninfo, tmp_path, pool_size=1)
    yield a, b
    a.close()
    b.close()


def _name(db: Database, owner: str, ref: int) -> None:
    """A committed transaction names the key (its ledger row), as a capture or admission does."""
    with db.connect() as con:
        con.execute("INSERT INTO data_keys VALUES (%s, %s, 1)", [owner, ref])


def test_a_key_made_on_one_core_opens_on_another_bound_to_its_owner(cores: tuple[PgKeyVault, PgKeyVault]) -> None:
    a, b = cores
    ref, key = a.new_data_key("record:mem_1")
    assert b.data_key(ref, "record:mem_1") == key and b.generation_of(ref) == a.active_generation()
    assert b.data_key(ref, "record:mem_other") is None  # another owner's ref opens nothing
    assert b.data_key(ref + 1000, "record:mem_1") is None


@contextmanager
def _maker_and_counted_reader(tmp_path: Path, db: Database) -> Iterator[tuple[PgKeyVault, PgKeyVault, RoundTripProxy]]:
    """Two cores' vaults over one database, the second's round trips counted on the wire."""
    PostgresEngine(db.conninfo, pool_size=1).close()
    maker = PgKeyVault(db.conninfo, tmp_path, pool_size=1)
    wire = RoundTripProxy(db.conninfo)
    reader = PgKeyVault(wire.conninfo, tmp_path, pool_size=1)
    try:
        yield maker, reader, wire
    finally:
        reader.close()
        maker.close()
        wire.close()


def test_keys_read_with_the_records_are_unwrapped_without_a_round_trip(tmp_path: Path,
                                                                       pg_database: Database) -> None:
    """A catch-up reads the records' wrapped keys with the records (``stored``): the vault
    unwraps those as if it had read them (another owner's row opens nothing, a row the ring did
    not wrap opens nothing) and reads only the refs not given."""
    with _maker_and_counted_reader(tmp_path, pg_database) as (maker, reader, wire):
        made = {f"record:mem_s{n}": maker.new_data_key(f"record:mem_s{n}") for n in range(4)}
        with pg_database.connect() as con:
            stored = {ref: WrappedKey(owner, version, generation, bytes(wrapped))
                      for ref, owner, version, generation, wrapped in con.execute(
                          "SELECT ref, owner, version, generation, wrapped FROM vault_keys").fetchall()}
        (r0, k0), (r1, k1), (r2, _), (r3, k3) = made.values()
        given = {r0: stored[r0], r1: stored[r1], r2: WrappedKey("record:mem_s2", stored[r2].version,
                                                                stored[r2].generation, b"\x00" * len(stored[r2].wrapped))}
        wire.reset()
        found = reader.data_keys([(r0, "record:mem_s0"), (r1, "record:mem_other"), (r2, "record:mem_s2")],
                                 stored=given)
        assert wire.round_trips == 0
        assert found == {r0: k0}
        wire.reset()
        assert reader.data_keys([(r3, "record:mem_s3")], stored=given) == {r3: k3}
        assert wire.round_trips == 1  # not given: read


def test_many_keys_are_read_in_one_round_trip_each_still_bound_to_its_owner(tmp_path: Path,
                                                                          pg_database: Database) -> None:
    """A scope's load opens every record's projection: ``data_keys`` reads the keys the cache
    does not hold in one query, with ``data_key``'s answers (another owner's ref, a destroyed
    key and an unknown ref open nothing)."""
    with _maker_and_counted_reader(tmp_path, pg_database) as (maker, reader, wire):
        made = {f"record:mem_b{n}": maker.new_data_key(f"record:mem_b{n}") for n in range(40)}
        gone = made.pop("record:mem_b39")[0]
        maker.destroy_many([gone])
        wanted = [(ref, owner) for owner, (ref, _) in made.items()]
        wanted += [(gone, "record:mem_b39"), (gone + 999, "record:x")]
        wire.reset()
        found = reader.data_keys(wanted)
        assert wire.round_trips == 1
        assert found == {ref: key for ref, key in made.values()}
        assert maker.data_keys([(made["record:mem_b0"][0], "record:mem_other")]) == {}  # from the cache
        maker._cache.clear()  # not from the cache either
        assert maker.data_keys([(made["record:mem_b0"][0], "record:mem_other")]) == {}
        wire.reset()
        assert reader.data_keys(wanted[:5]) == {ref: made[owner][1] for ref, owner in wanted[:5]}
        assert wire.round_trips == 0  # all cached now


def test_a_destroyed_key_is_gone_for_the_vault_that_destroyed_it_at_once(cores: tuple[PgKeyVault, PgKeyVault],
                                                                        pg_database: Database) -> None:
    a, b = cores
    ref, _ = a.new_data_key("record:mem_2")
    assert a.data_key(ref, "record:mem_2") is not None  # cached now
    assert not b.is_destroyed(ref)
    a.destroy_many([ref])
    assert a.data_key(ref, "record:mem_2") is None and b.data_key(ref, "record:mem_2") is None
    assert b.is_destroyed(ref)  # what a restore reading this store as its key source is told
    with pg_database.connect() as con:
        assert con.execute("SELECT count(*) FROM vault_keys WHERE ref = %s", [ref]).fetchone()[0] == 0  # type: ignore[index]


def test_a_rotation_on_one_core_is_followed_by_the_other(cores: tuple[PgKeyVault, PgKeyVault],
                                                        pg_database: Database) -> None:
    """B's copy of the ring is stale after A rotates: a key B makes is still wrapped by the new
    generation (the database refuses the old one and B re-reads the ring), and B opens keys A
    re-wrapped by a generation B had never seen."""
    a, b = cores
    old_ref, old_key = a.new_data_key("record:mem_old")
    _name(pg_database, "record:mem_old", old_ref)
    assert b.active_generation() == 1
    new = a.rotate(100)
    assert a.rewrap(old_ref, "record:mem_old")
    ref, key = b.new_data_key("record:mem_new")
    assert b.generation_of(ref) == new == b.active_generation()
    assert b.data_key(old_ref, "record:mem_old") == old_key and a.data_key(ref, "record:mem_new") == key


def test_a_core_with_a_stale_ring_cannot_wrap_by_an_old_generation(cores: tuple[PgKeyVault, PgKeyVault],
                                                                    tmp_path: Path) -> None:
    """A ring copy held in memory from before a rotation (as a core that has not looked at the file
    yet) is refused by the database's agreed generation, so no key is left wrapped by a generation
    about to retire."""
    a, b = cores
    stale = KekRing(tmp_path / "store.kek")  # generation 1 active, as B had it
    a.rotate(100)
    b.ring = stale
    b._ring_seen = b._ring_stamp()  # B believes its copy is current
    ref, _ = b.new_data_key("record:mem_stale")
    assert b.generation_of(ref) == 2  # refused under 1, re-read the ring, wrapped again


def test_retirement_is_refused_while_a_key_is_wrapped_by_the_generation(cores: tuple[PgKeyVault, PgKeyVault],
                                                                        pg_database: Database) -> None:
    a, b = cores
    ref, key = a.new_data_key("record:mem_3")
    _name(pg_database, "record:mem_3", ref)
    a.rotate(100)
    with pytest.raises(ValueError, match="still wrapped"):
        b.retire(1, 200)
    with pytest.raises(ValueError, match="active"):
        b.retire(2, 200)
    assert a.rewrap(ref, "record:mem_3") and a.wrapping_generations() == {2}
    b.retire(1, 200)
    assert a.is_retired(1) and a.destruction_complete(1) and not a.destruction_complete(2)
    assert a.data_key(ref, "record:mem_3") == key  # re-wrapped before, so still open


def test_reconcile_deletes_only_what_nobody_can_still_name(cores: tuple[PgKeyVault, PgKeyVault],
                                                         pg_database: Database) -> None:
    a, b = cores
    named, _ = a.new_data_key("record:mem_named")  # a committed transaction names it
    in_flight, _ = b.new_data_key("record:mem_in_flight")  # another core's transaction is about to
    abandoned, _ = a.new_data_key("record:mem_abandoned")  # a transaction that never committed, long ago
    destroyed, _ = a.new_data_key("record:mem_destroyed")  # its destruction committed; the delete crashed
    with pg_database.connect() as con:
        con.execute("INSERT INTO data_keys VALUES ('record:mem_named', %s, 1)", [named])
        con.execute("INSERT INTO key_destructions VALUES ('record:mem_destroyed', 1, 'tombstone', 1)")
        con.execute("UPDATE vault_keys SET created_at = now() - interval '1 hour' WHERE ref IN (%s, %s)",
                    [named, abandoned])
    # The caller's live set may be older than the ledger (the named key is not in it): still kept.
    assert a.reconcile(set()) == 2
    assert a.data_key(named, "record:mem_named") is not None
    assert b.data_key(in_flight, "record:mem_in_flight") is not None  # young and unnamed: kept
    assert a.data_key(abandoned, "record:mem_abandoned") is None
    assert a.data_key(destroyed, "record:mem_destroyed") is None


def test_cores_starting_together_on_an_empty_key_directory_make_one_ring(tmp_path: Path, pg_database: Database) -> None:
    PostgresEngine(pg_database.conninfo, pool_size=1).close()
    vaults: list[PgKeyVault] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        barrier.wait(30)
        vaults.append(PgKeyVault(pg_database.conninfo, tmp_path / "keys", pool_size=1))

    (tmp_path / "keys").mkdir()
    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert len(vaults) == 4
        ref, key = vaults[0].new_data_key("record:mem_ring")
        assert all(v.data_key(ref, "record:mem_ring") == key for v in vaults)  # one KEK, whoever made it
    finally:
        for v in vaults:
            v.close()


def test_a_key_directory_holding_another_ring_is_refused(tmp_path: Path, pg_database: Database,
                                                        cores: tuple[PgKeyVault, PgKeyVault]) -> None:
    """A core given the wrong key directory would wrap keys no other core can open: it refuses to
    start, whether its ring is another generation 1 or behind the store's."""
    a, _ = cores
    for n, rotate in enumerate((False, True)):
        if rotate:
            a.rotate(100)  # the store's agreed generation is 2
        elsewhere = tmp_path / f"elsewhere{n}"
        elsewhere.mkdir()
        with pytest.raises(EngramError) as refused:
            PgKeyVault(pg_database.conninfo, elsewhere, pool_size=1)  # a fresh ring of its own: generation 1
        assert refused.value.code == Code.STORE_UNAVAILABLE and "same key directory" in refused.value.detail
    a.close()
    PgKeyVault(pg_database.conninfo, tmp_path, pool_size=1).close()  # the right one still opens


def test_the_vault_needs_the_engines_schema(tmp_path: Path, pg_database: Database) -> None:
    with pytest.raises(EngramError) as refused:
        PgKeyVault(pg_database.conninfo, tmp_path, pool_size=1)
    assert refused.value.code == Code.STORE_UNAVAILABLE and "schema" in refused.value.detail


def test_status_counts_live_and_destroyed_keys(cores: tuple[PgKeyVault, PgKeyVault]) -> None:
    a, _ = cores
    refs = [a.new_data_key(f"record:mem_s{n}")[0] for n in range(3)]
    a.destroy(refs[0])
    assert a.slot_counts() == (2, 1)
    assert a.status() == {"active_kek": 1, "keks": 1, "retired_keks": 0, "slots": 3, "live_slots": 2}


# -- re-wrapping against destruction (several cores hold no lock in common) ------------------------------------------
@pytest.fixture
def store_and_vault(tmp_path: Path, pg_database: Database) -> Iterator[tuple[Any, PgKeyVault]]:
    target = PostgresTarget(tmp_path, pg_database)
    store = target.open()
    yield store, store.vault  # type: ignore[attr-defined]
    target.close_all()


def _named_key(store: Any, vault: PgKeyVault, owner: str) -> int:
    ref, _ = vault.new_data_key(owner)
    with store.write() as tx:
        tx.put_data_key(owner, ref, 1)
    return ref


def test_only_live_keys_are_rewrapped(store_and_vault: tuple[Any, PgKeyVault]) -> None:
    store, vault = store_and_vault
    live = _named_key(store, vault, "record:mem_live")
    unnamed, _ = vault.new_data_key("record:mem_unnamed")  # a transaction in flight would name it
    vault.rotate(100)
    assert vault.rewrap(live, "record:mem_live") and vault.generation_of(live) == 2
    assert not vault.rewrap(unnamed, "record:mem_unnamed") and vault.generation_of(unnamed) == 1


def test_a_destruction_records_the_generation_wrapping_the_key_when_it_committed(
        store_and_vault: tuple[Any, PgKeyVault], pg_database: Database) -> None:
    """The engine reads the generation itself, after deleting the key's ledger row: a re-wrap that
    finished before is recorded (2); one that comes while the destruction is in flight waits for
    it and then finds the key no longer live, so the generation recorded (1) is the one every copy
    is wrapped by."""
    store, vault = store_and_vault
    before = _named_key(store, vault, "record:mem_before")
    during = _named_key(store, vault, "record:mem_during")
    vault.rotate(100)
    assert vault.rewrap(before, "record:mem_before")
    with store.write() as tx:
        tx.drop_data_key("record:mem_before", 2, "tombstone", slot=before)
    outcome: list[bool] = []
    with store.write() as tx:
        tx.drop_data_key("record:mem_during", 2, "tombstone", slot=during)
        tx.meta("anything")  # a read: the DELETE and the destruction's row reach the server now
        rewrap = threading.Thread(target=lambda: outcome.append(vault.rewrap(during, "record:mem_during")))
        rewrap.start()

        def vault_waits() -> bool:
            with pg_database.connect() as con:
                return bool(con.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                                        "'engram-vault' AND wait_event_type = 'Lock'").fetchone()[0])  # type: ignore[index]
        assert wait_until(vault_waits, 30) and not outcome  # held off by the destruction in flight
    rewrap.join(30)
    assert outcome == [False]
    with store.read() as tx:
        assert tx.key_destruction("record:mem_before").generation == 2  # type: ignore[union-attr]
        assert tx.key_destruction("record:mem_during").generation == 1  # type: ignore[union-attr]


def test_a_key_made_without_its_own_flush_is_durable_once_a_commit_names_it(
        store_and_vault: tuple[Any, PgKeyVault], pg_cluster: Any) -> None:
    """``durable=False`` (how captures and admissions make keys): the naming transaction's COMMIT
    flushes the WAL past the key's row, so a crash right after it loses neither."""
    store, vault = store_and_vault
    refs = []
    for n in range(20):
        ref, key = vault.new_data_key(f"record:mem_async{n}", durable=False)
        vault.sync()
        with store.write() as tx:
            tx.put_data_key(f"record:mem_async{n}", ref, 1)
        refs.append((ref, key))
    pg_cluster.restart("immediate")  # a crash: only what was flushed comes back
    with store.read() as tx:
        assert tx.live_key_slots() == {ref: f"record:mem_async{n}" for n, (ref, _) in enumerate(refs)}
    vault._cache.clear()  # read from the database, not this process's memory
    assert all(vault.data_key(ref, f"record:mem_async{n}") == key for n, (ref, key) in enumerate(refs))
