"""Versioned schema migrations of the PostgreSQL engine (SPEC §10), with a ledger.

As the DuckDB engine's (``store/duckdb/migrations.py``): each migration has a version, a name
and its SQL; the ledger (``schema_migrations``) records the checksum of what was applied, and a
ledger that disagrees with this code (an unknown version, another checksum, a gap) is
MIGRATION_LEDGER_INVALID. An engine older than its database (the ledger holds versions this
code does not know) refuses to open rather than write rows a newer schema means differently.
Migrations run under a session advisory lock (``engine.PostgresEngine.check_migrations``), so
replicas starting together on an empty database apply each migration once.

Applying and checking are apart (``run_migrations``): a store whose ledger is current is checked with reads
alone (no ``CREATE TABLE IF NOT EXISTS``, which PostgreSQL refuses a role without CREATE on the
schema even when the table exists), so a serving role without DDL rights opens it. What is
pending is applied in one transaction, ledger included: a role that may not apply all of it
applies none of it, and is told to run ``engram admin migrate --store URL`` as the schema's owner
(docs/deployment.md, "Roles: an owner migrates, a serving role serves").

Migration 1 is the whole schema as DuckDB's stands after its migration 10 (the same tables,
columns and meaning; PostgreSQL has no history of its own to replay), plus what several writers
need that one writer kept in memory: ``audit_heads`` (each audit chain's head, locked by the
transaction that extends the chain) and the key vault's ``vault_keys``, ``vault_state`` and ``vault_rings``
(``engram_core/store/postgres/keyvault.py``). Migrations 2 and 3 are DuckDB's 11 and 12; 4 holds
what one DuckDB core keeps in memory and several cores must share (context nonce claims, page
pins, usage buckets); 5 is DuckDB's 13; 6 the trusted host keys' trust version (``host_key_trust``,
moved by a trigger on every change, which each core compares its copy of the keys against). Types:
identifiers ``TEXT COLLATE "C"`` (ordered by code point, as DuckDB orders VARCHAR, whatever the
database's default collation), cursors and instants ``BIGINT``, sealed bytes ``BYTEA``, and JSON documents ``TEXT`` holding the exact
bytes the core wrote (``JSONB`` would re-serialize them, and stored outcomes are replayed
byte-identical, SPEC §7).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import psycopg

from engram_core.contract.errors import Code, EngramError
from engram_core.store.sql.ledger import pending_migrations as check_ledger

# Identifiers compare and sort by code point (DuckDB's VARCHAR order) in any database.
_ID = 'TEXT COLLATE "C"'


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return "sha256:" + hashlib.sha256(self.sql.encode()).hexdigest()


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "initial schema (DuckDB's after its migration 10), audit chain heads, the key vault",
        f"""
CREATE TABLE scopes (
  tenant {_ID} NOT NULL, workspace {_ID} NOT NULL,
  activated BOOLEAN NOT NULL, tools TEXT NOT NULL,
  authorization_epoch BIGINT NOT NULL,
  last_cursor BIGINT NOT NULL, last_event_digest TEXT NOT NULL,
  PRIMARY KEY (tenant, workspace));
CREATE TABLE journal (
  tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, cursor BIGINT NOT NULL,
  event_id {_ID} NOT NULL, operation TEXT NOT NULL, target {_ID} NOT NULL,
  from_state TEXT NOT NULL, to_state TEXT NOT NULL, at_ms BIGINT NOT NULL,
  body TEXT NOT NULL, prev_digest TEXT NOT NULL, event_digest TEXT NOT NULL,
  PRIMARY KEY (tenant, workspace, cursor));
CREATE INDEX journal_event_id ON journal (tenant, workspace, event_id);
CREATE TABLE candidates (
  candidate_id {_ID} PRIMARY KEY, tenant {_ID} NOT NULL, workspace {_ID} NOT NULL,
  principal {_ID} NOT NULL, agent_id {_ID} NOT NULL, session {_ID} NOT NULL,
  state TEXT NOT NULL, payload_digest TEXT NOT NULL, record_digest TEXT NOT NULL,
  trust_class TEXT NOT NULL, facts TEXT NOT NULL, sealed_envelope BYTEA,
  captured_at_ms BIGINT NOT NULL, cursor BIGINT NOT NULL, decision TEXT, key_slot BIGINT);
