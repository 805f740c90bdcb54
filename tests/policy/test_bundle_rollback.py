"""Signed bundles only move forward (issue 57, hole 2): a bundle server serving a genuine but
older signed revision is refused within a poll, a restart does not fall back to it (the last
accepted pulled bundle is kept beside the core's keys), an old signed bundle copied into the
bundle directory is refused at SIGHUP, and an operator rolls back only on purpose
(``--bundle-allow-rollback``), logged and recorded. Real signed bundles (the project's signing
code), a real HTTP bundle server, real ``engram serve`` processes."""

from __future__ import annotations

import json
import shutil
import signal
import stat
import time
import urllib.request
from pathlib import Path
from typing import Any

import jwt
import pytest

from engram_core.cli.policy import tarball_members, write_tarball
from engram_core.policy.bundle import read_bundle
from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.ordering import PULLED_FILE, STATE_FILE, RollbackGuard
from engram_core.policy.port import AUTHZ, BundleRefused
from engram_core.policy.signing import BundleVerifier, file_digest, load_signing_key, sign_files
from engram_core.policy.sources import DiskSource
from tests.support.policy_support import BundleServer, copy_bundle, engram, serve, write_keys

# Signing times (JWT iat, seconds) far enough apart that no test depends on the clock.
T1, T2, T3 = 1_760_000_000, 1_760_086_400, 1_760_172_800


def _signed_dir(tmp: Path, revision: str, private: Path, iat: int, name: str | None = None) -> Path:
    bundle = copy_bundle(tmp, name or f"dir-{revision}-{iat}", revision=revision)
    files = dict(read_bundle(bundle).files)
    (bundle / ".signatures.json").write_bytes(sign_files(files, load_signing_key(private.read_bytes()),
                                                         issued_at=iat))
    return bundle


def _signed_archive(tmp: Path, revision: str, private: Path, iat: int) -> bytes:
    bundle = read_bundle(copy_bundle(tmp, f"src-{revision}-{iat}", revision=revision))
    signatures = sign_files(tarball_members(bundle), load_signing_key(private.read_bytes()), issued_at=iat)
    out = tmp / f"{revision}-{iat}.tar.gz"
    write_tarball(bundle, out, signatures=signatures)
    return out.read_bytes()


