"""`engram admin verify`, anchors and audit devices with several cores over one PostgreSQL store
(issue 28): the audit rows of both cores verify as one log, an anchor made through one core is
checked through the other, every core's audit device together covers every row, and a row
rewritten or removed in the database is found."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.core_support import Client, activate
from tests.support.mcp_helpers import ENGRAM, REPO
from tests.support.pg_cluster import Database
from tests.support.replicas import Replica, replica_pair


def _admin(replica: Replica, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, "admin", "--json", "--core", replica.address, "--host-key",
                           str(replica.host_key_path), *argv], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.fixture
def replicas(pg_database: Database, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    with replica_pair(pg_database.conninfo, tmp_path / "keys", pg_database.env,
                      ("--audit-device", f"file:{tmp_path / 'a.audit'}"),
                      ("--audit-device", f"file:{tmp_path / 'b.audit'}")) as (a, b):
        activate(a)  # type: ignore[arg-type]
        yield a, b


def _write_on_both(a: Replica, b: Replica, n: int, word: str) -> None:
    ca, cb = Client(a), Client(b)  # type: ignore[arg-type]
    for i in range(n):
        (ca if i % 2 else cb).remember(f"Verify replicas: {word} note {i} about the audit log.")
        (cb if i % 2 else ca).search(f"{word} note")  # reads: rows of each core's writer chain
    ca.channel.close()
    cb.channel.close()


def test_both_cores_rows_verify_as_one_log_against_an_anchor_and_the_devices(
        replicas: tuple[Replica, Replica], tmp_path: Path, pg_database: Database) -> None:
    a, b = replicas
    _write_on_both(a, b, 6, "razorbill")
    made = _admin(a, "anchor", "--out", str(tmp_path / "anchor.json"))
    assert made.returncode == 0, made.stderr
    _write_on_both(a, b, 4, "shag")
    devices = ("--device", str(tmp_path / "a.audit"), "--device", str(tmp_path / "b.audit"))
    checked = _admin(b, "verify", "--anchor", str(tmp_path / "anchor.json"), *devices)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] and report["anchor"]["ok"] and report["device"]["ok"] and report["limits"] == []
    assert report["audit"]["chains"] >= 3  # the scope's chain and a writer chain per core

    # One device alone does not hold the other core's rows: named alone, it is reported short.
    one = _admin(b, "verify", "--device", str(tmp_path / "a.audit"))
    assert one.returncode == 1 and "device_missing" in one.stdout
    assert "name every core's device" in one.stdout  # what to do about it (issue 60 item 8)

    # The scope chain cut back in the database (rows and head, so it verifies against itself) and
    # extended again by a core: the devices hold two rows at one position.
    with pg_database.connect() as con:
        chain, head = con.execute("SELECT chain, seq FROM audit_heads WHERE chain LIKE 'scope:%%'").fetchone()  # type: ignore[misc]
        con.execute("DELETE FROM audit WHERE chain = %s AND seq >= %s", [chain, head - 1])
        digest = con.execute("SELECT row_digest FROM audit WHERE chain = %s AND seq = %s", [chain, head - 2]).fetchone()
        con.execute("UPDATE audit_heads SET seq = %s, row_digest = %s WHERE chain = %s", [head - 2, digest[0], chain])  # type: ignore[index]
    assert _admin(b, "verify").returncode == 0  # consistent with itself: only the devices can tell
    Client(a).remember("Verify replicas: a row written over the cut.")  # type: ignore[arg-type]
    broken = _admin(b, "verify", *devices)
    assert broken.returncode == 1 and "device_fork" in broken.stdout, broken.stdout
