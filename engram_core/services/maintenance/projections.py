"""Schema, projections and policies: migrations, invalidating and rebuilding a scope's
projections, re-deriving them at start-up when the analyzer or model changed, policy reload."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from engram_core.contract.canonical import digest, with_receipt_digest
from engram_core.contract.scope import Scope
from engram_core.policy.port import BundleRefused
from engram_core.services.core import CallRecord, Core, new_id
from engram_core.services.lexical import ANALYZER_ID, record_fields
from engram_core.services.maintenance.base import HostOps, log, open_body
from engram_core.services.mutations import record_text
from engram_core.services.reconciliation import payload_links, write_links
from engram_core.store.fields import FIELD_CODE
from engram_core.store.port import RecordRow, Tx
from engram_core.store.projection import Projection
from engram_core.trust.hostctx import BoundContext

INDEXED_STATES = ("accepted_current", "accepted_disputed", "historical", "expired", "trust_invalid")
ANALYZER_META = "lexical_analyzer"
VECTOR_MODEL_META = "vector_model"
Rewrite = Callable[[RecordRow, Projection], Projection | None]


class ProjectionOps(HostOps):
    # -- schema, projections, policies ------------------------------------------------------------
    def migrate(self, ctx: BoundContext) -> dict[str, Any]:
        call = self.authorize(ctx, "migrate")
        applied = self.core.store.migrate()  # MIGRATION_LEDGER_INVALID if the ledger disagrees
        self._audit(ctx, "migrate", "ok", "", call)
        return {"applied": applied, "ledger": self.core.store.migration_ledger(),
                "code": self.core.store.migration_code()}

    def invalidate_projections(self, ctx: BoundContext, scope: Scope) -> dict[str, Any]:
        call = self.authorize(ctx, "invalidate_projections", target=scope)
        tctx = self.target_ctx(ctx, scope)
        with self.core.store.write() as tx:
            removed = tx.drop_projections(scope)
            self.core.projections.mark(tx, scope, stale=True)  # searches: PROJECTION_STALE
            # Journaled: the other cores of a shared store reload the scope's index when they see it.
            tx.append_event(scope, event_id=new_id("evt_"), operation="invalidate_projections",
                            target=f"projections:{scope}", from_state="projections_current",
                            to_state="projections_stale", at_ms=self.core.now_ms(),
                            body={"removed": removed, "decisions": call.summaries(), "audit_id": ctx.audit_id})
            head = tx.scope(scope)
            tx.append_audit(self.core.audit_row(tctx, "admin.invalidate_projections", "ok", str(scope), call))
        self.core.projections.published(scope, stale=True)
        return with_receipt_digest({"kind": "projection-invalidation", "tenant": scope.tenant, "workspace": scope.workspace,
                                    "removed": removed, "cursor": str(head.last_cursor if head else 0),
                                    "at": self.core.instant()})

    def rebuild_projections(self, ctx: BoundContext, scope: Scope) -> dict[str, Any]:
        """Re-derive postings (and vectors) from the sealed bodies of every non-tombstoned record."""
        call = self.authorize(ctx, "rebuild_projections", target=scope)
        tctx = self.target_ctx(ctx, scope)
        indexed, unreadable = [], []
        with self.core.store.write() as tx:  # writer lock: no admission slips between drop and re-index
            removed = tx.drop_projections(scope)
            for rec in tx.scope_records(scope, INDEXED_STATES):
                payload = open_body(self.core, tx, rec)
                if payload is None:
                    unreadable.append(rec.record_id)
                    continue
                tx.index_record(scope, rec.record_id, record_fields(payload, self.core.hasher),
                                self.mutations.embed_record(payload))
                write_links(tx, scope, rec.record_id, payload_links(payload))  # records admitted before links
                indexed.append(rec.record_id)
            counts = tx.projection_counts(scope)
            self.core.projections.mark(tx, scope, stale=False)
            tx.append_event(scope, event_id=new_id("evt_"), operation="rebuild_projections",
                            target=f"projections:{scope}", from_state="projections_stale",
                            to_state="projections_current", at_ms=self.core.now_ms(),
                            body={"records_indexed": len(indexed), "decisions": call.summaries(),
                                  "audit_id": ctx.audit_id})
            head = tx.scope(scope)
            tx.append_audit(self.core.audit_row(tctx, "admin.rebuild_projections", "ok", str(scope), call))
        self.core.projections.published(scope, stale=False)
        return with_receipt_digest({
            "kind": "projection-rebuild", "tenant": scope.tenant, "workspace": scope.workspace, "removed": removed,
            "records_indexed": len(indexed), "unreadable": unreadable, "counts": counts,
            "ordered_ids_digest": digest("ordered-ids", indexed), "cursor": str(head.last_cursor if head else 0),
            "at": self.core.instant(),
        })

    def reload_policies(self, ctx: BoundContext) -> dict[str, Any]:
        """Activate the bundle as it is now. A bundle that was read and refused is an answer,
        not an error: retrying cannot help, so the caller learns which file failed and that
        the previous revision stays active (``outcome: refused``). An unreachable backend is
        still POLICY_UNAVAILABLE (retriable)."""
        call = self.authorize(ctx, "reload_policies")
        previous = self.core.policy.revision()
        try:
            revision = self.core.policy.reload()
        except BundleRefused as exc:
            self._audit(ctx, "reload_policies", "refused", exc.active_revision, CallRecord([*call.decisions]))
            return {"outcome": "refused", "previous_revision": previous, "revision": exc.active_revision,
                    "problem": exc.problem}
        self._audit(ctx, "reload_policies", "ok", revision, CallRecord([*call.decisions]))
        return {"outcome": "activated", "previous_revision": previous, "revision": revision}


def _rederive_projections(core: Core, meta_key: str, current: str,
                          rewrite_of: Callable[[Tx], Rewrite]) -> tuple[int, str | None] | None:
    """At start-up, before the core serves: when ``store_meta[meta_key]`` is not ``current``,
    rewrite every scope's projections with ``rewrite_of(tx)`` and record ``current``, in one write
    transaction (all or nothing: a crash leaves the old projections and the old stamp, and the
    next start does it again). Returns (projections rewritten, the stamp found), or None when the
    store was current (one read). The in-memory index is rebuilt only if a projection changed."""
    with core.store.read() as tx:
        stamped = tx.meta(meta_key)
    if stamped == current:
        return None
    rewritten = 0
    with core.store.write() as tx:
        rewrite = rewrite_of(tx)
        for scope in tx.scopes():
            rewritten += tx.reseal_projections(Scope(scope.tenant, scope.workspace), rewrite)
        tx.set_meta(meta_key, current)
    if rewritten:
        core.store.reload_indexes()  # a copy built before held the old projections
    return rewritten, stamped


def reanalyze_lexical(core: Core) -> int | None:
    """Re-derive every scope's postings when they were made by another analyzer than this code's
    (``lexical.ANALYZER_ID``, recorded in ``store_meta``): a query analyzed one way must never be
    matched against postings analyzed another way. Vectors are kept. Returns the records
    re-indexed, or None when the postings were already current. A store without the id and
    without postings is new: it is only stamped (0)."""

    def reanalyzed(tx: Tx) -> Rewrite:
        def rewrite(rec: RecordRow, old: Projection) -> Projection | None:
            payload = open_body(core, tx, rec) if rec.state in INDEXED_STATES else None
            if payload is None:
                return None  # shredded: left
            fields = record_fields(payload, core.hasher)
            return Projection.of({FIELD_CODE[name]: counts for name, counts in fields.items()}, old.model,
                                 old.vector)  # type: ignore[arg-type]
        return rewrite

    done = _rederive_projections(core, ANALYZER_META, ANALYZER_ID, reanalyzed)
    if done is None:
        return None
    indexed, before = done
    if indexed:
        log.info("lexical postings re-analyzed: %d records (%s -> %s)", indexed, before or "v1", ANALYZER_ID)
    return indexed


def reembed_vectors(core: Core) -> int | None:
    """Re-derive the vectors made by another model than the embedder's (``model_id``), e.g. a
    store from before the model was derived for int8 arithmetic (engram_core/embedding/model.py): searches
    rank only vectors of their own model, so without this every older record would drop out of
    the semantic channel. ~5 ms per record re-embedded. The model whose vectors the store holds
    is recorded in ``store_meta``, so a store that is current costs one read (not a scan of its
    projections, nor the search index, which the server builds after it listens). Records
    without a vector are left as they are (``engram admin rebuild-projections`` gives them one).
    Returns the records re-embedded, or None when the store was already current."""
    embedder = core.embedder
    if embedder is None:
        return None  # nothing can be checked or stamped without the model
    older: set[str] = set()

    def reembedded(tx: Tx) -> Rewrite:
        def rewrite(rec: RecordRow, old: Projection) -> Projection | None:
            if old.vector is None or old.model == embedder.model_id or rec.state not in INDEXED_STATES:
                return None
            payload = open_body(core, tx, rec)
            if payload is None:
                return None
            older.add(old.model)
            vector = embedder.embed(record_text(payload))
            return dataclasses.replace(old, model=embedder.model_id, vector=np.asarray(vector, dtype=np.float32))
        return rewrite

    done = _rederive_projections(core, VECTOR_MODEL_META, embedder.model_id, reembedded)
    if done is None:
        return None
    embedded, _ = done
    if embedded:
        log.info("vectors re-embedded: %d records (%s -> %s)", embedded, ", ".join(sorted(older)), embedder.model_id)
    return embedded
