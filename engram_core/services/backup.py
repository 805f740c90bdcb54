"""Logical backup and restore (SPEC §10, §12).

A backup is JSON lines (RFC 8785 per line) taken from one read snapshot, so it
is pinned at each scope's cursor and at the audit head. It holds scopes, the
journal, admitted records (control row + *sealed* body), the tombstone ledger,
key-destruction ledger, trusted host keys and the audit log, then a manifest
with counts, a digest over every preceding byte, ``manifest_digest``
(``backup-manifest`` domain) and the signature of the core that made it over
that digest (its ``DIR/backup.key``, engram_core/trust/signing.py). Restore verifies
everything, then the signature against the backup keys the operator names (and
the restoring core's own); trusted host keys in a backup are restored only when
the operator asks. Candidates — pending, rejected or withdrawn
content — are never included, and neither is the idempotency ledger.

Key material never enters a backup. A record line names its data key by
``(owner, slot)`` in the key vault it came from; restore takes each key from a
key-vault directory (the source's ``store.kek`` + ``datakeys.bin``), unseals,
checks the payload digest, and re-seals under a fresh key of the target vault.
So crypto-shredding reaches backups: a record forgotten after the backup has a
zeroed slot, its key is gone, and restore journals it as tombstoned instead of
bringing it back (docs/admin.md).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engram_core.contract.canonical import canonical_json, digest
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import KeyVault
from engram_core.crypto.sealing import seal, unseal
from engram_core.services.admin import target_facts
from engram_core.services.core import CallRecord, Core, new_id, record_id_of
from engram_core.services.lexical import record_fields
from engram_core.services.maintenance import check_audit, check_journal, event_doc
from engram_core.services.mutations import Mutations
from engram_core.services.reconciliation import payload_links, write_links
from engram_core.store.chain import LEGACY_CHAIN, chain_heads
from engram_core.store.port import Event, HostKeyRow, RecordRow, ScopeRow, Tx
from engram_core.trust.hostctx import BoundContext
from engram_core.trust.hostkeys import key_id, load_public_pem, public_pem
from engram_core.trust.signing import BACKUP_DOMAIN, CoreSigner, public_keys_from_pems, verify_signature

# v2: signed manifests; v3: a head per audit chain, no engine schema version (any engine restores it).
FORMAT = "engram-backup/v3"
FORMATS = ("engram-backup/v2", FORMAT)
CHUNK_BYTES = 1 << 20
MAX_BACKUP_BYTES = 1 << 31


def _invalid(detail: str) -> EngramError:
    return EngramError(Code.BACKUP_INVALID, detail)


# -- taking a backup ------------------------------------------------------------------------
def build_backup(tx: Tx, *, created_at: str, signer: CoreSigner,
                 scope: Scope | None = None) -> bytes:
    """Serialize one consistent snapshot (the caller holds the read transaction).

    The whole store, or one ``(tenant, workspace)`` scope. A scope backup carries
    that scope's journal, records, tombstone ledger and key destructions but no
    audit rows: the audit chain is global, so a subset could not be verified;
    the restored store starts its own audit chain with the restore.
    """
    lines: list[bytes] = []
    counts: dict[str, int] = {}

    def put(kind: str, item: dict[str, Any]) -> None:
        counts[kind] = counts.get(kind, 0) + 1
        lines.append(canonical_json({"kind": kind, **item}) + b"\n")

    audit = tx.audit_rows(None, 0, None) if scope is None else []
    head = {chain: [seq, d] for chain, (seq, d) in sorted(chain_heads(audit).items())}
    put("header", {"format": FORMAT, "created_at": created_at, "audit_head": head})
    pins = []
    owners: set[str] = set()
    for s in tx.scopes():
        if scope is not None and Scope(s.tenant, s.workspace) != scope:
            continue
        put("scope", {"tenant": s.tenant, "workspace": s.workspace, "activated": s.activated, "tools": list(s.tools),
                      "authorization_epoch": s.authorization_epoch, "last_cursor": str(s.last_cursor),
                      "last_event_digest": s.last_event_digest})
        pins.append({"tenant": s.tenant, "workspace": s.workspace, "cursor": str(s.last_cursor)})
        for e in tx.events(Scope(s.tenant, s.workspace), 0, None):
            put("event", event_doc(e))
        for rec in tx.scope_records(Scope(s.tenant, s.workspace)):
            owners.add(f"record:{rec.record_id}")
            doc = asdict(rec)
            doc.pop("key_slot")  # a slot of this store's vault: restore seals under new keys
            doc["sealed_body"] = base64.b64encode(rec.sealed_body).decode() if rec.sealed_body is not None else ""
            if rec.state != "tombstoned":
                owner = f"record:{rec.record_id}"
                slot = tx.data_key_slot(owner)
                doc["key_ref"] = {"owner": owner, "ref": slot if slot is not None else -1}
            put("record", {k: v for k, v in doc.items() if v is not None})
    for row in tx.tombstone_rows():
        if scope is None or Scope(row["tenant"], row["workspace"]) == scope:
            put("tombstone", row)
    for d in tx.key_destructions():
        if scope is None or d.owner in owners:
            item: dict[str, Any] = {"owner": d.owner, "at_ms": d.at_ms, "reason": d.reason}
            if d.generation is not None:
                item["generation"] = d.generation
            put("key_destruction", item)
    for key in tx.host_key_rows():  # with what each serves (migration 13), never a private key
        put("trusted_host_key", {"key_id": key.key_id, "public_key_pem": key.public_key_pem,
                                 "tenants": list(key.tenants), "all_tenants": key.all_tenants,
                                 "maintenance_scopes": list(key.maintenance_scopes)})
    for row in audit:
        put("audit", row)
    body = b"".join(lines)
    manifest: dict[str, Any] = {"format": FORMAT, "counts": counts, "pins": pins, "audit_head": head,
                "items_sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}
    if scope is not None:
        manifest["scope"] = {"tenant": scope.tenant, "workspace": scope.workspace}
    manifest["manifest_digest"] = digest("backup-manifest", manifest)
    manifest["signature"] = signer.sign(manifest["manifest_digest"])
    return body + canonical_json({"kind": "manifest", **manifest}) + b"\n"


def chunks(data: bytes) -> Iterable[tuple[bytes, int]]:
    for i in range(0, len(data), CHUNK_BYTES):
        yield data[i:i + CHUNK_BYTES], len(data)


# -- reading one back -------------------------------------------------------------------------
class ParsedBackup:
    """A backup whose manifest, counts, digests and hash chains all verified."""

    def __init__(self, data: bytes) -> None:
        if not data.endswith(b"\n"):
            raise _invalid("truncated")
        body_end = data.rstrip(b"\n").rfind(b"\n") + 1
        body, last = data[:body_end], data[body_end:]
        try:
            manifest = json.loads(last)
            items = [json.loads(line) for line in body.splitlines()]
        except ValueError:
            raise _invalid("not JSON lines") from None
        if not isinstance(manifest, dict) or manifest.pop("kind", None) != "manifest":
            raise _invalid("no manifest")
        self.signature = manifest.pop("signature", None)
        claimed = manifest.pop("manifest_digest", None)
        if claimed != digest("backup-manifest", manifest) or manifest.get("format") not in FORMATS:
            raise _invalid("manifest digest")
        self.manifest_digest: str = claimed
        self.signed_by: str | None = None  # the trusted backup key that verified the signature
        if hashlib.sha256(body).hexdigest() != manifest.get("items_sha256") or len(body) != manifest.get("bytes"):
            raise _invalid("items digest")
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
                raise _invalid("item")
            by_kind.setdefault(item.pop("kind"), []).append(item)
        if {k: len(v) for k, v in by_kind.items()} != manifest.get("counts"):
            raise _invalid("counts")
        header = by_kind.get("header", [{}])[0]
        if header.get("format") != manifest.get("format"):
            raise _invalid("header")
        try:
            self.scopes = [ScopeRow(s["tenant"], s["workspace"], bool(s["activated"]), tuple(s["tools"]),
                                    int(s["authorization_epoch"]), int(s["last_cursor"]), s["last_event_digest"])
                           for s in by_kind.get("scope", [])]
            self.events = [Event(e["tenant"], e["workspace"], int(e["cursor"]), e["event_id"], e["operation"],
                                 e["target"], e["from_state"], e["to_state"], int(e["at_ms"]), e["body"],
                                 e["prev_digest"], e["event_digest"]) for e in by_kind.get("event", [])]
            self.records = [_record_row(r) for r in by_kind.get("record", [])]
            self.key_refs = {r["record_id"]: (r["key_ref"]["owner"], int(r["key_ref"].get("ref", r["key_ref"].get("slot"))))
                             for r in by_kind.get("record", []) if "key_ref" in r}
            self.tombstones = by_kind.get("tombstone", [])
            self.key_destructions = by_kind.get("key_destruction", [])
            self.trusted_keys = by_kind.get("trusted_host_key", [])
            self.audit = by_kind.get("audit", [])
            head = manifest["audit_head"]
            if head != header["audit_head"]:
                raise _invalid("audit head")
        except (KeyError, TypeError, ValueError):
            raise _invalid("item fields") from None
        for k in self.trusted_keys:
            try:
                load_public_pem(k["public_key_pem"])
            except Exception:
                raise _invalid("trusted host key") from None
            if not _binding_valid(k):
                raise _invalid("trusted host key binding")
        self._verify_chains(head)

    def _verify_chains(self, head: dict[str, Any]) -> None:
        known = {(s.tenant, s.workspace): s for s in self.scopes}
        per_scope: dict[tuple[str, str], list[Event]] = {k: [] for k in known}
        for e in self.events:
            if (e.tenant, e.workspace) not in known:
                raise _invalid("event outside any scope")
            per_scope[(e.tenant, e.workspace)].append(e)
        for k, events in per_scope.items():
            if check_journal(known[k], sorted(events, key=lambda e: e.cursor)):
                raise _invalid("journal chain")
        for row in self.audit:
            row["seq"] = int(row["seq"])
        try:
            if "seq" in head and "digest" in head:  # v2: the one chain there was then
                heads = {LEGACY_CHAIN: (int(head["seq"]), str(head["digest"]))} if int(head["seq"]) else {}
            else:
                heads = {str(c): (int(h[0]), str(h[1])) for c, h in head.items()}
        except (AttributeError, TypeError, ValueError, IndexError):
            raise _invalid("audit head") from None
        if check_audit(self.audit, heads) or set(heads) != set(chain_heads(self.audit)):
            raise _invalid("audit chain")
        for rec in self.records:
            scope = known.get((rec.tenant, rec.workspace))
            if scope is None or rec.accepted_cursor > scope.last_cursor or rec.record_id != record_id_of(rec.record_digest):
                raise _invalid("record row")
            if rec.state != "tombstoned" and (rec.sealed_body is None or rec.record_id not in self.key_refs):
                raise _invalid("record body")


def _record_row(r: dict[str, Any]) -> RecordRow:
    fields: dict[str, Any] = {k: r.get(k) for k in RecordRow.__dataclass_fields__ if k != "key_slot"}
    fields["sealed_body"] = base64.b64decode(r["sealed_body"], validate=True) if r.get("sealed_body") else None
    return RecordRow(**fields)


# -- restore ------------------------------------------------------------------------------------
def _binding_valid(k: dict[str, Any]) -> bool:
    """A backup line's binding (absent in lines of a store before migration 13: serves nothing)."""
    tenants, scopes = k.get("tenants", []), k.get("maintenance_scopes", [])
    return (isinstance(tenants, list) and all(isinstance(t, str) and t for t in tenants)
            and isinstance(scopes, list) and all(x in ("read", "maintain") for x in scopes)
            and isinstance(k.get("all_tenants", False), bool))


