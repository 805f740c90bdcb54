"""The conformance target of the in-memory engine (``store/memory``): the suite's worked example
of a ``Target`` (an engine written outside this repository writes one like it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from engram_core.crypto.keyvault import FileKeyVault
from engram_core.store.kernel import StoreKernel
from engram_core.store.memory import MemoryDatabase, MemoryEngine


class MemoryTarget:
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
        self._open: list[StoreKernel] = []

    def open(self) -> StoreKernel:
        vault = FileKeyVault(self.data_dir)
        store = StoreKernel(MemoryEngine(self.database), vault, spool_dir=self.data_dir)
        store.vault = vault  # type: ignore[attr-defined]  # the checks destroy and inspect keys
        self._open.append(store)
        return store

    def reopen(self, store: StoreKernel) -> StoreKernel:
        self.close(store)
        return self.open()

    def close(self, store: StoreKernel) -> None:
        if store in self._open:
            self._open.remove(store)
        store.close()
        store.vault.close()  # type: ignore[attr-defined]

    def run_process(self, body: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError("an in-memory store is not reachable from another process")

    def close_all(self) -> None:
        for store in list(self._open):
            try:
                self.close(store)
            except Exception:  # noqa: BLE001 - a check may have closed it already
                pass
