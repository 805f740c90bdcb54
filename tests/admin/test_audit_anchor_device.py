"""A rewritten audit log is detected (issue 13, finding 5), attacked as someone who can write the data directory.

The attack: stop the core, open its store (``engram.duckdb`` with duckdb, or the PostgreSQL
database with a client), delete the forget's audit row and everything after it, rename the
principal, recompute the chain (or cut the journal back and move the scope head). Plain ``engram admin verify`` cannot see that: every link recomputes. What sees
it: an anchor the operator exported earlier (signed heads, kept outside the data directory) and
an audit device that received every row before its call answered.

`engram admin` and `engram doctor` run through the console script's function in this process
(``tests/support/engram_cli.py``) except where a call says ``process=True``: at least one of each
command, and `engram serve` itself, still run as the operator runs them, as processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from engram_core.api import admin_pb2
from engram_core.clock import SystemClock
from engram_core.contract.scope import Scope
from engram_core.store.audit_device import check_device_file
from engram_core.store.chain import GENESIS, audit_digest_of, scope_chain
from engram_core.trust.hostkeys import create_private_key_file
from engram_core.trust.shared_secrets import META_PREFIX, fingerprint
from engram_core.trust.signing import ANCHOR_DOMAIN, CoreSigner
from tests.support.admin_support import TENANT, WORKSPACE, Env, code_of
from tests.support.core_engines import EngineStores, SqlSession
from tests.support.engram_cli import run_engram

ENGRAM = str(Path(sys.executable).with_name("engram"))
AUDIT_COLUMNS = ("chain", "seq", "at_ms", "audit_id", "tenant", "workspace", "principal", "agent_id", "operation",
                 "outcome", "target_digest", "decisions", "prev_digest", "row_digest", "context_nonce")


def admin(env: Env, *argv: str, json_out: bool = True, process: bool = False) -> subprocess.CompletedProcess:
    """`engram admin` against ``env``'s core: in this process, or (``process``) as the console script."""
    cmd = ["admin", "--core", env.running.address, "--host-key", str(env.running.host_key_path),
           *(["--json"] if json_out else []), *argv]
    if process:
        return subprocess.run([ENGRAM, *cmd], capture_output=True, text=True, timeout=60)
    return run_engram(*cmd)


def _start(stores: EngineStores, data_dir: Path, devices: list[str] | None = None, *, activate: bool = False) -> Env:
    env = Env(stores, data_dir, SystemClock(), audit_devices=devices)  # type: ignore[arg-type]
    if activate:
        env.activate()
    return env


