"""`engram mcp --http ... --metrics HOST:PORT`: the adapter's own series count its tools/call
answers by tool and outcome code, scraped and parsed with the Prometheus text parser; JSON
logs carry one line per tool call without the arguments."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from tests.support.mcp_helpers import (
    ENGRAM,
    PURPOSE,
    REPO,
    WORKSPACE,
    Core,
    activate,
    approve,
    bearer,
    binding_for,
    capture_args,
    free_port,
    http_client,
    http_token,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio
QUERY = "cormorant lantern protocol"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def adapter(tmp_path: Path, stores):
    running = stores.start_core(tmp_path / "core")
    core = Core(address=running.address, host_key_path=Path(running.host_key_path))
    activate(core, "acme", WORKSPACE)
    secret, http = http_token(tmp_path)
    config = write_config(tmp_path / "acme.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("acme"), extra=http)
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path / "mcp.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([ENGRAM, "mcp", "--host-config", str(config), "--http", f"127.0.0.1:{port}",
                                 "--metrics", f"127.0.0.1:{metrics_port}", "--log-format", "json"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    # Ready when both listen: /metrics comes up before the MCP port (the adapter serves metrics
    # first), and on a loaded machine the gap was long enough for the first client to be refused.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_path.read_text()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1)
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp", f"127.0.0.1:{metrics_port}", log_path, bearer(secret)
    proc.terminate()
    proc.wait(timeout=10)
    running.stop()


async def test_tool_calls_are_counted_by_tool_and_outcome(adapter) -> None:
    url, metrics_address, log_path, headers = adapter
    made: Counter[tuple[str, str]] = Counter()
    async with http_client(url, headers=headers, elicitation=approve) as client:
        await _wait_listening(client)
        cap = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("key"), f"Note {QUERY}")))
        made[("engram_memory_capture", "OK")] += 1
        value_of(await client.call_tool("engram_memory_request_admission",
                                        {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")}))
        made[("engram_memory_request_admission", "OK")] += 1
        for _ in range(3):
            value_of(await client.call_tool("engram_memory_search", {"query": QUERY, "purpose_ref": PURPOSE}))
        made[("engram_memory_search", "OK")] += 3
        bad = await client.call_tool("engram_memory_get", {"record_id": "nope", "purpose_ref": PURPOSE})
        assert bad.structured_content["error"]["code"] == "INVALID_SCHEMA"
        made[("engram_memory_get", "INVALID_SCHEMA")] += 1
        with pytest.raises(MCPError):
            await client.call_tool("no_such_tool_named_after_a_secret", {})
        made[("unknown", "UNKNOWN_TOOL")] += 1

    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    counted = Counter({(s.labels["tool"], s.labels["code"]): int(s.value)
                       for s in fams["engram_mcp_tool_calls"] if s.name == "engram_mcp_tool_calls_total"})
    assert counted == made
    timed = {s.labels["tool"]: int(s.value) for s in fams["engram_mcp_tool_call_duration_seconds"]
             if s.name == "engram_mcp_tool_call_duration_seconds_count"}
    assert timed["engram_memory_search"] == 3
    assert "no_such_tool_named_after_a_secret" not in text and "acme" not in text

    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    tool_lines = [line for line in lines if line.get("event") == "tool_call"]
    assert Counter((t["tool"], t["outcome"]) for t in tool_lines) == made
    assert all(t["audit_id"].startswith("aud_") for t in tool_lines if t["outcome"] != "UNKNOWN_TOOL")
    log = log_path.read_text()
    assert QUERY not in log and "cormorant" not in log and "no_such_tool_named_after_a_secret" not in log


async def _wait_listening(client) -> None:
    await client.list_tools()
