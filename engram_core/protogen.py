"""Generates the protobuf/gRPC stubs from proto/ into engram_core/_gen.

Run by the install step (tools/setup) and checked on import of
``engram_core.api``: when the .proto files change, the stubs are regenerated,
so a stale build can never serve an old contract. Generated code is never
committed.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
GEN_DIR = PACKAGE_DIR / "_gen"
STAMP = GEN_DIR / "PROTO_DIGEST"


def proto_root() -> Path:
    """The repository's proto/ directory (source checkouts and editable installs)."""
    return PACKAGE_DIR.parent / "proto"


def _proto_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.proto"))


def proto_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in _proto_files(root):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def stubs_current() -> bool:
    root = proto_root()
    if not root.is_dir():
        # Installed without sources: whatever was generated at install time is it.
        return (GEN_DIR / "engram" / "v1" / "memory_pb2.py").exists()
    return STAMP.exists() and STAMP.read_text().strip() == proto_digest(root)


def generate(root: Path | None = None, gen_dir: Path | None = None) -> None:
    """Generate stubs from ``root`` (default: the repository's proto/) into ``gen_dir``
    (default: engram_core/_gen; setup.py passes the wheel's build directory)."""
    from grpc_tools import protoc  # build-time tool, imported only when needed

    root = root or proto_root()
    gen_dir = gen_dir or GEN_DIR
    gen_dir.mkdir(parents=True, exist_ok=True)
    # Generate into a fresh directory and swap, so a concurrent importer never
    # sees half-written stubs.
    with tempfile.TemporaryDirectory(dir=gen_dir.parent) as tmp:
        files = [str(p.relative_to(root)) for p in _proto_files(root)]
        include = str(Path(protoc.__file__).parent / "_proto")
        args = ["protoc", f"-I{root}", f"-I{include}", f"--python_out={tmp}", f"--grpc_python_out={tmp}", f"--pyi_out={tmp}", *files]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed")
        for sub in Path(tmp).rglob("*"):
            if sub.is_dir():
                (sub / "__init__.py").touch()
        (Path(tmp) / "__init__.py").touch()
        # grpc_python_out emits absolute imports (`from engram.v1 import ...`);
        # rewrite them to the package-relative location.
        for py in Path(tmp).rglob("*_pb2*.py"):
            text = py.read_text()
            text = text.replace("from engram.v1 import", "from engram_core._gen.engram.v1 import")
            py.write_text(text)
        for py in Path(tmp).rglob("*"):
            if py.is_file():
                dest = gen_dir / py.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(py, dest)
    (gen_dir / STAMP.name).write_text(proto_digest(root) + "\n")


def ensure() -> None:
    if not stubs_current():
        generate()


if __name__ == "__main__":
    generate()
    print(f"generated stubs in {GEN_DIR}", file=sys.stderr)
