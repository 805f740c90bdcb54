"""The lexical and vector projections (SPEC §5, §10, §11): maintained in the admission and forget
transactions, hashed terms only, nothing for candidates that were never accepted."""

from __future__ import annotations

import pytest

from engram_core.contract.scope import Scope
from engram_core.rpc.server import RunningCore
from engram_core.services.lexical import analyze
from engram_core.store.port import LexicalQuery
from engram_core.store.postgres.engine import PostgresEngine
from engram_core.store.projection import Projection, open_projection
from engram_core.store.search_index import FIELDS
from engram_core.store.sql.codecs import RECORD_COLS, record_of
from tests.support.core_engines import one, rows
from tests.support.search_support import Client


def _rows(core: RunningCore, sql: str, params: list) -> list[tuple]:
    with core.core.store.read() as tx:
        return rows(tx, sql, params)


def _is_postgresql(core: RunningCore) -> bool:
    return isinstance(core.core.store.engine, PostgresEngine)


def _opened(core: RunningCore, tenant: str = "acme", workspace: str = "alpha") -> dict[str, Projection]:
    """Every sealed projection of the scope, opened with its record's data key (both engines read
    records through the one codec)."""
    with core.core.store.read() as tx:
        found = rows(tx, f"SELECT p.sealed, {RECORD_COLS} FROM records JOIN (SELECT record_id, sealed FROM "
                         "projections WHERE tenant = ? AND workspace = ?) p USING (record_id)", [tenant, workspace])
    store = core.core.store
    return {rec.record_id: open_projection(store.data_key(rec), rec.record_id, bytes(sealed))
            for sealed, rec in ((row[0], record_of(row[1:])) for row in found)}


def _docs(core: RunningCore) -> int:
    with core.core.store.read() as tx:
        return tx.lexical_stats(Scope("acme", "alpha"), []).docs


def test_admission_indexes_postings_stats_and_vector_in_one_go(core: RunningCore) -> None:
    ana = Client(core)
    before = _docs(core)
    rid = ana.remember("Smew ingestion uses batched writes.")
    with core.core.store.read() as tx:
        assert tx.postings_count(rid) > 0 and tx.vector_count(rid) == 1
    assert _docs(core) == before + 1
    assert _opened(core)[rid].postings == core.core.store._index.indexed_postings(Scope("acme", "alpha"), rid)


def test_forget_removes_postings_and_vector_in_same_transaction(core: RunningCore) -> None:
    ana = Client(core)
    rid = ana.remember("Eider rollback procedure.")
    docs = _docs(core)
    out = ana.forget(rid)
    assert out["projection_invalidation"] == "complete"
    with core.core.store.read() as tx:
        assert tx.postings_count(rid) == 0 and tx.vector_count(rid) == 0
        assert one(tx, "SELECT count(*) FROM projections WHERE record_id = ?", [rid])[0] == 0
    assert _docs(core) == docs - 1


def test_projections_are_sealed_and_hold_keyed_hashes_never_words(core: RunningCore) -> None:
    """SPEC §10: the plain columns carry no content; opened with the record's key the projection
    holds keyed term hashes (never words, never unkeyed hashes)."""
    ana = Client(core)
    rid = ana.remember("Loon quokka zebrafish marker words.")
    hasher = core.core.hasher
    columns = _rows(core, "SELECT column_name, data_type FROM information_schema.columns "
                          "WHERE table_name = 'projections'", [])
    text, blob = ("text", "bytea") if _is_postgresql(core) else ("VARCHAR", "BLOB")
    assert sorted(columns) == [("record_id", text), ("sealed", blob), ("tenant", text), ("workspace", text)]
    for table in ("postings", "vectors", "field_stats"):
        assert not _rows(core, "SELECT 1 FROM information_schema.tables WHERE table_name = ?", [table])
    sealed = bytes(_rows(core, "SELECT sealed FROM projections WHERE record_id = ?", [rid])[0][0])
    terms = {hasher.term(t) for t in analyze("quokka zebrafish")}
    for term in terms:
        assert term.to_bytes(8, "little", signed=True) not in sealed
    projection = _opened(core)[rid]
    held = {int(t) for codes in projection.fields.values() for t in codes[0]}
    assert terms <= held
    import hashlib
    unkeyed = int.from_bytes(hashlib.blake2b(b"quokka", digest_size=8).digest(), "big", signed=True)
    assert unkeyed not in held


def test_pending_candidates_have_no_projection(core: RunningCore) -> None:
    ana = Client(core)
    ana.capture_only("Merganser unadmitted text.")
    with core.core.store.read() as tx:
        n = one(tx, "SELECT count(*) FROM projections p LEFT JOIN records r USING (record_id) WHERE r.record_id IS NULL")
    assert n[0] == 0


