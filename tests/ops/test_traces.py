"""OpenTelemetry: one trace from the MCP tool call through the adapter's gRPC call into the core,
with spans for validation, policy decisions, the store transaction and ranking; no memory text,
query text or secret in any span. The core and the adapter run in this process (a real gRPC
server on loopback, the adapter driven by the MCP SDK's in-process client) so that their spans
reach one in-memory exporter; the trace context still crosses gRPC as W3C traceparent metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from adapters.mcp.config import load_host_config
from adapters.mcp.main import build_adapter
from engram_core.observability import tracing
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.mcp_helpers import (
    PURPOSE,
    WORKSPACE,
    Core,
    activate,
    approve,
    binding_for,
    capture_args,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio
SECRET_TEXT = "Pelicans audit the granite vault with tangerine passphrase 90417"
QUERY = "tangerine granite pelicans"
FORBIDDEN = (SECRET_TEXT, "tangerine", "granite", "Pelicans", "pelicans", "passphrase", "90417")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def traced_stack(tmp_path: Path, stores):
    exporter = InMemorySpanExporter()
    tracing.configure("engram-test", exporter=exporter, batch=False)
    running = stores.start_core(tmp_path / "core")
    try:
        core = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(core, "acme", WORKSPACE)
        config = load_host_config(str(write_config(tmp_path / "acme.toml", address=core.address,
                                                   signing_key=core.host_key_path, binding=binding_for("acme"))))
        adapter = build_adapter(config, running.address, load_private_key_file(running.host_key_path))
        yield adapter, exporter, tmp_path
    finally:
        running.stop()
        tracing.shutdown()


# What a span carries that is generated, not content: random ids (hex, or bytes in OTLP) and
# instants. A content needle such as "90417" can occur in those by chance (a 128-bit trace id
# holds a given five hex digits about once in 37,000 ids), so they are left out of the search.
_GENERATED = {"context", "parent_id", "start_time", "end_time", "timestamp", "trace_id", "span_id",
              "parent_span_id", "start_time_unix_nano", "end_time_unix_nano", "time_unix_nano"}


def _content(value: object) -> object:
    """``value`` (a span's JSON, or an OTLP message as a dict) without its generated fields."""
    if isinstance(value, dict):
        return {k: _content(v) for k, v in value.items() if k not in _GENERATED}
    if isinstance(value, list):
        return [_content(v) for v in value]
    return value


def _by_id(spans) -> dict[int, object]:
    return {s.context.span_id: s for s in spans}


def _ancestors(span, index) -> list:
    out = []
    while span.parent is not None and span.parent.span_id in index:
        span = index[span.parent.span_id]
        out.append(span)
    return out


def _trace_of(spans, root_name: str) -> tuple[object, list]:
    roots = [s for s in spans if s.name == root_name and s.parent is None]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    return root, [s for s in spans if s.context.trace_id == root.context.trace_id]


def _check_chain(trace: list, root, method: str) -> object:
    """root (adapter, SERVER) -> gRPC CLIENT span (adapter) -> gRPC SERVER span (core)."""
    index = _by_id(trace)
    client = [s for s in trace if s.kind == SpanKind.CLIENT and method in s.name]
    assert len(client) == 1, [(s.name, s.kind) for s in trace]
    assert client[0].parent.span_id == root.context.span_id
    server = [s for s in trace if s.kind == SpanKind.SERVER and method in s.name]
    assert len(server) == 1, [(s.name, s.kind) for s in trace]
    assert server[0].parent.span_id == client[0].context.span_id
    assert server[0].parent.is_remote  # it crossed gRPC as traceparent metadata
    assert root in _ancestors(server[0], index)
    return server[0]


def _under(trace: list, ancestor, name: str) -> list:
    index = _by_id(trace)
    return [s for s in trace if s.name == name and ancestor in _ancestors(s, index)]


async def test_one_trace_from_tool_call_into_core_with_steps_and_no_content(traced_stack) -> None:
    adapter, exporter, tmp_path = traced_stack
    async with Client(adapter.build(), elicitation_callback=approve) as client:
        cap = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("key"), SECRET_TEXT)))
        value_of(await client.call_tool("engram_memory_request_admission",
                                        {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")}))
        found = value_of(await client.call_tool("engram_memory_search", {"query": QUERY, "purpose_ref": PURPOSE}))
        assert found["records"], "the captured record is found"
    await adapter.close()
    spans = list(exporter.get_finished_spans())

    root, search = _trace_of(spans, "tools/call engram_memory_search")
    assert root.kind == SpanKind.SERVER and root.attributes["engram.outcome"] == "OK"
    core_span = _check_chain(search, root, "MemoryService/Search")
    assert _under(search, root, "engram.validate"), "the adapter validated the arguments"
    assert core_span.attributes["engram.outcome"] == "OK"
    assert core_span.attributes["engram.audit_id"] == root.attributes["engram.audit_id"]
    for step in ("engram.validate", "engram.policy.decide", "engram.search.rank"):
        assert _under(search, core_span, step), f"{step} missing under the core's span"
    decision = _under(search, core_span, "engram.policy.decide")[0]
    assert decision.attributes["engram.policy.family"] == "authz+redaction"
    assert decision.attributes["engram.policy.outcome"].startswith("allow")
    assert decision.attributes["engram.policy.revision"]

    root, admission = _trace_of(spans, "tools/call engram_memory_request_admission")
    core_span = _check_chain(admission, root, "MemoryService/RequestAdmission")
    assert _under(admission, core_span, "engram.store.transaction")
    assert {"authz", "admission"} <= {s.attributes["engram.policy.family"]
                                      for s in _under(admission, core_span, "engram.policy.decide")}

    exported = [json.loads(s.to_json()) for s in spans]
    (tmp_path / "trace.json").write_text(json.dumps([e for e in exported
                                                     if e["context"]["trace_id"] == f"0x{search[0].context.trace_id:032x}"],
                                                    indent=1))
    text = json.dumps(_content(exported))
    assert "engram.policy.family" in text  # the search below reads the attributes
    for needle in FORBIDDEN:
        assert needle not in text, f"{needle!r} reached an exported span"


def test_tracing_is_off_by_default_and_on_by_environment() -> None:
    assert not tracing.enabled()
    assert not tracing.wanted(False, env={})
    assert tracing.wanted(True, env={})
    assert tracing.wanted(False, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    assert tracing.wanted(False, env={"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.wanted(True, env={"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.wanted(True, env={"OTEL_SDK_DISABLED": "true"})


def test_engram_serve_exports_over_otlp_configured_by_environment(tmp_path: Path, stores) -> None:
    """A real `engram serve` with only OTEL_EXPORTER_OTLP_ENDPOINT set exports its spans to an
    OTLP/gRPC collector (here a loopback one in the test) and flushes them at SIGTERM."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    from tests.support.core_support import Client
    from tests.support.core_support import activate as activate_core
    from tests.support.ops_support import serve

    received: list = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 - the OTLP service's method name
            received.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    collector = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), collector)
    port = collector.add_insecure_port("127.0.0.1:0")
    collector.start()
    try:
        served = serve(stores, tmp_path / "data", env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                                               "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_SERVICE_NAME": "engram-ci"})
        try:
            assert "tracing on" in served.opened
            served.wait_ready()
            activate_core(served)
            Client(served).search(QUERY)
        finally:
            assert served.stop() == 0
    finally:
        collector.stop(0)
    spans = [(span.name, resource.resource)
             for request in received for resource in request.resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    names = {name for name, _ in spans}
    assert {"/engram.v1.MemoryService/Search", "engram.policy.decide", "engram.search.rank"} <= names, names
    services = {a.value.string_value for _, res in spans for a in res.attributes if a.key == "service.name"}
    assert services == {"engram-ci"}
    from google.protobuf.json_format import MessageToDict

    content = json.dumps(_content([MessageToDict(r, preserving_proto_field_name=True) for r in received]))
    assert "engram.search.rank" in content  # the search below reads the spans
    assert not any(word in content for word in FORBIDDEN)
