"""The retrieval harnesses' corpora are what their generators make from the fixed seed: the
committed JSON cannot drift from the code that documents how it was made."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "retrieval"


@pytest.mark.parametrize("generator", ["make_conversations", "make_corpus"])
def test_committed_corpus_is_the_generators_output(generator: str, tmp_path: Path, monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location(f"_gen_{generator}", TOOLS / f"{generator}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    committed = module.OUT.read_bytes()
    monkeypatch.setattr(module, "OUT", tmp_path / "out.json")
    module.main()
    assert (tmp_path / "out.json").read_bytes() == committed


def test_conversation_questions_cite_existing_turns() -> None:
    import json

    corpus = json.loads((TOOLS / "conversations.json").read_text())
    turns = {f"{c['id']}:s{s['session']}:t{i + 1}" for c in corpus["conversations"] for s in c["sessions"]
             for i in range(len(s["turns"]))}
    assert len(corpus["questions"]) >= 300
    for q in corpus["questions"]:
        assert q["evidence"] and set(q["evidence"]) <= turns, q
        assert q["workspace"] == q["evidence"][0].split(":")[0]
