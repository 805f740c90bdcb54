"""Isolation matrix (issue 7 item 4, SPEC §2): every target-taking operation ×
(other tenant, other workspace, other principal where relevant) × (existing,
tombstoned, pending, never-existed target) answers exactly like a target that
never existed — same code, same status message and details, no receipt —
changes nothing, and leaks nothing through search, cursors or timing class."""

from __future__ import annotations

import statistics
import time

import pytest

from engram_core.contract.errors import Code
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, Failed
from tests.support.reliability_crash import activate_scope, domain_state

NEVER_RECORD = "mem_" + "a" * 52
NEVER_CANDIDATE = "cand_" + "b" * 26


@pytest.fixture(scope="module")
def world(module_stores: EngineStores, tmp_path_factory):
    running = module_stores.start_core(tmp_path_factory.mktemp("iso") / "data", semantic=False)
    for t, w in (("acme", "alpha"), ("acme", "beta"), ("globex", "alpha")):
        activate_scope(running, t, w)
    owner = Client(running)
    targets = {
        "existing": owner.remember("Isolation matrix: the heron service owns the billing ledger in Oslo."),
        "tombstoned": owner.remember("Isolation matrix: the heron record to be forgotten names the Kafka retention of 7 days."),
        "pending": owner.capture("Isolation matrix heron candidate pending.")["candidate_id"],
        "withdrawn": owner.capture("Isolation matrix heron candidate withdrawn.")["candidate_id"],
    }
    owner.call("forget", {"record_id": targets["tombstoned"], "idempotency_key": "iso-forget-key-xxxxxxx",
                          "reason_ref": "r:iso"}, grant=True)
    owner.call("withdraw", {"candidate_id": targets["withdrawn"], "idempotency_key": "iso-withdraw-key-xxxxx",
                            "reason_ref": "r:iso"}, grant=True)
    yield running, owner, targets
    running.stop()


OUTSIDERS = {
    "other_tenant": dict(tenant="globex", workspace="alpha"),
    "other_workspace": dict(tenant="acme", workspace="beta"),
}


def _answer(c: Client, op: str, args: dict, gated: bool) -> tuple:
    try:
        c.call(op, args, grant=gated or None)
    except Failed as f:
        return f.code, f.err.code(), f.err.details(), tuple(sorted((k, v if isinstance(v, str) else v.hex())
                                                                 for k, v in (f.err.trailing_metadata() or ())))
    raise AssertionError(f"{op} succeeded across scopes")


def _ops(target: str, n: int) -> list[tuple[str, dict, bool]]:
    rec = target if target.startswith("mem_") else NEVER_RECORD
    cand = target if target.startswith("cand_") else NEVER_CANDIDATE
    return [
        ("get", {"record_id": rec, "purpose_ref": "purpose:engineering-notes"}, False),
        ("forget", {"record_id": rec, "idempotency_key": f"iso-fg-{n:06d}-xxxxxxxx", "reason_ref": "r:x"}, True),
        ("request_admission", {"candidate_id": cand, "idempotency_key": f"iso-adm-{n:06d}-xxxxxxx"}, False),
        ("withdraw", {"candidate_id": cand, "idempotency_key": f"iso-wd-{n:06d}-xxxxxxxx", "reason_ref": "r:x"}, True),
    ]


def test_every_operation_outside_scope_is_never_existed_not_found(world) -> None:
    running, owner, targets = world
    before = domain_state(running)
    n = 0
    for who, scope in OUTSIDERS.items():
        c = Client(running, **scope)
        for kind, target in [*targets.items(), ("never", NEVER_RECORD)]:
            for op, args, gated in _ops(target, n):
                n += 1
                got = _answer(c, op, args, gated)
                never_args = dict(args, **({"record_id": NEVER_RECORD} if "record_id" in args else
                                           {"candidate_id": NEVER_CANDIDATE}))
                never_args["idempotency_key"] = never_args.get("idempotency_key", "x")[:-1] + "n" \
                    if "idempotency_key" in never_args else None
                if never_args["idempotency_key"] is None:
                    del never_args["idempotency_key"]
                want = _answer(c, op, never_args, gated)
                assert got[0] == Code.NOT_FOUND, (who, kind, op, got)
                assert got[:3] == want[:3], (who, kind, op, got, want)
                assert got[3] == want[3], (who, kind, op)
    assert domain_state(running) == {**before, "heads": before["heads"]}


def test_other_principal_same_key_is_its_own_key(world) -> None:
    """Idempotency keys are per principal (SPEC §7): another principal reusing a key neither
    replays nor conflicts with the first principal's outcome (that would reveal the key exists)."""
    running, owner, targets = world
    from tests.support.core_support import capture_args

    key = "iso-shared-idempotency-key-01"
    first = owner.call("capture", capture_args("Principal isolation first capture.", key=key))
    mallory = Client(running, principal="user:mallory")
    other = mallory.call("capture", capture_args("Principal isolation other content.", key=key))
    assert other["status"] == "committed_pending" and other["candidate_id"] != first["candidate_id"]


def test_search_and_cursors_leak_nothing_and_timing_class_matches(world) -> None:
    running, owner, targets = world
    for scope in OUTSIDERS.values():
        c = Client(running, **scope)
        assert c.search("heron")["records"] == []
        cap = c.capture("An outsider's own first note about cormorants.")
        assert cap["cursor"] == "1", cap  # per-scope dense cursors: no volume leak from acme/alpha
    c = Client(running, **OUTSIDERS["other_tenant"])
    args = {"purpose_ref": "purpose:engineering-notes"}

    def timed(rid: str) -> float:
        t = time.perf_counter()
        try:
            c.call("get", {**args, "record_id": rid})
        except Failed:
            pass
        return time.perf_counter() - t

    for _ in range(5):
        timed(targets["existing"]), timed(NEVER_RECORD)
    existing = statistics.median(timed(targets["existing"]) for _ in range(40))
    never = statistics.median(timed(NEVER_RECORD) for _ in range(40))
    # same timing class: no order-of-magnitude difference between an out-of-scope hit and a miss
    assert existing < never * 3 + 0.005 and never < existing * 3 + 0.005, (existing, never)
