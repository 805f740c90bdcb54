"""Crash soak pieces: a mixed workload against a subprocess core that records what
was acknowledged and what was in flight, and checks read straight from the store (on either
engine: tests/support/core_engines.py).

The workload runs in a few threads, each on its own records (so lifecycle
errors between workers cannot happen and any non-transport error is a bug):
captures, agent admissions, confirmed withdrawals and forgets, host
transitions (dispute → resolve, supersede) and a migration call per cycle, plus
searches and gets whose audit rows must survive every kill.
"""

from __future__ import annotations

import json
import random
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc
from engram_core.contract.canonical import digest
from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.contract.tools import ADMISSION_TOOL, CAPTURE_TOOL, FORGET_TOOL, WITHDRAW_TOOL
from engram_core.rpc.status import code_from_rpc_error
from engram_core.store.chain import GENESIS, audit_digest_of, event_digest_of
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.core_engines import EngineStores, one, rows
from tests.support.core_support import Client, Failed, capture_args

TENANT, WORKSPACE = "acme", "alpha"
# What a client may see when the server dies under it.
TRANSPORT = {Code.STORE_UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.CANCELLED, Code.MUTATION_OUTCOME_UNKNOWN}


class SubprocessCore:
    """What core_support.Client needs from a core: address and host key."""

    def __init__(self, address: str, data_dir: Path) -> None:
        self.address = address
        self.host_key_path = data_dir / "host.key"


class HostAdmin:
    """AdminService calls under a signed host maintenance context."""

    def __init__(self, core: SubprocessCore) -> None:
        self.key = load_private_key_file(core.host_key_path)
        self.channel = grpc.insecure_channel(core.address)
        self.stub = admin_pb2_grpc.AdminServiceStub(self.channel)

    def md(self) -> list[tuple[str, bytes]]:
        ctx = make_context(self.key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:operator",
                           agent_id="ops",
                           session="s", now_ms=time.time_ns() // 1_000_000, host_principal=True,
                           maintenance_scopes=("read", "maintain"), memory_enabled=False)
        return [(CONTEXT_METADATA_KEY, ctx)]

    def call(self, rpc: str, request: Any, timeout: float = 10) -> dict[str, Any]:
        try:
            return json.loads(getattr(self.stub, rpc)(request, metadata=self.md(), timeout=timeout).json)
        except grpc.RpcError as err:
            raise Failed(code_from_rpc_error(err), err) from None

    def transition(self, req: dict[str, str], timeout: float = 5) -> dict[str, Any]:
        return self.call("Transition", admin_pb2.TransitionRequest(tenant=TENANT, workspace=WORKSPACE, **req), timeout)

    def verify(self) -> dict[str, Any]:
        return self.call("Verify", admin_pb2.ScopeRequest(report_only=True), timeout=60)

    def migrate(self) -> dict[str, Any]:
        return self.call("Migrate", admin_pb2.ScopeRequest(), timeout=5)

    def close(self) -> None:
        self.channel.close()


@dataclass
class Ledger:
    """Acknowledged mutations (kind, args, result) and those in flight at a kill (kind, args)."""

    acked: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    in_flight: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)  # audit ids of acknowledged searches and gets
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, kind: str, args: dict[str, Any], result: dict[str, Any]) -> None:
        with self.lock:
            self.acked.append((kind, args, result))


def _key(prefix: str, rng: random.Random) -> str:
    return f"{prefix}-{rng.getrandbits(64):016x}-{secrets.token_hex(4)}"


def perform(client: Client, admin: HostAdmin, kind: str, args: dict[str, Any], timeout: float = 5) -> dict[str, Any]:
    """One mutation of the workload, as a client would send it (a fresh grant for gated ones)."""
    if kind == "capture":
        return client.call("capture", args, timeout=timeout)
    if kind == "admit":
        return client.call("request_admission", args, timeout=timeout)
    if kind in ("withdraw", "forget"):
        return client.call(kind, args, grant=True, timeout=timeout)
    if kind == "host":
        return admin.transition(args, timeout=timeout)
    raise AssertionError(kind)


