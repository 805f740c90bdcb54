"""Transport security of the core and the adapter: TLS, file modes, per-scope pins, sizes.
The MCP helpers are shared with tests/mcp."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mcp"))

from serve_support import Served, serve  # noqa: E402
from tls_support import Authority, Issued  # noqa: E402


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


