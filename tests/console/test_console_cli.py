"""`engram console`'s refusals at start (no browser, no core needed): what would leave the pages
reachable without TLS, or nobody able to sign in, stops it with one line and exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram_core.cli import main
from engram_core.console.app import allowed_hosts
from engram_core.console.settings import ConsoleSettings
from engram_core.trust.hostkeys import load_or_create_private_key


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "console.key"
    load_or_create_private_key(path)
    token = tmp_path / "host.token"
    token.write_text("t0ken\n")
    return path


@pytest.mark.parametrize(("extra", "says"), [
    (["--listen", "0.0.0.0:8780", "--scope", "acme/main"], "--tls-cert"),
    (["--listen", "127.0.0.1:8780"], "--scope"),
    (["--scope", "acme"], "TENANT/WORKSPACE"),
    (["--scope", "acme/main", "--tls-cert", "x.pem"], "--tls-key"),
])
def test_refusals_at_start(key: Path, extra: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["console", "--host-key", str(key), "--token-file", str(key.with_name("host.token")), *extra]
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_nobody_could_sign_in(key: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["console", "--host-key", str(key), "--scope", "acme/main"]) == 2
    assert "nobody could sign in" in capsys.readouterr().err


def test_allowed_hosts() -> None:
    assert allowed_hosts(ConsoleSettings(listen="127.0.0.1:8780")) == ["127.0.0.1", "localhost"]
    assert allowed_hosts(ConsoleSettings(listen="0.0.0.0:8780", public_url="https://console.example.com")) == [
        "console.example.com"]
    assert allowed_hosts(ConsoleSettings(listen="0.0.0.0:8780")) == ["*"]
