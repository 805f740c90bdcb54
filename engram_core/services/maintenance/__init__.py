"""Host maintenance (SPEC §12), by concern: lifecycle transitions, adjudication, reads, audit
verification and anchors, keys and host keys, schema/projections/policies.

Every operation authorizes the *host* context for ``admin.<op>`` (policy asks for a host
principal holding the ``read`` or ``maintain`` scope), then acts on the target scope named in the
request through a derived context, so journal events, idempotency rows and audit rows land in
the scope they concern while keeping the host's principal and audit id. Host mutations are
idempotent by the request's ``event_id``: it is the key of an idempotency row in the target scope
under the host principal, written in the same transaction as the effect (SPEC §7). Backup and
restore live in ``engram_core.services.backup``.
"""

from engram_core.services.maintenance.adjudication import AdjudicationOps
from engram_core.services.maintenance.audit_checks import AuditOps, check_anchor, check_audit, check_journal
from engram_core.services.maintenance.base import event_doc, parse_cursor, record_meta
from engram_core.services.maintenance.keys import KeyOps
from engram_core.services.maintenance.projections import (
    ANALYZER_META,
    VECTOR_MODEL_META,
    ProjectionOps,
    reanalyze_lexical,
    reembed_vectors,
)
from engram_core.services.maintenance.reads import ReadOps
from engram_core.services.maintenance.transitions import TransitionOps


class MaintenanceService(TransitionOps, AdjudicationOps, ReadOps, AuditOps, KeyOps, ProjectionOps):
    """Every host maintenance operation, one class per concern (each a ``HostOps``)."""


__all__ = ["ANALYZER_META", "VECTOR_MODEL_META", "MaintenanceService", "check_anchor", "check_audit",
           "check_journal", "event_doc", "parse_cursor", "reanalyze_lexical", "record_meta", "reembed_vectors"]
