"""A secret in a request's other stored strings is refused and never reaches the disk
(issue 13 finding 6, SPEC §13), through the real gRPC surface.

``idempotency_key`` (idempotency ledger), ``reason_ref`` (journal), and a host's
``event_id`` were never scanned: an AWS key id and a GitHub token there were accepted and
were still in plain text in ``engram.duckdb`` after the forget. Each attempt below must
be refused (UNAUTHORIZED, the authz policy's SECRET_FINDINGS), change nothing, and leave
the secret in no file of the data directory, raw bytes, after a CHECKPOINT.

A control forget with an ordinary ``reason_ref`` shows that the grep would see a stored
string: its marker is in the file afterwards.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from engram_core.contract.errors import Code
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, Failed, capture_args
from tests.support.reliability_crash import HostAdmin, activate_scope, domain_state

_rng = random.Random()
AWS_KEY_ID = "AKIA" + "".join(_rng.choice(string.ascii_uppercase + "234567") for _ in range(16))
GITHUB_TOKEN = "ghp_" + "".join(_rng.choice(string.ascii_letters + string.digits) for _ in range(36))


@pytest.fixture(scope="module")
def core(module_stores: EngineStores, tmp_path_factory):
    running = module_stores.start_core(tmp_path_factory.mktemp("request-fields") / "data", semantic=False)
    activate_scope(running)
    yield running
    running.stop()


def _files_containing(stores: EngineStores, data_dir: Path, needle: bytes) -> list[str]:
    """Files of the store holding ``needle``: the data directory's and, on PostgreSQL, the
    database's heap files and WAL (core_engines.EngineStores.blobs)."""
    return [name for name, blob in stores.blobs(data_dir).items() if needle in blob]


def test_secrets_in_idempotency_keys_reason_refs_and_event_ids_are_refused_and_stored_nowhere(core, module_stores: EngineStores) -> None:
    c = Client(core)
    host = HostAdmin(core)
    record_id = c.remember("We cache search pages for five minutes; the pin is per scope.")
    candidate_id = c.capture("A pending decision about the retry budget of the adapter.")["candidate_id"]
    before = domain_state(core)

    agent_attempts = [
        ("forget", {"record_id": record_id, "idempotency_key": f"forget-{AWS_KEY_ID}", "reason_ref": "r:cleanup"}),
        ("forget", {"record_id": record_id, "idempotency_key": "forget-ordinary-key-0001",
                    "reason_ref": f"r:{GITHUB_TOKEN}"}),
        ("forget", {"record_id": record_id, "idempotency_key": f"k{GITHUB_TOKEN}",  # glued to the word before
                    "reason_ref": f"because{AWS_KEY_ID}"}),
        ("withdraw", {"candidate_id": candidate_id, "idempotency_key": f"withdraw-{GITHUB_TOKEN}",
                      "reason_ref": "r:dup"}),
        ("withdraw", {"candidate_id": candidate_id, "idempotency_key": "withdraw-ordinary-0001",
                      "reason_ref": f"r:{AWS_KEY_ID}"}),
        ("request_admission", {"candidate_id": candidate_id, "idempotency_key": f"adm-{AWS_KEY_ID}"}),
        ("capture", capture_args("An ordinary decision about log rotation.", key=f"cap-{GITHUB_TOKEN}")),
    ]
    for op, args in agent_attempts:
        gated = op in ("forget", "withdraw")
        assert c.fails(op, args, grant=True if gated else None) == Code.UNAUTHORIZED, (op, args)

    host_attempts = [
        {"operation": "tombstone", "target": record_id, "event_id": f"evt-{GITHUB_TOKEN}", "reason_ref": "r:ops"},
        {"operation": "tombstone", "target": record_id, "event_id": "evt-ordinary-000001",
         "reason_ref": f"r:{AWS_KEY_ID}"},
        {"operation": "reject", "target": candidate_id, "event_id": "evt-ordinary-000002",
         "reason_ref": f"r:{GITHUB_TOKEN}"},
    ]
    for req in host_attempts:
        with pytest.raises(Failed) as refused:
            host.transition(req)
        assert refused.value.code == Code.UNAUTHORIZED, req

    assert domain_state(core) == before  # nothing happened
    assert c.get(record_id)["record"]["record_id"] == record_id

    data_dir = core.core.data_dir
    core.core.store.checkpoint()
    for secret in (AWS_KEY_ID, GITHUB_TOKEN):
        assert _files_containing(module_stores, data_dir, secret.encode()) == [], secret
        assert _files_containing(module_stores, data_dir, secret[4:].encode()) == [], secret  # not even its random part

    # Control: an ordinary reason_ref is stored in plain (journal), so the grep above would
    # have seen a secret stored there.
    marker = "r:control-" + "".join(_rng.choice(string.ascii_lowercase) for _ in range(16))
    out = c.call("forget", {"record_id": record_id, "idempotency_key": "forget-control-000001",
                            "reason_ref": marker}, grant=True)
    assert out["receipt"]["to_state"] == "tombstoned"
    core.core.store.checkpoint()
    assert _files_containing(module_stores, data_dir, marker.encode()), "the control marker should be on disk"
    host.close()


def test_engram_own_ids_and_digests_are_not_secrets(core) -> None:
    """Everything Engram hands an agent (ids, digests, receipts, cursors) can be quoted in a
    capture without being taken for a credential."""
    c = Client(core)
    captured = c.capture("A decision quoted by id later on.")
    admitted = c.admit(captured["candidate_id"])
    record_id = admitted["outcome"]["record_id"]
    page = c.search("decision", limit=1)
    quoted = " ".join(json.dumps(x) for x in (captured, admitted, page, c.get(record_id)))
    assert len(quoted) > 1000
    out = c.capture(f"See the earlier answers: {quoted[:60000]}")
    assert out["status"] == "committed_pending"
