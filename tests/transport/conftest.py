"""Transport security of the core and the adapter: TLS, file modes, per-scope pins, sizes.
The MCP helpers are shared with tests/mcp."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.serve_support import Served, serve
from tests.support.tls_support import Authority, Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Authority | Issued]:
    d = tmp_path_factory.mktemp("pki")
    ca, other = Authority(d, "engram test CA"), Authority(d, "someone else CA")
    return {"ca": ca, "other": other, "server": ca.issue("core", server=True),
            "client": ca.issue("operator", server=False), "rogue": other.issue("rogue", server=False)}


@pytest.fixture(scope="module")
def tls_core(pki, tmp_path_factory) -> Iterator[Served]:
    served = serve(tmp_path_factory.mktemp("tls") / "data",
                   "--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def mtls_core(pki, tmp_path_factory) -> Iterator[Served]:
    served = serve(tmp_path_factory.mktemp("mtls") / "data", "--tls-cert", str(pki["server"].cert),
                   "--tls-key", str(pki["server"].key), "--client-ca", str(pki["ca"].cert))
    yield served
    served.stop()


