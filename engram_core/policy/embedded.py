"""The embedded backend: Rego evaluated in-process over a bundle (SPEC §9).

Uses the OPA Go library through ``opa_bindings``. The active bundle (its engines
and revision together) is one object swapped under a lock on reload, so a
decision is always made wholly under one revision. An OPA engine serializes its
evaluations, and it evaluates without Python's interpreter lock; so a bundle
keeps a few engines, each decision taking one that is free (a search's decision
does not queue behind the writers', and two run on two cores). A call cannot
be interrupted, so ``timeout_s`` is checked after the fact and a late answer is
discarded (fail closed). It bounds the evaluation, from the moment an engine is
free, not the wait for one: a busy core queues its decisions (sixteen concurrent
captures on a loaded 2-core machine waited over a second), and that wait is the
call's deadline's business, not a sign of a runaway policy; it is bounded by
``compiled.LEASE_WAIT_S``.

Bundles come from a source (``sources.py``: a directory or archive on disk, or a bundle
server) and, with a verifier, must carry a valid signature (and, with a guard, be signed no
earlier than the bundle accepted last: ``ordering.py``). A bundle that cannot be read,
verified or compiled is refused (``BundleRefused``, naming the file and line) and the previous
revision keeps answering.

With ``log_mask`` each decision carries the decision-log mask's operations: the bundle's
``path_mask(path)``, asked once per path and revision and kept with the active bundle, and its
``mask(event)`` if it defines one, evaluated in the decision's own engine call (handing the
input to the engine is most of a decision's cost; a second call would pay it again).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import re2
from opa_bindings.engine import OpaEngine, OpaError

from engram_core.contract.canonical import digest
from engram_core.contract.errors import Code, EngramError
from engram_core.policy.bundle import MANIFEST, Bundle, BundleError, build_engine
from engram_core.policy.compiled import REGISTRY, CompiledBundle
from engram_core.policy.ordering import RollbackGuard, Ticket
from engram_core.policy.port import DECISION_PATHS, LOG_MASK, LOG_PATH_MASK, BundleRefused, Decision
from engram_core.policy.shapes import shape_error
from engram_core.policy.signing import BundleVerifier
from engram_core.policy.sources import BundleSource, DiskSource, SourceUnavailable

ENGINES = max(2, min(4, os.cpu_count() or 1))  # engines per bundle; more would only wait for a core
_PATH = re2.compile(r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$")
_MASK_REF = "data." + LOG_MASK.replace("/", ".")
_PATH_MASK_QUERY = f"x := [m | m := data.{LOG_PATH_MASK.replace('/', '.')}(input.path)]"


class _Active:
    """One bundle revision and the engines compiled from its content (``compiled.py``: shared
    with any other activation of the same content in this process)."""

    def __init__(self, compiled: CompiledBundle, revision: str, *, has_mask: bool = False,
                 path_masks: dict[str, Any] | None = None) -> None:
        self.revision = revision
        self.compiled = compiled
        self.has_mask = has_mask  # the bundle defines mask(event), asked with each decision
        # path_mask(path)'s answer per decision path (None: the bundle defines none), kept for
        # the bundle's life: the same list object every time, so the logger parses it once.
        self.path_masks = path_masks
        self.lease = compiled.lease

    def path_mask(self, path: str) -> Any:
        if self.path_masks is None:
            return None
        if path not in self.path_masks:  # a path the core did not name at reload: asked once
            with self.lease() as engine:
                self.path_masks[path] = _path_mask(engine, path)
        return self.path_masks[path]

    def close(self) -> None:
        REGISTRY.release(self.compiled)


def _unavailable(detail: str) -> EngramError:
    return EngramError(Code.POLICY_UNAVAILABLE, detail)


def _input_digest(input: Mapping[str, Any]) -> str:
    try:
        return digest("policy-input", input)
    except (TypeError, ValueError) as exc:
        raise _unavailable(f"policy input is not canonical JSON: {exc}") from exc


def _check_time(what: str, started: float, timeout_s: float | None) -> None:
    if timeout_s is not None and time.monotonic() - started > timeout_s:
        raise _unavailable(f"{what}: decision took longer than {timeout_s}s")


def _dotted(path: str) -> str:
    path = path.strip("/")
    if not _PATH.match(path):  # paths are the core's constants; anything else never reaches a query
        raise _unavailable(f"not a decision path: {path!r}")
    return path.replace("/", ".")


def _decision(path: str, result: Any, active: _Active, input_digest: str, log_mask: Any = None) -> Decision:
    problem = shape_error(path, result)
    if problem is not None:
        raise _unavailable(f"{path}: {problem}")
    return Decision(path=path, result=result, decision_id=f"embedded-{uuid.uuid4()}", revision=active.revision,
                    input_digest=input_digest, log_mask=log_mask)


def _combined(path_ops: Any, event_ops: Any) -> Any:
    """The operations of both masks; a failure of either is the event's failure."""
    for ops in (path_ops, event_ops):
        if isinstance(ops, dict) and "error" in ops:
            return ops
    if event_ops is None:
        return path_ops
    if path_ops is None:
        return event_ops
    if not isinstance(path_ops, list) or not isinstance(event_ops, list):
        return {"error": "a mask answered something other than a set of operations"}
    return [*path_ops, *event_ops]


