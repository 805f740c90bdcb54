"""A capture's vector is computed while the agent turns round to request admission: the record
carries exactly the vector its text embeds to, and nothing of a withdrawn or decided candidate
stays in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, activate, capture_args


def test_the_early_vector_is_the_records_own_and_goes_with_its_candidate(stores: EngineStores, tmp_path: Path) -> None:
    running = stores.start_core(tmp_path / "data", semantic=True)
    try:
        assert running.core.embedder is not None and running.memory is not None
        activate(running)
        c = Client(running)
        text = "We pinned the queue consumer to one partition because ordering matters."
        cap = c.capture(text)
        assert cap["candidate_id"] in running.memory.mutations._early_vectors
        rid = c.admit(cap["candidate_id"])["outcome"]["record_id"]
        assert cap["candidate_id"] not in running.memory.mutations._early_vectors
        with running.core.store.read() as tx:
            projection = tx.projection(rid)
        assert projection is not None and projection.vector is not None
        alone = np.asarray(running.core.embedder.embed(text), dtype=np.float32)
        assert float(np.dot(alone, projection.vector)) > 0.9999

        gone = c.capture("A candidate the agent takes back before anyone decides it.")
        assert gone["candidate_id"] in running.memory.mutations._early_vectors
        c.call("withdraw", {"candidate_id": gone["candidate_id"], "idempotency_key": "withdraw-early-0001",
                            "reason_ref": "reason:changed-mind"}, grant=True)
        assert gone["candidate_id"] not in running.memory.mutations._early_vectors
    finally:
        running.stop()


def test_captures_that_do_not_commit_keep_no_vector(stores: EngineStores, tmp_path: Path) -> None:
    """The model starts on a capture's text before its write; only a committed capture keeps
    the vector. Eight identical captures at once (one key): one candidate, one vector held."""
    from concurrent.futures import ThreadPoolExecutor

    running = stores.start_core(tmp_path / "data", semantic=True)
    try:
        assert running.memory is not None
        activate(running)
        c = Client(running)
        args = capture_args("Retries use exponential backoff capped at thirty seconds.", key="early-same-key-0001")
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda _: c.call("capture", args), range(8)))
        ids = {o["candidate_id"] for o in outs}
        assert len(ids) == 1 and sorted(o["status"] for o in outs).count("committed_pending") == 1
        assert list(running.memory.mutations._early_vectors) == list(ids)
    finally:
        running.stop()
