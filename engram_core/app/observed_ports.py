"""Wrappers that observe the ports operators watch: the policy engine (decision latency and
outcomes, bundle loads), the embedding model (embed latency) and the store (commit latency,
index rebuilds). Each forwards everything else to the wrapped object unchanged.

They live in the composition root, not in ``observability``: they wrap the ports, so they sit
above them, while ``observability`` (logs, metrics, spans) sits below everything that logs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engram_core.contract.errors import EngramError
from engram_core.observability import calls, tracing
from engram_core.observability.calls import DecisionFact
from engram_core.observability.logs import log_event
from engram_core.observability.metrics import CoreMetrics
from engram_core.policy.port import BundleRefused, Decision
from engram_core.policy.wrapper import PolicyEngineWrapper

_MAX_OUTCOME = 32  # label values come from policy answers: keep them short
REFUSED = "REFUSED"  # a reload that read a bundle and would not activate it (logs and metrics)


def family_of(path: str) -> str:
    """``engram/authz/decision`` -> ``authz``; ``engram/authz/tools`` -> ``authz.tools``."""
    parts = path.strip("/").split("/")
    if parts and parts[0] == "engram":
        parts = parts[1:]
    if parts and parts[-1] == "decision":
        parts = parts[:-1]
    return ".".join(parts) or path


def outcome_of(d: Decision) -> str:
    result = d.result
    if "allow" in result:
        return "allow" if result["allow"] else "deny"
    value = result.get("decision", result.get("action", "answered"))
    return str(value)[:_MAX_OUTCOME] if isinstance(value, str | bool | int) else "answered"


def _fact(d: Decision, seconds: float) -> DecisionFact:
    reasons = tuple(sorted({str(r.get("code", ""))[:64] for r in d.result.get("reasons", []) if isinstance(r, dict)}))
    return DecisionFact(family_of(d.path), d.revision, outcome_of(d), reasons, seconds)


class ObservedPolicyEngine(PolicyEngineWrapper):
    """A PolicyEngine that reports each evaluation; the answers are the wrapped engine's."""

    def __init__(self, inner: Any, metrics: CoreMetrics | None) -> None:
        super().__init__(inner)
        self._metrics = metrics
        if metrics is not None and inner.active():
            metrics.observe_bundle_load(revision=inner.revision())

    def _observe(self, paths: Sequence[str], started: float, decisions: list[Decision] | None) -> None:
        seconds = time.perf_counter() - started
        families = "+".join(family_of(p) for p in paths)
        revision = decisions[0].revision if decisions else self._inner.revision()
        if self._metrics is not None:
            self._metrics.observe_evaluation(families, revision, seconds)
        if decisions is None:  # failed closed: POLICY_UNAVAILABLE
            facts = [DecisionFact(family_of(p), revision, "unavailable", (), seconds) for p in paths]
        else:
            facts = [_fact(d, seconds) for d in decisions]
        for fact in facts:
            calls.note_decision(fact)
            if self._metrics is not None:
                self._metrics.observe_decision(fact)
        tracing.set_attributes(**{"engram.policy.family": families, "engram.policy.revision": revision,
                                  "engram.policy.outcome": ",".join(f.outcome for f in facts)})

    def _around(self, requests: Sequence[tuple[str, Mapping[str, Any]]],
                evaluate: Callable[[], list[Decision]]) -> list[Decision]:
        paths = [p for p, _ in requests]
        with tracing.span("engram.policy.decide"):
            started = time.perf_counter()
            try:
                ds = evaluate()
            except EngramError:
                self._observe(paths, started, None)
                raise
            self._observe(paths, started, ds)
            return ds

    def reload(self) -> str:
        previous = self._inner.revision()
        try:
            revision = self._inner.reload()
        except BundleRefused as exc:  # read and refused: a distinct outcome, the previous revision answers
            if self._metrics is not None:
                self._metrics.observe_bundle_load(revision="", code=REFUSED)
            where = {"file": exc.problem.get("file") or "-"}
            if exc.problem.get("line"):
                where["line"] = exc.problem["line"]
            log_event("policy_reload", logging.ERROR, outcome=REFUSED, **where, error=exc.problem.get("error", ""),
                      active_revision=exc.active_revision or "none")
            raise
        except EngramError as exc:
            if self._metrics is not None:
                self._metrics.observe_bundle_load(revision="", code=exc.code.value)
            log_event("policy_reload", logging.ERROR, outcome=exc.code.value, active_revision=previous)
            raise
        if self._metrics is not None:
            self._metrics.observe_bundle_load(revision=revision)
        log_event("policy_reload", outcome="OK", revision=revision, previous_revision=previous)
        return revision


class ObservedEmbedder:
    """An Embedder that reports its latency (``kind``: one text or a batch)."""

    def __init__(self, inner: Any, metrics: CoreMetrics | None) -> None:
        self._inner = inner
        self._metrics = metrics
        self.model_id = inner.model_id
        self.dimensions = inner.dimensions
        self.needs_network = inner.needs_network

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def embed(self, text: str) -> list[float]:
        with tracing.span("engram.semantic.embed", **{"engram.embed.texts": 1}):
            started = time.perf_counter()
            vector = self._inner.embed(text)
        if self._metrics is not None:
            self._metrics.observe_embed("one", time.perf_counter() - started)
        return vector

    def embed_batch(self, texts: list[str]) -> list[list[float]]:
        with tracing.span("engram.semantic.embed", **{"engram.embed.texts": len(texts)}):
            started = time.perf_counter()
            vectors = self._inner.embed_batch(texts)
        if self._metrics is not None:
            self._metrics.observe_embed("batch", time.perf_counter() - started)
        return vectors


def observe_store(store: Any, metrics: CoreMetrics | None) -> None:
    """Report the store's commits, scope locks, index builds and scope loads: through the
    observers the store was built with (``store/engine.py`` ``StoreObservers``, which its engine
    reports to as well), never by setting attributes of the store or its engine."""

    def rebuilt(seconds: float, documents: int) -> None:
        if metrics is not None:
            metrics.observe_index_rebuild(seconds, documents)
        log_event("search_index_built", documents=documents, seconds=round(seconds, 3))

    def loaded(seconds: float, records: int) -> None:
        if metrics is not None:
            metrics.scope_load_seconds.observe(seconds)

    observers = store.observers
    if metrics is not None:
        observers.observe(on_commit=metrics.observe_commit, on_scope_lock=metrics.observe_scope_lock)
    observers.observe(on_index_rebuild=rebuilt, on_scope_load=loaded)


def observe_core(core: Any, memory: Any, metrics: CoreMetrics | None) -> None:
    """Fit the core's ports with their observers (and the scrape-time levels, when metrics are on)."""
    core.policy = ObservedPolicyEngine(core.policy, metrics)
    if core.embedder is not None:
        core.embedder = ObservedEmbedder(core.embedder, metrics)
    observe_store(core.store, metrics)
    if metrics is not None:
        metrics.watch(core, memory.reading.pins)