def _path_mask(engine: OpaEngine, path: str) -> Any:
    try:
        rows = engine.eval_query(_PATH_MASK_QUERY, {"path": path.strip("/")})
    except OpaError as exc:
        return {"error": str(exc)}
    answers = rows[0].get("x") if rows else None
    return answers[0] if answers else {"error": f"{LOG_PATH_MASK} is undefined for {path}"}


def _mask_clause(i: int | str, path: str, input_ref: str) -> str:
    # A list of zero or one answer: a mask undefined for this event never makes the decision undefined.
    return (f'm{i} := [x | x := {_MASK_REF}({{"path": "{path.strip("/")}", "input": {input_ref}, '
            f'"result": d{i}}})]')


def _mask_of(binding: Mapping[str, Any], i: int | str) -> Any:
    answers = binding.get(f"m{i}")
    return answers[0] if isinstance(answers, list) and answers else None


class EmbeddedPolicyEngine:
    """PolicyEngine over a bundle, evaluated in this process.

    ``bundle_dir``: a bundle directory or archive (or give ``source``); ``verifier``: refuse
    bundles whose signature does not verify; ``log_mask``: evaluate the decision-log mask with
    every decision (``Decision.log_mask``).

    Not guaranteed: bounding a runaway evaluation (OPA cannot be interrupted
    from here; the answer is only discarded once late).
    """

    def __init__(self, bundle_dir: Path | None = None, *, expected_revision: str | None = None,
                 source: BundleSource | None = None, verifier: BundleVerifier | None = None,
                 log_mask: bool = False, guard: RollbackGuard | None = None) -> None:
        if guard is not None and verifier is None:
            raise ValueError("ordering bundles needs their signatures verified (a verifier)")
        if source is None:
            if bundle_dir is None:
                raise ValueError("a bundle directory or a source is needed")
            source = DiskSource(Path(bundle_dir))
        self._bundle_dir = Path(bundle_dir) if bundle_dir is not None else None
        self._source = source
        self._verifier = verifier
        self._guard = guard
        self._expected_revision = expected_revision
        self._log_mask = log_mask
        self._lock = threading.Lock()
        self._active: _Active | None = None
        self._closed = False

    @property
    def source(self) -> BundleSource:
        return self._source

    def decide(self, path: str, input: Mapping[str, Any], *, timeout_s: float | None = None) -> Decision:
        active = self._active_bundle()  # one reference for the whole decision: one bundle, one revision
        input_digest = _input_digest(input)
        dotted = _dotted(path)
        if self._log_mask and active.has_mask:
            return self._decide_masked(path, dotted, input, active, input_digest, timeout_s)
        try:
            with active.lease() as engine:
                started = time.monotonic()
                result = engine.eval_document(dotted, dict(input))
        except OpaError as exc:  # includes OpaUndefinedError
            raise _unavailable(f"{path}: {exc}") from exc
        _check_time(path, started, timeout_s)
        return _decision(path, result, active, input_digest, active.path_mask(path) if self._log_mask else None)

    def _decide_masked(self, path: str, dotted: str, input: Mapping[str, Any], active: _Active,
                       input_digest: str, timeout_s: float | None) -> Decision:
        query = f"d0 := data.{dotted}; event_input := input; " + _mask_clause(0, path, "event_input")
        try:
            with active.lease() as engine:
                started = time.monotonic()
                bindings = engine.eval_query(query, dict(input))
        except OpaError as exc:
            # The mask may be what failed: the decision alone decides whether this is an answer.
            try:
                with active.lease() as engine:
                    started = time.monotonic()
                    result = engine.eval_document(dotted, dict(input))
            except OpaError as again:
                raise _unavailable(f"{path}: {again}") from again
            _check_time(path, started, timeout_s)
            return _decision(path, result, active, input_digest, {"error": str(exc)})
        if len(bindings) != 1:
            raise _unavailable(f"{path}: undefined decision")
        _check_time(path, started, timeout_s)
        return _decision(path, bindings[0].get("d0"), active, input_digest,
                         _combined(active.path_mask(path), _mask_of(bindings[0], 0)))

    def decide_all(self, requests: Sequence[tuple[str, Mapping[str, Any]]], *,
                   timeout_s: float | None = None) -> list[Decision]:
        """One engine call for all: ``d0 := data.<path0> with input as input[0]; ...``. Each
        engine call costs a fixed ~0.1 ms and, inside a busy server, its caches are cold: a
        search asks for authorization and redaction together (~1 ms less per search)."""
        if len(requests) == 1:
            return [self.decide(*requests[0], timeout_s=timeout_s)]
        active = self._active_bundle()
        digests = [_input_digest(input) for _, input in requests]
        masked = self._log_mask and active.has_mask  # mask(event) asked in this same call
        # The query text depends only on the paths, a fixed set: the engine's prepared-query
        # cache stays bounded.
        clauses = []
        for i, (path, _) in enumerate(requests):
            clauses.append(f"d{i} := data.{_dotted(path)} with input as input[{i}]")
            if masked:
                clauses.append(_mask_clause(i, path, f"input[{i}]"))
        names = ", ".join(path for path, _ in requests)
        try:
            with active.lease() as engine:
                started = time.monotonic()
                bindings = engine.eval_query("; ".join(clauses), [dict(input) for _, input in requests])
        except OpaError as exc:
            if masked:  # the mask may be what failed: decide each alone, the mask marked failed
                decisions = [self.decide(path, input, timeout_s=timeout_s) for path, input in requests]
                return [_with_mask(d, {"error": str(exc)}) for d in decisions]
            raise _unavailable(f"{names}: {exc}") from exc
        if len(bindings) != 1:  # a decision undefined (no binding), or not single-valued
            raise _unavailable(f"{names}: undefined decision")
        _check_time(names, started, timeout_s)
        return [_decision(path, bindings[0].get(f"d{i}"), active, d,
                          _combined(active.path_mask(path), _mask_of(bindings[0], i) if masked else None)
                          if self._log_mask else None)
                for i, ((path, _), d) in enumerate(zip(requests, digests, strict=True))]

    def _active_bundle(self) -> _Active:
        active = self._active
        if self._closed or active is None:
            raise _unavailable("no active policy bundle")
        return active

    def revision(self) -> str:
        active = self._active
        return active.revision if active is not None and not self._closed else ""

    def active(self) -> bool:
        return not self._closed and self._active is not None

    def masks_decisions(self) -> bool:
        """Whether decisions carry a decision-log mask's answer (asked for, and defined)."""
        active = self._active
        return self._log_mask and active is not None and (active.has_mask or active.path_masks is not None)

    def reload(self) -> str:
        """Read, verify and compile the bundle and swap it in; on any failure the previous
        revision stays active (BundleRefused names the file, line and error)."""
        return self._load(self._source)

    def restore(self, source: BundleSource) -> str:
        """Activate the bundle ``source`` holds (the pulled bundle accepted before a restart)
        with every check a reload makes; the engine's own source stays the one reloads read."""
        return self._load(source)

    def _load(self, source: BundleSource) -> str:
        with self._lock:
            if self._closed:
                raise _unavailable("policy engine is closed")
            previous = self._active.revision if self._active is not None else ""
            try:
                bundle = source.load()
                ticket = self._check(bundle)
                compiled = REGISTRY.acquire(bundle, lambda: _build_engines(bundle))
            except SourceUnavailable as exc:
                raise _unavailable(f"policy bundle not loaded: {source.describe()}: {exc}") from exc
            except BundleError as exc:
                raise BundleRefused(exc.problem(), previous) from exc
            has_mask = path_masks = None
            try:  # until it is active, this activation's hold is released on any failure
                if ticket is not None and self._guard is not None:
                    self._guard.accepted(bundle, ticket)  # before it answers: a restart resumes from here
                if self._log_mask:
                    with compiled.lease() as engine:
                        has_mask = _defines(engine, f'{_MASK_REF}({{"path": "", "input": {{}}, "result": {{}}}})')
                        if _defines(engine, f'data.{LOG_PATH_MASK.replace("/", ".")}("")'):
                            path_masks = {path: _path_mask(engine, path) for path in DECISION_PATHS}
            except BaseException:
                REGISTRY.release(compiled)
                raise
            # The previous bundle's engines are released, not closed: a decision in flight may
            # still hold one; each closes with its last reference (compiled.py).
            previous_active, self._active = self._active, _Active(
                compiled, bundle.revision, has_mask=bool(has_mask), path_masks=path_masks)
            if previous_active is not None:
                previous_active.close()
            return bundle.revision

    def _check(self, bundle: Bundle) -> Ticket | None:
        ticket = None
        if self._verifier is not None:
            claims = self._verifier.verify(bundle.files, bundle.signatures)
            if self._guard is not None:  # after the signature verified: its iat is the order
                ticket = self._guard.check(bundle, claims)
        if self._expected_revision is not None and bundle.revision != self._expected_revision:
            raise BundleError(f"bundle revision {bundle.revision!r} is not the expected {self._expected_revision!r}",
                              file=MANIFEST)
        return ticket

    def close(self) -> None:
        with self._lock:
            self._closed = True
            active, self._active = self._active, None
        if active is not None:
            active.close()
        close = getattr(self._source, "close", None)
        if close is not None:
            close()


def _build_engines(bundle: Bundle) -> list[OpaEngine]:
    engines: list[OpaEngine] = []
    try:
        for _ in range(ENGINES):
            engines.append(build_engine(bundle))
    except BaseException:
        for engine in engines:
            engine.close()
        raise
    return engines


def _with_mask(d: Decision, log_mask: Any) -> Decision:
    from dataclasses import replace

    return replace(d, log_mask=log_mask)


def _defines(engine: OpaEngine, call: str) -> bool:
    """Whether the bundle defines the function ``call`` names (a query naming an undefined
    function does not compile; one that fails at run time is defined)."""
    try:
        engine.eval_query(f"x := [m | m := {call}]")
    except OpaError as exc:
        return "undefined function" not in exc.message and "undefined ref" not in exc.message
    return True
