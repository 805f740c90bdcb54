"""`engram mcp` refuses to start on an unusable host configuration (SPEC §14)."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.mcp_helpers import ENGRAM, REPO, binding_for, write_config


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ENGRAM, "mcp", *args], cwd=REPO, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[core]\naddress = "127.0.0.1:1"\n[host]\nmemory_enabled = true\n', "missing signing_key in [host]"),
        ("[core\n", "not valid TOML"),
        ('[host]\nsigning_key = "k"\n', "missing [core] section"),
    ],
)
def test_bad_config_fails_at_startup_with_a_clear_message(tmp_path, body, message):
    config = tmp_path / "host.toml"
    config.write_text(body)
    result = _run("--host-config", str(config))
    assert result.returncode != 0
    assert message in result.stderr


def test_missing_config_and_missing_key_file_fail_at_startup(tmp_path):
    result = _run("--host-config", str(tmp_path / "absent.toml"))
    assert result.returncode != 0 and "host config not found" in result.stderr
    config = write_config(
        tmp_path / "host.toml",
        address="127.0.0.1:1",
        signing_key=tmp_path / "no.key",
        binding=binding_for("acme"),
    )
    result = _run("--host-config", str(config))
    assert result.returncode != 0 and "signing key not found" in result.stderr


def test_stdio_without_binding_fails_at_startup(tmp_path):
    key = tmp_path / "host.key"
    from engram_core.trust.hostkeys import create_private_key_file

    create_private_key_file(key)
    config = write_config(tmp_path / "host.toml", address="127.0.0.1:1", signing_key=key)
    result = _run("--host-config", str(config))
    assert result.returncode != 0 and "[binding]" in result.stderr
