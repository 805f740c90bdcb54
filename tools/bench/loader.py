"""Bulk loading of accepted records, in-process, in batches.

Loading 100k records through gRPC capture + admission one pair at a time takes
far too long on a 2-core machine, so the benchmark loads its data set here,
against the core's own objects, and measures the operations afterwards
through gRPC and MCP. Each record is built by the same code the admission path
uses: closed-schema validation of the capture arguments, the effective payload
(host default retention, bound scope), ``payload_digest``/``record_digest``,
``record_id``, a per-record data key wrapped by the store KEK in its key slot,
the sealed body (AES-256-GCM), the sealed search projection (keyed postings and the
local embedding when the semantic channel is loaded), and a hash-chained
journal event. What differs from the per-call path: one DuckDB transaction and
one key-slot fsync per batch instead of per record, no policy decisions, no
candidate/idempotency/audit rows for loaded records (the benchmark never reads
them). docs/performance.md says so.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from engram_core.contract.canonical import canonical_json, digest
from engram_core.contract.scope import Scope
from engram_core.contract.tools import CAPTURE_TOOL, TOOL_NAMES
from engram_core.contract.validation import validate_arguments
from engram_core.crypto.sealing import seal
from engram_core.services.core import Core, new_id, record_id_of
from engram_core.services.lexical import record_fields
from engram_core.services.memory import MemoryService
from engram_core.store.chain import event_digest_of
from engram_core.store.engine import TxEffects
from engram_core.store.fields import FIELD_CODE
from engram_core.store.projection import Projection, seal_projection
from tools.bench.corpus import Corpus

PRINCIPAL = "agent:bench-loader"
AGENT_ID = "bench-loader"


class Progress:
    """A progress bar on stderr (tqdm when installed, else a plain counter)."""

    def __init__(self, total: int, desc: str, enabled: bool = True) -> None:
        self.total, self.desc, self.done, self.enabled = total, desc, 0, enabled
        self._bar = None
        self._t0 = time.monotonic()
        self._last = 0.0
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, unit="rec", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last > 0.5 or self.done >= self.total:
            self._last = now
            rate = self.done / max(now - self._t0, 1e-9)
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(f"\r{self.desc} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                             f"{rate:,.0f} rec/s")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def activate_scope(core: Core, tenant: str, workspace: str) -> None:
    """What AdminService.Activate with no tool list does: every tool on."""
    with core.store.write() as tx:
        tx.set_activation(Scope(tenant, workspace), activated=True, tools=tuple(sorted(TOOL_NAMES)))


def _new_slots(core: Core, owners_keys: list[tuple[str, bytes]]) -> list[int]:
    """Write wrapped data keys into fresh slots; the caller fsyncs once per batch before commit.

    Uses the FileKeyVault's own wrapping (same slot format as ``new_data_key``);
    only the fsync is batched.
    """
    vault = core.vault
    slots = []
    with vault._lock:  # noqa: SLF001 - batched variant of FileKeyVault.new_data_key
        for owner, key in owners_keys:
            slot = vault._next
            vault._next += 1
            os.pwrite(vault._fd, vault._wrap(key, owner), slot * 64)
            slots.append(slot)
    return slots


def load_scope(core: Core, corpus: Corpus, tenant: str, workspace: str, n: int, *, embed: bool,
               batch: int = 500, progress: Progress | None = None, start: int = 0,
               reload: bool = True) -> list[str]:
    """Load ``n`` accepted records into one scope; returns their record ids.

    ``reload=False`` leaves the in-memory index unbuilt (a store loaded only to be opened
    elsewhere, e.g. the start-up benchmark, need not hold a million records' index twice)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    embedder = core.embedder if embed else None
    salt = f"{tenant}.{workspace}"
    ids: list[str] = []
    scope_ref = {"tenant": tenant, "workspace": workspace}
    for lo in range(start, start + n, batch):
        hi = min(start + n, lo + batch)
        now = core.now_ms()
        recs: list[dict[str, Any]] = []
        for i in range(lo, hi):
            args = corpus.capture_args(salt, i)
            validate_arguments(CAPTURE_TOOL, args)
            effective = {**args["payload"], "retention": {"derivative_rule": "make-ineligible"}, "scope_ref": scope_ref}
            payload_digest = digest("payload", effective)
            candidate_id = new_id("cand_")
            record_digest = digest("record", MemoryService._record_core(  # noqa: SLF001
                candidate_id, effective, payload_digest, "asserted",
                type("Ctx", (), {"principal": PRINCIPAL, "agent_id": AGENT_ID})()))
            record_id = record_id_of(record_digest)
            key = AESGCM.generate_key(bit_length=256)
            recs.append({"id": record_id, "cand": candidate_id, "eff": effective, "pd": payload_digest,
                         "rd": record_digest, "key": key,
                         "body": seal(key, canonical_json(effective), kind="record", owner=record_id),
                         "fields": record_fields(effective, core.hasher)})
        vectors = None
        if embedder is not None:
            vectors = embedder.embed_batch(["\n".join(c["text"] for c in r["eff"]["components"]) for r in recs])
        slots = _new_slots(core, [(f"record:{r['id']}", r["key"]) for r in recs])
        os.fdatasync(core.vault._fd)  # noqa: SLF001 - durable before the transaction that references them
        # An engine transaction of its own: the rows go in raw, and moving the scope's journal head
        # past them (``set_scope_head``) is the engine's, not the store port's (issue 62).
        with core.store.engine.write(effects=TxEffects()) as tx:  # type: ignore[attr-defined]
            con = tx._con  # noqa: SLF001
            scope = tx.scope(Scope(tenant, workspace))
            cursor, prev = scope.last_cursor, scope.last_event_digest
            journal: list[list[Any]] = [[] for _ in range(12)]
            records: list[list[Any]] = [[] for _ in range(20)]
            for r, slot in zip(recs, slots, strict=True):
                r["slot"] = slot
                cursor += 1
                event_id = new_id("evt_")
                body = {"bulk_load": True, "record_id": r["id"], "payload_digest": r["pd"]}
                e = {"tenant": tenant, "workspace": workspace, "cursor": str(cursor), "event_id": event_id,
                     "operation": "accept", "target": r["cand"], "from_state": "pending",
                     "to_state": "accepted_current", "at_ms": now, "body": body, "prev_digest": prev}
                ed = event_digest_of(e)
                import json

                for col, v in zip(journal, [tenant, workspace, cursor, event_id, "accept", r["cand"], "pending",
                                            "accepted_current", now, json.dumps(body, sort_keys=True), prev, ed],
                                  strict=True):
                    col.append(v)
                prev = ed
                vt = r["eff"]["valid_time"]
                for col, v in zip(records, [r["id"], tenant, workspace, r["cand"], r["rd"], r["pd"],
                                            "accepted_current", "asserted", PRINCIPAL, AGENT_ID, vt["t"],
                                            vt.get("t_end"), None, "make-ineligible", now, cursor, cursor, None,
                                            r["body"], r["slot"]], strict=True):
                    col.append(v)
            con.execute(
                "INSERT INTO journal SELECT unnest($1::VARCHAR[]), unnest($2::VARCHAR[]), unnest($3::UBIGINT[]), "
                "unnest($4::VARCHAR[]), unnest($5::VARCHAR[]), unnest($6::VARCHAR[]), unnest($7::VARCHAR[]), "
                "unnest($8::VARCHAR[]), unnest($9::BIGINT[]), unnest($10::VARCHAR[]), unnest($11::VARCHAR[]), "
                "unnest($12::VARCHAR[])", journal)
            tx.set_scope_head(Scope(tenant, workspace), cursor, prev)
            con.execute(
                "INSERT INTO records (record_id, tenant, workspace, candidate_id, record_digest, payload_digest, "
                "state, trust_class, principal, agent_id, valid_t, valid_t_end, expires_at_ms, derivative_rule, "
                "accepted_at_ms, accepted_cursor, state_cursor, successor_id, sealed_body, key_slot) SELECT "
                + ", ".join(f"unnest(${k + 1}::{t}[])" for k, t in enumerate(
                    ["VARCHAR"] * 10 + ["BIGINT"] * 3 + ["VARCHAR", "BIGINT", "UBIGINT", "UBIGINT", "VARCHAR",
                                                        "BLOB", "BIGINT"])), records)
            con.execute("INSERT INTO data_keys SELECT unnest($1::VARCHAR[]), unnest($2::BIGINT[]), $3",
                        [[f"record:{r['id']}" for r in recs], slots, now])
            # The search projection as index_record writes it: postings and vector sealed under the
            # record's own key (store/projection.py).
            sealed = [seal_projection(r["key"], r["id"], Projection.of(
                {FIELD_CODE[name]: counts for name, counts in r["fields"].items()},
                *((embedder.model_id, vectors[k]) if embedder is not None and vectors is not None else ("", None))))
                for k, r in enumerate(recs)]
            con.execute("INSERT INTO projections SELECT unnest($1::VARCHAR[]), $2, $3, unnest($4::BLOB[])",
                        [[r["id"] for r in recs], tenant, workspace, sealed])
        ids.extend(r["id"] for r in recs)
        if progress is not None:
            progress.update(len(recs))
    if reload:
        core.store.reload_indexes()  # the projections went in as raw rows, past DuckDBTx's index changes
    return ids
