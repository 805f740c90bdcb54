"""A call that fails on the store answers the caller with the contract's constant message, and the
operator's log names which kind of failure it was (a driver error's class and SQLSTATE, a batch
rolled back and why): without it, failed calls under load on several cores could not be traced."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.rpc.call_handler import CallHandler


class _Aborted(Exception):
    pass


class _Context:
    """What ``CallHandler.run`` asks of grpc's servicer context (grpc's, not ours)."""

    def __init__(self) -> None:
        self.status: Any = None

    def time_remaining(self) -> float:
        return 5.0

    def is_active(self) -> bool:
        return True

    def abort_with_status(self, status: Any) -> None:
        self.status = status
        raise _Aborted


@pytest.mark.parametrize("code", [Code.STORE_UNAVAILABLE, Code.MUTATION_OUTCOME_UNKNOWN])
def test_a_store_failure_is_logged_with_its_kind_and_answered_without_it(
        code: Code, caplog: pytest.LogCaptureFixture) -> None:
    handler = object.__new__(CallHandler)  # ``run`` reads nothing of the handler's own state
    context = _Context()
    detail = "write batch rolled back (STORE_UNAVAILABLE: write conflict, retry: DeadlockDetected 40P01): retry"

    def fails() -> None:
        raise EngramError(code, detail)

    with caplog.at_level(logging.WARNING, logger="engram.core"), pytest.raises(_Aborted):
        handler.run(context, fails)  # type: ignore[arg-type]
    assert f"call refused: {code.value}: {detail}" in caplog.text
    assert context.status.code != grpc.StatusCode.OK
    assert "DeadlockDetected" not in context.status.details  # the caller gets the constant message


def test_a_refusal_the_caller_caused_is_not_logged_as_a_store_failure(caplog: pytest.LogCaptureFixture) -> None:
    handler = object.__new__(CallHandler)
    with caplog.at_level(logging.WARNING, logger="engram.core"), pytest.raises(_Aborted):
        handler.run(_Context(), lambda: (_ for _ in ()).throw(EngramError(Code.NOT_FOUND, "record")))  # type: ignore[arg-type]
    assert "call refused" not in caplog.text
