"""The gRPC server: servicers, health checking, reflection, and start-up wiring.

``start_core`` is separate from ``serve_main`` so tests and the MCP adapter's
embedded mode bind port 0 on loopback and talk to a real server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engram_core import secrets_scan
from engram_core.api import admin_pb2, admin_pb2_grpc, host_pb2, host_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.canonical import canonical_json
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.errors import Code, EngramError
from engram_core.hostctx import (
    ADMIN_CALL,
    CONFIRMATION_METADATA_KEY,
    CONTEXT_METADATA_KEY,
    HOST_CALL,
    TOOLS_LIST_CALL,
    BoundContext,
    verify_context,
)
from engram_core.hostkeys import (
    TrustedHostKeys,
    key_id,
    load_or_create_private_key,
    load_public_pem,
    public_pem,
)
from engram_core.observability import calls as observed_calls
from engram_core.observability.metrics import CoreMetrics
from engram_core.operation import target_of
from engram_core.policy import OPA_BINDINGS_HINT
from engram_core.policy import default_bundle_dir as default_policies_dir
from engram_core.rpc.convert import has_unknown_fields, message_to_value, value_to_message
from engram_core.rpc.handlers import add_servicer
from engram_core.rpc.status import OPERATOR_DETAIL_CODES, abort
from engram_core.rpc.tls import ServerTls
from engram_core.services.admin import AdminServiceCore
from engram_core.services.attestation import AttestationService
from engram_core.services.core import Core
from engram_core.services.host import HostServiceCore
from engram_core.services.keyring import KeyRingScheduler, KeySchedule
from engram_core.services.maintenance import reanalyze_lexical, reembed_vectors
from engram_core.services.memory import MemoryService
from engram_core.shared_secrets import check_shared_secrets
from engram_core.signing import CoreSigners
from engram_core.store.duckdb.engine import DuckDBEngine
from engram_core.store.file_modes import make_private
from engram_core.store.kernel import StoreKernel

log = logging.getLogger("engram.core")
TOOL_OF_METHOD = {
    "search": "engram_memory_search",
    "get": "engram_memory_get",
    "capture": "engram_memory_capture",
    "request_admission": "engram_memory_request_admission",
    "withdraw": "engram_memory_withdraw",
    "forget": "engram_memory_forget",
}
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# What a context must have been signed for (HostContext.call), per kind of call (docs/security.md):
# an acting call accepts only a context signed for it; the calls that act on nothing also accept
# the context of the tool call they serve (one context per request from a fronting host).
TOOL_CALLS = frozenset(TOOL_OF_METHOD.values())
GATED_CALLS = frozenset({"engram_memory_withdraw", "engram_memory_forget"})
LISTING_CALLS = TOOL_CALLS | {TOOLS_LIST_CALL}
HOST_CALLS = frozenset({HOST_CALL})
ADMIN_CALLS = frozenset({ADMIN_CALL})


def _refused_operation(calls: frozenset[str]) -> str:
    """The operation a refusal before the call's own code ran is audited under: the call's, as
    the observing interceptor named it."""
    obs = observed_calls.current()
    if obs is not None and obs.operation:
        return obs.operation
    return next(iter(calls)) if len(calls) == 1 else "host"


def _metadata(context: grpc.ServicerContext, key: str) -> bytes | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, bytes) else None
    return None


class _Handler:
    """Shared per-call plumbing: verify context, check deadline, map errors once."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def bind(self, context: grpc.ServicerContext, *, calls: frozenset[str], single_use: bool = True) -> BoundContext:
        """The verified context of this call. ``single_use`` claims its nonce (a replay is
        refused). False only for the host calls that read or change nothing of the scope and
        that the adapter makes with the same context as the tool call itself (one context per
        HTTP request from a fronting host): the tool listing, the check before a confirmation
        is asked, and the record of a refusal the adapter decided. ``calls``: what the context
        must have been signed for."""
        ctx = verify_context(_metadata(context, CONTEXT_METADATA_KEY), self.core.trusted, now_ms=self.core.now_ms(),
                             calls=calls)
        observed_calls.note_context(ctx)  # the call's log line and metrics name who called
        if single_use:
            try:
                ctx = self.core.claim_context(ctx)
            except EngramError as exc:
                if exc.code is Code.RATE_LIMITED:
                    # A verified context refused for its key's full lane: audited like any refusal
                    # (a flood leaves its trace), and answered with the retriable code.
                    raise self.refused(ctx, _refused_operation(calls), exc) from None
                raise
        return ctx

    def refused(self, ctx: BoundContext, operation: str, exc: EngramError, target: str = "") -> EngramError:
        """Audit a refusal after the context was verified (its audit id is then the host's): the
        audit row, like the call's log line, names the operation, scope, audit id and the exact
        reason (class, reason codes, JSON pointer); the caller sees only the constant message.
        Returns the error to answer with: STORE_UNAVAILABLE if the row could not be written,
        so an auditId never points nowhere."""
        # The call's one log line (engram_core.observability) carries the code, reason codes,
        # class and pointer of the error this answers with.
        if exc.audited:
            return exc
        try:
            self.core.audit_refusal(ctx, operation, exc, target)
        except Exception as audit_exc:  # noqa: BLE001 - any failure to write the row
            log.warning("refusal not audited: audit_id=%s %s", ctx.audit_id, type(audit_exc).__name__)
            # A transient failure (FENCE_LOST, STORE_UNAVAILABLE, ...) already tells the caller to
            # retry and changed nothing: keep its code. Anything else must not stand unaudited.
            return exc if exc.retriable else EngramError(Code.STORE_UNAVAILABLE, "refusal audit row not written")
        exc.audited = True
        return exc

    def audited(self, context: grpc.ServicerContext, operation: str, fn: Callable[[BoundContext], Any],
                target: Callable[[], str] = lambda: "", *, calls: frozenset[str],
                single_use: bool = True) -> Any:
        """``fn`` with the verified context; a refusal after verification is logged and audited.
        ``calls`` and ``single_use`` as for :meth:`bind`."""
        def go() -> Any:
            ctx = self.bind(context, calls=calls, single_use=single_use)
            try:
                return fn(ctx)
            except EngramError as exc:
                try:
                    where = target() if exc.code not in (Code.INVALID_SCHEMA, Code.INVALID_DIGEST) else ""
                except Exception:  # noqa: BLE001 - a target that cannot be read is no target
                    where = ""
                raise self.refused(ctx, operation, exc, where) from None

        return self.run(context, go)

    def run(self, context: grpc.ServicerContext, fn: Callable[[], Any]) -> Any:
        try:
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:
                raise EngramError(Code.DEADLINE_EXCEEDED, "deadline passed before start")
            return fn()
        except EngramError as exc:
            if exc.code in OPERATOR_DETAIL_CODES:
                log.warning("call refused: %s: %s", exc.code.value, exc.detail)
            abort(context, exc)  # every call is logged once by engram_core.observability.interceptor
        except grpc.RpcError:
            raise
        except Exception:
            if not context.is_active():
                abort(context, EngramError(Code.CANCELLED, "client went away"))
            log.exception("internal error")
            # Unknown failure inside a call: the mutation may or may not have
            # committed, so the contract's answer is "retry with the same key".
            abort(context, EngramError(Code.MUTATION_OUTCOME_UNKNOWN, "unexpected failure"))


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer, _Handler):
    def __init__(self, core: Core, memory: MemoryService) -> None:
        _Handler.__init__(self, core)
        self.memory = memory

    def _call(self, request, context, op: str, response_cls, gated: bool):
        tool = TOOL_OF_METHOD[op]
        args: dict[str, Any] = {}

        def go(ctx: BoundContext):
            if not context.is_active():
                raise EngramError(Code.CANCELLED, "cancelled")
            if has_unknown_fields(request):
                raise EngramError(Code.INVALID_SCHEMA, "unknown field", reason_class="unknown_field",
                                  reasons=("unknown_field",))
            args.update(message_to_value(request))
            fn = getattr(self.memory, op)
            result = fn(ctx, args, _metadata(context, CONFIRMATION_METADATA_KEY)) if gated else fn(ctx, args)
            return value_to_message(result, response_cls())

        return self.audited(context, tool, go, lambda: target_of(tool, args), calls=frozenset({tool}))

    def Search(self, request, context):
        return self._call(request, context, "search", memory_pb2.SearchResponse, False)

    def Get(self, request, context):
        return self._call(request, context, "get", memory_pb2.GetResponse, False)

    def Capture(self, request, context):
        return self._call(request, context, "capture", memory_pb2.CaptureResponse, True)

    def RequestAdmission(self, request, context):
        return self._call(request, context, "request_admission", memory_pb2.RequestAdmissionResponse, True)

    def Withdraw(self, request, context):
        return self._call(request, context, "withdraw", memory_pb2.WithdrawResponse, True)

    def Forget(self, request, context):
        return self._call(request, context, "forget", memory_pb2.ForgetResponse, True)


