"""check_device: reading an audit device file as the chain the core wrote."""

from __future__ import annotations

from engram_core.canonical import canonical_json
from engram_core.store.audit_device import check_device
from engram_core.store.chain import GENESIS, audit_doc
from engram_core.store.port import AuditRow


def _row(head: tuple[int, str], who: str = "user:ana") -> dict:
    return audit_doc(AuditRow(at_ms=1, audit_id="a", tenant="t", workspace="w", principal=who, agent_id="x",
                              operation="op", outcome="ok", target_digest="", decisions=[]), head)


def _chain(n: int, who: str = "user:ana", start: tuple[int, str] = (0, GENESIS)) -> list[dict]:
    rows, head = [], start
    for _ in range(n):
        rows.append(_row(head, who))
        head = (rows[-1]["seq"], rows[-1]["row_digest"])
    return rows


def _lines(*docs: dict) -> list[bytes]:
    return [canonical_json(d if "seqs" in d else {"kind": "audit", **d}) for d in docs]


def test_intact_device_matches() -> None:
    rows = _chain(4)
    assert check_device(rows, _lines(*rows))["ok"]
    # Lines past the rows read (calls made after them) are fine.
    assert check_device(rows[:3], _lines(*rows))["ok"]


def test_an_abort_line_rewinds_the_chain() -> None:
    rows = _chain(3)
    lost = _row((3, rows[2]["row_digest"]), who="never-committed")
    again = _chain(1, start=(3, rows[2]["row_digest"]))
    lines = _lines(*rows, lost, {"kind": "abort", "seqs": [4]}, *again)
    assert check_device(rows + again, lines)["ok"]


def test_truncate_and_continue_forks_and_rename_mismatches() -> None:
    rows = _chain(4)
    cut_then_new = _chain(1, who="user:other", start=(2, rows[1]["row_digest"]))  # seq 3 again
    report = check_device(rows[:2] + cut_then_new, _lines(*rows, *cut_then_new))
    assert {"seq": "3", "problem": "device_fork"} in report["problems"]
    renamed = _chain(4, who="user:someone")
    report = check_device(renamed, _lines(*rows))
    assert {p["problem"] for p in report["problems"]} == {"device_mismatch"}


def test_rows_before_the_device_existed_are_not_required() -> None:
    rows = _chain(5)
    assert check_device(rows, _lines(*rows[2:]))["ok"]
    report = check_device(rows, _lines(*rows[2:3], *rows[4:]))
    assert {"seq": "5", "problem": "device_fork"} in report["problems"]
    assert {"seq": "4", "problem": "device_missing"} in report["problems"]


def test_rows_lost_at_a_restart_are_reported_and_the_chain_goes_on() -> None:
    rows = _chain(4)
    # Rows 3-4 reached the device, then a crash before COMMIT: the store reopened at row 2.
    after = _chain(2, who="user:bob", start=(2, rows[1]["row_digest"]))
    lines = [canonical_json({"kind": "open", "seq": 0, "row_digest": GENESIS}), *_lines(*rows),
             canonical_json({"kind": "open", "seq": 2, "row_digest": rows[1]["row_digest"]}), *_lines(*after)]
    report = check_device(rows[:2] + after, lines)
    assert report["problems"] == [{"seq": "3", "problem": "device_lost_at_restart", "count": 2}]
    # A store reopened at a head that is not on the device was rewritten while stopped.
    renamed = _chain(2, who="user:someone")
    lines = [*_lines(*rows), canonical_json({"kind": "open", "seq": 2, "row_digest": renamed[1]["row_digest"]})]
    assert {"seq": "2", "problem": "device_fork"} in check_device(renamed, lines)["problems"]
