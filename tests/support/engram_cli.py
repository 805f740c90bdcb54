"""`engram ARGV` through the console script's own function, in this process.

The console script is ``sys.exit(engram_core.cli.main())`` (pyproject.toml, ``[project.scripts]``):
``run_engram`` calls ``main(argv)`` here, so the same parser and command run against the same core
and print the same output with the same exit status, without a new interpreter importing grpc,
cryptography and the command's modules first (0.3-0.6 s a call on this suite's machines, more
under load). What only a process shows (the script itself, its environment as the shell gives
it, signals, the working directory, output written before a crash) is not here: a test file that
uses this keeps at least one real `engram` subprocess for each command family it covers.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def _environ(extra: Mapping[str, str]) -> Iterator[None]:
    """``extra`` in ``os.environ`` for the block (what ``env={**os.environ, **extra}`` gives a subprocess)."""
    before = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_engram(*argv: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``engram *argv`` as ``subprocess.run(..., capture_output=True, text=True)`` reports it:
    the exit status the script would exit with, what it printed on stdout and on stderr."""
    from engram_core.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _environ(env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors exit as the script would
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=err)
                code = 1
    return subprocess.CompletedProcess(["engram", *argv], code, out.getvalue(), err.getvalue())
