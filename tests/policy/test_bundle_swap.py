"""Swapping a directory bundle for SIGHUP (issue 60 item 13), as docs/policies.md says to: each
revision in a directory of its own, the served path a symlink renamed over in one step. A reload
reads the directory the link names when it starts, so it sees one revision whole; and the swap
really changes what the engine serves. Real parts: the bundled policies on OPA's engine."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from engram_core.policy import default_bundle_dir
from engram_core.policy.bundle import read_bundle
from engram_core.policy.embedded import EmbeddedPolicyEngine


def _revision(directory: Path, revision: str) -> Path:
    shutil.copytree(default_bundle_dir(), directory)
    manifest = json.loads((directory / ".manifest").read_text())
    (directory / ".manifest").write_text(json.dumps({**manifest, "revision": revision}))
    return directory


def _swap(link: Path, target: Path) -> None:
    """`ln -sfn TARGET LINK.next && mv -T LINK.next LINK`: a rename, atomic on one file system."""
    staged = link.with_name(link.name + ".next")
    staged.unlink(missing_ok=True)
    staged.symlink_to(target.name)
    os.replace(staged, link)


def test_a_symlink_swapped_to_a_new_revision_is_served_whole_at_the_next_reload(tmp_path: Path) -> None:
    one, two = _revision(tmp_path / "policies-r1", "swap-r1"), _revision(tmp_path / "policies-r2", "swap-r2")
    served = tmp_path / "policies"
    _swap(served, one)
    engine = EmbeddedPolicyEngine(served)
    engine.reload()
    assert engine.decide("engram/authz/decision", {}).revision == "swap-r1"
    _swap(served, two)
    engine.reload()
    assert engine.decide("engram/authz/decision", {}).revision == "swap-r2"


def test_a_read_through_the_link_sees_the_directory_it_named_when_it_began(tmp_path: Path, monkeypatch) -> None:
    """The swap lands in the middle of a read (after its first file): every file still comes from
    the revision the link named when the read began."""
    one, two = _revision(tmp_path / "policies-r1", "swap-r1"), _revision(tmp_path / "policies-r2", "swap-r2")
    data = json.loads((two / "data.json").read_text())
    (two / "data.json").write_text(json.dumps({**data, "swapped": True}))
    served = tmp_path / "policies"
    _swap(served, one)
    read_bytes = Path.read_bytes
    reads: list[Path] = []

    def swap_after_the_first_read(path: Path) -> bytes:
        blob = read_bytes(path)
        reads.append(path)
        if len(reads) == 1:
            _swap(served, two)  # the operator's rename, mid-read
        return blob

    monkeypatch.setattr(Path, "read_bytes", swap_after_the_first_read)
    bundle = read_bundle(served)
    monkeypatch.undo()
    assert len(reads) > 2 and os.readlink(served) == two.name
    assert bundle.revision == "swap-r1"
    assert bundle.files["data.json"] == (one / "data.json").read_bytes()
