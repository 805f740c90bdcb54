"""Versioned schema migrations (SPEC §10) with a ledger.

Each migration has a version, a name and its SQL; the ledger records the
checksum of what was applied. A ledger that disagrees with this code (unknown
version, different checksum, gap) is MIGRATION_LEDGER_INVALID: the store will
not open rather than guess.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    # A data conversion SQL cannot do, run by the store in the migration's transaction after
    # ``sql``: the name of a store method (it may need the key vault). Part of the checksum.
    step: str | None = None

    @property
    def checksum(self) -> str:
        text = self.sql if self.step is None else f"{self.sql}\0step:{self.step}"
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _key_slot_column(table: str, id_col: str, owner: str) -> str:
    """Rows of ``table`` name their data key's slot, filled from the data_keys ledger (owner
    ``<owner>:<id>``). A row's slot never changes (slots are never reused, and unwrapping is bound
    to the owner), so the row can name it. data_keys stays the ledger of live keys: a destroyed
    key's slot is zeroed in the vault and its data_keys row deleted, so the number alone opens
    nothing."""
    return f"""
ALTER TABLE {table} ADD COLUMN key_slot BIGINT;
UPDATE {table} SET key_slot = k.slot FROM data_keys k WHERE k.owner = '{owner}:' || {table}.{id_col};
"""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial schema",
        """
CREATE TABLE scopes (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL,
  activated BOOLEAN NOT NULL, tools VARCHAR NOT NULL,
  authorization_epoch BIGINT NOT NULL,
  last_cursor UBIGINT NOT NULL, last_event_digest VARCHAR NOT NULL,
  PRIMARY KEY (tenant, workspace));
CREATE TABLE journal (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, cursor UBIGINT NOT NULL,
  event_id VARCHAR NOT NULL, operation VARCHAR NOT NULL, target VARCHAR NOT NULL,
  from_state VARCHAR NOT NULL, to_state VARCHAR NOT NULL, at_ms BIGINT NOT NULL,
  body VARCHAR NOT NULL, prev_digest VARCHAR NOT NULL, event_digest VARCHAR NOT NULL,
  PRIMARY KEY (tenant, workspace, cursor));
CREATE TABLE candidates (
  candidate_id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL,
  principal VARCHAR NOT NULL, agent_id VARCHAR NOT NULL, session VARCHAR NOT NULL,
  state VARCHAR NOT NULL, payload_digest VARCHAR NOT NULL, record_digest VARCHAR NOT NULL,
  trust_class VARCHAR NOT NULL, facts VARCHAR NOT NULL, sealed_envelope BLOB,
  captured_at_ms BIGINT NOT NULL, cursor UBIGINT NOT NULL, decision VARCHAR);
CREATE TABLE data_keys (
  owner VARCHAR PRIMARY KEY, slot BIGINT NOT NULL, created_at_ms BIGINT NOT NULL);
CREATE TABLE key_destructions (
  owner VARCHAR PRIMARY KEY, destroyed_at_ms BIGINT NOT NULL, reason VARCHAR NOT NULL);
CREATE TABLE records (
  record_id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL,
  candidate_id VARCHAR NOT NULL, record_digest VARCHAR NOT NULL, payload_digest VARCHAR NOT NULL,
  state VARCHAR NOT NULL, trust_class VARCHAR NOT NULL, principal VARCHAR NOT NULL, agent_id VARCHAR NOT NULL,
  valid_t BIGINT NOT NULL, valid_t_end BIGINT, expires_at_ms BIGINT, derivative_rule VARCHAR NOT NULL,
  accepted_at_ms BIGINT NOT NULL, accepted_cursor UBIGINT NOT NULL, state_cursor UBIGINT NOT NULL,
  successor_id VARCHAR, sealed_body BLOB);
CREATE INDEX records_scope ON records (tenant, workspace);
CREATE TABLE tombstones (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, payload_digest VARCHAR NOT NULL,
  record_id VARCHAR NOT NULL, cursor UBIGINT NOT NULL, at_ms BIGINT NOT NULL,
  PRIMARY KEY (tenant, workspace, payload_digest, record_id));
CREATE TABLE idempotency (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, principal VARCHAR NOT NULL, key VARCHAR NOT NULL,
  tool VARCHAR NOT NULL, target VARCHAR NOT NULL, request_digest VARCHAR NOT NULL,
  outcome VARCHAR NOT NULL, created_at_ms BIGINT NOT NULL,
  PRIMARY KEY (tenant, workspace, principal, key));
CREATE TABLE used_confirmations (
  grant_id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, used_at_ms BIGINT NOT NULL);
CREATE TABLE audit (
  seq UBIGINT PRIMARY KEY, at_ms BIGINT NOT NULL, audit_id VARCHAR NOT NULL,
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, principal VARCHAR NOT NULL, agent_id VARCHAR NOT NULL,
  operation VARCHAR NOT NULL, outcome VARCHAR NOT NULL, target_digest VARCHAR NOT NULL,
  decisions VARCHAR NOT NULL, prev_digest VARCHAR NOT NULL, row_digest VARCHAR NOT NULL);
