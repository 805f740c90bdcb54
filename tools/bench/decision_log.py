"""What decision logging costs a call (issue 30): the same workload against ``engram serve`` with
``--decision-log`` off and on, in alternating rounds of one run (so the machine's drift falls on
both), through gRPC.

    .venv/bin/python -m tools.bench.decision_log [--size 2000] [--clients 1,4] [--rounds 3]
        [--duration 4] [--sink file|http] [--out FILE]

Per logging state, client count and operation (search, get, capture, request_admission): the
median across rounds of p50 and p95 latency, and the server process's CPU time per operation;
then the overhead of logging on, in percent of the figure with logging off. The logged run's
own counters (events written, dropped by reason) come from its metrics endpoint. The machine's
facts and load averages go with the figures: on a shared VM they say how much to trust them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tools.bench.corpus import PURPOSE, Corpus
from tools.bench.grpc_client import GrpcAgent, activate
from tools.bench.machine import facts, loadavg, process_cpu_s
from tools.bench.report import print_and_save
from tools.bench.stats import percentile

TENANT, WORKSPACE = "bench", "dlog"
ENGRAM = str(Path(sys.executable).with_name("engram"))
OPS = ("search", "get", "capture", "request_admission")


def _load(data: Path, size: int) -> list[str]:
    from engram_core.app.composition import open_core
    from tools.bench.loader import activate_scope, load_scope

    core, _, _ = open_core(data, semantic=False, load_index=False)
    try:
        activate_scope(core, TENANT, WORKSPACE)
        return load_scope(core, Corpus(seed=30), TENANT, WORKSPACE, size, embed=False, reload=False)
    finally:
        core.store.close()


class _Serve:
    def __init__(self, data: Path, extra: list[str]) -> None:
        argv = [ENGRAM, "serve", "--data", str(data), "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", *extra]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "ENGRAM_SEMANTIC": "off"})
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        opened = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"engram serve did not start: {line!r}")
        self.address = line.split("listening on ", 1)[1].split()[0]
        self.metrics_url = "http://" + opened.split("metrics http://", 1)[1].split()[0].rstrip(",")

    def metric(self, prefix: str) -> dict[str, float]:
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(prefix)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class _Collector:
    """A decision-log service that accepts every upload (the http sink's far end)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/logs"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def _workload(address: str, key: Path, clients: int, duration: float, corpus: Corpus, records: list[str],
              salt: str) -> tuple[dict[str, list[float]], int]:
    lat: dict[str, list[float]] = {op: [] for op in OPS}
    lock = threading.Lock()
    errors = [0]
    queries = corpus.queries(200)
    stop = time.monotonic() + duration

    def client(n: int) -> None:
        agent = GrpcAgent(address, key, tenant=TENANT, workspace=WORKSPACE)
        i = 0
        try:
            while time.monotonic() < stop:
                i += 1
                timings = []
                t0 = time.perf_counter()
                agent.call("search", {"query": queries[(n * 31 + i) % len(queries)], "purpose_ref": PURPOSE})
                t1 = time.perf_counter()
                agent.call("get", {"record_id": records[(n * 17 + i) % len(records)], "purpose_ref": PURPOSE})
                t2 = time.perf_counter()
                cap = agent.call("capture", corpus.capture_args(f"{salt}-{n}", i))
                t3 = time.perf_counter()
                agent.call("request_admission", {"candidate_id": cap["candidate_id"],
                                                 "idempotency_key": f"dlog-adm-{salt}-{n}-{i:08d}"})
                t4 = time.perf_counter()
                timings = [("search", t1 - t0), ("get", t2 - t1), ("capture", t3 - t2), ("request_admission", t4 - t3)]
                with lock:
                    for op, seconds in timings:
                        lat[op].append(seconds)
        except Exception:  # noqa: BLE001 - counted and reported
            with lock:
                errors[0] += 1
        finally:
            agent.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, errors[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.decision_log", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=2000)
    p.add_argument("--clients", default="1,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--sink", choices=("file", "http"), default="file")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    clients = [int(x) for x in a.clients.split(",")]
    corpus = Corpus(seed=30)
    began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before = loadavg()
    points: dict[str, dict[str, Any]] = {}
    counters: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="engram-bench-dlog-") as tmp:
        data = Path(tmp) / "data"
        print(f"loading {a.size} records …", file=sys.stderr)
        records = _load(data, a.size)
        collector = _Collector() if a.sink == "http" else None
        sink = collector.url if collector else f"file:{Path(tmp) / 'decisions.jsonl'}"
        for rnd in range(a.rounds):
            for state in (("off", "on") if rnd % 2 == 0 else ("on", "off")):
                served = _Serve(data, ["--decision-log", sink] if state == "on" else [])
                try:
                    activate(served.address, data / "host.key", TENANT, WORKSPACE)
                    _workload(served.address, data / "host.key", 1, 1.0, corpus, records, f"warm{rnd}{state}")
                    for n in clients:
                        cpu0 = process_cpu_s(served.proc.pid)
                        lat, errors = _workload(served.address, data / "host.key", n, a.duration, corpus, records,
                                                f"r{rnd}{state}{n}")
                        cpu = process_cpu_s(served.proc.pid) - cpu0
                        ops = sum(len(v) for v in lat.values())
                        for op, values in lat.items():
                            point = points.setdefault(f"{state}/{n}/{op}", {"p50_ms": [], "p95_ms": [], "n": 0})
                            ordered = sorted(v * 1000 for v in values)
                            point["p50_ms"].append(percentile(ordered, 50))
                            point["p95_ms"].append(percentile(ordered, 95))
                            point["n"] += len(values)
                        cpu_point = points.setdefault(f"{state}/{n}/server_cpu_ms_per_op", {"values": []})
                        cpu_point["values"].append(1000 * cpu / ops if ops else float("nan"))
                        if errors:
                            print(f"round {rnd} {state} {n} clients: {errors} client errors", file=sys.stderr)
                    if state == "on":
                        for k, v in served.metric("engram_decision_log_").items():
                            counters[k] = counters.get(k, 0.0) + v
                finally:
                    served.stop()
                print(f"round {rnd + 1}/{a.rounds} logging {state} done", file=sys.stderr)
    summary: dict[str, Any] = {"clients": clients, "rounds": a.rounds, "duration_s": a.duration, "size": a.size,
                               "sink": a.sink, "started": began, "machine": facts(),
                               "loadavg_before": load_before, "loadavg_after": loadavg(),
                               "decision_log_counters_summed_over_on_rounds": counters, "ops": {}}
    for n in clients:
        for op in (*OPS, "server_cpu_ms_per_op"):
            off, on = points[f"off/{n}/{op}"], points[f"on/{n}/{op}"]
            if op == "server_cpu_ms_per_op":
                o, w = statistics.median(off["values"]), statistics.median(on["values"])
                summary["ops"][f"{n} clients/{op}"] = {"off": round(o, 3), "on": round(w, 3),
                                                      "overhead_pct": round(100 * (w - o) / o, 1)}
                continue
            row = {}
            for k in ("p50_ms", "p95_ms"):
                o, w = statistics.median(off[k]), statistics.median(on[k])
                row[k] = {"off": round(o, 3), "on": round(w, 3), "overhead_pct": round(100 * (w - o) / o, 1)}
            row["calls"] = {"off": off["n"], "on": on["n"]}
            summary["ops"][f"{n} clients/{op}"] = row
    print_and_save(summary, a.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
