"""`engram serve`: run the core until SIGINT/SIGTERM; SIGHUP reloads policies.

SIGTERM drains: the health services turn NOT_SERVING, calls in flight get up to
``--drain-seconds`` to finish (gRPC cancels the rest, none of which was acknowledged), then
the store closes cleanly, so the next start has no audit spool to replay (docs/operations.md).
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import logging
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from engram_core.contract.errors import EngramError
from engram_core.policy.serving import PolicySettings, build_serving_policy
from engram_core.rpc.tls import ServerTls, plaintext_refusal
from engram_core.store.file_modes import private_umask


def _fail(message: str) -> int:
    print(f"engram serve: {message}", file=sys.stderr)
    return 2


def listen_problem(listen: str) -> str | None:
    """Why ``listen`` cannot be bound, checked before the data directory is touched."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        return f"--listen must be HOST:PORT, got {listen!r}"
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror:
        return f"cannot resolve the listen host {host!r}"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{listen} is already in use (another engram serve?); pick another with --listen HOST:PORT"
            return f"cannot listen on {listen}: {exc.strerror}"
    return None


def serve_main(args: argparse.Namespace) -> int:
    from engram_core.app.composition import start_core
    from engram_core.cli.first_serve import activate_first_scope
    from engram_core.observability import tracing
    from engram_core.observability.logs import configure_logging, log_event
    from engram_core.observability.metrics import CoreMetrics, serve_metrics
    from engram_core.services.keyring import DAY_MS, KeySchedule

    configure_logging(getattr(args, "log_format", "text"))
    store_url = getattr(args, "store", None)
    if store_url is not None:
        from engram_core.app.engines import store_conninfo

        if not getattr(args, "key_dir", None):
            return _fail("--store needs --key-dir DIR: the KEK ring and the secrets every core of the store shares")
        try:
            store_conninfo(store_url)  # a password in it is refused before anything is opened
        except ValueError as exc:
            return _fail(str(exc))
        args.data = args.key_dir  # the directory of this core's keys and files, as --data is for DuckDB
    elif getattr(args, "index_max_records", 0):
        return _fail("--index-max-records goes with --store (a DuckDB core holds every scope's index)")
    elif getattr(args, "key_dir", None):
        return _fail("--key-dir goes with --store (a DuckDB store keeps its keys in --data)")
    problem = listen_problem(args.listen)
    if problem:
        return _fail(problem)
    try:
        tls = _server_tls(args)
    except (OSError, ValueError) as exc:
        return _fail(str(exc))
    refusal = plaintext_refusal(args.listen, tls, getattr(args, "insecure", False))
    if refusal:
        return _fail(refusal)
    private_umask()  # every file this process creates in the data directory is owner-only (0600)
    if not args.opa_url and importlib.util.find_spec("opa_bindings") is None:
        from engram_core.policy import OPA_BINDINGS_HINT

        return _fail(OPA_BINDINGS_HINT)  # before the data directory is created
    try:
        pems = [Path(p).read_text() for p in args.trust_host_key]
    except OSError as exc:
        return _fail(f"--trust-host-key: cannot read {exc.filename} ({exc.strerror})")
    if tracing.wanted(getattr(args, "otel", False)):
        try:
            tracing.configure("engram-core")
        except ValueError as exc:
            return _fail(str(exc))
    metrics = CoreMetrics(tenant_labels=args.metrics_tenant_labels) if getattr(args, "metrics", None) else None
    try:
        settings = policy_settings(args)
        serving = build_serving_policy(settings, Path(args.data))
    except ValueError as exc:
        return _fail(str(exc))
    try:
        running = start_core(
            Path(args.data), listen=args.listen, extra_trusted_pems=pems, audit_devices=args.audit_device,
            metrics=metrics, tls=tls, policy=serving.engine,
            key_schedule=KeySchedule(rotation_interval_ms=getattr(args, "key_rotation_interval", DAY_MS),
                                     retention_ms=getattr(args, "key_retention", DAY_MS)),
            store_url=store_url, index_max_records=getattr(args, "index_max_records", 0),
        )
    except EngramError as exc:
        serving.engine.close()
        return _fail(f"{exc.code.value}: {exc.detail}")
    except (OSError, ValueError) as exc:  # the message names paths or addresses, never key material
        serving.engine.close()
        return _fail(f"cannot start: {exc}")
    serving.start_pulling(running.core.policy.reload, settings)
    if metrics is not None:
        from engram_core.policy.metrics import PolicyCollector

        metrics.registry.register(PolicyCollector(logger=serving.logger, source=serving.source,
                                                  engine=running.core.policy))
    metrics_server, metrics_address = None, ""
    if metrics is not None:
        try:
            metrics_server, metrics_address = serve_metrics(args.metrics, metrics.registry)
        except (OSError, ValueError) as exc:
            running.stop(0)
            return _fail(f"cannot serve metrics on {args.metrics}: {exc}")
    activated = None
    try:
        activated = activate_first_scope(running.core, Path(args.data), running.host_key_path)
    except (EngramError, ValueError) as exc:  # serve anyway: the operator can still activate by hand
        detail = f"{exc.code.value}: {exc.detail}" if isinstance(exc, EngramError) else str(exc)
        print(f"engram serve: could not activate the scope named by engram init ({detail}); "
              "use `engram admin activate`", file=sys.stderr, flush=True)
    if activated:
        logging.getLogger("engram.core").info("activated %s (first serve after engram init)", activated)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def reload(*_: object) -> None:
        try:
            running.core.policy.reload()  # logged (policy_reload event) by the observed engine
        except EngramError:
            pass

    signal.signal(signal.SIGHUP, reload)
    # Machine-readable ready line, always the first line on stdout: tests and scripts wait for it.
    described = _described(running.core.store)
    where = f"store {described['store']}, key dir {args.data}" if store_url else f"data {args.data}"
    print(f"engram core listening on {running.address} ({where}, host key {running.host_key_path})", flush=True)
    opened = opened_summary(running, args, metrics_address, described)
    opened.update(serving.describe())
    if not running.core.policy.active() and (serving.refused or serving.unavailable):
        problem = serving.refused or {}
        where = ":".join(str(x) for x in (problem.get("file"), problem.get("line")) if x)
        why = f"bundle refused: {where + ': ' if where else ''}{problem.get('error')}" if serving.refused \
            else serving.unavailable
        opened["policy_revision"] = f"NONE (not serving: {why})"
    print("engram core opened: " + ", ".join(f"{k} {v}" for k, v in opened.items()), flush=True)
    log_event("started", **opened)
    if described["migrations_applied"]:
        log_event("migration", applied=described["migrations_applied"], trigger="open")
    if described["audit_spool_replayed_rows"]:
        log_event("audit_spool_replayed", logging.WARNING, rows=described["audit_spool_replayed_rows"])
    # Never a bare stop.wait(): the kernel may deliver SIGTERM to any thread (gRPC's, the policy
    # engine's Go runtime), and Python runs handlers only in the main thread once it wakes up; a
    # wait without a timeout may never wake, and the signal is never handled.
    while not stop.wait(0.5):
        pass
    drain = getattr(args, "drain_seconds", 10.0)
    log_event("draining", grace_s=drain)
    serving.stop_pulling()
    running.stop(drain)  # closes the policy engine, and with it the decision logger (flushed)
    log_event("stopped", store_closed=not running.core.store.is_open())
    if metrics_server is not None:
        metrics_server.shutdown()
    tracing.shutdown()
    return 0


