"""Policy decisions: the PolicyEngine port and its backends (embedded OPA, OPA REST)."""

from __future__ import annotations

from pathlib import Path

OPA_BINDINGS_HINT = (
    "the embedded policy engine needs OPA's in-process bindings: "
    "pip install --no-deps --ignore-requires-python opa-golib-python-bindings==0.4.4 "
    "(tools/setup installs them), or ask an OPA server with --opa-url URL"
)


def default_bundle_dir() -> Path:
    """The bundled policies: the source tree's ``policies/`` (checkouts, editable installs),
    else the copy a built wheel ships inside the package (see setup.py)."""
    package = Path(__file__).resolve().parents[1]
    source = package.parent / "policies"
    return source if source.is_dir() else package / "bundled_policies"
