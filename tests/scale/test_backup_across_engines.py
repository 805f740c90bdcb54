"""A backup is engine-neutral (issue 27): made by a DuckDB core, it restores into an empty
PostgreSQL store served by `engram serve --store`, bodies re-sealed under the target's vault,
and the restored records answer search and get there; a record forgotten before the backup
stays gone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from engram_core.app.composition import start_core
from engram_core.contract.errors import Code
from tests.support.core_support import Client, activate
from tests.support.mcp_helpers import ENGRAM, REPO
from tests.support.pg_cluster import Database
from tests.support.replicas import serve_store


def _admin(address: str, host_key: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, "admin", "--core", address, "--host-key", str(host_key), *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_a_duckdb_backup_restores_into_postgresql(pg_database: Database, tmp_path: Path) -> None:
    source_dir = tmp_path / "duck"
    source = start_core(source_dir, semantic=False)
    try:
        activate(source)
        ana = Client(source)
        kept = ana.remember("Cross-engine restore: the shearwater decision is kept.")
        gone = ana.remember("Cross-engine restore: the skua note is forgotten before the backup.")
        ana.call("forget", {"record_id": gone, "idempotency_key": "cross-engine-forget-01", "reason_ref": "r:x"},
                 grant=True)
        ana.channel.close()
        made = _admin(source.address, source.host_key_path, "backup", "--out", str(tmp_path / "b.jsonl"))
        assert made.returncode == 0, made.stderr
        keys = _admin(source.address, source.host_key_path, "signing-keys", "--out-dir", str(tmp_path / "pub"))
        assert keys.returncode == 0, keys.stderr
    finally:
        source.stop()

    replica = serve_store(pg_database.conninfo, tmp_path / "pg-keys", pg_database.env)
    try:
        restored = _admin(replica.address, replica.host_key_path, "restore", "--in", str(tmp_path / "b.jsonl"),
                          "--key-dir", str(source_dir), "--trust-backup-key", str(tmp_path / "pub" / "backup.pub"))
        assert restored.returncode == 0, restored.stdout + restored.stderr
        ana = Client(replica)  # type: ignore[arg-type]
        assert ana.get(kept)["record"]["record_id"] == kept
        assert [r["record"]["record_id"] for r in ana.search("shearwater decision")["records"]] == [kept]
        assert ana.fails("get", {"record_id": gone, "purpose_ref": ana.purpose_ref}) == Code.NOT_FOUND
        assert ana.search("skua note")["records"] == []
        ana.channel.close()
    finally:
        replica.stop()
    with pg_database.connect() as con:
        assert con.execute("SELECT state FROM records WHERE record_id = %s", [kept]).fetchone() == ("accepted_current",)


def test_a_postgresql_backup_restores_into_duckdb(pg_database: Database, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The other way: a PostgreSQL core's data keys are wrapped in its database, so the restore
    names that store (``--key-store``) with its key directory; a record forgotten there after the
    backup has no key left and is restored tombstoned, its text nowhere in the new store."""
    key_dir = tmp_path / "pg-keys"
    replica = serve_store(pg_database.conninfo, key_dir, pg_database.env)
    try:
        activate(replica)  # type: ignore[arg-type]
        ana = Client(replica)  # type: ignore[arg-type]
        kept = ana.remember("Engine round trip: the petrel decision stays in the restored store.")
        later = ana.remember("Engine round trip: the fulmar note is forgotten after the backup.")
        made = _admin(replica.address, replica.host_key_path, "backup", "--out", str(tmp_path / "b.jsonl"))
        assert made.returncode == 0, made.stderr
        keys = _admin(replica.address, replica.host_key_path, "signing-keys", "--out-dir", str(tmp_path / "pub"))
        assert keys.returncode == 0, keys.stderr
        ana.call("forget", {"record_id": later, "idempotency_key": "engine-round-trip-forget", "reason_ref": "r:x"},
                 grant=True)
        ana.channel.close()
    finally:
        replica.stop()

    for name, value in pg_database.env.items():  # the restoring core reaches the source store as a core would
        monkeypatch.setenv(name, value)
    target_dir = tmp_path / "duck"
    target = start_core(target_dir, semantic=False)
    try:
        restore = ("restore", "--in", str(tmp_path / "b.jsonl"), "--trust-backup-key", str(tmp_path / "pub" / "backup.pub"))
        no_store = _admin(target.address, target.host_key_path, *restore, "--key-dir", str(key_dir))
        assert no_store.returncode != 0 and "RESTORE_REFUSED" in no_store.stdout + no_store.stderr
        restored = _admin(target.address, target.host_key_path, "--json", *restore, "--key-dir", str(key_dir),
                          "--key-store", pg_database.conninfo)
        assert restored.returncode == 0, restored.stdout + restored.stderr
        assert json.loads(restored.stdout)["records_unrecoverable"] == [later]
        ana = Client(target)
        assert ana.get(kept)["record"]["record_id"] == kept
        assert [r["record"]["record_id"] for r in ana.search("petrel decision")["records"]] == [kept]
        assert ana.fails("get", {"record_id": later, "purpose_ref": ana.purpose_ref}) == Code.NOT_FOUND
        # Only the kept record can answer (a fulmar is a petrel: WordNet relates the two words).
        assert [r["record"]["record_id"] for r in ana.search("fulmar note")["records"]] in ([], [kept])
        ana.channel.close()
    finally:
        target.stop()
    stored = b"".join(p.read_bytes() for p in target_dir.rglob("*") if p.is_file())
    assert b"fulmar" not in stored