def rewrite_audit(stores: EngineStores, data_dir: Path, *, drop_from_operation: str | None = None,
                  rename: tuple[str, str] | None = None) -> None:
    """Delete rows from the first row of ``drop_from_operation`` on (in its chain and every later row
    of the others), rename a principal, re-chain every chain: what an attacker with the file (or
    the database) does."""
    with stores.sql(data_dir) as con:
        if drop_from_operation:
            (first,) = con.one("SELECT min(at_ms) FROM audit WHERE operation = ?", [drop_from_operation]) or (None,)
            assert first is not None
            con.run("DELETE FROM audit WHERE at_ms >= ?", [first])
        if rename:
            con.run("UPDATE audit SET principal = ? WHERE principal = ?", [rename[1], rename[0]])
        prev: dict[str, str] = {}
        last: dict[str, int] = {}
        for row in con.all(f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audit ORDER BY chain, seq"):
            doc = dict(zip(AUDIT_COLUMNS, row, strict=True))
            chain = doc["chain"]
            if not chain:
                del doc["chain"]
            if not doc["context_nonce"]:  # as the store documents a row that claimed no nonce
                del doc["context_nonce"]
            doc["seq"], doc["decisions"] = int(doc["seq"]), json.loads(doc["decisions"])
            doc["prev_digest"] = prev.get(chain, GENESIS)
            doc["row_digest"] = audit_digest_of(doc)
            con.run("UPDATE audit SET prev_digest = ?, row_digest = ? WHERE chain = ? AND seq = ?",
                    [doc["prev_digest"], doc["row_digest"], chain, doc["seq"]])
            prev[chain], last[chain] = doc["row_digest"], doc["seq"]
        if stores.is_postgresql:
            _move_audit_heads(con, prev, last)


def _move_audit_heads(con: SqlSession, digests: dict[str, str], seqs: dict[str, int]) -> None:
    """PostgreSQL keeps each chain's head in a row of its own (audit_heads): the attacker moves
    it onto the rewritten chain's last row, as DuckDB's store reads it from the rows at open."""
    con.run("DELETE FROM audit_heads")
    for chain, digest_ in digests.items():
        con.run("INSERT INTO audit_heads (chain, seq, row_digest) VALUES (?, ?, ?)", [chain, seqs[chain], digest_])


def cut_journal(con: SqlSession, tenant: str, workspace: str) -> None:
    """Drop the scope's last journal event and move the scope head back onto the one before."""
    (last,) = con.one("SELECT max(cursor) FROM journal WHERE tenant = ? AND workspace = ?", [tenant, workspace]) or (None,)
    con.run("DELETE FROM journal WHERE tenant = ? AND workspace = ? AND cursor = ?", [tenant, workspace, last])
    (prev,) = con.one("SELECT event_digest FROM journal WHERE tenant = ? AND workspace = ? AND cursor = ?",
                      [tenant, workspace, last - 1]) or (None,)
    con.run("UPDATE scopes SET last_cursor = ?, last_event_digest = ? WHERE tenant = ? AND workspace = ?",
            [last - 1, prev, tenant, workspace])


def _forget_scenario(env: Env) -> str:
    keep = env.record("the retention policy for build logs is thirty days")
    doomed = env.record("a decision someone wants to have never forgotten")
    env.search("retention policy")  # a spooled read row between the mutations
    env.transition("tombstone", doomed)
    return keep


def test_rewritten_audit_log_fails_verify_against_anchor(tmp_path, stores):
    data = tmp_path / "core"
    env = _start(stores, data, activate=True)
    try:
        _forget_scenario(env)
        keys = tmp_path / "operator"
        assert admin(env, "signing-keys", "--out-dir", str(keys)).returncode == 0
        made = admin(env, "anchor", "--out", str(keys / "anchor.json"), json_out=False, process=True)
        assert made.returncode == 0, made.stderr
        assert "signed by anchor key" in made.stdout
        ok = admin(env, "verify", "--anchor", str(keys / "anchor.json"), "--anchor-key", str(keys / "anchor.pub"),
                   json_out=False)
        assert ok.returncode == 0 and "all chains intact" in ok.stdout, ok.stdout + ok.stderr
        assert "note: rows after the anchor's heads" in ok.stdout and "add --device FILE" in ok.stdout
    finally:
        env.stop()

    rewrite_audit(stores, data, drop_from_operation="admin.tombstone", rename=("host:operator", "host:someone"))
    env = _start(stores, data)
    try:
        plain = admin(env, "verify", json_out=False)
        assert plain.returncode == 0 and "all chains intact" in plain.stdout  # the rewrite recomputes
        # ... which plain verify says it cannot see, and what would (issue 26, "Also").
        assert "note: the chains were checked against themselves only" in plain.stdout
        assert "cut back" in plain.stdout and "--anchor FILE" in plain.stdout and "--device FILE" in plain.stdout
        assert json.loads(admin(env, "verify").stdout)["limits"] != []
        anchored = ["--anchor", str(keys / "anchor.json"), "--anchor-key", str(keys / "anchor.pub")]
        res = admin(env, "verify", *anchored, process=True)
        assert res.returncode == 1 and json.loads(res.stdout)["code"] == "JOURNAL_CORRUPT"
        report = json.loads(admin(env, "verify", "--report", *anchored).stdout)
        assert report["ok"] is False
        # Each audit chain the rewrite touched: truncated, or rewritten once later calls (this
        # verify's own audit rows) refill the anchored seq.
        problems = report["anchor"]["problems"]
        assert problems and all(p["chain"].startswith("audit:") for p in problems)
        assert {p["problem"] for p in problems} <= {"anchor_truncated", "anchor_rewritten"}
        human = admin(env, "verify", "--report", *anchored, json_out=False)
        assert human.returncode == 1 and human.stdout.startswith("JOURNAL_CORRUPT")
        assert "anchor: anchor_" in human.stdout and "(audit:scope:" in human.stdout
        # Over gRPC the verification itself fails closed with JOURNAL_CORRUPT.
        with pytest.raises(grpc.RpcError) as err:
            env.admin("Verify", admin_pb2.ScopeRequest(anchor_json=(keys / "anchor.json").read_text(),
                                                       anchor_key_pem=[(keys / "anchor.pub").read_text()]))
        assert code_of(err.value) == "JOURNAL_CORRUPT"
    finally:
        env.stop()


def test_rewrite_without_truncation_and_cut_journal_are_detected(tmp_path, stores):
    data = tmp_path / "core"
    env = _start(stores, data, activate=True)
    try:
        _forget_scenario(env)
        anchor = env.admin("Anchor", admin_pb2.ScopeRequest(), scopes=("read",))
        anchor_pub = env.admin("SigningKeys", admin_pb2.ScopeRequest(), scopes=("read",))["anchor"]["public_key_pem"]
    finally:
        env.stop()
    rewrite_audit(stores, data, rename=("host:operator", "host:someone"))  # every row kept, renamed
    # The attacker also replaces the core's anchor key: the operator's copy of the public key still decides.
    # With the store, they also rewrite the key file's fingerprint the store holds (shared_secrets.py).
    (data / "anchor.key").unlink()
    create_private_key_file(data / "anchor.key")
    with stores.sql(data) as con:
        cut_journal(con, TENANT, WORKSPACE)  # the tombstone event gone
        con.run("UPDATE store_meta SET v = ? WHERE k = ?", [
            fingerprint("anchor.key", (data / "anchor.key").read_bytes()), META_PREFIX + "anchor.key"])
    env = _start(stores, data)
    try:
        report = env.admin("Verify", admin_pb2.ScopeRequest(report_only=True))
        assert report["ok"] is True  # without an anchor both rewrites verify
        report = env.admin("Verify", admin_pb2.ScopeRequest(report_only=True, anchor_json=json.dumps(anchor),
                                                            anchor_key_pem=[anchor_pub]))
        problems = {(p.get("chain"), p["problem"]) for p in report["anchor"]["problems"]}
        assert (f"audit:{scope_chain(TENANT, WORKSPACE)}", "anchor_rewritten") in problems
        assert (f"{TENANT}/{WORKSPACE}", "anchor_truncated") in problems
        assert report["anchor"]["key_id"] is not None  # the genuine anchor still verifies under the operator's key
        # An anchor forged with the replacement key does not verify under the operator's key.
        forged = env.admin("Anchor", admin_pb2.ScopeRequest(), scopes=("read",))
        report = env.admin("Verify", admin_pb2.ScopeRequest(report_only=True, anchor_json=json.dumps(forged),
                                                            anchor_key_pem=[anchor_pub]))
        assert {"problem": "anchor_signature"} in report["anchor"]["problems"]
    finally:
        env.stop()


def test_every_acknowledged_call_is_on_the_device_and_a_rewrite_shows(tmp_path, stores):
    device = tmp_path / "elsewhere" / "audit.log"
    device.parent.mkdir()
    data = tmp_path / "core"
    env = _start(stores, data, [f"file:{device}"], activate=True)
    try:
        keep = _forget_scenario(env)
        env.get(keep)
        with pytest.raises(grpc.RpcError):
            env.get("mem_" + "a" * 52)  # a refusal is audited too
        rows = env.admin("Export", admin_pb2.ExportRequest(what="audit"), scopes=("read",))["items"]
        lines = [json.loads(line) for line in device.read_text().splitlines()]
        assert lines[0] == {"kind": "open", "heads": {}}  # the store opened empty
        on_device = [d for d in lines if d["kind"] == "audit"]
        # Every row the store holds was on the device, with its chain, position and digest (the
        # Export itself is audited after its answer was built: it is on the device only).
        assert {(d["chain"], str(d["seq"]), d["row_digest"]) for d in on_device} >= \
               {(r["chain"], r["seq"], r["row_digest"]) for r in rows}
        assert len(on_device) == len(rows) + 1
        assert {d["operation"] for d in on_device} >= {"admin.activate", "engram_memory_capture", "engram_memory_search",
                                                  "engram_memory_get", "admin.tombstone"}
        assert oct(device.stat().st_mode & 0o777) == "0o600"
        ok = admin(env, "verify", "--device", str(device), json_out=False, process=True)
        assert ok.returncode == 0 and "device lines" in ok.stdout, ok.stdout + ok.stderr
    finally:
        env.stop()
    rewrite_audit(stores, data, drop_from_operation="admin.tombstone", rename=("host:operator", "host:x"))
    env = _start(stores, data, [f"file:{device}"])
    try:
        res = admin(env, "verify", "--device", str(device))
        assert res.returncode == 1
        problems = {p["problem"] for p in json.loads(res.stdout)["device"]["problems"]}
        # Renamed rows differ from the device's; the rows the core wrote after the cut fork its chain.
        assert {"device_mismatch", "device_fork"} <= problems
        rows = env.admin("Export", admin_pb2.ExportRequest(what="audit"), scopes=("read",))["items"]
        assert not check_device_file(device, rows)["ok"]
    finally:
        env.stop()


def test_calls_fail_closed_when_no_device_accepts(tmp_path, stores):
    data = tmp_path / "core"
    env = _start(stores, data, ["file:/dev/full"])  # every write: ENOSPC
    try:
        with pytest.raises(grpc.RpcError) as err:
            env.activate()
        assert code_of(err.value) == "STORE_UNAVAILABLE"
        with pytest.raises(grpc.RpcError) as err:
            env.admin("KeyStatus", admin_pb2.ScopeRequest(), scopes=("read",))  # a read: spooled row
        assert code_of(err.value) == "STORE_UNAVAILABLE"
        with env.core.store.read() as tx:
            assert tx.scope(Scope(TENANT, WORKSPACE)) is None and tx.audit_heads() == {}
    finally:
        env.stop()
    # One device failing of two: the other one takes the rows and calls go through.
    good = tmp_path / "good.log"
    env = _start(stores, data, ["file:/dev/full", f"file:{good}?fsync=1"], activate=True)  # the good one fdatasyncs
    try:
        env.record("recorded while one device is down")
        assert check_device_file(good, [])["lines"] >= 3  # activate, capture, admission
    finally:
        env.stop()


def _doctor(env: Env, tmp_path: Path, *, process: bool = False) -> str:
    config = tmp_path / "host.toml"
    config.write_text(f'''[core]
address = "{env.running.address}"

[host]
signing_key = "{env.running.host_key_path}"
memory_enabled = true

[binding]
tenant = "{TENANT}"
workspace = "{WORKSPACE}"
principal = "user:ana"
agent_id = "a"
session = "s"
purpose_ref = "purpose:eng"
''')
    if process:
        res = subprocess.run([ENGRAM, "doctor", "--host-config", str(config)], capture_output=True, text=True,
                             timeout=60)
    else:
        res = run_engram("doctor", "--host-config", str(config))
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_doctor_warns_when_nothing_outside_the_data_directory_keeps_the_audit_log(tmp_path, stores):
    """Issue 26 "Also": the doctor asks the core (HostService.Health) for its audit devices and
    last anchor, and warns when there is neither. The doctor runs as the console script's process
    on the DuckDB leg (~2.5 s of imports) and in this process on the PostgreSQL one: it only talks
    to the core over gRPC, and what it is told is the core's, whichever engine."""
    env = _start(stores, tmp_path / "core", activate=True)
    try:
        out = _doctor(env, tmp_path, process=not stores.is_postgresql)
        assert "warn  neither an audit device nor a signed anchor" in out and "--audit-device" in out
        assert admin(env, "anchor", "--out", str(tmp_path / "anchor.json")).returncode == 0
        out = _doctor(env, tmp_path)
        assert "ok    last signed anchor " in out and "neither" not in out
    finally:
        env.stop()
    env = _start(stores, tmp_path / "core", [f"file:{tmp_path / 'audit.log'}"])
    try:
        assert "ok    audit rows go to 1 audit device(s)" in _doctor(env, tmp_path)
    finally:
        env.stop()


def test_a_device_file_that_exists_with_a_wider_mode_is_tightened(tmp_path, caplog, stores):
    """Issue 26.7: a device file made beforehand (by an operator, a log rotation, an older
    version) kept its 0644 and any local user read the audit rows on it. Opening it now makes it
    0600, with a warning naming the mode it had; new rows go on being appended."""
    device = tmp_path / "audit.log"
    device.write_text("")
    device.chmod(0o644)
    with caplog.at_level("WARNING", logger="engram.audit_device"):
        env = _start(stores, tmp_path / "core", [f"file:{device}"], activate=True)
    try:
        assert oct(device.stat().st_mode & 0o777) == "0o600"
        assert any("had mode 0644; now 0600" in r.getMessage() for r in caplog.records)
        env.record("a row on the tightened device")
        assert check_device_file(device, [])["lines"] >= 3  # activate, capture, admission
    finally:
        env.stop()
    device.chmod(0o640)  # loosened again while the core was stopped: tightened at the next open
    env = _start(stores, tmp_path / "core", [f"file:{device}"])
    try:
        assert oct(device.stat().st_mode & 0o777) == "0o600"
        assert env.search("tightened")["records"]  # served (after the index is built) and audited
    finally:
        env.stop()


def test_serve_refuses_a_device_it_cannot_open(tmp_path, stores):
    res = subprocess.run([ENGRAM, "serve", *stores.serve_args(tmp_path / "core"), "--listen", "127.0.0.1:0",
                          "--audit-device", f"file:{tmp_path / 'missing-dir' / 'audit.log'}"],
                         capture_output=True, text=True, timeout=120, env=stores.process_env())
    assert res.returncode == 2 and "audit device" in res.stderr


def test_forged_anchor_signature_is_reported(tmp_path, stores):
    data = tmp_path / "core"
    env = _start(stores, data, activate=True)
    try:
        env.record("anchored")
        anchor = env.admin("Anchor", admin_pb2.ScopeRequest(), scopes=("read",))
        intruder = CoreSigner(create_private_key_file(tmp_path / "intruder.key"), ANCHOR_DOMAIN)
        anchor["signature"] = intruder.sign(anchor["anchor_digest"])
        with pytest.raises(grpc.RpcError) as err:
            env.admin("Verify", admin_pb2.ScopeRequest(anchor_json=json.dumps(anchor)))
        assert code_of(err.value) == "JOURNAL_CORRUPT"
        with pytest.raises(grpc.RpcError) as err:
            env.admin("Verify", admin_pb2.ScopeRequest(anchor_json="{not an anchor"))
        assert code_of(err.value) == "INVALID_SCHEMA"
        with pytest.raises(grpc.RpcError) as err:
            env.admin("Anchor", admin_pb2.ScopeRequest(tenant=TENANT), scopes=("read",))
        assert code_of(err.value) == "INVALID_SCHEMA"
        # A scope's anchor holds that journal only and verifies for that scope.
        env.activate(workspace="other")
        scoped = env.admin("Anchor", admin_pb2.ScopeRequest(tenant=TENANT, workspace=WORKSPACE), scopes=("read",))
        assert [(j["tenant"], j["workspace"]) for j in scoped["journals"]] == [(TENANT, WORKSPACE)]
        report = env.admin("Verify", admin_pb2.ScopeRequest(tenant=TENANT, workspace=WORKSPACE,
                                                            anchor_json=json.dumps(scoped)), scopes=("read",))
        assert report["ok"] and report["anchor"]["journals"] == 1
    finally:
        env.stop()


def test_unix_socket_device_receives_every_row_and_its_loss_fails_closed(tmp_path, stores):
    import socket
    import threading

    path = tmp_path / "dev.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    received: list[bytes] = []
    conns: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            try:
                while chunk := conn.recv(65536):
                    received.append(chunk)
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    env = _start(stores, tmp_path / "core", [f"unix:{path}"], activate=True)
    try:
        env.record("streamed to a log shipper")
        rows = env.admin("Export", admin_pb2.ExportRequest(what="audit"), scopes=("read",))["items"]
        lines = b"".join(received).split(b"\n")
        device = tmp_path / "copy.log"
        device.write_bytes(b"\n".join(lines))
        report = check_device_file(device, rows)
        assert report["ok"] and int(report["first_seq"]) == 1 and report["lines"] >= len(rows)
        # The shipper goes away: no device accepts the next row, so the call fails and nothing changes.
        listener.close()
        path.unlink()
        for c in conns:
            c.shutdown(socket.SHUT_RDWR)  # a blocked recv keeps a merely closed socket alive
            c.close()
        with pytest.raises(grpc.RpcError) as err:
            env.activate(workspace="other")
        assert code_of(err.value) == "STORE_UNAVAILABLE"
        with env.core.store.read() as tx:
            assert tx.scope(Scope(TENANT, "other")) is None
    finally:
        env.stop()


def _serve(stores: EngineStores, data: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([ENGRAM, "serve", *stores.serve_args(data), "--listen", "127.0.0.1:0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**stores.process_env(), "ENGRAM_SEMANTIC": "off"})
    first = proc.stdout.readline() if proc.stdout else ""
    if "listening on" not in first:
        proc.kill()
        raise AssertionError(f"engram serve did not start: {first!r}")
    return proc, first.split("listening on ", 1)[1].split()[0]


def _cli(address: str, data: Path, *argv: str, process: bool = False) -> subprocess.CompletedProcess:
    import os

    cmd = ["admin", "--core", address, "--host-key", str(data / "host.key"), *argv]
    paged = {"ENGRAM_AUDIT_PAGE_ROWS": "2"}  # rows fetched over many pages
    if process:
        return subprocess.run([ENGRAM, *cmd], capture_output=True, text=True, timeout=60, env={**os.environ, **paged})
    return run_engram(*cmd, env=paged)


def test_engram_serve_audit_device_across_restarts(tmp_path, stores):
    """One device file across three starts of one store: a core in this process (as ``engram
    serve`` builds its core, ``start_core``), then `engram serve --audit-device` itself as the
    operator runs it, then, after rows were cut while it was stopped, a core in this process
    again. (Each start was an `engram serve` process once, ~3 s apiece; the flag itself and the
    process are what the middle one checks, and test_serve_refuses_a_device_it_cannot_open.)"""
    data, device = tmp_path / "core", tmp_path / "outside" / "audit.log"
    device.parent.mkdir()

    def activate_and_verify(address: str, run: int) -> None:
        done = _cli(address, data, "activate", "--tenant", TENANT, "--workspace", f"w{run}")
        assert done.returncode == 0, done.stderr
        res = _cli(address, data, "verify", "--device", str(device))
        assert res.returncode == 0 and "device lines" in res.stdout, res.stdout + res.stderr
        report = json.loads(_cli(address, data, "--json", "verify", "--device", str(device)).stdout)
        assert report["device"]["rows"] >= report["audit"]["rows"] >= 3  # every row, over many pages

    env = _start(stores, data, [f"file:{device}"])
    try:
        activate_and_verify(env.running.address, 0)
    finally:
        env.stop()
    proc, address = _serve(stores, data, "--audit-device", f"file:{device}")
    try:
        activate_and_verify(address, 1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    kinds = [json.loads(line)["kind"] for line in device.read_text().splitlines()]
    assert kinds.count("open") == 2 and kinds.count("audit") >= 4  # two activations, two verifies
    # Rows cut from the store while it was stopped: seen across pages on the next start.
    rewrite_audit(stores, data, drop_from_operation="admin.activate")
    env = _start(stores, data, [f"file:{device}"])
    try:
        res = _cli(env.running.address, data, "--json", "verify", "--device", str(device), process=True)
        assert res.returncode == 1, res.stdout
        lost = [p for p in json.loads(res.stdout)["device"]["problems"] if p["problem"] == "device_lost_at_restart"]
        # Every row cut, named at the reopen: each chain's from its first row.
        assert lost and {p["seq"] for p in lost} == {"1"} and sum(p["count"] for p in lost) >= 4
    finally:
        env.stop()
