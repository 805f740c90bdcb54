"""Another local user attacking `engram mcp --http` on loopback (issue 26.1), for
``test_mcp_local_users.py``.

    python local_user_probe.py URL RECORD_ID PURPOSE [--answer SESSION_ID REQUEST_ID] [--read FILE ...]

Started as root (the interpreter lives where only root can read), it imports everything it
needs, then drops to uid/gid 65534 (``nobody``) before it touches the adapter or a file, and
prints one JSON object: what that user got when it listed the tools, read the record, forgot it
(approving its own confirmation), answered the confirmation another session is waiting on (a
JSON-RPC response posted to SESSION_ID for REQUEST_ID), and read each FILE.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import anyio
import anyio._backends._asyncio  # noqa: F401  (loaded now: nothing under /root is readable later)
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

NOBODY = 65534


async def _approve(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"approve": True})


def _preload() -> None:
    """Import, while root can still read them, every module a client session may import lazily
    (a successful tool call loads more than a refused one): a probe that cannot import must fail
    loudly, never pass for a refusal."""
    import importlib
    import pkgutil

    import mcp
    import mcp_types
    import pydantic

    def walk(package: Any) -> None:
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if any(part in info.name for part in (".cli", "._vendor", ".v1", ".experimental", "._pytest")):
                continue
            try:
                module = importlib.import_module(info.name)
            except BaseException:  # an optional extra this install lacks: never needed by the client
                continue
            if info.ispkg:
                walk(module)

    import jsonschema  # the client validates structuredContent against each tool's outputSchema

    for package in (mcp, mcp_types, httpx2, anyio, pydantic, jsonschema):
        walk(package)
    for name in ("importlib.readers", "importlib.resources.readers", "importlib.metadata"):
        importlib.import_module(name)
    jsonschema.validators.validator_for({}).check_schema({"type": "object"})  # loads its metaschemas
    import encodings.idna  # noqa: F401


class ProbeBroken(Exception):
    """The probe itself failed (an import after dropping privileges): not a refusal."""


def _refusal(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, ImportError | PermissionError):
        raise ProbeBroken(f"{type(exc).__name__}: {exc}")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return f"refused: {type(exc).__name__}" + (f" {status}" if status else "") + (
        f" {exc.code}" if isinstance(exc, MCPError) else "")


async def _as_client(url: str, action: Any) -> str:
    try:
        async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient(timeout=15)),
                          elicitation_callback=_approve) as client:
            return "ok: " + json.dumps(await action(client), default=str)[:500]
    except Exception as exc:  # every way of being refused is a refusal; the test reads which
        return _refusal(exc)


async def attack(url: str, record_id: str, purpose: str, session: str | None, request_id: str | None) -> dict:
    async def list_tools(c: Client) -> list[str]:
        return [t.name for t in (await c.list_tools()).tools]

    async def get(c: Client) -> Any:
        return (await c.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": purpose})
                ).structured_content

    async def forget(c: Client) -> Any:
        return (await c.call_tool("engram_memory_forget", {"record_id": record_id, "reason_ref": "reason:mine",
                                                          "idempotency_key": "nobody-forgets-0001"})).structured_content

    out: dict[str, Any] = {"list": await _as_client(url, list_tools), "get": await _as_client(url, get),
                           "forget": await _as_client(url, forget)}
    # The SDK client reports any HTTP error as -32603; the status itself, from a plain request:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "nobody", "version": "1"}}}
    async with httpx2.AsyncClient(timeout=15) as http:
        reply = await http.post(url, json=initialize, headers={
            "Accept": "application/json, text/event-stream", "Content-Type": "application/json"})
        out["initialize_status"] = reply.status_code
    if session is not None and request_id is not None:
        answer = {"jsonrpc": "2.0", "id": int(request_id) if request_id.isdigit() else request_id,
                  "result": {"action": "accept", "content": {"approve": True}}}
        async with httpx2.AsyncClient(timeout=15) as http:
            reply = await http.post(url, json=answer, headers={
                "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
                "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25"})
        out["answer_elicitation"] = reply.status_code
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("record_id")
    p.add_argument("purpose")
    p.add_argument("--answer", nargs=2, metavar=("SESSION_ID", "REQUEST_ID"), default=(None, None))
    p.add_argument("--read", nargs="*", default=[])
    args = p.parse_args()
    session, request_id = args.answer
    _preload()
    anyio.run(anyio.sleep, 0)  # the event loop's modules, loaded while they can be read
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    out: dict[str, Any] = {"uid": os.getuid(), "gid": os.getgid()}
    for path in args.read:
        try:
            with open(path, "rb") as f:
                f.read(1)
            out[path] = "read"
        except OSError as exc:
            out[path] = f"unreadable: {type(exc).__name__}"
    out.update(anyio.run(attack, args.url, args.record_id, args.purpose, session, request_id))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