class HostServicer(host_pb2_grpc.HostServiceServicer, _Handler):
    def __init__(self, core: Core, host: HostServiceCore, memory: MemoryService) -> None:
        _Handler.__init__(self, core)
        self.host = host
        self.attestation = AttestationService(core)
        self.memory = memory

    def CheckGated(self, request, context):
        # Audited as the refusal of the tool itself: it is that tool call's answer.
        tool = request.tool if request.tool in ("engram_memory_withdraw", "engram_memory_forget") else "host.check_gated"
        args = {"tool": request.tool, "target": request.target, "idempotency_key": request.idempotency_key,
                "reason_ref": request.reason_ref}
        return self.audited(context, tool, lambda ctx: host_pb2.CheckGatedResponse(
            **self.memory.check_gated(ctx, args)), lambda: request.target, calls=GATED_CALLS, single_use=False)

    def Health(self, request, context):
        return host_pb2.HealthResponse(**self.host.health())

    def ListCapabilities(self, request, context):
        # Not single use: a fronting host sends one context per HTTP request, and the adapter
        # lists the tools with it besides making the call (SPEC §2 tools/list).
        return self.audited(context, "host.list_capabilities",
                            lambda ctx: host_pb2.ListCapabilitiesResponse(**self.host.list_capabilities(ctx)),
                            calls=LISTING_CALLS, single_use=False)

    def AuthorizationEpoch(self, request, context):
        return self.audited(context, "host.authorization_epoch", lambda ctx: host_pb2.AuthorizationEpochResponse(
            **self.host.authorization_epoch(ctx)), calls=HOST_CALLS)

    def IssueConfirmation(self, request, context):
        def go(ctx: BoundContext):
            return host_pb2.IssueConfirmationResponse(**self.host.issue_confirmation(
                ctx, tool=request.tool, target=request.target, operation_digest=request.operation_digest,
                approved_at_ms=request.approved_at_ms))

        return self.audited(context, "host.issue_confirmation", go, lambda: request.target, calls=HOST_CALLS)

    def RecordRefusal(self, request, context):
        return self.audited(context, "host.record_refusal", lambda ctx: host_pb2.RecordRefusalResponse(
            **self.host.record_refusal(ctx, operation=request.operation, code=request.code,
                                       reason_class=request.reason_class, reason_codes=list(request.reason_codes),
                                       pointer=request.pointer, target=request.target)), calls=LISTING_CALLS,
                            single_use=False)


    def Attest(self, request, context):
        def go():
            req = {f: getattr(request, f) for f in ("tenant", "workspace", "target", "trust_class", "event_id",
                                                    "reason_ref", "verifier_public_key_pem", "signature")}
            out = self.attestation.attest(self.bind(context, calls=HOST_CALLS), req)
            return host_pb2.AttestResponse(json=canonical_json(out).decode())

        return self.run(context, go)


