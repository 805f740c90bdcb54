"""Scope activation for the reliability suite's own cores."""

from __future__ import annotations

import time

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import load_private_key_file


def activate_scope(core, tenant: str = "fuzz", workspace: str = "w") -> None:
    key = load_private_key_file(core.host_key_path)
    ctx = make_context(key, call="admin", tenant="_host", workspace="_admin", principal="host:operator",
                       now_ms=time.time_ns() // 1_000_000, host_principal=True,
                       maintenance_scopes=("read", "maintain"), memory_enabled=False)
    with grpc.insecure_channel(core.address) as ch:
        admin_pb2_grpc.AdminServiceStub(ch).Activate(admin_pb2.ActivateRequest(tenant=tenant, workspace=workspace),
                                                     metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=10)
