"""`engram admin …` as operators run it: the console script against a real core.

Each test runs its first command, and the ones whose exit status or stderr it is about (an
error, a usage error, progress), as `engram` processes (``process=True``); the rest go through
the console script's own function in this process (``tests/support/engram_cli.py``): the same
parser, command, output and exit status, without an interpreter start per command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engram_core.clock import SystemClock
from tests.support.admin_support import TENANT, WORKSPACE, start_env
from tests.support.engram_cli import run_engram

ENGRAM = str(Path(sys.executable).with_name("engram"))


@pytest.fixture
def live(tmp_path, stores):
    env = start_env(stores, tmp_path / "core", SystemClock(), activate=False)  # type: ignore[arg-type]
    try:
        yield env
    finally:
        env.stop()


def admin(env, *argv: str, json_out: bool = True, process: bool = False) -> subprocess.CompletedProcess:
    """`engram admin` against ``env``'s core: in this process, or (``process``) as the console script."""
    cmd = ["admin", "--core", env.running.address, "--host-key", str(env.running.host_key_path)]
    if json_out:
        cmd.append("--json")
    if process:
        return subprocess.run([ENGRAM, *cmd, *argv], capture_output=True, text=True, timeout=60)
    return run_engram(*cmd, *argv)


def test_cli_lifecycle_history_verify_and_errors(live):
    scope = ["--tenant", TENANT, "--workspace", WORKSPACE]
    assert admin(live, "activate", *scope, process=True).returncode == 0
    rid = live.record("cli managed record")
    out = admin(live, "dispute", rid, *scope, "--event-id", "evt_cli_dispute_0001")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["receipt"]["to_state"] == "accepted_disputed"
    again = admin(live, "dispute", rid, *scope, "--event-id", "evt_cli_dispute_0001")
    assert json.loads(again.stdout)["replayed"] is True
    human = admin(live, "history", *scope, "--record", rid, json_out=False)
    assert human.returncode == 0 and "accepted_disputed" in human.stdout and "dispute" in human.stdout
    bad = admin(live, "mark-non-current", rid, *scope, "--event-id", "short")
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == "INVALID_SCHEMA"
    illegal = admin(live, "dispute", rid, *scope, json_out=False, process=True)
    assert illegal.returncode == 1 and "ILLEGAL_TRANSITION" in illegal.stderr
    verify = admin(live, "verify", json_out=False)
    assert verify.returncode == 0 and "all chains intact" in verify.stdout
    assert json.loads(admin(live, "key-status", *scope).stdout)["scope"]["records"][0]["key"] == "live"
    assert json.loads(admin(live, "adjudication-list", *scope).stdout)["candidates"] == []
    assert json.loads(admin(live, "migrate").stdout)["applied"] == []


def test_cli_backup_restore_with_progress(live, tmp_path):
    scope = ["--tenant", TENANT, "--workspace", WORKSPACE]
    admin(live, "activate", *scope)
    rid = live.record("cli backed up record")
    out = admin(live, "backup", "--out", str(tmp_path / "b.jsonl"), json_out=False, process=True)
    assert out.returncode == 0, out.stderr
    assert "backup" in out.stderr and "manifest sha256:" in out.stdout
    rotated = admin(live, "rotate-keys", json_out=False)
    assert rotated.returncode == 0 and "rotating" in rotated.stderr
    assert admin(live, "signing-keys", "--out-dir", str(tmp_path / "keys")).returncode == 0
    target = start_env(live.stores, tmp_path / "target", SystemClock(), activate=False)  # type: ignore[arg-type]
    try:
        res = admin(target, "restore", "--in", str(tmp_path / "b.jsonl"), *live.restore_key_args(),
                    "--trust-backup-key", str(tmp_path / "keys" / "backup.pub"), process=True)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["records_restored"] == 1 and "restore sent" in res.stderr
        assert target.get(rid)["record"]["record_id"] == rid
        again = admin(target, "restore", "--in", str(tmp_path / "b.jsonl"), *live.restore_key_args())
        assert again.returncode == 1 and json.loads(again.stdout)["code"] == "RESTORE_REFUSED"
    finally:
        target.stop()
    rebuilt = admin(live, "rebuild-projections", *scope)
    assert json.loads(rebuilt.stdout)["records_indexed"] == 1


def test_inspect_with_a_record_id_says_which_command_reads_records(live):
    scope = ["--tenant", TENANT, "--workspace", WORKSPACE]
    assert admin(live, "activate", *scope).returncode == 0
    rid = live.record("a record an operator tries to inspect")
    out = admin(live, "inspect", rid, *scope, json_out=False, process=True)
    assert out.returncode == 2 and "is a record id" in out.stderr and "--record" in out.stderr


def test_key_status_counts_generations_by_state_and_names_each_date(live):
    """Two generations after a rotation read as two (issue 60 item 9: "active KEK 2 (1 held, 0
    retired)" counted one), and each date says what it is: the retained generation's date is when
    it will retire, not when it did."""
    assert admin(live, "rotate-keys").returncode == 0
    out = admin(live, "key-status", json_out=False, process=True)
    assert out.returncode == 0, out.stderr
    first, *generations = out.stdout.splitlines()
    assert first.startswith("active KEK generation 2; 2 generation(s): 1 active, 1 retained;"), first
    assert generations[0].startswith("generation 1  retained  created ") and "retires after " in generations[0]
    assert "retired " not in generations[0].replace("retires after", "")
    assert generations[1].startswith("generation 2  active  created "), generations
