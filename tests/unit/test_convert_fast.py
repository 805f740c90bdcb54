"""value_to_message's direct fill gives the same message as json_format.ParseDict, and
leaves every value it does not handle to ParseDict (same result or same error)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, assume, given, settings

from engram_core.api import host_pb2, memory_pb2
from engram_core.rpc.convert import value_to_message
from tests.support.schema_values import arguments, outputs


def _reference(value: Any, cls: Any) -> Any:
    try:
        return json_format.ParseDict(value, cls(), ignore_unknown_fields=False).SerializeToString(deterministic=True)
    except Exception as exc:  # noqa: BLE001 - the error class is what is compared
        return type(exc)


def _fast(value: Any, cls: Any) -> Any:
    try:
        return value_to_message(value, cls()).SerializeToString(deterministic=True)
    except Exception as exc:  # noqa: BLE001
        return type(exc)


# Drawing a capture from its schema is slow when the machine is busy (seen at load 14 on 2 cores):
# how long a draw takes is not what this test checks, so the too-slow health check is off.
# The values come from tests/support/schema_values.py: the schema's values, its strategy built
# once per process (hypothesis-jsonschema's own rebuilt its members on every draw).
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments("engram_memory_capture"))
def test_capture_requests_match_parsedict(value: Any) -> None:
    assert _fast(value, memory_pb2.CaptureRequest) == _reference(value, memory_pb2.CaptureRequest)


@pytest.mark.parametrize("value", [
    {"query": "q", "limit": True},  # bool for int64
    {"query": "q", "limit": "7"},  # int64 spelled as a JSON string
    {"query": "q", "limit": 2**70},  # out of range
    {"query": "q", "pageCursor": "x"},  # JSON name
    {"query": None},  # null
    {"query": "q", "extra": 1},  # unknown key
    {"query": "q", "capability_policy": {}},  # empty sub-message keeps presence
    {"query": "q", "capability_policy": {"network": 3}},  # wrong scalar type
    {"query": 5},
])
def test_edges_match_parsedict(value: dict[str, Any]) -> None:
    assert _fast(value, memory_pb2.SearchRequest) == _reference(value, memory_pb2.SearchRequest)


def test_response_with_scores_and_records() -> None:
    value = {"records": [{"record": {"record_id": "rec_1", "payload": {"schema_version": 2, "components": [
        {"component_id": "c1", "text": "t", "citation_ids": ["a", "b"]}]}}, "redacted_fields": [],
        "score": 0.5, "rank": 1}, {"score": 1}], "rank_receipt": {"candidate_count": 0}, "response_digest": "d"}
    assert _fast(value, memory_pb2.SearchResponse) == _reference(value, memory_pb2.SearchResponse)


RESPONSES = {"engram_memory_search": memory_pb2.SearchResponse, "engram_memory_get": memory_pb2.GetResponse,
             "engram_memory_capture": memory_pb2.CaptureResponse,
             "engram_memory_request_admission": memory_pb2.RequestAdmissionResponse,
             "engram_memory_withdraw": memory_pb2.WithdrawResponse, "engram_memory_forget": memory_pb2.ForgetResponse}


def _by_constructor(value: Any, cls: Any) -> Any:
    from engram_core.rpc.convert import message_of

    try:
        return message_of(value, cls).SerializeToString(deterministic=True)
    except Exception as exc:  # noqa: BLE001
        return type(exc)


@pytest.mark.parametrize("tool", sorted(RESPONSES))
def test_responses_by_constructor_match_the_direct_fill(tool: str) -> None:
    """Every value a tool's output schema allows converts to the same message either way."""
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(outputs(tool))
    def check(value: Any) -> None:
        assert _by_constructor(value, RESPONSES[tool]) == _fast(value, RESPONSES[tool])

    check()


REQUESTS = {"engram_memory_search": memory_pb2.SearchRequest, "engram_memory_get": memory_pb2.GetRequest,
            "engram_memory_capture": memory_pb2.CaptureRequest,
            "engram_memory_request_admission": memory_pb2.RequestAdmissionRequest,
            "engram_memory_withdraw": memory_pb2.WithdrawRequest, "engram_memory_forget": memory_pb2.ForgetRequest}


