"""`engram serve --store postgresql://…` (issue 28): the composition root opens the PostgreSQL
engine and its key vault, `--key-dir` holds the KEK ring and the secrets, and a real process
serves the whole round trip over gRPC. A connection string carrying a password is refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg

from engram_core.contract.errors import Code
from tests.support.core_support import Client, activate
from tests.support.mcp_helpers import ENGRAM, REPO
from tests.support.pg_cluster import Database
from tests.support.replicas import serve_store


def test_serve_store_serves_a_round_trip_on_postgresql(pg_database: Database, tmp_path: Path) -> None:
    key_dir = tmp_path / "keys"
    replica = serve_store(pg_database.conninfo, key_dir, pg_database.env)
    try:
        assert "store postgresql://" in replica.ready and f"key dir {key_dir}" in replica.ready
        assert "store postgresql://" in replica.opened
        activate(replica)  # type: ignore[arg-type]
        ana = Client(replica)  # type: ignore[arg-type]
        cap = ana.capture("PostgreSQL replicas: the petrel ledger is shared by every core.")
        admitted = ana.admit(cap["candidate_id"])
        assert admitted["outcome"]["status"] == "accepted", admitted
        rid = admitted["outcome"]["record_id"]
        assert [r["record"]["record_id"] for r in ana.search("petrel ledger")["records"]] == [rid]
        assert ana.get(rid)["record"]["record_id"] == rid
        ana.call("forget", {"record_id": rid, "idempotency_key": "serve-pg-forget-0001", "reason_ref": "r:x"},
                 grant=True)
        assert ana.fails("get", {"record_id": rid, "purpose_ref": ana.purpose_ref}) == Code.NOT_FOUND
        assert ana.search("petrel ledger")["records"] == []
        ana.channel.close()
    finally:
        replica.stop()
    assert replica.proc.returncode == 0, replica.proc.stderr.read()[-2000:] if replica.proc.stderr else ""
    # The rows are in PostgreSQL, the keys in the key directory: no DuckDB file anywhere.
    with pg_database.connect() as con:
        assert con.execute("SELECT state FROM records WHERE record_id = %s", [rid]).fetchone() == ("tombstoned",)
        assert con.execute("SELECT count(*) FROM journal").fetchone()[0] >= 3  # type: ignore[index]
    assert (key_dir / "store.kek").exists() and (key_dir / "host.key").exists()
    assert not list(key_dir.glob("*.duckdb")) and not (key_dir / "datakeys.bin").exists()


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, "serve", "--listen", "127.0.0.1:0", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=env)


def test_serve_store_refuses_a_password_and_a_missing_key_dir(pg_database: Database, tmp_path: Path) -> None:
    params = psycopg.conninfo.conninfo_to_dict(pg_database.conninfo)
    with_password = f"postgresql://{params['user']}:hunter2secret@{params['host']}:{params['port']}/{params['dbname']}"
    refused = _serve("--store", with_password, "--key-dir", str(tmp_path / "keys"))
    assert refused.returncode != 0
    assert "--store: the PostgreSQL connection string holds a password" in refused.stderr
    assert "PGPASSFILE" in refused.stderr and "hunter2secret" not in refused.stderr + refused.stdout
    assert not (tmp_path / "keys").exists()  # refused before anything was created
    no_keys = _serve("--store", pg_database.conninfo)
    assert no_keys.returncode != 0 and "--store needs --key-dir DIR" in no_keys.stderr
    both = _serve("--store", pg_database.conninfo, "--data", str(tmp_path / "data"), "--key-dir", str(tmp_path))
    assert both.returncode != 0 and "not allowed with argument" in both.stderr
    stray = _serve("--data", str(tmp_path / "data"), "--key-dir", str(tmp_path / "keys"))
    assert stray.returncode != 0 and "--key-dir goes with --store" in stray.stderr
