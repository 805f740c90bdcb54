"""The PostgreSQL engine of the store: several cores over one database (``engine.py``).

Only the composition root, tests and tools name this package; core services are written
against ``engram_core.store.port`` alone (tests/unit/test_layering.py enforces it).
"""
