"""The scope and the 16 queries of the search benchmarks at N records in one scope
(``tools/bench_search.py`` through gRPC, ``tools.bench.search_inprocess`` in process)."""

TENANT, WORKSPACE = "bench", "main"
QUERIES = [
    "which database does the ledger service use", "deploy canary rollout", "memory leak cache fix",
    "timeouts connection pool", "who owns the migration to kubernetes", "authentication tokens gateway",
    "on-call runbook latency alert", "branch naming convention", "kafka events", "contract tests before review",
    "why was the sync engine hanging", "warehouse loader backfill", "push gateway certificates",
    "feature store retention", "secrets vault rotation policy", "dns failover",
]
