"""Reading an OPA bundle (a ``policies/`` directory or a ``.tar.gz``) the way OPA does.

Rego modules are added under their path relative to the bundle root;
every ``data.json`` is merged at its directory's path (``policies/data.json``
at ``data``, ``policies/a/b/data.json`` at ``data.a.b``); ``.manifest`` names
the revision and the roots the bundle owns; ``.signatures.json``, when present,
signs the other files (``engram_core/policy/signing.py``).

Bundles pulled from a bundle server are untrusted input until their signature
verifies: tarballs are read with limits (size, member count, paths inside the
bundle, regular files only) and every pattern that reads their text is RE2.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import re2

if TYPE_CHECKING:
    from opa_bindings.engine import OpaEngine

MANIFEST = ".manifest"
SIGNATURES = ".signatures.json"
# OPA refuses bundles over 1 GiB; ours are policies: a few hundred KiB. A pulled archive
# beyond these is refused before it is unpacked (a gzip bomb stays compressed).
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
MAX_BUNDLE_FILES = 10_000

_PACKAGE = re2.compile(r"(?m)^package[ \t]+([A-Za-z_][A-Za-z0-9_.]*)[ \t]*$")
# OPA's compile errors: "<file>:<line>: <kind>: <message>" (the first one names the culprit).
_OPA_ERROR = re2.compile(r"([^\s:][^:\n]*):(\d+): (rego_[a-z_]+|[a-z_]+_error): ([^\n]*)")


class BundleError(Exception):
    """The bundle cannot be read, verified or compiled. ``file`` and ``line`` name where (when
    known: a file relative to the bundle root, a 1-based line), ``error`` says what."""

    def __init__(self, error: str, *, file: str = "", line: int = 0) -> None:
        self.error, self.file, self.line = error, file, line
        where = f"{file}:{line}: " if file and line else f"{file}: " if file else ""
        super().__init__(where + error)

    def problem(self) -> dict[str, Any]:
        """The reason as a document (admin answers, logs, reports)."""
        return {"file": self.file, "line": self.line, "error": self.error}


def opa_error(message: str) -> BundleError:
    """A BundleError naming the first file and line of an OPA compile or parse error."""
    match = _OPA_ERROR.search(message)
    if match is None:
        return BundleError(message.strip().splitlines()[0] if message.strip() else "compile error")
    more = max(0, len(_OPA_ERROR.findall(message)) - 1)
    error = f"{match.group(3)}: {match.group(4).strip()}" + (f" (and {more} more)" if more else "")
    return BundleError(error, file=match.group(1), line=int(match.group(2)))


@dataclass(frozen=True)
class Bundle:
    """The files of one bundle as read (sources, not an engine)."""

    root: Path  # the directory or archive it was read from (for messages)
    revision: str
    roots: tuple[str, ...]
    modules: dict[str, str]  # relative path -> Rego source
    data: tuple[tuple[str, Any], ...]  # (dotted path, value) per data.json
    # Every file the bundle consists of (relative path -> bytes), .manifest included and
    # .signatures.json excluded: what a signature covers.
    files: Mapping[str, bytes] = field(default_factory=dict)
    signatures: bytes | None = None  # the .signatures.json, if the bundle carries one
    # The archive's bytes when read from one (a pulled bundle is kept as received: ordering.py).
    archive: bytes | None = field(default=None, repr=False, compare=False)

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


def package_line(source: str) -> int:
    """The 1-based line of the package declaration (0 when there is none)."""
    match = _PACKAGE.search(source)
    return source.count("\n", 0, match.start()) + 1 if match else 0


def is_bundle_file(relpath: str) -> bool:
    """Files a bundle consists of: ``.manifest``, Rego modules and ``data.json`` documents.
    (Anything else in a directory, a README say, is not loaded and not signed.)"""
    name = PurePosixPath(relpath).name
    hidden = any(part.startswith(".") for part in PurePosixPath(relpath).parts)
    return relpath == MANIFEST or (not hidden and (name.endswith(".rego") or name == "data.json"))


def read_bundle(root: Path) -> Bundle:
    """Read a bundle directory, or a bundle archive (``.tar.gz``) when ``root`` is a file."""
    root = Path(root)
    if root.is_file():
        try:
            blob = root.read_bytes()
        except OSError as exc:
            raise BundleError(f"cannot read {root}: {exc.strerror}") from exc
        return read_bundle_archive(blob, origin=root)
    if not root.is_dir():
        raise BundleError(f"bundle directory {root} does not exist")
    files: dict[str, bytes] = {}
    signatures = None
    # Resolved once: when ``root`` is a symlink an operator swaps to a new revision's directory
    # (docs/policies.md, "Swapping a directory bundle"), one read sees one revision, never a mix.
    walk = root.resolve()
    try:
        for path in sorted(walk.rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(walk).as_posix()
            if rel == SIGNATURES:
                signatures = path.read_bytes()
            elif is_bundle_file(rel):
                files[rel] = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read bundle file: {exc.strerror}", file=_rel(root, exc.filename)) from exc
    return bundle_of_files(files, origin=root, signatures=signatures)


def read_bundle_archive(blob: bytes, *, origin: Path | str = "bundle.tar.gz") -> Bundle:
    """Read a gzipped tarball in OPA's bundle format (paths may be rooted: ``/.manifest``)."""
    files: dict[str, bytes] = {}
    signatures = None
    try:
        raw = _gunzip_bounded(blob)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            members = tar.getmembers()
            if len(members) > MAX_BUNDLE_FILES:
                raise BundleError(f"archive has more than {MAX_BUNDLE_FILES} members")
            for member in members:
                if member.isdir():
                    continue
                name = _member_name(member.name)
                if not member.isreg():
                    raise BundleError("archive member is not a regular file", file=name)
                extracted = tar.extractfile(member)
                content = extracted.read() if extracted is not None else b""
                if name == SIGNATURES:
                    signatures = content
                elif name in files:
                    raise BundleError("archive holds this file twice", file=name)
                else:
                    files[name] = content
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(f"not a bundle archive (gzipped tar): {exc}") from exc
    # OPA signs and loads every member; Engram loads the bundle files among them.
    bundle = bundle_of_files(files, origin=Path(str(origin)), signatures=signatures, all_files=True)
    return replace(bundle, archive=blob)


