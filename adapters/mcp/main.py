"""`engram mcp --host-config FILE [--http HOST:PORT]` (SPEC §14).

Loads the host configuration (failing at startup with a clear message),
optionally starts an embedded core in-process (still spoken to over gRPC), and
serves the adapter over stdio or streamable HTTP. The embedded core comes from the
caller (``engram_core/cli/mcp.py`` passes the composition root's ``start_core``): the
adapter knows a core only by its address and host key.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import anyio
from prometheus_client import CollectorRegistry

from adapters.mcp.config import ConfigError, HostConfig, load_host_config
from adapters.mcp.core_client import CoreClient
from adapters.mcp.host_context import ContextSource
from adapters.mcp.observability import ToolCallObserver
from adapters.mcp.server import EngramMcp
from engram_core.observability import tracing
from engram_core.observability.logs import configure_logging, notice
from engram_core.observability.metrics import AdapterMetrics, serve_metrics

HTTP_PATH = "/mcp"


class EmbeddedCore(Protocol):
    """A core this process started for ``[core] embedded = true``: where it listens, the host
    key its data directory trusts, and how to stop it (drain, then close the store)."""

    address: str
    host_key_path: Path

    def stop(self) -> None: ...


# (data directory, the metrics registry the core's series join, or None) -> a started core.
EmbeddedCoreFactory = Callable[[Path, CollectorRegistry | None], EmbeddedCore]


def _fail(message: str) -> int:
    print(f"engram mcp: {message}", file=sys.stderr)
    return 2


def _parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--http must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def build_adapter(config: HostConfig, address: str, signing_key: Any, *, metrics: Any = None,
                  callers: Any = None) -> EngramMcp:
    """``callers``: the binding policy's answers per access token ([http.oauth])."""
    return EngramMcp(
        observer=ToolCallObserver(metrics),
        core=CoreClient(address, deadline_ms=config.deadline_ms,
                        tls=config.core_tls if config.embedded_data_dir is None else None),
        contexts=ContextSource(config, signing_key, callers=callers),
        signing_key=signing_key,
        confirmation_timeout_ms=config.confirmation_timeout_ms,
        console_url=config.console_url or None,
    )


def mcp_main(args: argparse.Namespace, *, embedded_core: EmbeddedCoreFactory | None = None) -> int:
    """``embedded_core`` starts the core of an ``embedded = true`` configuration (the CLI passes
    one); without it such a configuration is refused."""
    # stdout is the MCP wire on stdio: diagnostics go to stderr only. Text logs stay at
    # warnings; JSON logs (an operator's choice) add one line per tool call.
    log_format = getattr(args, "log_format", "text")
    if log_format == "json":
        configure_logging("json", stream=sys.stderr)
    else:
        logging.basicConfig(
            stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
        )
    if tracing.wanted(getattr(args, "otel", False)):
        try:
            tracing.configure("engram-mcp")
        except ValueError as exc:  # an OTEL_* setting this install cannot honour
            return _fail(str(exc))
    registry = CollectorRegistry() if getattr(args, "metrics", None) else None
    adapter_metrics = AdapterMetrics(registry) if registry is not None else None
    # One line per refusal (tool, scope, audit id, exact reason) in either log format.
    logging.getLogger("engram.mcp.refusal").setLevel(logging.INFO)
    try:
        config = load_host_config(args.host_config)
        listen = _parse_listen(args.http) if getattr(args, "http", None) else None
    except ConfigError as exc:
        return _fail(str(exc))
    if listen is None and config.binding is None:
        return _fail("stdio needs a [binding] section in the host config")
    if listen is not None:
        from adapters.mcp.http_security import check_bind

        try:
            check_bind(listen[0], config.http, header_mode=config.binding is None and config.http.oauth is None)
        except ConfigError as exc:
            return _fail(str(exc))
    callers = None
    if listen is not None and config.http.oauth is not None:
        from adapters.mcp.oauth.caller_binding import CallerBindings
        from adapters.mcp.oauth.resource_server import policy_engine
        from engram_core.contract.errors import EngramError

        try:
            callers = CallerBindings(policy_engine(config.http.oauth), cache_s=config.http.oauth.binding_cache_s)
        except EngramError as exc:  # the bundle deciding engram/binding does not load
            return _fail(f"binding policy unavailable: {exc.detail}")

    running: EmbeddedCore | None = None
    signing_key = config.signing_key
    address = config.core_address
    if config.embedded_data_dir is not None:
        from engram_core.trust.hostkeys import load_private_key_file

        if embedded_core is None:
            return _fail("[core] embedded = true needs a core to start; run it with `engram mcp`")
        try:
            # The embedded core's series join the adapter's on the same /metrics.
            running = embedded_core(Path(config.embedded_data_dir), registry)
        except Exception as exc:  # the message may name paths, never key material
            return _fail(f"embedded core failed to start: {type(exc).__name__}: {exc}")
        address = running.address
        if signing_key is None:
            signing_key = load_private_key_file(running.host_key_path)
    if signing_key is None or address is None:
        return _fail("no signing key or core address")

    from adapters.mcp.diagnosis import startup_line

    started = startup_line(config, args.host_config, address, signing_key)
    notice(started, "started")
    adapter = build_adapter(config, address, signing_key, metrics=adapter_metrics, callers=callers)
    metrics_server = None
    if registry is not None:
        try:
            metrics_server, metrics_address = serve_metrics(args.metrics, registry)
        except (OSError, ValueError) as exc:
            if running is not None:
                running.stop()
            return _fail(f"cannot serve metrics on {args.metrics}: {exc}")
        notice(f"engram mcp: metrics on http://{metrics_address}/metrics", "metrics_listening",
               url=f"http://{metrics_address}/metrics")
    try:
        if listen is None:
            anyio.run(_serve_stdio, adapter)
        else:
            _serve_http(adapter, config, *listen, callers=callers)
    except KeyboardInterrupt:
        pass
    finally:
        if running is not None:
            running.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
        tracing.shutdown()
    return 0


