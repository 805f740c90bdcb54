"""The SQL both SQL engines share (DuckDB, PostgreSQL): row codecs, statements written once
with ``?`` placeholders and rendered per dialect (``dialect.py``), the ``EngineTx`` members
whose SQL is the same in both (``rows.py``) and the migration-ledger check (``ledger.py``).

An engine keeps only what its dialect and its concurrency need: PostgreSQL its scope locks,
pipelines and fenced lookups; DuckDB its single writer, group commit and caches."""
