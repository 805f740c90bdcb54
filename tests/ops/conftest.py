"""The operations suite drives `engram serve` as an operator would (logs, metrics, traces,
signals) and reuses the core and MCP test helpers: put their directories on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for _sub in ("core", "mcp"):
    if str(_TESTS / _sub) not in sys.path:
        sys.path.append(str(_TESTS / _sub))