def _wait(predicate: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def _refusals(served: Any) -> list[dict[str, Any]]:
    return [e for e in served.json_events("policy_reload") if e.get("outcome") == "REFUSED"]


def _metrics(served: Any) -> str:
    address = served.opened.split("metrics http://", 1)[1].split("/metrics", 1)[0]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return response.read().decode()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _pull_flags(server: BundleServer, public: Path) -> tuple[str, ...]:
    return ("--bundle-url", server.url, "--bundle-verification-key", str(public),
            "--bundle-poll-min-seconds", "0.2", "--bundle-poll-max-seconds", "0.4", "--metrics", "127.0.0.1:0")


def test_a_bundle_server_serving_an_older_signed_revision_is_refused_by_poll_and_by_restart(tmp_path):
    private, public = write_keys(tmp_path)
    rev1, rev2 = _signed_archive(tmp_path, "rev-1", private, T1), _signed_archive(tmp_path, "rev-2", private, T2)
    data = tmp_path / "data"
    with BundleServer() as server:
        server.publish(rev1)
        served = serve(data, *_pull_flags(server, public))
        try:
            served.wait_for_revision("rev-1")
            server.publish(rev2)  # the revision that closes a hole
            served.wait_for_revision("rev-2")
            server.publish(rev1)  # the genuine, signed, older one, served again
            [refused] = _wait(lambda: _refusals(served))
            assert refused["file"] == ".signatures.json" and "refused as a rollback" in refused["error"]
            assert "'rev-1'" in refused["error"] and "'rev-2'" in refused["error"]
            assert refused["active_revision"] == "rev-2" and refused["level"] == "error"
            assert 'bundle_failed_load_counter_total{code="REFUSED",name="engram"} 1.0' in _metrics(served)
            downloads, polls = len(served.json_events("policy_bundle_downloaded")), len(server.requests)
            _wait(lambda: len(server.requests) >= polls + 4)  # more polls: 304s, no second try, still rev-2
            health = served.health()
            assert (health.status, health.policy_revision) == ("SERVING", "rev-2")
            assert len(_refusals(served)) == 1 and len(served.json_events("policy_bundle_downloaded")) == downloads
        finally:
            served.stop()
        state, saved = data / STATE_FILE, data / PULLED_FILE
        assert json.loads(state.read_text())["revision"] == "rev-2"
        assert json.loads(state.read_text())["signed_at"] == T2
        assert saved.read_bytes() == rev2 and _mode(state) == _mode(saved) == 0o600

        # A restart while the server still serves rev-1: the kept rev-2 answers, rev-1 is refused.
        again = serve(data, *_pull_flags(server, public), log_name="restart.log")
        try:
            assert "policy_revision rev-2," in again.opened, again.opened
            assert f"bundle_ordering on ({state}" in again.opened
            health = again.health()
            assert (health.status, health.policy_revision) == ("SERVING", "rev-2")
            [restored] = again.json_events("policy_bundle_restored")
            assert restored["revision"] == "rev-2"
            assert "refused as a rollback" in again.log_text()
            time.sleep(1.5)  # a few polls later, still rev-2
            assert again.health().policy_revision == "rev-2"
        finally:
            again.stop()


def test_an_older_signed_bundle_copied_into_the_directory_is_refused_at_sighup(tmp_path):
    private, public = write_keys(tmp_path)
    live = _signed_dir(tmp_path, "rev-1", private, T1, name="live")
    served = serve(tmp_path / "data", "--policies", str(live), "--bundle-verification-key", str(public))
    try:
        served.wait_for_revision("rev-1")
        shutil.rmtree(live)
        shutil.copytree(_signed_dir(tmp_path, "rev-2", private, T2), live)
        served.signal(signal.SIGHUP)
        _wait(lambda: [e for e in served.json_events("policy_reload") if e.get("revision") == "rev-2"])
        shutil.rmtree(live)
        shutil.copytree(_signed_dir(tmp_path, "rev-1", private, T1), live)  # the old one, copied back
        served.signal(signal.SIGHUP)
        [refused] = _wait(lambda: _refusals(served))
        assert refused["file"] == ".signatures.json" and "refused as a rollback" in refused["error"]
        assert refused["active_revision"] == "rev-2"
        done = engram("admin", "--core", served.address, "--host-key", str(served.data_dir / "host.key"),
                      "reload-policies")
        assert done.returncode == 1 and done.stdout.startswith("refused; revision rev-2 still active: "
                                                               ".signatures.json: revision 'rev-1' was signed")
        assert served.health().policy_revision == "rev-2"
    finally:
        served.stop()


def test_a_deliberate_rollback_is_allowed_once_logged_and_recorded(tmp_path):
    private, public = write_keys(tmp_path)
    rev1, rev2 = _signed_archive(tmp_path, "rev-1", private, T1), _signed_archive(tmp_path, "rev-2", private, T2)
    data = tmp_path / "data"
    with BundleServer() as server:
        server.publish(rev2)
        served = serve(data, *_pull_flags(server, public), "--bundle-allow-rollback", "rev-1")
        try:
            served.wait_for_revision("rev-2")
            assert "rollback to rev-1 allowed once" in served.opened
            server.publish(rev1)  # the operator's deliberate rollback
            served.wait_for_revision("rev-1")
            [event] = served.json_events("policy_bundle_rollback")
            assert (event["revision"], event["from_revision"], event["level"]) == ("rev-1", "rev-2", "warning")
            assert event["signed_at"] < event["from_signed_at"]
            server.publish(rev2)  # forward again: newer than rev-1
            served.wait_for_revision("rev-2")
            server.publish(rev1)  # the flag is spent: the same old bundle again is a rollback
            [refused] = _wait(lambda: _refusals(served))
            assert "already rolled back to once" in refused["error"] and refused["active_revision"] == "rev-2"
            assert served.health().policy_revision == "rev-2"
        finally:
            served.stop()
    state = json.loads((data / STATE_FILE).read_text())
    assert state["revision"] == "rev-2"
    [record] = state["rollbacks"]
    assert (record["revision"], record["signed_at"], record["from_revision"], record["from_signed_at"]) == \
        ("rev-1", T1, "rev-2", T2)
    # What a restart with the flag still given reads: the rollback stays spent.
    guard = RollbackGuard(data, keep_bundle=True, allow_rollback_to="rev-1")
    engine = EmbeddedPolicyEngine(tmp_path / "unused", verifier=BundleVerifier.from_pem_file(str(public)),
                                  guard=guard)
    (tmp_path / "old.tar.gz").write_bytes(rev1)
    assert engine.restore(DiskSource(data / PULLED_FILE)) == "rev-2"
    with pytest.raises(BundleRefused) as caught:
        engine.restore(DiskSource(tmp_path / "old.tar.gz"))
    assert "already rolled back to once" in caught.value.problem["error"]
    engine.close()


def _engine(tmp_path: Path, bundle: Path, public: Path) -> EmbeddedPolicyEngine:
    return EmbeddedPolicyEngine(bundle, verifier=BundleVerifier.from_pem_file(str(public)),
                                guard=RollbackGuard(tmp_path / "state"))


def test_a_signature_without_a_signing_time_cannot_be_ordered_and_is_refused(tmp_path):
    """``opa sign`` without a claims file signs no iat: such a bundle has no place in the order."""
    private, public = write_keys(tmp_path)
    bundle = copy_bundle(tmp_path, revision="no-iat")
    files = read_bundle(bundle).files
    claims = {"files": [{"name": n, "hash": file_digest(n, b), "algorithm": "SHA-256"} for n, b in files.items()],
              "keyid": "default"}
    token = jwt.encode(claims, load_signing_key(private.read_bytes()), algorithm="RS256", headers={"kid": "default"})
    (bundle / ".signatures.json").write_text(json.dumps({"signatures": [token]}))
    BundleVerifier.from_pem_file(str(public)).verify(files, (bundle / ".signatures.json").read_bytes())  # authentic
    engine = _engine(tmp_path, bundle, public)
    with pytest.raises(BundleRefused) as caught:
        engine.reload()
    assert caught.value.problem["file"] == ".signatures.json" and "no iat" in caught.value.problem["error"]
    assert not engine.active() and not (tmp_path / "state" / STATE_FILE).exists()


def test_a_bundle_signed_in_the_same_second_or_later_is_accepted_and_a_directory_bundle_is_not_kept(tmp_path):
    private, public = write_keys(tmp_path)
    live = _signed_dir(tmp_path, "rev-2", private, T2, name="live")
    engine = _engine(tmp_path, live, public)
    assert engine.reload() == "rev-2"
    shutil.rmtree(live)
    shutil.copytree(_signed_dir(tmp_path, "rev-2b", private, T2), live)  # same second: not a rollback
    assert engine.reload() == "rev-2b"
    shutil.rmtree(live)
    shutil.copytree(_signed_dir(tmp_path, "rev-3", private, T3), live)
    assert engine.reload() == "rev-3" and engine.decide(AUTHZ, {}).revision == "rev-3"
    state = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    assert (state["revision"], state["signed_at"]) == ("rev-3", T3)
    assert not (tmp_path / "state" / PULLED_FILE).exists()  # a directory is its own copy
    engine.close()


def test_an_unreadable_state_file_stops_the_start_and_rollback_needs_a_verification_key(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / STATE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not a policy bundle state file"):
        RollbackGuard(data)
    done = engram("serve", "--data", str(tmp_path / "other"), "--listen", "127.0.0.1:0",
                  "--bundle-allow-rollback", "rev-1")
    assert done.returncode == 2 and "--bundle-allow-rollback" in done.stderr and "--bundle-verification-key" in done.stderr
    assert not (tmp_path / "other").exists()


def test_unsigned_bundles_keep_todays_behaviour_no_order_and_nothing_kept(tmp_path):
    """Without a verification key there is no signed time: any revision activates, nothing is written."""
    from engram_core.policy.serving import PolicySettings, build_serving_policy

    bundle = copy_bundle(tmp_path, revision="unsigned-2")
    serving = build_serving_policy(PolicySettings(policies=bundle), tmp_path / "data")
    try:
        assert serving.guard is None and serving.backend.revision() == "unsigned-2"
        (bundle / ".manifest").write_text(json.dumps({"revision": "unsigned-1", "roots": ["engram"]}))
        assert serving.backend.reload() == "unsigned-1"
        assert not (tmp_path / "data").exists()
        assert "bundle_ordering" not in serving.describe()
    finally:
        serving.engine.close()