def _json_result(value: Any) -> admin_pb2.AdminResult:
    return admin_pb2.AdminResult(json=canonical_json(value).decode())


class AdminServicer(admin_pb2_grpc.AdminServiceServicer, _Handler):
    """Maintenance endpoints. Operations beyond activation live in ``services.maintenance``."""

    def __init__(self, core: Core, admin: AdminServiceCore) -> None:
        _Handler.__init__(self, core)
        self.admin = admin

    def Activate(self, request, context):
        return self.run(context, lambda: _json_result(self.admin.activate(
            self.bind(context, calls=ADMIN_CALLS), request.tenant, request.workspace, list(request.tools),
            activated=True)))

    def Deactivate(self, request, context):
        return self.run(context, lambda: _json_result(self.admin.activate(
            self.bind(context, calls=ADMIN_CALLS), request.tenant, request.workspace, list(request.tools),
            activated=False)))

    def __getattr__(self, name: str):
        # Any maintenance RPC the core does not implement yet answers with the
        # contract's CAPABILITY_UNAVAILABLE after authenticating the caller.
        if name[:1].isupper():
            def unavailable(request, context):
                def go():
                    self.bind(context, calls=ADMIN_CALLS)
                    raise EngramError(Code.CAPABILITY_UNAVAILABLE, name)

                return self.run(context, go)

            return unavailable
        raise AttributeError(name)


