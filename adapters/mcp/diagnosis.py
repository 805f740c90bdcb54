"""What stands between a host config and a working `tools/list`, and how to fix it.

Used by `engram doctor --host-config FILE` (every finding) and by `engram mcp` at start
(one line: the tools it will list, or the first reason there are none). The checks run in
the order a tool call depends on them: the host TOML loads and its key is usable; the core
answers and is SERVING (store open, policy bundle active); the binding names the purpose agents
must pass; the core trusts the signing key; the host opted in (`memory_enabled`); the scope is
active and grants tools; the semantic channel is loaded. Each check signs and sends exactly what the adapter would, so a clean
report means the adapter's first `tools/list` works.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from adapters.mcp.config import AgentBinding, ConfigError, HostConfig, load_host_config
from adapters.mcp.host_context import CallContext, ContextSource
from engram_core.api import host_pb2, host_pb2_grpc
from engram_core.contract.errors import Code
from engram_core.install_hints import SEMANTIC_INSTALL
from engram_core.rpc.status import code_from_rpc_error
from engram_core.rpc.tls import channel as core_channel
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY
from engram_core.trust.hostkeys import key_id

PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Finding:
    level: str  # "ok" | "warn" | "FAIL"
    text: str
    fix: str = ""

    def render(self) -> str:
        line = f"  {self.level:<5} {self.text}"
        return f"{line}\n        fix: {self.fix}" if self.fix else line


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)

    def ok(self, text: str) -> None:
        self.findings.append(Finding("ok", text))

    def warn(self, text: str, fix: str) -> None:
        self.findings.append(Finding("warn", text, fix))

    def fail(self, text: str, fix: str) -> None:
        self.findings.append(Finding("FAIL", text, fix))

    @property
    def failure(self) -> Finding | None:
        return next((f for f in self.findings if f.level == "FAIL"), None)


def _activate_hint(config: HostConfig) -> str:
    b = config.binding
    assert b is not None
    return shlex.join(["engram", "admin", "--core", config.core_address or "HOST:PORT", "--host-key",
                       str(config.signing_key_path), "activate", "--tenant", b.tenant, "--workspace", b.workspace])


def check(config: HostConfig, config_path: str, *, address: str | None = None,
          signing_key: Ed25519PrivateKey | None = None, http: bool = False) -> Report:
    """Probe the core named by ``config`` (or ``address``, for an embedded core) as the adapter would,
    signing with ``signing_key`` (default: the config's); ``http``: also what `engram mcp --http`
    would do with the config (adapters/mcp/http_checks.py)."""
    report = Report()
    address = address or config.core_address
    signing_key = signing_key or config.signing_key
    b = config.binding
    where = (f"binds {b.tenant}/{b.workspace} as {b.principal}" if b else
             "binds each OAuth caller by the binding policy" if config.http.oauth else
             "binds each HTTP request from its header")
    report.ok(f"host config loads; core {address}; {where}")
    if http:
        from adapters.mcp.http_checks import http_findings

        http_findings(config, lambda level, text, fix: report.findings.append(Finding(level, text, fix)))
    kid = key_id(signing_key.public_key()) if signing_key else "?"
    channel = core_channel(address, config.core_tls if address == config.core_address else None)
    try:
        host = host_pb2_grpc.HostServiceStub(channel)
        try:
            health = host.Health(host_pb2.HealthRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError:
            report.fail(f"no core answers at {address}", f"start it: engram serve --data DIR --listen {address}")
            return report
        if health.status != "SERVING":
            why = "the store is not open" if not health.store_open else "the policy bundle is not active"
            report.fail(f"the core at {address} is NOT_SERVING: {why}",
                        "read the core's log (a bundle that fails to load is named there; `engram policy check`)")
        else:
            report.ok(f"core {health.version} SERVING; policy revision {health.policy_revision}")
        if b is None and config.http.oauth:
            # OAuth binds each caller by the binding policy (docs/mcp-clients.md §3a says not to add
            # [binding]); the http checks above already said what they could about it.
            report.ok("no [binding], as OAuth wants: each caller's scope and tools come from the binding policy "
                      "(sign in with a client to see a caller's tools)")
            return report
        if b is None:
            report.warn("no [binding]: the scope is chosen per HTTP request",
                        "add a [binding] section to check one scope's tools here")
            return report
        if not b.complete:
            report.fail("[binding] needs tenant, workspace and principal", f"fill them in {config_path}")
            return report
        _check_purpose(report, b, config_path)
        if signing_key is None:
            return report
        source = ContextSource(config, signing_key)
        ctx = source.for_request(None)
        try:
            caps = _list_following_epoch(host, source, ctx)
        except grpc.RpcError as err:
            code = code_from_rpc_error(err)
            if code == Code.TRUSTED_CONTEXT_UNAVAILABLE:
                report.fail(f"the core does not trust the signing key {config.signing_key_path} (key id {kid})",
                            "use the core's own DIR/host.key, or on the core's host: engram admin ... "
                            "trust-host-key --public-key PUBLIC.pem")
            else:
                report.fail(f"listing tools failed: {code.value}", "read the core's log for this call")
            return report
        report.ok(f"the core trusts the signing key (key id {kid})")
        if not config.memory_enabled:
            report.fail("memory_enabled = false in [host]: no tool is listed",
                        f"set memory_enabled = true in [host] of {config_path}")
        elif "HOST_KEY_NOT_BOUND" in caps.reason_codes:
            report.fail(f"the core trusts the signing key (key id {kid}) for other tenants, not {b.tenant}",
                        "on the core's host: engram admin ... trust-host-key --public-key PUBLIC.pem "
                        f"--tenant {b.tenant} (repeat --tenant for each tenant it serves)")
        elif not caps.tools:
            report.fail(f"no tools granted to {b.tenant}/{b.workspace}: the scope is not active "
                        "(or the policy grants this principal none)", _activate_hint(config))
        else:
            report.tools = list(caps.tools)
            gated = f"; a human confirms: {', '.join(caps.confirmation_required)}" if caps.confirmation_required else ""
            report.ok(f"tools granted: {', '.join(caps.tools)}{gated}")
        if health.semantic_available:
            report.ok("semantic channel loaded (lexical_and_semantic searches work)")
        else:
            report.warn("semantic channel off: lexical_and_semantic searches answer RANKING_UNAVAILABLE "
                        "(a plain `pip install` leaves it out)",
                        f"on the core's host, in the checkout: {SEMANTIC_INSTALL} (tools/setup does both), "
                        "then restart `engram serve` without ENGRAM_SEMANTIC=off")
        _audit_protection(report, health)
    finally:
        channel.close()
    return report


def _audit_protection(report: Report, health: host_pb2.HealthResponse) -> None:
    """Whether anything outside the data directory can show the audit log was rewritten: the
    log's hash chain alone cannot (whoever writes the data directory can cut it back and chain it
    again; docs/security.md, "A rewritten audit log")."""
    if health.audit_devices:
        report.ok(f"audit rows go to {health.audit_devices} audit device(s) outside the data directory")
    elif health.last_anchor_at_ms:
        when = datetime.fromtimestamp(health.last_anchor_at_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        report.ok(f"last signed anchor {when}; no audit device, so only the rows up to it can be checked "
                  "against something the data directory's writer cannot rewrite")
    else:
        report.warn("neither an audit device nor a signed anchor: a truncated and re-chained audit log "
                    "would pass `engram admin verify`",
                    "engram serve ... --audit-device file:/var/log/engram/audit.log, and/or "
                    "engram admin ... anchor --out FILE on a schedule (docs/admin.md, Anchors and audit devices)")


def _check_purpose(report: Report, binding: AgentBinding, config_path: str) -> None:
    """The purpose every search, get and capture must carry (SPEC §2). An agent that sends another
    sees only -32603, so the operator needs to see here which one the adapter binds."""
    if binding.purpose_ref:
        report.ok(f"bound purpose_ref {binding.purpose_ref!r}: agents pass exactly this in search, get and "
                  "capture (any other value is refused with -32603)")
    else:
        report.fail("[binding] has no purpose_ref: every search, get and capture is refused (-32603)",
                    f"set purpose_ref in [binding] of {config_path}, e.g. purpose_ref = \"purpose:default\"")


def diagnose(config_path: str, *, emit: Callable[[str], None] = print) -> int:
    """`engram doctor`: print every finding; exit status 1 when any check failed."""
    emit(f"engram doctor: {config_path}")
    try:
        config = load_host_config(config_path)
    except ConfigError as exc:
        emit(Finding("FAIL", f"host config: {exc}",
                     "run `engram init`, or see docs/mcp-clients.md for the file's sections").render())
        return 1
    if config.embedded_data_dir is not None:
        emit(Finding("ok", f"host config loads; embedded core on {config.embedded_data_dir}").render())
        emit(Finding("warn", "an embedded core starts only with `engram mcp`; nothing more to probe here",
                     "point [core] address at a running `engram serve` to check the whole chain").render())
        return 0
    report = check(config, config_path, http=True)
    for finding in report.findings:
        emit(finding.render())
    emit("engram doctor: " + ("fix the FAIL line(s) above" if report.failure else "all good"))
    return 1 if report.failure else 0


def startup_line(config: HostConfig, config_path: str, address: str, signing_key: Ed25519PrivateKey) -> str:
    """`engram mcp`'s one start-up line on stderr: what it will list, or why nothing."""
    if config.binding is None:
        return f"engram mcp: core {address}; binding per HTTP request"
    report = check(config, config_path, address=address, signing_key=signing_key)
    failure = report.failure
    if failure is not None:
        return f"engram mcp: {failure.text}; fix: {failure.fix} (engram doctor --host-config {config_path})"
    b = config.binding
    return f"engram mcp: {b.tenant}/{b.workspace} as {b.principal} via core {address}; tools: {', '.join(report.tools)}"


def _list_following_epoch(host: host_pb2_grpc.HostServiceStub, source: ContextSource,
                          ctx: CallContext) -> host_pb2.ListCapabilitiesResponse:
    """The tool list as the adapter gets it: after `engram admin revoke` the adapter reads the
    scope's new authorization epoch and signs with it, so the probe does too."""
    def listed() -> host_pb2.ListCapabilitiesResponse:
        return host.ListCapabilities(host_pb2.ListCapabilitiesRequest(),
                                     metadata=[(CONTEXT_METADATA_KEY, ctx.signed())], timeout=PROBE_TIMEOUT_S)

    try:
        return listed()
    except grpc.RpcError as err:
        if code_from_rpc_error(err) != Code.AUTHORIZATION_REVOKED:
            raise
    epoch = host.AuthorizationEpoch(host_pb2.AuthorizationEpochRequest(),
                                    metadata=[(CONTEXT_METADATA_KEY, source.host_context(ctx))],
                                    timeout=PROBE_TIMEOUT_S).authorization_epoch
    source.follow_epoch(epoch)
    return listed()
