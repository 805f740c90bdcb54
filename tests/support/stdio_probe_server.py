"""A minimal MCP server on ``adapters.mcp.stdio.stdio_server`` (the transport of ``engram mcp``),
run as a subprocess by test_mcp_stdio_transport.py. Its tools misbehave the way handlers and
child processes do: write to fd 1 without a newline, read fd 0, and answer with pages larger
than a pipe holds. After the transport exits it reports on stdout whether fd 0 and 1 are back.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from adapters.mcp.stdio import stdio_server

_EMPTY = {"type": "object", "properties": {}, "additionalProperties": True}
TOOLS = [types.Tool(name=name, input_schema=_EMPTY) for name in ("stray", "echo_size", "big")]


async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "stray":
        # No newline: had this reached the wire, it would glue onto the answer's line.
        print("stray print", end="", flush=True)
        os.write(1, b"stray write")
        read = os.read(0, 64)  # the wire's stdin would block or lose bytes; /dev/null is EOF
        text = json.dumps({"stdin_read": read.decode("latin-1")})
    elif params.name == "echo_size":
        text = json.dumps({"chars": len(args.get("blob", ""))})
    else:
        text = "é" * int(args.get("n", 0))  # two UTF-8 bytes each
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main() -> None:
    server: Server[Any] = Server("probe", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
    # The transport has exited: fd 1 is the wire again, in its original blocking mode.
    os.write(1, (json.dumps({"after_exit": True, "stdout_blocking": os.get_blocking(1),
                             "stdin_blocking": os.get_blocking(0)}) + "\n").encode())
    sys.exit(0)
