"""``engram admin migrate --store URL``: apply a PostgreSQL store's schema migrations offline.

Without ``--store``, ``engram admin migrate`` asks a running core (AdminService.Migrate), which
migrates with its own role. A least-privilege deployment serves with a role that may not change
the schema, so the schema is migrated apart, as the role that owns it: this command opens the
database with that role's connection string, applies what is pending in one transaction (under
the migration advisory lock the cores take too) and exits. It needs no key directory, no
``--core`` and no ``--host-key``: the migrations are SQL alone, and nothing else is opened.
docs/deployment.md, "Roles: an owner migrates, a serving role serves".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable


def register(sub: argparse._SubParsersAction) -> None:
    """Give the ``migrate`` command (registered by ``cli.admin``) its offline form."""
    p = sub.choices["migrate"]
    through_core: Callable[[argparse.Namespace], int] = p.get_default("func")
    p.add_argument("--store", default=None, metavar="URL",
                   help="migrate this PostgreSQL store directly, as the role in URL (the schema's owner), "
                        "instead of through a core; its password from PGPASSFILE or the libpq environment, "
                        "never in URL; needs no --core or --host-key")
    p.set_defaults(func=lambda a: run(a) if a.store is not None else through_core(a))


def _fail(message: str, code: int) -> int:
    print(f"engram admin migrate: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from engram_core.app.engines import migrate_schema
    from engram_core.contract.errors import EngramError

    try:
        value = migrate_schema(args.store)
    except ValueError as exc:  # the URL: a password in it, no PostgreSQL engine for it
        return _fail(str(exc), 2)
    except EngramError as exc:  # the detail names the failure's kind and versions, never a row's values
        return _fail(f"{exc.code.value}: {exc.detail}", 1)
    if args.json:
        print(json.dumps(value, sort_keys=True))
    else:
        head = value["ledger"][-1]["version"] if value["ledger"] else 0
        print(f"{value['store']}: schema at version {head}; applied now: {value['applied'] or 'none'}")
    return 0
