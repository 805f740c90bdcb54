"""The gRPC server: the servicers, health checking, reflection.

``serve`` takes a core and its services, built by the composition root
(``engram_core.app.composition.start_core``), and serves them; tests and the MCP adapter's
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

from engram_core.api import admin_pb2, host_pb2, host_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.contract.canonical import canonical_json
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.operation import target_of
from engram_core.contract.tools import (
    ADMISSION_TOOL,
    CAPTURE_TOOL,
    FORGET_TOOL,
    GATED_TOOLS,
    GET_TOOL,
    SEARCH_TOOL,
    WITHDRAW_TOOL,
)
from engram_core.observability.metrics import CoreMetrics
from engram_core.rpc.call_handler import (
    GATED_CHECK_CALLS,
    HOST_CALLS,
    LISTING_CALLS,
    REFUSAL_RECORD_CALLS,
    CallHandler,
    metadata_value,
)
from engram_core.rpc.convert import has_unknown_fields, message_of, message_to_value
from engram_core.rpc.handlers import add_servicer
from engram_core.rpc.maintenance import MaintenanceServicer
from engram_core.rpc.tls import ServerTls
from engram_core.services.admin import AdminServiceCore
from engram_core.services.attestation import AttestationService
from engram_core.services.backup import BackupService
from engram_core.services.core import Core
from engram_core.services.host import HostServiceCore
from engram_core.services.keyring import KeyRingScheduler
from engram_core.services.maintenance import MaintenanceService
from engram_core.services.memory import MemoryService
from engram_core.services.pending_confirmations import CLAIM, DECIDE, LIST, PARK, PendingConfirmations
from engram_core.trust.hostctx import CONFIRMATION_METADATA_KEY, BoundContext

log = logging.getLogger("engram.core")
TOOL_OF_METHOD = {
    "search": SEARCH_TOOL,
    "get": GET_TOOL,
    "capture": CAPTURE_TOOL,
    "request_admission": ADMISSION_TOOL,
    "withdraw": WITHDRAW_TOOL,
    "forget": FORGET_TOOL,
}
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
HEALTH_INTERVAL_S = 1.0  # how often standard health is checked (serve's default)


def _tool_method(op: str, response_cls: type, *, grant: bool) -> Callable[..., Any]:
    """The MemoryService method of the tool call ``op`` (``MemoryServicer._call``)."""
    def method(self: MemoryServicer, request: Any, context: grpc.ServicerContext) -> Any:
        return self._call(request, context, op, response_cls, grant)

    return method


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer, CallHandler):
    def __init__(self, core: Core, memory: MemoryService) -> None:
        CallHandler.__init__(self, core)
        self.memory = memory

    def _call(self, request, context, op: str, response_cls, grant: bool):
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
            result = fn(ctx, args, metadata_value(context, CONFIRMATION_METADATA_KEY)) if grant else fn(ctx, args)
            return message_of(result, response_cls)

        return self.audited(context, tool, go, lambda: target_of(tool, args), calls=frozenset({tool}))

    # One method per tool, each the one tool call above (the writes carry a confirmation grant).
    Search = _tool_method("search", memory_pb2.SearchResponse, grant=False)
    Get = _tool_method("get", memory_pb2.GetResponse, grant=False)
    Capture = _tool_method("capture", memory_pb2.CaptureResponse, grant=True)
    RequestAdmission = _tool_method("request_admission", memory_pb2.RequestAdmissionResponse, grant=True)
    Withdraw = _tool_method("withdraw", memory_pb2.WithdrawResponse, grant=True)
    Forget = _tool_method("forget", memory_pb2.ForgetResponse, grant=True)


class HostServicer(host_pb2_grpc.HostServiceServicer, CallHandler):
    def __init__(self, core: Core, host: HostServiceCore, memory: MemoryService) -> None:
        CallHandler.__init__(self, core)
        self.host = host
        self.attestation = AttestationService(core)
        self.memory = memory
        self.pending = PendingConfirmations(core)

    def CheckGated(self, request, context):
        # Audited as the refusal of the tool itself: it is that tool call's answer. A context signed
        # for a host call is spent here; the tool call's own (a fronting host's one context per
        # request) is left for that call to spend (CallHandler.bind).
        tool = request.tool if request.tool in GATED_TOOLS else "host.check_gated"
        args = {"tool": request.tool, "target": request.target, "idempotency_key": request.idempotency_key,
                "reason_ref": request.reason_ref}
        return self.audited(context, tool, lambda ctx: host_pb2.CheckGatedResponse(
            **self.memory.check_gated(ctx, args)), lambda: request.target, calls=GATED_CHECK_CALLS,
            serves_tool_call=True)

    def Health(self, request, context):
        return host_pb2.HealthResponse(**self.host.health())

    def ListCapabilities(self, request, context):
        # A context signed for the listing is spent here. A tool call's own is not: a fronting host
        # sends one context per HTTP request, and the adapter lists the tools with it before making
        # the call, which spends it (SPEC §2 tools/list; CallHandler.bind).
        return self.audited(context, "host.list_capabilities",
                            lambda ctx: host_pb2.ListCapabilitiesResponse(**self.host.list_capabilities(ctx)),
                            calls=LISTING_CALLS, serves_tool_call=True)

    def AuthorizationEpoch(self, request, context):
        return self.audited(context, "host.authorization_epoch", lambda ctx: host_pb2.AuthorizationEpochResponse(
            **self.host.authorization_epoch(ctx)), calls=HOST_CALLS)

    def IssueConfirmation(self, request, context):
        def go(ctx: BoundContext):
            return host_pb2.IssueConfirmationResponse(**self.host.issue_confirmation(
                ctx, tool=request.tool, target=request.target, operation_digest=request.operation_digest,
                approved_at_ms=request.approved_at_ms))

        return self.audited(context, "host.issue_confirmation", go, lambda: request.target, calls=HOST_CALLS)

    # -- confirmations in the console's browser page (issue 61; services/pending_confirmations.py) --
    # The adapter parks and claims under a context of the agent's binding (signed for a host call,
    # or a fronting host's tool-call context, left for that call to spend, as CheckGated does); the
    # console lists and decides under a host-principal context naming the person and the scope.
    def ParkConfirmation(self, request, context):
        return self.audited(context, PARK, lambda ctx: host_pb2.ParkConfirmationResponse(**self.pending.park(
            ctx, tool=request.tool, target=request.target, reason_ref=request.reason_ref,
            digest=request.operation_digest, ttl_ms=request.ttl_ms)), lambda: request.target,
            calls=GATED_CHECK_CALLS, serves_tool_call=True)

    def ClaimConfirmation(self, request, context):
        def go(ctx: BoundContext):
            left = context.time_remaining()
            return host_pb2.ClaimConfirmationResponse(**self.pending.claim(
                ctx, confirmation_id=request.confirmation_id, tool=request.tool, target=request.target,
                digest=request.operation_digest, wait_ms=request.wait_ms,
                time_left_ms=None if left is None else int(left * 1000)))

        return self.audited(context, CLAIM, go, lambda: request.target, calls=GATED_CHECK_CALLS,
                            serves_tool_call=True)

    def ListConfirmations(self, request, context):
        return self.audited(context, LIST, lambda ctx: host_pb2.ConfirmationsResponse(json=canonical_json(
            self.pending.list(ctx, request.confirmation_id)).decode()), calls=HOST_CALLS)

    def DecideConfirmation(self, request, context):
        return self.audited(context, DECIDE, lambda ctx: host_pb2.ConfirmationsResponse(json=canonical_json(
            self.pending.decide(ctx, request.confirmation_id, request.approve)).decode()), calls=HOST_CALLS)

    def RecordRefusal(self, request, context):
        # Spends the context's nonce, whatever it was signed for: a refusal is the last thing a
        # host does with a call's context, so one shown here cannot act afterwards (issue 57).
        return self.audited(context, "host.record_refusal", lambda ctx: host_pb2.RecordRefusalResponse(
            **self.host.record_refusal(ctx, operation=request.operation, code=request.code,
                                       reason_class=request.reason_class, reason_codes=list(request.reason_codes),
                                       pointer=request.pointer, target=request.target)),
                            calls=REFUSAL_RECORD_CALLS)

    def Attest(self, request, context):
        def go():
            req = {f: getattr(request, f) for f in ("tenant", "workspace", "target", "trust_class", "event_id",
                                                    "reason_ref", "verifier_public_key_pem", "signature")}
            out = self.attestation.attest(self.bind(context, calls=HOST_CALLS), req)
            return host_pb2.AttestResponse(json=canonical_json(out).decode())

        return self.run(context, go)


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


@dataclass(frozen=True)
class Services:
    """The services one core serves, built by the composition root."""

    memory: MemoryService
    host: HostServiceCore
    admin: AdminServiceCore
    maintenance: MaintenanceService
    backups: BackupService


def serve(core: Core, services: Services, *, host_key_path: Path, listen: str = "127.0.0.1:0", max_workers: int = 16,
          metrics: CoreMetrics | None = None, tls: ServerTls | None = None,
          health_interval_s: float = HEALTH_INTERVAL_S) -> RunningCore:
    """Serve ``core`` on ``listen`` (port 0: any free port) and start building its search index.

    ``tls``: serve over TLS (mutual with a client CA). On failure to listen the core is closed.
    ``health_interval_s``: how often standard health is checked (default ``HEALTH_INTERVAL_S``;
    tests of health transitions check more often rather than wait out the second)."""
    from engram_core.observability.wiring import server_interceptors

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="engram-rpc"),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                 ("grpc.so_reuseport", 0)],
        interceptors=server_interceptors(metrics),
    )
    add_servicer(server, MemoryServicer(core, services.memory), memory_pb2.DESCRIPTOR.services_by_name["MemoryService"])
    add_servicer(server, HostServicer(core, services.host, services.memory),
                 host_pb2.DESCRIPTOR.services_by_name["HostService"])
    add_servicer(server, MaintenanceServicer(core, services.admin, services.maintenance, services.backups),
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
                          host_key_path=host_key_path, health=health_servicer, memory=services.memory,
                          keyring=KeyRingScheduler(core, core.key_schedule).start())
    _watch_health(running, services.host, health_interval_s)
    threading.Thread(target=_build_index, args=(running, services.host), name="engram-index", daemon=True).start()
    return running


def _build_index(running: RunningCore, host: HostServiceCore) -> None:
    try:
        running.core.store.reload_indexes(key_digests=False)  # loaded at open
    except EngramError as exc:  # store closed meanwhile; a later call rebuilds it or fails
        log.warning("search index not built at start: %s", exc.code.value)
    except Exception:
        log.exception("search index not built at start")
    _health_update(running, host)


HEALTH_SERVICES = ("engram.v1.MemoryService", "engram.v1.HostService", "engram.v1.AdminService")
# Liveness: SERVING while the process runs with its store open (restart it if not). Readiness
# is "" and each engram service: the store open, the bundle active and the search index built.
LIVENESS_SERVICE = "liveness"
# How long readiness waits for the store to answer its check before it says NOT_SERVING. The
# check reads the store, and a PostgreSQL server that is gone holds that read for the pool's
# whole timeout (``pool_timeout_s``, 30 s) before it fails: an orchestrator would keep sending
# calls to a core that cannot answer them for as long. Ordinary calls keep the pool's timeout
# (a store that is only slow for a moment should not fail them); the check left waiting runs on,
# and the next starts once it has its answer, so a store that comes back is SERVING again as
# soon as that check gets a connection.
READINESS_PROBE_TIMEOUT_S = 3.0


def _readiness(running: RunningCore, host: HostServiceCore) -> bool | None:
    """Whether the core is ready (None: stopping or its store closed, nothing to say). Reads the
    store, so it may wait for it (see READINESS_PROBE_TIMEOUT_S)."""
    store = running.core.store
    if running.stopping or not store.is_open():
        return None  # stopping: RunningCore.stop set everything NOT_SERVING
    return host.health()["status"] == "SERVING" and store.index_ready()


def _report(running: RunningCore, ready: bool | None) -> None:
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    if ready is None or running.stopping:
        return
    running.health.set(LIVENESS_SERVICE, serving)
    for svc in ("", *HEALTH_SERVICES):
        running.health.set(svc, serving if ready else not_serving)


def _not_ready(running: RunningCore, why: str) -> None:
    """Readiness NOT_SERVING: the store did not answer (a PostgreSQL server restarting or gone,
    or the store closing under stop). Liveness stays: the process and its store are still open."""
    if running.stopping:
        return
    log.warning("store did not answer the health check: %s", why)
    for svc in ("", *HEALTH_SERVICES):
        running.health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)


def _health_update(running: RunningCore, host: HostServiceCore) -> None:
    _report(running, _readiness(running, host))


def _probe(running: RunningCore, host: HostServiceCore) -> futures.Future[bool | None]:
    """``_readiness`` on a thread of its own, so that its caller can stop waiting for it."""
    answer: futures.Future[bool | None] = futures.Future()

    def check() -> None:
        try:
            answer.set_result(_readiness(running, host))
        except BaseException as exc:  # handed to the watcher, which decides what it means
            answer.set_exception(exc)

    threading.Thread(target=check, name="engram-health-probe", daemon=True).start()
    return answer


def _watch_health(running: RunningCore, host: HostServiceCore, interval_s: float) -> None:
    """Standard gRPC health, readiness and liveness (see LIVENESS_SERVICE), checked every
    ``interval_s`` (a second); a check the store has not answered within READINESS_PROBE_TIMEOUT_S
    is NOT_SERVING."""
    _health_update(running, host)

    def loop() -> None:
        while running.core.store.is_open():
            answer = _probe(running, host)
            try:
                try:
                    ready = answer.result(timeout=READINESS_PROBE_TIMEOUT_S)
                except futures.TimeoutError:
                    _not_ready(running, f"no answer within {READINESS_PROBE_TIMEOUT_S:g} s")
                    ready = answer.result()  # one check at a time: its answer, whenever it comes, is the next
                _report(running, ready)
            except EngramError as exc:
                # The watcher must outlive a store error, or readiness keeps its last value for
                # the life of the process.
                _not_ready(running, exc.code.value)
            threading.Event().wait(interval_s)

    threading.Thread(target=loop, name="engram-health", daemon=True).start()
