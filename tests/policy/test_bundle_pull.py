"""One revision across replicas: cores pull the bundle from an OPA-compatible bundle server
(GET with ETag, polled), verify its signature, and converge on one revision; a tampered
bundle is refused with the file named and the previous revision keeps answering; POLICY_STALE
when a pull lands between a decision and its commit (issue 30). A real HTTP server serves
real tarballs and changes them mid-run."""

from __future__ import annotations

import io
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from engram_core.app.composition import start_core
from engram_core.contract.errors import Code
from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.port import ADMISSION
from engram_core.policy.pull import BundlePuller, HttpBundleSource
from engram_core.policy.signing import BundleVerifier
from engram_core.policy.sources import SourceUnavailable
from tests.support.core_support import Client, activate
from tests.support.policy_support import BundleServer, copy_bundle, engram, serve, write_keys


def _archive(tmp: Path, revision: str, key: Path | None, name: str | None = None) -> bytes:
    bundle = copy_bundle(tmp, name or f"bundle-{revision}", revision=revision)
    out = tmp / f"{name or revision}.tar.gz"
    argv = ["policy", "bundle", str(bundle), "--out", str(out)] + (["--sign", str(key)] if key else [])
    engram(*argv, check=True)
    return out.read_bytes()


def _tampered(archive: bytes, member: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    members["/" + member] += b"\n# changed after signing\n"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return buffer.getvalue()


def test_the_source_asks_with_the_etag_and_a_304_costs_nothing(tmp_path):
    with BundleServer() as server:
        server.publish(_archive(tmp_path, "rev-a", None))
        source = HttpBundleSource(server.url)
        assert source.fetch() is True and source.load().revision == "rev-a"
        assert source.fetch() is False and source.not_modified == 1
        assert server.requests[-1]["if_none_match"] == source.etag != ""
        server.publish(_archive(tmp_path, "rev-b", None))
        assert source.fetch() is True and source.load().revision == "rev-b"
        server.fail(1)
        with pytest.raises(SourceUnavailable, match="HTTP 500"):
            source.fetch()
        assert source.failures == 1


def _metrics(served: Any) -> str:
    address = served.opened.split("metrics http://", 1)[1].split("/metrics", 1)[0]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return response.read().decode()


def test_two_cores_converge_on_the_served_revision_and_refuse_a_tampered_one(tmp_path):
    private, public = write_keys(tmp_path)
    with BundleServer() as server:
        server.publish(_archive(tmp_path, "rev-a", private))
        flags = ("--bundle-url", server.url, "--bundle-verification-key", str(public),
                 "--bundle-poll-min-seconds", "0.2", "--bundle-poll-max-seconds", "0.4", "--metrics", "127.0.0.1:0")
        cores = [serve(tmp_path / f"replica-{i}" / "data", *flags) for i in (1, 2)]
        try:
            for core in cores:
                core.wait_for_revision("rev-a")
                assert f"policy_bundle pulled from {server.url}" in core.opened
                assert "bundle_verification on" in core.opened
            server.publish(_archive(tmp_path, "rev-b", private))
            for core in cores:
                core.wait_for_revision("rev-b")
                assert 'engram_policy_revision_info{revision="rev-b"} 1.0' in _metrics(core)
                assert 'last_success_bundle_activation{active_revision="rev-b",name="engram"}' in _metrics(core)

            server.publish(_tampered(_archive(tmp_path, "rev-c", private), "engram/authz/authz.rego"))
            for core in cores:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline and not [
                        e for e in core.json_events("policy_reload") if e.get("outcome") == "REFUSED"]:
                    time.sleep(0.1)
                [refused] = [e for e in core.json_events("policy_reload") if e.get("outcome") == "REFUSED"]
                assert refused["file"] == "engram/authz/authz.rego" and "digest mismatch" in refused["error"]
                assert refused["active_revision"] == "rev-b"
                assert core.health().policy_revision == "rev-b"  # still answering, still one revision
                assert 'bundle_failed_load_counter_total{code="REFUSED",name="engram"} 1.0' in _metrics(core)

            server.publish(_archive(tmp_path, "rev-d", None))  # unsigned: refused too
            for core in cores:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline and len(
                        [e for e in core.json_events("policy_reload") if e.get("outcome") == "REFUSED"]) < 2:
                    time.sleep(0.1)
                last = [e for e in core.json_events("policy_reload") if e.get("outcome") == "REFUSED"][-1]
                assert last["file"] == ".signatures.json" and core.health().policy_revision == "rev-b"
        finally:
            for core in cores:
                core.stop()
    pulls = [e for core in cores for e in core.json_events("policy_bundle_downloaded")]
    assert len(pulls) >= 8  # a, b, c, d on each replica


def test_a_core_started_while_the_server_is_down_serves_once_it_answers(tmp_path):
    with BundleServer() as server:  # no archive yet: 500
        served = serve(tmp_path / "data", "--bundle-url", server.url, "--bundle-poll-min-seconds", "0.1",
                       "--bundle-poll-max-seconds", "0.3")
        try:
            assert served.health().status == "NOT_SERVING"
            assert "bundle server answered HTTP 500" in served.opened
            server.publish(_archive(tmp_path, "rev-late", None))
            served.wait_for_revision("rev-late")
        finally:
            served.stop()


class _PullAfterAdmissionDecision(EmbeddedPolicyEngine):
    """The real embedded engine over a real bundle server; once armed, the puller polls right
    after an admission decision (the server already serves the next revision)."""

    puller: BundlePuller | None = None
    armed = False

    def decide(self, path: str, input: Any, *, timeout_s: float | None = None):
        decision = super().decide(path, input, timeout_s=timeout_s)
        if path == ADMISSION and self.armed and self.puller is not None:
            self.armed = False
            assert self.puller.poll_once()
        return decision


def test_a_pull_between_decision_and_commit_is_policy_stale_and_receipts_name_the_pulled_revision(tmp_path):
    private, public = write_keys(tmp_path)
    with BundleServer() as server:
        server.publish(_archive(tmp_path, "pulled-1", private))
        source = HttpBundleSource(server.url)
        engine = _PullAfterAdmissionDecision(source=source, verifier=BundleVerifier.from_pem_file(str(public)))
        engine.reload()
        running = start_core(tmp_path / "data", policy=engine, semantic=False)
        engine.puller = BundlePuller(source, running.core.policy.reload, min_delay_s=60, max_delay_s=60)
        try:
            activate(running)
            client = Client(running)
            cap = client.capture("Pulled bundles: decided under one revision, committed under the next.")
            server.publish(_archive(tmp_path, "pulled-2", private))
            engine.armed = True
            args = {"candidate_id": cap["candidate_id"], "idempotency_key": "pulled-stale-0001"}
            assert client.fails("request_admission", args) == Code.POLICY_STALE
            assert running.core.policy.revision() == "pulled-2"
            retry = client.call("request_admission", args)
            assert retry["outcome"]["status"] == "accepted"
            with running.core.store.read() as tx:
                rows = tx.audit_rows(None, 0, None)
        finally:
            running.stop()
    admitted = [r for r in rows if r["operation"] == "engram_memory_request_admission" and r["outcome"] == "accepted"]
    assert admitted and {d["revision"] for d in admitted[-1]["decisions"] if "revision" in d} == {"pulled-2"}
    captured = [r for r in rows if r["operation"] == "engram_memory_capture"]
    assert {d["revision"] for d in captured[-1]["decisions"] if "revision" in d} == {"pulled-1"}


def test_serve_refuses_flags_that_cannot_work_before_touching_the_data_directory(tmp_path):
    done = engram("serve", "--data", str(tmp_path / "data"), "--listen", "127.0.0.1:0",
                  "--bundle-url", "http://127.0.0.1:9/b.tar.gz", "--bundle-poll-min-seconds", "5",
                  "--bundle-poll-max-seconds", "1")
    assert done.returncode == 2 and "--bundle-poll-min-seconds" in done.stderr
    key = tmp_path / "not-a-key.pem"
    key.write_text("hello")
    done = engram("serve", "--data", str(tmp_path / "data"), "--listen", "127.0.0.1:0",
                  "--bundle-verification-key", str(key))
    assert done.returncode == 2 and "not a PEM public key" in done.stderr
    assert not (tmp_path / "data").exists()


def test_a_server_without_etags_resending_the_same_archive_is_not_a_new_bundle(tmp_path):
    archive = _archive(tmp_path, "rev-same", None)
    with BundleServer() as server:
        server.publish(archive)
        source = HttpBundleSource(server.url)
        assert source.fetch() is True
        source.etag = ""  # as if the server sent none: the next GET asks unconditionally
        assert source.fetch() is False and source.not_modified == 1 and source.downloads == 1
