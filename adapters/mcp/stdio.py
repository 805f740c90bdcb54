"""The stdio transport of ``engram mcp``: the SDK's, without a worker thread per line.

The SDK's ``stdio_server()`` reads stdin and writes stdout through ``anyio.wrap_file``, so
every line read, every write and every flush is a hand-off to a worker thread and back:
three per ``tools/call``. On a busy 2-core machine each hand-off waits for the scheduler to
run the other thread, which is where much of the MCP hop's time went (docs/performance.md,
"The MCP hop"). Here the event loop waits for the pipes itself (epoll) and reads and writes
them non-blocking. Everything else stays the SDK's: the same ``stdio_server()`` parses each
line (``jsonrpc_message_adapter.validate_json``) and serializes each answer
(``model_dump_json(by_alias=True, exclude_unset=True)`` plus a newline); lines are decoded
as its text layer decodes them (UTF-8 with ``errors="replace"``, universal newlines); and, as
the SDK does, fd 0 reads the null device and fd 1 writes to stderr while serving, so stray
output of a handler or a child process cannot corrupt the wire. Both are restored after.

Only a pipe or a socket can be waited for this way; a terminal or a regular file (someone
typing JSON-RPC by hand, a replayed file) gets the SDK's threaded transport unchanged.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import stat
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp.server.stdio import stdio_server as sdk_stdio_server

_READ_CHUNK = 65536


def _waitable(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _LoopLines:
    """Lines of a non-blocking descriptor, read when epoll says it is readable. Decoded like
    the SDK's ``TextIOWrapper(buffer, encoding="utf-8", errors="replace")``: universal
    newlines (``\\r\\n`` and ``\\r`` end a line and read as ``\\n``), the last line even
    without a newline."""

    def __init__(self, fd: int, read_size: int = _READ_CHUNK) -> None:
        self._fd = fd
        self._read_size = read_size
        self._decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(errors="replace"),
                                                     translate=True)
        self._eof = False

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        buf, start, scan = "", 0, 0  # buf[start:] is unread; no newline in buf[start:scan]
        while True:
            end = buf.find("\n", scan)
            if end >= 0:
                yield buf[start : end + 1]
                start = scan = end + 1
                continue
            if self._eof:
                if start < len(buf):
                    yield buf[start:]
                return
            buf = buf[start:]
            start, scan = 0, len(buf)  # a long line is searched once, not once per chunk
            buf += self._decoder.decode(await self._read(), final=self._eof)

    async def _read(self) -> bytes:
        while True:
            try:
                chunk = os.read(self._fd, self._read_size)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            if not chunk:
                self._eof = True
            return chunk


class _LoopWriter:
    """What the SDK's writer task needs of stdout (``write``, ``flush``): each write goes out
    whole before it returns, waiting in the event loop while the pipe is full."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def write(self, text: str) -> int:
        data = memoryview(text.encode("utf-8"))
        while data:
            try:
                data = data[os.write(self._fd, data) :]
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
        return len(text)

    async def flush(self) -> None:
        """Nothing is buffered."""


@contextlib.contextmanager
def _claimed(fd: int, diversion: int) -> Any:
    """A private non-blocking duplicate of ``fd`` (the wire), with ``fd`` itself pointing at
    ``diversion`` until exit; then the wire is back on ``fd``, in its original blocking mode."""
    import fcntl  # POSIX only; never reached on Windows

    wire = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    blocking = os.get_blocking(wire)
    try:
        os.dup2(diversion, fd)
        os.set_blocking(wire, False)
        yield wire
    finally:
        with contextlib.suppress(OSError):
            os.set_blocking(wire, blocking)
        os.dup2(wire, fd)
        anyio.notify_closing(wire)
        os.close(wire)


@contextlib.asynccontextmanager
async def stdio_server() -> AsyncIterator[tuple[Any, Any]]:
    """``(read_stream, write_stream)`` over the process's stdin and stdout, like the SDK's
    ``mcp.server.stdio.stdio_server()``."""
    if sys.platform == "win32" or not (_waitable(0) and _waitable(1)):
        async with sdk_stdio_server() as streams:
            yield streams
        return
    null_in = os.open(os.devnull, os.O_RDONLY)
    try:
        err_out = os.dup(2)  # stray output goes where diagnostics go
    except OSError:  # no stderr: as the SDK does, the null device
        err_out = os.open(os.devnull, os.O_WRONLY)
    try:
        with _claimed(0, null_in) as wire_in, _claimed(1, err_out) as wire_out:
            async with sdk_stdio_server(stdin=_LoopLines(wire_in), stdout=_LoopWriter(wire_out)) as streams:
                yield streams
    finally:
        os.close(null_in)
        os.close(err_out)
