"""A loopback HTTP adapter and the other users of the machine (issue 26.1, docs/security.md
"Another local user of a loopback HTTP adapter").

The documented set-up, exactly as a user runs it: `engram init`, `engram serve`, `engram mcp
--host-config host.toml --http 127.0.0.1:PORT`, in a home-like directory others may enter. A
second OS user (uid 65534, ``local_user_probe.py`` dropping root's privileges before it touches
anything) then lists the tools, reads the owner's record, forgets it approving its own
confirmation, and answers the confirmation the owner's session is waiting on. Before the fix
each of these worked and the owner's record was gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.mcp_helpers import (
    ENGRAM,
    bearer,
    capture_args,
    error_code,
    free_port,
    http_client,
    start_http_adapter,
    stop,
    unique,
    value_of,
)

pytestmark = pytest.mark.anyio
PROBE = Path(__file__).resolve().parents[1] / "support" / "local_user_probe.py"
PURPOSE = "purpose:default"  # what `engram init` binds


@dataclass
class Install:
    home: Path
    host_config: Path
    url: str
    owner_headers: dict[str, str]  # what the owner's client sends: the token init wrote, if any
    secret_files: list[Path]


def _engram(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def _token_file(host_config: Path) -> Path | None:
    http = tomllib.loads(host_config.read_text()).get("http", {})
    return (host_config.parent / http["token_file"]) if "token_file" in http else None


@pytest.fixture(scope="module")
def install() -> Iterator[Install]:
    if os.getuid() != 0:
        raise AssertionError("this test needs root: it becomes another user (uid 65534) to attack")
    home = Path(tempfile.mkdtemp(prefix="engram-home-"))
    home.chmod(0o755)  # like a home directory: others may enter it, not read its private files
    address = f"127.0.0.1:{free_port()}"
    init = _engram("init", "--core", address, cwd=home)
    assert init.returncode == 0, init.stderr
    serve = subprocess.Popen([ENGRAM, "serve", "--data", "engram-data", "--listen", address], cwd=home,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    adapter = None
    try:
        assert serve.stdout is not None
        deadline = time.monotonic() + 60
        while "listening on" not in serve.stdout.readline():
            assert serve.poll() is None and time.monotonic() < deadline, "engram serve did not start"
        host_config = home / "host.toml"
        adapter = start_http_adapter(host_config)
        token_file = _token_file(host_config)
        headers = bearer(token_file.read_text().strip()) if token_file is not None else {}
        yield Install(home, host_config, adapter.url, headers,
                      [host_config] + ([token_file] if token_file is not None else []))
    finally:
        if adapter is not None:
            stop(adapter)
        serve.terminate()
        serve.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)


async def _owners_record(install: Install, word: str) -> str:
    async with http_client(install.url, headers=install.owner_headers) as owner:
        cap = value_of(await owner.call_tool("engram_memory_capture", capture_args(
            unique("owner-cap"), f"The owner keeps {word} notes.", purpose=PURPOSE)))
        adm = value_of(await owner.call_tool("engram_memory_request_admission", {
            "candidate_id": cap["candidate_id"], "idempotency_key": unique("owner-adm")}))
        return adm["outcome"]["record_id"]


def _probe(install: Install, record_id: str, *extra: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(PROBE), install.url, record_id, PURPOSE, *extra,
                           "--read", *map(str, install.secret_files)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["uid"], out["gid"]) == (65534, 65534)
    return out


async def _owner_still_reads(install: Install, record_id: str) -> None:
    async with http_client(install.url, headers=install.owner_headers) as owner:
        got = value_of(await owner.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE}))
        assert got["record"]["record_id"] == record_id


async def test_another_local_user_can_neither_list_read_nor_forget(install: Install) -> None:
    record_id = await _owners_record(install, unique("wren").replace("-", ""))
    out = _probe(install, record_id)
    for path in install.secret_files:  # the token is the owner's alone: 0600 in a directory others enter
        assert out[str(path)].startswith("unreadable: PermissionError"), out
    for action in ("list", "get", "forget"):
        assert out[action].startswith("refused: "), (action, out)
    assert out["initialize_status"] == 401, out
    await _owner_still_reads(install, record_id)


async def test_another_local_user_cannot_answer_the_owners_confirmation(install: Install) -> None:
    """The confirmation goes to the session of the one who authenticated; an answer posted to it by
    anyone else is refused, so the owner's own decline stands."""
    record_id = await _owners_record(install, unique("plover").replace("-", ""))
    session: dict[str, str] = {}
    attacks: list[dict[str, Any]] = []

    async def remember_session(response: httpx2.Response) -> None:
        if response.headers.get("mcp-session-id"):
            session["id"] = response.headers["mcp-session-id"]

    async def owner_declines(context: Any, params: Any) -> types.ElicitResult:
        # While the owner looks at the question, the other user answers it for them.
        import anyio

        attacks.append(await anyio.to_thread.run_sync(
            lambda: _probe(install, record_id, "--answer", session["id"], str(context.request_id))))
        return types.ElicitResult(action="decline")

    http = httpx2.AsyncClient(headers=install.owner_headers, timeout=60,
                              event_hooks={"response": [remember_session]})
    async with Client(streamable_http_client(install.url, http_client=http), mode="legacy",
                      elicitation_callback=owner_declines) as owner:
        result = await owner.call_tool("engram_memory_forget", {
            "record_id": record_id, "idempotency_key": unique("owner-forget"), "reason_ref": "reason:cleanup"})
    assert len(attacks) == 1 and attacks[0]["answer_elicitation"] == 401, attacks
    assert error_code(result) == "gate_failed"
    await _owner_still_reads(install, record_id)
