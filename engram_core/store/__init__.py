"""Storage: the Store port (``port.py``), what every engine shares (hash chains, sealed
projections, the in-memory search index, audit spool and devices) and, in ``duckdb/``,
the DuckDB engine."""
