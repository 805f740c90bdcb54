"""The secret scanner's benchmark (issue 13 finding 1, issue 26 item 4): pathological and
ordinary inputs.

    .venv/bin/python -m tools.bench.scanner                       # 1 KiB, 64 KiB, 1 MiB; 30 reps
    .venv/bin/python -m tools.bench.scanner --sizes 65536 --reps 5
    .venv/bin/python -m tools.bench.scanner --shapes prose,slot_placeholders

For each shape and size: ``scan()`` on one text of that many UTF-8 bytes, repeated, with
p50/p99 of wall time and of the calling thread's CPU time (CPU time is what the scan costs;
wall time also holds what other processes on a shared machine took). Shapes: the two the
adversarial review reported (``dotenv_TOKEN``, ``cookie_sid``: seconds at 32 KiB before
RE2), the worst cases found since (every rule keyword present, near-miss assignments, runs of
exactly 40 base64 characters, Discord-prefix runs, invisible characters between letters,
an 18-fold NFKC expander), those of issue 26's rules (credential slots full of placeholders
or code, each judged in Python up to the slot budget; an unclosed quote after a key; runs of
curl flags and of DSN-like colons; look-alike letters; line separators and control
characters between letters), issue 57's (soups of rule words in mixed case, and folded from
full-width letters, that sent RE2 to its NFA; ``-----BEGIN`` runs; unterminated values), ordinary
prose, and a typical capture's strings. ``python -m
tools.bench`` runs this too (``--no-scanner`` skips it) and stores it under ``"scanner"``.

The shapes depend only on this file, so the same run can measure an older scanner: put this
file's ``tools/`` beside an older ``engram_core/`` (``git archive REF engram_core``) and run it
from there with the same interpreter (docs/performance.md, "Secret scanner").
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import time
from pathlib import Path
from typing import Any

from engram_core.secret_scan.rules import RULES
from engram_core.secret_scan.scan import module_ready, scan
from tools.bench import machine
from tools.bench.corpus import Corpus
from tools.bench.stats import percentile

DEFAULT_SIZES = (1 << 10, 1 << 16, 1 << 20)
B64 = string.ascii_letters + string.digits + "+/"


def _fill(unit: str, n_bytes: int) -> str:
    """``unit`` repeated to ``n_bytes`` UTF-8 bytes (whole units when it is not ASCII)."""
    if unit.isascii():
        return (unit * (n_bytes // len(unit) + 1))[:n_bytes]
    return unit * max(1, n_bytes // len(unit.encode()))


def _random(alphabet: str, n: int, rng: random.Random) -> str:
    return "".join(rng.choices(alphabet, k=n))


def shapes(n_bytes: int, rng: random.Random | None = None) -> dict[str, str]:
    """Each shape as one text of about ``n_bytes`` UTF-8 bytes."""
    rng = rng or random.Random(13)
    keywords = " ".join(k for r in RULES for k in r.keywords) + " "
    corpus = Corpus()
    capture_strings: list[str] = []
    i = 0
    while sum(len(s.encode()) + 1 for s in capture_strings) < n_bytes:
        args = corpus.capture_args("bench", i)
        p = args["payload"]
        capture_strings += [args["idempotency_key"], p["purpose_ref"], p["primary_event"]["type_ref"]]
        capture_strings += [c["text"] for c in p["components"]]
        capture_strings += [f for c in p["citations"] for f in (c["source_ref"], c["locator"]["value"])]
        i += 1
    return {
        "prose": _fill("The quick brown fox jumps over the lazy dog; we chose DuckDB for its WAL. ", n_bytes),
        "capture_strings": "\n".join(capture_strings)[:n_bytes],
        "dotenv_TOKEN": " " + _fill("TOKEN", n_bytes - 1),
        "cookie_sid": "cookie:" + _fill("sid", n_bytes - 7),
        "every_keyword": _fill(keywords, n_bytes),
        "assignment_near_misses": _fill("aws secret key: " + "A" * 39 + " ", n_bytes),
        "base64_runs_of_40": " ".join(_random(B64, 40, rng) for _ in range(n_bytes // 41)),
        "discord_prefix_run": _random("MNOab-_", n_bytes, rng),
        "invisible_between_letters": _fill("ghp\u200b", n_bytes),
        "expanding_nfkc": _fill("\ufdfa", n_bytes),
        # issue 26 item 4
        "slot_placeholders": _fill('"password": "changeme", "api_key": "${API_KEY}", TOKEN=<redacted> ', n_bytes),
        "slot_code": _fill("signing_key: Ed25519PrivateKey, private_key=self.key, password = cfg.pw\n", n_bytes),
        "json_config": _fill('{"host": "db.internal", "port": 5432, "user": "app", "timeout_s": 30}, ', n_bytes),
        "unclosed_quote": 'password: "' + _fill("a", n_bytes - 11),
        "curl_flag_runs": "curl " + _fill(" -u x", n_bytes - 5),
        "dsn_colon_runs": _fill("a:bbb@", n_bytes),
        "look_alikes": _fill("gh\u0440_ \u0410KIA x\u03bfxb- \u0440\u0430ssword: ", n_bytes),
        "cyrillic_prose": _fill("Мы храним пароль в хранилище, а токен API меняем каждые 90 дней. ", n_bytes),
        "separator_between_letters": _fill("ghp\u2028", n_bytes),
        "control_between_letters": _fill("ghp\x00", n_bytes),
        # issue 57 item 8: soups of rule words in mixed case (the slot rules' values run to the
        # end of the text: 55 ms per MiB each on RE2's NFA; the AWS assignment and private-key
        # rules' DFA states multiplied), the same folded from full-width letters, and other shapes
        "mixed_case_key_soup": _soup(["password", "API", "SECRET", "A", "=", "Key", "pass", ";"], n_bytes, rng),
        "aws_assignment_soup": _soup(["AwS", "x", "kEy", ":", "="], n_bytes, rng),
        "aws_tab_soup": _soup(["\t", ":", "sk-", "AWS", "secret"], n_bytes, rng),
        "all_slow_rules_soup": _soup(["AwS", "x", "kEy", ":", "=", "password", "SECRET", "pass"], n_bytes, rng),
        "fullwidth_key_soup": _full_width(_soup(["AwS", "x", "kEy", ":", "=", "password", "SECRET", "pass"],
                                                n_bytes // 3, rng)),
        "fullwidth_letters": _fill("".join(chr(0xFF21 + i) + chr(0xFF41 + i) for i in range(26)), n_bytes),
        "pem_begin_run": _soup(["-----BEGIN", " "], n_bytes, rng, [6, 4]),
        "atlassian_prefix_run": _soup(["ATATT3", "a", ":"], n_bytes, rng, [50, 48, 2]),
        "unterminated_value": "password=" + _fill("a", n_bytes - 9),
        "base64_long_run": _random(B64, n_bytes, rng),
        "near_miss_prefixes": _fill("AKIA ghp_ sk- xoxb- glpat- eyJ AIza hf_ npm_ ", n_bytes),
        "separator_runs": _fill("secret:", n_bytes),
        "confusable_soup": _fill("\u0440\u0430\u0455\u0455\u0461\u043e\u0433\u0501=", n_bytes),
    }


def _soup(words: list[str], n_bytes: int, rng: random.Random, weights: list[int] | None = None) -> str:
    """Words drawn at random (ASCII), about ``n_bytes`` long."""
    return "".join(rng.choices(words, weights, k=n_bytes))[:n_bytes]


def _full_width(text: str) -> str:
    """ASCII's printable characters as their full-width forms (U+FF01..U+FF5E), which NFKC folds back."""
    return "".join(chr(ord(c) - 0x21 + 0xFF01) if "!" <= c <= "~" else c for c in text)


