"""The ``records`` table's columns as ``RecordRow`` reads them, shared by the store and the search
index (the codec itself is ``engram_core/store/sql/codecs.py``, both SQL engines')."""

from __future__ import annotations

from engram_core.store.sql.codecs import RECORD_COLS, RECORD_WIDTH, record_of

__all__ = ["RECORD_COLS", "RECORD_COLS_BEFORE_12", "RECORD_WIDTH", "record_of"]

# The columns from migration 3 to 11: what a migration step before 12 may read (``record_of`` fills
# the later ones with None).
RECORD_COLS_BEFORE_12 = RECORD_COLS.removesuffix(", session, captured_at_ms")
