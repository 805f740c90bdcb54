"""The decision logger: every decision the core asks for becomes one OPA-style event
(``decision_id``, ``path``, ``input``, ``result``, ``bundles.engram.revision``, ``timestamp``,
``labels``, plus Engram's ``audit_id``, which joins it to the call's audit row), masked by the
bundle's ``engram.log.mask`` and written to a sink.

A call pays for one append to a bounded buffer (no copy, no serialization, no I/O). The
logger's thread masks, serializes and writes. When the buffer is full the event is dropped,
never waited for: drops are counted by reason (``buffer_full``, ``mask_missing``,
``mask_failed``, ``sink_failed``, ``backlog``), exported as metrics and said in the log at
most every ``DROP_REPORT_S``. An event is written masked or not at all: a decision whose mask
is missing or fails leaves a count, never an unmasked line.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engram_core import __version__
from engram_core.contract.errors import EngramError
from engram_core.observability import calls
from engram_core.observability.logs import log_event
from engram_core.policy.decisionlog.mask import (
    MaskError,
    Plan,
    Pseudonymizer,
    apply_plan,
    parse_operations,
)
from engram_core.policy.decisionlog.sinks import Sink
from engram_core.policy.port import Decision
from engram_core.policy.wrapper import PolicyEngineWrapper

log = logging.getLogger("engram.decision_log")
BUNDLE_NAME = "engram"
DROP_REPORT_S = 10.0
REASONS = ("buffer_full", "mask_missing", "mask_failed", "sink_failed", "backlog")


def rfc3339(ns: int) -> str:
    seconds, rest = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:06d}Z"


class DecisionLogger:
    """Buffers decisions and writes them, masked, from its own thread.

    ``mask_remotely``: asks for the mask of a decision that does not carry one (the OPA REST
    backend cannot evaluate it in the decision's own call), on this thread.
    """

    def __init__(self, sink: Sink, *, pseudonymizer: Pseudonymizer, labels: Mapping[str, str] | None = None,
                 buffer_events: int = 10_000, batch_events: int = 256, flush_s: float = 0.5,
                 mask_remotely: Callable[[dict[str, Any], str], Any] | None = None) -> None:
        self.sink = sink
        self._pseudonymize = pseudonymizer
        self._mask_remotely = mask_remotely
        self.labels = {"id": str(uuid.uuid4()), "app": "engram", "version": __version__,
                       "pseudonym_key": pseudonymizer.key_id, **(labels or {})}
        self._buffer: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=buffer_events)
        self._drop_lock = threading.Lock()  # drops come from call threads
        self._parse_cache: dict[int, tuple[Any, Plan]] = {}
        self._batch = batch_events
        self._flush_s = flush_s
        self.written = 0
        self.dropped: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()
        self._last_report = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engram-decision-log", daemon=True)
        self._thread.start()

    # -- the call path ---------------------------------------------------------------------
    def record(self, decision: Decision, input: Mapping[str, Any]) -> None:
        self._put((time.time_ns(), _audit_id(), decision, input, None))

    def record_failure(self, path: str, input: Mapping[str, Any], error: EngramError, revision: str) -> None:
        self._put((time.time_ns(), _audit_id(), path, input, (error.code.value, error.detail, revision)))

    def _put(self, item: tuple[Any, ...]) -> None:
        try:
            if self._stop.is_set():
                raise queue.Full
            self._buffer.put_nowait(item)
        except queue.Full:
            with self._drop_lock:
                self.dropped["buffer_full"] += 1

    # -- the logger's thread ---------------------------------------------------------------
    @property
    def buffered(self) -> int:
        return self._buffer.qsize()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._cycle(self._flush_s)
        while not self._buffer.empty():  # what was buffered when close() was called
            self._cycle(0)

    def _cycle(self, wait_s: float) -> None:
        items = self._drain(wait_s)
        lines = [line for line in (self._event_line(item) for item in items) if line is not None]
        if lines:
            try:
                self.sink.write(lines)
                self.written += len(lines)
            except (OSError, ValueError) as exc:
                self._drop("sink_failed", len(lines))
                log.warning("decision log sink %s failed: %s", self.sink.name, exc)
        try:
            self.sink.tick(time.monotonic())
        except (OSError, ValueError) as exc:
            log.warning("decision log sink %s failed: %s", self.sink.name, exc)
        backlog = getattr(self.sink, "dropped", 0)
        if backlog > self.dropped["backlog"]:
            with self._drop_lock:
                self.dropped["backlog"] = backlog
        self._report_drops()

    def _drain(self, wait_s: float) -> list[tuple[Any, ...]]:
        items: list[tuple[Any, ...]] = []
        try:
            items.append(self._buffer.get(timeout=wait_s) if wait_s > 0 else self._buffer.get_nowait())
            while len(items) < self._batch:
                items.append(self._buffer.get_nowait())
        except queue.Empty:
            pass
        return items

    def _drop(self, reason: str, n: int = 1) -> None:
        with self._drop_lock:
            self.dropped[reason] += n

    def _event_line(self, item: tuple[Any, ...]) -> bytes | None:
        at_ns, audit_id, decision, input, failure = item
        if failure is None:
            event = self.event(decision, input, at_ns, audit_id)
            ops = decision.log_mask
            if ops is None and self._mask_remotely is not None:
                try:
                    ops = self._mask_remotely({"path": decision.path, "input": input, "result": decision.result},
                                              decision.revision)
                except EngramError as exc:
                    ops = {"error": exc.detail}
            if ops is None:
                self._drop("mask_missing")
                return None
            if isinstance(ops, dict) and "error" in ops:
                self._drop("mask_failed")
                return None
            try:
                event = apply_plan(event, self._parsed(ops), self._pseudonymize)
            except MaskError:
                self._drop("mask_failed")
                return None
        else:  # no answer, so no mask: nothing that could be content goes out
            code, detail, revision = failure
            event = {"decision_id": f"core-{uuid.uuid4()}", "path": decision, "labels": self.labels,
                     "bundles": {BUNDLE_NAME: {"revision": revision}}, "timestamp": rfc3339(at_ns),
                     "audit_id": audit_id, "error": {"code": code, "message": detail}, "erased": ["/input"]}
        try:
            return json.dumps(event, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8")
        except (TypeError, ValueError):
            self._drop("mask_failed")
            return None

    def _parsed(self, ops: Any) -> Plan:
        """Parsed operations; a path mask's answer (one list object per path and revision) is
        parsed once. Entries keep their list alive, so an id is never reused while cached."""
        hit = self._parse_cache.get(id(ops))
        if hit is not None and hit[0] is ops:
            return hit[1]
        parsed = parse_operations(ops)
        if len(self._parse_cache) >= 256:
            self._parse_cache.clear()
        self._parse_cache[id(ops)] = (ops, parsed)
        return parsed

    def event(self, d: Decision, input: Mapping[str, Any], at_ns: int, audit_id: str) -> dict[str, Any]:
        """The unmasked event of one decision (OPA's decision-log fields, plus ``audit_id``)."""
        return {"decision_id": d.decision_id, "path": d.path, "input": input, "result": d.result,
                "bundles": {BUNDLE_NAME: {"revision": d.revision}}, "timestamp": rfc3339(at_ns),
                "labels": self.labels, "audit_id": audit_id}

    def _report_drops(self) -> None:
        now = time.monotonic()
        if now - self._last_report < DROP_REPORT_S:
            return
        with self._drop_lock:
            new = self.dropped - self._reported
        if new:
            log_event("decision_log_dropped", logging.WARNING, dropped=sum(new.values()),
                      reasons=",".join(f"{k}:{v}" for k, v in sorted(new.items())),
                      written=self.written, sink=self.sink.name)
            with self._drop_lock:
                self._reported = Counter(self.dropped)
        self._last_report = now

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop taking events, write what is buffered, give the sink until ``timeout_s``."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout_s)
        left = self.sink.close(time.monotonic() + timeout_s)
        if left:
            self._drop("sink_failed", left)
        self._last_report = 0.0
        self._report_drops()


def _audit_id() -> str:
    obs = calls.current()
    return obs.audit_id if obs is not None else ""


class LoggedPolicyEngine(PolicyEngineWrapper):
    """A PolicyEngine that hands every decision it answers (and every one it fails) to a
    DecisionLogger; the answers are the wrapped engine's, unchanged."""

    def __init__(self, inner: Any, logger: DecisionLogger) -> None:
        super().__init__(inner)
        self.logger = logger

    def _around(self, requests: Sequence[tuple[str, Mapping[str, Any]]],
                evaluate: Callable[[], list[Decision]]) -> list[Decision]:
        try:
            ds = evaluate()
        except EngramError as exc:
            revision = self._inner.revision()
            for path, input in requests:
                self.logger.record_failure(path, input, exc, revision)
            raise
        for d, (_, input) in zip(ds, requests, strict=True):
            self.logger.record(d, input)
        return ds

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self.logger.close()
