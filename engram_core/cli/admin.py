"""`engram admin --core HOST:PORT --host-key FILE <command>`: maintenance over AdminService.

Each call is signed with the host key as a host principal holding the
maintenance scopes; the core's policy decides whether that is enough.
Command names and flags are a public interface. Output is a short human
summary by default and the server's JSON document with ``--json``; progress
of long operations goes to stderr so stdout stays scriptable.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from engram_core.cli import migrate_schema, migrate_store
from engram_core.cli.channel import admin_metadata, client_tls, core_channel


def _print(args: argparse.Namespace, value: dict[str, Any], human: str) -> None:
    if args.json:
        print(json.dumps(value, sort_keys=True))
    else:
        print(human)


def _activation(args: argparse.Namespace, *, activated: bool) -> int:
    from engram_core.api import admin_pb2, admin_pb2_grpc

    with core_channel(args) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        rpc = stub.Activate if activated else stub.Deactivate
        result = rpc(admin_pb2.ActivateRequest(tenant=args.tenant, workspace=args.workspace, tools=args.tool or []),
                     metadata=admin_metadata(args.host_key), timeout=args.timeout)
    value = json.loads(result.json)
    state = "active" if value["activated"] else "inactive"
    _print(args, value, f"{value['tenant']}/{value['workspace']}: memory {state}; tools: {', '.join(value['tools']) or '(none)'}")
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=30.0, help="per-call deadline in seconds (default: %(default)s)")
    sub = parser.add_subparsers(dest="admin_command", required=True)
    for name, activated in (("activate", True), ("deactivate", False)):
        p = sub.add_parser(name, help=f"{name} memory (or single tools) for a tenant+workspace")
        p.add_argument("--tenant", required=True)
        p.add_argument("--workspace", required=True)
        p.add_argument("--tool", action="append", help="only this tool (repeatable); default all six")
        p.set_defaults(func=lambda a, act=activated: _run(a, lambda: _activation(a, activated=act)))
    register_more(sub, _run)
    migrate_store.register(sub)  # offline: it opens the two stores itself, no --core
    migrate_schema.register(sub)  # `migrate --store URL`: offline, as the schema's owner


def _run(args: argparse.Namespace, fn) -> int:
    from engram_core.rpc.status import error_from_rpc_error, operator_detail

    if not args.host_key:
        print("engram admin: --host-key KEY is required (the host signing key, PEM)", file=sys.stderr)
        return 2
    if not Path(args.host_key).exists():
        print(f"engram admin: host key {args.host_key} not found", file=sys.stderr)
        return 2
    try:
        client_tls(args)  # unreadable TLS files: one line, before any call
    except ValueError as exc:
        print(f"engram admin: {exc}", file=sys.stderr)
        return 2
    try:
        return fn()
    except grpc.RpcError as err:
        error = error_from_rpc_error(err)  # the constant message of its code and reason class
        code, detail = error.code, operator_detail(err)
        if args.json:
            print(json.dumps({"ok": False, "code": code.value, "message": error.message, "detail": detail}))
        else:
            print(f"engram admin: {code.value}: {error.message}", file=sys.stderr)
        if detail:
            print(f"engram admin: reason: {detail}", file=sys.stderr)
        return 1
    except CliInputError as err:
        print(f"engram admin: {err}", file=sys.stderr)
        return 2


# -- maintenance commands beyond activation (SPEC §12, §14) ---------------------------------
READ_SCOPES = ("read",)
ALL_SCOPES = ("read", "maintain")

# command -> (lifecycle operation, needs successor, needs to_state, target kind)
TRANSITIONS: dict[str, tuple[str, bool, bool, str]] = {
    "dispute": ("dispute", False, False, "record"),
    "resolve": ("resolve_dispute", False, True, "record"),
    "supersede": ("supersede", True, False, "record"),
    "mark-non-current": ("mark_non_current", False, False, "record"),
    "rewind": ("rewind", True, False, "record"),
    "trust-invalidate": ("trust_invalidate", False, False, "record"),
    "tombstone": ("tombstone", False, False, "record"),
    "reject": ("reject", False, False, "candidate"),
    "withdraw": ("withdraw", False, False, "candidate"),
}


def _progress(message: str) -> None:
    print(f"engram admin: {message}", file=sys.stderr, flush=True)


def _stub(channel: grpc.Channel):
    from engram_core.api import admin_pb2_grpc

    return admin_pb2_grpc.AdminServiceStub(channel)


def _call(args: argparse.Namespace, rpc: str, request: Any, scopes: tuple[str, ...] = ALL_SCOPES) -> dict[str, Any]:
    with core_channel(args) as channel:
        result = getattr(_stub(channel), rpc)(request, metadata=admin_metadata(args.host_key, scopes=scopes),
                                              timeout=args.timeout)
    return json.loads(result.json)


def _emit(args: argparse.Namespace, value: dict[str, Any], human: str) -> int:
    print(json.dumps(value, sort_keys=True) if args.json else human)
    return 0


def _scope_flags(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--tenant", required=required, default="")
    p.add_argument("--workspace", required=required, default="")


def _scope_req(args: argparse.Namespace, **kw: Any):
    from engram_core.api import admin_pb2

    return admin_pb2.ScopeRequest(tenant=getattr(args, "tenant", ""), workspace=getattr(args, "workspace", ""), **kw)


# -- commands ------------------------------------------------------------------------------
def _transition(args: argparse.Namespace, op: str) -> int:
    from engram_core.api import admin_pb2

    event_id = args.event_id or "evt_host_" + secrets.token_hex(12)
    req = admin_pb2.TransitionRequest(tenant=args.tenant, workspace=args.workspace, operation=op, target=args.target,
                                      successor=getattr(args, "successor", "") or "",
                                      to_state=getattr(args, "to", "") or "", reason_ref=args.reason,
                                      event_id=event_id)
    value = _call(args, "Transition", req)
    r = value["receipt"]
    note = " (replayed)" if value.get("replayed") else ""
    return _emit(args, value, f"{op} {args.target}: {r['from_state']} -> {r['to_state']} at cursor {r['cursor']}"
                              f"{note}; event id {event_id}")


def _adjudicate(args: argparse.Namespace) -> int:
    from engram_core.api import admin_pb2

    event_id = args.event_id or "evt_host_" + secrets.token_hex(12)
    value = _call(args, "Adjudicate", admin_pb2.AdjudicateRequest(
        tenant=args.tenant, workspace=args.workspace, candidate_id=args.candidate, decision=args.decision,
        reason_ref=args.reason, event_id=event_id))
    o = value["outcome"]
    return _emit(args, value, f"{o['candidate_id']}: {o['status']}" + (f" as {o['record_id']}" if "record_id" in o else "")
                 + f"; event id {event_id}")


def _adjudication_list(args: argparse.Namespace) -> int:
    value = _call(args, "ListAdjudication", _scope_req(args), READ_SCOPES)
    lines = [f"{c['candidate_id']}  {c['payload_digest']}  {c['sizes'].get('payload_bytes', '?')} B  "
             f"{','.join(c['reasons']) or '-'}" for c in value["candidates"]]
    return _emit(args, value, "\n".join(lines) or "no candidates pending adjudication")


def _expire(args: argparse.Namespace) -> int:
    value = _call(args, "ExpireSweep", _scope_req(args))
    n = sum(len(s["expired"]) for s in value["scopes"])
    return _emit(args, value, f"expired {n} record(s) in {len(value['scopes'])} scope(s)")


def _history(args: argparse.Namespace) -> int:
    from engram_core.api import admin_pb2

    value = _call(args, "History", admin_pb2.HistoryRequest(tenant=args.tenant, workspace=args.workspace,
                                                            record_id=args.record or "", disputed_only=args.disputed),
                  READ_SCOPES)
    lines = [f"{r['record_id']}  {r['state']}  accepted@{r['accepted_cursor']}" for r in value["records"]]
    lines += [f"  {e['cursor']:>6}  {e['operation']}  {e['from_state'] or '-'} -> {e['to_state']}"
              for e in value.get("events", [])]
    return _emit(args, value, "\n".join(lines) or "no records")


def _inspect(args: argparse.Namespace) -> int:
    from engram_core.api import admin_pb2

    if args.candidate.startswith("mem_"):  # record ids never name candidates (docs/contract.md §4)
        print(f"engram admin: {args.candidate} is a record id; inspect takes a candidate id. For a record: "
              f"engram admin history --tenant {args.tenant} --workspace {args.workspace} --record {args.candidate}",
              file=sys.stderr)
        return 2
    value = _call(args, "InspectCandidate", admin_pb2.InspectRequest(
        tenant=args.tenant, workspace=args.workspace, candidate_id=args.candidate), READ_SCOPES)
    return _emit(args, value, json.dumps(value, indent=2, sort_keys=True))


def _export(args: argparse.Namespace) -> int:
    from engram_core.api import admin_pb2

    value = _call(args, "Export", admin_pb2.ExportRequest(
        tenant=args.tenant, workspace=args.workspace, what=args.what, from_cursor=args.from_cursor or "",
        to_cursor=args.to_cursor or ""), READ_SCOPES)
    if args.out:
        with _open_private(Path(args.out)) as f:
            f.write("".join(json.dumps(i, sort_keys=True) + "\n" for i in value["items"]).encode())
        return _emit(args, {"count": value["count"], "out": args.out}, f"wrote {value['count']} {args.what} rows to {args.out}")
    return _emit(args, value, "\n".join(json.dumps(i, sort_keys=True) for i in value["items"]))


def _verify(args: argparse.Namespace) -> int:
    anchor = _read_inputs([args.anchor], "anchor")[0] if args.anchor else ""
    keys = _read_inputs(args.anchor_key, "anchor public key")
    value = _call(args, "Verify", _scope_req(args, report_only=args.report or bool(args.device), anchor_json=anchor,
                                             anchor_key_pem=keys), READ_SCOPES)
    bad = [f"{s['tenant']}/{s['workspace']}: {p['problem']} at cursor {p['cursor']}" for s in value["scopes"] for p in s["problems"]]
    bad += [f"audit{' ' + p['chain'] if p.get('chain') else ''}: {p['problem']} at seq {p['seq']}"
            for p in value["audit"]["problems"]]
    bad += [f"anchor: {p['problem']}" + (f" ({p['chain']} at {p.get('seq') or p.get('cursor')})" if "chain" in p else "")
            for p in value.get("anchor", {}).get("problems", [])]
    if args.device:
        from engram_core.store.audit_device import check_device_files

        value["device"] = check_device_files([Path(d) for d in args.device], _audit_rows(args))
        bad += [f"device{' ' + p['chain'] if p.get('chain') else ''}: {p['problem']} at seq {p['seq']}"
                for p in value["device"]["problems"]]
        value["ok"] = value["ok"] and value["device"]["ok"]
    checked = (f"{len(value['scopes'])} journal(s), {value['audit']['rows']} audit rows on "
               f"{value['audit'].get('chains', 1)} chain(s)")
    if "anchor" in value:
        checked += f", anchor of {value['anchor']['created_at']} (key {value['anchor']['key_id']})"
    if "device" in value:
        checked += f", {value['device']['lines']} device lines"
    value["limits"] = _verify_limits(value)
    if len(args.device) == 1 and any(p["problem"] == "device_missing" for p in value.get("device", {}).get("problems", [])):
        # One core's device holds only the rows that core wrote: with several cores, rows of the
        # others are "missing" from it until every core's device is named.
        value["limits"].append("rows are missing from the one device named: if several cores serve this store, "
                               "name every core's device (repeat --device FILE)")
    human = "verified: " + checked + ", all chains intact" if value["ok"] else "JOURNAL_CORRUPT\n" + "\n".join(bad)
    human += "".join(f"\nnote: {limit}" for limit in value["limits"])
    _emit(args, value, human)
    return 0 if value["ok"] else 1


def _verify_limits(value: dict[str, Any]) -> list[str]:
    """What this verification could not detect (docs/security.md, "A rewritten audit log"): a hash
    chain is only consistent with itself, so whoever can write the data directory can cut the
    log back, rewrite rows and chain them again. Only an anchor or a device shows that."""
    if "anchor" not in value and "device" not in value:
        return ["the chains were checked against themselves only: an audit log or journal cut back (or rows "
                "rewritten) and re-chained by someone who can write the data directory passes this check; "
                "verify against a signed anchor (--anchor FILE --anchor-key PEM, from `engram admin anchor`) "
                "or an audit device (--device FILE, from `engram serve --audit-device`) to detect that"]
    if "device" not in value:
        return ["rows after the anchor's heads were checked against their own chains only: "
                "add --device FILE to cover them"]
    return []


# Rows per Export call: well inside the gRPC message limit (~300 B a row). ENGRAM_AUDIT_PAGE_ROWS
# overrides it (tests use a tiny page to cross page boundaries).
AUDIT_PAGE = 10_000


def _audit_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every audit row of the store, fetched in seq ranges (each range over every chain) until a
    range comes back empty."""
    from engram_core.api import admin_pb2

    size = int(os.environ.get("ENGRAM_AUDIT_PAGE_ROWS", AUDIT_PAGE))
    rows: list[dict[str, Any]] = []
    start = 1
    while True:
        page = _call(args, "Export", admin_pb2.ExportRequest(what="audit", from_cursor=str(start),
                                                             to_cursor=str(start + size - 1)), READ_SCOPES)
        if not page["items"]:
            return rows
        rows += page["items"]
        start += size