@dataclass
class RunningCore:
    server: grpc.Server
    core: Core
    port: int
    address: str
    host_key_path: Path
    health: health.HealthServicer
    stopping: bool = False
    memory: MemoryService | None = None  # the agents' service behind the server (tests, benchmarks)
    keyring: KeyRingScheduler | None = None  # rotates and retires KEK generations on schedule

    def stop(self, grace: float | None = 1.0) -> None:
        """Drain: refuse new calls, let calls in flight finish within ``grace`` seconds (gRPC
        cancels the rest: none of those was acknowledged), then close the store cleanly (the
        audit spool moved into the table, a CHECKPOINT, the fence released)."""
        self.stopping = True
        for name in (*HEALTH_SERVICES, "", LIVENESS_SERVICE):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.stop(grace).wait()
        if self.keyring is not None:
            self.keyring.stop()
        self.core.close()


def build_policy(policies_dir: Path | None, opa_url: str | None):
    """The policy backend, loaded. A bundle that fails to load leaves the core
    up but NOT_SERVING, every decision failing closed (SPEC §9, §12)."""
    if opa_url:
        from engram_core.policy.opa_rest import OpaRestPolicyEngine

        engine = OpaRestPolicyEngine(opa_url)
    else:
        try:
            from engram_core.policy.embedded import EmbeddedPolicyEngine
        except ModuleNotFoundError as exc:
            if exc.name != "opa_bindings":
                raise
            raise EngramError(Code.POLICY_UNAVAILABLE, OPA_BINDINGS_HINT) from None

        engine = EmbeddedPolicyEngine(policies_dir or default_policies_dir())
    try:
        engine.reload()
    except EngramError as exc:
        log.error("policy bundle not active: %s", exc.detail)
        return engine
    # Warm every decision path once (OPA prepares each query on first use) so the
    # first real call does not pay for it; every path answers {} with a denial.
    from engram_core.policy.port import DECISION_PATHS

    for path in DECISION_PATHS:
        try:
            engine.decide(path, {}, timeout_s=30)
        except EngramError:
            pass
    return engine


