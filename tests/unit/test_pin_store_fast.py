"""The page-pin store's bounds (engram_core/services/paging.py): per scope, in total, and
eviction that falls on the scope holding the most pins, never on a smaller one."""

from __future__ import annotations

from engram_core.services.paging import Binding, Pin, PinStore


def _pin(tenant: str) -> Pin:
    return Pin(binding=Binding("p", tenant, "w", "r", "d"), system_as_of=0, valid_as_of=0, candidate_count=0,
               created_ms=0)


def test_a_flooding_scope_loses_its_own_pins_first():
    store = PinStore(now_ms=lambda: 0, per_scope=4, capacity=10)
    quiet = [store.put(_pin("quiet")) for _ in range(3)]
    flood = [store.put(_pin("flood")) for _ in range(100)]
    assert all(store.get(p) is not None for p in quiet)
    assert [store.get(p) is not None for p in flood] == [False] * 96 + [True] * 4
    assert len(store) == 7


def test_the_total_bound_takes_from_the_largest_scope():
    store = PinStore(now_ms=lambda: 0, per_scope=4, capacity=10)
    small = store.put(_pin("small"))
    for tenant in ("a", "b", "c"):
        for _ in range(4):
            store.put(_pin(tenant))
    assert len(store) == 10  # 13 put, capacity 10: three evictions, none of them the small scope's
    assert store.get(small) is not None


def test_expired_pins_are_gone():
    now = [0]
    store = PinStore(now_ms=lambda: now[0], ttl_ms=10)
    pin = store.put(_pin("t"))
    now[0] = 11
    assert store.get(pin) is None and len(store) == 0
