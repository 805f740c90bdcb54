"""gRPC over TLS (docs/security.md, "gRPC without TLS"): a real `engram serve` with a throwaway
PKI made at test time; TLS and mutual-TLS clients work, plaintext and unauthenticated clients
do not, and the core refuses to serve plaintext where other hosts can reach it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest

from engram_core.api import host_pb2, host_pb2_grpc
from engram_core.rpc.tls import ClientTls, channel
from tests.support.mcp_helpers import ENGRAM, REPO
from tests.support.serve_support import admin, serve


def _health(address: str, tls: ClientTls | None) -> str:
    with channel(address, tls) as ch:
        return host_pb2_grpc.HostServiceStub(ch).Health(host_pb2.HealthRequest(), timeout=5).status


def _refused(address: str, tls: ClientTls | None) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        _health(address, tls)
    return err.value.code()


def test_tls_client_works_plaintext_fails(tls_core, pki):
    assert "tls on" in tls_core.opened
    assert _health(tls_core.address, ClientTls.from_files(pki["ca"].cert)) in ("SERVING", "NOT_SERVING")
    assert _refused(tls_core.address, None) == grpc.StatusCode.UNAVAILABLE
    # A client that trusts another CA does not accept the core's certificate.
    assert _refused(tls_core.address, ClientTls.from_files(pki["other"].cert)) == grpc.StatusCode.UNAVAILABLE


def test_admin_cli_over_tls(tls_core, pki):
    ok = admin(tls_core, "activate", "--tenant", "acme", "--workspace", "ws", tls=("--tls-ca", str(pki["ca"].cert)))
    assert ok.returncode == 0, ok.stderr
    assert "acme/ws: memory active" in ok.stdout
    plain = admin(tls_core, "activate", "--tenant", "acme", "--workspace", "ws")
    assert plain.returncode == 1 and "STORE_UNAVAILABLE" in plain.stderr


def test_mutual_tls_requires_a_client_certificate(mtls_core, pki):
    assert "mutual" in mtls_core.opened
    ca = pki["ca"].cert
    client, rogue = pki["client"], pki["rogue"]
    assert _refused(mtls_core.address, None) == grpc.StatusCode.UNAVAILABLE
    assert _refused(mtls_core.address, ClientTls.from_files(ca)) == grpc.StatusCode.UNAVAILABLE
    assert _refused(mtls_core.address, ClientTls.from_files(ca, rogue.cert, rogue.key)) == grpc.StatusCode.UNAVAILABLE
    assert _health(mtls_core.address, ClientTls.from_files(ca, client.cert, client.key)) in ("SERVING", "NOT_SERVING")
    no_cert = admin(mtls_core, "activate", "--tenant", "acme", "--workspace", "ws", tls=("--tls-ca", str(ca)))
    assert no_cert.returncode == 1, no_cert.stdout
    ok = admin(mtls_core, "activate", "--tenant", "acme", "--workspace", "ws",
               tls=("--tls-ca", str(ca), "--tls-cert", str(client.cert), "--tls-key", str(client.key)))
    assert ok.returncode == 0, ok.stderr


def _start(data: Path, listen: str, *flags: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([ENGRAM, "serve", "--data", str(data), "--listen", listen, *flags], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:  # it served: the refusal is missing
        raise AssertionError(f"engram serve on {listen} served plaintext") from exc


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0"])
def test_plaintext_on_a_reachable_address_refuses_to_start(tmp_path, listen):
    done = _start(tmp_path / "data", listen)
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--tls-cert" in lines[0] and "--insecure" in lines[0], done.stderr
    assert not (tmp_path / "data").exists(), "refused before the data directory is touched"


def test_insecure_is_an_explicit_choice(tmp_path):
    served = serve(tmp_path / "data", "--insecure", listen="0.0.0.0:0")
    try:
        assert "tls off" in served.opened
        port = served.address.rsplit(":", 1)[1]
        assert _health(f"127.0.0.1:{port}", None) in ("SERVING", "NOT_SERVING")
    finally:
        served.stop()


@pytest.mark.parametrize("flags, message", [
    (("--tls-cert", "{cert}"), "--tls-cert and --tls-key go together"),
    (("--client-ca", "{ca}"), "--client-ca needs --tls-cert and --tls-key"),
    (("--tls-cert", "{missing}", "--tls-key", "{missing}"), "cannot read"),
])
def test_unusable_tls_flags_are_one_line(tmp_path, pki, flags, message):
    values = {"cert": pki["server"].cert, "ca": pki["ca"].cert, "missing": tmp_path / "nope.pem"}
    done = _start(tmp_path / "data", "127.0.0.1:0", *(f.format(**values) for f in flags))
    assert done.returncode == 2 and message in done.stderr, done.stderr
