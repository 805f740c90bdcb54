"""Reading an OPA bundle directory (``policies/``) the way OPA does.

Rego modules are added under their path relative to the bundle root;
every ``data.json`` is merged at its directory's path (``policies/data.json``
at ``data``, ``policies/a/b/data.json`` at ``data.a.b``); ``.manifest`` names
the revision and the roots the bundle owns.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opa_bindings.engine import OpaEngine

_PACKAGE = re.compile(r"^package\s+([A-Za-z_][\w.]*)\s*$", re.MULTILINE)


class BundleError(Exception):
    """The bundle directory cannot be read or compiled; the message says why."""


@dataclass(frozen=True)
class Bundle:
    """The files of one bundle as read from disk (sources, not an engine)."""

    root: Path
    revision: str
    roots: tuple[str, ...]
    modules: dict[str, str]  # relative path -> Rego source
    data: tuple[tuple[str, Any], ...]  # (dotted path, value) per data.json

    def policy_modules(self) -> dict[str, str]:
        """The modules that decide: everything but ``*_test.rego``."""
        return {p: s for p, s in self.modules.items() if not is_test_module(p)}

    def test_modules(self) -> dict[str, str]:
        return {p: s for p, s in self.modules.items() if is_test_module(p)}


def is_test_module(relpath: str) -> bool:
    return relpath.endswith("_test.rego")


def package_of(source: str) -> str | None:
    match = _PACKAGE.search(source)
    return match.group(1) if match else None


def read_bundle(root: Path) -> Bundle:
    """Read ``.manifest``, every ``*.rego`` and every ``data.json`` under ``root``."""
    root = Path(root)
    if not root.is_dir():
        raise BundleError(f"bundle directory {root} does not exist")
    manifest_path = root / ".manifest"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"cannot read {manifest_path}: {exc}") from exc
    revision = manifest.get("revision") if isinstance(manifest, dict) else None
    roots = manifest.get("roots") if isinstance(manifest, dict) else None
    if not isinstance(revision, str) or not revision:
        raise BundleError(".manifest has no revision string")
    if not isinstance(roots, list) or not roots or not all(isinstance(r, str) and r for r in roots):
        raise BundleError(".manifest has no roots list")
    modules: dict[str, str] = {}
    data: list[tuple[str, Any]] = []
    try:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if any(part.startswith(".") for part in rel.parts) or not path.is_file():
                continue
            if path.suffix == ".rego":
                modules[rel.as_posix()] = path.read_text(encoding="utf-8")
            elif path.name == "data.json":
                data.append((".".join(rel.parent.parts), json.loads(path.read_text(encoding="utf-8"))))
    except (OSError, ValueError) as exc:
        raise BundleError(f"cannot read bundle file: {exc}") from exc
    bundle = Bundle(root, revision, tuple(roots), modules, tuple(data))
    _check_roots(bundle)
    return bundle


def _check_roots(bundle: Bundle) -> None:
    """Every package and every data key must sit under a root the manifest claims."""

    def owned(dotted: str) -> bool:
        slashed = dotted.replace(".", "/")
        return any(slashed == r or slashed.startswith(r.rstrip("/") + "/") for r in bundle.roots)

    for relpath, source in bundle.modules.items():
        package = package_of(source)
        if package is None:
            raise BundleError(f"{relpath}: no package declaration")
        if not owned(package):
            raise BundleError(f"{relpath}: package {package} is outside the manifest roots")
    for dotted, value in bundle.data:
        keys = [dotted] if dotted else [str(k) for k in (value if isinstance(value, dict) else {"": 0})]
        for key in keys:
            if not owned(key):
                raise BundleError(f"data at {key or 'data'} is outside the manifest roots")


def build_engine(bundle: Bundle, *, include_tests: bool = False) -> OpaEngine:
    """A new, compiled engine over the bundle; raises BundleError on any problem."""
    from opa_bindings.engine import OpaEngine, OpaError

    engine = OpaEngine()
    modules = bundle.modules if include_tests else bundle.policy_modules()
    try:
        for relpath, source in modules.items():
            engine.add_policy(relpath, source)
        for dotted, value in bundle.data:
            engine.add_data(value, dotted)
        # Compilation is lazy; a trivial query forces it so errors surface here.
        engine.eval_query("true")
    except OpaError as exc:
        engine.close()
        raise BundleError(str(exc)) from exc
    return engine
