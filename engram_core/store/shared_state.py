"""The state a store's cores share, where one process is the store's sole writer.

An engine whose database no other process opens (``EngineCapabilities.sole_writer``: DuckDB's
fence, the in-memory engine) has nothing to share with another core: this process's ledgers are
exact. So its ``SharedState`` (``engine.py``) is this one, which every such engine uses:

- a context nonce's claim always succeeds: the process's nonce ledger (seeded from the audit
  log at open: ``services/context_nonces.py``) is the only one and decides alone;
- there is no host-key trust version (None): this process's changes update its copy of the keys
  and nobody else changes them;
- every leader lease is held: no other process runs the job;
- search pins and usage counts stay in the kernel's in-memory stores (no shelf, no shared usage).

An engine of several writers keeps this state in its database instead
(``postgres/shared_state.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engram_core.store.engine import UsageBuckets
    from engram_core.store.page_pins import PinShelf
    from engram_core.store.usage_counters import SharedUsage, UsageRead


class SoleWriterState:
    """``engine.SharedState`` of a store one process writes alone (see the module docstring)."""

    def claim_context_nonce(self, ref: str, expires_at_ms: int) -> bool:
        return True

    def claim_context_nonce_and_trust(self, ref: str, expires_at_ms: int, *, usage: UsageRead | None = None,
                                      ) -> tuple[bool, int | None, UsageBuckets | None]:
        return True, None, None

    def host_keys_version(self) -> int | None:
        return None

    @contextmanager
    def leader_lease(self, job: str) -> Iterator[bool]:
        yield True

    def pin_shelf(self) -> PinShelf | None:
        return None

    def shared_usage(self) -> SharedUsage | None:
        return None


SOLE_WRITER_STATE = SoleWriterState()  # it holds nothing: one serves every engine that is its store's sole writer
