"""The policy engine ``engram serve`` runs: which backend, where its bundle comes from (a
directory or archive, or a bundle server), whether bundles must be signed, and whether
decisions are logged. Every core's engine is built here (``build_serving_policy``): ``serve``'s
with all its settings, any other core's with a bundle directory or an OPA only. Built before
the core opens and handed to it as its ``policy``; the bundle puller starts once the core is
serving, so its reloads go through the core's observed engine (logged and counted like SIGHUP
and ``engram admin reload-policies``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engram_core.contract.errors import EngramError
from engram_core.observability.logs import log_event
from engram_core.policy import OPA_BINDINGS_HINT, default_bundle_dir
from engram_core.policy.decisionlog.config import DecisionLogConfig, open_decision_logger
from engram_core.policy.decisionlog.logger import DecisionLogger, LoggedPolicyEngine
from engram_core.policy.ordering import RollbackGuard
from engram_core.policy.port import DECISION_PATHS, BundleRefused
from engram_core.policy.pull import BundlePuller, HttpBundleSource
from engram_core.policy.signing import BundleVerifier
from engram_core.policy.sources import DiskSource

log = logging.getLogger("engram.core")


@dataclass(frozen=True)
class PolicySettings:
    policies: Path | None = None
    opa_url: str | None = None
    bundle_url: str | None = None
    verification_key: Path | None = None
    poll_min_s: float = 10.0
    poll_max_s: float = 20.0
    bundle_token: str | None = None
    decision_log: DecisionLogConfig | None = None
    allow_rollback: str | None = None  # the one older signed revision an operator allows (ordering.py)


@dataclass
class ServingPolicy:
    engine: Any  # what the core asks (LoggedPolicyEngine around the backend when logging)
    backend: Any
    source: HttpBundleSource | None = None
    logger: DecisionLogger | None = None
    verifier: BundleVerifier | None = None
    guard: RollbackGuard | None = None
    refused: dict[str, Any] | None = None  # why the first load was refused, if it was
    unavailable: str = ""  # why no bundle could be had at start (a bundle server down), if so
    puller: BundlePuller | None = None

    def start_pulling(self, reload: Any, settings: PolicySettings) -> None:
        """Poll the bundle server, activating through ``reload`` (the core's observed engine)."""
        if self.source is not None and self.puller is None:
            self.puller = BundlePuller(self.source, reload, min_delay_s=settings.poll_min_s,
                                       max_delay_s=settings.poll_max_s)
            self.puller.start()

    def stop_pulling(self) -> None:
        if self.puller is not None:
            self.puller.stop()

    def describe(self) -> dict[str, str]:
        """For the start-up summary: where the bundle comes from, signing, decision logging."""
        if self.source is not None:
            where = f"pulled from {self.source.url}"
        elif hasattr(self.backend, "source"):
            where = self.backend.source.describe()
        else:
            where = "OPA server"
        out = {"policy_bundle": where,
               "bundle_verification": f"on ({self.verifier.origin})" if self.verifier else "off",
               "decision_log": "off"}
        if self.guard is not None:
            out["bundle_ordering"] = self.guard.describe()
        if self.logger is not None:
            out["decision_log"] = f"{self.logger.sink.name} (pseudonym key {self.logger.labels['pseudonym_key']})"
        return out


def build_serving_policy(settings: PolicySettings, data_dir: Path) -> ServingPolicy:
    """Build and load the backend: the one policy-engine builder, for ``engram serve`` and for
    every other core (``composition.build_policy``: tests, tools, ``engram mcp``'s embedded core).

    Errors, the same for every caller: ValueError for settings that cannot work (conflicting
    flags, an unreadable verification key, the embedded engine's OPA bindings not installed),
    raised before anything is loaded. A bundle that cannot be had or is refused is no error:
    the core comes up NOT_SERVING (every decision fails closed), the reason logged and kept in
    ``refused`` or ``unavailable`` for the start-up summary."""
    if settings.opa_url and (settings.bundle_url or settings.verification_key):
        raise ValueError("--opa-url asks an OPA server, which owns its bundle: --bundle-url and "
                         "--bundle-verification-key configure the embedded engine (configure OPA's own "
                         "bundle signing instead)")
    if settings.allow_rollback and (settings.verification_key is None or settings.opa_url):
        raise ValueError("--bundle-allow-rollback orders signed bundles: it needs --bundle-verification-key "
                         "(and the embedded engine)")
    verifier = None
    if settings.verification_key is not None:
        try:
            verifier = BundleVerifier.from_pem_file(str(settings.verification_key))
        except OSError as exc:
            raise ValueError(f"--bundle-verification-key: cannot read {settings.verification_key} "
                             f"({exc.strerror})") from None
        except ValueError as exc:
            raise ValueError(f"--bundle-verification-key {settings.verification_key}: {exc}") from None
    logging_on = settings.decision_log is not None
    source = None
    guard = None
    if settings.opa_url:
        from engram_core.policy.opa_rest import OpaRestPolicyEngine

        backend: Any = OpaRestPolicyEngine(settings.opa_url)
    else:
        try:
            from engram_core.policy.embedded import EmbeddedPolicyEngine
        except ModuleNotFoundError as exc:  # pragma: no cover - tools/setup installs the bindings
            if exc.name != "opa_bindings":
                raise
            raise ValueError(OPA_BINDINGS_HINT) from None
        # Signed bundles are ordered by their signing time, kept beside the core's keys.
        guard = RollbackGuard(data_dir, keep_bundle=bool(settings.bundle_url),
                              allow_rollback_to=settings.allow_rollback) if verifier is not None else None
        if settings.bundle_url:
            source = HttpBundleSource(settings.bundle_url, bearer_token=settings.bundle_token)
            backend = EmbeddedPolicyEngine(source=source, verifier=verifier, log_mask=logging_on, guard=guard)
        else:
            backend = EmbeddedPolicyEngine(settings.policies or default_bundle_dir(), verifier=verifier,
                                           log_mask=logging_on, guard=guard)
    serving = ServingPolicy(engine=backend, backend=backend, source=source, verifier=verifier,
                            guard=guard)
    if serving.guard is not None and (saved := serving.guard.saved_bundle()) is not None:
        _restore(backend, saved)
    try:
        backend.reload()
    except BundleRefused as exc:
        serving.refused = exc.problem
        log.error("policy bundle refused: %s", exc.detail)
    except EngramError as exc:
        serving.unavailable = exc.detail
        log.error("policy bundle not active: %s", exc.detail)
    if backend.active():
        # OPA prepares each query on first use: warm every decision path (each answers {}
        # with a denial) before the logger sees anything, so warming is not logged.
        for path in DECISION_PATHS:
            try:
                backend.decide(path, {}, timeout_s=30)
            except EngramError:
                pass
    if settings.decision_log is not None:
        remote = backend.evaluate_mask if settings.opa_url else None
        serving.logger = open_decision_logger(settings.decision_log, data_dir, mask_remotely=remote)
        serving.engine = LoggedPolicyEngine(backend, serving.logger)
        if not settings.opa_url and backend.active() and not backend.masks_decisions():
            log.warning("decision log: the bundle defines no engram.log.mask(event); every event is dropped "
                        "(counted as mask_missing) until one is loaded")
    return serving


def _restore(backend: Any, saved: Path) -> None:
    """Activate the pulled bundle accepted before this start (re-verified), so the server's
    answer, asked next, is ordered after it and a server down at start is no outage."""
    try:
        revision = backend.restore(DiskSource(saved))
    except BundleRefused as exc:
        log.error("saved policy bundle %s refused (the bundle server's is asked next): %s", saved, exc.detail)
    except EngramError as exc:
        log.error("saved policy bundle %s not active: %s", saved, exc.detail)
    else:
        log_event("policy_bundle_restored", revision=revision, path=str(saved))