CREATE TABLE postings (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, term BIGINT NOT NULL,
  record_id VARCHAR NOT NULL, field VARCHAR NOT NULL, tf INTEGER NOT NULL, field_len INTEGER NOT NULL);
CREATE INDEX postings_term ON postings (tenant, workspace, term);
CREATE INDEX postings_record ON postings (record_id);
CREATE TABLE field_stats (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, field VARCHAR NOT NULL,
  doc_count BIGINT NOT NULL, total_len BIGINT NOT NULL,
  PRIMARY KEY (tenant, workspace, field));
CREATE TABLE vectors (
  record_id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL,
  model VARCHAR NOT NULL, embedding FLOAT[]);
CREATE TABLE trusted_host_keys (
  key_id VARCHAR PRIMARY KEY, public_key_pem VARCHAR NOT NULL, added_at_ms BIGINT NOT NULL);
CREATE TABLE store_meta (k VARCHAR PRIMARY KEY, v VARCHAR NOT NULL);
""",
    ),
    Migration(
        2,
        "lexical document numbers, term document frequencies, term-ordered postings",
        # Search at 100k records spent most of its time counting document frequencies over
        # postings and joining/grouping on VARCHAR record ids over an unordered table
        # (docs/search.md, Performance). Records get an integer document number from a
        # sequence (filled by the column default, so inserts need not name it); postings
        # carry it and are rewritten in term order so DuckDB's zone maps skip row groups;
        # term_stats keeps each scope's per-term document frequency, maintained by
        # index_record/unindex_record in the admission and forget transactions.
        """
CREATE SEQUENCE record_doc_seq START 1;
ALTER TABLE records ADD COLUMN doc BIGINT DEFAULT nextval('record_doc_seq');
CREATE TABLE postings_by_term AS
  SELECT p.tenant, p.workspace, p.term, p.record_id, p.field, p.tf, p.field_len, r.doc
  FROM postings p JOIN records r ON r.record_id = p.record_id
  ORDER BY p.tenant, p.workspace, p.term, r.doc;
DROP INDEX postings_term;
DROP INDEX postings_record;
DROP TABLE postings;
ALTER TABLE postings_by_term RENAME TO postings;
CREATE INDEX postings_record ON postings (record_id);
CREATE TABLE term_stats (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, term BIGINT NOT NULL, df BIGINT NOT NULL,
  PRIMARY KEY (tenant, workspace, term));
INSERT INTO term_stats SELECT tenant, workspace, term, count(DISTINCT record_id) FROM postings GROUP BY ALL;
""",
    ),
    Migration(
        3,
        "records carry their data key's slot",
        # Reading a record body needed a second lookup (data_keys by owner) per read.
        _key_slot_column("records", "record_id", "record"),
    ),
    Migration(
        4,
        "no term_stats table",
        # Document frequencies served the SQL BM25 query; ranking now reads the in-memory index,
        # which counts them from the postings when it loads. Keeping the table meant an upsert of
        # every term on each admission and two statements on each forget for nothing.
        """
DROP TABLE term_stats;
""",
    ),
    Migration(
        5,
        "record links: reconciliation families and derivative sources",
        # Reconciliation (which current records share a family with a newcomer) and derivative
        # rules (which records cite a record that leaves eligibility) must not open sealed bodies.
        # Identifiers and labels only; records admitted before this migration gain their links
        # from rebuild_projections, which re-derives them from the bodies.
        """
CREATE TABLE record_families (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, family_ref VARCHAR NOT NULL,
  record_id VARCHAR NOT NULL, primary_kind VARCHAR NOT NULL,
  PRIMARY KEY (tenant, workspace, family_ref, record_id));
CREATE INDEX record_families_record ON record_families (record_id);
CREATE TABLE record_sources (
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, source_id VARCHAR NOT NULL, record_id VARCHAR NOT NULL,
  PRIMARY KEY (tenant, workspace, source_id, record_id));
CREATE INDEX record_sources_record ON record_sources (record_id);
""",
    ),
    Migration(
        6,
        "search projections sealed under each record's data key",
        # SPEC §10: postings (keyed term hashes) and vectors stored as plain rows outlived a forget
        # in freed DuckDB pages, and anyone holding DIR/index.key could test words against them.
        # Each record's projection is now one blob sealed under the record's key, so destroying
        # the key shreds it everywhere. seal_legacy_projections moves the old rows into sealed
        # blobs, drops the plain tables, and has the store rewrite its file (freed pages holding
        # the old rows are not carried over).
        """
CREATE TABLE projections (
  record_id VARCHAR PRIMARY KEY, tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, sealed BLOB NOT NULL);