def workload(client: Client, admin: HostAdmin, ledger: Ledger, rng: random.Random, worker: int) -> None:
    """Mixed mutations until the server dies; the call in flight at that moment is recorded."""
    current: list[str] = []  # this worker's accepted_current records (successor candidates)
    n = 0

    def do(kind: str, args: dict[str, Any]) -> dict[str, Any]:
        try:
            out = perform(client, admin, kind, args)
        except Failed as f:
            if f.code in TRANSPORT:
                with ledger.lock:
                    ledger.in_flight.append((kind, args))
            else:
                with ledger.lock:
                    ledger.unexpected.append(f"{kind}: {f.code.value}")
            raise
        ledger.ack(kind, args, out)
        return out

    def read(op: str, args: dict[str, Any]) -> None:
        """A search or get; its audit row (audit spool) must survive any later kill."""
        audit_id = "aud_soak_" + secrets.token_hex(10)
        try:
            client.call(op, {**args, "purpose_ref": client.purpose_ref}, context=client.context(op, audit_id=audit_id),
                        timeout=5)
        except Failed as f:
            if f.code not in TRANSPORT:
                with ledger.lock:
                    ledger.unexpected.append(f"{op}: {f.code.value}")
            raise
        with ledger.lock:
            ledger.reads.append(audit_id)

    try:
        while True:
            n += 1
            args = capture_args(f"Crash soak worker {worker} item {n} about the kestrel {rng.random()}.",
                                key=_key("soak-cap", rng))
            cap = do("capture", args)
            r = rng.random()
            if r < 0.12:
                do("withdraw", {"candidate_id": cap["candidate_id"], "idempotency_key": _key("soak-wd", rng),
                                "reason_ref": "reason:soak"})
                continue
            if r < 0.17:
                do("host", {"operation": "reject", "target": cap["candidate_id"], "event_id": _key("soak-rej", rng),
                            "reason_ref": "reason:soak"})
                continue
            out = do("admit", {"candidate_id": cap["candidate_id"], "idempotency_key": _key("soak-adm", rng)})
            if out["outcome"]["status"] != "accepted":
                continue
            rid = out["outcome"]["record_id"]
            r = rng.random()
            if r < 0.5:  # this worker's own record, just accepted: found
                read("get", {"record_id": rid})
            elif r < 0.7:
                read("search", {"query": f"kestrel worker {worker}"})
            r = rng.random()
            if r < 0.2:
                do("forget", {"record_id": rid, "idempotency_key": _key("soak-fg", rng), "reason_ref": "reason:soak"})
            elif r < 0.4:
                do("host", {"operation": "dispute", "target": rid, "event_id": _key("soak-dsp", rng),
                            "reason_ref": "reason:soak"})
                do("host", {"operation": "resolve_dispute", "target": rid, "to_state": "accepted_current",
                            "event_id": _key("soak-res", rng), "reason_ref": "reason:soak"})
                current.append(rid)
            elif r < 0.55 and current:
                older = current.pop(0)
                do("host", {"operation": "supersede", "target": older, "successor": rid,
                            "event_id": _key("soak-sup", rng), "reason_ref": "reason:soak"})
                current.append(rid)
            elif r < 0.65:
                do("host", {"operation": "tombstone", "target": rid, "event_id": _key("soak-htb", rng),
                            "reason_ref": "reason:soak"})
            else:
                current.append(rid)
    except Failed:
        return


# -- checks ----------------------------------------------------------------------------------------
TOOL_OF = {"capture": CAPTURE_TOOL, "admit": ADMISSION_TOOL,
           "withdraw": WITHDRAW_TOOL, "forget": FORGET_TOOL}


def target_of(kind: str, args: dict[str, Any], result: dict[str, Any]) -> str:
    if kind == "capture":
        return result["candidate_id"]
    return args.get("candidate_id") or args.get("record_id") or args["target"]


