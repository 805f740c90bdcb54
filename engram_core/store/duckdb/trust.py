"""Trust classes that move after capture (SPEC §5 Trust; issue 18 host verifiers).

A candidate or record carries ``asserted`` until a host verifier attests it
``signed`` or ``earned``; trust invalidation takes that back. The record digest
keeps covering the trust class it was captured with (``asserted``): the digest
names immutable content, and an attestation is a later fact about it, signed
over that digest and kept in the journal.
"""

from __future__ import annotations

from typing import Any


class TrustClasses:
    """Mixin of ``DuckDBEngineTx`` (uses its ``_exec``)."""

    def _exec(self, sql: str, params: list[Any] | tuple = ()) -> None: ...  # provided by DuckDBEngineTx

    def set_record_trust_class(self, record_id: str, trust_class: str) -> None:
        self._exec("UPDATE records SET trust_class = ? WHERE record_id = ?", [trust_class, record_id])

    def set_candidate_trust_class(self, candidate_id: str, trust_class: str) -> None:
        self._exec("UPDATE candidates SET trust_class = ? WHERE candidate_id = ?", [trust_class, candidate_id])