@pytest.mark.parametrize("tool", sorted(REQUESTS))
def test_validated_arguments_by_constructor_match_the_direct_fill(tool: str) -> None:
    """What the adapter sends: arguments its closed schema allows convert alike either way."""
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(arguments(tool))
    def check(value: Any) -> None:
        assert _by_constructor(value, REQUESTS[tool]) == _fast(value, REQUESTS[tool])

    check()


def test_a_response_the_constructor_refuses_is_converted_as_before() -> None:
    value = {"records": [{"rank": 1.0, "score": 1}], "rank_receipt": {"candidate_count": 0}}  # a float rank
    assert _by_constructor(value, memory_pb2.SearchResponse) == _fast(value, memory_pb2.SearchResponse)


def _listfields_walk(msg: Any) -> dict[str, Any]:
    """message_to_value as it was: a walk over ListFields, the lists SPEC §5 requires added at
    the end in declaration order. The generated converters must give the same keys in the same
    order (the adapter's text block and structuredContent keep it)."""
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        if field.type == field.TYPE_MESSAGE:
            out[field.name] = [_listfields_walk(v) for v in value] if field.is_repeated else _listfields_walk(value)
        else:
            out[field.name] = list(value) if field.is_repeated else value
    for field in msg.DESCRIPTOR.fields:
        if field.is_repeated and field.name in ("records", "redacted_fields", "family_refs") and field.name not in out:
            out[field.name] = []
    return out


def _converted(value: Any, cls: Any) -> Any:
    """The message of a drawn value. Where a schema is open (extra members) and the message closed,
    the extras are dropped: most drawn replies have some, and the message is what is compared."""
    try:
        return json_format.ParseDict(value, cls(), ignore_unknown_fields=True)
    except json_format.ParseError:  # rare: a drawn value the message cannot hold at all
        assume(False)


def _same_value(msg: Any) -> None:
    from engram_core.rpc.convert import message_to_value

    # JSON text compares key order, and tells -0.0 from 0.0 and 1 from 1.0 and True.
    assert json.dumps(message_to_value(msg)) == json.dumps(_listfields_walk(msg))


@pytest.mark.parametrize("tool", sorted(RESPONSES))
def test_message_to_value_matches_the_listfields_walk_on_responses(tool: str) -> None:
    """What the adapter turns into structuredContent: every reply a tool's output schema allows.
    Fewer examples than the constructor's property above: the converters are generated per
    message type, so a value's shape, not its number, is what finds a difference."""
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(outputs(tool))
    def check(value: Any) -> None:
        _same_value(_converted(value, RESPONSES[tool]))

    check()


@pytest.mark.parametrize("tool", sorted(REQUESTS))
def test_message_to_value_matches_the_listfields_walk_on_requests(tool: str) -> None:
    """What the core turns into arguments: every request the input schema allows."""
    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(arguments(tool))
    def check(value: Any) -> None:
        _same_value(_converted(value, REQUESTS[tool]))

    check()


@pytest.mark.parametrize("msg", [
    memory_pb2.SearchResponse(),  # the required empty list, added
    memory_pb2.SearchResponse(records=[memory_pb2.RecordPacket(score=-0.0), memory_pb2.RecordPacket(score=0.0, rank=0)]),
    memory_pb2.SearchResponse(rank_receipt={}),  # an empty sub-message keeps its presence
    host_pb2.HealthResponse(),  # fields without presence: none listed at zero
    host_pb2.HealthResponse(status="ok", store_open=True, audit_devices=3, last_anchor_at_ms=-1),
    host_pb2.AuthorizationEpochResponse(authorization_epoch=2**63 + 1),
    host_pb2.IssueConfirmationResponse(signed_grant=b"\x00", grant_id="g"),
])
def test_message_to_value_matches_the_listfields_walk_on_edges(msg: Any) -> None:
    from engram_core.rpc.convert import message_to_value

    # repr: bytes are not JSON, and it too shows key order, -0.0, and 1 against 1.0 and True.
    assert repr(message_to_value(msg)) == repr(_listfields_walk(msg))
