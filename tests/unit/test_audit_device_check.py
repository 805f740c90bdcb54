"""check_device: reading an audit device file as the chains the core wrote. Most cases use one
chain (the legacy one: the line format of devices written before the audit log had several
chains still reads); the last ones interleave several."""

from __future__ import annotations

from engram_core.contract.canonical import canonical_json
from engram_core.store.audit_device import check_device, check_devices
from engram_core.store.chain import GENESIS, LEGACY_CHAIN, audit_doc, scope_chain
from engram_core.store.port import AuditRow


def _row(head: tuple[int, str], who: str = "user:ana", chain: str = LEGACY_CHAIN) -> dict:
    return audit_doc(AuditRow(at_ms=1, audit_id="a", tenant="t", workspace="w", principal=who, agent_id="x",
                              operation="op", outcome="ok", target_digest="", decisions=[]), chain, head)


def _chain(n: int, who: str = "user:ana", start: tuple[int, str] = (0, GENESIS), chain: str = LEGACY_CHAIN) -> list[dict]:
    rows, head = [], start
    for _ in range(n):
        rows.append(_row(head, who, chain))
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


def test_interleaved_chains_are_each_read_as_their_own() -> None:
    a, b = scope_chain("t", "w"), "writer:0123456789abcdef01234567"
    ra, rb = _chain(3, chain=a), _chain(3, chain=b)
    lines = [canonical_json({"kind": "open", "heads": {}}), *_lines(ra[0], rb[0], rb[1], ra[1], ra[2], rb[2])]
    assert check_device(ra + rb, lines)["ok"]
    # One chain cut back and continued is a fork of that chain only.
    again = _chain(1, who="user:other", chain=a, start=(1, ra[0]["row_digest"]))
    report = check_device(ra[:1] + again + rb, [*lines, *_lines(*again)])
    assert report["problems"] == [{"chain": a, "seq": "2", "problem": "device_fork"}]
    # A store reopened with a chain's head missing from the device lost that chain's rows.
    reopened = canonical_json({"kind": "open", "heads": {a: [1, ra[0]["row_digest"]], b: [3, rb[2]["row_digest"]]}})
    report = check_device(ra[:1] + rb, [*lines, reopened])
    assert report["problems"] == [{"chain": a, "seq": "2", "problem": "device_lost_at_restart", "count": 2}]
    # An abort names its chain.
    lost = _row((3, rb[2]["row_digest"]), who="never-committed", chain=b)
    report = check_device(ra + rb, [*lines, *_lines(lost), canonical_json({"kind": "abort", "chain": b, "seqs": [4]})])
    assert report["ok"]


def test_the_devices_of_several_cores_are_read_as_one() -> None:
    """Two cores share a scope's chain: each device holds the rows its core wrote, with the other
    core's between them. Merged, they must link and hold every row."""
    shared, wa, wb = scope_chain("t", "w"), "writer:" + "a" * 24, "writer:" + "b" * 24
    rs, ra, rb = _chain(5, chain=shared), _chain(2, chain=wa), _chain(2, chain=wb)
    opened = canonical_json({"kind": "open", "heads": {}})
    dev_a = [opened, *_lines(rs[0], ra[0], rs[2], rs[3], ra[1])]
    dev_b = [opened, *_lines(rs[1], rb[0], rs[4], rb[1])]
    rows = rs + ra + rb
    assert check_devices(rows, [dev_a, dev_b])["ok"]
    # Alone, one core's device is short of the other's rows (and sees their gaps as forks).
    alone = check_device(rows, dev_a)
    assert {"chain": shared, "seq": "2", "problem": "device_missing"} in alone["problems"]
    # A row neither device holds is missing.
    report = check_devices(rows, [dev_a[:-1], dev_b])
    assert report["problems"] == [{"chain": wa, "seq": "2", "problem": "device_missing"}]
    # A position two devices hold with different rows is a fork; so is a row that does not link.
    other = _row((1, rs[0]["row_digest"]), who="user:mallory", chain=shared)
    report = check_devices(rows, [[*dev_a, *_lines(other)], dev_b])
    assert {"chain": shared, "seq": "2", "problem": "device_fork"} in report["problems"]
    unlinked = _row((2, "sha256:" + "1" * 64), who="user:mallory", chain=shared)
    report = check_devices(rs[:2] + [unlinked], [[opened, *_lines(rs[0], unlinked)], [opened, *_lines(rs[1])]])
    assert {"chain": shared, "seq": "3", "problem": "device_fork"} in report["problems"]