def _host_key_row(k: dict[str, Any], at_ms: int) -> HostKeyRow:
    pub = load_public_pem(k["public_key_pem"])
    return HostKeyRow(key_id=key_id(pub), public_key_pem=public_pem(pub), added_at_ms=at_ms,
                      tenants=tuple(sorted(set(k.get("tenants", [])))), all_tenants=k.get("all_tenants", False),
                      maintenance_scopes=tuple(sorted(set(k.get("maintenance_scopes", [])))))


class BackupService:
    def __init__(self, core: Core, mutations: Mutations, signer: CoreSigner) -> None:
        self.core = core
        self.mutations = mutations  # a restore embeds its records as admissions do
        self.signer = signer

    def backup(self, ctx: BoundContext, tenant: str, workspace: str = "") -> bytes:
        call = CallRecord()
        self.core.authorize(ctx, "admin.backup", call, facts=target_facts(Scope(tenant, workspace)))
        if bool(tenant) != bool(workspace):
            raise EngramError(Code.INVALID_SCHEMA, "a scope backup names both tenant and workspace")
        scope = Scope(tenant, workspace) if tenant else None
        with self.core.store.read() as tx:
            if scope is not None and tx.scope(scope) is None:
                raise EngramError(Code.NOT_FOUND, "scope")
            data = build_backup(tx, created_at=self.core.instant(), signer=self.signer, scope=scope)
        manifest = json.loads(data.rstrip(b"\n").rsplit(b"\n", 1)[-1])
        self.core.audit_standalone(ctx, "admin.backup", "ok", manifest["manifest_digest"], call)
        return data

    def restore(self, ctx: BoundContext, data: bytes, key_dir: str, *, trusted_backup_key_pems: tuple[str, ...] = (),
                restore_trusted_host_keys: bool = False, key_store: str = "") -> dict[str, Any]:
        """Restore into an empty store. The backup must verify (BACKUP_INVALID) and be signed by one
        of the backup keys the operator names or this core's own (RESTORE_REFUSED otherwise).
        Trusted host keys in it are restored only with ``restore_trusted_host_keys``.

        Data keys come from ``key_dir``: a file vault, or, with ``key_store`` (the URL of the
        store a PostgreSQL core kept its wrapped keys in: the live database, or one restored
        from a dump taken no earlier than the backup), that store's vault under the ring of
        ``key_dir``. So a backup made on either engine restores on either."""
        call = CallRecord()
        self.core.authorize(ctx, "admin.restore", call)
        try:
            named = public_keys_from_pems(list(trusted_backup_key_pems))
        except ValueError:
            raise EngramError(Code.INVALID_SCHEMA, "trusted backup key is not an Ed25519 public key PEM") from None
        parsed = ParsedBackup(data)
        self._check_signature(parsed, named)
        with self.core.store.read() as tx:
            if not tx.is_empty():
                raise EngramError(Code.RESTORE_REFUSED, "target store is not empty")
        source_dir = Path(key_dir) if key_dir else self.core.data_dir
        if key_store:
            if not key_dir:
                raise EngramError(Code.INVALID_SCHEMA, "a key store needs the key directory of its KEK ring")
            try:
                source = self.core.open_key_dir(source_dir, key_store)
            except ValueError as exc:
                raise EngramError(Code.INVALID_SCHEMA, f"key store: {exc}") from None
        elif source_dir == self.core.data_dir:
            source = self.core.vault
        else:
            source = self.core.open_key_dir(source_dir, None)
        if source is None:
            raise EngramError(Code.RESTORE_REFUSED, "key directory has no key vault")
        created: list[int] = []
        try:
            bodies, lost = self._rekey(parsed, source, created)
            summary = self._write(ctx, call, parsed, bodies, lost, restore_trusted_host_keys)
        except BaseException:
            if created:
                self.core.vault.destroy_many(created)
            raise
        if restore_trusted_host_keys:
            for k in parsed.trusted_keys:
                row = _host_key_row(k, 0)
                self.core.trusted.add(load_public_pem(row.public_key_pem), tenants=row.tenants,
                                      all_tenants=row.all_tenants, maintenance_scopes=row.maintenance_scopes)
        return summary

    def _check_signature(self, parsed: ParsedBackup, named: list) -> None:
        keys = [self.signer.public_key, *named]
        if not isinstance(parsed.signature, dict):
            raise EngramError(Code.RESTORE_REFUSED, "backup is not signed")
        parsed.signed_by = verify_signature(BACKUP_DOMAIN, parsed.manifest_digest, parsed.signature, keys)
        if parsed.signed_by is None:
            claimed = parsed.signature.get("key_id", "?")
            trusted = ", ".join(sorted({key_id(k) for k in keys}))
            raise EngramError(Code.RESTORE_REFUSED, f"backup signature by {claimed} does not verify under any "
                                                    f"trusted backup key ({trusted}); name the source core's "
                                                    "backup public key with --trust-backup-key")

    def _rekey(self, parsed: ParsedBackup, source: KeyVault, created: list[int]):
        """Take each data key from the source vault, verify the body, re-seal under a new target key."""
        bodies: dict[str, tuple[int, bytes, dict[str, Any]]] = {}
        lost: list[RecordRow] = []
        try:
            for rec in parsed.records:
                if rec.state == "tombstoned":
                    continue
                owner, slot = parsed.key_refs[rec.record_id]
                key = source.data_key(slot, owner) if slot >= 0 else None
                wrapped_by = source.generation_of(slot) if key is not None else None
                if wrapped_by is not None and self.core.vault.is_retired(wrapped_by):
                    # A copy of key material older than this store's last retirement: what that
                    # generation alone still opens was destroyed here (docs/admin.md, "Keys").
                    key = None
                    lost.append(rec)
                    continue
                if key is None:
                    if slot >= 0 and not source.is_destroyed(slot):
                        raise EngramError(Code.RESTORE_REFUSED, "key vault does not match the backup")
                    lost.append(rec)  # crypto-shredded since the backup: stays unreadable
                    continue
                try:
                    plaintext = unseal(key, rec.sealed_body or b"", kind="record", owner=rec.record_id)
                    payload = json.loads(plaintext)
                except Exception:
                    raise _invalid("sealed body") from None
                if digest("payload", payload) != rec.payload_digest:
                    raise _invalid("payload digest")
                new_slot, new_key = self.core.vault.new_data_key(owner)
                created.append(new_slot)
                bodies[rec.record_id] = (new_slot, seal(new_key, plaintext, kind="record", owner=rec.record_id), payload)
        finally:
            if source is not self.core.vault:
                source.close()
        return bodies, lost

    def _write(self, ctx: BoundContext, call: CallRecord, parsed: ParsedBackup,
               bodies: dict[str, tuple[int, bytes, dict[str, Any]]], lost: list[RecordRow],
               restore_trusted_host_keys: bool) -> dict[str, Any]:
        now = self.core.now_ms()
        with self.core.store.write() as tx:
            if not tx.is_empty():
                raise EngramError(Code.RESTORE_REFUSED, "target store is not empty")
            for s in parsed.scopes:
                tx.restore_scope(s)
            for e in parsed.events:
                tx.restore_event(e)
            for row in parsed.audit:
                tx.restore_audit_row(row)
            for rec in parsed.records:
                if rec.record_id in bodies:
                    slot, sealed, payload = bodies[rec.record_id]
                    tx.insert_record(RecordRow(**{**asdict(rec), "sealed_body": sealed, "key_slot": slot}))
                    tx.put_data_key(f"record:{rec.record_id}", slot, now)
                    tx.index_record(Scope(rec.tenant, rec.workspace), rec.record_id, record_fields(payload, self.core.hasher),
                                    self.mutations.embed_record(payload))
                    write_links(tx, Scope(rec.tenant, rec.workspace), rec.record_id, payload_links(payload))
                else:
                    tx.insert_record(rec)
            for t in parsed.tombstones:
                tx.add_tombstone(Scope(t["tenant"], t["workspace"]), t["payload_digest"], t["record_id"], int(t["cursor"]),
                                 int(t["at_ms"]))
            for d in parsed.key_destructions:
                # The generation that wrapped it at the source; this vault's active one when the
                # backup does not say (pending until it retires, never claimed complete early).
                generation = int(d["generation"]) if "generation" in d else self.core.vault.active_generation()
                tx.restore_key_destruction(d["owner"], int(d["at_ms"]), d["reason"], generation)
            if restore_trusted_host_keys:
                for k in parsed.trusted_keys:
                    # The id is recomputed from the key: a line cannot name one key and carry another.
                    # It comes back serving what it served (a key that served nothing there, such as
                    # the source's own host.key, serves nothing until bound).
                    tx.bind_trusted_host_key(_host_key_row(k, now))
            shredded = []
            for rec in lost:
                # The key was destroyed after the backup (forget): record that fact, never the body.
                event = tx.append_event(
                    Scope(rec.tenant, rec.workspace), event_id=new_id("evt_"), operation="tombstone", target=rec.record_id,
                    from_state=rec.state, to_state="tombstoned", at_ms=now,
                    body={"reason_ref": "restore:data-key-destroyed", "decisions": call.summaries(),
                          "audit_id": ctx.audit_id})
                tx.set_record_state(rec.record_id, "tombstoned", state_cursor=event.cursor, drop_body=True)
                tx.add_tombstone(Scope(rec.tenant, rec.workspace), rec.payload_digest, rec.record_id, event.cursor, now)
                tx.restore_key_destruction(f"record:{rec.record_id}", now, "destroyed before restore",
                                           self.core.vault.active_generation())
                shredded.append(rec.record_id)
            tx.append_audit(self.core.audit_row(ctx, "admin.restore", "ok", "", call))
        self.core.store.analyze()  # the planner has no statistics of what one transaction just filled
        return {"scopes": len(parsed.scopes), "events": len(parsed.events), "records_restored": len(bodies),
                "records_unrecoverable": sorted(shredded), "audit_rows": len(parsed.audit),
                "trusted_host_keys_restored": len(parsed.trusted_keys) if restore_trusted_host_keys else 0,
                "trusted_host_keys_skipped": 0 if restore_trusted_host_keys else len(parsed.trusted_keys),
                "signed_by": parsed.signed_by,
                "tombstones": len(parsed.tombstones) + len(shredded)}
