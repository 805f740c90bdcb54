"""The base of the PolicyEngine wrappers (the decision log's, the composition root's observer):
each adds something around the wrapped engine's answers and leaves the answers unchanged."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engram_core.policy.port import Decision


class PolicyEngineWrapper:
    """A PolicyEngine around ``inner``. ``decide`` and ``decide_all`` both answer through
    ``_around``, so a wrapper says once what it does around one evaluation of the inner engine
    (one decision or several asked together) and its failure; every other member forwards."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def decide(self, path: str, input: Mapping[str, Any], *, timeout_s: float | None = None) -> Decision:
        return self._around([(path, input)], lambda: [self._inner.decide(path, input, timeout_s=timeout_s)])[0]

    def decide_all(self, requests: Sequence[tuple[str, Mapping[str, Any]]], *,
                   timeout_s: float | None = None) -> list[Decision]:
        return self._around(requests, lambda: self._inner.decide_all(requests, timeout_s=timeout_s))

    def _around(self, requests: Sequence[tuple[str, Mapping[str, Any]]],
                evaluate: Callable[[], list[Decision]]) -> list[Decision]:
        """The decisions ``evaluate`` answers for ``requests`` (path, input), in their order."""
        return evaluate()

    def revision(self) -> str:
        return self._inner.revision()

    def active(self) -> bool:
        return self._inner.active()

    def reload(self) -> str:
        return self._inner.reload()

    def close(self) -> None:
        self._inner.close()
