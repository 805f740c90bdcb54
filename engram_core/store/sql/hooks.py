"""The kernel's commit hooks and observers as both SQL engines hold them (``engine.Engine``'s
``set_hooks``; ``on_commit``, the observer tests watch commits through)."""

from __future__ import annotations

from typing import Any

from engram_core.store.engine import CommitHooks, StoreObservers


class HeldHooks:
    """Mixin of ``DuckDBEngine`` and ``PostgresEngine``."""

    _hooks: CommitHooks | None
    observers: StoreObservers

    def set_hooks(self, hooks: CommitHooks, observers: StoreObservers) -> None:
        self._hooks = hooks
        self.observers = observers

    @property
    def on_commit(self) -> Any:
        """``observers.on_commit`` (tests watch commits through it)."""
        return self.observers.on_commit

    @on_commit.setter
    def on_commit(self, callback: Any) -> None:
        self.observers.on_commit = callback
