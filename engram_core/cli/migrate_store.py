"""``engram admin migrate-store``: move an embedded (DuckDB) store into PostgreSQL.

It is a backup and a restore, done for the operator with nothing in between to get wrong: the
source directory is opened by a core of its own (so its flock proves no other core serves it),
a backup streamed from it over loopback gRPC is restored into the empty database by a core
serving ``--store URL --key-dir DIR``, bodies re-sealed under fresh data keys of the new store's
vault (the source's KEK ring is never copied), trusted host keys with what each serves, and
journal, tombstones, key destructions and the audit chain as they were. Both cores authorize and
audit the two calls as for any operator (``admin.backup``, ``admin.restore``).

The key directory is made for the new store when it is new or empty, with the source's
``host.key`` (hosts keep signing with the key they have), ``backup.key`` and ``anchor.key``
(anchors and backups taken before keep verifying as the core's own) copied in; a key directory
that already holds files keeps them. The source is left as it was: it still opens every migrated
record, so delete it once the new store serves (docs/admin.md, "Moving a store to PostgreSQL").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import grpc

COPIED_KEYS = ("host.key", "backup.key", "anchor.key")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate-store", help="move an embedded (DuckDB) store into an empty PostgreSQL database")
    p.add_argument("--from", dest="source", required=True, metavar="DIR",
                   help="the data directory of the DuckDB store (no core may be serving it)")
    p.add_argument("--to", dest="target", required=True, metavar="URL",
                   help="the PostgreSQL store (a libpq URL or service name; its password from PGPASSFILE or "
                        "the libpq environment, never in URL); its database must hold no Engram data")
    p.add_argument("--key-dir", required=True, metavar="DIR",
                   help="the new store's key directory, which every core serving it mounts")
    p.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"engram admin migrate-store: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from engram_core.app.engines import StoreConfig
    from engram_core.contract.errors import EngramError

    source, key_dir = Path(args.source), Path(args.key_dir)
    if not (source / "engram.duckdb").is_file() or not (source / "store.kek").is_file():
        return _fail(f"{source} holds no DuckDB store (engram.duckdb and store.kek)")
    try:
        StoreConfig.from_options(key_dir, args.target)
    except ValueError as exc:
        return _fail(str(exc))
    if key_dir.resolve() == source.resolve():
        return _fail("--key-dir must not be the source directory (the new store's ring is its own)")
    made_key_dir = not key_dir.exists()
    copied = _prepare_key_dir(source, key_dir)
    try:
        value = _migrate(source, key_dir, args.target)
    except EngramError as exc:
        _undo(key_dir, copied, made_key_dir)
        if exc.code.value == "FENCE_LOST":
            # The source's flock is held: a core still serves it. Retrying cannot help until it stops.
            return _fail(f"a core is still serving {source} (it holds the store's lock): stop that core, "
                         "then run this command again")
        return _fail(f"{exc.code.value}: {exc.message}")
    except grpc.RpcError as err:
        from engram_core.rpc.status import error_from_rpc_error, operator_detail

        _undo(key_dir, copied, made_key_dir)
        error = error_from_rpc_error(err)
        detail = operator_detail(err)
        return _fail(f"{error.code.value}: {error.message}" + (f" ({detail})" if detail else ""))
    except BaseException:
        _undo(key_dir, copied, made_key_dir)
        raise
    value["key_files_copied"] = copied
    if args.json:
        print(json.dumps(value, sort_keys=True))
    else:
        print(f"moved {value['records_restored']} record(s) in {value['scopes']} scope(s) into {value['store']}; "
              f"unrecoverable (key destroyed): {len(value['records_unrecoverable'])}; trusted host keys: "
              f"{value['trusted_host_keys_restored']}; key files copied: {', '.join(copied) or 'none'}")
        print(f"serve it with: engram serve --store '{args.target}' --key-dir {key_dir}")
        if "host.key" in copied:
            print(f"re-point every host TOML whose signing_key names {source / 'host.key'} to "
                  f"{key_dir / 'host.key'} (the same key, copied there)")
        print(f"then delete {source}: its key files still open every record it held (docs/admin.md)")
    return 0


def _prepare_key_dir(source: Path, key_dir: Path) -> list[str]:
    """Copy the source's host and signing keys into a new (or empty) key directory."""
    if key_dir.exists() and any(key_dir.iterdir()):
        return []
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    copied = []
    for name in COPIED_KEYS:
        if (source / name).is_file():
            shutil.copy2(source / name, key_dir / name)
            (key_dir / name).chmod(0o600)
            copied.append(name)
    return copied


def _undo(key_dir: Path, copied: list[str], made_key_dir: bool) -> None:
    """Leave the key directory as it was: the files copied into it removed, and the directory
    itself when this command made it and nothing else is in it."""
    for name in copied:
        (key_dir / name).unlink(missing_ok=True)
    if made_key_dir and key_dir.is_dir() and not any(key_dir.iterdir()):
        key_dir.rmdir()


def _migrate(source: Path, key_dir: Path, target_url: str) -> dict[str, Any]:
    from engram_core.api import admin_pb2, admin_pb2_grpc
    from engram_core.app.composition import start_core
    from engram_core.cli.channel import admin_metadata

    print(f"engram admin: opening {source} …", file=sys.stderr, flush=True)
    old = start_core(source, semantic=False)
    try:
        with grpc.insecure_channel(old.address) as ch:
            stub = admin_pb2_grpc.AdminServiceStub(ch)
            meta = admin_metadata(str(old.host_key_path))
            data = b"".join(c.data for c in stub.Backup(admin_pb2.ScopeRequest(), metadata=meta, timeout=3600))
            keys = json.loads(stub.SigningKeys(admin_pb2.ScopeRequest(), metadata=admin_metadata(
                str(old.host_key_path), scopes=("read",)), timeout=60).json)
    finally:
        old.stop()
    print(f"engram admin: backup of {len(data)} bytes taken; restoring into the new store …", file=sys.stderr,
          flush=True)
    new = start_core(key_dir, store_url=target_url)
    try:
        with grpc.insecure_channel(new.address) as ch:
            stub = admin_pb2_grpc.AdminServiceStub(ch)
            step = 1 << 20

            def chunks():
                for i in range(0, max(len(data), 1), step):
                    first = i == 0
                    yield admin_pb2.BackupChunk(
                        data=data[i:i + step], total_bytes=len(data), key_dir=str(source) if first else "",
                        trusted_backup_key_pem=[keys["backup"]["public_key_pem"]] if first else [],
                        restore_trusted_host_keys=first)

            result = stub.Restore(chunks(), metadata=admin_metadata(str(new.host_key_path)), timeout=3600)
    finally:
        new.stop()
    return {**json.loads(result.json), "store": target_url}
