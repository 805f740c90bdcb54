"""The MCP hop's floor: Engram's own answer replayed by a server that does nothing else.

    python -m tools.bench.mcp_floor ANSWER.json      # serve over stdio (tools.bench.broad --floor starts it)

One tool, ``engram_memory_search`` with Engram's own definition (input and output schemas),
served by the same SDK server class over the same stdio transport as ``engram mcp``; each call
answers the value of the envelope in ANSWER.json (re-read when the file changes) through the
adapter's own ``adapters.mcp.envelope.success`` (the envelope, its text copy and
``structuredContent``), as ``engram mcp`` answers a search. No
core, no gRPC, no context, no policy: what is left is what the SDK on both ends and the
contract's answer shape cost. The SDK client validates the answer against the output schema, as
it does for Engram's. ``tools.bench.broad --floor`` runs it beside Engram and the peer, with
the answer of each shape's first real search, so "how fast could this answer be through MCP
here" is a figure of the same run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

from adapters.mcp.envelope import success
from adapters.mcp.server import tool_definition
from adapters.mcp.stdio import stdio_server
from engram_core.contract.tools import SEARCH_TOOL


class _Answer:
    """The envelope in a file, read again only when the file changed (one stat a call)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._mtime = -1
        self._envelope: dict[str, Any] = {}

    def envelope(self) -> dict[str, Any]:
        mtime = self._path.stat().st_mtime_ns
        if mtime != self._mtime:
            self._envelope, self._mtime = json.loads(self._path.read_text()), mtime
        return self._envelope


def build(answer: _Answer) -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool_definition(SEARCH_TOOL)])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != SEARCH_TOOL:
            raise ValueError(params.name)
        envelope = answer.envelope()
        return success(envelope["output"]["value"], audit_id=envelope["auditId"])

    return Server("engram-floor", version="0", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve(path: Path) -> None:
    server = build(_Answer(path))
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    anyio.run(serve, Path(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
