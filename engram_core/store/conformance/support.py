"""What the conformance checks share: the scope they write, small row builders, racing
threads, waiting, and a journal's own check of its hash chain (the same rules
``services/maintenance.check_journal`` applies; the store may not import a service)."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from engram_core.contract.scope import Scope
from engram_core.contract.tools import SEARCH_TOOL
from engram_core.store.chain import GENESIS, event_digest_of
from engram_core.store.port import AuditRow, CandidateRow, Event, LexicalQuery, RecordRow, ScopeRow

T, W = "acme", "alpha"
OTHER = Scope("globex", "beta")
WEIGHTS = {"primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5}


def wait_until(condition: Callable[[], bool], timeout_s: float, *, every_s: float = 0.02) -> bool:
    """Whether ``condition`` became true within ``timeout_s`` (polled)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)


def check_journal(scope: ScopeRow, events: list[Event]) -> list[dict[str, Any]]:
    """Problems in one scope's hash chain: dense cursors, prev links, recomputed digests, head."""
    problems: list[dict[str, Any]] = []
    prev, expected = GENESIS, 1
    for e in events:
        doc = {"tenant": e.tenant, "workspace": e.workspace, "cursor": str(e.cursor), "event_id": e.event_id,
               "operation": e.operation, "target": e.target, "from_state": e.from_state, "to_state": e.to_state,
               "at_ms": e.at_ms, "body": e.body, "prev_digest": e.prev_digest}
        if e.cursor != expected:
            problems.append({"cursor": str(e.cursor), "problem": "cursor_gap"})
        if e.prev_digest != prev:
            problems.append({"cursor": str(e.cursor), "problem": "prev_link"})
        if event_digest_of(doc) != e.event_digest:
            problems.append({"cursor": str(e.cursor), "problem": "event_digest"})
        prev, expected = e.event_digest, e.cursor + 1
    if scope.last_cursor != expected - 1 or scope.last_event_digest != prev:
        problems.append({"cursor": str(scope.last_cursor), "problem": "head"})
    return problems


# -- small builders ---------------------------------------------------------------------------------------
def event(tx: Any, target: str, *, tenant: str = T, workspace: str = W, at_ms: int = 1) -> int:
    return tx.append_event(Scope(tenant, workspace), event_id=f"evt_{target}", operation="capture", target=target,
                           from_state="", to_state="pending", at_ms=at_ms, body={"n": target}).cursor


def audit_row(n: int, *, tenant: str = T, workspace: str = W) -> AuditRow:
    return AuditRow(at_ms=1_800_000_000_000 + n, audit_id=f"aud_conformance_{n:06d}", tenant=tenant,
                    workspace=workspace, principal="user:ana", agent_id="agent", operation=SEARCH_TOOL,
                    outcome="ok", target_digest="", decisions=[])


def candidate(cid: str, *, tenant: str = T, workspace: str = W, cursor: int = 1) -> CandidateRow:
    return CandidateRow(candidate_id=cid, tenant=tenant, workspace=workspace, principal="user:ana", agent_id="agent",
                        session="s1", state="pending", payload_digest="sha256:" + "a" * 64,
                        record_digest="sha256:" + "b" * 64, trust_class="asserted", facts={"n": 1},
                        sealed_envelope=b"\x01sealed", captured_at_ms=1, cursor=cursor)


def record(store: Any, rid: str, *, tenant: str = T, workspace: str = W, payload: str = "c",
           valid_t: int = 1) -> RecordRow:
    slot, _ = store.vault.new_data_key(f"record:{rid}")
    return RecordRow(record_id=rid, tenant=tenant, workspace=workspace, candidate_id="cand_" + rid,
                     record_digest="sha256:" + "d" * 64, payload_digest="sha256:" + payload * 64,
                     state="accepted_current", trust_class="asserted", principal="user:ana", agent_id="agent",
                     valid_t=valid_t, valid_t_end=None, expires_at_ms=None, derivative_rule="make-ineligible",
                     accepted_at_ms=1, accepted_cursor=1, state_cursor=1, successor_id=None, sealed_body=b"\x02body",
                     key_slot=slot)


def admit(store: Any, rid: str, terms: list[int], **kw: Any) -> None:
    """A record with its sealed projection, in one write transaction (as an admission writes it)."""
    row = record(store, rid, **kw)
    with store.write() as tx:
        tx.insert_record(row)
        tx.put_data_key(f"record:{rid}", row.key_slot, 1)
        tx.index_record(Scope(row.tenant, row.workspace), rid, {"primary": Counter(terms)})


def admit_row(store: Any, row: RecordRow, terms: list[int]) -> None:
    with store.write() as tx:
        tx.insert_record(row)
        tx.put_data_key(f"record:{row.record_id}", row.key_slot, 1)
        tx.index_record(Scope(row.tenant, row.workspace), row.record_id, {"primary": Counter(terms)})


def admit_journaled(store: Any, rid: str, terms: list[int], *, event_id: str, at_ms: int = 2) -> None:
    """A record captured, admitted and journaled as the services do it: its capture event, the
    record with its projection, then the admission event naming it (which a catch-up follows)."""
    with store.write() as tx:
        event(tx, rid)
    admit(store, rid, terms)
    with store.write() as tx:
        tx.append_event(Scope(T, W), event_id=event_id, operation="admit", target=rid, from_state="",
                        to_state="accepted_current", at_ms=at_ms, body={"record_id": rid})


def search(store: Any, terms: list[int], *, tenant: str = T, workspace: str = W) -> list[str]:
    with store.read(snapshot=False) as tx:
        stats = tx.lexical_stats(Scope(tenant, workspace), terms)
        page = tx.rank_lexical(Scope(tenant, workspace), LexicalQuery(
            stats, WEIGHTS, k1=1.2, b=0.75, now_ms=10, half_life_ms=1000, lexical_weight=0.85,
            max_accepted_cursor=2**62, best_bm25=None, after=None, limit=50))
    return [r[0] for r in page.rows]


def race(workers: list[Callable[[], None]]) -> list[BaseException]:
    """Run every worker at once (behind a barrier); the exceptions they raised."""
    barrier = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            barrier.wait(30)
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the check
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def each(stores: list[Any], work: Callable[[Any, int], None]) -> list[Callable[[], None]]:
    """One worker per store for ``race``: ``work(store, k)``, ``k`` the store's place in ``stores``."""
    return [functools.partial(work, s, k) for k, s in enumerate(stores)]


def writers(target: Any, store: Any, n: int) -> list[Any]:
    """``n`` stores to write through: ``store`` itself, and more over the same database where the
    engine allows several writers (each a core of its own)."""
    if not target.several_writers:
        return [store] * n
    return [store] + [target.open() for _ in range(n - 1)]
