"""The Policy page's replay of a candidate bundle against the core's decision log, for one scope.

The computation is ``engram policy replay``'s (``engram_core.policy.replay.replay``), called as
the command calls it; this module only chooses what it reads:

- **the candidate**: an entry of the configured directory (``[console.replay] candidates``): a
  bundle directory or a ``.tar.gz`` (at most ``MAX_ARCHIVE_BYTES``). The form names an entry; the
  console accepts only a name it lists itself (one path component, no ``..``, no hidden file),
  and one that still resolves inside the directory (a symbolic link out of it is refused). Nothing
  is uploaded: a person picks what an operator put there.
- **the log**: a decision log spans every tenant, and its names are pseudonyms. The events of this
  scope are those whose ``input.context`` names its tenant and workspace, in clear or as their
  pseudonym under the configured key (the core's ``decision-log.key``); only they are replayed,
  from a temporary file the replay reads and that is removed after.

One replay runs at a time (it uses several engines and CPU): a second is told to wait.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from engram_core.contract.scope import Scope
from engram_core.policy import replay as policy_replay
from engram_core.policy.decisionlog.mask import Pseudonymizer

MAX_ARCHIVE_BYTES = 16 * 1024 * 1024
WINDOWS = {"1h": "1h", "24h": "24h", "7d": "7d", "all": None}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_running = threading.Lock()


class ReplayRefused(Exception):
    """A replay that cannot run (the message is for the page)."""


class ReplayBusy(ReplayRefused):
    """Another replay is running."""


def candidates(directory: str) -> list[str]:
    """The candidate bundles a person may choose: each subdirectory holding a ``.manifest`` or a
    ``data.json``, and each ``.tar.gz`` no larger than MAX_ARCHIVE_BYTES, by name."""
    if not directory:
        return []
    root = Path(directory).resolve()
    out = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not _NAME.fullmatch(entry.name) or entry.resolve().parent != root:
            continue
        if entry.is_dir() and ((entry / ".manifest").is_file() or (entry / "data.json").is_file()):
            out.append(entry.name)
        elif entry.name.endswith(".tar.gz") and entry.is_file() and entry.stat().st_size <= MAX_ARCHIVE_BYTES:
            out.append(entry.name)
    return out


def candidate_path(directory: str, name: str) -> Path:
    """The chosen candidate's path, only if ``name`` is one :func:`candidates` lists."""
    if not _NAME.fullmatch(name) or name not in candidates(directory):
        raise ReplayRefused("Choose one of the candidate bundles listed.")
    return Path(directory).resolve() / name


def _scope_names(scope: Scope, key: Pseudonymizer) -> tuple[set[str], set[str]]:
    return {scope.tenant, key(scope.tenant)}, {scope.workspace, key(scope.workspace)}


def scope_events(logs: list[str], scope: Scope, key: Pseudonymizer, out: Path) -> tuple[int, int]:
    """Write this scope's events of ``logs`` to ``out`` (JSON lines); (events read, events kept)."""
    tenants, workspaces = _scope_names(scope, key)
    read = kept = 0
    with out.open("w", encoding="utf-8") as f:
        for event in policy_replay.read_events([Path(p) for p in logs]):
            read += 1
            if event is None:
                continue
            ctx = (event.get("input") or {}).get("context") if isinstance(event.get("input"), dict) else None
            if isinstance(ctx, dict) and ctx.get("tenant") in tenants and ctx.get("workspace") in workspaces:
                f.write(json.dumps(event, ensure_ascii=False) + "\n")
                kept += 1
    return read, kept


def run(*, candidates_dir: str, name: str, logs: list[str], key_file: str, scope: Scope,
        window: str) -> dict[str, Any]:
    """``engram policy replay``'s report for this scope's logged decisions under the candidate
    ``name``, plus ``log_events`` (every event the logs hold) and ``scope_events`` (this scope's)."""
    bundle = candidate_path(candidates_dir, name)
    if window not in WINDOWS:
        raise ReplayRefused("Choose a window: the last hour, day, week, or the whole log.")
    if not _running.acquire(blocking=False):
        raise ReplayBusy("Another replay is running: try again in a moment.")
    try:
        key_path = Path(key_file)
        key = Pseudonymizer.from_file(key_path)
        with tempfile.TemporaryDirectory(prefix="engram-console-replay-") as tmp:
            scoped = Path(tmp) / "scope.jsonl"
            read, kept = scope_events(logs, scope, key, scoped)
            report = policy_replay.replay(bundle, [scoped], since=WINDOWS[window], keys=[key_path], examples=3)
    finally:
        _running.release()
    report["log_events"], report["scope_events"] = read, kept
    return report
