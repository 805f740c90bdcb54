"""`engram serve`: run the core until SIGINT/SIGTERM; SIGHUP reloads policies."""

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

from engram_core.errors import EngramError


def _fail(message: str) -> int:
    print(f"engram serve: {message}", file=sys.stderr)
    return 2


def _listen_problem(listen: str) -> str | None:
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
    from engram_core.rpc.first_serve import activate_first_scope
    from engram_core.rpc.server import start_core

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    problem = _listen_problem(args.listen)
    if problem:
        return _fail(problem)
    if not args.opa_url and importlib.util.find_spec("opa_bindings") is None:
        from engram_core.policy import OPA_BINDINGS_HINT

        return _fail(OPA_BINDINGS_HINT)  # before the data directory is created
    try:
        pems = [Path(p).read_text() for p in args.trust_host_key]
    except OSError as exc:
        return _fail(f"--trust-host-key: cannot read {exc.filename} ({exc.strerror})")
    try:
        running = start_core(
            Path(args.data), listen=args.listen,
            policies_dir=Path(args.policies) if args.policies else None,
            opa_url=args.opa_url, extra_trusted_pems=pems, audit_devices=args.audit_device,
        )
    except EngramError as exc:
        return _fail(f"{exc.code.value}: {exc.detail}")
    except (OSError, ValueError) as exc:  # the message names paths or addresses, never key material
        return _fail(f"cannot start: {exc}")
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
            rev = running.core.policy.reload()
            logging.getLogger("engram.core").info("policies reloaded, revision %s", rev)
        except EngramError as exc:
            logging.getLogger("engram.core").error("policy reload failed: %s", exc.code.value)

    signal.signal(signal.SIGHUP, reload)
    # Machine-readable ready line: tests and scripts wait for it.
    print(f"engram core listening on {running.address} (data {args.data}, host key {running.host_key_path})", flush=True)
    stop.wait()
    running.stop()
    return 0
