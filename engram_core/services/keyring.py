"""The KEK ring's schedule: rotation and retirement of key-encryption-key generations (SPEC §10).

Rotation makes a new generation active and re-wraps every live data key under it; the
generation before stays in the ring, unwrapping only, for ``retention`` (so backups and copies
of the key files made under it still restore), then retires: its KEK leaves the ring for good.
A destroyed data key's destruction is complete once every generation that wrapped it retired,
so with a rotation every ``rotation_interval`` a forget or withdrawal completes within
``rotation_interval + retention`` (plus one check interval) of it. The schedule is operator
configuration (``engram serve --key-rotation-interval/--key-retention``), not a per-call policy.

Both steps run under an exclusive write transaction: no key destruction commits between reading
the live keys and re-wrapping them (a re-wrap could otherwise write a just-destroyed key back),
and no key created meanwhile is left wrapped by a generation about to retire.

Several cores over one store: the schedule is a leader-only job (``KEY_RING_JOB``). Each check
runs under the store's leader lease (``Store.leader_lease``), so one core at a time rotates and
retires, and the check whether a rotation is due is made by that core, on the ring as the
vault reads it then (a rotation another core made is in it): one rotation per interval across
every core, not one per core. The core that leads says so in its log (``leads job key-ring``);
when it dies, another takes the lease at its next check (``check_interval_s``). A rotation that
does overlap another (a leader whose lease session was cut mid-tick) is still safe: the vault
rotates under its ring lock from the latest copy of the ring, so at worst the ring gains one
more generation.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from engram_core.services.key_schedule import DAY_MS, KeySchedule

if TYPE_CHECKING:
    from engram_core.services.core import Core

log = logging.getLogger("engram.keyring")
__all__ = ["DAY_MS", "KEY_RING_JOB", "KeyRingScheduler", "KeySchedule", "check_interval_s", "due_for_rotation",
           "retire", "rotate"]
KEY_RING_JOB = "key-ring"  # the leader lease of rotation and retirement
MAX_CHECK_S = 30.0  # the schedule is checked at least this often
MIN_CHECK_S = 0.25


def check_interval_s(schedule: KeySchedule) -> float:
    """How often the schedule is checked: every 30 s, or four times per rotation interval when
    that is shorter (a rotation is then late by at most a quarter of its interval)."""
    if schedule.rotation_interval_ms <= 0:
        return MAX_CHECK_S
    return max(MIN_CHECK_S, min(MAX_CHECK_S, schedule.rotation_interval_ms / 4000))


def rotate(core: Core) -> dict[str, Any]:
    """A new active generation; every live data key re-wrapped under it (no sealed body is touched)."""
    vault = core.vault
    with core.store.write() as tx:
        live = tx.live_key_slots()
        active = vault.rotate(core.now_ms())
        rewrapped = sum(1 for slot, owner in live.items() if vault.rewrap(slot, owner))
        vault.sync()
    return {"active_generation": active, "live_data_keys": len(live), "rewrapped": rewrapped}


def retire(core: Core, schedule: KeySchedule, *, now: bool = False) -> list[int]:
    """Retire every retained generation whose retention has passed (``now``: whatever its
    retention) and by which no live data key is wrapped any more; returns them."""
    vault = core.vault
    at = core.now_ms()
    retired = []
    with core.store.write():
        wrapping = vault.wrapping_generations()
        for gen in vault.generations():
            if gen.state != "retained" or gen.generation in wrapping:
                continue
            if not now and (gen.deactivated_at_ms is None or gen.deactivated_at_ms + schedule.retention_ms > at):
                continue
            vault.retire(gen.generation, at)
            retired.append(gen.generation)
    if retired:
        log.info("KEK generations retired: %s", retired)
    return retired


def due_for_rotation(core: Core, schedule: KeySchedule) -> bool:
    if schedule.rotation_interval_ms <= 0:
        return False
    active = next(g for g in core.vault.generations() if g.state == "active")
    return active.created_at_ms + schedule.rotation_interval_ms <= core.now_ms()


class KeyRingScheduler:
    """Rotates and retires on ``schedule``, checking every ``check_s`` seconds (None:
    ``check_interval_s``), on a thread of its own, while this core holds the job's lease."""

    def __init__(self, core: Core, schedule: KeySchedule, *, check_s: float | None = None) -> None:
        self.core = core
        self.schedule = schedule
        self._check_s = check_interval_s(schedule) if check_s is None else check_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engram-keyring", daemon=True)

    def start(self) -> KeyRingScheduler:
        self._thread.start()
        return self

    def tick(self) -> dict[str, Any]:
        """One check, if this core leads the job (else ``{"leader": False}``): rotate if due,
        then retire what is due."""
        with self.core.store.leader_lease(KEY_RING_JOB) as leading:
            if not leading:
                return {"leader": False}
            out: dict[str, Any] = {}
            if due_for_rotation(self.core, self.schedule):
                out["rotated"] = rotate(self.core)
                log.info("KEK generation %d active (rotated on schedule)", out["rotated"]["active_generation"])
            out["retired"] = retire(self.core, self.schedule)
            return out

    def _run(self) -> None:
        while not self._stop.wait(self._check_s):
            if not self.core.store.is_open():
                return
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a failed check is retried at the next one
                log.exception("KEK ring check failed; retried in %.0f s", self._check_s)

    def stop(self) -> None:
        self._stop.set()