def _gunzip_bounded(blob: bytes) -> bytes:
    if len(blob) > MAX_BUNDLE_BYTES:
        raise BundleError(f"archive is larger than {MAX_BUNDLE_BYTES} bytes")
    with gzip.GzipFile(fileobj=io.BytesIO(blob)) as gz:
        raw = gz.read(MAX_BUNDLE_BYTES + 1)
    if len(raw) > MAX_BUNDLE_BYTES:
        raise BundleError(f"archive unpacks to more than {MAX_BUNDLE_BYTES} bytes")
    return raw


def _member_name(name: str) -> str:
    """A member's path inside the bundle; refuses any that would leave it."""
    parts = [p for p in PurePosixPath(name.lstrip("/")).parts if p not in ("", ".")]
    if not parts or ".." in parts or "\\" in name:
        raise BundleError(f"archive member {name!r} is not a path inside the bundle")
    return "/".join(parts)


def bundle_of_files(files: Mapping[str, bytes], *, origin: Path, signatures: bytes | None = None,
                    all_files: bool = False) -> Bundle:
    """Parse the manifest, modules and data of a bundle given as files (relative path -> bytes).
    ``all_files``: the files are an archive's members, all of which the signature must cover."""
    manifest_blob = files.get(MANIFEST)
    if manifest_blob is None:
        raise BundleError("the bundle has no .manifest", file=MANIFEST)
    manifest = _json_file(MANIFEST, manifest_blob)
    revision = manifest.get("revision") if isinstance(manifest, dict) else None
    roots = manifest.get("roots") if isinstance(manifest, dict) else None
    if not isinstance(revision, str) or not revision:
        raise BundleError("no revision string", file=MANIFEST)
    if not isinstance(roots, list) or not roots or not all(isinstance(r, str) and r for r in roots):
        raise BundleError("no roots list", file=MANIFEST)
    modules: dict[str, str] = {}
    data: list[tuple[str, Any]] = []
    for rel in sorted(files):
        if not is_bundle_file(rel) or rel == MANIFEST:
            continue
        if rel.endswith(".rego"):
            try:
                modules[rel] = files[rel].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BundleError("not UTF-8 text", file=rel) from exc
        else:
            data.append((".".join(PurePosixPath(rel).parent.parts), _json_file(rel, files[rel])))
    kept = dict(files) if all_files else {rel: blob for rel, blob in files.items() if is_bundle_file(rel)}
    bundle = Bundle(origin, revision, tuple(roots), modules, tuple(data), kept, signatures)
    _check_roots(bundle)
    return bundle


def _json_file(rel: str, blob: bytes) -> Any:
    try:
        return json.loads(blob.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BundleError("not UTF-8 text", file=rel) from exc
    except json.JSONDecodeError as exc:
        raise BundleError(f"invalid JSON: {exc.msg}", file=rel, line=exc.lineno) from exc


def _rel(root: Path, filename: str | None) -> str:
    try:
        return Path(filename or "").relative_to(root).as_posix() if filename else ""
    except ValueError:
        return str(filename)


def _check_roots(bundle: Bundle) -> None:
    """Every package and every data key must sit under a root the manifest claims."""

    def owned(dotted: str) -> bool:
        slashed = dotted.replace(".", "/")
        return any(slashed == r or slashed.startswith(r.rstrip("/") + "/") for r in bundle.roots)

    for relpath, source in bundle.modules.items():
        package = package_of(source)
        if package is None:
            raise BundleError("no package declaration", file=relpath)
        if not owned(package):
            raise BundleError(f"package {package} is outside the manifest roots", file=relpath,
                              line=package_line(source))
    for dotted, value in bundle.data:
        keys = [dotted] if dotted else [str(k) for k in (value if isinstance(value, dict) else {"": 0})]
        for key in keys:
            if not owned(key):
                where = "/".join([*dotted.split("."), "data.json"]) if dotted else "data.json"
                raise BundleError(f"data at {key or 'data'} is outside the manifest roots", file=where)


def build_engine(bundle: Bundle, *, include_tests: bool = False,
                 extra_modules: Mapping[str, str] | None = None) -> OpaEngine:
    """A new, compiled engine over the bundle; raises BundleError (naming the file and line of
    the first compile error) on any problem. ``extra_modules``: more modules to compile in
    (the test runner's probes)."""
    from opa_bindings.engine import OpaEngine, OpaError

    engine = OpaEngine()
    modules = dict(bundle.modules if include_tests else bundle.policy_modules())
    modules.update(extra_modules or {})
    try:
        for relpath, source in modules.items():
            engine.add_policy(relpath, source)
        for dotted, value in bundle.data:
            engine.add_data(value, dotted)
        # Compilation is lazy; a trivial query forces it so errors surface here.
        engine.eval_query("true")
    except OpaError as exc:
        engine.close()
        raise opa_error(exc.message) from exc
    return engine
