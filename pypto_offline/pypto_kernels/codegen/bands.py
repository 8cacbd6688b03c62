"""A band constant written from bounds (``importer/bands.py``): the kernel compares the column
index with the row's bounds, two index ranges broadcast over the ``[R, C]`` matrix, and takes
no argument for the constant. A causal band of GPT-2's 4 new tokens over 16 keys and the
scores' Add: 0.98 us in PyPTO's cost model, equal to numpy's, every pass verified (probe of
2026-12-07, docs/pypto-ops.md "Masks made from bounds")."""
from __future__ import annotations

import onnx

from pypto_offline.importer.bands import Band
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.codegen.writer import Writer, pypto_dtype

FLOAT = onnx.TensorProto.FLOAT
ROWS, COLUMNS = 0, 1  # the axes of a band's [rows, columns] matrix


def hold_band(w: Writer, tensor: str, band: Band) -> None:
    """``tensor`` held as its ``[rows, columns]`` matrix, made in the kernel."""
    rows, columns = band.rows, band.columns
    w.tile((rows, columns), FLOAT)
    column = _index_range(w, 0, COLUMNS, (rows, columns))
    tests = []
    if band.high is not None:  # beyond the upper diagonal: column > row + high
        tests.append(f"pypto.logical_not(pypto.gt({column}, "
                     f"{_index_range(w, band.high, ROWS, (rows, columns))}))")
    if band.low is not None:  # below the lower one: column < row + low
        tests.append(f"pypto.logical_not(pypto.lt({column}, "
                     f"{_index_range(w, band.low, ROWS, (rows, columns))}))")
    inside = tests[0] if len(tests) == 1 else f"pypto.logical_and({tests[0]}, {tests[1]})"
    if isinstance(band.inside, bool):
        value = inside if band.inside else f"pypto.logical_not({inside})"
    else:
        value = f"pypto.where({inside}, {float_literal(band.inside)}, " \
                f"{float_literal(band.outside)})"
        if w.dtype(tensor) != FLOAT:
            value = f"pypto.cast({value}, {pypto_dtype(w.dtype(tensor))})"
    name = w.fresh()
    w.emit(f"{name} = {value}")
    w.hold(tensor, name, (rows, columns))


def _index_range(w: Writer, start: int, axis: int, matrix: tuple[int, int]) -> str:
    """``start, start + 1, ...`` (fp32) along ``axis`` of the ``matrix`` (``ROWS``, ``COLUMNS``),
    the same along the other: a running sum of ones, not ``pypto.arange``, whose values PyPTO
    0.2.0's pass-verify loses after its InferParamIndex pass (the kernel computed the mask, its
    check failed: docs/pypto-ops.md, "Masks made from bounds")."""
    name = w.fresh()
    shape = [extent if index == axis else 1 for index, extent in enumerate(matrix)]
    w.emit(f"{name} = pypto.expand_clone(pypto.add(pypto.cumsum(pypto.full({shape}, 1.0, "
           f"pypto.DT_FP32), {axis}), {float(start - 1)!r}), {list(matrix)})")
    return name