def _anchor(args: argparse.Namespace) -> int:
    value = _call(args, "Anchor", _scope_req(args), READ_SCOPES)
    with _open_private(Path(args.out)) as f:
        f.write((json.dumps(value, sort_keys=True, indent=1) + "\n").encode())
    return _emit(args, {"out": args.out, **value},
                 f"anchored {len(value['audit_chains'])} audit chain head(s) and {len(value['journals'])} journal "
                 f"head(s) in {args.out}; signed by anchor key {value['signature']['key_id']}")


def _signing_keys(args: argparse.Namespace) -> int:
    value = _call(args, "SigningKeys", _scope_req(args), READ_SCOPES)
    lines = []
    for role in ("backup", "anchor"):
        if args.out_dir:
            path = Path(args.out_dir) / f"{role}.pub"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value[role]["public_key_pem"])
            value[role]["file"] = str(path)
        lines.append(f"{role}: {value[role]['key_id']}" + (f" -> {value[role]['file']}" if args.out_dir else ""))
    if not args.out_dir:
        lines += [value[r]["public_key_pem"].rstrip() for r in ("backup", "anchor")]
    return _emit(args, value, "\n".join(lines))


def _rotate(args: argparse.Namespace) -> int:
    _progress("rotating the store key and re-wrapping data keys …")
    value = _call(args, "RotateKeys", _scope_req(args))
    _progress("rotation complete")
    return _emit(args, value, f"active KEK {value['active_kek']}; re-wrapped {value['rewrapped']} data key(s); "
                              f"retired KEKs {value['retired_keks'] or 'none'}; bodies rewritten: 0")


