"""The scope `engram init` asked the first `engram serve` to activate.

Activation goes through the AdminService core with a context signed by the data
directory's own host key, so the policy authorizes it and the audit log records it
like an operator's `engram admin activate`. It happens once: a scope that has a row
(activated or deliberately deactivated since) is left alone.
"""

from __future__ import annotations

import time
from pathlib import Path

from engram_core.cli.init import read_first_serve_scope
from engram_core.services.admin import AdminServiceCore
from engram_core.services.core import Core
from engram_core.trust.hostctx import ADMIN_CALL, make_context, verify_context
from engram_core.trust.hostkeys import load_private_key_file

FIRST_SERVE_PRINCIPAL = "host:engram-init"


def activate_first_scope(core: Core, data_dir: Path, host_key_path: Path) -> str | None:
    """Activate the init scope if this store has never seen it; returns "tenant/workspace" when it did."""
    scope = read_first_serve_scope(data_dir)
    if scope is None:
        return None
    with core.store.read() as tx:
        if tx.scope(scope) is not None:
            return None
    signed = make_context(load_private_key_file(host_key_path), call=ADMIN_CALL, tenant="_host", workspace="_admin",
                          principal=FIRST_SERVE_PRINCIPAL, agent_id="engram-serve", session="first-serve",
                          now_ms=time.time_ns() // 1_000_000, host_principal=True,
                          maintenance_scopes=("read", "maintain"), memory_enabled=False)
    ctx = verify_context(signed, core.trusted, now_ms=core.now_ms())
    AdminServiceCore(core).activate(ctx, scope, [], activated=True)
    return str(scope)
