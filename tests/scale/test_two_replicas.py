"""Two cores over one PostgreSQL store (issue 28): two `engram serve --store` processes on one
database and one key directory, clients spread over both. What one acknowledged, the other
serves; a forget on one leaves no replica returning the record; one idempotency key sent to both
at once has one effect; a context used on one is refused on the other; a page cursor from one
pages on the other; a revocation on one cuts the old contexts off on the other."""

from __future__ import annotations

import json
import threading
from typing import Any

from engram_core.api import admin_pb2
from engram_core.contract.errors import Code
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, make_context
from tests.support.core_support import PURPOSE, Client, Failed, activate, capture_args, now_ms
from tests.support.pg_cluster import Database
from tests.support.replicas import Replica

ROUNDS = 20


def _ids(result: dict[str, Any]) -> list[str]:
    return [r["record"]["record_id"] for r in result["records"]]


def test_what_one_replica_acknowledged_the_other_serves(replicas: tuple[Replica, Replica]) -> None:
    a, b = (Client(r) for r in replicas)  # type: ignore[arg-type]
    rid = a.remember("Replicas: the kittiwake runbook names the failover order.")
    # Admission acknowledged by A: B's search and get see it at once (B caught up from the journal).
    assert _ids(b.search("kittiwake runbook")) == [rid]
    assert b.get(rid)["record"]["record_id"] == rid
    # A page cursor from A pages on B (the pin is in the database, the MAC key in the key directory).
    more = [a.remember(f"Replicas: kittiwake note {n} about the runbook.") for n in range(3)]
    first = a.search("kittiwake", limit=2)
    second = b.search("kittiwake", limit=2, page_cursor=first["next_page_cursor"])
    assert len(set(_ids(first)) | set(_ids(second))) == 4 and not set(_ids(first)) & set(_ids(second))
    assert set(_ids(first)) | set(_ids(second)) <= {rid, *more}
    # A forget acknowledged by A: neither replica returns the record, by get or by search.
    a.call("forget", {"record_id": rid, "idempotency_key": "replica-forget-0001", "reason_ref": "r:x"}, grant=True)
    for c in (a, b):
        assert c.fails("get", {"record_id": rid, "purpose_ref": PURPOSE}) == Code.NOT_FOUND
        assert rid not in _ids(c.search("kittiwake runbook failover"))
    for c in (a, b):
        c.channel.close()


def test_one_idempotency_key_sent_to_both_at_once_has_one_effect(replicas: tuple[Replica, Replica],
                                                                   pg_database: Database) -> None:
    a, b = (Client(r) for r in replicas)  # type: ignore[arg-type]

    def send(i: int, client: Client, args: dict[str, Any], barrier: threading.Barrier, out: list[Any]) -> None:
        barrier.wait()
        try:
            out[i] = client.call("capture", args)
        except Failed as f:
            out[i] = f.code

    for n in range(ROUNDS):
        args = capture_args(f"Race across replicas, round {n}: the fulmar key.", key=f"replica-race-{n:04d}-x")
        barrier = threading.Barrier(2)
        out: list[Any] = [None, None]
        threads = [threading.Thread(target=send, args=(i, c, args, barrier, out)) for i, c in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        candidates = {o["candidate_id"] for o in out if isinstance(o, dict)}
        assert len(candidates) == 1, out  # both answered with the one candidate: one made it, one replayed
        assert all(isinstance(o, dict) for o in out), out
    with pg_database.connect() as con:
        made = con.execute("SELECT count(*) FROM candidates").fetchone()[0]  # type: ignore[index]
        keys = con.execute("SELECT count(*) FROM idempotency WHERE key LIKE 'replica-race-%'").fetchone()[0]  # type: ignore[index]
        events = con.execute("SELECT count(*) FROM journal WHERE operation = 'capture'").fetchone()[0]  # type: ignore[index]
    assert (made, keys, events) == (ROUNDS, ROUNDS, ROUNDS)
    for c in (a, b):
        c.channel.close()


def test_a_context_used_on_one_replica_is_refused_on_the_other(replicas: tuple[Replica, Replica]) -> None:
    a, b = (Client(r) for r in replicas)  # type: ignore[arg-type]
    rid = a.remember("Replay across replicas: the skua context.")
    context = a.context("get")
    args = {"record_id": rid, "purpose_ref": PURPOSE}
    assert a.call("get", args, context=context)["record"]["record_id"] == rid
    assert b.fails("get", args, context=context) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert a.fails("get", args, context=context) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert b.get(rid)["record"]["record_id"] == rid  # a fresh context is served
    # A revocation on A: B refuses the contexts of the old epoch too.
    leaked = b.context("get")
    host = make_context(a.key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:operator",
                        now_ms=now_ms(), host_principal=True, maintenance_scopes=("read", "maintain"),
                        memory_enabled=False)
    out = a.admin.Revoke(admin_pb2.ScopeRequest(tenant=a.tenant, workspace=a.workspace),
                         metadata=[(CONTEXT_METADATA_KEY, host)], timeout=10)
    assert json.loads(out.json)["authorization_epoch"] == 1
    assert b.fails("get", args, context=leaked) == Code.AUTHORIZATION_REVOKED
    assert b.call("get", args, context=b.context("get", authorization_epoch=1))["record"]["record_id"] == rid
    for c in (a, b):
        c.channel.close()


def _operator(client: Client) -> list[tuple[str, bytes]]:
    ctx = make_context(client.key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:operator",
                       now_ms=now_ms(), host_principal=True, maintenance_scopes=("read", "maintain"),
                       memory_enabled=False)
    return [(CONTEXT_METADATA_KEY, ctx)]


def test_projections_one_replica_invalidated_are_stale_on_the_other_until_rebuilt(
        replicas: tuple[Replica, Replica]) -> None:
    """SPEC §3: a scope whose projections an operator dropped answers PROJECTION_STALE, never an
    empty page, on every core: B had alpha's index loaded (it catches up past the invalidation)
    and had never loaded beta's (it loads it afresh, with its mark)."""
    activate(replicas[0], workspace="beta")  # type: ignore[arg-type]
    a, b = (Client(r) for r in replicas)  # type: ignore[arg-type]
    a_beta, b_beta = (Client(r, workspace="beta") for r in replicas)  # type: ignore[arg-type]
    rid = a.remember("Replicas: the petrel dashboard shows the queue depth.")
    beta_id = a_beta.remember("Replicas: the petrel pager goes to beta's on-call.")
    assert _ids(b.search("petrel dashboard")) == [rid]  # alpha loaded on B; beta not
    for c in (a, a_beta):
        a.admin.InvalidateProjections(admin_pb2.ScopeRequest(tenant=c.tenant, workspace=c.workspace),
                                      metadata=_operator(a), timeout=10)
    for c in (a, b, a_beta, b_beta):
        assert c.fails("search", {"query": "petrel", "purpose_ref": PURPOSE}) == Code.PROJECTION_STALE
    assert b.get(rid)["record"]["record_id"] == rid  # get reads no projection
    for c in (b, b_beta):
        b.admin.RebuildProjections(admin_pb2.ScopeRequest(tenant=c.tenant, workspace=c.workspace),
                                   metadata=_operator(b), timeout=10)
    for c, expected in ((a, rid), (b, rid), (a_beta, beta_id), (b_beta, beta_id)):
        assert _ids(c.search("petrel")) == [expected]
    for c in (a, b, a_beta, b_beta):
        c.channel.close()
