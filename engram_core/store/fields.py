"""The search fields of a record and their codes in a sealed projection (``projection.py``).

A projection stores each field's postings under its code, so the codes are part of the stored
format: shared by the services that derive postings (``services/lexical.py``, maintenance's
re-analysis) and the index that ranks them (``store/search_index/``). Append only: a code once
written names its field for good.
"""

from __future__ import annotations

FIELDS: tuple[str, ...] = ("primary", "decision", "evidence", "context", "citations")
FIELD_CODE: dict[str, int] = {name: i for i, name in enumerate(FIELDS)}