class _DeepLines:
    """The SDK's stdio transport parses each line with pydantic's JSON parser, which gives up
    past 200 levels of nesting; the SDK then drops the line without an answer and the client
    waits forever. Such a line is still JSON: parse it again with the standard library so the
    call reaches the adapter and gets its envelope (INVALID_SCHEMA: malformed arguments are
    envelopes, SPEC §3). Everything else passes through untouched."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    @staticmethod
    def _reparsed(item: Any) -> Any:
        import json

        import mcp_types as types
        from mcp.shared.message import SessionMessage
        from pydantic import ValidationError

        if not isinstance(item, ValidationError):
            return item
        errors = item.errors()
        line = errors[0].get("input") if len(errors) == 1 and errors[0].get("type") == "json_invalid" else None
        if not isinstance(line, str) or "recursion limit" not in errors[0].get("msg", ""):
            return item
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(json.loads(line), by_name=False))
        except (ValueError, RecursionError):
            return item

    async def receive(self) -> Any:
        return self._reparsed(await self._inner.receive())

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _DeepLines:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _DeepLines:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _serve_stdio(adapter: EngramMcp) -> None:
    from adapters.mcp.stdio import stdio_server

    server = adapter.build()
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(_DeepLines(read_stream), write_stream, server.create_initialization_options())
    finally:
        await adapter.close()


def _serve_http(adapter: EngramMcp, config: HostConfig, host: str, port: int, *, callers: Any = None) -> None:
    import uvicorn

    from adapters.mcp.http_app import build_http_app
    from adapters.mcp.http_security import DigestTokenVerifier, transport_security

    server = adapter.build()
    http = config.http
    scheme = "https" if http.tls_cert else "http"
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    url = f"{scheme}://{authority}{HTTP_PATH}"
    security = transport_security(host, port, http)
    if http.oauth is not None:
        from adapters.mcp.oauth.resource_server import build_resource_server

        rs = build_resource_server(http.oauth, served_url=url, callers=callers)
        app = build_http_app(server, path=HTTP_PATH, transport_security=security, verifier=rs.verifier,
                             oauth=rs.resource)
        access = (f"OAuth 2.1 resource {rs.resource.resource}, issuer {http.oauth.issuer}, "
                  f"scopes {' '.join(rs.resource.scopes_supported)}")
    elif http.token_digests:
        app = build_http_app(server, path=HTTP_PATH, transport_security=security,
                             verifier=DigestTokenVerifier(http.token_digests))
        access = f"bearer token required ({len(http.token_digests)} configured)"
    else:  # header binding on loopback (check_bind refused everything else)
        app = build_http_app(server, path=HTTP_PATH, transport_security=security, verifier=None)
        access = "each request bound by its signed X-Engram-Host-Context (loopback only)"
    # stderr: stdout is kept clean on every transport.
    notice(f"engram mcp: serving streamable HTTP on {url}; {access}", "http_listening", url=url)
    tls = {"ssl_certfile": str(http.tls_cert), "ssl_keyfile": str(http.tls_key)} if http.tls_cert else {}
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", **tls)).run()