CREATE INDEX candidates_scope_state ON candidates (tenant, workspace, state, cursor);
CREATE TABLE data_keys (
  owner {_ID} PRIMARY KEY, slot BIGINT NOT NULL, created_at_ms BIGINT NOT NULL);
CREATE INDEX data_keys_slot ON data_keys (slot);
CREATE TABLE key_destructions (
  owner {_ID} PRIMARY KEY, destroyed_at_ms BIGINT NOT NULL, reason TEXT NOT NULL, generation BIGINT);
-- doc: the record's place in document order (rows appended under the scope lock, so within a
-- scope it is commit order), which the search index's neighbourhoods follow (DuckDB: migration 2).
CREATE TABLE records (
  record_id {_ID} PRIMARY KEY, tenant {_ID} NOT NULL, workspace {_ID} NOT NULL,
  candidate_id {_ID} NOT NULL, record_digest TEXT NOT NULL, payload_digest TEXT NOT NULL,
  state TEXT NOT NULL, trust_class TEXT NOT NULL, principal {_ID} NOT NULL, agent_id {_ID} NOT NULL,
  valid_t BIGINT NOT NULL, valid_t_end BIGINT, expires_at_ms BIGINT, derivative_rule TEXT NOT NULL,
  accepted_at_ms BIGINT NOT NULL, accepted_cursor BIGINT NOT NULL, state_cursor BIGINT NOT NULL,
  successor_id {_ID}, sealed_body BYTEA, key_slot BIGINT,
  doc BIGINT GENERATED ALWAYS AS IDENTITY);
CREATE INDEX records_scope ON records (tenant, workspace, accepted_cursor);
CREATE INDEX records_payload ON records (tenant, workspace, payload_digest);
CREATE INDEX records_doc ON records (doc);
CREATE TABLE tombstones (
  tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, payload_digest TEXT NOT NULL,
  record_id {_ID} NOT NULL, cursor BIGINT NOT NULL, at_ms BIGINT NOT NULL,
  PRIMARY KEY (tenant, workspace, payload_digest, record_id));
CREATE TABLE idempotency (
  tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, principal {_ID} NOT NULL, key {_ID} NOT NULL,
  tool TEXT NOT NULL, target {_ID} NOT NULL, request_digest TEXT NOT NULL,
  outcome TEXT NOT NULL, created_at_ms BIGINT NOT NULL,
  PRIMARY KEY (tenant, workspace, principal, key));
CREATE TABLE used_confirmations (
  grant_id {_ID} PRIMARY KEY, tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, used_at_ms BIGINT NOT NULL);
CREATE TABLE audit (
  chain {_ID} NOT NULL, seq BIGINT NOT NULL, at_ms BIGINT NOT NULL, audit_id {_ID} NOT NULL,
  tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, principal {_ID} NOT NULL, agent_id {_ID} NOT NULL,
  operation TEXT NOT NULL, outcome TEXT NOT NULL, target_digest TEXT NOT NULL,
  decisions TEXT NOT NULL, prev_digest TEXT NOT NULL, row_digest TEXT NOT NULL,
  PRIMARY KEY (chain, seq));
