"""An int8 sketch of a scope's vectors: the first pass of ``SearchIndex.nearest`` at scale.

``nearest`` answers with float64 similarities, but computing them for every row is what made a
fused search slow at 100k records; since 2026-12-05 a cheaper first pass over every row picks
the few rows that may be on the page, with a rigorous bound on its error, and only those get
float64 similarities. The float32 product of every row (BLAS ``sgemv``) reads the whole float32
matrix, 150 MB at 100k records of 384 dimensions, and is bound by memory bandwidth (4.5–6.5 ms
on the project's VM). This sketch holds each row as int8 codes, a quarter of the bytes, and
computes the integer products with onnxruntime's ``MatMulInteger`` (MLAS's u8×s8 kernel: ~1 ms
at 100k rows on two threads), so the first pass costs about a fifth.

A row ``x`` is held as codes ``c`` (int8, |c_i| ≤ 127) and a scale ``s = max|x_i| / 127``, with
``e = x − s·c`` its error; the query ``q`` as codes ``d`` (|d_i| ≤ 63) and a scale
``t = max|q_i| / 63``, with ``f = q − t·d``. The kernel multiplies ``d + 64`` (uint8, at most
127) and ``c``, and 64 times each row's code sum is subtracted after, so ``c·d`` is exact, and

    x·q − s·t·(c·d) = e·q + s·c·f,   so   |x·q − s·t·(c·d)| ≤ ‖e‖·‖q‖ + ‖s·c‖·‖f‖,

which ``similarities`` bounds with the largest ``‖e‖`` and ``‖s·c‖`` of any row (kept as rows
are put) plus the float64 reference's own rounding. The answer ``nearest`` returns is therefore
the float64 answer whatever the sketch's values: a row the first pass leaves out cannot be on
the page.

The query has seven bits, not eight, because the kernel is exact only so. MLAS multiplies u8 by s8
on x86 CPUs without VNNI (AVX2, AVX-512BW) with ``vpmaddubsw``, which adds two adjacent products
into an int16 **with saturation**: with ``d + 128`` up to 255 a pair reached 2 × 255 × 127 =
64,770 and was clipped to 32,767, so on such a machine (issue 58: a 2-core CI runner) a
similarity was off by 1.24 against a bound of 0.137 and ``nearest`` returned other records than
the float64 answer, while VNNI and AMX machines, which add in int32, were exact. With the query's
codes at most 127 a pair is at most 2 × 127 × 127 = 32,258 and every kernel is exact (int32 sums:
384 × 127 × 127 < 2³¹); the price is a coarser query, ``‖f‖`` about twice as large (the bound
~0.025 instead of ~0.018 for unit vectors of 384 dimensions). The session is also checked once,
when it is made, on operands at those limits (``_exact``): a kernel found inexact leaves the
sketch unavailable, and ``nearest`` keeps the float32 pass rather than risk a wrong page.

The codes are held transposed, in blocks of ``BLOCK`` rows (``MatMulInteger``'s right operand is
``dims × rows``), so that rows are appended without copying the others; the last block grows by
a quarter (every search reads all of it). Without onnxruntime (the ``semantic`` extra),
``available()`` is false and ``nearest`` keeps the float32 pass.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any

import numpy as np

BLOCK = 32_768  # rows per block of codes (12.6 MB at 384 dimensions)
_U64 = 2.0**-53
ROW_LEVELS = 127  # a row's codes: |c_i| ≤ 127
QUERY_LEVELS = 63  # the query's: |d_i| ≤ 63, offset by 64 to uint8 [1, 127] (the module docstring)
QUERY_OFFSET = QUERY_LEVELS + 1

_log = logging.getLogger(__name__)
_session: Any = None
_session_lock = threading.Lock()
_unavailable = False


def _product_session() -> Any:
    """One onnxruntime session computing ``d @ B`` for a uint8 query row ``d`` and an int8
    block ``B`` (any number of columns): shared by every sketch (a session's ``run`` is
    thread-safe), or None when onnxruntime is not installed."""
    global _session, _unavailable
    if _session is not None or _unavailable:
        return _session
    with _session_lock:
        if _session is not None or _unavailable:
            return _session
        try:
            import onnxruntime as ort
            from onnx import TensorProto, helper
        except ImportError:
            _unavailable = True
            return None
        # No zero-point input: with one, MLAS took a path three times slower (2.4 vs 0.8 ms for
        # 65,536 rows); ``similarities`` subtracts 64 × each row's code sum instead.
        a = helper.make_tensor_value_info("d", TensorProto.UINT8, [1, None])
        b = helper.make_tensor_value_info("codes", TensorProto.INT8, [None, None])
        y = helper.make_tensor_value_info("y", TensorProto.INT32, [1, None])
        graph = helper.make_graph([helper.make_node("MatMulInteger", ["d", "codes"], ["y"])],
                                  "sketch_product", [a, b], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.inter_op_num_threads = 1
        # The product is bound by memory bandwidth, which a few threads saturate. Threads that
        # spin-wait after each run (onnxruntime's default) took 7.2 ms of CPU per search against
        # 3.1 without spinning, for 0.1 ms of latency: CPU the other calls on the core need.
        options.intra_op_num_threads = min(os.cpu_count() or 1, 4)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        if not _exact(session):
            _log.warning("onnxruntime's integer product is not exact on this CPU: the vector list's "
                         "first pass reads the float32 rows instead of the int8 sketch")
            _unavailable = True
            return None
        _session = session
        return _session


def _exact(session: Any) -> bool:
    """Whether ``session`` multiplies the operands ``similarities`` gives it exactly: uint8 query
    codes up to 127 by int8 codes in [−127, 127], at the limits (all 127 against rows of ±127,
    where a saturating kernel clips) and at random, in a few shapes (MLAS picks its path by
    shape)."""
    rng = np.random.default_rng(58)
    top = QUERY_OFFSET + QUERY_LEVELS
    for dims, rows in ((384, 67), (16, 16), (7, 5)):
        codes = rng.choice(np.array([-ROW_LEVELS, ROW_LEVELS]), size=(rows, dims))
        codes[0], codes[1] = ROW_LEVELS, -ROW_LEVELS
        codes[-1] = rng.integers(-ROW_LEVELS, ROW_LEVELS + 1, size=dims)
        block = np.ascontiguousarray(codes.T.astype(np.int8))
        for d in (np.full(dims, top), rng.integers(0, top + 1, size=dims)):
            got = session.run(None, {"d": d.astype(np.uint8).reshape(1, -1), "codes": block})[0]
            if not np.array_equal(np.asarray(got, dtype=np.int64).reshape(-1), codes @ d):
                return False
    return True


def available() -> bool:
    return _product_session() is not None


def _quantize(rows: np.ndarray, levels: int = ROW_LEVELS) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(codes int8 in [−levels, levels], scales, ‖e‖ per row, ‖s·c‖ per row) of float rows,
    computed in float64."""
    x = np.asarray(rows, dtype=np.float64)
    scale = np.abs(x).max(axis=1) / levels if x.shape[1] else np.zeros(len(x))
    safe = np.where(scale > 0, scale, 1.0)
    codes = np.clip(np.rint(x / safe[:, None]), -levels, levels)
    codes[scale == 0] = 0
    approx = codes * scale[:, None]
    err = np.linalg.norm(x - approx, axis=1)
    return codes.astype(np.int8), scale, err, np.linalg.norm(approx, axis=1)


