"""Open a core from configuration, and serve it: the composition root (docs/architecture.md).

``open_core`` chooses every implementation behind the core's ports, from configuration only:
the key vault, the store engine (``engines.StoreConfig``), the policy engine (embedded Rego or an
OPA server), the local embedding model, and the trusted keys. ``start_core`` builds the services
on that core and hands them to the gRPC server (``engram_core.rpc.server.serve``). Tests, tools
and the CLI open cores here; services and servicers only ever see the ports.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engram_core.app.engines import VAULTS, StoreConfig, open_key_source, open_store
from engram_core.clock import Clock
from engram_core.contract.errors import Code, EngramError
from engram_core.crypto.keyvault import FileKeyVault, KeyVault
from engram_core.crypto.secret_files import load_or_create_secret
from engram_core.embedding.port import Embedder
from engram_core.observability.metrics import CoreMetrics
from engram_core.policy import default_bundle_dir as default_policies_dir
from engram_core.policy.port import PolicyEngine
from engram_core.policy.serving import PolicySettings, build_serving_policy
from engram_core.rpc.server import HEALTH_INTERVAL_S, RunningCore, Services, serve
from engram_core.rpc.tls import ServerTls
from engram_core.secret_scan import scan as secrets_scan
from engram_core.services.admin import AdminServiceCore
from engram_core.services.backup import BackupService
from engram_core.services.core import Core
from engram_core.services.host import HostServiceCore
from engram_core.services.keyring import KeySchedule
from engram_core.services.lexical import TermHasher
from engram_core.services.maintenance import MaintenanceService, reanalyze_lexical, reembed_vectors
from engram_core.services.memory import MemoryService
from engram_core.store.file_modes import make_private
from engram_core.store.page_pins import MAX_PINS
from engram_core.store.port import Store
from engram_core.trust.hostkeys import (
    TrustedHostKeys,
    key_id,
    load_or_create_private_key,
    load_public_pem,
    public_pem,
)
from engram_core.trust.shared_secrets import check_shared_secrets
from engram_core.trust.signing import CoreSigners

log = logging.getLogger("engram.core")

__all__ = ["OpenedCore", "RunningCore", "build_embedder", "build_policy", "default_policies_dir", "open_core",
           "start_core"]


class OpenedCore(NamedTuple):
    """An open core and the local keys its servers need (unpacks as ``core, host_key_path, key``)."""

    core: Core
    host_key_path: Path  # DIR/host.key: its public key is trusted for contexts
    confirmation_key: Ed25519PrivateKey  # DIR/confirmation.key: signs IssueConfirmation grants only


def build_policy(data_dir: Path, policies_dir: Path | None, opa_url: str | None) -> PolicyEngine:
    """The policy engine of a core that ``engram serve`` did not configure (tests, tools,
    ``engram mcp``'s embedded core, ``engram migrate-store``): the one builder ``serve`` uses
    (``build_serving_policy``) over the bundle directory or the OPA, so every core runs what
    ``serve`` runs. Its errors are ``serve``'s: ValueError for settings that cannot work (the
    OPA bindings not installed), and a bundle that fails to load leaves the core up but
    NOT_SERVING, every decision failing closed (SPEC §9, §12)."""
    return build_serving_policy(PolicySettings(policies=policies_dir, opa_url=opa_url), data_dir).engine


def build_embedder(semantic: bool | None) -> Embedder | None:
    """The local embedding model when the semantic channel is enabled and installed.

    ``semantic`` None means: on if installed, unless ENGRAM_SEMANTIC=off.
    """
    if semantic is False or (semantic is None and os.environ.get("ENGRAM_SEMANTIC", "").lower() in ("off", "0")):
        return None
    from engram_core.embedding.onnx_minilm import try_load_local_embedder

    return try_load_local_embedder()


def build_vault(config: StoreConfig) -> KeyVault:
    """The key vault: KEK and wrapped data keys in the data directory (``store.kek``,
    ``datakeys.bin``), outside the database; an engine several cores share keeps the wrapped
    keys in its database instead, the KEK ring still in the (key) directory (``engines.VAULTS``)."""
    opener = VAULTS.get(config.engine)
    return opener(config) if opener is not None else FileKeyVault(config.data_dir)


def _open_audit_devices(data_dir: Path, specs: list[str]) -> Any:
    from engram_core.store.audit_device import AuditDevices, open_device

    devices = []
    for spec in specs:
        try:
            dev = open_device(spec)
        except ValueError as exc:
            for d in devices:
                d.close()
            raise EngramError(Code.STORE_UNAVAILABLE, str(exc)) from None
        target = Path(spec.partition(":")[2].partition("?")[0]).resolve()
        if target.is_relative_to(data_dir.resolve()):
            log.warning("audit device %s is inside the data directory: whoever can rewrite the store "
                        "can rewrite it too", dev.name)
        devices.append(dev)
    return AuditDevices(devices) if devices else None


class _LocalKeys(NamedTuple):
    trusted: TrustedHostKeys
    host_key_path: Path
    host_public: Ed25519PublicKey
    confirmation_key: Ed25519PrivateKey


def _local_keys(data_dir: Path, extra_trusted_pems: list[str]) -> _LocalKeys:
    """The keys trusted before the store is read: the local host key for contexts, the core's
    confirmation key for grants only (SPEC §2), and the operator's ``--trust-host-key`` PEMs."""
    host_key_path = data_dir / "host.key"
    host_public = load_or_create_private_key(host_key_path).public_key()
    confirmation_key = load_or_create_private_key(data_dir / "confirmation.key")
    trusted = TrustedHostKeys([host_public], grant_signers=[confirmation_key.public_key()])
    for pem in extra_trusted_pems:
        # --trust-host-key at start: the operator's own key, bound like host.key (docs/security.md).
        trusted.add(load_public_pem(pem), local=True)  # KeyRoleConflict: refuse to start, an operator error
    return _LocalKeys(trusted, host_key_path, host_public, confirmation_key)


