"""Engram core: governed long-term memory for AI agents."""

import os

__version__ = "0.1.0"

# OpenBLAS's worker threads spin for 2^28 cycles (~0.1 s) after each call before they sleep, and
# numpy's vector products (the search index's float32 rows, an admission's similar records) call
# it a few times per request: with the semantic channel on, a capture and admission pair cost
# 55-57 ms of the core's CPU, half of it a worker spinning, and 27 ms with the workers asleep
# after 2^4 cycles (docs/performance.md). Set before numpy loads; an operator's own value wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
