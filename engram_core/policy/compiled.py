"""The OPA engines compiled from one bundle's decision modules and data, shared in a process.

An engine costs ~50 ms to build from the bundle and ~20-80 ms more for each decision path the
first time it is asked (OPA prepares a query on first use): ~0.35 s per engine, and a bundle keeps
``ENGINES`` of them. An engine is a function of the modules and the data alone (no builtin is
registered on it and no data is added after the build), so two activations of the same content
would compile engines that answer the same. A process that opens several cores over one bundle
(the test suite, ``tools/bench``, ``migrate-store``'s two stores) or reloads a bundle whose
decision modules and data did not change (a re-signed bundle, a poll that fetched the same
content under a new revision) shares them instead: each activation holds a reference, a decision
leases whichever engine is free.

Kept: every content some activation holds, and the content activated last even once nobody
holds it (a core closed and the next one opened over the same bundle, as tests do), and, where
the process asks for it (``keep_unheld``), a few more released ones. Dropped: a
content nobody holds once another has been activated since, so a server that reloads to new
content keeps one bundle's engines, as before. A dropped content's engines are not closed here:
a decision that read the active bundle just before a reload may still be about to lease one;
each engine closes with its last reference (``OpaEngine.__del__``).
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opa_bindings.engine import OpaEngine

from engram_core.contract.errors import Code, EngramError
from engram_core.policy.bundle import Bundle

LEASE_WAIT_S = 30.0  # the longest a decision waits for a free engine (embedded.py's docstring)


class CompiledBundle:
    """The engines of one content; a decision takes whichever is free, or waits for one."""

    def __init__(self, key: str, engines: list[OpaEngine]) -> None:
        self.key = key
        self._free: queue.SimpleQueue[OpaEngine] = queue.SimpleQueue()
        for engine in engines:
            self._free.put(engine)
        self.holders = 0  # activations holding it (guarded by the registry's lock)

    @contextmanager
    def lease(self) -> Iterator[OpaEngine]:
        try:
            engine = self._free.get(timeout=LEASE_WAIT_S)
        except queue.Empty:
            raise EngramError(Code.POLICY_UNAVAILABLE,
                              f"no policy engine free within {LEASE_WAIT_S:.0f}s") from None
        try:
            yield engine
        finally:
            self._free.put(engine)

    def close_unshared(self) -> None:
        """Close the engines of a content built twice by racing activations (the loser's copy,
        which nobody leased)."""
        while True:
            try:
                self._free.get_nowait().close()
            except queue.Empty:
                return


def content_key(bundle: Bundle) -> str:
    """What an engine is built from: the decision modules and the data (not the revision, the
    manifest or the signatures, which no decision reads)."""
    h = hashlib.sha256()
    for path, source in sorted(bundle.policy_modules().items()):
        h.update(json.dumps([path, source]).encode())
    h.update(json.dumps(list(bundle.data), sort_keys=True, default=repr).encode())
    return h.hexdigest()


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, CompiledBundle] = {}
        self._last: CompiledBundle | None = None
        # Contents nobody holds, kept beyond the last activated one, most recently released
        # last. 0 by default: a server keeps only what it serves. A process that opens many
        # cores over a few bundles in turn (the test suite: tests/conftest.py) keeps a few.
        self.keep_unheld = 0
        self._unheld: OrderedDict[str, CompiledBundle] = OrderedDict()

    def acquire(self, bundle: Bundle, build: Callable[[], list[OpaEngine]]) -> CompiledBundle:
        """The shared engines for the bundle's content, built by ``build`` if none are kept;
        the caller holds them until it calls :meth:`release`. Building happens outside the lock
        (it takes tenths of a second); two racing builds of one content keep the first."""
        key = content_key(bundle)
        with self._lock:
            found = self._kept(key)
            if found is not None:
                return self._hold(found)
        built = CompiledBundle(key, build())
        with self._lock:
            found = self._kept(key)
            if found is not None:
                built.close_unshared()
                return self._hold(found)
            return self._hold(built)

    def _kept(self, key: str) -> CompiledBundle | None:
        last = self._last
        return (self._held.get(key) or self._unheld.get(key)
                or (last if last is not None and last.key == key else None))

    def _hold(self, compiled: CompiledBundle) -> CompiledBundle:
        compiled.holders += 1
        self._unheld.pop(compiled.key, None)
        self._held[compiled.key] = compiled
        previous, self._last = self._last, compiled
        if previous is not None and previous is not compiled and previous.holders == 0:
            self._keep_released(previous)  # no longer kept as the last one
        return compiled

    def release(self, compiled: CompiledBundle) -> None:
        with self._lock:
            compiled.holders -= 1
            if compiled.holders > 0:
                return
            self._held.pop(compiled.key, None)
            if compiled is not self._last:  # the last activated is kept anyway
                self._keep_released(compiled)

    def _keep_released(self, compiled: CompiledBundle) -> None:
        """Keep a content nobody holds among the ``keep_unheld`` most recent, or drop it: its
        engines then close with their last reference."""
        if self.keep_unheld > 0:
            self._unheld[compiled.key] = compiled
            while len(self._unheld) > self.keep_unheld:
                self._unheld.popitem(last=False)


REGISTRY = _Registry()