def _trust_stored_keys(store: Store, trusted: TrustedHostKeys, host_public: Ed25519PublicKey) -> None:
    """Add the host keys trusted through AdminService, each with the tenants and maintenance scopes
    it is bound to, and record the local one."""
    with store.write() as tx:
        for row in tx.host_key_rows():
            if trusted.is_grant_signer(row.key_id):
                log.warning("stored trusted host key %s is the confirmation key; not trusted for contexts", row.key_id)
                continue
            trusted.add(load_public_pem(row.public_key_pem), tenants=row.tenants, all_tenants=row.all_tenants,
                        maintenance_scopes=row.maintenance_scopes)
            if not trusted.binding(row.key_id).local and not (row.tenants or row.all_tenants):
                log.warning("trusted host key %s serves no tenant (trusted before keys were bound, or restored): "
                            "bind it with `engram admin trust-host-key --tenant T`", row.key_id)
        tx.add_trusted_host_key(key_id(host_public), public_pem(host_public), 0)


def open_core(data_dir: Path, *, policies_dir: Path | None = None, opa_url: str | None = None,
              extra_trusted_pems: list[str] | None = None, clock: Clock | None = None,
              semantic: bool | None = None, policy: PolicyEngine | None = None,
              audit_devices: list[str] | None = None, load_index: bool = True,
              store_url: str | None = None, key_schedule: KeySchedule | None = None,
              index_max_records: int = 0, page_pin_capacity: int = MAX_PINS) -> OpenedCore:
    """Open (creating on first run) the data directory and the store its configuration names.

    ``policy``: the engine ``engram serve`` built (``build_serving_policy``, with its bundle
    server, signing and decision log); otherwise the same builder makes one over
    ``policies_dir`` or ``opa_url`` (``build_policy``). ``audit_devices`` are ``--audit-device``
    specs (engram_core/store/audit_device.py); ``store_url`` selects another engine than the
    data directory's DuckDB file (``engines.StoreConfig``); ``load_index`` False leaves the
    search index to the server, which builds it after it listens. ``page_pin_capacity``: the
    most search pins the core keeps in memory (``store/page_pins.py``; tests fill a smaller one)."""
    embedder = build_embedder(semantic)
    config = StoreConfig.from_options(data_dir, store_url, index_max_records=index_max_records,
                                      vector_search=embedder is not None)
    make_private(data_dir)  # keys and the store: owner only, also in a directory that already existed
    # Before the store opens, as ``engram serve`` builds it: settings that cannot work refuse the
    # start with nothing opened.
    engine = policy if policy is not None else build_policy(data_dir, policies_dir, opa_url)
    try:
        devices = _open_audit_devices(data_dir, audit_devices or [])
        keys = _local_keys(data_dir, extra_trusted_pems or [])
        vault = build_vault(config)
        store = open_store(config, vault=vault, load_index=load_index, audit_devices=devices)
        _trust_stored_keys(store, keys.trusted, keys.host_public)
    except BaseException:
        if policy is None:
            engine.close()  # built here: the caller's own is the caller's to close
        raise
    core = Core(data_dir=data_dir, store=store, vault=vault, policy=engine,
                hasher=TermHasher(load_or_create_secret(data_dir / "index.key")),
                page_key=load_or_create_secret(data_dir / "page.key"),
                trusted=keys.trusted, clock=clock, embedder=embedder, key_schedule=key_schedule,
                open_key_dir=open_key_source, page_pin_capacity=page_pin_capacity)
    try:
        CoreSigners.load(data_dir)  # the backup and anchor keys exist before their fingerprints are checked
        check_shared_secrets(store, data_dir, vault.ring.ring_id)  # a store opened with other key files refuses
        reanalyze_lexical(core)  # postings of an older analyzer are re-derived before anything is served
        reembed_vectors(core)  # and vectors of an older model
    except BaseException:
        core.close()  # the fence is released: the operator fixes the files and starts again
        raise
    make_private(data_dir)  # what opening created (the DuckDB file, key slots) in a process without umask 077
    return OpenedCore(core, keys.host_key_path, keys.confirmation_key)


