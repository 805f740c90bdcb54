"""A complete MCP client that signs a person in to an Engram adapter served with OAuth 2.1.

What docs/mcp-clients.md §3a leaves to the reader, done: the SDK's ``OAuthClientProvider`` with
tokens kept in a file only you can read (0600, replaced atomically), the provider's sign-in page
opened in the browser, and the authorization code caught on a loopback redirect
(``http://127.0.0.1:PORT/oauth/callback``, RFC 8252: the provider must allow a native client's
loopback redirect on any port). A confirmation the adapter asks for (withdraw, forget) is asked
on the terminal.

    .venv/bin/python -m tools.mcp_oauth_client https://memory.example.com/mcp \\
        --client-id mcp-client --search "why did we pick the ledger" --purpose purpose:engineering-notes

``--client-id`` names a client registered at the provider (a public, native client with the
redirect URI ``http://127.0.0.1/oauth/callback``); without it the SDK registers one dynamically,
where the provider allows that. Tested against a real OpenID provider:
tests/oauth/test_oauth_client_example.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import webbrowser
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

CALLBACK_PATH = "/oauth/callback"
SIGN_IN_TIMEOUT_S = 300


class FileTokenStorage:
    """The SDK's TokenStorage in one JSON file only its owner reads: the tokens and the client's
    registration survive a restart, so a person signs in once until the refresh token expires."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    def _write(self, key: str, value: dict[str, Any]) -> None:
        state = {**self._read(), key: value}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
        try:  # mkstemp makes the file 0600; a rename replaces the old one whole
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(state, out)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def get_tokens(self) -> OAuthToken | None:
        raw = self._read().get("tokens")
        return OAuthToken.model_validate(raw) if raw else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._write("tokens", tokens.model_dump(mode="json", exclude_none=True))

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        raw = self._read().get("client")
        return OAuthClientInformationFull.model_validate(raw) if raw else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._write("client", client_info.model_dump(mode="json", exclude_none=True))


class LoopbackCallback:
    """A one-shot HTTP listener on 127.0.0.1 that the provider redirects the browser to."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._result: asyncio.Future[AuthorizationCodeResult] | None = None
        self.redirect_uri = ""

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        bound = self._server.sockets[0].getsockname()[1]
        self.redirect_uri = f"http://127.0.0.1:{bound}{CALLBACK_PATH}"
        # Made before the browser is sent anywhere: the redirect may arrive before wait() is called.
        self._result = asyncio.get_running_loop().create_future()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def wait(self) -> AuthorizationCodeResult:
        """The code the provider sent back (the SDK checks ``state`` and ``iss`` itself)."""
        assert self._result is not None, "start() first"
        try:
            return await asyncio.wait_for(asyncio.shield(self._result), SIGN_IN_TIMEOUT_S)
        finally:
            self._result = asyncio.get_running_loop().create_future()  # a later sign-in gets its own

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = (await asyncio.wait_for(reader.readline(), 10)).decode("latin-1")
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass  # the headers: nothing in them is needed
            parts = request_line.split(" ")
            target = urlsplit(parts[1]) if len(parts) >= 2 else urlsplit("/")
            query = parse_qs(target.query)
            ok = target.path == CALLBACK_PATH and "code" in query
            body = (b"Signed in: you can close this tab." if ok else b"Sign-in failed: " +
                    query.get("error_description", query.get("error", ["no code"]))[0].encode()[:200])
            writer.write(b"HTTP/1.1 %d OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (200 if ok else 400, len(body), body))
            await writer.drain()
            if target.path == CALLBACK_PATH and self._result is not None and not self._result.done():
                if ok:
                    self._result.set_result(AuthorizationCodeResult(
                        code=query["code"][0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0]))
                else:
                    self._result.set_exception(RuntimeError(body.decode(errors="replace")))
        finally:
            writer.close()


async def open_in_browser(url: str) -> None:
    print(f"Sign in at: {url}", file=sys.stderr)
    webbrowser.open(url)


async def ask_on_terminal(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    """A confirmation the adapter asks (withdraw, forget): each yes/no field asked on the terminal."""
    print(f"\n{params.message}", file=sys.stderr)
    schema = getattr(params, "requested_schema", None) or {}
    content: dict[str, Any] = {}
    for name, field in (schema.get("properties") or {}).items():
        if field.get("type") != "boolean":
            return types.ElicitResult(action="decline")  # only yes/no questions are answered here
        answer = await asyncio.to_thread(input, f"{field.get('title') or name} [y/N] ")
        content[name] = answer.strip().lower() in ("y", "yes")
    return types.ElicitResult(action="accept", content=content)


@asynccontextmanager
async def connect(server_url: str, *, tokens: Path, client_id: str | None = None, port: int = 0,
                  open_url: Callable[[str], Awaitable[None]] = open_in_browser,
                  elicitation: Any = ask_on_terminal) -> AsyncIterator[Client]:
    """An MCP ``Client`` signed in to ``server_url``: from the tokens kept in ``tokens`` when they
    are still good (or refresh), else by sending the person to the provider's sign-in page."""
    callback = LoopbackCallback()
    await callback.start(port)
    storage = FileTokenStorage(tokens)
    metadata = OAuthClientMetadata(redirect_uris=[callback.redirect_uri], token_endpoint_auth_method="none",
                                   grant_types=["authorization_code", "refresh_token"], response_types=["code"],
                                   client_name="Engram OAuth example")
    if client_id and await storage.get_client_info() is None:
        await storage.set_client_info(OAuthClientInformationFull(client_id=client_id, **metadata.model_dump()))
    provider = OAuthClientProvider(server_url=server_url, client_metadata=metadata, storage=storage,
                                   redirect_handler=open_url, callback_handler=callback.wait)
    try:
        async with httpx2.AsyncClient(auth=provider, timeout=30) as http, \
                Client(streamable_http_client(server_url, http_client=http), elicitation_callback=elicitation) as client:
            yield client
    finally:
        await callback.close()


async def _main(args: argparse.Namespace) -> int:
    async with connect(args.url, tokens=Path(args.tokens).expanduser(), client_id=args.client_id,
                       port=args.port) as client:
        tools = await client.list_tools()
        print("tools:", ", ".join(t.name for t in tools.tools) or "none (ask the operator what binds you)")
        if args.search:
            result = await client.call_tool("engram_memory_search", {"query": args.search, "purpose_ref": args.purpose})
            print(json.dumps(result.structured_content, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the adapter's MCP endpoint, e.g. https://memory.example.com/mcp")
    parser.add_argument("--client-id", help="a client registered at the provider (else dynamic registration)")
    parser.add_argument("--tokens", default="~/.config/engram/oauth-tokens.json",
                        help="where the tokens are kept (0600)")
    parser.add_argument("--port", type=int, default=0, help="the loopback callback's port (default: any free one)")
    parser.add_argument("--search", help="search for this after signing in")
    parser.add_argument("--purpose", default="purpose:default", help="the purpose_ref the binding gives you")
    return asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
