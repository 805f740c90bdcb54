"""Provenance facts: what a candidate's citations point at, as schemes and hosts only.

A tenant may trust some sources more than others (its own repository host, its ticket system)
and say so in policy: ``provenance.source_hosts`` against ``trusted_source_hosts``. A
``source_ref`` is an opaque reference (SPEC §5): when it parses as a URL its scheme and host
are reported, when it is a record id (``mem_…``) it counts as a record citation, otherwise
only its scheme-like prefix (``ticket:``, ``file:``) is, or nothing. Paths, queries and the
rest of a reference are never reported.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import re2

_SCHEME = re2.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,31}):")
_RECORD_ID = re2.compile(r"^mem_[a-z2-7]{52}$")
_HOST = re2.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
_MAX = 16


def _scheme_host(ref: str) -> tuple[str, str]:
    m = _SCHEME.search(ref)
    if m is None:
        return "", ""
    scheme = m.group(1).lower()
    host = ""
    if ref[m.end():m.end() + 2] == "//":
        try:
            host = (urlsplit(ref).hostname or "").rstrip(".")
        except ValueError:
            host = ""
        if not _HOST.fullmatch(host) or len(host) > 253:
            host = ""
    return scheme, host


def provenance(payload: dict[str, Any]) -> dict[str, Any]:
    """``{"source_schemes", "source_hosts", "locator_schemes", "locator_hosts", "record_citations",
    "opaque_citations"}``: sorted, de-duplicated, at most 16 of each; ``opaque_citations`` counts
    the source_refs that are neither a record id nor start with a scheme."""
    source_schemes: set[str] = set()
    source_hosts: set[str] = set()
    locator_schemes: set[str] = set()
    locator_hosts: set[str] = set()
    records = opaque = 0
    for citation in payload.get("citations", []):
        ref = citation.get("source_ref", "")
        if _RECORD_ID.fullmatch(ref):
            records += 1
        else:
            scheme, host = _scheme_host(ref)
            if scheme:
                source_schemes.add(scheme)
            else:
                opaque += 1
            if host:
                source_hosts.add(host)
        locator = citation.get("locator", {})
        if isinstance(locator.get("scheme"), str):
            locator_schemes.add(locator["scheme"].lower()[:64])
        _, host = _scheme_host(str(locator.get("value", "")))
        if host:
            locator_hosts.add(host)
    return {
        "source_schemes": sorted(source_schemes)[:_MAX], "source_hosts": sorted(source_hosts)[:_MAX],
        "locator_schemes": sorted(locator_schemes)[:_MAX], "locator_hosts": sorted(locator_hosts)[:_MAX],
        "record_citations": records, "opaque_citations": opaque,
    }