def build_services(opened: OpenedCore, metrics: CoreMetrics | None = None) -> Services:
    """The services on an open core, with their observers fitted (logs, metrics, spans)."""
    from engram_core.app.observed_ports import observe_core

    core = opened.core
    secrets_scan.module_ready()  # the scanner's fold table, before the first capture needs it
    memory = MemoryService(core)
    observe_core(core, memory, metrics)
    signers = CoreSigners.load(core.data_dir)
    return Services(memory=memory, host=HostServiceCore(core, opened.confirmation_key),
                    admin=AdminServiceCore(core), maintenance=MaintenanceService(core, memory.mutations, signers),
                    backups=BackupService(core, memory.mutations, signers.backup))


def start_core(data_dir: Path, *, listen: str = "127.0.0.1:0", policies_dir: Path | None = None,
               opa_url: str | None = None, extra_trusted_pems: list[str] | None = None, clock: Clock | None = None,
               max_workers: int = 16, semantic: bool | None = None, policy: PolicyEngine | None = None,
               audit_devices: list[str] | None = None, metrics: CoreMetrics | None = None,
               tls: ServerTls | None = None, store_url: str | None = None,
               key_schedule: KeySchedule | None = None, index_max_records: int = 0,
               page_pin_capacity: int = MAX_PINS, health_interval_s: float = HEALTH_INTERVAL_S) -> RunningCore:
    """Open the core and serve it. The search index is built after the server listens: until
    it is, the health of the engram services is NOT_SERVING (readiness) while ``liveness``
    is SERVING; a call that comes early waits for the index instead of failing.

    ``tls``: serve over TLS (mutual with a client CA). Whether plaintext may listen on
    ``listen`` is the caller's rule (``engram serve`` refuses a non-loopback address without
    TLS unless told ``--insecure``). ``health_interval_s``: how often standard health is checked
    (``rpc/server.py``, a second by default; not an operator option)."""
    opened = open_core(
        data_dir, policies_dir=policies_dir, opa_url=opa_url, extra_trusted_pems=extra_trusted_pems, clock=clock,
        semantic=semantic, policy=policy, audit_devices=audit_devices, load_index=False, store_url=store_url,
        index_max_records=index_max_records, page_pin_capacity=page_pin_capacity,
        key_schedule=key_schedule)
    try:
        services = build_services(opened, metrics)
    except BaseException:
        opened.core.close()
        raise
    return serve(opened.core, services, host_key_path=opened.host_key_path, listen=listen, max_workers=max_workers,
                 metrics=metrics, tls=tls, health_interval_s=health_interval_s)