def _key_status(args: argparse.Namespace) -> int:
    value = _call(args, "KeyStatus", _scope_req(args), READ_SCOPES)
    v = value["vault"]
    generations = value.get("generations", [])
    by_state: dict[str, int] = {}
    for g in generations:
        by_state[g["state"]] = by_state.get(g["state"], 0) + 1
    ring = ", ".join(f"{n} {state}" for state, n in sorted(by_state.items())) or "none listed"
    human = (f"active KEK generation {v['active_kek']}; {len(generations)} generation(s): {ring}; "
             f"{value['live_data_keys']} live data keys, {value['destroyed_data_keys']} destroyed "
             f"({value.get('destructions_pending', 0)} destruction(s) pending until the generations that "
             "wrapped them retire)")
    for g in generations:
        # Each date says what it is: one column for several meanings misread "retires after" as done.
        dates = [f"{label} {g[key]}" for key, label in (("created_at", "created"), ("deactivated_at", "deactivated"),
                                                         ("retires_after", "retires after"),
                                                         ("retired_at", "retired")) if g.get(key)]
        human += f"\ngeneration {g['generation']}  {g['state']}" + ("  " + ", ".join(dates) if dates else "")
    for r in value.get("scope", {}).get("records", []):
        human += f"\n{r['record_id']}  {r['state']}  key {r['key']}"
        if "destruction" in r:
            human += f"  destruction {r['destruction']}"
    return _emit(args, value, human)


