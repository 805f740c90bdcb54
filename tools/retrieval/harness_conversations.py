"""Conversational retrieval harness: loads tools/retrieval/conversations.json through the real
service (gRPC, start_core, semantic channel on), one turn per memory (``kind: context``, one
citation, one workspace and one agent session per conversation), then asks every question with
each channel and reports recall@5, recall@10 and MRR@10 of the evidence turns, per question type
and overall, beside ``rank_bm25`` and ``bm25s`` baselines over the same turns.

Two ways of capturing, each into a core of its own (``--mode``):

- ``session``: a chat log captured after the fact, every turn dated with its session's date
  (``valid_time.t`` = noon UTC of that day), all of it captured in one burst;
- ``live``: an agent capturing as the chat goes, every turn dated with its own instant
  (``turn_instants``) and captured at that instant: the core's clock is set to each turn's instant
  before its capture and admission (the conversations interleaved in time order), then to the
  present for the questions.

Run: ``.venv/bin/python tools/retrieval/harness_conversations.py [--mode session|live|both] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent import DAY_MS, Agent  # noqa: E402
from harness import metrics  # noqa: E402

from engram_core.app.composition import start_core  # noqa: E402
from engram_core.clock import FixedClock  # noqa: E402
from engram_core.services.lexical import tokenize  # noqa: E402

CORPUS = Path(__file__).with_name("conversations.json")
TENANT = "harness-conv"
_PLACEHOLDER = re.compile(r"\{(month|ago):(\d+)\}")


def render(text: str, now: dt.datetime) -> str:
    """Questions say times relative to the day the harness runs: ``{month:D}`` is the month of the
    day D days ago ("in March", with the year when it is not the last twelve months), ``{ago:D}``
    a rough relative phrase ("last week", "about two months ago")."""
    def one(m: re.Match[str]) -> str:
        days = int(m.group(2))
        when = now - dt.timedelta(days=days)
        if m.group(1) == "month":
            return when.strftime("%B") + (f" {when.year}" if days > 300 else "")
        if days <= 1:
            return "yesterday"
        if days <= 9:
            return "last week"
        if days <= 45:
            return f"about {round(days / 7)} weeks ago"
        return f"about {round(days / 30)} months ago"
    return _PLACEHOLDER.sub(one, text)


def turn_text(conv: dict[str, Any], turn: dict[str, Any]) -> str:
    return f"{turn['speaker']}: {turn['text']}"


def turns_of(corpus: dict[str, Any]) -> list[tuple[str, str, str, int]]:
    """(workspace, turn id, text, days ago) for every turn."""
    out = []
    for conv in corpus["conversations"]:
        for s in conv["sessions"]:
            for i, t in enumerate(s["turns"]):
                out.append((conv["id"], f"{conv['id']}:s{s['session']}:t{i + 1}", turn_text(conv, t), s["days_ago"]))
    return out


def session_noon(now: dt.datetime) -> int:
    """Sessions happened at noon UTC, ``days_ago`` days before ``now`` (epoch ms)."""
    noon = int(now.replace(hour=12, minute=0, second=0, microsecond=0).timestamp() * 1000)
    return min(noon, int(now.timestamp() * 1000) - 1000)


def turn_instants(corpus: dict[str, Any], noon_ms: int) -> dict[str, int]:
    """The instant each turn was said, for live capture: a session starts at noon UTC of its day,
    and each turn follows the one before by 20 s to 3 min, or, one time in twenty, after a pause
    of 10 to 60 minutes (someone stepped away). Seeded by the turn's id, so every run (and the
    offline sweeps of tune_query.py) uses the same instants. Fixed before any neighbour window
    was measured against them (docs/retrieval-quality.md, "Live capture")."""
    out: dict[str, int] = {}
    for conv in corpus["conversations"]:
        for s in conv["sessions"]:
            t = noon_ms - s["days_ago"] * DAY_MS
            for i in range(len(s["turns"])):
                tid = f"{conv['id']}:s{s['session']}:t{i + 1}"
                if i:
                    rnd = random.Random(tid)
                    t += (rnd.randint(600, 3600) if rnd.random() < 0.05 else rnd.randint(20, 180)) * 1000
                out[tid] = t
    return out


def baselines(corpus: dict[str, Any], questions: list[dict[str, Any]]) -> dict[str, list[list[str]]]:
    """Library BM25 over the same turns (text only), one index per conversation."""
    import bm25s
    from rank_bm25 import BM25Okapi

    by_ws: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for ws, tid, text, _days in turns_of(corpus):
        by_ws[ws].append((tid, text))
    stop = set(bm25s.stopwords.STOPWORDS_EN)
    out: dict[str, list[list[str]]] = {}

    def okapi(name: str, tok: Any) -> None:
        models = {ws: ([t for t, _ in docs], BM25Okapi([tok(x) for _, x in docs])) for ws, docs in by_ws.items()}
        ranked = []
        for q in questions:
            ids, model = models[q["workspace"]]
            scores = model.get_scores(tok(q["text"]))
            order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
            ranked.append([ids[i] for i in order[:10] if scores[i] > 0])
        out[name] = ranked

    okapi("rank_bm25 BM25Okapi", tokenize)
    okapi("rank_bm25 BM25Okapi, English stop words", lambda s: [t for t in tokenize(s) if t not in stop])

    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    retrievers = {}
    for ws, docs in by_ws.items():
        r = bm25s.BM25()
        r.index(bm25s.tokenize([x for _, x in docs], stopwords="en", stemmer=stemmer, show_progress=False),
                show_progress=False)
        retrievers[ws] = ([t for t, _ in docs], r)
    ranked = []
    for q in questions:
        ids, r = retrievers[q["workspace"]]
        qt = bm25s.tokenize([q["text"]], stopwords="en", stemmer=stemmer, show_progress=False)
        if not qt.ids[0]:
            ranked.append([])
            continue
        docs, scores = r.retrieve(qt, k=min(10, len(ids)), show_progress=False)
        ranked.append([ids[d] for d, s in zip(docs[0], scores[0], strict=True) if s > 0])
    out["bm25s (stop words, Snowball stemmer)"] = ranked
    return out


def per_type(ranked: list[list[str]], questions: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(questions):
        groups[q["type"]].append(i)
    out: dict[str, Any] = {"all": metrics(ranked, [q["evidence"] for q in questions])}
    for t, idx in sorted(groups.items()):
        out[t] = metrics([ranked[i] for i in idx], [questions[i]["evidence"] for i in idx])
    return out


def run(data_dir: Path, mode: str = "session") -> dict[str, Any]:
    corpus = json.loads(CORPUS.read_text())
    now = dt.datetime.now(dt.UTC)
    questions = [{**q, "text": render(q["text"], now)} for q in corpus["questions"]]
    noon = session_noon(now)
    turns = turns_of(corpus)
    if mode == "live":
        instants = turn_instants(corpus, noon)
        # Time order across conversations (the clock only moves forward); a conversation's turns
        # keep their order, so each scope admits its turns as they were said.
        order = sorted(range(len(turns)), key=lambda i: (instants[turns[i][1]], i))
        when = [instants[turns[i][1]] for i in order]
        clock = FixedClock(when[0] - 60_000)
    else:
        order = list(range(len(turns)))
        when = [noon - turns[i][3] * DAY_MS for i in order]
        clock = None
    running = start_core(data_dir, semantic=True, clock=clock)
    try:
        agents = {c["id"]: Agent(running, TENANT, c["id"], session=f"s-{c['id']}", clock=clock)
                  for c in corpus["conversations"]}
        for a in agents.values():
            a.activate()
        t0 = time.perf_counter()
        ids: dict[str, str] = {}
        for i, t in zip(order, when, strict=True):
            ws, tid, text, _days = turns[i]
            if clock is not None:
                clock.advance(max(t - clock.now_ms(), 0))
            ids[tid] = agents[ws].remember_turn(tid, text, tid, t=t)
        if clock is not None:  # the questions are asked now
            clock.advance(max(int(now.timestamp() * 1000) - clock.now_ms(), 0))
        load_s = time.perf_counter() - t0
        back = {v: k for k, v in ids.items()}
        report: dict[str, Any] = {"mode": mode, "turns": len(ids), "questions": len(questions),
                                  "load_seconds": round(load_s, 1), "profiles": {}}
        for channel, semantic in (("lexical", False), ("lexical_and_semantic", True)):
            ranked, latencies, profile = [], [], ""
            for q in questions:
                t = time.perf_counter()
                res = agents[q["workspace"]].search(q["text"], semantic=semantic)
                latencies.append(time.perf_counter() - t)
                profile = f"{res['rank_receipt']['profile']} v{res['rank_receipt']['profile_version']}"
                ranked.append([back[p["record"]["record_id"]] for p in res["records"]])
            latencies.sort()
            report["profiles"][f"{channel} ({profile})"] = {
                **per_type(ranked, questions), "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1)}
        for name, ranked in baselines(corpus, questions).items():
            report["profiles"][name] = per_type(ranked, questions)
        return report
    finally:
        running.stop()


def print_report(report: dict[str, Any]) -> None:
    print(f"{report['mode']}: {report['turns']} turns, {report['questions']} questions, "
          f"loaded in {report['load_seconds']} s")
    types = [t for t in next(iter(report["profiles"].values())) if t not in ("all", "p50_ms")]
    print(f"{'profile':48} {'R@5':>6} {'R@10':>6} {'MRR':>6}  " + " ".join(f"{t[:11]:>11}" for t in types))
    for name, m in report["profiles"].items():
        a = m["all"]
        print(f"{name:48} {a['recall@5']:>6} {a['recall@10']:>6} {a['mrr@10']:>6}  "
              + " ".join(f"{m[t]['recall@10']:>11}" for t in types))
    print("(per type: recall@10; counts " + ", ".join(
        f"{t} {next(iter(report['profiles'].values()))[t]['queries']}" for t in types) + ")")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the report here as JSON")
    ap.add_argument("--mode", choices=("session", "live", "both"), default="both",
                    help="dated by session (a log captured after the fact), live (each turn at its instant), or both")
    args = ap.parse_args()
    reports = {}
    for mode in ("session", "live") if args.mode == "both" else (args.mode,):
        with tempfile.TemporaryDirectory(prefix="engram-harness-conv-") as tmp:
            reports[mode] = run(Path(tmp) / "data", mode)
        print_report(reports[mode])
    if args.json:
        args.json.write_text(json.dumps({"modes": reports}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
