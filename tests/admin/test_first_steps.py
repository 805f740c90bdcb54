"""The small things a new user meets in the first minutes (issue 31 item 7), through the real
surface: `engram init` and `tools/serve` as subprocesses, git's own ignore rules.

- The next steps `engram init` prints are numbered 1, 2, 3 (2 steps under tools/serve), none bare.
- `engram init … | head`: a reader that stops reading ends the command quietly, no traceback.
- A kept host TOML that would not reach this data directory's core (another address, another
  directory's key) is said in one line, with a rewrite command that works.
- `tools/serve` takes ENGRAM_HOST_CONFIG, so a second data directory gets its own host TOML.
- git ignores every file a data directory of any name holds, and the host TOMLs and their bearer
  token files beside it.
- `engram init` never prints the HTTP bearer token (issue 60 item 10): each registration reads it
  from the token file, or says which file to paste it from.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram_core.app.composition import start_core

REPO = Path(__file__).resolve().parents[2]
ENGRAM = str(Path(sys.executable).with_name("engram"))


def _engram(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _steps(stdout: str) -> list[tuple[int, str]]:
    """(number, first words) of each step under "Next:", and every bare step line as number 0."""
    lines = stdout[stdout.index("Next:\n"):].splitlines()[1:]
    steps = [(int(m.group(1)), m.group(2)) for line in lines if (m := re.match(r"^  (\d+)\. (\w+ \w+)", line))]
    bare = [(0, line.strip()) for line in lines if re.match(r"^  [A-Z]", line) and not line.startswith("  Clients")]
    return steps + bare


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_ready(address: str) -> None:
    """Readiness as an orchestrator reads it (gRPC health ""): the store open and the search index
    built. A core stopped before its index is built races the build for the store's connection
    (RunningCore.stop does not wait for the index thread), which is not what this test is about."""
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 60
        while health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status != \
                health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, "the core did not become ready"
            time.sleep(0.05)


def test_init_never_prints_the_bearer_token_only_where_to_read_it(tmp_path: Path) -> None:
    result = _engram("init", str(tmp_path / "engram-data"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    token_file = tmp_path / "host.token"
    token = token_file.read_text(encoding="utf-8").strip()
    assert len(token) >= 16
    assert token not in result.stdout and token not in result.stderr
    assert f"$(cat {token_file})" in result.stdout  # Claude Code's registration reads the file itself
    assert "${input:engram-token}" in result.stdout and "${env:ENGRAM_MCP_TOKEN}" in result.stdout


def test_the_next_steps_are_numbered_without_gaps(tmp_path: Path) -> None:
    alone = _engram("init", str(tmp_path / "a" / "engram-data"), cwd=tmp_path)
    assert _steps(alone.stdout) == [(1, "Start the"), (2, "Check the"), (3, "Register the")], alone.stdout
    serving = _engram("init", str(tmp_path / "b" / "engram-data"), "--serving", cwd=tmp_path)
    assert _steps(serving.stdout) == [(1, "Check the"), (2, "Register the")], serving.stdout


def test_init_into_a_pipe_nobody_reads_ends_without_a_traceback(tmp_path: Path) -> None:
    # `engram init | head -1`, made deterministic: the reader is gone before anything is written
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([ENGRAM, "init", str(tmp_path / "engram-data")], cwd=tmp_path, stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert result.returncode == 128 + 13  # as a process ended by SIGPIPE, what `set -o pipefail` expects
    assert (tmp_path / "host.toml").exists() and (tmp_path / "engram-data" / "host.key").exists()  # work done


def test_a_kept_host_config_with_another_directorys_key_is_said_with_a_working_rewrite(tmp_path: Path) -> None:
    address = "127.0.0.1:50081"
    assert _engram("init", "engram-data", "--core", address, cwd=tmp_path).returncode == 0
    second = _engram("init", "other-data", "--core", address, cwd=tmp_path)
    assert second.returncode == 0 and "kept the existing" in second.stdout
    line = second.stderr.strip()
    assert "\n" not in line
    root = tmp_path.resolve()
    assert f"signs with {root / 'engram-data' / 'host.key'}, not {root / 'other-data' / 'host.key'}" in line
    assert "ENGRAM_HOST_CONFIG=FILE" in line
    rewrite = line.split("Rewrite it: ", 1)[1].split(" (or keep it", 1)[0]
    assert subprocess.run(shlex.split(rewrite), cwd=tmp_path, capture_output=True, timeout=60).returncode == 0
    assert 'signing_key = "other-data/host.key"' in (tmp_path / "host.toml").read_text()
    assert _engram("init", "other-data", "--core", address, cwd=tmp_path).stderr == ""


def test_tools_serve_writes_the_host_config_where_engram_host_config_says(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_free_port()}"
    data, host_config = tmp_path / "other-data", tmp_path / "other-host.toml"
    env = {**os.environ, "ENGRAM_DATA": str(data), "ENGRAM_LISTEN": address, "ENGRAM_HOST_CONFIG": str(host_config)}
    beside_repo = REPO / "host.toml"  # the default; a developer's own one must stay as it is
    before = beside_repo.read_bytes() if beside_repo.exists() else None
    serve = subprocess.Popen([str(REPO / "tools" / "serve")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, stdin=subprocess.DEVNULL)
    try:
        assert serve.stdout is not None
        printed = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any("listening on" in line for line in printed):
            line = serve.stdout.readline()
            if not line and serve.poll() is not None:
                break
            printed.append(line)
        out = "".join(printed)
        assert "listening on" in out, out
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    text = host_config.read_text()
    assert f'address = "{address}"' in text and 'signing_key = "other-data/host.key"' in text
    assert (beside_repo.read_bytes() if beside_repo.exists() else None) == before
    assert _steps(out) == [(1, "Check the"), (2, "Register the")], out


def test_git_ignores_every_file_of_a_data_directory_with_another_name(tmp_path: Path) -> None:
    data = tmp_path / "other-data"
    assert _engram("init", str(data), cwd=tmp_path).returncode == 0
    running = start_core(data)  # everything a core writes into its data directory
    try:
        _wait_until_ready(running.address)
    finally:
        running.stop()
    names = sorted(p.name for p in data.iterdir())
    assert {"engram.duckdb", "host.key", "store.kek", "datakeys.bin", "init.toml"} <= set(names), names
    paths = [f"other-data/{name}" for name in names] + ["host.toml", "other-host.toml", "host.token",
                                                                 "other-host.token"]
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
                             input="\n".join(paths) + "\n", capture_output=True, text=True, timeout=60)
    assert ignored.returncode in (0, 1), ignored.stderr
    assert sorted(ignored.stdout.split()) == sorted(paths)


def test_init_for_a_postgresql_store_names_serve_store_and_an_explicit_activation(tmp_path: Path) -> None:
    """`engram init K --store URL` (issue 60 item 6): K is the cores' shared key directory, so no
    init.toml goes into it (cores may be running already: a first-serve activation would wait for a
    restart), and the steps say `serve --store … --key-dir K` and `admin activate`, never `--data K`."""
    url = "postgresql://engram@db.internal:5432/engram"
    result = _engram("init", str(tmp_path / "keys"), "--store", url, "--core", "127.0.0.1:50071", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "keys" / "init.toml").exists() and (tmp_path / "keys" / "host.key").exists()
    out = result.stdout
    assert f"serve --store {url} --key-dir {tmp_path / 'keys'} --listen 127.0.0.1:50071" in out
    assert "activate --tenant local --workspace default" in out and "--data" not in out
    assert "the first `engram serve` on it activates" not in out
    assert _steps(out)[:3] == [(1, "Start each"), (2, "Activate the"), (3, "Check the")], out
    refused = _engram("init", str(tmp_path / "k2"), "--store", "postgresql://engram:secret@db/engram", cwd=tmp_path)
    assert refused.returncode == 2 and "password" in refused.stderr and not (tmp_path / "k2").exists()
