"""What every conformance target keeps of the stores it opened (a base for ``Target``s)."""

from __future__ import annotations

from typing import Any

from engram_core.store.kernel import StoreKernel


class OpenedStores:
    """The stores a target opened and not yet closed: each ``open`` builds its engine and vault as
    the composition root does and hands the kernel to ``keep``; ``reopen``, ``close`` and
    ``close_all`` are then the same for every engine."""

    def __init__(self) -> None:
        self._open: list[StoreKernel] = []

    def open(self) -> StoreKernel:
        raise NotImplementedError

    def keep(self, store: StoreKernel, vault: Any) -> StoreKernel:
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

    def close_all(self) -> None:
        for store in list(self._open):
            try:
                self.close(store)
            except Exception:  # noqa: BLE001 - a check may have closed it already
                pass
