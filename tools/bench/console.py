"""The console's pages at scale (issue 61: every page within 300 ms p95 at 100k records).

    .venv/bin/python -m tools.bench.console                     # 100k records
    .venv/bin/python -m tools.bench.console --records 10000 --requests 30

Loads N accepted records into one scope in-process (tools/bench/loader.py: no audit rows for
them), serves the store with a real core whose policy holds that tenant's asserted captures for
review, holds five captures an agent makes over gRPC, starts a real `engram console` process,
signs in with the local token, then times each page (GET, full answer read) ``--requests``
times, sequentially, one client: every page, the Memory page's browsing (newest, by state, an older
page) and the candidate page included, and apart the audit page's **Verify again** action, which
reads the whole store (three times at most). Prints and writes JSON: p50/p95/max per page.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

TENANT, WORKSPACE = "bench", "console"
HELD = 5


def _held_policies(dest: Path) -> Path:
    from engram_core.policy import default_bundle_dir

    shutil.copytree(default_bundle_dir(), dest)
    data = json.loads((dest / "data.json").read_text())
    data["engram"]["config"]["tenants"][TENANT] = {"adjudication_trust_classes": ["asserted"]}
    (dest / "data.json").write_text(json.dumps(data))
    return dest


def _hold(address: str, key_path: str, n: int) -> None:
    """``n`` captures an agent makes and asks to admit, each held for review."""
    import grpc

    from engram_core.api import memory_pb2, memory_pb2_grpc
    from engram_core.rpc.convert import message_to_value, value_to_message
    from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context
    from engram_core.trust.hostkeys import load_private_key_file
    from tools.bench.corpus import PURPOSE, Corpus

    key = load_private_key_file(key_path)
    corpus = Corpus(seed=5)
    with grpc.insecure_channel(address) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        def call(tool: str, rpc: str, args: dict[str, Any], cls: Any) -> dict[str, Any]:
            ctx = make_context(key, call=tool, tenant=TENANT, workspace=WORKSPACE, principal="agent:bench",
                               agent_id="bench", session="s", purpose_ref=PURPOSE, now_ms=time.time_ns() // 1_000_000)
            return message_to_value(getattr(stub, rpc)(value_to_message(args, cls()),
                                                       metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=60))

        for i in range(n):
            cand = call("engram_memory_capture", "Capture", corpus.capture_args("held", 10_000_000 + i),
                        memory_pb2.CaptureRequest)["candidate_id"]
            out = call("engram_memory_request_admission", "RequestAdmission",
                       {"candidate_id": cand, "idempotency_key": "adm-" + secrets.token_hex(8)},
                       memory_pb2.RequestAdmissionRequest)["outcome"]
            if out["status"] != "pending_adjudication":
                raise SystemExit(f"a capture meant to be held was {out['status']}")


def _get(url: str, cookie: str = "", form: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a: Any, **k: Any) -> None:
            return None

    data = None if form is None else urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(url, data=data, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.build_opener(_NoRedirect).open(req, timeout=120) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def _sign_in(url: str, token: str) -> str:
    _, headers, _ = _get(url + "/signin")
    pre = next(c for c in headers.get_all("Set-Cookie") if c.startswith("engram_console_pre=")).split(";")[0]
    status, headers, _ = _get(url + "/signin", pre, {"csrf": pre.split("=", 1)[1], "token": token})
    if status != 303:
        raise SystemExit(f"sign-in answered {status}")
    return next(c for c in headers.get_all("Set-Cookie") if c.startswith("engram_console=")).split(";")[0]


def run(records: int, requests: int, root: Path) -> dict[str, Any]:
    from engram_core.app.composition import open_core, start_core
    from tools.bench.corpus import Corpus
    from tools.bench.loader import activate_scope, load_scope

    data = root / "data"
    core, _, _ = open_core(data, semantic=False, load_index=False)
    activate_scope(core, TENANT, WORKSPACE)
    t0 = time.perf_counter()
    load_scope(core, Corpus(seed=11), TENANT, WORKSPACE, records, embed=False, reload=False)
    load_s = time.perf_counter() - t0
    core.store.close()
    running = start_core(data, policies_dir=_held_policies(root / "policies"), semantic=False)
    console = None
    try:
        _hold(running.address, running.host_key_path, HELD)
        token = secrets.token_urlsafe(32)
        (root / "host.token").write_text(token + "\n")
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        engram = Path(sys.executable).with_name("engram")
        log = (root / "console.log").open("wb")
        console = subprocess.Popen([str(engram), "console", "--core", running.address, "--host-key",
                                    running.host_key_path, "--listen", f"127.0.0.1:{port}", "--token-file",
                                    str(root / "host.token"), "--scope", f"{TENANT}/{WORKSPACE}"],
                                   stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(url + "/signin")
                break
            except OSError:
                if console.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("engram console did not start") from None
                time.sleep(0.2)
        cookie = _sign_in(url, token)
        scope = f"/s/{TENANT}/{WORKSPACE}"
        word = Corpus(seed=11).queries(1)[0]
        _, _, queue = _get(url + scope + "/review", cookie)
        held = re.search(rb"/candidates/([A-Za-z0-9_]+)\"", queue)
        if held is None:
            raise SystemExit("the review queue lists no candidate")
        # Every page a person opens (GET), the sign-in form included. Verify again is an action
        # (the audit page's button): it reads the whole store, O(store), and is timed apart, 3 times.
        pages = {"signin": "/signin", "home": "/", "review": scope + "/review",
                 "candidate": scope + "/candidates/" + held.group(1).decode(),
                 "memory": scope + "/memory?q=" + urllib.parse.quote(word),
                 "memory_browse": scope + "/memory", "memory_browse_state": scope + "/memory?state=accepted_current",
                 "memory_browse_older": scope + f"/memory?before={records // 2}",
                 "audit": scope + "/audit", "policy": scope + "/policy", "keys": scope + "/keys",
                 "confirmations": "/confirmations",
                 "audit_verify": scope + "/audit?verify=1"}
        from tools.bench.stats import percentile

        results: dict[str, Any] = {}
        for name, path in pages.items():
            status, _, body = _get(url + path, cookie)  # warm-up (the first verification of the scope, too)
            if status != 200:
                said = re.search(rb"<main[^>]*>(.*?)</main>", body, re.S)
                text = re.sub(rb"<[^>]+>|\s+", b" ", said.group(1) if said else body)[:400].decode(errors="replace")
                raise SystemExit(f"{name} answered {status}: {text}")
            times = []
            for _ in range(min(requests, 3) if name == "audit_verify" else requests):
                t = time.perf_counter()
                _get(url + path, cookie)
                times.append((time.perf_counter() - t) * 1000)
            times.sort()
            results[name] = {"p50_ms": round(percentile(times, 50), 1), "p95_ms": round(percentile(times, 95), 1),
                             "max_ms": round(times[-1], 1), "n": len(times)}
        return {"records": records, "held": HELD, "load_s": round(load_s, 1), "requests": requests, "pages": results}
    finally:
        if console is not None:
            console.terminate()
            console.wait(timeout=10)
        running.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.console", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=50, help="timed GETs per page (default: %(default)s)")
    parser.add_argument("--out", default=None, help="write the JSON here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="engram-console-bench-") as tmp:
        doc = run(args.records, args.requests, Path(tmp))
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