def open_core(data_dir: Path, *, policies_dir: Path | None = None, opa_url: str | None = None,
              extra_trusted_pems: list[str] | None = None, clock=None,
              semantic: bool | None = None, policy: Any = None,
              audit_devices: list[str] | None = None, load_index: bool = True,
              key_schedule: KeySchedule | None = None) -> tuple[Core, Path, Any]:
    """Open (creating on first run) the data directory; ``policy`` overrides the backend (tests, embedding).
    ``audit_devices`` are ``--audit-device`` specs (engram_core/store/audit_device.py)."""
    make_private(data_dir)  # keys and the store: owner only, also in a directory that already existed
    devices = _open_audit_devices(data_dir, audit_devices or [])
    host_key_path = data_dir / "host.key"
    host_key = load_or_create_private_key(host_key_path)
    confirmation_key = load_or_create_private_key(data_dir / "confirmation.key")
    # The confirmation key signs grants only (SPEC §2): never trusted for contexts.
    trusted = TrustedHostKeys([host_key.public_key()], grant_signers=[confirmation_key.public_key()])
    for pem in extra_trusted_pems or []:
        # --trust-host-key at start: the operator's own key, bound like host.key (docs/security.md).
        trusted.add(load_public_pem(pem), local=True)  # KeyRoleConflict: refuse to start, an operator error
    vault = FileKeyVault(data_dir)
    # Search projections are sealed under record keys: the kernel and the engine's migration 6 need the vault.
    store = StoreKernel(DuckDBEngine(data_dir, keys=vault), vault, spool_dir=data_dir, load_index=load_index)
    if devices:
        store.attach_audit_devices(devices)
    with store.write() as tx:
        for row in tx.host_key_rows():
            if trusted.is_grant_signer(row.key_id):
                log.warning("stored trusted host key %s is the confirmation key; not trusted for contexts", row.key_id)
                continue
            trusted.add(load_public_pem(row.public_key_pem), tenants=row.tenants, all_tenants=row.all_tenants,
                        maintenance_scopes=row.maintenance_scopes)
            if not trusted.binding(row.key_id).local and not (row.tenants or row.all_tenants):
                log.warning("trusted host key %s serves no tenant (trusted before keys were bound, or restored): "
                            "bind it with `engram admin trust-host-key --tenant T`", row.key_id)
        tx.add_trusted_host_key(key_id(host_key.public_key()), public_pem(host_key.public_key()), 0)
    policy = policy or build_policy(policies_dir, opa_url)
    core = Core(data_dir=data_dir, store=store, vault=vault, policy=policy, trusted=trusted, clock=clock,
                embedder=build_embedder(semantic), key_schedule=key_schedule)
    try:
        CoreSigners.load(data_dir)  # the backup and anchor keys exist before their fingerprints are checked
        check_shared_secrets(store, data_dir, vault.ring.ring_id)  # a store opened with other key files refuses
        reanalyze_lexical(core)  # postings of an older analyzer are re-derived before anything is served
        reembed_vectors(core)  # and vectors of an older model
    except BaseException:
        core.close()  # the fence is released: the operator fixes the files and starts again
        raise
    make_private(data_dir)  # what opening created (the DuckDB file, key slots) in a process without umask 077
    return core, host_key_path, confirmation_key


def _open_audit_devices(data_dir: Path, specs: list[str]):
    from engram_core.store.audit_device import AuditDevices, open_device

    devices = []
    for spec in specs:
        try:
            dev = open_device(spec)
        except ValueError as exc:
            for d in devices:
                d.close()
            raise EngramError(Code.STORE_UNAVAILABLE, str(exc)) from None
        target = Path(spec.partition(":")[2].partition("?")[0]).resolve()
        if target.is_relative_to(data_dir.resolve()):
            log.warning("audit device %s is inside the data directory: whoever can rewrite the store "
                        "can rewrite it too", dev.name)
        devices.append(dev)
    return AuditDevices(devices) if devices else None


def build_embedder(semantic: bool | None):
    """The local embedding model when the semantic channel is enabled and installed.

    ``semantic`` None means: on if installed, unless ENGRAM_SEMANTIC=off.
    """
    import os

    from engram_core.services.embedding import try_load_local_embedder

    if semantic is False or (semantic is None and os.environ.get("ENGRAM_SEMANTIC", "").lower() in ("off", "0")):
        return None
    return try_load_local_embedder()


