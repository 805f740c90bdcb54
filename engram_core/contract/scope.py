"""``Scope``: the (tenant, workspace) every record, event, audit row and search belongs to, as
one value (issue 62). Every layer names a scope with it, so a tenant and a workspace cannot be
passed in the wrong order or one without the other; the engines unpack it where their SQL binds
parameters. Frozen and hashable: it is the key of per-scope state too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Scope:
    tenant: str
    workspace: str

    def __str__(self) -> str:
        """The form audit targets, messages and the console show: ``tenant/workspace``."""
        return f"{self.tenant}/{self.workspace}"
