"""One request digest and one operation digest (SPEC §7, §8; issue 62): the core's pipeline,
which digests the arguments' canonical form from its one validation walk, and the MCP adapter
and pending confirmations, which digest the arguments as received, call the same functions
(``engram_core/contract/operation.py``) and get the same values for every tool's example
arguments, and those values are the ones computed before the two were one function: a change
to either path, or to the digests themselves, fails here."""

from __future__ import annotations

import hashlib

import pytest

from engram_core.contract.canonical import canonical_json
from engram_core.contract.operation import operation_digest, request_digest
from engram_core.contract.schema_examples import TOOL_EXAMPLES
from engram_core.contract.tools import GATED_TOOLS, TARGET_FIELD
from engram_core.services.pipeline import prepare
from engram_core.trust.hostctx import BoundContext

CTX = BoundContext(
    tenant="acme", workspace="platform", principal="user:ana", agent_id="agent:a", session="s",
    purpose_ref="purpose:engineering-notes", audit_id="aud", credential_ref="cred", issued_at_ms=0,
    expires_at_ms=1, memory_enabled=True, host_principal=False, maintenance_scopes=(), authorization_epoch=0,
    host_key_id="k")

# Per tool: the examples these values were computed for (sha256 of their canonical JSON, first
# 16 hex digits), then (request digest, operation digest) per example, in order.
EXPECTED: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "engram_memory_search": ("6aa27388f5f4a131", [
        ("sha256:85d220b159ed7a3a4975b6e2a2006655ad52aaf7f08cfd58e89442f207964a19",
         "sha256:7312d0cd90849201e8f26aad76086ff9cc9845c46548b2748373733636b5fac5"),
        ("sha256:7d16ef2746e51c5be75ff8812f7a1e25208b020299248076df7ba24797f55b0f",
         "sha256:14c435391569f634716355bd01522fb6d5b013558d9d92de134c806c554ae60a"),
    ]),
    "engram_memory_get": ("e3f8c5d951cf365c", [
        ("sha256:b645b979b8ac91816e7dc80a8793d0745693ce2f99a35f555d06b86feab2c527",
         "sha256:469240dc7ddbd617df36c72132d51a1b3b0783a5cf375abe3ea1eab11afae6d3"),
    ]),
    "engram_memory_capture": ("509e8f6a8ee44d0f", [
        ("sha256:b1deeaf84d4c691289515799a94cfcff23e91f3c6cc90d270d4d8dbcc72d2649",
         "sha256:9b9cfc8946b0be8c694fe9d7ae65854b62fbd690214e0cf9e28dd4f2c9e02858"),
        ("sha256:ce3a25314576f998875785dc8ec3d9287df7f451646d1a8b063d8145ac120af4",
         "sha256:40db19408ed753d5ba14d4452cb45caee65fb4c38eaf9a37c581f9c622cc63d0"),
        ("sha256:aeebe1b0a49bcce56881dcc064a6ba3e5db22811451b94b22d4b3a3b3ef302ba",
         "sha256:b27face02fe2723a31348e98da0235e58b364d84298095cc7a01875a861dabf1"),
        ("sha256:28e69d540746166ffe98d4dbd532be3750a4888c726fcdc48f58a9f363187ac5",
         "sha256:1aae037c74dadc3621b7990e63b82fb6bf2b2c7d2abbbad1daa98f50d2d279eb"),
        ("sha256:759d29126d1715223b0618d0d8f5d3765ce0fe7e3aae83ae5e65975d2fb1acad",
         "sha256:ec80564395c52d929ae62ba2b34ed25e2803647a9e575379f3217ef0735115dd"),
    ]),
    "engram_memory_request_admission": ("b47aa925d2aaee5b", [
        ("sha256:cf2fb1be4d93e3466538b1c58d1b4cfd495d687f95b13a112780c2dc92c29666",
         "sha256:55e53a42bbb9b5651c46dda4774ffdbe721914b7bc2f6ca0568a069526e7fdb4"),
    ]),
    "engram_memory_withdraw": ("2e393cdaa9521cbf", [
        ("sha256:ddd2d7fe5031d8888dca23969bfec6872ef4d70060d5e552aa5511814546242c",
         "sha256:83f6e298c9aad9909e5b2f728a7e09b94149aa761f95a9b64448951db48ef166"),
    ]),
    "engram_memory_forget": ("0f7b28d4e45247c4", [
        ("sha256:6bba7d87dcd4498bb4d583ca8f532e64958652ce888f5d6da8d253c6849235be",
         "sha256:b8f259fd5c0a8edc7ab1e39c0941a594670be14aa1ca5aafac8008b9ef5794e8"),
    ]),
}


def test_every_tool_is_pinned() -> None:
    assert set(EXPECTED) == set(TOOL_EXAMPLES)


@pytest.mark.parametrize("tool", sorted(TOOL_EXAMPLES))
def test_the_core_and_the_adapter_digest_every_example_alike_and_as_before(tool: str) -> None:
    examples = TOOL_EXAMPLES[tool]
    pinned, expected = EXPECTED[tool]
    assert hashlib.sha256(canonical_json(examples)).hexdigest()[:16] == pinned, (
        "the examples changed, not the digests: pin the new examples' digests computed by the code "
        "before any change to operation.py or pipeline.py")
    assert len(examples) == len(expected)
    for example, (request, operation) in zip(examples, expected, strict=True):
        prepared = prepare(CTX, tool, example)  # the core: the canonical form's members spliced
        adapter = operation_digest(tool=tool, tenant=CTX.tenant, workspace=CTX.workspace,
                                   principal=CTX.principal, arguments=example)  # the arguments as received
        assert (prepared.request_digest, request_digest(tool, example)) == (request, request)
        assert (prepared.operation_digest, adapter) == (operation, operation)


@pytest.mark.parametrize("tool", sorted(GATED_TOOLS))
def test_a_parked_confirmation_binds_the_digest_the_adapter_asks_with(tool: str) -> None:
    """Pending confirmations check a parked request's digest from its target and reason alone:
    for a gated tool those are all its arguments but the idempotency key."""
    field = TARGET_FIELD[tool]
    assert field is not None
    for example in TOOL_EXAMPLES[tool]:
        parked = {field: example[field], "reason_ref": example["reason_ref"]}
        assert set(example) - set(parked) == {"idempotency_key"}
        assert operation_digest(tool=tool, tenant=CTX.tenant, workspace=CTX.workspace, principal=CTX.principal,
                                arguments=parked) == prepare(CTX, tool, example).operation_digest


def test_the_idempotency_key_target_scope_and_principal_are_what_they_bind() -> None:
    example = TOOL_EXAMPLES["engram_memory_forget"][0]
    base = prepare(CTX, "engram_memory_forget", example)
    rekeyed = prepare(CTX, "engram_memory_forget", {**example, "idempotency_key": "forget-another-key-0000000"})
    assert (rekeyed.request_digest, rekeyed.operation_digest) == (base.request_digest, base.operation_digest)
    other_target = {**example, "record_id": example["record_id"][:-1] + "a"}
    assert request_digest("engram_memory_forget", other_target) != base.request_digest
    for change in ({"tenant": "other"}, {"workspace": "other"}, {"principal": "user:bob"}):
        scope = {"tenant": CTX.tenant, "workspace": CTX.workspace, "principal": CTX.principal, **change}
        assert operation_digest(tool="engram_memory_forget", arguments=example, **scope) != base.operation_digest
