"""A new user's first five minutes, as the README and `engram init` tell them: init, serve,
doctor, register the adapter, capture, admit, search; and each misconfiguration a newcomer
hits explains itself in one line (issue: from clone to a first remembered fact).

Every command runs as the newcomer runs it, a process, except where a test only needs what a
command decides, not how the process shows it: an `engram admin` call that sets up a state,
a doctor run after a test's first (``tests/support/engram_cli.py``: the console script's function
in this process), and the adapter's start-up line for the misconfigurations after the first
(``startup_line``, what `engram mcp` prints first).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.stdio import stdio_client as stdio_client_transport
from mcp.shared.exceptions import MCPError

from tests.support.engram_cli import run_engram
from tests.support.mcp_helpers import ENGRAM, REPO, capture_args, free_port, stdio_client, unique, value_of


@dataclass
class FirstRun:
    workdir: Path
    data: Path
    host_config: Path
    address: str
    serve: subprocess.Popen[str]


def _engram(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _start_serve(data: Path, address: str, cwd: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([ENGRAM, "serve", "--data", str(data), "--listen", address], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "listening on" in line:
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"serve exited: {proc.stderr.read() if proc.stderr else ''}")
    raise AssertionError("serve did not print its ready line")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstRun]:
    workdir = tmp_path_factory.mktemp("newcomer")
    address = f"127.0.0.1:{free_port()}"
    init = _engram("init", "--core", address, cwd=workdir)
    assert init.returncode == 0, init.stderr
    # what init prints is what a newcomer copies: the serve line, doctor, and each client's registration
    for needle in ("engram serve --data", "engram doctor --host-config", "claude mcp add engram",
                   '"mcpServers"', "VS Code", "Cursor"):
        assert needle in init.stdout, needle
    serve = _start_serve(workdir / "engram-data", address, workdir)
    try:
        yield FirstRun(workdir, workdir / "engram-data", workdir / "host.toml", address, serve)
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def test_init_writes_a_private_data_directory_and_a_host_config_beside_it(first_run: FirstRun) -> None:
    assert first_run.host_config.exists()
    assert first_run.data.stat().st_mode & 0o777 == 0o700
    assert first_run.host_config.stat().st_mode & 0o777 == 0o600
    text = first_run.host_config.read_text()
    assert first_run.address in text and "memory_enabled = true" in text and "[binding]" in text


def test_doctor_is_green_after_init_and_serve(first_run: FirstRun) -> None:
    result = _engram("doctor", "--host-config", str(first_run.host_config), cwd=first_run.workdir)
    assert result.returncode == 0, result.stdout
    assert "tools granted: " in result.stdout and "engram doctor: all good" in result.stdout


@pytest.mark.anyio
async def test_first_capture_admission_and_search_through_the_registered_adapter(first_run: FirstRun) -> None:
    word = unique("heronfirst").replace("-", "")
    async with stdio_client(first_run.host_config) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "engram_memory_capture" in names
        args = capture_args(unique("first-capture"), f"We keep {word} notes in the team wiki.",
                            purpose="purpose:default")
        captured = value_of(await client.call_tool("engram_memory_capture", args))
        admitted = value_of(await client.call_tool("engram_memory_request_admission", {
            "candidate_id": captured["candidate_id"], "idempotency_key": unique("first-admit")}))
        assert admitted["outcome"]["status"] == "accepted"
        found = value_of(await client.call_tool("engram_memory_search",
                                                {"query": word, "purpose_ref": "purpose:default"}))
        assert [hit["record"]["record_id"] for hit in found["records"]] == [admitted["outcome"]["record_id"]]


def test_second_init_keeps_the_host_config(first_run: FirstRun) -> None:
    before = first_run.host_config.read_text()
    again = _engram("init", "--core", first_run.address, cwd=first_run.workdir)
    assert again.returncode == 0 and "kept the existing" in again.stdout
    assert first_run.host_config.read_text() == before


def test_a_scope_the_operator_deactivated_stays_deactivated_at_the_next_serve(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    assert _engram("init", "--core", address, cwd=tmp_path).returncode == 0
    serve = _start_serve(tmp_path / "engram-data", address, tmp_path)
    try:
        off = run_engram("admin", "--core", address, "--host-key", str(tmp_path / "engram-data" / "host.key"),
                         "deactivate", "--tenant", "local", "--workspace", "default")
        assert off.returncode == 0, off.stderr
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    serve = _start_serve(tmp_path / "engram-data", address, tmp_path)
    try:
        doctor = run_engram("doctor", "--host-config", str(tmp_path / "host.toml"))
        assert doctor.returncode == 1 and "the scope is not active" in doctor.stdout
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def _adapter_startup_line(config: Path, *, process: bool = False) -> str:
    """What `engram mcp` says at start (``process``: its stderr, the process run on an empty stdin);
    else the line it prints first (``startup_line``) for the config, computed in this process."""
    if process:
        proc = subprocess.run([ENGRAM, "mcp", "--host-config", str(config)], cwd=REPO, input="", capture_output=True,
                              text=True, timeout=60)
        return proc.stderr
    from adapters.mcp.config import load_host_config
    from adapters.mcp.diagnosis import startup_line

    loaded = load_host_config(config)
    assert loaded.core_address is not None and loaded.signing_key is not None
    return startup_line(loaded, str(config), loaded.core_address, loaded.signing_key)


def test_adapter_says_at_start_why_it_lists_no_tools(first_run: FirstRun, tmp_path: Path) -> None:
    base = first_run.host_config.read_text().replace(
        'signing_key = "engram-data/host.key"', f'signing_key = "{first_run.data / "host.key"}"')
    off = tmp_path / "off.toml"
    off.write_text(base.replace("memory_enabled = true", "memory_enabled = false"))
    assert "memory_enabled = false in [host]" in _adapter_startup_line(off)

    inactive = tmp_path / "inactive.toml"
    inactive.write_text(base.replace('workspace = "default"', 'workspace = "alpha"'))
    line = _adapter_startup_line(inactive)
    assert "the scope is not active" in line and "activate --tenant local --workspace alpha" in line

    down = tmp_path / "down.toml"
    down.write_text(base.replace(first_run.address, f"127.0.0.1:{free_port()}"))
    assert "no core answers at" in _adapter_startup_line(down)

    ok = _adapter_startup_line(first_run.host_config, process=True)
    assert "local/default as agent:" in ok and "engram_memory_capture" in ok


def test_doctor_names_the_fix_for_an_inactive_scope(first_run: FirstRun, tmp_path: Path) -> None:
    inactive = tmp_path / "inactive.toml"
    inactive.write_text(first_run.host_config.read_text()
                        .replace('signing_key = "engram-data/host.key"', f'signing_key = "{first_run.data / "host.key"}"')
                        .replace('workspace = "default"', 'workspace = "beta"'))
    result = run_engram("doctor", "--host-config", str(inactive))
    assert result.returncode == 1
    assert "FAIL" in result.stdout and "activate --tenant local --workspace beta" in result.stdout


def test_serve_on_a_busy_port_says_so_in_one_line_and_creates_nothing(first_run: FirstRun, tmp_path: Path) -> None:
    result = _engram("serve", "--data", str(tmp_path / "other"), "--listen", first_run.address, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "other").exists()


def test_init_says_in_one_line_when_the_kept_host_config_names_another_core(tmp_path: Path) -> None:
    # tools/serve re-run with another ENGRAM_LISTEN: the kept host.toml would send the adapter to the old address
    assert _engram("init", "--core", "127.0.0.1:50071", cwd=tmp_path).returncode == 0
    before = (tmp_path / "host.toml").read_text()
    moved = _engram("init", "--core", "127.0.0.1:50072", cwd=tmp_path)
    assert moved.returncode == 0 and (tmp_path / "host.toml").read_text() == before
    assert moved.stderr.strip().count("\n") == 0
    assert "names core 127.0.0.1:50071, not 127.0.0.1:50072" in moved.stderr
    assert "--core 127.0.0.1:50072 --force" in moved.stderr
    # no --core given: nothing to compare, nothing said
    assert _engram("init", cwd=tmp_path).stderr == ""


def test_tools_serve_on_a_busy_port_writes_no_host_config_and_names_engram_listen(
        first_run: FirstRun, tmp_path: Path) -> None:
    env = {**os.environ, "ENGRAM_DATA": str(tmp_path / "engram-data"), "ENGRAM_LISTEN": first_run.address}
    result = subprocess.run([str(REPO / "tools" / "serve")], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("tools/serve: ") and "already in use" in last
    assert "ENGRAM_LISTEN=HOST:PORT tools/serve" in last
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "host.toml").exists() and not (tmp_path / "engram-data").exists()


@pytest.mark.anyio
async def test_tools_list_without_a_core_says_why_on_the_adapters_stderr(first_run: FirstRun, tmp_path: Path) -> None:
    # The agent sees only a JSON-RPC error (retriable -32010); the adapter's stderr (a client's MCP log) must say
    # which core did not answer, for a core that stopped after the adapter started as well as for one that never ran.
    address = f"127.0.0.1:{free_port()}"
    down = tmp_path / "down.toml"
    down.write_text(first_run.host_config.read_text()
                    .replace('signing_key = "engram-data/host.key"', f'signing_key = "{first_run.data / "host.key"}"')
                    .replace(first_run.address, address))
    errlog = tmp_path / "adapter.stderr"
    with errlog.open("w") as sink:
        params = StdioServerParameters(command=ENGRAM, args=["mcp", "--host-config", str(down)], cwd=str(REPO))
        async with Client(stdio_client_transport(params, errlog=sink)) as client:
            with pytest.raises(MCPError, match="Memory service temporarily unavailable"):
                await client.list_tools()
    lines = [line for line in errlog.read_text().splitlines() if "tools/list refused" in line]
    assert len(lines) == 1, errlog.read_text()
    assert f"no core answers at {address}" in lines[0] and "code=STORE_UNAVAILABLE" in lines[0]


def test_init_for_tools_serve_does_not_tell_the_user_to_start_the_core_it_is_starting(tmp_path: Path) -> None:
    serving = _engram("init", "--serving", "--core", f"127.0.0.1:{free_port()}", cwd=tmp_path)
    assert serving.returncode == 0 and "Start the core" not in serving.stdout
    assert "engram doctor --host-config" in serving.stdout and "claude mcp add engram" in serving.stdout
