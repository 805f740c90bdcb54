"""The kernel's commit hooks and observers as both SQL engines hold them (``engine.Engine``'s
``set_hooks``)."""

from __future__ import annotations

from engram_core.store.engine import CommitHooks, StoreObservers


class HeldHooks:
    """Mixin of ``DuckDBEngine`` and ``PostgresEngine``."""

    _hooks: CommitHooks | None
    observers: StoreObservers

    def set_hooks(self, hooks: CommitHooks, observers: StoreObservers) -> None:
        self._hooks = hooks
        self.observers = observers