def _retire(args: argparse.Namespace) -> int:
    from engram_core.api import admin_pb2

    value = _call(args, "RetireKeys", admin_pb2.RetireKeysRequest(now=args.now))
    return _emit(args, value, f"retired KEK generations: {value['retired_keks'] or 'none'}")


def _revoke(args: argparse.Namespace) -> int:
    value = _call(args, "Revoke", _scope_req(args))
    return _emit(args, value, f"{args.tenant}/{args.workspace}: authorization epoch now {value['authorization_epoch']}; "
                              "older contexts and grants are refused")


def _binding_text(b: dict[str, Any]) -> str:
    if b["local"]:
        return "the operator's own key: every tenant, every maintenance scope"
    if b["all_tenants"]:
        tenants = "every tenant"
    else:
        tenants = ("tenants " + ", ".join(b["tenants"])) if b["tenants"] else "no tenant"
    return f"{tenants}; maintenance scopes: {', '.join(b['maintenance_scopes']) or 'none'}"


def _host_key(args: argparse.Namespace, trust: bool) -> int:
    from engram_core.api import admin_pb2

    pem = _read_inputs([args.public_key], "host public key")[0] if args.public_key else ""
    if not trust:
        value = _call(args, "UntrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=pem, key_id=args.key_id or ""))
        return _emit(args, value, f"host key {value['key_id']}: no longer trusted")
    if not pem:
        raise CliInputError("trust-host-key needs --public-key PEM")
    if bool(args.tenant) == args.all_tenants:
        raise CliInputError("trust-host-key needs --tenant T (repeatable) or --all-tenants: the tenants the key serves")
    value = _call(args, "TrustHostKey", admin_pb2.HostKeyRequest(
        public_key_pem=pem, key_id=args.key_id or "", tenants=args.tenant, all_tenants=args.all_tenants,
        maintenance_scopes=args.maintenance_scope))
    return _emit(args, value, f"host key {value['key_id']}: trusted for {_binding_text(value['binding'])}")


def _list_host_keys(args: argparse.Namespace) -> int:
    value = _call(args, "ListHostKeys", _scope_req(args), READ_SCOPES)
    lines = [f"{k['id']}  {_binding_text(k)}" + ("" if k["stored"] or k["local"] else "  (not stored)")
             for k in value["host_keys"]]
    return _emit(args, value, "\n".join(lines) or "no trusted host keys")


class CliInputError(Exception):
    """A local input the command cannot use (unreadable key or anchor file): exit 2."""


def _read_inputs(paths: list[str], what: str) -> list[str]:
    try:
        return [Path(p).read_text() for p in paths]
    except OSError as exc:
        raise CliInputError(f"cannot read {what} {exc.filename}: {exc.strerror}") from None


def _open_private(path: Path):
    """A file only the owner can read (0600), even if one was already there with a wider mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "wb")


def _backup(args: argparse.Namespace) -> int:
    from engram_core.api import admin_pb2

    received = 0
    out = Path(args.out)
    tmp = out.with_name(out.name + ".partial")
    # Backups hold sealed bodies, the journal and the audit log: owner-only from the first byte.
    with core_channel(args) as channel, _open_private(tmp) as f:
        request = admin_pb2.ScopeRequest(tenant=args.tenant or "", workspace=args.workspace or "")
        for chunk in _stub(channel).Backup(request, metadata=admin_metadata(args.host_key), timeout=args.timeout):
            f.write(chunk.data)
            received += len(chunk.data)
            _progress(f"backup {received}/{chunk.total_bytes} bytes")
    tmp.replace(out)  # never leave a truncated file under the final name
    manifest = json.loads(out.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1])
    value = {"out": str(out), "bytes": received, "manifest_digest": manifest["manifest_digest"],
             "counts": manifest["counts"], "signed_by": manifest["signature"]["key_id"]}
    return _emit(args, value, f"wrote {received} bytes to {out}; manifest {manifest['manifest_digest']}; "
                              f"signed by backup key {manifest['signature']['key_id']}")


def _restore(args: argparse.Namespace) -> int:
    from engram_core.api import admin_pb2

    data = Path(args.in_file).read_bytes()
    pems = _read_inputs(args.trust_backup_key, "backup public key")
    step = 1 << 20

    def stream() -> Iterator[Any]:
        for i in range(0, max(len(data), 1), step):
            _progress(f"restore sent {min(i + step, len(data))}/{len(data)} bytes")
            if i == 0:
                yield admin_pb2.BackupChunk(data=data[i:i + step], total_bytes=len(data), key_dir=args.key_dir or "",
                                            key_store=args.key_store or "", trusted_backup_key_pem=pems,
                                            restore_trusted_host_keys=args.restore_trusted_host_keys)
            else:
                yield admin_pb2.BackupChunk(data=data[i:i + step], total_bytes=len(data))

    with core_channel(args) as channel:
        result = _stub(channel).Restore(stream(), metadata=admin_metadata(args.host_key), timeout=args.timeout)
    _progress("restore verified and committed")
    value = json.loads(result.json)
    return _emit(args, value, f"restored {value['records_restored']} record(s) in {value['scopes']} scope(s); "
                              f"unrecoverable (key destroyed): {len(value['records_unrecoverable'])}; "
                              f"signed by {value['signed_by']}; trusted host keys restored: "
                              f"{value['trusted_host_keys_restored']}, skipped: {value['trusted_host_keys_skipped']}")


def _migrate(args: argparse.Namespace) -> int:
    value = _call(args, "Migrate", _scope_req(args))
    head = value["ledger"][-1]["version"] if value["ledger"] else 0
    return _emit(args, value, f"schema at version {head}; applied now: {value['applied'] or 'none'}")


def _projections(args: argparse.Namespace, rebuild: bool) -> int:
    if rebuild:
        _progress(f"rebuilding projections of {args.tenant}/{args.workspace} …")
    value = _call(args, "RebuildProjections" if rebuild else "InvalidateProjections", _scope_req(args))
    if rebuild:
        human = f"re-indexed {value['records_indexed']} record(s); receipt {value['receipt_digest']}"
    else:
        human = f"removed {value['removed']['postings']} postings, {value['removed']['vectors']} vectors; receipt {value['receipt_digest']}"
    return _emit(args, value, human)


def _reload(args: argparse.Namespace) -> int:
    value = _call(args, "ReloadPolicies", _scope_req(args))
    if value.get("outcome") != "refused":
        return _emit(args, value, f"policy revision {value['revision']} (was {value['previous_revision']})")
    problem = value.get("problem") or {}
    where = ":".join(str(p) for p in (problem.get("file"), problem.get("line")) if p)
    active = f"revision {value['revision']} still active" if value.get("revision") else "no revision active"
    _emit(args, value, f"refused; {active}: {where + ': ' if where else ''}{problem.get('error', '')}")
    return 1


def _record_digest_of(args: argparse.Namespace) -> str:
    """The digest the verifier signs: a record id encodes it; a candidate's comes from inspect."""
    import base64

    target = args.target
    if target.startswith("mem_"):
        raw = target.removeprefix("mem_").upper()
        return "sha256:" + base64.b32decode(raw + "=" * (-len(raw) % 8)).hex()
    from engram_core.api import admin_pb2

    view = _call(args, "InspectCandidate", admin_pb2.InspectRequest(
        tenant=args.tenant, workspace=args.workspace, candidate_id=target), READ_SCOPES)
    return view["record_digest"]


def _attest(args: argparse.Namespace) -> int:
    """Host verifier attestation (HostService.Attest): signed with --verifier-key, or earned."""
    from engram_core.api import host_pb2, host_pb2_grpc
    from engram_core.services.attestation import sign_attestation
    from engram_core.trust.hostkeys import load_private_key_file, public_pem

    pem, signature = "", b""
    if args.trust_class == "signed":
        if not args.verifier_key:
            print("engram admin: attest --trust-class signed needs --verifier-key", file=sys.stderr)
            return 2
        key = load_private_key_file(Path(args.verifier_key))
        pem, signature = public_pem(key.public_key()), sign_attestation(key, _record_digest_of(args))
    event_id = args.event_id or "evt_host_" + secrets.token_hex(12)
    with core_channel(args) as channel:
        result = host_pb2_grpc.HostServiceStub(channel).Attest(host_pb2.AttestRequest(
            tenant=args.tenant, workspace=args.workspace, target=args.target, trust_class=args.trust_class,
            event_id=event_id, reason_ref=args.reason, verifier_public_key_pem=pem, signature=signature),
            metadata=admin_metadata(args.host_key, scopes=ALL_SCOPES, call="host"), timeout=args.timeout)
    value = json.loads(result.json)
    r = value["receipt"]
    note = " (replayed)" if value.get("replayed") else ""
    by = f" by {r['verifier_key_id']}" if r["verifier_key_id"] else ""
    return _emit(args, value, f"{args.target}: {r['previous_trust_class']} -> {r['trust_class']}{by} at cursor "
                              f"{r['cursor']}{note}; event id {event_id}")


# -- registration --------------------------------------------------------------------------
def register_more(sub: argparse._SubParsersAction, run: Callable[[argparse.Namespace, Callable[[], int]], int]) -> None:
    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str, *, scope: str | None = "required"):
        p = sub.add_parser(name, help=help)
        if scope is not None:
            _scope_flags(p, required=scope == "required")
        p.set_defaults(func=lambda a: run(a, lambda: fn(a)))
        return p

    for name, (op, successor, to_state, kind) in TRANSITIONS.items():
        p = add(name, lambda a, op=op: _transition(a, op), f"{op} a {kind} (host lifecycle, docs/contract.md §6)")
        p.add_argument("target", metavar="RECORD_ID" if kind == "record" else "CANDIDATE_ID")
        if successor:
            p.add_argument("--successor", required=True, help="record id of the successor")
        if to_state:
            p.add_argument("--to", required=True, choices=("accepted_current", "historical"))
        p.add_argument("--reason", default="reason:operator", help="reason_ref recorded in the journal")
        p.add_argument("--event-id", default="", help="idempotency id; reuse it to retry (default: new)")

    p = add("attest", _attest, "attest a candidate or record as signed (verifier key) or earned (host verifier)")
    p.add_argument("target", metavar="RECORD_OR_CANDIDATE_ID")
    p.add_argument("--trust-class", required=True, choices=("signed", "earned"))
    p.add_argument("--verifier-key", default="", help="signed: the verifier's Ed25519 private key (PEM file)")
    p.add_argument("--reason", default="reason:operator", help="reason_ref recorded in the journal")
    p.add_argument("--event-id", default="", help="idempotency id; reuse it to retry (default: new)")
    p = add("adjudicate", _adjudicate, "accept or reject a candidate pending adjudication")
    p.add_argument("candidate")
    p.add_argument("--decision", required=True, choices=("accept", "reject"))
    p.add_argument("--reason", default="reason:operator")
    p.add_argument("--event-id", default="")
    add("adjudication-list", _adjudication_list, "list candidates pending adjudication (redacted)")
    add("expire", _expire, "expire records whose expires_at passed (all scopes without --tenant)", scope="optional")
    p = add("history", _history, "records of a scope with states; one record's journal with --record")
    p.add_argument("--record", default="")
    p.add_argument("--disputed", action="store_true", help="only accepted_disputed records")
    p = add("inspect", _inspect, "a candidate's structure (no body)")
    p.add_argument("candidate")
    p = add("export", _export, "journal or audit rows for a scope and cursor range", scope="optional")
    p.add_argument("what", choices=("journal", "audit"))
    p.add_argument("--from", dest="from_cursor", default="")
    p.add_argument("--to", dest="to_cursor", default="")
    p.add_argument("--out", default="", help="write JSON lines here instead of stdout")
    p = add("verify", _verify, "verify journal and audit hash chains (exit 1 on JOURNAL_CORRUPT)", scope="optional")
    p.add_argument("--report", action="store_true", help="print the report even when a chain is broken")
    p.add_argument("--anchor", default="", metavar="FILE",
                   help="an anchor from `engram admin anchor`: the chains must still reach its heads")
    p.add_argument("--anchor-key", action="append", default=[], metavar="PEM",
                   help="anchor public key the anchor must be signed by (repeatable; default: the core's own)")
    p.add_argument("--device", action="append", default=[], metavar="FILE",
                   help="an audit device file (`engram serve --audit-device file:…`): every audit row must be on it; "
                        "repeat it with every core's device when several cores serve one store")
    p = add("anchor", _anchor, "write the signed heads of every journal (or one scope's) and the audit chain",
            scope="optional")
    p.add_argument("--out", required=True, help="anchor file (keep it outside the data directory)")
    p = add("signing-keys", _signing_keys, "the core's backup and anchor public keys", scope=None)
    p.add_argument("--out-dir", default="", help="write backup.pub and anchor.pub here")
    add("rotate-keys", _rotate, "rotate the store KEK and re-wrap every data key", scope=None)
    p = add("retire-keys", _retire, "retire KEK generations past their retention (completes key destructions)",
            scope=None)
    p.add_argument("--now", action="store_true",
                   help="retire every retained generation no live key needs, whatever its retention "
                        "(backups and key copies made under them stop restoring)")
    add("key-status", _key_status, "KEK and data-key destruction status", scope="optional")
    add("revoke", _revoke, "bump the authorization epoch of a scope")
    p = add("trust-host-key", lambda a: _host_key(a, True),
            "trust a host key for the tenants (and maintenance scopes) it serves, or change what it serves",
            scope=None)
    p.add_argument("--public-key", default="", help="PEM file of the host public key")
    p.add_argument("--key-id", default="", help="the key id the key must have (a check)")
    p.add_argument("--tenant", action="append", default=[], metavar="T",
                   help="a tenant the key may act for (repeatable)")
    p.add_argument("--all-tenants", action="store_true", help="the key may act for every tenant")
    p.add_argument("--maintenance-scope", action="append", default=[], choices=("read", "maintain"),
                   help="a maintenance scope the key may sign for (repeatable; default none: agent and host "
                        "calls of its tenants only)")
    p = add("untrust-host-key", lambda a: _host_key(a, False), "remove a trusted host key", scope=None)
    p.add_argument("--public-key", default="", help="PEM file of the host public key")
    p.add_argument("--key-id", default="")
    add("list-host-keys", _list_host_keys, "the trusted host keys and the tenants and scopes each serves", scope=None)
    p = add("backup", _backup, "stream a verified logical backup of the whole store (or of one scope) to a file",
            scope="optional")
    p.add_argument("--out", required=True)
    p = add("restore", _restore, "restore a backup into an empty store", scope=None)
    p.add_argument("--in", dest="in_file", required=True)
    p.add_argument("--key-dir", default="", help="key-vault directory (store.kek, datakeys.bin) on the core's host; "
                                                 "with --key-store, that store's key directory (its KEK ring)")
    p.add_argument("--key-store", default="", metavar="URL",
                   help="the PostgreSQL store the backup's data keys are wrapped in (a backup made by a core "
                        "serving --store URL); its password from PGPASSFILE on the core's host, never in URL")
    p.add_argument("--trust-backup-key", action="append", default=[], metavar="PEM",
                   help="backup public key of the core that made the backup (repeatable; the restoring core's "
                        "own is always trusted); see `engram admin signing-keys`")
    p.add_argument("--restore-trusted-host-keys", action="store_true",
                   help="also trust the host keys the backup lists (default: they are skipped)")
    add("migrate", _migrate, "verify the migration ledger and apply pending migrations", scope=None)
    add("invalidate-projections", lambda a: _projections(a, False), "drop the lexical and vector projections of a scope")
    add("rebuild-projections", lambda a: _projections(a, True), "rebuild the projections of a scope from sealed bodies")
    add("reload-policies", _reload, "reload the policy bundle", scope=None)
