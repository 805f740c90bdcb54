"""AdminService over gRPC (SPEC §12): every maintenance RPC, mapped once to the services.

Context binding and error mapping come from the shared ``CallHandler``; results
are canonical JSON documents (``AdminResult.json``); backups stream as chunks.
"""

from __future__ import annotations

from engram_core.api import admin_pb2, admin_pb2_grpc
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.observability import calls as observed_calls
from engram_core.rpc.call_handler import ADMIN_CALLS, CallHandler, json_result
from engram_core.services.admin import AdminServiceCore
from engram_core.services.backup import MAX_BACKUP_BYTES, BackupService, chunks
from engram_core.services.core import CallRecord, Core
from engram_core.services.maintenance import MaintenanceService


def _operation() -> str:
    obs = observed_calls.current()
    return obs.operation if obs is not None and obs.operation else "admin"


class MaintenanceServicer(admin_pb2_grpc.AdminServiceServicer, CallHandler):
    def __init__(self, core: Core, admin: AdminServiceCore, maintenance: MaintenanceService,
                 backups: BackupService) -> None:
        CallHandler.__init__(self, core)
        self.admin = admin
        self.svc = maintenance
        self.backups = backups

    def _json(self, context, fn):
        # A refusal is audited under the RPC's operation name (admin.export, ...), as the
        # observing interceptor named the call.
        return self.audited(context, _operation(), lambda ctx: json_result(fn(ctx)), calls=ADMIN_CALLS)

    # -- activation (SPEC §2: memory off by default) ---------------------------------------
    def Activate(self, request, context):
        return self._json(context, lambda ctx: self.admin.activate(
            ctx, Scope(request.tenant, request.workspace), list(request.tools), activated=True))

    def Deactivate(self, request, context):
        return self._json(context, lambda ctx: self.admin.activate(
            ctx, Scope(request.tenant, request.workspace), list(request.tools), activated=False))

    # -- lifecycle and adjudication ---------------------------------------------------------
    def Transition(self, request, context):
        return self._json(context, lambda ctx: self.svc.transition(ctx, {
            "tenant": request.tenant, "workspace": request.workspace, "operation": request.operation,
            "target": request.target, "successor": request.successor, "to_state": request.to_state,
            "reason_ref": request.reason_ref, "event_id": request.event_id}))

    def ExpireSweep(self, request, context):
        return self._json(context, lambda ctx: self.svc.expire_sweep(ctx, Scope(request.tenant, request.workspace)))

    def ListAdjudication(self, request, context):
        return self._json(context, lambda ctx: self.svc.list_adjudication(ctx, Scope(request.tenant, request.workspace)))

    def Adjudicate(self, request, context):
        return self._json(context, lambda ctx: self.svc.adjudicate(ctx, {
            "tenant": request.tenant, "workspace": request.workspace, "candidate_id": request.candidate_id,
            "decision": request.decision, "reason_ref": request.reason_ref, "event_id": request.event_id}))

    # -- reads ------------------------------------------------------------------------------
    def History(self, request, context):
        return self._json(context, lambda ctx: self.svc.history(
            ctx, Scope(request.tenant, request.workspace), request.record_id, request.disputed_only))

    def InspectCandidate(self, request, context):
        return self._json(context, lambda ctx: self.svc.inspect_candidate(
            ctx, Scope(request.tenant, request.workspace), request.candidate_id))

    def Export(self, request, context):
        return self._json(context, lambda ctx: self.svc.export(
            ctx, Scope(request.tenant, request.workspace), request.what, request.from_cursor, request.to_cursor))

    def Verify(self, request, context):
        return self._json(context, lambda ctx: self.svc.verify(
            ctx, Scope(request.tenant, request.workspace), report_only=request.report_only,
            anchor_json=request.anchor_json, anchor_key_pems=tuple(request.anchor_key_pem)))

    # -- keys and authorization -------------------------------------------------------------
    def RotateKeys(self, request, context):
        return self._json(context, self.svc.rotate_keys)

    def RetireKeys(self, request, context):
        return self._json(context, lambda ctx: self.svc.retire_keys(ctx, now=request.now))

    def KeyStatus(self, request, context):
        return self._json(context, lambda ctx: self.svc.key_status(ctx, Scope(request.tenant, request.workspace)))

    def Revoke(self, request, context):
        return self._json(context, lambda ctx: self.svc.revoke(ctx, Scope(request.tenant, request.workspace)))

    def TrustHostKey(self, request, context):
        return self._json(context, lambda ctx: self.svc.trust_host_key(
            ctx, request.public_key_pem, request.key_id, tenants=list(request.tenants),
            all_tenants=request.all_tenants, maintenance_scopes=list(request.maintenance_scopes)))

    def ListHostKeys(self, request, context):
        return self._json(context, self.svc.list_host_keys)

    def UntrustHostKey(self, request, context):
        return self._json(context, lambda ctx: self.svc.untrust_host_key(ctx, request.public_key_pem, request.key_id))

    # -- backup and restore -----------------------------------------------------------------
    def Backup(self, request, context):
        data = self.audited(context, "admin.backup",
                            lambda ctx: self.backups.backup(ctx, request.tenant, request.workspace), calls=ADMIN_CALLS)
        for piece, total in chunks(data):
            yield admin_pb2.BackupChunk(data=piece, total_bytes=total)

    def Restore(self, request_iterator, context):
        def go():
            ctx = self.bind(context, calls=ADMIN_CALLS)
            # Authorize before reading a byte of the stream.
            self.core.authorize(ctx, "admin.restore", CallRecord())
            parts, size, first = [], 0, admin_pb2.BackupChunk()
            for i, chunk in enumerate(request_iterator):
                if i == 0:
                    first = chunk
                size += len(chunk.data)
                if size > MAX_BACKUP_BYTES:
                    raise EngramError(Code.BACKUP_INVALID, "backup too large")
                parts.append(chunk.data)
            return json_result(self.backups.restore(
                ctx, b"".join(parts), first.key_dir, trusted_backup_key_pems=tuple(first.trusted_backup_key_pem),
                restore_trusted_host_keys=first.restore_trusted_host_keys, key_store=first.key_store))

        return self.run(context, go)

    # -- schema, projections, policies ------------------------------------------------------
    def Migrate(self, request, context):
        return self._json(context, self.svc.migrate)

    def InvalidateProjections(self, request, context):
        return self._json(context, lambda ctx: self.svc.invalidate_projections(ctx, Scope(request.tenant, request.workspace)))

    def RebuildProjections(self, request, context):
        return self._json(context, lambda ctx: self.svc.rebuild_projections(ctx, Scope(request.tenant, request.workspace)))

    def ReloadPolicies(self, request, context):
        return self._json(context, self.svc.reload_policies)

    # -- signing keys and anchors (docs/security.md) -----------------------------------------
    def SigningKeys(self, request, context):
        return self._json(context, self.svc.signing_keys)

    def Anchor(self, request, context):
        return self._json(context, lambda ctx: self.svc.anchor(ctx, Scope(request.tenant, request.workspace)))