def measure(sizes: tuple[int, ...] | list[int] = DEFAULT_SIZES, reps: int = 30,
            only: set[str] | None = None) -> dict[str, Any]:
    """``{shape: {size: {p50_ms, p99_ms, cpu_p50_ms, cpu_p99_ms, max_ms, n, bytes}}}``."""
    module_ready()  # the fold table is built at server start; not part of a scan
    scan(["warm up"])
    out: dict[str, Any] = {}
    for size in sizes:
        for name, text in shapes(size).items():
            if only is not None and name not in only:
                continue
            wall: list[float] = []
            cpu: list[float] = []
            for _ in range(reps):
                w0, c0 = time.perf_counter(), time.thread_time()
                scan([text])
                cpu.append((time.thread_time() - c0) * 1000)
                wall.append((time.perf_counter() - w0) * 1000)
            wall.sort()
            cpu.sort()
            out.setdefault(name, {})[str(size)] = {
                "bytes": len(text.encode()), "n": reps,
                "p50_ms": round(percentile(wall, 50), 3), "p99_ms": round(percentile(wall, 99), 3),
                "max_ms": round(wall[-1], 3),
                "cpu_p50_ms": round(percentile(cpu, 50), 3), "cpu_p99_ms": round(percentile(cpu, 99), 3),
            }
    return out


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per shape, p50 / p99 (wall, CPU in brackets) per size."""
    sizes = sorted({int(s) for per in result.values() for s in per})
    head = "| shape | " + " | ".join(f"{s // 1024} KiB p50 / p99 ms" for s in sizes) + " |"
    rows = [head, "|---|" + "---|" * len(sizes)]
    for name, per in result.items():
        cells = []
        for s in sizes:
            p = per.get(str(s))
            cells.append(f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f} (cpu {p['cpu_p50_ms']:.2f} / {p['cpu_p99_ms']:.2f})"
                         if p else "")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.scanner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="UTF-8 bytes per text")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--shapes", default=None, help="comma-separated shape names (default: all)")
    p.add_argument("--out", default=None, help="write {machine, scanner} JSON here")
    a = p.parse_args(argv)
    doc = {"machine": {**machine.facts(), "loadavg_before": machine.loadavg()},
           "scanner": measure([int(s) for s in a.sizes.split(",")], a.reps,
                              set(a.shapes.split(",")) if a.shapes else None)}
    doc["machine"]["loadavg_after"] = machine.loadavg()
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1))
    print(table(doc["scanner"]))
    print(json.dumps(doc["machine"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
