"""Quotas (issue 18; SPEC §3 RATE_LIMITED): which tool counts what, and the refusal.

The core counts, per principal (tenant, workspace, principal) and per scope
(tenant, workspace), what agents do — captures, admissions, searches, gets,
withdrawals, forgets and bytes stored (effective payload bytes of committed
captures) — over sliding
windows (a minute and an hour), and hands the counts to the authz policy with
every agent tool call (``input.usage``). The policy decides: it may deny with
``retry_after_ms`` in its answer, which the core turns into RATE_LIMITED
(retriable; over gRPC with a ``google.rpc.RetryInfo`` detail). Limits live in
``data.json``, not here.

The counters are the store's (``engram_core/store/usage_counters.py``): in memory on one core,
shared by every core of a store several share.
"""

from __future__ import annotations

from engram_core.contract.errors import Code, EngramError
from engram_core.store.usage_counters import METRICS, WINDOWS_MS, QuotaCounters

__all__ = ["METRICS", "TOOL_METRIC", "WINDOWS_MS", "QuotaCounters", "RateLimited"]
# Which counter an agent tool adds one to once it is authorized. The check a host makes before a
# human is asked to confirm a withdraw or forget (HostService.CheckGated) is authorized as that
# tool and counts as a call of it (issue 26.7: a principal out of quota made hundreds of them).
TOOL_METRIC: dict[str, str] = {
    "engram_memory_capture": "captures",
    "engram_memory_request_admission": "admissions",
    "engram_memory_search": "searches",
    "engram_memory_get": "gets",
    "engram_memory_withdraw": "withdrawals",
    "engram_memory_forget": "forgets",
}


class RateLimited(EngramError):
    """RATE_LIMITED with the policy's retry-after (travels as gRPC RetryInfo)."""

    def __init__(self, retry_after_ms: int, detail: str = "") -> None:
        super().__init__(Code.RATE_LIMITED, detail)
        self.retry_after_ms = max(0, int(retry_after_ms))
