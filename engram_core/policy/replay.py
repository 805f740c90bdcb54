"""``engram policy replay``: what a candidate bundle would have decided on logged traffic.

Every logged decision's input is evaluated again under the candidate (compiled once, a few
engines in parallel) and compared with what was logged: the outcome (allowed/denied, the
admission's accept/reject/duplicate/adjudication_required, the retention action, the
reconciliation's proceed/adjudication_required), the reason codes, and the rest of the
result. Changes are counted per decision path and transition, with the reasons that appear
or disappear, the tenants they concern and a few examples; ``--json`` gives the same report
for CI. Works for any decision path in the log, not a fixed list.

Logged inputs are masked (``decisionlog/mask.py``). Pseudonyms are restored before
evaluation wherever the candidate bundle could tell the name apart: every string of its data
documents (keys included: tenant and purpose names) and every string literal of its modules is
pseudonymized with the given keys, and a pseudonym that matches is put back. Any other name
stays a pseudonym: rules that only compare names (``input.a == input.b``), or look them up in
data, decide the same; a rule matching a name by prefix or pattern sees the pseudonym. Fields
the mask erased or rewrote are left out of the comparison of results.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engram_core.contract.errors import EngramError
from engram_core.policy.bundle import Bundle, BundleError
from engram_core.policy.decisionlog.mask import PSEUDONYM_PREFIX, MaskError, Pseudonymizer, apply_mask
from engram_core.policy.port import BundleRefused, Decision
from engram_core.policy.sources import DiskSource

BATCH = 512
UNAVAILABLE = "unavailable"
_AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400}


# --- reading logs ---


def read_events(paths: Sequence[Path]) -> Iterator[dict[str, Any] | None]:
    """Every event of every log (JSON lines or one JSON array, gzipped or not); None for a
    line that is not a JSON object (counted, not fatal: a log cut mid-line)."""
    for path in paths:
        blob = Path(path).read_bytes()
        if blob[:2] == b"\x1f\x8b":
            blob = gzip.decompress(blob)
        text = blob.decode("utf-8", errors="replace")
        if text.lstrip().startswith("["):
            try:
                events = json.loads(text)
            except ValueError:
                yield None
                continue
            for event in events if isinstance(events, list) else [None]:
                yield event if isinstance(event, dict) else None
            continue
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                yield None
                continue
            yield event if isinstance(event, dict) else None


def parse_time(value: str | None, *, now: dt.datetime | None = None) -> dt.datetime | None:
    """An instant (``2026-12-01T00:00:00Z``) or an age before now (``24h``, ``90m``, ``7d``, ``30s``)."""
    if value is None:
        return None
    now = now or dt.datetime.now(dt.UTC)
    unit = value[-1:]
    if unit in _AGES and value[:-1].isdigit():
        return now - dt.timedelta(seconds=int(value[:-1]) * _AGES[unit])
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not an instant or an age (24h, 90m, 7d): {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _timestamp(event: dict[str, Any]) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(event.get("timestamp")))
    except ValueError:
        return None


# --- pseudonyms ---


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)


def rego_string_literals(source: str) -> Iterator[str]:
    """The string literals of a Rego module (``"..."`` with JSON escapes, and raw strings)."""
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c == "#":
            while i < n and source[i] != "\n":
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and source[j] != '"' and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            try:
                literal = json.loads(source[i:j + 1])
            except ValueError:
                literal = None
            if isinstance(literal, str):
                yield literal
            i = j
        elif c == "`":
            j = source.find("`", i + 1)
            j = n if j < 0 else j
            yield source[i + 1:j]
            i = j
        i += 1


def restoration_map(bundle: Bundle, keys: Iterable[Pseudonymizer], extra: Iterable[str] = ()) -> dict[str, str]:
    """Pseudonym -> name for every name the candidate bundle mentions (and ``extra`` names:
    tenants the operator lists), under each key."""
    names: set[str] = set(extra)
    for _, value in bundle.data:
        names.update(_strings(value))
    for source in bundle.modules.values():
        names.update(rego_string_literals(source))
    out: dict[str, str] = {}
    for key in keys:
        for name in names:
            out[key(name)] = name
    return out


def restore(value: Any, names: dict[str, str], missed: Counter[str]) -> Any:
    if isinstance(value, str):
        if value.startswith(PSEUDONYM_PREFIX):
            if value in names:
                return names[value]
            missed[value] += 1
        return value
    if isinstance(value, list):
        return [restore(v, names, missed) for v in value]
    if isinstance(value, dict):
        return {k: restore(v, names, missed) for k, v in value.items()}
    return value


# --- comparing ---


def outcome_of(result: Any) -> str:
    """A decision's outcome in one word, for any family: allowed/denied, else the value of its
    ``decision``, ``admission`` or ``action`` string, else ``answered``."""
    if not isinstance(result, dict):
        return UNAVAILABLE
    if isinstance(result.get("allow"), bool):
        return "allowed" if result["allow"] else "denied"
    for key in ("decision", "admission", "action"):
        if isinstance(result.get(key), str):
            return result[key]
    return "answered"


def reason_codes(result: Any) -> list[str]:
    reasons = result.get("reasons") if isinstance(result, dict) else None
    return sorted({str(r.get("code")) for r in reasons or [] if isinstance(r, dict) and "code" in r})


def _comparable(result: Any, pointers: Iterable[str]) -> Any:
    """The result without the fields a mask erased or rewrote (on either side)."""
    ops = sorted({p for p in pointers if isinstance(p, str) and p.startswith("/result")})
    if not ops or not isinstance(result, dict):
        return result
    try:
        return apply_mask({"result": result}, ops, lambda s: s).get("result")
    except MaskError:
        return result


# --- the replay ---


class _Path:
    def __init__(self, examples: int) -> None:
        self.replayed = 0
        self.changed = 0
        self.outcomes: Counter[str] = Counter()
        self.transitions: dict[str, dict[str, Any]] = {}
        self.examples = examples

    def add(self, label: str, before: list[str], after: list[str], tenant: str, example: dict[str, Any]) -> None:
        t = self.transitions.setdefault(label, {"count": 0, "reasons_appeared": Counter(),
                                                "reasons_disappeared": Counter(), "tenants": Counter(),
                                                "examples": []})
        t["count"] += 1
        t["reasons_appeared"].update(set(after) - set(before))
        t["reasons_disappeared"].update(set(before) - set(after))
        t["tenants"][tenant] += 1
        if len(t["examples"]) < self.examples:
            t["examples"].append(example)

    def as_dict(self) -> dict[str, Any]:
        transitions = {}
        for label, t in sorted(self.transitions.items(), key=lambda kv: -kv[1]["count"]):
            transitions[label] = {"count": t["count"],
                                  "reasons_appeared": dict(t["reasons_appeared"].most_common()),
                                  "reasons_disappeared": dict(t["reasons_disappeared"].most_common()),
                                  "tenants": dict(t["tenants"].most_common(10)),
                                  "examples": t["examples"]}
        return {"replayed": self.replayed, "changed": self.changed, "unchanged": self.replayed - self.changed,
                "outcomes_before": dict(self.outcomes), "transitions": transitions}


def replay(bundle_path: Path, logs: Sequence[Path], *, since: str | None = None, until: str | None = None,
           paths: Sequence[str] | None = None, keys: Sequence[Path] = (), names_file: Path | None = None,
           examples: int = 3) -> dict[str, Any]:
    """The report (a JSON-ready dict): ``totals``, ``paths`` (per decision path: transitions
    with counts, reasons, tenants, examples), ``skipped`` by reason, ``candidate_revision``,
    ``logged_revisions``."""
    from engram_core.policy.embedded import ENGINES, EmbeddedPolicyEngine

    source = DiskSource(bundle_path)
    bundle = source.load()
    engine = EmbeddedPolicyEngine(source=source, log_mask=True)
    try:
        engine.reload()
    except BundleRefused as exc:
        raise BundleError(exc.problem.get("error", ""), file=exc.problem.get("file", ""),
                          line=exc.problem.get("line", 0)) from None
    pseudonymizers = [Pseudonymizer.from_file(k) for k in keys]
    extra = [ln.strip() for ln in names_file.read_text(encoding="utf-8").splitlines() if ln.strip()] if names_file else []
    names = restoration_map(bundle, pseudonymizers, extra)
    known_keys = {p.key_id for p in pseudonymizers}
    start, end = parse_time(since), parse_time(until)
    wanted = {p.strip("/") for p in paths} if paths else None
    per_path: dict[str, _Path] = defaultdict(lambda: _Path(examples))
    skipped: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    logged_revisions: Counter[str] = Counter()
    keys_seen: Counter[str] = Counter()
    read = 0

    def selected() -> Iterator[dict[str, Any]]:
        nonlocal read
        for event in read_events(logs):
            read += 1
            if event is None:
                skipped["unreadable"] += 1
                continue
            path = str(event.get("path", "")).strip("/")
            at = _timestamp(event)
            if wanted is not None and path not in wanted:
                skipped["other_path"] += 1
            elif (start or end) and at is None:
                skipped["no_timestamp"] += 1
            elif (start and at < start) or (end and at >= end):
                skipped["outside_window"] += 1
            elif "error" in event:
                skipped["failed_when_logged"] += 1
            elif not isinstance(event.get("input"), dict):
                skipped["input_erased"] += 1
            else:
                yield event

    def evaluate(item: tuple[dict[str, Any], dict[str, Any]]) -> tuple[dict[str, Any], Decision | EngramError]:
        event, restored = item
        try:
            return event, engine.decide(event["path"].strip("/"), restored)
        except EngramError as exc:
            return event, exc

    try:
        with ThreadPoolExecutor(max_workers=ENGINES) as pool:  # OPA evaluates outside the GIL
            batch: list[tuple[dict[str, Any], dict[str, Any]]] = []
            for event in selected():
                batch.append((event, restore(event["input"], names, missed)))
                if len(batch) >= BATCH:
                    for (ev, restored), answer in zip(batch, pool.map(evaluate, batch), strict=True):
                        _compare(ev, restored, answer[1], per_path, logged_revisions, keys_seen)
                    batch.clear()
            for (ev, restored), answer in zip(batch, pool.map(evaluate, batch), strict=True):
                _compare(ev, restored, answer[1], per_path, logged_revisions, keys_seen)
    finally:
        engine.close()
    replayed = sum(p.replayed for p in per_path.values())
    changed = sum(p.changed for p in per_path.values())
    return {
        "candidate_revision": bundle.revision,
        "logged_revisions": dict(logged_revisions),
        "logs": [str(p) for p in logs],
        "window": {"since": start.isoformat() if start else None, "until": end.isoformat() if end else None},
        "totals": {"read": read, "replayed": replayed, "changed": changed, "unchanged": replayed - changed,
                   "skipped": sum(skipped.values())},
        "skipped": dict(skipped),
        "pseudonyms": {"restored_names_known": len(names), "left_pseudonymized": sum(missed.values()),
                       "keys_in_logs": dict(keys_seen), "keys_missing": sorted(set(keys_seen) - known_keys - {""})},
        "paths": {path: p.as_dict() for path, p in sorted(per_path.items())},
    }


def _compare(event: dict[str, Any], restored: dict[str, Any], answer: Decision | EngramError,
             per_path: dict[str, _Path],
             logged_revisions: Counter[str], keys_seen: Counter[str]) -> None:
    path = str(event["path"]).strip("/")
    stats = per_path[path]
    stats.replayed += 1
    revision = ((event.get("bundles") or {}).get("engram") or {}).get("revision", "")
    logged_revisions[revision] += 1
    keys_seen[str((event.get("labels") or {}).get("pseudonym_key", ""))] += 1
    before = event.get("result")
    old, old_reasons = outcome_of(before), reason_codes(before)
    stats.outcomes[old] += 1
    if isinstance(answer, EngramError):
        new, new_reasons, after, touched = UNAVAILABLE, [], None, []
    else:
        after = answer.result
        new, new_reasons = outcome_of(after), reason_codes(after)
        touched = _masked_pointers(event, answer)
    if old == new and old_reasons == new_reasons:
        pointers = [*event.get("erased", []), *event.get("masked", []), *touched]
        if _comparable(before, pointers) == _comparable(after, pointers):
            return
        label = f"{old}→{new} (result)"
    elif old == new:
        label = f"{old}→{new} (reasons)"
    else:
        label = f"{old}→{new}"
    stats.changed += 1
    tenant = (restored.get("context") or {}).get("tenant") or "-"
    example = {"decision_id": event.get("decision_id", ""), "audit_id": event.get("audit_id", ""),
               "timestamp": event.get("timestamp", ""), "tenant": tenant, "reasons_before": old_reasons,
               "reasons_after": new_reasons}
    if isinstance(answer, EngramError):
        example["error"] = answer.detail
    stats.add(label, old_reasons, new_reasons, tenant, example)


def _masked_pointers(event: dict[str, Any], answer: Decision) -> list[str]:
    """The pointers the candidate's own mask would erase or rewrite in its answer's event."""
    if not isinstance(answer.log_mask, list):
        return []
    try:
        masked = apply_mask({"path": answer.path, "input": {}, "result": answer.result}, answer.log_mask,
                            lambda s: s)
    except MaskError:
        return []
    return [*masked.get("erased", []), *masked.get("masked", [])]


def render(report: dict[str, Any]) -> str:
    """The report as text for a policy author."""
    t = report["totals"]
    revisions = ", ".join(f"{r or '-'} ({n})" for r, n in sorted(report["logged_revisions"].items())) or "none"
    lines = [f"replayed {t['replayed']} of {t['read']} logged decisions under candidate revision "
             f"{report['candidate_revision']} (logged under {revisions})",
             f"would change: {t['changed']}; unchanged: {t['unchanged']}"]
    for path, p in report["paths"].items():
        if not p["changed"]:
            lines.append(f"{path}: {p['replayed']} replayed, no change")
            continue
        lines.append(f"{path}: {p['replayed']} replayed, {p['changed']} would change")
        for label, tr in p["transitions"].items():
            lines.append(f"  {label}: {tr['count']}")
            if tr["reasons_appeared"]:
                lines.append("    reasons appearing: " + ", ".join(f"{c} ×{n}" for c, n in tr["reasons_appeared"].items()))
            if tr["reasons_disappeared"]:
                lines.append("    reasons disappearing: " + ", ".join(f"{c} ×{n}" for c, n in tr["reasons_disappeared"].items()))
            lines.append("    tenants: " + ", ".join(f"{name} ×{n}" for name, n in tr["tenants"].items()))
            for ex in tr["examples"]:
                lines.append(f"    e.g. {ex['timestamp']} audit {ex['audit_id'] or '-'} tenant {ex['tenant']}: "
                             f"[{', '.join(ex['reasons_before'])}] → [{', '.join(ex['reasons_after'])}]"
                             + (f" ({ex['error']})" if ex.get("error") else ""))
    if report["skipped"]:
        lines.append("skipped: " + ", ".join(f"{reason} {n}" for reason, n in sorted(report["skipped"].items())))
    if report["candidate_revision"] in report["logged_revisions"]:
        # Receipts and audit rows name the revision: a changed bundle deployed under a logged one
        # makes two different policies indistinguishable there (issue 60 item 13).
        lines.append(f"note: the candidate's revision {report['candidate_revision']} is one the log was decided "
                     "under: bump the revision in .manifest before deploying a changed bundle")
    ps = report["pseudonyms"]
    if ps["keys_missing"]:
        lines.append(f"note: no --pseudonym-key for key(s) {', '.join(ps['keys_missing'])}: names stay pseudonymized, "
                     "so tenant-specific rules see the defaults")
    elif ps["left_pseudonymized"]:
        lines.append(f"note: {ps['left_pseudonymized']} names the candidate bundle does not mention stayed pseudonymized")
    return "\n".join(lines)