def _replay(client: Client, admin: HostAdmin, kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """One retry, as a well-behaved agent makes it: RATE_LIMITED (the principal's per-minute
    quota, which a soak's thousands of replays from one client reach) is waited out."""
    deadline = time.monotonic() + 180
    while True:
        try:
            return perform(client, admin, kind, args, timeout=10)
        except Failed as exc:
            if exc.code != Code.RATE_LIMITED or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def check_replays(client: Client, admin: HostAdmin, ledger: Ledger) -> int:
    """Every acknowledged mutation, retried with its idempotency key, returns its original outcome."""
    for kind, args, result in ledger.acked:
        again = _replay(client, admin, kind, args)
        if kind == "capture":
            assert again["status"] == "duplicate_exact" and again["candidate_id"] == result["candidate_id"], (args, again)
            assert {k: v for k, v in again.items() if k != "status"} == {k: v for k, v in result.items() if k != "status"}
        else:
            assert again["replayed"] is True, (kind, args, again)
            assert {k: v for k, v in again.items() if k not in ("replayed",)} == \
                {k: v for k, v in result.items() if k not in ("replayed",)}, (kind, args, again, result)
    return len(ledger.acked)


def verify_file(stores: EngineStores, data_dir: Path, ledger: Ledger) -> dict[str, int]:
    """Read straight from the store (core stopped; the DuckDB file or the PostgreSQL database):
    chains verify, nothing half-applied, every acknowledged mutation has its journal event and
    its audit row."""
    with stores.open_store(data_dir) as store:  # postings_count opens sealed projections: the vault is needed
        with store.read() as tx:
            targets_by_op: dict[str, set[str]] = {}
            n_events = 0
            for scope in tx.scopes():
                prev = GENESIS
                last = 0
                for e in tx.events(Scope(scope.tenant, scope.workspace), 1, None):
                    doc = {"tenant": e.tenant, "workspace": e.workspace, "cursor": str(e.cursor),
                           "event_id": e.event_id, "operation": e.operation, "target": e.target,
                           "from_state": e.from_state, "to_state": e.to_state, "at_ms": e.at_ms, "body": e.body,
                           "prev_digest": e.prev_digest}
                    assert e.prev_digest == prev and event_digest_of(doc) == e.event_digest, e
                    assert e.cursor == last + 1, "cursor gap"
                    prev, last = e.event_digest, e.cursor
                    targets_by_op.setdefault(e.operation, set()).add(e.target)
                    n_events += 1
                assert prev == scope.last_event_digest and last == scope.last_cursor
            chain_prev: dict[str, str] = {}  # each audit chain on its own
            audited: set[tuple[str, str]] = set()
            audit_ids: set[str] = set()
            n_audit = 0
            for row in tx.audit_rows(None, 0, None):
                chain = row.get("chain", "")
                assert row["prev_digest"] == chain_prev.get(chain, GENESIS)
                assert audit_digest_of(row) == row["row_digest"]
                chain_prev[chain] = row["row_digest"]
                audited.add((row["operation"], row["target_digest"]))
                audit_ids.add(row["audit_id"])
                n_audit += 1
            # every acknowledged read: its audit row (spooled before the answer)
            missing = [a for a in ledger.reads if a not in audit_ids]
            assert not missing, ("acknowledged reads without an audit row", missing[:5])
            owners = set(tx.live_key_slots().values())
            for cid, state, env in rows(tx, "SELECT candidate_id, state, sealed_envelope IS NOT NULL FROM candidates"):
                live = state in ("pending", "pending_adjudication")
                assert (f"candidate:{cid}" in owners) == live and bool(env) == live, (cid, state)
            for rid, state, body in rows(tx, "SELECT record_id, state, sealed_body IS NOT NULL FROM records"):
                if state == "tombstoned":
                    assert not body and f"record:{rid}" not in owners and tx.postings_count(rid) == 0
                    assert tx.vector_count(rid) == 0
                else:
                    assert body and f"record:{rid}" in owners and tx.postings_count(rid) > 0, (rid, state)
            assert one(tx, "SELECT count(*) FROM candidates")[0] == len(targets_by_op.get("capture", ()))
            accepted = one(tx, "SELECT count(*) FROM candidates WHERE state = 'accepted'")[0]
            assert one(tx, "SELECT count(*) FROM records")[0] == accepted == len(targets_by_op.get("accept", ()))
            tomb = one(tx, "SELECT count(*) FROM records WHERE state = 'tombstoned'")[0]
            assert tomb == one(tx, "SELECT count(*) FROM tombstones")[0]
            # every acknowledged mutation: its journal event and its audit row
            journal_op = {"capture": "capture", "withdraw": "withdraw", "forget": "tombstone"}
            for kind, args, result in ledger.acked:
                target = target_of(kind, args, result)
                if kind == "admit":
                    op = {"accepted": "accept", "rejected": "reject",
                          "pending_adjudication": "adjudication_required"}[result["outcome"]["status"]]
                    audit_op = TOOL_OF[kind]
                elif kind == "host":
                    op = args["operation"]
                    audit_op = f"admin.{op}"
                else:
                    op, audit_op = journal_op[kind], TOOL_OF[kind]
                assert target in targets_by_op.get(op, set()), ("no journal event", kind, args)
                assert (audit_op, digest("request", {"target": target})) in audited, ("no audit row", kind, args)
            return {"events": n_events, "audit_rows": n_audit, "reads": len(ledger.reads)}


def activate_scope(core: Any, tenant: str = TENANT, workspace: str = WORKSPACE, attempts: int = 20) -> None:
    """Activate a scope, retrying the retriable POLICY_UNAVAILABLE of a cold, loaded machine."""
    from tests.support.core_support import activate

    for attempt in range(attempts):
        try:
            activate(core, tenant, workspace)
            return
        except grpc.RpcError as err:
            if code_from_rpc_error(err) != Code.POLICY_UNAVAILABLE or attempt == attempts - 1:
                raise
            time.sleep(0.2)


DOMAIN_TABLES = ("candidates", "records", "journal", "idempotency", "used_confirmations", "tombstones", "projections",
                 "data_keys", "key_destructions", "scopes")


def domain_state(running: Any) -> dict[str, Any]:
    """Row counts and the state columns of an in-process core: what a side effect would change."""
    with running.core.store.read() as tx:
        out: dict[str, Any] = {t: one(tx, f"SELECT count(*) FROM {t}")[0] for t in DOMAIN_TABLES}
        out["candidate_states"] = sorted(rows(tx, "SELECT candidate_id, state FROM candidates"))
        out["record_states"] = sorted(rows(tx, "SELECT record_id, state FROM records"))
        out["heads"] = sorted(rows(tx, "SELECT tenant, workspace, last_cursor, last_event_digest FROM scopes"))
        return out
