"""A least-privilege PostgreSQL deployment (issue 57), on the session's real cluster: an owner role
migrates the schema with `engram admin migrate --store URL`, and `engram serve --store` runs as a
serving role that may read and write the tables but change no schema (docs/deployment.md, "Roles:
an owner migrates, a serving role serves": the SQL run here is read from that section, so what it
tells operators to run is what is tested).

- A serving role on an empty or behind schema refuses to start with one line naming the migrate
  command, and changes nothing; a role that may apply part of what is pending applies none of it.
- The serving role cannot CREATE (a table, a temporary table), ALTER the owner's tables, or write
  the migration ledger: each is tried over SQL and refused.
- With the schema current, a real core serving as that role does a capture, an admission, a
  search and a forget over gRPC.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.store.postgres.engine import PostgresEngine
from engram_core.store.postgres.migrations import MIGRATIONS, Migration
from tests.support.core_support import Client, activate
from tests.support.mcp_helpers import ENGRAM, REPO
from tests.support.pg_cluster import PgCluster
from tests.support.replicas import serve_store

_TESTS = Path(__file__).resolve().parents[1]

MIGRATE_LINE = "run `engram admin migrate --store URL` as the role that owns the schema"


@dataclass
class Roles:
    """A database owned by ``owner``, and ``serve``, a role granted only what a core needs."""

    cluster: PgCluster
    dbname: str
    owner: str
    serve: str
    passfile: Path

    def url(self, role: str) -> str:
        return f"postgresql://{role}@127.0.0.1:{self.cluster.port}/{self.dbname}"

    def connect(self, role: str) -> psycopg.Connection:
        return psycopg.connect(self.url(role), autocommit=True, passfile=str(self.passfile))

    @property
    def env(self) -> dict[str, str]:
        return {"PGPASSFILE": str(self.passfile)}

    def tables(self) -> set[str]:
        with self.connect(self.owner) as con:
            return {r[0] for r in con.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}

    def ledger(self) -> list[tuple[int, str]]:
        with self.connect(self.owner) as con:
            return [(int(v), c) for v, c in con.execute("SELECT version, checksum FROM schema_migrations ORDER BY 1")]


DEPLOYMENT = _TESTS.parent / "docs" / "deployment.md"
SECTION = "## Roles: an owner migrates, a serving role serves"


def documented_sql() -> tuple[list[str], list[str]]:
    """The statements of the docs' section: (the superuser's, the owner's), in order, psql's
    meta-commands (``\\password ROLE``, ``\\c DB``) in their places, comments dropped."""
    text = DEPLOYMENT.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"^```sql\n(.*?)^```", section, re.M | re.S)
    assert len(blocks) == 2, "the section gives the superuser's SQL, then the owner's"
    parsed: list[list[str]] = []
    for block in blocks:
        statements, pending = [], ""
        for line in block.splitlines():
            line = re.sub(r"\s*--.*$", "", line).strip()
            if line.startswith("\\"):
                statements.append(line)
                continue
            pending = f"{pending} {line}".strip()
            while ";" in pending:
                statement, pending = pending.split(";", 1)
                statements.append(" ".join(statement.split()))
                pending = pending.strip()
        assert not pending, f"a statement without its semicolon: {pending!r}"
        parsed.append(statements)
    return parsed[0], parsed[1]


def _named(statement: str, names: dict[str, str]) -> str:
    """``statement`` with the docs' role and database names replaced by this test's."""
    for doc_name, name in names.items():
        statement = re.sub(rf"\b{doc_name}\b", name, statement)
    return statement


@pytest.fixture
def roles(pg_cluster: PgCluster, tmp_path: Path) -> Iterator[Roles]:
    """The superuser's part of the docs' section, run as written (names made unique to the test):
    the two roles with their passwords and the database the owner owns and only the serving role
    (and the owner) may connect to."""
    suffix = secrets.token_hex(4)
    owner, serve, dbname = f"engram_owner_{suffix}", f"engram_serve_{suffix}", f"engram_roles_{suffix}"
    names = {"engram_owner": owner, "engram_serve": serve, "engram": dbname}
    passwords = {owner: secrets.token_urlsafe(18), serve: secrets.token_urlsafe(18)}
    passfile = tmp_path / "pgpass"
    lines = pg_cluster.passfile.read_text() + "".join(f"127.0.0.1:*:*:{r}:{p}\n" for r, p in passwords.items())
    with open(os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(lines)
    as_superuser, _ = documented_sql()
    con = pg_cluster.admin()
    try:
        for statement in (_named(s, names) for s in as_superuser):
            if statement.startswith("\\password "):  # psql asks for it; the test has it
                role = statement.split()[1]
                con.execute(f"ALTER ROLE {role} PASSWORD '{passwords[role]}'")
            elif statement.startswith("\\c "):
                con.close()
                con = psycopg.connect(pg_cluster.conninfo(statement.split()[1]), autocommit=True)
            else:
                con.execute(statement)  # type: ignore[arg-type]
    finally:
        con.close()
    made = Roles(pg_cluster, dbname, owner, serve, passfile)
    try:
        yield made
    finally:
        with pg_cluster.admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
            for role in passwords:
                admin.execute(f"DROP ROLE IF EXISTS {role}")


def grant_serving_role(roles: Roles) -> None:
    """The owner's part of the docs' section, once migrated, run as written: the serving role
    reads and writes every table (the ledger: reads only), and so every table a later migration
    creates."""
    _, as_owner = documented_sql()
    names = {"engram_owner": roles.owner, "engram_serve": roles.serve, "engram": roles.dbname}
    with roles.connect(roles.owner) as con:
        for statement in as_owner:
            con.execute(_named(statement, names))  # type: ignore[arg-type]


def engram(roles: Roles, *argv: str) -> subprocess.CompletedProcess[str]:
    """The `engram` console script, its PostgreSQL password from the test's password file only."""
    return subprocess.run([ENGRAM, *argv], cwd=REPO, capture_output=True, text=True, timeout=180,
                          env={**os.environ, **roles.env, "ENGRAM_SEMANTIC": "off"})


