"""Host verifiers for trust over gRPC and `engram admin attest` (SPEC §5 Trust, §12; issue 18).

The tests share one core per engine (``module_core``): each attests records it remembered
itself, and counts the attestations it caused from what was there when it began."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engram_core.api import host_pb2, host_pb2_grpc
from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.rpc.server import RunningCore
from engram_core.rpc.status import code_from_rpc_error
from engram_core.services.attestation import sign_attestation
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY
from engram_core.trust.hostkeys import key_id, public_pem
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, capture_args, now_ms
from tests.support.engram_cli import run_engram
from tests.support.governance_support import Host, new_event_id, start_with_bundle

VERIFIER = Ed25519PrivateKey.generate()
STRANGER = Ed25519PrivateKey.generate()


def _edit(cfg: dict) -> None:
    cfg["tenants"]["*"].update(verifier_key_ids=[key_id(VERIFIER.public_key())],
                               consented_families=["family:db"], adjudication_trust_classes=[])


@pytest.fixture(scope="module")
def module_core(tmp_path_factory: pytest.TempPathFactory, module_stores: EngineStores) -> Iterator[RunningCore]:
    core = start_with_bundle(tmp_path_factory.mktemp("attest"), module_stores, edit=_edit)
    try:
        yield core
    finally:
        core.stop()


@pytest.fixture
def env(module_core: RunningCore) -> Iterator[tuple[RunningCore, Client, Host]]:
    c, host = Client(module_core), Host(module_core)
    try:
        yield module_core, c, host
    finally:
        c.channel.close()
        host.channel.close()


def _digest(record_id: str) -> str:
    import base64

    raw = record_id.removeprefix("mem_").upper()
    return "sha256:" + base64.b32decode(raw + "=" * (-len(raw) % 8)).hex()


def _attest(host: Host, target: str, trust_class: str, *, key: Ed25519PrivateKey | None = None,
            digest: str | None = None, pem_of: Ed25519PrivateKey | None = None, event_id: str | None = None,
            md=None) -> dict:
    req = host_pb2.AttestRequest(tenant="acme", workspace="alpha", target=target, trust_class=trust_class,
                                 event_id=event_id or new_event_id(), reason_ref="reason:verified")
    if key is not None:
        req.signature = sign_attestation(key, digest or _digest(target))
        req.verifier_public_key_pem = public_pem((pem_of or key).public_key())
    stub = host_pb2_grpc.HostServiceStub(host.channel)
    return json.loads(stub.Attest(req, metadata=md or host.md("host"), timeout=30).json)


def _code(fn) -> Code:
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return code_from_rpc_error(err.value)


def _attest_events(core: RunningCore) -> list:
    with core.core.store.read() as tx:
        return [e for e in tx.events(Scope("acme", "alpha"), 0, None) if e.operation == "attest"]


def _attest_audit_rows(core: RunningCore) -> int:
    with core.core.store.read() as tx:
        return [row["operation"] for row in tx.audit_rows(Scope("acme", "alpha"), 0, None)].count("host.attest")


def test_signed_attestation_is_verified_journaled_idempotent_and_visible(env) -> None:
    core, c, host = env
    rid = c.remember("Deploys are gated on the canary error rate.")
    audited_before = _attest_audit_rows(core)
    event_id = new_event_id()
    out = _attest(host, rid, "signed", key=VERIFIER, event_id=event_id)
    r = out["receipt"]
    assert (out["replayed"], r["trust_class"], r["previous_trust_class"]) == (False, "signed", "asserted")
    assert r["verifier_key_id"] == key_id(VERIFIER.public_key()) and r["record_digest"] == _digest(rid)
    assert c.get(rid)["record"]["trust_class"] == "signed"
    again = _attest(host, rid, "signed", key=VERIFIER, event_id=event_id)
    assert again == {**out, "replayed": True}
    events = [e for e in _attest_events(core) if e.target == rid]
    assert len(events) == 1 and events[0].body["verifier_key_id"] == r["verifier_key_id"]
    # The same event id for another attestation is a conflict, not a second effect.
    assert _code(lambda: _attest(host, rid, "earned", event_id=event_id)) == Code.DIGEST_CONFLICT
    assert _attest_audit_rows(core) - audited_before == 1


def test_forged_misdirected_or_untrusted_signatures_change_nothing(env) -> None:
    core, c, host = env
    rid = c.remember("Backups run nightly at two.")
    other = c.remember("Restores are tested monthly.")
    attested_before = len(_attest_events(core))
    # A signature by another key presented with the trusted verifier's public key.
    assert _code(lambda: _attest(host, rid, "signed", key=STRANGER, pem_of=VERIFIER)) == Code.UNAUTHORIZED
    # A genuine verifier signature over another record's digest.
    assert _code(lambda: _attest(host, rid, "signed", key=VERIFIER, digest=_digest(other))) == Code.UNAUTHORIZED
    # A valid signature by a key the tenant does not name (policy: VERIFIER_NOT_TRUSTED).
    assert _code(lambda: _attest(host, rid, "signed", key=STRANGER)) == Code.UNAUTHORIZED
    # signed without a signature, an unknown class, earned carrying a signature.
    assert _code(lambda: _attest(host, rid, "signed")) == Code.INVALID_SCHEMA
    assert _code(lambda: _attest(host, rid, "asserted")) == Code.INVALID_SCHEMA
    assert _code(lambda: _attest(host, rid, "earned", key=VERIFIER)) == Code.INVALID_SCHEMA
    assert _code(lambda: _attest(host, "mem_" + "a" * 52, "earned")) == Code.NOT_FOUND
    assert c.get(rid)["record"]["trust_class"] == "asserted" and len(_attest_events(core)) == attested_before


def test_agents_cannot_attest(env) -> None:
    core, c, host = env
    rid = c.remember("An agent would like to be trusted.")
    agent_md = [(CONTEXT_METADATA_KEY, c.context(call="host"))]
    assert _code(lambda: _attest(host, rid, "earned", md=agent_md)) == Code.UNAUTHORIZED
    assert c.get(rid)["record"]["trust_class"] == "asserted"


def test_earned_candidate_is_seen_by_admission_and_reconciliation(env) -> None:
    core, c, host = env
    family = {"family_refs": ["family:db"]}
    signed_member = c.admit(c.call("capture", capture_args("We use Postgres 16.", t=now_ms() - 120_000,
                                                           reconciliation=family))["candidate_id"])["outcome"]
    _attest(host, signed_member["record_id"], "signed", key=VERIFIER)
    # An asserted newcomer cannot displace a signed member: the default rule sends it to adjudication.
    weak = c.call("capture", capture_args("We use Postgres 17.", t=now_ms() - 60_000, reconciliation=family))
    assert c.admit(weak["candidate_id"])["outcome"]["status"] == "pending_adjudication"
    # A newcomer the host verifier signed before admission does displace it.
    strong = c.call("capture", capture_args("We use Postgres 17, verified.", t=now_ms() - 30_000,
                                            reconciliation=family))
    digest = strong["record_digest"]
    _attest(host, strong["candidate_id"], "signed", key=VERIFIER, digest=digest)
    out = c.admit(strong["candidate_id"])["outcome"]
    assert out["status"] == "accepted"
    assert host.state(signed_member["record_id"]) == "historical"
    assert c.get(out["record_id"])["record"]["trust_class"] == "signed"
    # earned on a pending candidate, as the admission policy sees it.
    cand = c.capture("Earned through host review.")
    _attest(host, cand["candidate_id"], "earned")
    rid = c.admit(cand["candidate_id"])["outcome"]["record_id"]
    assert c.get(rid)["record"]["trust_class"] == "earned"
    with core.core.store.read() as tx:
        events = tx.events(Scope("acme", "alpha"), 0, None)
    admission = [d for e in events if e.operation == "accept" and e.target == cand["candidate_id"]
                 for d in e.body["decisions"] if d["path"] == "engram/admission/decision"]
    assert len(admission) == 1


def test_trust_invalidation_undoes_an_attestation(env) -> None:
    core, c, host = env
    rid = c.remember("The CDN is Fastly.")
    _attest(host, rid, "signed", key=VERIFIER)
    receipt = host.transition("trust_invalidate", rid)["receipt"]
    assert receipt["trust_class_revoked"] == "signed"
    view = host.history(rid)
    assert view["records"][0]["trust_class"] == "asserted" and view["records"][0]["state"] == "trust_invalid"
    assert _code(lambda: _attest(host, rid, "earned")) == Code.ILLEGAL_TRANSITION


def test_engram_admin_attest_signs_with_a_verifier_key_file(env, tmp_path) -> None:
    core, c, host = env
    rid = c.remember("Secrets live in Vault.")
    cand = c.capture("Pending, verified by the CLI.")
    key_file = tmp_path / "verifier.key"
    key_file.write_bytes(VERIFIER.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    key_file.chmod(0o600)
    engram = str(Path(sys.executable).with_name("engram"))
    base = ["admin", "--core", core.address, "--host-key", str(core.host_key_path), "--json", "attest",
            "--tenant", "acme", "--workspace", "alpha"]
    # The record as the console script (a process); the candidate and the refusal through its
    # function in this process (tests/support/engram_cli.py).
    signed = [rid, "--trust-class", "signed", "--verifier-key", str(key_file)]
    for out in (subprocess.run([engram, *base, *signed], capture_output=True, text=True, timeout=60),
                run_engram(*base, cand["candidate_id"], "--trust-class", "signed", "--verifier-key", str(key_file))):
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["receipt"]["trust_class"] == "signed"
    assert c.get(rid)["record"]["trust_class"] == "signed"
    out = run_engram(*base, rid, "--trust-class", "signed")
    assert out.returncode == 2 and "--verifier-key" in out.stderr
