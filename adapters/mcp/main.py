"""`engram mcp --host-config FILE [--http HOST:PORT]` (SPEC §14).

Loads the host configuration (failing at startup with a clear message),
optionally starts an embedded core in-process (still spoken to over gRPC), and
serves the adapter over stdio or streamable HTTP.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import anyio

from adapters.mcp.binding import ContextSource
from adapters.mcp.config import ConfigError, HostConfig, load_host_config
from adapters.mcp.core_client import CoreClient
from adapters.mcp.server import EngramMcp

HTTP_PATH = "/mcp"


def _fail(message: str) -> int:
    print(f"engram mcp: {message}", file=sys.stderr)
    return 2


def _parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--http must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def build_adapter(config: HostConfig, address: str, signing_key: Any) -> EngramMcp:
    return EngramMcp(
        core=CoreClient(address, deadline_ms=config.deadline_ms),
        contexts=ContextSource(config, signing_key),
        signing_key=signing_key,
        confirmation_timeout_ms=config.confirmation_timeout_ms,
    )


def mcp_main(args: argparse.Namespace) -> int:
    # stdout is the MCP wire on stdio: diagnostics go to stderr only.
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_host_config(args.host_config)
        listen = _parse_listen(args.http) if getattr(args, "http", None) else None
    except ConfigError as exc:
        return _fail(str(exc))
    if listen is None and config.binding is None:
        return _fail("stdio needs a [binding] section in the host config")

    running = None
    signing_key = config.signing_key
    address = config.core_address
    if config.embedded_data_dir is not None:
        from engram_core.hostkeys import load_private_key_file
        from engram_core.rpc.server import start_core

        try:
            running = start_core(Path(config.embedded_data_dir))
        except Exception as exc:  # the message may name paths, never key material
            return _fail(f"embedded core failed to start: {type(exc).__name__}: {exc}")
        address = running.address
        if signing_key is None:
            signing_key = load_private_key_file(running.host_key_path)
    if signing_key is None or address is None:
        return _fail("no signing key or core address")

    adapter = build_adapter(config, address, signing_key)
    try:
        if listen is None:
            anyio.run(_serve_stdio, adapter)
        else:
            _serve_http(adapter, *listen)
    except KeyboardInterrupt:
        pass
    finally:
        if running is not None:
            running.stop()
    return 0


async def _serve_stdio(adapter: EngramMcp) -> None:
    from mcp.server.stdio import stdio_server

    server = adapter.build()
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await adapter.close()


def _serve_http(adapter: EngramMcp, host: str, port: int) -> None:
    import uvicorn

    server = adapter.build()
    app = server.streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")).run()