def test_document_frequencies_track_postings_through_admission_and_forget(core: RunningCore) -> None:
    """Per-term document frequencies (SPEC §11 IDF) and field statistics equal counts over the
    sealed projections, and a forgotten record's unique terms leave no posting behind."""
    ana = Client(core)
    keep = ana.remember("Gadwall shoveler pintail notes.")
    gone = ana.remember("Gadwall garganey unique marker.")
    hasher = core.core.hasher
    gadwall, garganey = hasher.terms("gadwall garganey")  # the analyzer stems them

    def df() -> dict[int, int]:
        with core.core.store.read() as tx:
            return tx.lexical_stats(Scope("acme", "alpha"), [gadwall, garganey]).df

    def counted(term: int) -> int:
        return sum(any(term in codes[0] for codes in p.fields.values()) for p in _opened(core).values())

    def drift() -> list[str]:
        """Fields whose average length in the index differs from the one the projections give."""
        projections = _opened(core).values()
        with core.core.store.read() as tx:
            avg = tx.lexical_stats(Scope("acme", "alpha"), []).avg_len
        wrong = []
        for code, name in enumerate(FIELDS):
            lengths = [int(p.fields[code][1].sum()) for p in projections if code in p.fields]
            if lengths and abs(avg.get(name, 0.0) - sum(lengths) / len(lengths)) > 1e-9:
                wrong.append(name)
        return wrong

    assert df() == {gadwall: 2, garganey: 1} == {gadwall: counted(gadwall), garganey: counted(garganey)}
    assert drift() == []
    ana.forget(gone)
    assert df() == {gadwall: 1} and counted(garganey) == 0
    assert drift() == []
    assert keep


def test_index_kept_by_commits_ranks_as_one_rebuilt_from_the_database(core: RunningCore) -> None:
    """The in-memory search index is a cache of the durable projections: after admissions and a
    forget it scores (lexical and, when installed, vector) exactly as one loaded from the database
    (as at open)."""
    ana = Client(core)
    ids = [ana.remember(f"Merganser {word} rollout checklist {i}.") for i, word in
           enumerate(["canary", "blue-green", "canary staged", "rolling", "canary rollback"])]
    ana.forget(ids[1])
    query = core.core.hasher.terms("merganser canary rollout checklist")
    now = core.core.now_ms()

    def ranked() -> tuple:
        with core.core.store.read() as tx:
            stats = tx.lexical_stats(Scope("acme", "alpha"), query)
            page = tx.rank_lexical(Scope("acme", "alpha"), LexicalQuery(
                stats, {"primary": 3.0, "context": 1.0}, k1=1.2, b=0.75, now_ms=now, half_life_ms=86_400_000,
                lexical_weight=0.85, max_accepted_cursor=2**62, best_bm25=None, after=None, limit=50))
            near = []
            if core.core.embedder is not None:
                near = tx.rank_vectors(Scope("acme", "alpha"), core.core.embedder.model_id,
                                       core.core.embedder.embed("merganser canary checklist"), now_ms=now,
                                       max_accepted_cursor=2**62, min_similarity=-1.0, limit=50)
        return stats, page.total, [(rid, score) for rid, score, _ in page.rows], page.best_bm25, near

    kept = ranked()
    assert {rid for rid, _ in kept[2]} >= {ids[0], ids[2], ids[4]} and ids[1] not in {rid for rid, _ in kept[2]}
    core.core.store.reload_indexes()
    assert ranked() == kept


def test_search_reads_a_record_from_the_index_copy_only_while_it_equals_the_database_row(core: RunningCore) -> None:
    """Searches read their page's rows from the index's copy; a forget, a state change or a
    dropped body takes the copy away, so the row is then read from the database."""
    ana = Client(core)
    ids = [ana.remember(f"Goldeneye copy check {word}.") for word in ("north", "south", "east")]
    store = core.core.store

    def held() -> dict:
        with store.search_index() as index:
            return index.rows(Scope("acme", "alpha"), ids)

    def from_db() -> dict:
        with store.engine.read(snapshot=False) as tx:  # the engine's rows, not the kernel's copy
            return tx.records(Scope("acme", "alpha"), ids)

    assert held() == from_db() and set(held()) == set(ids)
    ana.forget(ids[1])
    with store.write() as tx:
        tx.set_record_state(ids[2], "disputed", state_cursor=2**40)
    assert set(held()) == {ids[0]} and held()[ids[0]] == from_db()[ids[0]]
    with store.read(snapshot=False) as tx:
        rows = tx.records(Scope("acme", "alpha"), ids)
        assert rows == from_db()
        assert rows[ids[2]].state == "disputed" and rows[ids[1]].sealed_body is None
        assert tx.records(Scope("acme", "beta"), ids) == {}  # another scope's ids are unknown here
    store.reload_indexes()  # as at open: the copy is loaded with the postings, from the same rows
    ana.ids("goldeneye")  # (PostgreSQL loads a scope's index at its first read)
    assert set(held()) == {ids[0], ids[2]} and held() == {k: v for k, v in from_db().items() if k in held()}
    # A writer reads its own transaction, never the committed copy.
    with pytest.raises(RuntimeError), store.write() as tx:
        tx.set_record_state(ids[0], "disputed", state_cursor=2**41)
        assert tx.records(Scope("acme", "alpha"), [ids[0]])[ids[0]].state == "disputed"
        raise RuntimeError("roll back")
    assert held()[ids[0]].state == "accepted_current"
