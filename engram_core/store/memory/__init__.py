"""The in-memory engine (``engine.py``): a reference and a test bed, no durability."""

from engram_core.store.memory.engine import MemoryDatabase, MemoryEngine

__all__ = ["MemoryDatabase", "MemoryEngine"]
