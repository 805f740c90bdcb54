"""Several cores over one PostgreSQL store (issue 28): `engram serve --store` processes on the
session's test cluster (tests/pg_cluster.py). The core and MCP test helpers are reused: put
their directories on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for _sub in ("core", "mcp"):
    if str(_TESTS / _sub) not in sys.path:
        sys.path.append(str(_TESTS / _sub))
