"""`engram serve`: run the core until SIGINT/SIGTERM; SIGHUP reloads policies."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from engram_core.errors import EngramError


def serve_main(args: argparse.Namespace) -> int:
    from engram_core.rpc.server import start_core

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    pems = [Path(p).read_text() for p in args.trust_host_key]
    try:
        running = start_core(
            Path(args.data), listen=args.listen,
            policies_dir=Path(args.policies) if args.policies else None,
            opa_url=args.opa_url, extra_trusted_pems=pems,
        )
    except EngramError as exc:
        print(f"engram serve: {exc.code.value}: {exc.detail}", file=sys.stderr)
        return 2
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
