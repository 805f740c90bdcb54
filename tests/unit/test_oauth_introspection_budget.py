"""The introspection budget (adapters/mcp/oauth/introspection.py, issue 57): a token bucket that
bounds how many not-yet-known opaque tokens are sent to the issuer. The clock is injected; the
end-to-end flood against a real HTTP issuer is tests/oauth/test_oauth_hostile_issuer.py."""

from __future__ import annotations

from adapters.mcp.oauth.introspection import BURST_S, IntrospectionBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_bounded_and_the_budget_refills_at_its_rate() -> None:
    clock = Clock()
    budget = IntrospectionBudget(2, clock=clock)
    assert sum(budget.take() for _ in range(100)) == 2 * BURST_S  # a full bucket, then nothing
    clock.now += 1.0
    assert sum(budget.take() for _ in range(100)) == 2
    clock.now += 3600.0  # a long quiet spell refills the bucket, never beyond one burst
    assert sum(budget.take() for _ in range(100)) == 2 * BURST_S


def test_a_budget_below_one_a_second_still_allows_one() -> None:
    clock = Clock()
    budget = IntrospectionBudget(0.05, clock=clock)
    assert budget.take() and not budget.take()
    clock.now += 20.0
    assert budget.take()
