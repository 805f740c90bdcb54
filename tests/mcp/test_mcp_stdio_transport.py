"""The stdio transport of `engram mcp` (adapters/mcp/stdio.py): the SDK's parse and
serialization over pipes the event loop waits for, instead of a worker thread per line.

What it must keep of the SDK's transport: lines decoded exactly as the SDK's text layer
decodes them; stray output of handlers and children kept off the wire and fd 0 kept away from
them; messages larger than a pipe holds, both ways; fd 0 and 1 given back, blocking, on exit;
and a terminal or regular file still served (by the SDK's own transport).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from adapters.mcp.stdio import _LoopLines

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
PROBE = str(Path(__file__).resolve().parents[1] / "support" / "stdio_probe_server.py")
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

# Line endings of every kind, invalid UTF-8, multi-byte characters (split across reads when the
# read size is small), a CR that ends one read and an LF that starts the next, empty lines,
# a last line without a newline, and one line longer than a pipe holds.
SAMPLES = [
    b'{"a":1}\n{"b":2}\n',
    b'{"a":1}\r\n{"b":2}\r\n',
    b'one\rtwo\r\nthree\nfour',
    b'\n\n{"x":"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"}\n',
    b'bad \xff\xfe utf-8 \xc3\n\xe2\x82 cut\n',
    b'cr at end\r',
    b'',
    b'{"long":"' + b"x\xc3\xa9" * 70_000 + b'"}\n{"after":true}\n',
]


def sdk_lines(data: bytes) -> list[str]:
    """What the SDK's stdio_server reads: TextIOWrapper(buffer, encoding="utf-8", errors="replace")."""
    return list(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace"))


async def loop_lines(data: bytes, read_size: int) -> list[str]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)

    def feed() -> None:
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        return [line async for line in _LoopLines(read_fd, read_size=read_size)]
    finally:
        feeder.join()
        os.close(read_fd)


@pytest.mark.parametrize("read_size", [1, 2, 3, 7, 65536])
async def test_lines_decode_exactly_as_the_sdk_text_layer(read_size: int) -> None:
    for data in SAMPLES:
        assert await loop_lines(data, read_size) == sdk_lines(data), (read_size, data[:40])


def probe_client() -> Client:
    return Client(StdioServerParameters(command=sys.executable, args=[PROBE], cwd=str(REPO), env=ENV))


async def test_stray_output_and_stdin_reads_never_touch_the_wire() -> None:
    async with probe_client() as client:
        with anyio.fail_after(60):
            for _ in range(3):
                result = await client.call_tool("stray", {})
                # fd 0 was the null device: nothing of the wire was read; the stray bytes
                # (no newline) went to stderr, else this answer's line would not parse.
                assert json.loads(result.content[0].text) == {"stdin_read": ""}


async def test_messages_larger_than_a_pipe_go_through_both_ways() -> None:
    async with probe_client() as client:
        with anyio.fail_after(60):
            blob = "ü" * 300_000  # ~600 KB request line
            result = await client.call_tool("echo_size", {"blob": blob})
            assert json.loads(result.content[0].text) == {"chars": 300_000}
            result = await client.call_tool("big", {"n": 400_000})  # ~800 KB answer line
            assert result.content[0].text == "é" * 400_000


def test_fd0_and_fd1_are_given_back_blocking_on_exit() -> None:
    done = subprocess.run([sys.executable, PROBE], input=b"", capture_output=True, env=ENV, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert json.loads(done.stdout.decode().strip().splitlines()[-1]) == {
        "after_exit": True, "stdout_blocking": True, "stdin_blocking": True}


def test_a_regular_file_on_stdin_is_read_to_its_end(tmp_path: Path) -> None:
    """Not a pipe: the SDK's threaded transport serves it (waiting in the event loop works for
    pipes and sockets only, and a terminal's blocking mode is shared with the user's shell).
    Whether an answer comes out before end of input cancels it is a race in the SDK too."""
    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ping"}) + "\n")
    with requests.open("rb") as stdin:
        done = subprocess.run([sys.executable, PROBE], stdin=stdin, capture_output=True, env=ENV, cwd=REPO,
                              timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert json.loads(done.stdout.decode().splitlines()[-1])["after_exit"] is True
