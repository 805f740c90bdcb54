"""Prometheus series of the policy machinery that runs beside the engine: the decision
logger (events written, dropped by reason, waiting in the buffer, failed uploads) and the
bundle puller (downloads, not-modified answers, failures). Read at scrape time from the
objects' counters, so they cost nothing between scrapes. Registered by ``engram serve``
when ``--metrics`` is on; the active revision is ``last_success_bundle_activation``'s label."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engram_core.policy.decisionlog.logger import REASONS


class PolicyCollector(Collector):
    def __init__(self, *, logger: Any = None, source: Any = None, engine: Any = None) -> None:
        self._logger, self._source, self._engine = logger, source, engine

    def collect(self):  # noqa: ANN201 - prometheus-client's collector protocol
        if self._engine is not None:
            revision = self._engine.revision()
            info = GaugeMetricFamily("engram_policy_revision_info", "1 for the bundle revision now answering",
                                     labels=["revision"])
            if revision:
                info.add_metric([revision], 1)
            yield info
        if self._logger is not None:
            yield CounterMetricFamily("engram_decision_log_events", "Decision-log events written to the sink",
                                      value=self._logger.written)
            dropped = CounterMetricFamily("engram_decision_log_dropped",
                                          "Decision-log events dropped, by reason (never waited for)",
                                          labels=["reason"])
            counts = dict(self._logger.dropped)
            for reason in REASONS:
                dropped.add_metric([reason], counts.get(reason, 0))
            yield dropped
            yield GaugeMetricFamily("engram_decision_log_buffer_events", "Decision-log events waiting in memory",
                                    value=self._logger.buffered)
            failures = getattr(self._logger.sink, "upload_failures", None)
            if failures is not None:
                yield CounterMetricFamily("engram_decision_log_upload_failures",
                                          "Decision-log uploads that failed (retried with backoff)", value=failures)
        if self._source is not None:
            pulls = CounterMetricFamily("engram_policy_bundle_pulls", "Bundle server polls, by outcome",
                                        labels=["outcome"])
            pulls.add_metric(["downloaded"], self._source.downloads)
            pulls.add_metric(["not_modified"], self._source.not_modified)
            pulls.add_metric(["failed"], self._source.failures)
            yield pulls
