"""Signed bundles only move forward: a core refuses a bundle signed before the one it last
accepted, across reloads, pulls and restarts (issue 57).

A signature proves who made a bundle, not that it is the newest: a bundle server (or whoever
writes the bundle directory) could serve a genuine older revision, one whose hole a newer one
closed, and every core would activate it. The order is the signature's own ``iat`` (the
signing time in the JWT of ``.signatures.json``, set by ``engram policy sign``/``bundle
--sign``; ``opa sign`` sets it from a ``--claims-file``): the signature covers it, so nobody
without the key can move it. A manifest's ``revision`` is a name (a git hash, say), not an
order. Equal times are not a rollback (a bundle served again, or two signed within a second).

``RollbackGuard`` keeps the last accepted revision and signing time in
``DIR/policy-bundle-state.json`` (DIR: ``--data``, or ``--key-dir`` with ``--store``) and,
for a pulled bundle, the archive itself in ``DIR/policy-bundle.tar.gz`` (both 0600, written
to a temporary file and renamed), so a restart starts from what was accepted last, not from
whatever the bundle server serves at that moment, and a bundle directory copied back to an
older signed revision is refused at SIGHUP as a pulled one is at the next poll.

Rolling back on purpose: ``engram serve --bundle-allow-rollback REVISION`` lets that one
revision, older than the last accepted, be activated once. The rollback is logged
(``policy_bundle_rollback``, a warning naming both revisions and signing times) and recorded
in the state file's ``rollbacks``; the same signed bundle is not rolled back to twice (a
flag left on the command line does not reopen the hole; re-signing the old content, which
gives it a new ``iat``, is the other deliberate way back).

Unsigned bundles (no verification key) have no signed time and are not ordered.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engram_core.observability.logs import log_event
from engram_core.policy.bundle import SIGNATURES, Bundle, BundleError
from engram_core.policy.signing import signed_at

STATE_FILE = "policy-bundle-state.json"
PULLED_FILE = "policy-bundle.tar.gz"
MAX_ROLLBACKS_KEPT = 100  # the state file's history of deliberate rollbacks stays small

log = logging.getLogger("engram.policy")


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Ticket:
    """A bundle the guard let through ``check``; ``accepted`` records it once it is active."""

    revision: str
    signed_at: float
    rollback: bool = False


class RollbackGuard:
    """Orders the signed bundles one engine activates (see the module docstring).

    ``directory``: where the state (and a pulled bundle) is kept; ``keep_bundle``: keep the
    accepted archive (a bundle server's); ``allow_rollback_to``: the one older revision an
    operator allows. ValueError when the state file exists but cannot be read: starting
    without it would forget the order, so the operator decides (restore it, or remove it)."""

    def __init__(self, directory: Path, *, keep_bundle: bool = False, allow_rollback_to: str | None = None) -> None:
        self.directory = Path(directory)
        self.keep_bundle = keep_bundle
        self.allow_rollback_to = allow_rollback_to or None
        self.state_path = self.directory / STATE_FILE
        self.bundle_path = self.directory / PULLED_FILE
        self._state = self._read_state()

    def _read_state(self) -> dict[str, Any]:
        try:
            text = self.state_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {self.state_path} ({exc}); it orders signed policy bundles: "
                             "restore it, or remove it to accept any signed bundle once") from None
        try:
            state = json.loads(text)
        except ValueError:
            state = None
        if not isinstance(state, dict) or not isinstance(state.get("revision"), str) \
                or isinstance(state.get("signed_at"), bool) or not isinstance(state.get("signed_at"), int | float) \
                or not isinstance(state.get("rollbacks", []), list):
            raise ValueError(f"{self.state_path} is not a policy bundle state file; it orders signed policy "
                             "bundles: restore it, or remove it to accept any signed bundle once")
        return state

    @property
    def last_revision(self) -> str:
        return str(self._state.get("revision", ""))

    @property
    def last_signed_at(self) -> float | None:
        return self._state.get("signed_at")

    @property
    def rollbacks(self) -> list[dict[str, Any]]:
        return list(self._state.get("rollbacks", []))

    def saved_bundle(self) -> Path | None:
        """The pulled archive accepted last, to activate at start before asking the server."""
        return self.bundle_path if self.keep_bundle and self.bundle_path.is_file() else None

    def check(self, bundle: Bundle, claims: dict[str, Any]) -> Ticket:
        """The bundle may be activated (its signature already verified: ``claims``), or
        BundleError naming ``.signatures.json``: it has no signing time, or it was signed
        before the last accepted bundle and is not the rollback the operator allowed."""
        when = signed_at(claims)
        if when is None:
            raise BundleError("the signature carries no iat (signing time), so it cannot be ordered after the "
                              "bundles this core accepted: sign with engram policy sign/bundle --sign, or opa "
                              "sign --claims-file with an iat", file=SIGNATURES)
        last = self.last_signed_at
        if last is None or when >= last:
            return Ticket(bundle.revision, when)
        if self.allow_rollback_to == bundle.revision:
            done = [r for r in self.rollbacks if r.get("revision") == bundle.revision and r.get("signed_at") == when]
            if not done:
                return Ticket(bundle.revision, when, rollback=True)
            raise BundleError(f"revision {bundle.revision!r} (signed {_when(when)}) was already rolled back to once "
                              f"(at {done[-1].get('at')}); revision {self.last_revision!r} (signed {_when(last)}) "
                              "is newer: refused as a rollback (re-sign the bundle to deploy it again)",
                              file=SIGNATURES)
        raise BundleError(f"revision {bundle.revision!r} was signed {_when(when)}, before revision "
                          f"{self.last_revision!r} (signed {_when(last)}) which this core already accepted: "
                          f"refused as a rollback (to roll back on purpose: engram serve --bundle-allow-rollback "
                          f"{bundle.revision})", file=SIGNATURES)

    def accepted(self, bundle: Bundle, ticket: Ticket) -> None:
        """Record the bundle now active. A state that cannot be written is logged, not fatal:
        this process still keeps the order; only a restart could forget it."""
        previous = dict(self._state)
        state: dict[str, Any] = {"revision": ticket.revision, "signed_at": ticket.signed_at,
                                 "accepted_at": _when(datetime.now(UTC).timestamp()),
                                 "rollbacks": self.rollbacks}
        if ticket.rollback:
            record = {"revision": ticket.revision, "signed_at": ticket.signed_at,
                      "from_revision": previous.get("revision", ""), "from_signed_at": previous.get("signed_at"),
                      "at": state["accepted_at"]}
            state["rollbacks"] = [*state["rollbacks"], record][-MAX_ROLLBACKS_KEPT:]
            log_event("policy_bundle_rollback", logging.WARNING, revision=ticket.revision,
                      signed_at=_when(ticket.signed_at), from_revision=record["from_revision"] or "none",
                      from_signed_at=_when(previous["signed_at"]), allowed_by="--bundle-allow-rollback")
        same = (previous.get("revision"), previous.get("signed_at")) == (ticket.revision, ticket.signed_at)
        self._state = state
        keep = self.keep_bundle and bundle.archive is not None
        if same and not ticket.rollback and (not keep or self.bundle_path.is_file()):
            return  # the bundle accepted last, activated again (a restart, a reload): nothing new to keep
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if keep:
                assert bundle.archive is not None
                _write_private(self.bundle_path, bundle.archive)
            _write_private(self.state_path, (json.dumps(state, indent=1, sort_keys=True) + "\n").encode())
        except OSError as exc:
            log_event("policy_bundle_state_not_saved", logging.ERROR, path=str(self.state_path),
                      error=exc.strerror or type(exc).__name__, revision=ticket.revision)

    def describe(self) -> str:
        """For the start-up summary."""
        allowed = f"; rollback to {self.allow_rollback_to} allowed once" if self.allow_rollback_to else ""
        return f"on ({self.state_path}{allowed})"


def _write_private(path: Path, data: bytes) -> None:
    """Owner-only, complete or absent: a temporary file beside ``path``, synced, renamed over
    it (unique names: cores sharing a key directory may write at once)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
