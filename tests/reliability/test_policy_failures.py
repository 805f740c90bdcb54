"""Policy engine failure modes fail closed with no side effect (issue 7 item 5, SPEC §9, §12).

An OPA-REST-compatible server (tests/support/opa_rest_server.py, extended here
with malformed answers) is switched, under a running core, to: HTTP errors,
answers past the deadline, undefined decisions (no ``result``), malformed
decisions; and a core is started against an engine that is down. Every
operation answers POLICY_UNAVAILABLE, nothing in the store changes, and health
is NOT_SERVING until the bundle answers again. The embedded engine: an
undefined admission decision after a reload changes nothing either.

The five misbehaviours share one core per engine (``opa_core``): each test records its own
record and candidate, and starts from the server answering and the core SERVING. The operations
of a drill are sent at once, each on its own thread, as clients would: an engine past its
deadline (``POLICY_TIMEOUT_S``, 1 s) then costs one deadline, not one per operation. The cores
here check their standard health every ``HEALTH_CHECK_S`` instead of every second: each drill
waits for two health transitions, which at the second's tick cost ~1.7 s of every drill.
"""

from __future__ import annotations

import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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

HEALTH_CHECK_S = 0.1  # the health watcher's own loop, only faster (engram_core/rpc/server.py)


class KnobServer(OpaRestTestServer):
    """Adds malformed answers: a bare value instead of an object, and an object of the wrong shape."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        # serve_forever's default poll (0.5 s) is how long each stop waited; a stop is all it changes.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

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
        time.sleep(0.05)
    raise AssertionError(f"health is {health(c)}, not {want}")


def every_operation_fails_closed(c: Client, cid: str, rid: str) -> None:
    """Each of the six calls and tools/list fails closed; sent together, so that an engine that
    answers past its deadline holds the drill for one deadline instead of seven."""
    key = secrets.token_hex(8)  # fresh keys: a call wrongly let through could not replay an earlier one
    ops: list[tuple[str, dict[str, Any], bool]] = [
        ("capture", capture_args("Policy down capture of the wren."), False),
        ("request_admission", {"candidate_id": cid, "idempotency_key": f"pol-adm-key-{key}"}, False),
        ("withdraw", {"candidate_id": cid, "idempotency_key": f"pol-wd-key-{key}", "reason_ref": "r:x"}, True),
        ("forget", {"record_id": rid, "idempotency_key": f"pol-fg-key-{key}", "reason_ref": "r:x"}, True),
        ("search", {"query": "wren", "purpose_ref": c.purpose_ref}, False),
        ("get", {"record_id": rid, "purpose_ref": c.purpose_ref}, False),
    ]

    def tools_refused() -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as err:
            c.tools()
        return err.value.code()

    calls: list[Callable[[], Any]] = [lambda op=op, args=args, gated=gated: c.fails(op, args, grant=gated or None)
                                      for op, args, gated in ops]
    with ThreadPoolExecutor(max_workers=len(calls) + 1) as pool:
        outcomes = [pool.submit(call) for call in calls]
        refused = pool.submit(tools_refused)
        for (op, _, _), outcome in zip(ops, outcomes, strict=True):
            assert outcome.result() == Code.POLICY_UNAVAILABLE, op
        assert refused.result() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture(scope="module")
def module_opa_core(module_stores: EngineStores,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KnobServer, Any]]:
    from tests.support.reliability_crash import activate_scope

    with KnobServer(default_policies_dir(), delay_s=2.5) as server:
        running = module_stores.start_core(tmp_path_factory.mktemp("opa") / "data", opa_url=server.url,
                                           semantic=False, health_interval_s=HEALTH_CHECK_S)
        try:
            activate_scope(running)
            yield server, running
        finally:
            running.stop()


@pytest.fixture
def opa_core(module_opa_core: tuple[KnobServer, Any]) -> tuple[KnobServer, Any]:
    """The module's core, its engine answering again (as a failed test may have left it) and the core SERVING."""
    server, running = module_opa_core
    server.mode = "normal"
    c = Client(running)
    try:
        wait_health(c, "SERVING")
    finally:
        c.channel.close()
    return server, running


@pytest.mark.parametrize("mode", ["error", "slow", "no_result", "bare", "shape"])
def test_opa_failure_fails_closed_with_no_side_effect_and_not_serving(opa_core, mode) -> None:
    server, running = opa_core
    c = Client(running)
    rid = c.remember(f"The policy outage drill ({mode}) keeps this wren record.")
    cid = c.capture(f"The policy outage drill ({mode}) keeps this wren candidate pending.")["candidate_id"]
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
    down = stores.start_core(tmp_path / "data", opa_url=f"http://127.0.0.1:{free_port()}", semantic=False,
                             health_interval_s=HEALTH_CHECK_S)
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