def start_core(data_dir: Path, *, listen: str = "127.0.0.1:0", policies_dir: Path | None = None,
               opa_url: str | None = None, extra_trusted_pems: list[str] | None = None, clock=None,
               max_workers: int = 16, semantic: bool | None = None, policy: Any = None,
               audit_devices: list[str] | None = None, metrics: CoreMetrics | None = None,
               tls: ServerTls | None = None, key_schedule: KeySchedule | None = None) -> RunningCore:
    """Open the core and serve it. The search index is built after the server listens: until
    it is, the health of the engram services is NOT_SERVING (readiness) while ``liveness``
    is SERVING; a call that comes early waits for the index instead of failing.

    ``tls``: serve over TLS (mutual with a client CA). Whether plaintext may listen on
    ``listen`` is the caller's rule (``engram serve`` refuses a non-loopback address without
    TLS unless told ``--insecure``)."""
    from engram_core.observability.wiring import observe_core, server_interceptors

    core, host_key_path, confirmation_key = open_core(
        data_dir, policies_dir=policies_dir, opa_url=opa_url, extra_trusted_pems=extra_trusted_pems, clock=clock,
        semantic=semantic, policy=policy, audit_devices=audit_devices, load_index=False, key_schedule=key_schedule)
    secrets_scan.module_ready()  # the scanner's fold table, before the first capture needs it
    memory = MemoryService(core)
    observe_core(core, memory, metrics)
    host = HostServiceCore(core, confirmation_key)
    admin = AdminServiceCore(core)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="engram-rpc"),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.so_reuseport", 0)],
        interceptors=server_interceptors(metrics),
    )
    add_servicer(server, MemoryServicer(core, memory), memory_pb2.DESCRIPTOR.services_by_name["MemoryService"])
    add_servicer(server, HostServicer(core, host, memory), host_pb2.DESCRIPTOR.services_by_name["HostService"])
    add_servicer(server, _maintenance_servicer(core, admin, memory),
                 admin_pb2.DESCRIPTOR.services_by_name["AdminService"])
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [
        memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name,
        host_pb2.DESCRIPTOR.services_by_name["HostService"].full_name,
        admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    reflection.enable_server_reflection(names, server)
    port = server.add_secure_port(listen, tls.credentials()) if tls else server.add_insecure_port(listen)
    if port == 0:
        core.close()
        raise OSError(f"cannot listen on {listen}")
    server.start()
    running = RunningCore(server=server, core=core, port=port, address=f"{listen.rsplit(':', 1)[0]}:{port}",
                          host_key_path=host_key_path, health=health_servicer, memory=memory,
                          keyring=KeyRingScheduler(core, core.key_schedule).start())
    _watch_health(running, host)
    threading.Thread(target=_build_index, args=(running, host), name="engram-index", daemon=True).start()
    return running


def _build_index(running: RunningCore, host: HostServiceCore) -> None:
    try:
        running.core.store.reload_indexes(key_digests=False)  # loaded at open
    except EngramError as exc:  # store closed meanwhile; a later call rebuilds it or fails
        log.warning("search index not built at start: %s", exc.code.value)
    except Exception:
        log.exception("search index not built at start")
    _health_update(running, host)


def _maintenance_servicer(core: Core, admin: AdminServiceCore, memory: MemoryService):
    try:
        from engram_core.rpc.maintenance import MaintenanceServicer
    except ImportError:
        return AdminServicer(core, admin)
    return MaintenanceServicer(core, admin, memory)


HEALTH_SERVICES = ("engram.v1.MemoryService", "engram.v1.HostService", "engram.v1.AdminService")
# Liveness: SERVING while the process runs with its store open (restart it if not). Readiness
# is "" and each engram service: the store open, the bundle active and the search index built.
LIVENESS_SERVICE = "liveness"


def _health_update(running: RunningCore, host: HostServiceCore) -> None:
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    store = running.core.store
    if running.stopping or not store.is_open():
        return  # stopping: RunningCore.stop set everything NOT_SERVING
    ready = host.health()["status"] == "SERVING" and store.index_ready()
    running.health.set(LIVENESS_SERVICE, serving)
    for svc in ("", *HEALTH_SERVICES):
        running.health.set(svc, serving if ready else not_serving)


def _watch_health(running: RunningCore, host: HostServiceCore) -> None:
    """Standard gRPC health, readiness and liveness (see LIVENESS_SERVICE), checked every second."""
    _health_update(running, host)

    def loop() -> None:
        while running.core.store.is_open():
            _health_update(running, host)
            threading.Event().wait(1.0)

    threading.Thread(target=loop, name="engram-health", daemon=True).start()