def policy_settings(args: argparse.Namespace) -> PolicySettings:
    """The policy flags of `engram serve`, checked before the data directory is touched."""
    from engram_core.policy.decisionlog.config import parse_decision_log

    token = None
    token_file = getattr(args, "bundle_bearer_token_file", None)
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"--bundle-bearer-token-file: cannot read {token_file} ({exc.strerror})") from None
    key = getattr(args, "bundle_verification_key", None)
    log_spec = getattr(args, "decision_log", None)
    poll_min, poll_max = getattr(args, "bundle_poll_min_seconds", 10.0), getattr(args, "bundle_poll_max_seconds", 20.0)
    if not 0 < poll_min <= poll_max:
        raise ValueError("--bundle-poll-min-seconds must be positive and at most --bundle-poll-max-seconds")
    return PolicySettings(
        policies=Path(args.policies) if args.policies else None, opa_url=args.opa_url,
        bundle_url=getattr(args, "bundle_url", None), verification_key=Path(key) if key else None,
        poll_min_s=poll_min, poll_max_s=poll_max, bundle_token=token,
        decision_log=parse_decision_log(log_spec) if log_spec else None,
        allow_rollback=getattr(args, "bundle_allow_rollback", None))


def _server_tls(args: argparse.Namespace) -> ServerTls | None:
    """The TLS settings of `engram serve`, read before the data directory is touched."""
    cert, key, client_ca = (getattr(args, name, None) for name in ("tls_cert", "tls_key", "client_ca"))
    if not cert and not key:
        if client_ca:
            raise ValueError("--client-ca needs --tls-cert and --tls-key")
        return None
    if not cert or not key:
        raise ValueError("--tls-cert and --tls-key go together")
    try:
        return ServerTls.from_files(cert, key, client_ca)
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename} ({exc.strerror})") from None