def query_codes(query: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(the kernel's uint8 operand ``d + 64``, 1 × dims, each in [1, 127]; the scale ``t``;
    ``‖f‖``) of a query: quantized as a row is, with seven bits (the module docstring)."""
    d, scale, rounding, _ = _quantize(np.asarray(query, dtype=np.float64).reshape(1, -1), QUERY_LEVELS)
    return (d.astype(np.int16) + QUERY_OFFSET).astype(np.uint8), float(scale[0]), float(rounding[0])


class VectorSketch:
    """Int8 codes of one scope's rows for one model, by document (see the module docstring).
    Read and changed under the search index's lock, like the rows it sketches."""

    def __init__(self, dims: int) -> None:
        self.dims = dims
        self.n = 0  # rows [0, n) are sketched (a row never put has zero codes)
        self._blocks: list[np.ndarray] = []  # dims × rows, int8; all but the last hold BLOCK rows
        self._scale = np.zeros(0)
        self._sums = np.zeros(0, dtype=np.int64)  # each row's codes summed: ``d`` is offset by 64
        self.max_error = 0.0  # largest ‖e‖ of any row
        self.max_norm = 0.0  # largest ‖s·c‖ of any row

    @classmethod
    def of(cls, matrix: np.ndarray, n: int) -> VectorSketch:
        sketch = cls(matrix.shape[1])
        step = math.gcd(BLOCK, 4096)  # rows quantized at a time: float64 copies of 12 MB, in one block
        for lo in range(0, n, step):
            sketch._put_rows(lo, matrix[lo:min(n, lo + step)])
        return sketch

    def put(self, doc: int, row: np.ndarray) -> None:
        self._put_rows(doc, np.asarray(row).reshape(1, -1))

    def _put_rows(self, lo: int, rows: np.ndarray) -> None:
        """Rows ``lo .. lo+len(rows)``, all inside one block."""
        hi = lo + len(rows)
        self._room(hi)
        codes, scale, err, norm = _quantize(rows)
        block, at = divmod(lo, BLOCK)
        self._blocks[block][:, at:at + len(rows)] = codes.T
        self._scale[lo:hi] = scale
        self._sums[lo:hi] = codes.sum(axis=1, dtype=np.int64)
        # A hair above what float64 computed: the norms themselves are rounded.
        if len(rows):
            self.max_error = max(self.max_error, float(err.max()) * (1 + 1e-9))
            self.max_norm = max(self.max_norm, float(norm.max()) * (1 + 1e-9))
        self.n = max(self.n, hi)

    def _room(self, rows: int) -> None:
        """Room for rows [0, rows): the last block grows by a quarter up to ``BLOCK`` (every
        search reads all of it), then a new one starts."""
        if rows > len(self._scale):
            cap = max(rows, 2 * len(self._scale), 1024)
            scale, sums = np.zeros(cap), np.zeros(cap, dtype=np.int64)
            scale[: len(self._scale)], sums[: len(self._sums)] = self._scale, self._sums
            self._scale, self._sums = scale, sums
        while True:
            before = (len(self._blocks) - 1) * BLOCK  # rows held by the full blocks
            if self._blocks and rows <= before + self._blocks[-1].shape[1]:
                return
            if self._blocks and self._blocks[-1].shape[1] < BLOCK:
                last = self._blocks[-1]
                grown = np.zeros((self.dims, min(BLOCK, max(last.shape[1] * 5 // 4, last.shape[1] + 1024,
                                                             rows - before))), dtype=np.int8)
                grown[:, : last.shape[1]] = last
                self._blocks[-1] = grown
            else:
                start = len(self._blocks) * BLOCK
                self._blocks.append(np.zeros((self.dims, min(BLOCK, max(1024, rows - start))), dtype=np.int8))

    def similarities(self, query: np.ndarray, n: int) -> tuple[np.ndarray, float]:
        """(approximate similarities of rows [0, n), a bound on each one's distance from the
        float64 similarity ``_similarities`` computes). Rows never put are zero."""
        session = _product_session()
        q = np.asarray(query, dtype=np.float64)
        codes, t, f = query_codes(q)
        out = np.zeros(n)
        for block, lo in enumerate(range(0, min(n, self.n), BLOCK)):
            hi = min(n, self.n, lo + BLOCK)
            product = session.run(None, {"d": codes, "codes": self._blocks[block]})[0][0, : hi - lo]
            np.multiply(product - QUERY_OFFSET * self._sums[lo:hi], self._scale[lo:hi], out=out[lo:hi])
        out *= t
        q_norm = float(np.linalg.norm(q))
        # The sketch's error; the float64 reference's own (γ_dims in float64, on ‖x‖‖q‖ ≤
        # (‖s·c‖ + ‖e‖)‖q‖); the rounding of s·t·(c·d) in float64 (two products).
        row_norm = self.max_norm + self.max_error
        bound = (self.max_error * q_norm + self.max_norm * f
                 + (self.dims * _U64 / (1 - self.dims * _U64) + 3 * _U64) * row_norm * q_norm)
        return out, bound * (1 + 1e-6) + 1e-12
