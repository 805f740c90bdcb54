"""Generate the retrieval-quality corpus (tools/retrieval/corpus.json) from templates and a seed.

Engineering memories of four workspaces (decisions, conventions, fixes, hand-offs,
runbooks), each service across several topics so that every query has natural
distractors: the same topic in other services and other topics of the same service.
Queries are paraphrases: they keep at most the service name and say the rest in
other words, as an agent asking later would. Some decisions are superseded by a
newer one (the old must not come back), some memories are forgotten (they must
never come back). Run: ``python tools/retrieval/make_corpus.py`` (deterministic).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20261130
OUT = Path(__file__).with_name("corpus.json")

WORKSPACES = {
    "payments": [("ledger service", "accounting ledger"), ("invoice worker", "billing job"),
                 ("refund API", "refunds endpoint"), ("checkout page", "purchase flow"),
                 ("fraud scorer", "risk model")],
    "mobile": [("iOS app", "iPhone client"), ("Android app", "Android client"), ("push gateway", "notification relay"),
               ("sync engine", "offline replication"), ("crash reporter", "error telemetry")],
    "data": [("events pipeline", "event stream"), ("warehouse loader", "warehouse ingestion"),
             ("metrics API", "KPI service"), ("feature store", "ML features"), ("dbt project", "SQL transformations")],
    "infra": [("ingress controller", "edge proxy"), ("build runners", "CI machines"), ("secrets vault", "credential store"),
              ("log shipper", "logging agent"), ("DNS setup", "name resolution")],
}

PEOPLE = ["Priya", "Marco", "Lena", "Tomasz", "Aiko", "Samir", "Joanna", "Diego", "Yusuf", "Hannah"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]

# Each topic: kind, memory template, context template, query templates.
# {s} service name, {q} the query's way of naming it (the name itself or a paraphrase).
TOPICS: list[dict] = [
    {"topic": "datastore", "kind": "decision",
     "text": "We decided to store {s} data in {db} because {why}.",
     "context": "Alternatives considered for {s}: {alt} was rejected after a load test.",
     "slots": {"db": ["PostgreSQL", "DynamoDB", "Cassandra", "SQLite", "MongoDB"],
               "alt": ["MySQL", "Redis", "Elasticsearch", "CockroachDB"],
               "why": ["we need transactions across tables", "writes are append-only and huge",
                       "the team already operates it", "it runs embedded with no server"]},
     "queries": ["which database does the {q} persist its records in?", "where is {q} state kept long term"]},
    {"topic": "queue", "kind": "decision",
     "text": "{s} publishes domain events to {mq} instead of calling consumers over HTTP.",
     "context": "Synchronous calls from {s} caused cascading failures during the {month} outage.",
     "slots": {"mq": ["Kafka", "RabbitMQ", "NATS", "SQS"],
               "month": ["March", "June", "September", "November"]},
     "queries": ["how does the {q} notify other systems asynchronously", "message broker used by {q}"]},
    {"topic": "branches", "kind": "convention",
     "text": "Convention: branches for {s} are named {pattern} and are squash-merged after one approval.",
     "context": "Agreed in the {s} team retro so the changelog stays readable.",
     "slots": {"pattern": ["feat/<ticket>-<slug>", "<owner>/<ticket>", "topic/<slug>"]},
     "queries": ["git naming rule for {q} work", "how should I call my feature branch in {q}"]},
    {"topic": "tests", "kind": "convention",
     "text": "Every new endpoint in {s} needs {test} before review; PRs without them are sent back.",
     "context": "Introduced after a regression in {s} reached production unnoticed.",
     "slots": {"test": ["contract tests under tests/contract", "a property-based test",
                        "an end-to-end smoke test", "golden-file tests"]},
     "queries": ["what checks are mandatory before merging a change to {q}",
                 "required testing for a pull request on {q}"]},
    {"topic": "timeouts", "kind": "fix",
     "text": "Fixed intermittent timeouts in {s}: the {client} connection pool was exhausted; pool raised to {n} "
             "and a {sec} second deadline added.",
     "context": "Symptom: requests to {s} hung for minutes under peak load, then failed.",
     "slots": {"client": ["database", "HTTP", "Redis", "gRPC"], "n": ["32", "64", "128"], "sec": ["2", "5", "10"]},
     "queries": ["why did {q} sometimes hang and stop responding", "{q} requests stalled under load, what was wrong"]},
    {"topic": "memory", "kind": "fix",
     "text": "Root cause of the {s} memory growth: an unbounded cache in the {module} module; replaced it with an "
             "LRU of {n} entries.",
     "context": "Pods of {s} were OOM-killed every few hours before the fix.",
     "slots": {"module": ["session", "templates", "lookup", "serializer"], "n": ["1000", "10000", "50000"]},
     "queries": ["{q} kept using more and more RAM until it crashed, cause?", "why was {q} running out of memory"]},
    {"topic": "handoff", "kind": "handoff",
     "text": "Hand-off: moving {s} to {target} is half done; {step} remains. {person} owns it and is away until "
             "{day}.",
     "context": "Work paused mid-way; the old and new {s} setups run side by side for now.",
     "slots": {"target": ["Kubernetes", "the new region", "Terraform", "ARM instances"],
               "step": ["cutting over traffic", "deleting the old cluster", "backfilling history",
                        "updating the runbooks"]},
     "queries": ["what is still open in the {q} migration and who is responsible",
                 "status of relocating {q}, remaining steps"]},
    {"topic": "auth", "kind": "decision",
     "text": "{s} authenticates callers with {auth}, validated at the gateway rather than in the service.",
     "context": "Per-service credential checks in {s} had drifted and one was missing.",
     "slots": {"auth": ["short-lived JWTs", "mutual TLS certificates", "OAuth2 client credentials", "API keys"]},
     "queries": ["how do clients prove their identity to {q}", "login and access control mechanism for {q}"]},
    {"topic": "runbook", "kind": "convention",
     "text": "Runbook: when {s} alerts on {metric}, first check {check}, then page {team}.",
     "context": "Written after an on-call engineer spent an hour guessing on a {s} alert.",
     "slots": {"metric": ["p99 latency", "error rate", "queue depth", "disk usage"],
               "check": ["the last deploy", "upstream dependencies", "the autoscaler events"],
               "team": ["the platform on-call", "the owning squad", "the database team"]},
     "queries": ["first steps when the {q} alarm goes off at night", "on-call procedure for {q} alerts"]},
    {"topic": "deploy", "kind": "decision",
     "text": "{s} ships through {tool} with a {pct} percent canary held for {mins} minutes.",
     "context": "Full rollouts of {s} had caused two incidents in one quarter.",
     "slots": {"tool": ["Argo Rollouts", "Spinnaker", "a GitHub Actions pipeline", "Flagger"],
               "pct": ["5", "10", "25"], "mins": ["15", "30", "60"]},
     "queries": ["how are releases of {q} rolled out gradually", "release process and canary for {q}"]},
]

SUPERSEDE = {
    "datastore": ("We decided to store {s} data in {old}; it was the simplest option at the time.",
                  "Update: {s} moved from {old} to {db}; all reads and writes now go to {db}."),
    "auth": ("{s} checks {old} itself inside the service.",
             "Update: {s} stopped checking {old} itself; callers now use {auth} checked at the gateway."),
}


def fill(template: str, values: dict[str, str]) -> str:
    return template.format(**values)


def main() -> None:
    rng = random.Random(SEED)
    memories: list[dict] = []
    queries: list[dict] = []
    supersessions: list[dict] = []
    forgotten: list[str] = []

    def add(ws: str, kind: str, text: str, context: str, days: int, ref: str) -> str:
        mid = f"m{len(memories) + 1:03d}"
        text = text[0].upper() + text[1:]
        memories.append({"id": mid, "workspace": ws, "kind": kind, "text": text, "context": context,
                         "days_ago": days, "source_ref": ref})
        return mid

    for ws, services in WORKSPACES.items():
        for s_i, (svc, alias) in enumerate(services):
            for topic in TOPICS:
                values = {k: rng.choice(v) for k, v in topic["slots"].items()}
                values.update(s=svc, person=rng.choice(PEOPLE), day=rng.choice(DAYS))
                ref = f"ticket:{ws[:3].upper()}-{rng.randint(100, 999)}"
                days = rng.randint(1, 400)
                relevant: list[str] = []
                must_not: list[str] = []
                sup = SUPERSEDE.get(topic["topic"])
                if sup and s_i in (0, 2):
                    old_value = rng.choice([v for v in topic["slots"].get("db", topic["slots"].get("auth", []))
                                            if v != values.get("db", values.get("auth"))])
                    old_text = fill(sup[0], {**values, "old": old_value})
                    old = add(ws, "decision", old_text, fill(topic["context"], values), days + 200, ref)
                    new = add(ws, "decision", fill(sup[1], {**values, "old": old_value}),
                              fill(topic["context"], values), days, ref)
                    supersessions.append({"old": old, "new": new})
                    relevant, must_not = [new], [old]
                else:
                    mid = add(ws, topic["kind"], fill(topic["text"], values), fill(topic["context"], values), days, ref)
                    relevant = [mid]
                    if s_i == 4 and topic["topic"] in ("handoff", "memory"):
                        forgotten.append(mid)  # forgotten: the query below must not find it any more
                        relevant, must_not = [], [mid]
                for qi, qt in enumerate(topic["queries"]):
                    name = svc if (qi == 0) == (rng.random() < 0.6) else alias
                    queries.append({"id": f"q{len(queries) + 1:03d}", "workspace": ws,
                                    "text": qt.format(q=name), "relevant": relevant, "must_not": must_not})
        # Notes unrelated to any query: noise every search must wade through.
        for _ in range(10):
            svc = rng.choice(services)[0]
            text = rng.choice([
                f"The {svc} team meets on {rng.choice(DAYS)} to groom the backlog.",
                f"{rng.choice(PEOPLE)} joined the {svc} rotation this quarter.",
                f"Dashboards for {svc} live in the shared Grafana folder.",
                f"The {svc} README was rewritten to describe the local setup.",
            ])
            add(ws, "context", text, f"Housekeeping note about {svc}.", rng.randint(1, 400), "doc:wiki")
    doc = {"seed": SEED, "generator": "tools/retrieval/make_corpus.py", "workspaces": sorted(WORKSPACES),
           "memories": memories, "supersessions": supersessions, "forgotten": forgotten,
           "queries": [q for q in queries if q["relevant"] or q["must_not"]]}
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(memories)} memories, {len(doc['queries'])} queries, {len(supersessions)} supersessions, "
          f"{len(forgotten)} forgotten -> {OUT}")


if __name__ == "__main__":
    main()
