"""A refusal for a bound or a format names its field and the bound (issue 60 item 3): the message
comes from the constant catalogue (engram_core.contract.errors.REFUSALS) and never echoes the input."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from engram_core.contract.errors import Code, EngramError, refusal_message
from engram_core.contract.schema_examples import (
    EXAMPLE_CANDIDATE_ID,
    EXAMPLE_PURPOSE,
    EXAMPLE_RECORD_ID,
    SCHEMA_CAPTURE_EXAMPLE,
)
from engram_core.contract.tools import ADMISSION_TOOL, CAPTURE_TOOL, GET_TOOL, SEARCH_TOOL
from engram_core.contract.validation import canonical_arguments

KEY = "refusal-messages-key-0001"


def _refusal(tool: str, args: dict[str, Any]) -> tuple[Code, str, str, str]:
    with pytest.raises(EngramError) as caught:
        canonical_arguments(tool, args)
    err = caught.value
    return err.code, str(err.reason_class), err.pointer, refusal_message(err.code, err.reason_class)


def test_limit_out_of_range_names_limit_and_its_bounds() -> None:
    code, cls, ptr, message = _refusal(SEARCH_TOOL, {"query": "cache", "purpose_ref": EXAMPLE_PURPOSE, "limit": 100})
    assert (code, cls, ptr) == (Code.INVALID_SCHEMA, "limit_out_of_range", "/limit")
    assert message.startswith("limit is outside its bounds") and "1 to 50" in message and "100" not in message


def test_a_candidate_id_where_a_record_id_belongs_and_the_other_way_round() -> None:
    code, cls, ptr, message = _refusal(GET_TOOL, {"record_id": EXAMPLE_CANDIDATE_ID, "purpose_ref": EXAMPLE_PURPOSE})
    assert (code, cls, ptr) == (Code.INVALID_SCHEMA, "record_id_format", "/record_id")
    assert message.startswith("record_id must be a record id: mem_") and EXAMPLE_CANDIDATE_ID not in message
    code, cls, ptr, message = _refusal(ADMISSION_TOOL, {"candidate_id": EXAMPLE_RECORD_ID, "idempotency_key": KEY})
    assert (code, cls, ptr) == (Code.INVALID_SCHEMA, "candidate_id_format", "/candidate_id")
    assert message.startswith("candidate_id must be a candidate id: cand_") and EXAMPLE_RECORD_ID not in message


def test_a_malformed_digest_states_the_digest_format() -> None:
    args = copy.deepcopy(SCHEMA_CAPTURE_EXAMPLE)
    args["payload"]["citations"][0]["content_digest"] = "sha256:" + "A" * 64  # uppercase hex
    code, cls, _ptr, message = _refusal(CAPTURE_TOOL, args)
    assert (code, cls) == (Code.INVALID_DIGEST, "format")
    assert "sha256: followed by 64 lowercase hex digits" in message and "A" * 64 not in message


def test_a_list_out_of_bounds_names_the_list() -> None:
    args = copy.deepcopy(SCHEMA_CAPTURE_EXAMPLE)
    args["payload"]["components"] = []
    code, cls, ptr, message = _refusal(CAPTURE_TOOL, args)
    assert (code, cls, ptr) == (Code.INVALID_SCHEMA, "components_count", "/payload/components")
    assert "1 to 64" in message
