"""Transport security of the core's gRPC port: TLS, mutual TLS, and the loopback rule.

The core refuses to listen on an address other hosts can reach without TLS unless the
operator says ``--insecure`` (docs/security.md, "gRPC without TLS"). Every client of the
core (``engram admin``, the MCP adapter, ``engram doctor``) opens its channel here, so the
server's CA, the client certificate and the name override are handled in one place.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

_WILDCARDS = ("", "0.0.0.0", "::", "*")


@dataclass(frozen=True)
class ServerTls:
    """The core's certificate chain and key (PEM); ``client_ca`` also demands client certificates."""

    cert: bytes
    key: bytes
    client_ca: bytes | None = None

    @classmethod
    def from_files(cls, cert: str | Path, key: str | Path, client_ca: str | Path | None = None) -> ServerTls:
        return cls(cert=Path(cert).read_bytes(), key=Path(key).read_bytes(),
                   client_ca=Path(client_ca).read_bytes() if client_ca else None)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.client_ca, require_client_auth=self.client_ca is not None
        )

    @property
    def mode(self) -> str:
        return "mtls" if self.client_ca else "tls"


@dataclass(frozen=True)
class ClientTls:
    """What a client needs: the CA that signed the core's certificate, and for mutual TLS its
    own certificate and key; ``server_name`` when the certificate does not name the address."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None

    @classmethod
    def from_files(cls, ca: str | Path, cert: str | Path | None = None, key: str | Path | None = None,
                   server_name: str | None = None) -> ClientTls:
        if (cert is None) != (key is None):
            raise ValueError("a client certificate and its key go together")
        return cls(ca=Path(ca).read_bytes(), cert=Path(cert).read_bytes() if cert else None,
                   key=Path(key).read_bytes() if key else None, server_name=server_name or None)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def split_listen(listen: str) -> tuple[str, str]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), port


def is_loopback_listen(listen: str) -> bool:
    """True when only this machine can connect to ``listen`` (127.0.0.0/8, ::1, localhost)."""
    host, _ = split_listen(listen)
    if host.lower() == "localhost":
        return True
    if host in _WILDCARDS:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name may resolve to any interface


def plaintext_refusal(listen: str, tls: ServerTls | None, insecure: bool) -> str | None:
    """Why the core must not listen on ``listen`` as configured, or None."""
    if tls is None and not insecure and not is_loopback_listen(listen):
        return (f"--listen {listen} is reachable from other hosts: give --tls-cert and --tls-key "
                "(and --client-ca for mutual TLS), or --insecure to serve plaintext anyway")
    return None


def channel(address: str, tls: ClientTls | None = None, *, options: list[tuple[str, Any]] | None = None
            ) -> grpc.Channel:
    """A blocking channel to the core, over TLS when ``tls`` is given."""
    options = list(options or [])
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options + tls.options())


def aio_channel(address: str, tls: ClientTls | None = None, *, options: list[tuple[str, Any]] | None = None,
                interceptors: Any = None) -> grpc.aio.Channel:
    """The asyncio twin of :func:`channel` (the MCP adapter)."""
    options = list(options or [])
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, tls.credentials(), options=options + tls.options(),
                                   interceptors=interceptors)
