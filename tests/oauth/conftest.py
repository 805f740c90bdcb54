"""Fixtures for the OAuth tests: a real core, a real OpenID provider (oidc-provider on node), and
real `engram mcp --http` processes as OAuth 2.1 resource servers: one accepting JWT access tokens,
one opaque tokens by introspection. The binding policy is the bundled one, with one issuer entry
naming the provider (what an operator adds to data.json, docs/operations.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engram_core.app.composition import start_core  # noqa: E402
from tests.support.idp_support import (
    INTROSPECTING_CLIENT,
    INTROSPECTION_SECRET,
    SCOPES,
    Idp,
    binding_bundle,
    start_idp,
)
from tests.support.mcp_helpers import (
    WORKSPACE,
    Core,
    HttpAdapter,
    activate,
    free_port,
    start_http_adapter,
    stop,
    write_config,
)

INTROSPECTION_ENV = "ENGRAM_TEST_INTROSPECTION_SECRET"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class World:
    core: Core
    idp: Idp
    jwt: HttpAdapter      # JWT access tokens, checked against the provider's JWKS
    opaque: HttpAdapter   # opaque access tokens, checked by introspection
    directory: Path


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("oauth")
    running = start_core(directory / "core")
    adapters: list[HttpAdapter] = []
    idp = None
    try:
        core = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(core, "acme", WORKSPACE)
        activate(core, "globex", WORKSPACE)
        jwt_port, opaque_port = free_port(), free_port()
        jwt_url, opaque_url = f"http://127.0.0.1:{jwt_port}/mcp", f"http://127.0.0.1:{opaque_port}/mcp"
        idp = start_idp(directory, resources={jwt_url: {"scope": SCOPES, "format": "jwt"},
                                              opaque_url: {"scope": SCOPES, "format": "opaque"}})
        bundle = binding_bundle(directory, idp.issuer)
        common = f'[http.oauth]\nissuer = "{idp.issuer}"\npolicies = "{bundle}"\nclock_skew_s = 5'
        jwt_config = write_config(directory / "jwt.toml", address=core.address, signing_key=core.host_key_path,
                                  extra=common)
        opaque_config = write_config(
            directory / "opaque.toml", address=core.address, signing_key=core.host_key_path,
            extra=common + f'\nintrospection_client_id = "{INTROSPECTING_CLIENT}"\n'
                           f'introspection_secret_env = "{INTROSPECTION_ENV}"\nintrospection_cache_s = 0')
        adapters.append(start_http_adapter(jwt_config, port=jwt_port))
        adapters.append(start_http_adapter(opaque_config, port=opaque_port,
                                           env={INTROSPECTION_ENV: INTROSPECTION_SECRET}))
        yield World(core=core, idp=idp, jwt=adapters[0], opaque=adapters[1], directory=directory)
    finally:
        for adapter in adapters:
            stop(adapter)
        if idp is not None:
            idp.stop()
        running.stop()
