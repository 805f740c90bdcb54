"""The issuer's keys over time, and what `engram doctor` says about an OAuth host config.

Key rotation with the real provider: it is restarted on the same address (the same issuer) with a
new signing key published before the old one; tokens of both keys are accepted, the new key was
fetched because a token named it, and tokens naming keys nobody published make at most one fetch
per cooldown (``jwks_refresh_cooldown_s``, 2 s here; ``adapters/mcp/oauth/jwks.py``), counted at
the provider.

``world`` here is the package's (tests/oauth/conftest.py) without its two `engram mcp --http`
adapters, which no test of this file calls: a core with the provider's tenants active, the
provider, and the JWT host config. The doctor runs after the file's first go through the console
script's function in this process (``tests/support/engram_cli.py``).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from engram_core.contract.schemas import TOOL_NAMES
from tests.support.engram_cli import run_engram
from tests.support.idp_support import (
    PUBLIC_CLIENT,
    SCOPES,
    Idp,
    Person,
    binding_bundle,
    new_key,
    oauth_client,
    start_idp,
)
from tests.support.mcp_helpers import (
    ENGRAM,
    REPO,
    WORKSPACE,
    Core,
    activate,
    free_port,
    start_http_adapter,
    stop,
    write_config,
)

pytestmark = pytest.mark.anyio
COOLDOWN_S = 2
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PING = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}


@dataclass
class IssuerWorld:
    core: Core
    idp: Idp
    directory: Path  # jwt.toml: the package world's JWT host config


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IssuerWorld]:
    from engram_core.app.composition import start_core

    directory = tmp_path_factory.mktemp("oauth-keys")
    running = start_core(directory / "core", semantic=False)  # nothing here searches
    idp = None
    try:
        core = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(core, "acme", WORKSPACE)
        activate(core, "globex", WORKSPACE)
        jwt_url = f"http://127.0.0.1:{free_port()}/mcp"
        idp = start_idp(directory, resources={jwt_url: {"scope": SCOPES, "format": "jwt"}})
        bundle = binding_bundle(directory, idp.issuer)
        write_config(directory / "jwt.toml", address=core.address, signing_key=core.host_key_path,
                     extra=f'[http.oauth]\nissuer = "{idp.issuer}"\npolicies = "{bundle}"\nclock_skew_s = 5')
        yield IssuerWorld(core=core, idp=idp, directory=directory)
    finally:
        if idp is not None:
            idp.stop()
        running.stop()


def _status(url: str, access_token: str) -> int:
    return httpx2.post(url, json=PING, headers={**ACCEPT, "Authorization": f"Bearer {access_token}"},
                       timeout=30).status_code


def _claims(issuer: str, url: str) -> dict:
    now = int(time.time())
    return {"iss": issuer, "sub": "alice", "aud": url, "iat": now, "exp": now + 300, "jti": uuid.uuid4().hex,
            "scope": SCOPES, "client_id": PUBLIC_CLIENT, "engram_tenant": "acme"}


async def test_a_rotated_key_is_fetched_when_a_token_names_it(world, tmp_path: Path) -> None:
    port, idp_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    resources = {url: {"scope": SCOPES, "format": "jwt"}}
    old, new = new_key("2026-01"), new_key("2026-02")
    idp = start_idp(tmp_path, resources=resources, keys=[old], port=idp_port)
    adapter = None
    try:
        config = write_config(tmp_path / "rotating.toml", address=world.core.address,
                              signing_key=world.core.host_key_path,
                              extra=f'[http.oauth]\nissuer = "{idp.issuer}"\n'
                                    f'policies = "{binding_bundle(tmp_path, idp.issuer)}"\n'
                                    f"jwks_refresh_cooldown_s = {COOLDOWN_S}")
        adapter = start_http_adapter(config, port=port)
        assert _status(url, old.sign(_claims(idp.issuer, url))) == 200
        fetched_by = time.monotonic()  # the first fetch was made before its answer
        assert idp.jwks_requests() == 1
        idp.stop()
        idp = start_idp(tmp_path, resources=resources, keys=[new, old], port=idp_port)  # same issuer
        assert _status(url, old.sign(_claims(idp.issuer, url))) == 200  # cached: no fetch for it
        assert idp.jwks_requests() == 0
        # Past the cooldown of the first fetch (the provider's restart took part of it already).
        time.sleep(max(0.0, fetched_by + COOLDOWN_S + 0.1 - time.monotonic()))
        assert _status(url, new.sign(_claims(idp.issuer, url))) == 200  # an unknown kid: one fetch
        assert idp.jwks_requests() == 1
        client, tokens = oauth_client(url, idp, Person("alice"))
        async with client:  # the provider itself now signs with the new key
            assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
        assert tokens.tokens.access_token.count(".") == 2
        before, started = idp.jwks_requests(), time.monotonic()
        for _ in range(20):  # made-up key ids: each refused, the provider asked at most once a cooldown
            assert _status(url, new_key(uuid.uuid4().hex).sign(_claims(idp.issuer, url))) == 401
        allowed = 1 + int((time.monotonic() - started) / COOLDOWN_S)
        assert idp.jwks_requests() - before <= allowed
    finally:
        if adapter is not None:
            stop(adapter)
        idp.stop()


def _doctor(config: Path, *, process: bool = False) -> subprocess.CompletedProcess[str]:
    if process:
        return subprocess.run([ENGRAM, "doctor", "--host-config", str(config)], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    return run_engram("doctor", "--host-config", str(config))


def test_doctor_checks_the_issuer_keys_and_the_binding_policy(world) -> None:
    done = _doctor(world.directory / "jwt.toml", process=True)
    assert done.returncode == 0, done.stdout
    assert "binds each OAuth caller by the binding policy" in done.stdout
    assert f"OAuth issuer {world.idp.issuer}: 1 signing key(s) (ES256)" in done.stdout
    assert f"has an entry for {world.idp.issuer}" in done.stdout
    # The documented OAuth TOML has no [binding], as docs/mcp-clients.md §3a says: doctor must not
    # tell the operator to add one (issue 60 item 15).
    assert "add a [binding]" not in done.stdout and "no [binding], as OAuth wants" in done.stdout


def test_doctor_says_the_default_bundle_binds_nobody_and_names_an_unreachable_issuer(world, tmp_path: Path) -> None:
    nobody = write_config(tmp_path / "nobody.toml", address=world.core.address, signing_key=world.core.host_key_path,
                          extra=f'[http.oauth]\nissuer = "{world.idp.issuer}"')
    done = _doctor(nobody)
    assert f"the binding policy binds nobody from {world.idp.issuer}" in done.stdout, done.stdout
    down = f"http://127.0.0.1:{free_port()}"
    gone = write_config(tmp_path / "gone.toml", address=world.core.address, signing_key=world.core.host_key_path,
                        extra=f'[http.oauth]\nissuer = "{down}"')
    done = _doctor(gone)
    assert done.returncode == 1 and f"FAIL  OAuth issuer {down} publishes no usable metadata" in done.stdout


def test_an_unusable_oauth_section_stops_the_start_in_one_line(world, tmp_path: Path) -> None:
    """Every way of getting [http.oauth] wrong is tests/unit/test_oauth_settings.py; here, that one
    of them stops `engram mcp` as every config problem does: one line, exit 2."""
    config = write_config(tmp_path / "bad.toml", address=world.core.address, signing_key=world.core.host_key_path,
                          extra='[http.oauth]\nissuer = "https://idp.example.com"\nalgorithms = ["HS256"]')
    done = subprocess.run([ENGRAM, "mcp", "--host-config", str(config), "--http", f"127.0.0.1:{free_port()}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "refused: HS256" in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0


def test_an_oauth_adapter_on_every_interface_needs_its_public_resource(world, tmp_path: Path) -> None:
    config = write_config(tmp_path / "wild.toml", address=world.core.address, signing_key=world.core.host_key_path,
                          extra=f'[http.oauth]\nissuer = "{world.idp.issuer}"')
    done = subprocess.run([ENGRAM, "mcp", "--host-config", str(config), "--http", f"0.0.0.0:{free_port()}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "needs resource in [http.oauth]" in done.stderr, done.stderr
    with_binding = write_config(tmp_path / "both.toml", address=world.core.address,
                                signing_key=world.core.host_key_path, binding={"tenant": "acme", "workspace": "w",
                                                                               "principal": "p"},
                                extra=f'[http.oauth]\nissuer = "{world.idp.issuer}"')
    done = subprocess.run([ENGRAM, "mcp", "--host-config", str(with_binding), "--http", f"127.0.0.1:{free_port()}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "remove [binding]" in done.stderr, done.stderr


def test_an_unreachable_issuer_is_503_not_a_bad_token(world, tmp_path: Path) -> None:
    """Nobody answers at the issuer: a JWT cannot be checked, and the client is told to retry
    (503), not sent into a new sign-in (401). A token that is no JWT is still simply refused."""
    down = f"http://127.0.0.1:{free_port()}"
    config = write_config(tmp_path / "down.toml", address=world.core.address, signing_key=world.core.host_key_path,
                          extra=f'[http.oauth]\nissuer = "{down}"')
    adapter = start_http_adapter(config)
    try:
        reply = httpx2.post(adapter.url, json=PING, timeout=30, headers={
            **ACCEPT, "Authorization": f"Bearer {world.idp.key.sign(_claims(down, adapter.url))}"})
        assert reply.status_code == 503 and reply.headers["retry-after"] == "5", reply.text
        assert reply.json()["error"] == "temporarily_unavailable"
        assert _status(adapter.url, "not-a-jwt-" + uuid.uuid4().hex) == 401
    finally:
        stop(adapter)
