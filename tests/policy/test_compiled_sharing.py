"""Engines compiled from one bundle's content are shared by every activation of that content in
a process (``policy/compiled.py``), and only by those: a different content, even one changed in a
data file, gets engines of its own, and each activation answers from its own revision."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import engram_core.policy.embedded as embedded
from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.port import AUTHZ

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def _bundle(tmp_path: Path, name: str, *, revision: str) -> Path:
    target = tmp_path / name
    shutil.copytree(POLICIES, target)
    manifest = json.loads((target / ".manifest").read_text())
    (target / ".manifest").write_text(json.dumps({**manifest, "revision": revision}))
    return target


def _counting_builds(monkeypatch) -> list[int]:
    """The number of engines compiled, counted where embedded.py builds them (the real build)."""
    built: list[int] = []
    real = embedded.build_engine

    def build(bundle, **kwargs):
        built.append(1)
        return real(bundle, **kwargs)

    monkeypatch.setattr(embedded, "build_engine", build)
    return built


def _loaded(path: Path) -> EmbeddedPolicyEngine:
    engine = EmbeddedPolicyEngine(path)
    engine.reload()
    return engine


def test_two_activations_of_one_content_compile_once_and_keep_their_own_revisions(tmp_path, monkeypatch):
    built = _counting_builds(monkeypatch)
    # A content this process has not compiled: a module no other test's bundle has.
    first = _bundle(tmp_path, "a", revision="rev-a")
    (first / "engram" / "zz_sharing_probe.rego").write_text("package engram.zz_sharing_probe\n\nx := 1\n")
    second = _bundle(tmp_path, "b", revision="rev-b")
    shutil.copy(first / "engram" / "zz_sharing_probe.rego", second / "engram" / "zz_sharing_probe.rego")
    one, two = _loaded(first), _loaded(second)
    try:
        assert len(built) == embedded.ENGINES  # the second activation compiled nothing
        d1, d2 = one.decide(AUTHZ, {}), two.decide(AUTHZ, {})
        assert (d1.revision, d2.revision) == ("rev-a", "rev-b")
        assert d1.result == d2.result
    finally:
        one.close()
    # Closed, the other activation still answers; and the last content is kept for the next.
    assert two.decide(AUTHZ, {}).revision == "rev-b"
    two.close()
    three = _loaded(first)
    try:
        assert len(built) == embedded.ENGINES
        assert three.decide(AUTHZ, {}).revision == "rev-a"
    finally:
        three.close()


def test_a_changed_data_file_is_another_content_with_engines_of_its_own(tmp_path, monkeypatch):
    built = _counting_builds(monkeypatch)
    plain = _bundle(tmp_path, "plain", revision="r1")
    changed = _bundle(tmp_path, "changed", revision="r1")
    (changed / "engram" / "zz_probe").mkdir()
    (changed / "engram" / "zz_probe" / "data.json").write_text(json.dumps({"marker": 1}))
    a = _loaded(plain)
    before = len(built)
    b = _loaded(changed)
    try:
        assert len(built) == before + embedded.ENGINES
    finally:
        a.close()
        b.close()


def test_activations_racing_on_one_content_all_answer(tmp_path):
    path = _bundle(tmp_path, "race", revision="race")
    engines: list[EmbeddedPolicyEngine] = []
    errors: list[BaseException] = []

    def activate() -> None:
        try:
            engines.append(_loaded(path))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=activate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors and len(engines) == 4
        assert {e.decide(AUTHZ, {}).revision for e in engines} == {"race"}
    finally:
        for e in engines:
            e.close()


def test_a_released_content_is_kept_only_while_last_or_within_keep_unheld(tmp_path, monkeypatch):
    """A server keeps only what it serves (``keep_unheld`` 0: a content released and then
    replaced by another is compiled again); the test suite keeps a few (tests/conftest.py)."""
    built = _counting_builds(monkeypatch)
    a = _bundle(tmp_path, "a", revision="a")
    (a / "engram" / "zz_keep_a.rego").write_text("package engram.zz_keep_a\n\nx := 1\n")
    b = _bundle(tmp_path, "b", revision="b")
    (b / "engram" / "zz_keep_b.rego").write_text("package engram.zz_keep_b\n\nx := 1\n")
    for keep, compiled_again in ((0, True), (1, False)):
        monkeypatch.setattr(embedded.REGISTRY, "keep_unheld", keep)
        _loaded(a).close()
        _loaded(b).close()
        before = len(built)
        _loaded(a).close()
        assert (len(built) > before) is compiled_again, keep
