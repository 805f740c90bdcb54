"""Storage: the Store port and its DuckDB implementation."""
