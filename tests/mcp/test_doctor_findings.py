"""`engram doctor` shows what an operator needs when an agent is stuck (issue 31 items 2 and 5): the
purpose the adapter binds (an agent sending another sees only -32603), a binding without one as
the failure it is, and, for a core without the semantic channel, the one line that says a plain
`pip install` leaves it out and how to turn it on. A real core without the channel, the real
`engram doctor` as a subprocess."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.install_hints import SEMANTIC_INSTALL
from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import ENGRAM, REPO, WORKSPACE, Core, activate, binding_for, write_config


@pytest.fixture(scope="module")
def lexical_core(module_stores: EngineStores, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Core]:
    """A core as a plain `pip install .` runs it: no semantic channel."""
    running = module_stores.start_core(tmp_path_factory.mktemp("lexical-core"), semantic=False)
    try:
        found = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(found, "acme", WORKSPACE)
        yield found
    finally:
        running.stop()


def _doctor(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGRAM, "doctor", "--host-config", str(config)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_doctor_shows_the_bound_purpose_and_how_to_turn_the_semantic_channel_on(
        lexical_core: Core, tmp_path: Path) -> None:
    config = write_config(tmp_path / "acme.toml", address=lexical_core.address,
                          signing_key=lexical_core.host_key_path,
                          binding=binding_for("acme", purpose="purpose:release-notes"))
    result = _doctor(config)
    assert result.returncode == 0, result.stdout  # a warning, not a failure
    lines = result.stdout.splitlines()
    assert "  ok    bound purpose_ref 'purpose:release-notes': agents pass exactly this in search, get and " \
           "capture (any other value is refused with -32603)" in lines
    warn = lines.index(next(line for line in lines if line.startswith("  warn  semantic channel off")))
    assert "a plain `pip install` leaves it out" in lines[warn]
    assert lines[warn + 1].startswith("        fix: ") and SEMANTIC_INSTALL in lines[warn + 1]


def test_doctor_fails_a_binding_without_a_purpose(lexical_core: Core, tmp_path: Path) -> None:
    binding = {k: v for k, v in binding_for("acme").items() if k != "purpose_ref"}
    config = write_config(tmp_path / "nopurpose.toml", address=lexical_core.address,
                          signing_key=lexical_core.host_key_path, binding=binding)
    result = _doctor(config)
    assert result.returncode == 1
    assert "  FAIL  [binding] has no purpose_ref: every search, get and capture is refused (-32603)" in \
        result.stdout.splitlines()
    assert f"set purpose_ref in [binding] of {config}" in result.stdout
