"""The conformance target of the in-memory engine (``store/memory``): the suite's worked example
of a ``Target`` (an engine written outside this repository writes one like it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from engram_core.crypto.keyvault import FileKeyVault
from engram_core.store.conformance.stores import OpenedStores
from engram_core.store.kernel import StoreKernel
from engram_core.store.memory import MemoryDatabase, MemoryEngine


class MemoryTarget(OpenedStores):
    """One in-memory database (``store/memory``): one store at a time, as DuckDB's file (a second
    engine on it is refused), and kept across reopening (the database outlives its engines as a
    file does); no process of its own can reach it (``processes`` False)."""

    name = "memory"
    several_writers = False
    processes = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.database = MemoryDatabase()
        super().__init__()

    def open(self) -> StoreKernel:
        vault = FileKeyVault(self.data_dir)
        store = StoreKernel(MemoryEngine(self.database), vault, spool_dir=self.data_dir)
        return self.keep(store, vault)


    def run_process(self, body: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError("an in-memory store is not reachable from another process")

