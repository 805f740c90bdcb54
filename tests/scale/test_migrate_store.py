"""`engram admin migrate-store` (issue 28): an embedded DuckDB store moves into an empty
PostgreSQL database, and `engram serve --store` then serves it: every scope's records answer get
and search there, signed by the host key the hosts already had; a record forgotten before the
move stays gone; trusted host keys keep what they serve. A source a core still serves, or a
database that already holds a store, is refused and nothing changes (the refusal for a served
source says to stop its core, and the key directory it made is removed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engram_core.api import admin_pb2
from engram_core.app.composition import start_core
from engram_core.contract.errors import Code
from engram_core.trust.hostkeys import key_id, public_pem
from tests.support.core_support import Client, activate
from tests.support.mcp_helpers import ENGRAM, REPO, admin_json
from tests.support.pg_cluster import Database
from tests.support.replicas import serve_store


def _engram(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, *argv], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, "ENGRAM_SEMANTIC": "off"})


def test_an_embedded_store_moves_into_postgresql_and_serves_there(pg_database: Database, tmp_path: Path) -> None:
    source_dir, key_dir = tmp_path / "duck", tmp_path / "pg-keys"
    partner = Ed25519PrivateKey.generate().public_key()
    (tmp_path / "partner.pub").write_text(public_pem(partner))
    source = start_core(source_dir, semantic=False)
    try:
        activate(source)
        activate(source, workspace="beta")
        alpha, beta = Client(source), Client(source, workspace="beta")
        kept = alpha.remember("Store move: the gannet decision names the primary region.")
        other = beta.remember("Store move: the puffin convention lives in the beta workspace.")
        gone = alpha.remember("Store move: the guillemot note is forgotten before the move.")
        alpha.call("forget", {"record_id": gone, "idempotency_key": "store-move-forget-01", "reason_ref": "r:x"},
                   grant=True)
        alpha.channel.close()
        beta.channel.close()
        bound = _engram({}, "admin", "--core", source.address, "--host-key", str(source.host_key_path),
                        "trust-host-key", "--public-key", str(tmp_path / "partner.pub"), "--tenant", "globex")
        assert bound.returncode == 0, bound.stderr
        served = _engram(pg_database.env, "admin", "migrate-store", "--from", str(source_dir),
                         "--to", pg_database.conninfo, "--key-dir", str(key_dir))
        # A core still serves the source: retrying cannot help, so the line says to stop it (issue 60
        # item 7), and the key directory this command made is gone again.
        assert served.returncode != 0 and "still serving" in served.stderr and "stop that core" in served.stderr
        assert "retry later" not in served.stderr
        assert not key_dir.exists()
    finally:
        source.stop()

    moved = _engram(pg_database.env, "admin", "--json", "migrate-store", "--from", str(source_dir),
                    "--to", pg_database.conninfo, "--key-dir", str(key_dir))
    assert moved.returncode == 0, moved.stdout + moved.stderr
    summary = json.loads(moved.stdout)
    assert summary["records_restored"] == 2 and summary["scopes"] == 2 and summary["records_unrecoverable"] == []
    assert summary["trusted_host_keys_restored"] >= 1
    assert set(summary["key_files_copied"]) == {"host.key", "backup.key", "anchor.key"}
    assert (key_dir / "host.key").read_bytes() == (source_dir / "host.key").read_bytes()
    assert (key_dir / "store.kek").read_bytes() != (source_dir / "store.kek").read_bytes()  # a ring of its own
    # The planner has statistics of what the restore filled (ANALYZE, not autovacuum's next pass):
    # without them a lookup by record id scanned the whole scope.
    with pg_database.connect() as conn:
        analyzed = dict(conn.execute("SELECT relname, last_analyze IS NOT NULL FROM pg_stat_user_tables "
                                     "WHERE relname = ANY(%s)", [["records", "journal", "projections"]]).fetchall())
    assert analyzed == {"records": True, "journal": True, "projections": True}

    again = _engram(pg_database.env, "admin", "migrate-store", "--from", str(source_dir),
                    "--to", pg_database.conninfo, "--key-dir", str(key_dir))
    assert again.returncode != 0 and "RESTORE_REFUSED" in again.stderr  # the database holds a store now

    replica = serve_store(pg_database.conninfo, key_dir, pg_database.env)
    try:
        # The hosts' key of the embedded store signs here too.
        alpha = Client(replica, key_path=source_dir / "host.key")  # type: ignore[arg-type]
        beta = Client(replica, workspace="beta", key_path=source_dir / "host.key")  # type: ignore[arg-type]
        assert alpha.get(kept)["record"]["record_id"] == kept
        assert [r["record"]["record_id"] for r in alpha.search("gannet decision")["records"]] == [kept]
        assert [r["record"]["record_id"] for r in beta.search("puffin convention")["records"]] == [other]
        assert alpha.fails("get", {"record_id": gone, "purpose_ref": alpha.purpose_ref}) == Code.NOT_FOUND
        assert alpha.search("guillemot note")["records"] == []
        alpha.channel.close()
        beta.channel.close()
        # What `engram admin --json list-host-keys` prints (the command is tested in tests/admin).
        listed = admin_json(replica, "ListHostKeys", admin_pb2.ScopeRequest())
        keys = {k["id"]: k for k in listed["host_keys"]}
        assert keys[key_id(partner)]["tenants"] == ["globex"]
    finally:
        replica.stop()
