"""Prometheus metrics of the core and of the MCP adapter (prometheus-client).

Each process keeps its own ``CollectorRegistry`` (no global state: a test process can run
several). Per-call and per-decision series are fed by the interceptor and the port wrappers;
levels (spool lag, index size, key slots, open page cursors, readiness) are read from the core
when Prometheus scrapes, so they cost nothing between scrapes.

Labels never name a tenant or workspace unless the operator opts in
(``--metrics-tenant-labels``): ``scope_class`` is ``workspace`` (agents), ``host``
(maintenance principals) or ``unbound`` (no verified context). Where OPA has a metric for the
same thing its name is used (``bundle_loaded_counter``, ``bundle_failed_load_counter``,
``last_success_bundle_activation``), so OPA dashboards work on Engram's embedded engine too.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engram_core.observability.calls import CallObservation, DecisionFact

# Sub-millisecond policy decisions to multi-second restores.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0)
# Finer where a scope lock's hold lives (a few round trips: 1-50 ms).
LOCK_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
                0.25, 0.5, 1.0, 2.5, 10.0)
BUNDLE_NAME = "engram"  # the one bundle; OPA's bundle metrics are labelled by bundle name
KEY_SLOT_CACHE_S = 30.0  # counting key slots reads the whole slot file: at most this often


class CoreMetrics:
    """The core's series. ``tenant_labels`` adds tenant and workspace to the call counter."""

    def __init__(self, *, tenant_labels: bool = False, prefix: str = "engram",
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.tenant_labels = tenant_labels
        r = self.registry

        def histogram(name: str, documentation: str, labels: tuple[str, ...] = (),
                      buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
            """One of the core's timings: prefixed, in this registry, latency buckets unless told."""
            return Histogram(f"{prefix}_{name}", documentation, labels, buckets=buckets, registry=r)

        labels = ["operation", "code", "scope_class"] + (["tenant", "workspace"] if tenant_labels else [])
        self.calls = Counter(f"{prefix}_calls", "Calls answered, by operation, outcome code and scope class",
                             labels, registry=r)
        self.call_seconds = histogram("call_duration_seconds", "Call latency by operation", ("operation",))
        self.decisions = Counter(f"{prefix}_policy_decisions", "Policy decisions by family, bundle revision and outcome",
                                 ["family", "revision", "outcome"], registry=r)
        self.decision_seconds = histogram(
            "policy_decision_duration_seconds",
            "Latency of one policy engine evaluation (decisions asked together share one)", ("family", "revision"))
        self.bundle_loaded = Counter("bundle_loaded_counter", "Policy bundle loads that activated (OPA's name)",
                                     ["name"], registry=r)
        self.bundle_failed = Counter("bundle_failed_load_counter", "Policy bundle loads that failed (OPA's name)",
                                     ["name", "code"], registry=r)
        self.commit_seconds = histogram("store_commit_duration_seconds",
                                        "Latency of one store COMMIT (one per group-commit batch)")
        self.commit_batch = histogram("store_commit_batch_transactions",
                                      "Write transactions made durable by one COMMIT (group commit batch size)",
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        # PostgreSQL: a write transaction's scope lock (its scope row, FOR UPDATE), the bound on
        # how fast one scope's writes go: waited for, then held until COMMIT returned.
        self.scope_lock_wait_seconds = histogram(
            "store_scope_lock_wait_duration_seconds",
            "Time a write transaction waited for its first scope lock (the round trip that took it)", buckets=LOCK_BUCKETS)
        self.scope_lock_hold_seconds = histogram(
            "store_scope_lock_hold_duration_seconds",
            "Time a write transaction held its scope lock, until COMMIT or ROLLBACK returned", buckets=LOCK_BUCKETS)
        self.embed_seconds = histogram("semantic_embed_duration_seconds",
                                       "Latency of the local embedding model, per call", ("kind",))
        self.index_rebuild_seconds = histogram("search_index_rebuild_duration_seconds",
                                               "Time to build the in-memory search index from the store")
        self.scope_load_seconds = histogram("search_index_scope_load_duration_seconds",
                                            "What a scope's cold first read costs: loading its index (--store)")
        self.last_activation_ns = 0
        self.active_revision = ""

    # -- fed per event -----------------------------------------------------------------
    def observe_call(self, obs: CallObservation, seconds: float) -> None:
        labels = [obs.operation, obs.outcome, obs.scope_class]
        if self.tenant_labels:
            labels += [obs.tenant or "-", obs.workspace or "-"]
        self.calls.labels(*labels).inc()
        self.call_seconds.labels(obs.operation).observe(seconds)

    def observe_decision(self, fact: DecisionFact) -> None:
        self.decisions.labels(fact.family, fact.revision or "-", fact.outcome).inc()

    def observe_evaluation(self, family: str, revision: str, seconds: float) -> None:
        self.decision_seconds.labels(family, revision or "-").observe(seconds)

    def observe_bundle_load(self, *, revision: str, code: str = "") -> None:
        if code:
            self.bundle_failed.labels(BUNDLE_NAME, code).inc()
        else:
            self.bundle_loaded.labels(BUNDLE_NAME).inc()
            self.last_activation_ns, self.active_revision = time.time_ns(), revision

    def observe_commit(self, seconds: float, transactions: int = 1) -> None:
        self.commit_seconds.observe(seconds)
        self.commit_batch.observe(transactions)

    def observe_scope_lock(self, wait_s: float, hold_s: float) -> None:
        self.scope_lock_wait_seconds.observe(wait_s)
        self.scope_lock_hold_seconds.observe(hold_s)

    def observe_index_rebuild(self, seconds: float, documents: int) -> None:
        self.index_rebuild_seconds.observe(seconds)

    def observe_embed(self, kind: str, seconds: float) -> None:
        self.embed_seconds.labels(kind).observe(seconds)

    # -- read at scrape time ------------------------------------------------------------
    def watch(self, core: Any, pins: Any = None) -> None:
        """Report the core's levels at every scrape."""
        self.registry.register(_CoreLevels(self, core, pins))


class _CoreLevels(Collector):
    def __init__(self, metrics: CoreMetrics, core: Any, pins: Any) -> None:
        self._m, self._core, self._pins = metrics, core, pins
        self._slots: tuple[float, int, int] | None = None

    def _key_slots(self) -> tuple[int, int] | None:
        now = time.monotonic()
        if self._slots is None or now - self._slots[0] > KEY_SLOT_CACHE_S:
            try:
                live, destroyed = self._core.vault.slot_counts()
            except (OSError, ValueError):
                return None
            self._slots = (now, live, destroyed)
        return self._slots[1], self._slots[2]

    def collect(self):  # noqa: ANN201 - prometheus-client's collector protocol
        core, store = self._core, self._core.store
        is_open = store.is_open()
        policy_active = bool(core.policy.active())
        yield _gauge("engram_store_open", "1 while the store is open (this process holds the writer fence)", is_open)
        yield _gauge("engram_policy_active", "1 while a policy bundle is loaded and answering", policy_active)
        ready = is_open and policy_active and store.index_ready()
        yield _gauge("engram_ready", "1 when MemoryService is SERVING (store open, index built, bundle active)", ready)
        act = GaugeMetricFamily("last_success_bundle_activation",
                                "Time of the last successful bundle activation, ns since epoch (OPA's name)",
                                labels=["name", "active_revision"])
        if self._m.last_activation_ns:
            act.add_metric([BUNDLE_NAME, self._m.active_revision], self._m.last_activation_ns)
        yield act
        if not is_open:
            return
        pending, oldest_ms = store.audit_spool_state()
        yield _gauge("engram_audit_spool_pending_rows",
                     "Audit rows durable in the spool, not yet moved into the audit table", pending)
        lag = max(0.0, time.time() - oldest_ms / 1000) if oldest_ms is not None else 0.0
        yield _gauge("engram_audit_spool_lag_seconds", "Age of the oldest audit row still in the spool", lag)
        failures = store.audit_device_failures()
        fam = CounterMetricFamily("engram_audit_device_write_failures",
                                  "Audit rows (batches) an audit device refused since start, by device",
                                  labels=["device"])
        for device, n in sorted(failures.items()):
            fam.add_metric([device], n)
        yield fam
        yield _gauge("engram_audit_devices", "Audit devices configured (--audit-device)", len(failures))
        docs = _index_documents(store)
        if docs is not None:
            yield _gauge("engram_search_index_documents", "Records in the in-memory search index", docs)
        resident = store.residency()
        if resident is not None:
            yield _gauge("engram_search_index_scopes_loaded", "Scopes whose index this core holds", resident.scopes_loaded)
            yield _gauge("engram_search_index_budget_records", "--index-max-records (0: no budget)",
                         resident.max_records)
            yield CounterMetricFamily("engram_search_index_scope_loads", "Scope indexes loaded on first use",
                                      value=resident.loads)
            yield CounterMetricFamily("engram_search_index_scope_evictions",
                                      "Scope indexes evicted to keep within --index-max-records",
                                      value=resident.evictions)
        slots = self._key_slots()
        if slots is not None:
            fam = GaugeMetricFamily("engram_keyvault_slots", "Data-key slots by state (destroyed = zeroed)",
                                    labels=["state"])
            fam.add_metric(["live"], slots[0])
            fam.add_metric(["destroyed"], slots[1])
            yield fam
        if self._pins is not None:
            yield _gauge("engram_page_cursors_open", "Search pins held for page cursors", len(self._pins))


def _index_documents(store: Any) -> int | None:
    # Read without the publish lock (a rebuild may hold it for seconds): a dict changing
    # under the count only skips this scrape's value.
    try:
        return store.document_count()
    except RuntimeError:
        return None


def _gauge(name: str, doc: str, value: float | bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


class AdapterMetrics:
    """The MCP adapter's series: tool calls by tool and outcome code, latency per tool."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.calls = Counter("engram_mcp_tool_calls", "MCP tools/call answered, by tool and outcome code",
                             ["tool", "code"], registry=self.registry)
        self.call_seconds = Histogram("engram_mcp_tool_call_duration_seconds", "MCP tools/call latency by tool",
                                      ["tool"], buckets=LATENCY_BUCKETS, registry=self.registry)

    def observe(self, tool: str, code: str, seconds: float) -> None:
        self.calls.labels(tool, code).inc()
        self.call_seconds.labels(tool).observe(seconds)


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"metrics address must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def serve_metrics(listen: str, registry: CollectorRegistry) -> tuple[Any, str]:
    """Serve ``/metrics`` on ``listen`` (HOST:PORT, port 0 picks one) in a daemon thread;
    returns (the HTTP server, to shut down, and the address it listens on)."""
    host, port = parse_listen(listen)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, f"{host}:{server.server_port}"