def tls_enabled(args: argparse.Namespace) -> bool:
    """Whether `engram serve` serves TLS (``--tls-cert``/``--tls-key``)."""
    return bool(getattr(args, "tls_cert", None) and getattr(args, "tls_key", None))


def tls_mode(args: argparse.Namespace) -> str:
    if not tls_enabled(args):
        return "off"
    return "on (mutual: client certificates required)" if getattr(args, "client_ca", None) else "on"


def _described(store: Any) -> dict[str, Any]:
    """The store's start-up summary (``Store.describe``), or what is known without it when the
    database does not answer now: a store that went away after the core opened it (PostgreSQL
    restarting) leaves this core serving, its calls answering STORE_UNAVAILABLE until it is back."""
    from engram_core.observability.logs import log_event

    try:
        return {**store.describe(), "schema_version": max((m["version"] for m in store.migration_ledger()),
                                                          default=0)}
    except EngramError as exc:
        log_event("store_summary_unavailable", logging.WARNING, code=exc.code.value)
        return {"store": f"unavailable ({exc.code.value})", "schema_version": "?", "migrations_applied": [],
                "audit_spool_replayed_rows": 0, "scopes": "?", "records": {}, "candidates": {}, "audit_rows": "?"}


def opened_summary(running: Any, args: argparse.Namespace, metrics_address: str,
                   counts: dict[str, Any] | None = None) -> dict[str, Any]:
    """What start-up opened, as identifiers and counts (also the ``started`` log event)."""
    from engram_core.observability import tracing

    core = running.core
    counts = counts if counts is not None else _described(core.store)
    revision = core.policy.revision()
    return {
        "store": counts["store"],
        "schema_version": counts["schema_version"],
        "migrations_applied": counts["migrations_applied"] or "none",
        "audit_spool_replayed_rows": counts["audit_spool_replayed_rows"],
        "scopes": counts["scopes"],
        "records": sum(counts["records"].values()),
        "records_by_state": counts["records"] or "none",
        "candidates_by_state": counts["candidates"] or "none",
        "audit_rows": counts["audit_rows"],
        "policy_revision": revision or "NONE (not serving: bundle not active)",
        "semantic": "on" if core.embedder is not None else "off",
        "listen": running.address,
        "tls": tls_mode(args),
        "metrics": f"http://{metrics_address}/metrics" if metrics_address else "off",
        "tracing": "on" if tracing.enabled() else "off",
    }
