"""When KEK generations rotate and retire: operator configuration the core holds
(``engram serve --key-rotation-interval/--key-retention``); ``services/keyring.py`` acts on it."""

from __future__ import annotations

from dataclasses import dataclass

DAY_MS = 86_400_000


@dataclass(frozen=True)
class KeySchedule:
    """When generations rotate and retire (milliseconds; a rotation interval of 0: only on request)."""

    rotation_interval_ms: int = DAY_MS
    retention_ms: int = DAY_MS

    @property
    def destruction_window_ms(self) -> int:
        """The longest a destroyed key's destruction stays pending under this schedule."""
        return self.rotation_interval_ms + self.retention_ms