CREATE INDEX audit_scope ON audit (tenant, workspace);
-- Each chain's last row (seq 0: none yet), kept with the rows in the same transaction: the
-- transaction that extends a chain locks its head (SELECT ... FOR UPDATE), so under several
-- writers each chain stays dense and unforked (DuckDB's one writer kept the heads in memory).
CREATE TABLE audit_heads (
  chain {_ID} PRIMARY KEY, seq BIGINT NOT NULL, row_digest TEXT NOT NULL);
CREATE TABLE record_families (
  tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, family_ref {_ID} NOT NULL,
  record_id {_ID} NOT NULL, primary_kind TEXT NOT NULL,
  PRIMARY KEY (tenant, workspace, family_ref, record_id));
CREATE INDEX record_families_record ON record_families (record_id);
CREATE TABLE record_sources (
  tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, source_id {_ID} NOT NULL, record_id {_ID} NOT NULL,
  PRIMARY KEY (tenant, workspace, source_id, record_id));
CREATE INDEX record_sources_record ON record_sources (record_id);
CREATE INDEX record_sources_source ON record_sources (source_id);
CREATE TABLE projections (
  record_id {_ID} PRIMARY KEY, tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, sealed BYTEA NOT NULL);
CREATE INDEX projections_scope ON projections (tenant, workspace);
CREATE TABLE trusted_host_keys (
  key_id {_ID} PRIMARY KEY, public_key_pem TEXT NOT NULL, added_at_ms BIGINT NOT NULL);
CREATE TABLE store_meta (k {_ID} PRIMARY KEY, v TEXT NOT NULL);
-- The key vault of several cores (crypto/pg_keyvault.py): data keys wrapped by the KEK ring kept
-- outside the database (62 bytes: nonce, wrapped key, tag), addressed by the ref the engines
-- store in key_slot. owner: the identifier the wrapping is bound to (reconcile uses it).
CREATE TABLE vault_keys (
  ref BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, owner {_ID} NOT NULL,
  version SMALLINT NOT NULL, generation INTEGER NOT NULL, wrapped BYTEA NOT NULL,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE INDEX vault_keys_generation ON vault_keys (generation);
CREATE INDEX vault_keys_owner ON vault_keys (owner);
-- The ring's active generation as the cores last agreed on it: a key is only inserted wrapped by
-- it, so no core with a stale copy of the ring file wraps a key by a generation being retired.
CREATE TABLE vault_state (
  id INTEGER PRIMARY KEY CHECK (id = 1), active_generation INTEGER NOT NULL);
-- Which ring this store's keys are wrapped by: per generation, a constant sealed by that KEK (the
-- first core to use the generation writes it). A core whose key directory holds another ring
-- cannot open it and refuses to start, instead of wrapping keys no other core could open.
CREATE TABLE vault_rings (
  generation INTEGER PRIMARY KEY, canary BYTEA NOT NULL);
""",
    ),
    Migration(
        2,
        "audit rows name the context nonce their call claimed (DuckDB's migration 11)",
        # A restarted core refuses a context used just before the restart: the nonces of the last
        # context lifetime are read back from the audit log at open (context_nonces.py), by time.
        """
ALTER TABLE audit ADD COLUMN context_nonce TEXT NOT NULL DEFAULT '';
CREATE INDEX audit_nonce_at ON audit (at_ms) WHERE context_nonce <> '';
""",
    ),
    Migration(
        3,
        "records carry their capture session and instant (DuckDB's migration 12)",
        # Copied from the candidate at admission (search profile v4's neighbours); records admitted
        # before take them from their candidate row, which outlives admission.
        f"""
ALTER TABLE records ADD COLUMN session {_ID};
ALTER TABLE records ADD COLUMN captured_at_ms BIGINT;
UPDATE records SET session = c.session, captured_at_ms = c.captured_at_ms
  FROM candidates c WHERE c.candidate_id = records.candidate_id;
""",
    ),
    Migration(
        4,
        "state every core shares: context nonce claims, search page pins, usage buckets",
        # What one DuckDB core keeps in its memory (no DuckDB migration): a context replayed on
        # another core is refused, a cursor from one core pages on another, and a principal's quota
        # is one quota however its calls are spread (docs/architecture.md, "several cores").
        f"""
CREATE TABLE context_nonce_claims (ref {_ID} PRIMARY KEY, expires_at_ms BIGINT NOT NULL);
CREATE INDEX context_nonce_claims_expiry ON context_nonce_claims (expires_at_ms);
CREATE TABLE page_pins (
  pin_id {_ID} PRIMARY KEY, tenant {_ID} NOT NULL, workspace {_ID} NOT NULL, pin BYTEA NOT NULL,
  expires_at_ms BIGINT NOT NULL);
CREATE INDEX page_pins_expiry ON page_pins (expires_at_ms);
CREATE TABLE usage_buckets (
  subject {_ID} NOT NULL, time_window TEXT NOT NULL, bucket_start_ms BIGINT NOT NULL, metric TEXT NOT NULL,
  amount BIGINT NOT NULL, PRIMARY KEY (subject, time_window, bucket_start_ms, metric));
CREATE INDEX usage_buckets_start ON usage_buckets (bucket_start_ms);
""",
    ),
    Migration(
        5,
        "trusted host keys carry the tenants and maintenance scopes they serve (DuckDB's migration 13)",
        # Issue 26.3: each key names what it serves and the authz policy decides on it; a key
        # trusted before gets the defaults, which serve nothing until the operator binds it again.
        """
ALTER TABLE trusted_host_keys ADD COLUMN tenants TEXT NOT NULL DEFAULT '[]';
ALTER TABLE trusted_host_keys ADD COLUMN all_tenants BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE trusted_host_keys ADD COLUMN maintenance_scopes TEXT NOT NULL DEFAULT '[]';
""",
    ),
    Migration(
        6,
        "a trust version every change to the trusted host keys moves (no DuckDB migration)",
        # Each core keeps the trusted keys in memory; a core that finds the version moved past the
        # one its copy was loaded at reloads it before it trusts a context (docs/security.md). The
        # trigger moves it in the changing transaction itself, whoever changed a row (any core, a
        # restore), and only for rows changed (a re-insert that does nothing moves nothing).
        """
CREATE TABLE host_key_trust (id INTEGER PRIMARY KEY CHECK (id = 1), version BIGINT NOT NULL);
INSERT INTO host_key_trust VALUES (1, 0);
CREATE FUNCTION host_key_trust_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE host_key_trust SET version = version + 1 WHERE id = 1;
  RETURN NULL;
END $$;
CREATE TRIGGER trusted_host_keys_changed AFTER INSERT OR UPDATE OR DELETE ON trusted_host_keys
  FOR EACH ROW EXECUTE FUNCTION host_key_trust_moved();
""",
    ),
)

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
  version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)
"""

# pg_advisory_lock keys (one bigint each): migrations, and the KEK ring's rotation and retirement.
MIGRATION_LOCK = 0x656E6772616D0001  # "engram" + 1
RING_LOCK = 0x656E6772616D0002


# What a core that may not change the schema is told to run, as the role that owns it.
MIGRATE_COMMAND = "engram admin migrate --store URL"


def read_ledger(conn: psycopg.Connection) -> dict[int, str]:
    """The ledger's versions and checksums; empty when there is no ledger yet. Reads only:
    a role without CREATE on the schema gets here on a store that is already migrated."""
    found = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return {}
    return {int(v): c for v, c in conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()}


def pending_migrations(ledger: dict[int, str], migrations: tuple[Migration, ...]) -> list[Migration]:
    """What of ``migrations`` the ledger lacks, after checking it against them: versions the
    code does not know (a newer engine migrated the database), another checksum, or a gap are
    MIGRATION_LEDGER_INVALID (``sql/ledger.py``)."""
    return check_ledger(ledger, migrations, newer_engine=True)


def run_migrations(conn: psycopg.Connection, migrations: tuple[Migration, ...], *, apply: bool) -> list[int]:
    """Check the ledger against ``migrations`` and apply what is pending (``apply``; else a
    pending one is MIGRATION_LEDGER_INVALID); the versions applied. The caller holds
    ``MIGRATION_LOCK``. Everything pending goes in one transaction with the ledger's rows, so a
    failure leaves the schema as it was; a role lacking the privileges is
    MIGRATION_LEDGER_INVALID naming ``MIGRATE_COMMAND`` (one line: ``engram serve`` prints it)."""
    pending = pending_migrations(read_ledger(conn), migrations)
    if not pending:
        return []
    versions = [m.version for m in pending]
    if not apply:
        raise EngramError(Code.MIGRATION_LEDGER_INVALID, "migrations pending")
    conn.execute("BEGIN")
    try:
        conn.execute(LEDGER_DDL)  # type: ignore[arg-type]
        for m in pending:
            conn.execute(m.sql)  # type: ignore[arg-type]  # several statements: the simple protocol
            conn.execute("INSERT INTO schema_migrations VALUES (%s, %s, %s, %s)",
                         [m.version, m.name, m.checksum, time.time_ns() // 1_000_000])
        conn.execute("COMMIT")
    except psycopg.errors.InsufficientPrivilege:
        conn.execute("ROLLBACK")
        row = conn.execute("SELECT current_user").fetchone()
        role = row[0] if row else "?"
        # Pending versions are always the code's last ones (the ledger has no gaps): first to last.
        which = f"migration {versions[0]}" if len(versions) == 1 else f"migrations {versions[0]} to {versions[-1]}"
        raise EngramError(Code.MIGRATION_LEDGER_INVALID,
                          f"the store's schema is behind this core ({which} pending) and role "
                          f"{role} may not change it: run `{MIGRATE_COMMAND}` as the role that owns the "
                          f"schema, then start again") from None
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return versions
