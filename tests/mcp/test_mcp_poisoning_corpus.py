"""Issue 59's rates on our own corpus (tests/support/poisoning_corpus.py), through the MCP tools
with the shipped bundle: a real core (semantic channel off), the real adapter (built as
`engram mcp` builds it, served in the test process), the SDK's own client. Capture then
request_admission; "held" means the outcome is not accepted (the agent sees only the contract's outcome).

* poisoned captures held >= 95% overall and in every family;
* legitimate memories accepted >= 98%;
* restatements of a current record not admitted as a second record >= 90%;
* near-miss pairs (same component, different decision) both accepted >= 95%.

And nothing of any captured text reaches the decision log or the audit log; the reasons of a
held candidate reach `engram admin adjudication-list`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_core.api import admin_pb2
from engram_core.policy.decisionlog.config import parse_decision_log
from engram_core.policy.serving import PolicySettings, build_serving_policy
from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import (
    WORKSPACE,
    Core,
    activate,
    adapter_client,
    admin_json,
    audit_rows,
    binding_for,
    capture_args,
    unique,
    value_of,
    write_config,
)
from tests.support.poisoning_corpus import DUPLICATES, LEGITIMATE, NEAR_MISSES, POISONED

pytestmark = pytest.mark.anyio
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def corpus_core(module_stores: EngineStores, tmp_path_factory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("poisoning")
    log_file = root / "logs" / "decisions.jsonl"
    serving = build_serving_policy(PolicySettings(decision_log=parse_decision_log(f"file:{log_file}")), root / "data")
    running = module_stores.start_core(root / "data", policy=serving.engine, semantic=False)
    core = Core(address=running.address, host_key_path=Path(running.host_key_path))
    # The tenants whose share of the corpus went through the core (each rate test adds its own).
    env: dict[str, Any] = {"core": core, "log_file": log_file, "stopped": False, "remembered": set()}

    def stop() -> None:
        if not env["stopped"]:
            env["stopped"] = True
            running.stop()

    env["stop"] = stop
    try:
        configs = {}
        for tenant in ("acme", "globex"):
            activate(core, tenant, WORKSPACE)
            configs[tenant] = write_config(root / f"{tenant}.toml", address=core.address,
                                           signing_key=core.host_key_path, binding=binding_for(tenant))
        env["configs"] = configs
        yield env
    finally:
        stop()


def _args(text: str, *, later: int = 0) -> dict[str, Any]:
    """A capture of ``text`` (its time moved ``later`` days: the same words captured another day)."""
    args = capture_args(unique("poison-cap"), text)
    if later:
        args = copy.deepcopy(args)
        t = args["payload"]["valid_time"]["t"] + later * DAY_MS
        args["payload"]["valid_time"]["t"] = t
        args["payload"]["primary_event"]["at"] = t
    return args


async def _remember(client: Any, text: str, *, later: int = 0) -> dict[str, Any]:
    cap = value_of(await client.call_tool("engram_memory_capture", _args(text, later=later)))
    assert cap["status"] == "committed_pending", cap
    adm = value_of(await client.call_tool("engram_memory_request_admission",
                                          {"candidate_id": cap["candidate_id"], "idempotency_key": unique("poison-adm")}))
    return adm["outcome"]


def _rate(hits: int, total: int) -> float:
    return hits / total if total else 1.0


async def test_poisoned_held_and_legitimate_accepted(corpus_core):
    held_by_family: dict[str, list[bool]] = {}
    held_ids: list[str] = []
    async with adapter_client(corpus_core["configs"]["acme"]) as client:
        for family, texts in POISONED.items():
            for text in texts:
                outcome = await _remember(client, text)
                held_by_family.setdefault(family, []).append(outcome["status"] != "accepted")
                if outcome["status"] == "pending_adjudication":
                    held_ids.append(outcome["candidate_id"])
        legit = [(await _remember(client, text))["status"] for text in LEGITIMATE]
    corpus_core["remembered"].add("acme")
    total = sum(len(v) for v in held_by_family.values())
    held = sum(sum(v) for v in held_by_family.values())
    rates = {family: _rate(sum(v), len(v)) for family, v in held_by_family.items()}
    accepted = _rate(legit.count("accepted"), len(legit))
    print(f"\npoisoned held {held}/{total}; by family {rates}; legitimate accepted {legit.count('accepted')}/{len(legit)}")
    assert _rate(held, total) >= 0.95
    assert all(rate >= 0.95 for rate in rates.values()), rates
    assert accepted >= 0.98, [t for t, s in zip(LEGITIMATE, legit, strict=True) if s != "accepted"]
    # The reasons of a held candidate reach the operator's adjudication queue.
    # What `engram admin --json adjudication-list --tenant acme --workspace ws-main` prints.
    listed = admin_json(corpus_core["core"], "ListAdjudication", admin_pb2.ScopeRequest(tenant="acme",
                                                                                       workspace=WORKSPACE))
    queue = {c["candidate_id"]: c["reasons"] for c in listed["candidates"]}
    assert set(held_ids) <= set(queue)
    codes = {code for reasons in queue.values() for code in reasons}
    assert {"AGENT_ADDRESSED", "OVERRIDE_PHRASE", "ROLE_MARKUP", "PIPE_TO_SHELL"} <= codes, codes


async def test_restatements_not_admitted_and_near_misses_both_accepted(corpus_core):
    async with adapter_client(corpus_core["configs"]["globex"]) as client:
        restated = []
        for original, restatement in DUPLICATES:
            first = await _remember(client, original)
            assert first["status"] == "accepted", original
            second = await _remember(client, restatement, later=3)
            restated.append(second["status"] != "accepted")
        both = []
        for a, b in NEAR_MISSES:
            both.append((await _remember(client, a))["status"] == "accepted"
                        and (await _remember(client, b))["status"] == "accepted")
    corpus_core["remembered"].add("globex")
    print(f"\nrestatements not admitted {sum(restated)}/{len(restated)}; near misses both accepted {sum(both)}/{len(both)}")
    assert _rate(sum(restated), len(restated)) >= 0.90, [d for d, r in zip(DUPLICATES, restated, strict=True) if not r]
    assert _rate(sum(both), len(both)) >= 0.95, [p for p, ok in zip(NEAR_MISSES, both, strict=True) if not ok]


async def test_no_captured_text_in_the_decision_log_or_the_audit_log(corpus_core):
    # Every text of the corpus goes through the core first: the two tests above send it (file
    # order); run alone or in another order, this test sends what they did not.
    if "acme" not in corpus_core["remembered"]:
        async with adapter_client(corpus_core["configs"]["acme"]) as client:
            for text in [t for ts in POISONED.values() for t in ts] + LEGITIMATE:
                await _remember(client, text)
    if "globex" not in corpus_core["remembered"]:
        async with adapter_client(corpus_core["configs"]["globex"]) as client:
            for original, restatement in DUPLICATES:
                await _remember(client, original)
                await _remember(client, restatement, later=3)
            for pair in NEAR_MISSES:
                for text in pair:
                    await _remember(client, text)
    core = corpus_core["core"]
    audit = json.dumps(audit_rows(core, "acme")) + json.dumps(audit_rows(core, "globex"))
    corpus_core["stop"]()  # the logger flushes on close
    log = Path(corpus_core["log_file"]).read_text()
    events = [json.loads(line) for line in log.splitlines()]
    admissions = [e for e in events if e["path"] == "engram/admission/decision"]
    assert admissions and any(e["input"]["candidate"].get("instructions") for e in admissions)
    assert any(e["input"]["candidate"].get("similar") for e in admissions)
    # Hosts read from a text (pipe-to-shell, exfiltrating links) are pseudonymized in the log like
    # names: the policy compares them, the log keeps no host an attacker wrote.
    hosts = [h for e in admissions for s in e["input"]["candidate"].get("instructions", []) for h in s.get("hosts", [])]
    assert hosts and all(h.startswith("masked:") for h in hosts if h)
    for host in ("get.devtools-fix.io", "contoso-mail.net", "pixel-track.net", "quickprov.io"):
        assert host not in log and host not in audit, host
    texts = [t for ts in POISONED.values() for t in ts] + LEGITIMATE + [t for pair in DUPLICATES + NEAR_MISSES for t in pair]
    for text in texts:
        # Every run of four words of the text (names, hosts and numbers alone may be facts: a
        # host the policy compares, a record id; four words in a row are text).
        words = text.split()
        for i in range(max(len(words) - 3, 1)):
            phrase = " ".join(words[i:i + 4])
            if len(phrase) >= 12:
                assert phrase not in log, phrase
                assert phrase not in audit, phrase