def test_a_serving_role_without_ddl_rights_serves_a_schema_its_owner_migrated(roles: Roles, tmp_path: Path) -> None:
    key_dir = tmp_path / "keys"
    # Before any migration: the serving role refuses to start, saying what to run, and creates nothing.
    refused = engram(roles, "serve", "--store", roles.url(roles.serve), "--key-dir", str(key_dir),
                     "--listen", "127.0.0.1:0")
    assert refused.returncode != 0
    said = [line for line in refused.stderr.splitlines() if line.startswith("engram serve:")]
    assert len(said) == 1 and said[0].startswith("engram serve: MIGRATION_LEDGER_INVALID: "), refused.stderr
    assert f"(migrations 1 to {len(MIGRATIONS)} pending)" in said[0]
    assert MIGRATE_LINE in said[0] and roles.serve in said[0], said
    assert roles.tables() == set()

    # The owner migrates, as a step of its own: everything, then nothing the second time.
    first = engram(roles, "admin", "migrate", "--store", roles.url(roles.owner))
    every = [m.version for m in MIGRATIONS]
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == (f"postgresql://{roles.owner}@127.0.0.1:{roles.cluster.port}/{roles.dbname}: "
                                    f"schema at version {every[-1]}; applied now: {every}")
    again = engram(roles, "admin", "--json", "migrate", "--store", roles.url(roles.owner))
    assert again.returncode == 0, again.stderr
    document = json.loads(again.stdout)
    assert document["applied"] == [] and [r["version"] for r in document["ledger"]] == every
    assert roles.ledger() == [(m.version, m.checksum) for m in MIGRATIONS]
    with roles.connect(roles.owner) as con:
        owners = {r[0] for r in con.execute("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")}
    assert owners == {roles.owner}

    grant_serving_role(roles)
    with roles.connect(roles.serve) as con:
        for ddl in ("CREATE TABLE intruder (x INTEGER)", "CREATE TEMPORARY TABLE intruder (x INTEGER)",
                    "ALTER TABLE records ADD COLUMN intruder INTEGER", "CREATE INDEX intruder ON records (state)",
                    "INSERT INTO schema_migrations VALUES (99, 'x', 'x', 0)", "DELETE FROM schema_migrations"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                con.execute(ddl)
        assert con.execute("SELECT count(*) FROM schema_migrations").fetchone() == (len(MIGRATIONS),)

    replica = serve_store(roles.url(roles.serve), key_dir, roles.env)
    try:
        assert f"postgresql://{roles.serve}@" in replica.opened
        activate(replica)  # type: ignore[arg-type]
        ana = Client(replica)  # type: ignore[arg-type]
        cap = ana.capture("Least privilege: the storm-petrel ledger is served by a role that cannot alter it.")
        admitted = ana.admit(cap["candidate_id"])
        assert admitted["outcome"]["status"] == "accepted", admitted
        rid = admitted["outcome"]["record_id"]
        assert [r["record"]["record_id"] for r in ana.search("storm-petrel ledger")["records"]] == [rid]
        ana.call("forget", {"record_id": rid, "idempotency_key": "roles-forget-0001", "reason_ref": "r:asked"},
                 grant=True)
        assert ana.fails("get", {"record_id": rid, "purpose_ref": ana.purpose_ref}) == Code.NOT_FOUND
        assert ana.search("storm-petrel ledger")["records"] == []
        ana.channel.close()
    finally:
        replica.stop()
    assert replica.proc.returncode == 0, replica.proc.stderr.read()[-2000:] if replica.proc.stderr else ""
    with roles.connect(roles.owner) as con:
        assert con.execute("SELECT state FROM records WHERE record_id = %s", [rid]).fetchone() == ("tombstoned",)
    assert "intruder" not in roles.tables()  # nothing the serving role tried to make is there
    assert roles.ledger() == [(m.version, m.checksum) for m in MIGRATIONS]


def test_a_role_that_may_apply_part_of_what_is_pending_applies_none_of_it(roles: Roles,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A core newer than the schema, serving as a role that may create tables (given CREATE on
    the schema here) but not alter the owner's: the first pending migration alone would apply,
    the second is refused, and the schema and ledger stay exactly as they were."""
    assert engram(roles, "admin", "migrate", "--store", roles.url(roles.owner)).returncode == 0
    grant_serving_role(roles)
    before_tables, before_ledger = roles.tables(), roles.ledger()
    n = len(MIGRATIONS)
    newer = (*MIGRATIONS, Migration(n + 1, "a table", "CREATE TABLE newer_table (x INTEGER);"),
             Migration(n + 2, "a column on the owner's table", "ALTER TABLE records ADD COLUMN newer_column INTEGER;"))
    with roles.connect(roles.owner) as con:
        con.execute(f"GRANT CREATE ON SCHEMA public TO {roles.serve}")
    serving = roles.url(roles.serve)
    monkeypatch.setenv("PGPASSFILE", str(roles.passfile))  # the engines opened in this process
    with pytest.raises(EngramError) as behind:
        PostgresEngine(serving, pool_size=1, migrations=newer)
    assert behind.value.code == Code.MIGRATION_LEDGER_INVALID
    assert f"migrations {n + 1} to {n + 2} pending" in behind.value.detail
    assert MIGRATE_LINE in behind.value.detail and "\n" not in behind.value.detail
    assert roles.tables() == before_tables and roles.ledger() == before_ledger
    # The current schema still opens as the serving role, and without CREATE on the schema too.
    with roles.connect(roles.owner) as con:
        con.execute(f"REVOKE CREATE ON SCHEMA public FROM {roles.serve}")
    engine = PostgresEngine(serving, pool_size=1)
    assert engine.migrations_applied_at_open == []
    engine.close()
    # The owner applies both in one step; the serving role's later core opens without DDL.
    PostgresEngine(roles.url(roles.owner), pool_size=1, migrations=newer).close()
    assert [v for v, _ in roles.ledger()] == [*range(1, n + 3)]
    PostgresEngine(serving, pool_size=1, migrations=newer).close()
