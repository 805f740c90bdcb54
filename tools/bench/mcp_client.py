"""MCP side: ``engram mcp`` adapters over stdio, driven by the official SDK client."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tools.bench.corpus import PURPOSE

ENGRAM = str(Path(sys.executable).with_name("engram"))
REPO = Path(__file__).resolve().parents[2]


def write_config(path: Path, *, address: str, signing_key: Path, tenant: str, workspace: str, n: int) -> Path:
    path.write_text("\n".join([
        "[core]", f'address = "{address}"', "deadline_ms = 60000", "",
        "[host]", f'signing_key = "{signing_key}"', "memory_enabled = true", "",
        "[binding]", f'tenant = "{tenant}"', f'workspace = "{workspace}"', f'principal = "agent:bench-mcp-{n}"',
        f'agent_id = "bench-mcp-{n}"', 'session = "bench"', f'purpose_ref = "{PURPOSE}"', "",
    ]), encoding="utf-8")
    return path


async def approve(context: Any, params: Any) -> types.ElicitResult:
    """The human says yes (forget needs a confirmation; the benchmark times the whole flow)."""
    return types.ElicitResult(action="accept", content={"approve": True})


def value_of(result: types.CallToolResult) -> dict[str, Any]:
    env = result.structured_content
    if not isinstance(env, dict) or not env.get("ok"):
        raise RuntimeError(f"tool failed: {env}")
    return env["output"]["value"]


@contextlib.asynccontextmanager
async def clients(configs: list[Path]):
    """Open one adapter process + SDK session per config (one agent each)."""
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for cfg in configs:
            params = StdioServerParameters(command=ENGRAM, args=["mcp", "--host-config", str(cfg)], cwd=str(REPO))
            out.append(await stack.enter_async_context(Client(params, elicitation_callback=approve)))
        yield out
