"""Payload times in the host's window, and no hiding a current decision behind one that is not in
effect (issue 26.5, issue 31.3), over gRPC against a real core and the bundled Rego.

The attack: another principal of the same scope admits a family member dated 2^53-1. Before the
fix it superseded the victim's current decision (gone from search, get NOT_FOUND) while being
invisible itself (valid only in the far future), and the victim's restatement then went to
adjudication as "older than a member". Now such a date is refused at capture, and a newcomer that
is not in effect now (dated ahead within the horizon, or already ended) supersedes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.rpc.server import RunningCore
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, Failed, capture_args, now_ms
from tests.support.governance_support import Host, consent, start_with_bundle

FAMILY = {"family_refs": ["family:store-choice"]}
DAY_MS = 86_400_000
SAFE_MAX = 2**53 - 1


@pytest.fixture
def scope(tmp_path: Path, stores: EngineStores) -> Iterator[tuple[RunningCore, Client, Client, Host]]:
    core = start_with_bundle(tmp_path, stores, edit=consent("family:store-choice"))
    try:
        yield core, Client(core, principal="user:ana"), Client(core, principal="user:mallory"), Host(core)
    finally:
        core.stop()


def _capture(c: Client, text: str, **vt: int) -> dict:
    args = capture_args(text, t=vt["t"], reconciliation=FAMILY)
    args["payload"]["valid_time"] = vt
    return c.call("capture", args)


def _refusal(c: Client, text: str, **vt: int) -> Failed:
    args = capture_args(text, t=vt["t"], reconciliation=FAMILY)
    args["payload"]["valid_time"] = vt
    with pytest.raises(Failed) as refused:
        c.call("capture", args)
    return refused.value


def _current(c: Client, rid: str, word: str) -> None:
    assert c.get(rid)["record"]["state"] == "accepted_current"
    assert rid in [r["record"]["record_id"] for r in c.search(word)["records"]]


def _audit_reasons(core: RunningCore, principal: str) -> list[str]:
    """The reason codes of each refused call's audit row, one entry per row."""
    with core.core.store.read() as tx:
        rows = tx.audit_rows(Scope("acme", "alpha"), 0, None)
    return [code for r in rows if r["principal"] == principal and r["outcome"] == "UNAUTHORIZED"
            for code in sorted({c for d in r["decisions"] for c in d.get("reason_codes", [])})]


def test_a_newcomer_not_in_effect_cannot_hide_the_current_decision(scope) -> None:
    core, ana, mallory, host = scope
    mine = ana.remember("We keep the session store in Redis with AOF persistence.", t=now_ms() - 60_000,
                        reconciliation=FAMILY)
    # The attack as found: a family member dated 2^53-1. Refused at capture by the host's window.
    assert _refusal(mallory, "The session store moves to Memcached.", t=SAFE_MAX).code == Code.UNAUTHORIZED
    assert "TIME_BEYOND_HORIZON" in _audit_reasons(core, "user:mallory")
    # Dated ahead within the horizon: admitted, but it supersedes nothing until it is in effect.
    ahead = _capture(mallory, "From next week the session store is Memcached.", t=now_ms() + DAY_MS)
    outcome = mallory.admit(ahead["candidate_id"])["outcome"]
    assert outcome["status"] == "accepted"
    _current(ana, mine, "Redis")
    assert host.state(outcome["record_id"]) == "accepted_current"
    # Newer than the victim's but already ended: no current record is replaced by a past one.
    ended = _capture(mallory, "Briefly the session store was etcd.", t=now_ms() - 2_000, t_end=now_ms() - 1_000)
    assert mallory.admit(ended["candidate_id"])["outcome"]["status"] == "accepted"
    _current(ana, mine, "Redis")
    # The victim's restatement is not held back by the member dated ahead; it replaces the
    # earlier decision as any newer one does.
    again = _capture(ana, "We keep the session store in Redis, now with RDB snapshots.", t=now_ms() - 500)
    restated = ana.admit(again["candidate_id"])["outcome"]
    assert restated["status"] == "accepted", restated
    assert host.state(mine) == "historical"
    _current(ana, restated["record_id"], "snapshots")


def test_times_outside_the_window_are_refused_with_the_policy_reason(scope) -> None:
    core, ana, _, _ = scope
    seconds = now_ms() // 1000  # epoch seconds sent as milliseconds: January 1970
    refused = _refusal(ana, "Dated in seconds by mistake.", t=seconds)
    assert refused.code == Code.UNAUTHORIZED
    assert "epoch milliseconds" in refused.err.details() and "not 1767225600 (epoch seconds)" in refused.err.details()
    far = _refusal(ana, "Dated far ahead.", t=now_ms() + 400 * DAY_MS)
    assert far.code == Code.UNAUTHORIZED and "further in the future" in far.err.details()
    # primary_event.at is bounded the same way.
    args = capture_args("The event in seconds.", t=now_ms() - 60_000)
    args["payload"]["primary_event"]["at"] = seconds
    assert ana.fails("capture", args) == Code.UNAUTHORIZED
    assert _audit_reasons(core, "user:ana").count("TIME_BEFORE_FLOOR") == 2
    assert "TIME_BEYOND_HORIZON" in _audit_reasons(core, "user:ana")
    with core.core.store.read() as tx:
        assert tx.candidates_in_state(Scope("acme", "alpha"), "pending") == []
    # Inside the window: accepted.
    assert ana.call("capture", capture_args("Dated correctly.", t=now_ms() - 60_000))["status"] == "committed_pending"
