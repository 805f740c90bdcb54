"""Policy engine failure modes fail closed with no side effect (issue 7 item 5, SPEC §9, §12).

An OPA-REST-compatible server (tests/support/opa_rest_server.py, extended here
with malformed answers) is switched, under a running core, to: HTTP errors,
answers past the deadline, undefined decisions (no ``result``), malformed
decisions; and a core is started against an engine that is down. Every
operation answers POLICY_UNAVAILABLE, nothing in the store changes, and health
is NOT_SERVING until the bundle answers again. The embedded engine: an
undefined admission decision after a reload changes nothing either.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram_core.api import admin_pb2, host_pb2
from engram_core.app.composition import default_policies_dir
from engram_core.contract.errors import Code
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, capture_args
from tests.support.crash_harness import free_port
from tests.support.opa_rest_server import OpaRestTestServer
from tests.support.reliability_crash import domain_state


class KnobServer(OpaRestTestServer):
    """Adds malformed answers: a bare value instead of an object, and an object of the wrong shape."""

    def answer(self, path: str, input: Any) -> tuple[int, dict[str, Any]]:
        status, body = super().answer(path, input) if self.mode not in ("bare", "shape") else (200, {})
        if self.mode == "bare":
            return 200, {"result": True, "provenance": {"bundles": {"engram": {"revision": self.revision}}}}
        if self.mode == "shape":
            return 200, {"result": {"allow": "yes", "tools": "all", "decision": 1},
                         "provenance": {"bundles": {"engram": {"revision": self.revision}}}}
        return status, body


def health(c: Client) -> tuple[str, int]:
    ours = c.host.Health(host_pb2.HealthRequest(), timeout=10).status
    std = health_pb2_grpc.HealthStub(c.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
    return ours, std


def wait_health(c: Client, want: str, timeout: float = 10) -> None:
    std_want = health_pb2.HealthCheckResponse.SERVING if want == "SERVING" else health_pb2.HealthCheckResponse.NOT_SERVING
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if health(c) == (want, std_want):
            return
        time.sleep(0.1)
    raise AssertionError(f"health is {health(c)}, not {want}")


def every_operation_fails_closed(c: Client, cid: str, rid: str) -> None:
    ops: list[tuple[str, dict[str, Any], bool]] = [
        ("capture", capture_args("Policy down capture of the wren."), False),
        ("request_admission", {"candidate_id": cid, "idempotency_key": "pol-adm-key-xxxxxxxxxxxxxx"}, False),
        ("withdraw", {"candidate_id": cid, "idempotency_key": "pol-wd-key-xxxxxxxxxxxxxxx", "reason_ref": "r:x"}, True),
        ("forget", {"record_id": rid, "idempotency_key": "pol-fg-key-xxxxxxxxxxxxxxx", "reason_ref": "r:x"}, True),
        ("search", {"query": "wren", "purpose_ref": c.purpose_ref}, False),
        ("get", {"record_id": rid, "purpose_ref": c.purpose_ref}, False),
    ]
    for op, args, gated in ops:
        assert c.fails(op, args, grant=gated or None) == Code.POLICY_UNAVAILABLE, op
    with pytest.raises(grpc.RpcError) as err:
        c.tools()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def opa_core(stores: EngineStores, tmp_path):
    server = KnobServer(default_policies_dir(), delay_s=2.5)
    server.__enter__()
    running = stores.start_core(tmp_path / "data", opa_url=server.url, semantic=False)
    from tests.support.reliability_crash import activate_scope

    activate_scope(running)
    yield server, running
    running.stop()
    server.__exit__(None, None, None)


@pytest.mark.parametrize("mode", ["error", "slow", "no_result", "bare", "shape"])
def test_opa_failure_fails_closed_with_no_side_effect_and_not_serving(opa_core, mode) -> None:
    server, running = opa_core
    c = Client(running)
    rid = c.remember("The policy outage drill keeps this wren record.")
    cid = c.capture("The policy outage drill keeps this wren candidate pending.")["candidate_id"]
    wait_health(c, "SERVING")
    before = domain_state(running)
    server.mode = mode
    every_operation_fails_closed(c, cid, rid)
    wait_health(c, "NOT_SERVING")
    assert domain_state(running) == before
    server.mode = "normal"
    wait_health(c, "SERVING")
    assert c.get(rid)["record"]["record_id"] == rid  # nothing was changed by the failed calls
    assert c.admit(cid)["outcome"]["status"] == "accepted"


def test_engine_down_at_start_is_not_serving_and_changes_nothing(stores: EngineStores, tmp_path) -> None:
    with KnobServer(default_policies_dir()) as server:
        running = stores.start_core(tmp_path / "data", opa_url=server.url, semantic=False)
        from tests.support.reliability_crash import activate_scope

        activate_scope(running)
        c = Client(running)
        rid = c.remember("The engine outage drill keeps this plover record.")
        cid = c.capture("The engine outage drill keeps this plover candidate.")["candidate_id"]
        running.stop()
    down = stores.start_core(tmp_path / "data", opa_url=f"http://127.0.0.1:{free_port()}", semantic=False)
    try:
        c = Client(down)
        before = domain_state(down)
        wait_health(c, "NOT_SERVING")
        every_operation_fails_closed(c, cid, rid)
        assert domain_state(down) == before
    finally:
        down.stop()


def test_embedded_undefined_admission_decision_changes_nothing(stores: EngineStores, tmp_path) -> None:
    bundle = tmp_path / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    running = stores.start_core(tmp_path / "data", policies_dir=bundle, semantic=False)
    try:
        from tests.support.reliability_crash import activate_scope

        activate_scope(running)
        c = Client(running)
        cid = c.capture("An undefined admission decision leaves this dunlin pending.")["candidate_id"]
        rego = bundle / "engram" / "admission" / "admission.rego"
        rego.write_text(rego.read_text().replace("decision :=", "renamed_decision :=")
                        .replace("decision =", "renamed_decision =").replace("decision if", "renamed_decision if"))
        (bundle / "engram" / "admission" / "admission_test.rego").unlink()
        from tests.support.reliability_crash import HostAdmin

        host = HostAdmin(running)
        host.call("ReloadPolicies", admin_pb2.ScopeRequest())
        before = domain_state(running)
        assert c.fails("request_admission", {"candidate_id": cid, "idempotency_key": "undef-adm-key-xxxxxxxxx"}) \
            == Code.POLICY_UNAVAILABLE
        assert domain_state(running) == before
        host.close()
    finally:
        running.stop()
