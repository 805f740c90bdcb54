"""Every core's policy engine is built the way ``engram serve`` builds its own (issue 62): a core
the composition root opens over a bundle directory (tests, tools, ``engram mcp``'s embedded
core) gets ``build_serving_policy``'s engine, with its error behaviour. Real bundles, the real
embedded OPA engine, real DuckDB cores."""

from __future__ import annotations

import logging

from engram_core.app.composition import build_policy, open_core
from engram_core.policy.port import RETENTION
from engram_core.policy.serving import PolicySettings, build_serving_policy
from tests.support.policy_support import copy_bundle

BROKEN = "package engram.retention\n\nimport data.engram.lib\n\ndecision := {\n"
REFUSED = "policy bundle refused: "  # serve's words; the composition root's own builder said "not active"


def test_a_core_opened_over_a_bundle_runs_what_serve_runs(tmp_path):
    bundle = copy_bundle(tmp_path, revision="rev-one-builder")
    served = build_serving_policy(PolicySettings(policies=bundle), tmp_path / "served")
    opened = open_core(tmp_path / "data", policies_dir=bundle, semantic=False)
    try:
        engine = opened.core.policy
        assert type(engine) is type(served.engine)
        assert engine.active() and engine.revision() == served.engine.revision() == "rev-one-builder"
        assert engine.decide(RETENTION, {}).result == served.engine.decide(RETENTION, {}).result
    finally:
        opened.core.close()
        served.engine.close()


def test_a_refused_bundle_leaves_any_core_up_and_not_serving_with_serves_reason(tmp_path, caplog):
    bundle = copy_bundle(tmp_path, revision="rev-broken")
    (bundle / "engram" / "retention" / "retention.rego").write_text(BROKEN)
    with caplog.at_level(logging.ERROR, logger="engram.core"):
        opened = open_core(tmp_path / "data", policies_dir=bundle, semantic=False)
    try:
        assert not opened.core.policy.active()
        refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith(REFUSED)]
        assert len(refusals) == 1 and "retention.rego" in refusals[0], caplog.text
    finally:
        opened.core.close()
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="engram.core"):
        engine = build_policy(tmp_path / "other", bundle, None)
    try:
        assert not engine.active()
        assert [r.getMessage() for r in caplog.records if r.getMessage().startswith(REFUSED)] == refusals
    finally:
        engine.close()
