"""The reliability suite reuses the core and MCP test helpers (crash_harness,
core_support, mcp_helpers). Their directories are on sys.path only when pytest
collects them, so put them there for `pytest tests/reliability` alone too."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for _sub in ("core", "mcp"):
    if str(_TESTS / _sub) not in sys.path:
        sys.path.append(str(_TESTS / _sub))