""",
        step="seal_legacy_projections",
    ),
    Migration(
        7,
        "payload digest indexes",
        # Every admission asks twice whether its content is current or was forgotten in its scope
        # (SPEC §5 duplicates and forgotten-content protection). Without an index that was a scan
        # of the records table: 3.7 ms at 100k records, growing with the store; by index, 0.5 ms.
        """
CREATE INDEX records_payload ON records (payload_digest);
CREATE INDEX tombstones_payload ON tombstones (payload_digest);
""",
    ),
    Migration(
        8,
        "candidates carry their data key's slot",
        # As migration 3 for records: an admission opened its candidate's envelope after a lookup
        # of the slot in data_keys by owner (one more statement per admission and withdrawal).
        _key_slot_column("candidates", "candidate_id", "candidate"),
    ),
    Migration(
        9,
        "audit rows on several chains",
        # One global chain meant one head every call took its place behind: several writers (the
        # cores of one PostgreSQL store) could not extend it without a hot row per call. Each row
        # now names its chain (docs/architecture.md, "The audit log's chains"): its scope's for
        # rows written in a write transaction, its writer's for the rows of calls that change
        # nothing. Rows written before keep the one old chain ("": their digests never covered a
        # chain field). The primary key becomes (chain, seq), so the table is rebuilt.
        """
CREATE TABLE audit_chained (
  chain VARCHAR NOT NULL, seq UBIGINT NOT NULL, at_ms BIGINT NOT NULL, audit_id VARCHAR NOT NULL,
  tenant VARCHAR NOT NULL, workspace VARCHAR NOT NULL, principal VARCHAR NOT NULL, agent_id VARCHAR NOT NULL,
  operation VARCHAR NOT NULL, outcome VARCHAR NOT NULL, target_digest VARCHAR NOT NULL,
  decisions VARCHAR NOT NULL, prev_digest VARCHAR NOT NULL, row_digest VARCHAR NOT NULL,
  PRIMARY KEY (chain, seq));
INSERT INTO audit_chained SELECT '', seq, at_ms, audit_id, tenant, workspace, principal, agent_id, operation,
  outcome, target_digest, decisions, prev_digest, row_digest FROM audit ORDER BY seq;
DROP TABLE audit;
ALTER TABLE audit_chained RENAME TO audit;
""",
    ),
    Migration(
        10,
        "key destructions name the KEK generation that wrapped the key",
        # A destroyed key still sits in copies of the key files made while it lived, wrapped by
        # the generations of the KEK ring then; its destruction is complete once they are all
        # retired (docs/admin.md, "Keys"). Destructions recorded before are taken as wrapped by
        # the generation active at this migration.
        """
ALTER TABLE key_destructions ADD COLUMN generation BIGINT;
""",
        step="destructions_wrapped_by_active_generation",
    ),
    Migration(
        11,
        "audit rows name the context nonce their call claimed",
        # So that a restarted core refuses a context used just before the restart: the nonces of
        # the last context lifetime are read back from the audit log at open (context_nonces.py).
        """
ALTER TABLE audit ADD COLUMN context_nonce VARCHAR DEFAULT '';
""",
    ),
    Migration(
        12,
        "records carry their capture session and instant",
        # Search neighbours (profile version 4) link records an agent captured in one host-bound
        # session close together in time, which needs the session and the capture instant at the
        # index without opening candidates: both are copied from the candidate at admission, as
        # trust class, principal and agent already are. Records admitted before this migration
        # take them from their candidate row, which outlives admission (only its envelope goes).
        """
ALTER TABLE records ADD COLUMN session VARCHAR;
ALTER TABLE records ADD COLUMN captured_at_ms BIGINT;
UPDATE records SET session = c.session, captured_at_ms = c.captured_at_ms
  FROM candidates c WHERE c.candidate_id = records.candidate_id;
""",
    ),
    Migration(
        13,
        "trusted host keys carry the tenants and maintenance scopes they serve",
        # Issue 26.3: any trusted host key could sign contexts for every tenant, maintenance
        # scopes included. Each key now names what it serves (JSON lists of tenants and scopes,
        # or all tenants) and the authz policy decides on it. A key trusted before this migration
        # gets the defaults, which serve nothing: the operator binds it again (`engram admin
        # trust-host-key --tenant T`). The data directory's own host.key is the operator's and is
        # bound at every start, not here.
        """
ALTER TABLE trusted_host_keys ADD COLUMN tenants VARCHAR DEFAULT '[]';
ALTER TABLE trusted_host_keys ADD COLUMN all_tenants BOOLEAN DEFAULT false;
ALTER TABLE trusted_host_keys ADD COLUMN maintenance_scopes VARCHAR DEFAULT '[]';
""",
    ),
)

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
  version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, checksum VARCHAR NOT NULL, applied_at_ms BIGINT NOT NULL)
"""
