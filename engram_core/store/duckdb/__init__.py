"""The DuckDB engine of the Store port: one file, one writer process, SQL of its own.

Only the composition root (``engram_core.rpc.server.open_core``), tests and
tools name this package; core services are written against
``engram_core.store.port`` alone (tests/unit/test_layering.py enforces it).
"""
