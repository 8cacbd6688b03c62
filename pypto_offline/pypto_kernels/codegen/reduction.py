"""Lowerings of the ops that reduce along rows: Reduce*, GlobalAveragePool and GlobalMaxPool,
Softmax and LogSoftmax, Layer-, Instance- and GroupNormalization. Each runs over the columns of
the region's rows (``fusion/rows.py``), the reduced axis whole in a tile."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import onnx

from pypto_offline.fusion.classify import HALF_DTYPES
from pypto_offline.fusion.records import RegionOp
from pypto_offline.fusion.rows import COLUMN, FULL, ROW, RowLayout
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.codegen.writer import Writer, let, pypto_dtype
from pypto_offline.registry.attributes import register_table
from pypto_offline.registry.ops import definition


def _square(x: str) -> str:
    return f"pypto.mul({x}, {x})"


def _absolute(x: str) -> str:
    return f"pypto.abs({x})"


def _mean(total: str, count: int) -> str:
    """There is no ``pypto.mean``: the sum times 1/N (docs/pypto-ops.md, "Reductions")."""
    return f"pypto.mul({total}, {float_literal(1 / count)})"


def _root(total: str, count: int) -> str:
    return f"pypto.sqrt({total})"


@dataclass(frozen=True)
class Reduction:
    """How a row reduction is written: ``after(call(each(x)), row length)``."""
    call: str                                    # PyPTO's reduction along a row: sum, amax, amin
    each: Callable[[str], str] | None = None     # what each element becomes first (its square)
    after: Callable[[str, int], str] | None = None  # what the row's result becomes (a mean)


# Every op reducing the columns of a region's rows to one per row: its Reduction
REDUCTIONS: Mapping[str, Reduction] = register_table("row_reduction", {
    "ReduceSum": Reduction("sum"), "ReduceMean": Reduction("sum", after=_mean),
    "ReduceMax": Reduction("amax"), "ReduceMin": Reduction("amin"),
    "ReduceSumSquare": Reduction("sum", each=_square),
    "ReduceL2": Reduction("sum", each=_square, after=_root),
    "ReduceL1": Reduction("sum", each=_absolute),
    "GlobalAveragePool": Reduction("sum", after=_mean), "GlobalMaxPool": Reduction("amax"),
})


def _row_input(w: Writer, tensor: str, dtype: int) -> str:
    """A row region's tensor as its [R, C] / [R, 1] / [1, C] variable, cast to ``dtype``."""
    value = w.value(tensor, w.rows.shape(tensor))
    if dtype == w.dtype(tensor):
        return value
    w.tile(w.rows.shape(tensor), dtype)
    name = w.fresh()
    w.emit(f"{name} = pypto.cast({value}, {pypto_dtype(dtype)})")
    return name


def _compute_dtype(w: Writer, op: RegionOp, stash: bool) -> int:
    """fp32 for a half-precision normalisation that asks for it (LayerNormalization's
    stash_type 1): fp16 LayerNorm accumulated in fp32 is 4x closer to the reference
    (docs/pypto-ops.md, "Reductions")."""
    dtype = w.dtype(op.inputs[0])
    half = dtype in HALF_DTYPES
    return onnx.TensorProto.FLOAT if half and stash else dtype


def _row_result(w: Writer, op: RegionOp, value: str, dtype: int) -> None:
    out = op.outputs[0]
    if dtype != w.dtype(out):
        w.tile(w.rows.shape(out), w.dtype(out))
        value = f"pypto.cast({value}, {pypto_dtype(w.dtype(out))})"
    w.assign(out, value, w.rows.shape(out))


def _reduce(w: Writer, op: RegionOp) -> None:
    """Over the columns of the rows (``fusion/rows.py``): the reduced axis is whole in a tile."""
    dtype = w.dtype(op.inputs[0])
    x = _row_input(w, op.inputs[0], dtype)
    w.tile((w.rows.rows, w.rows.columns), dtype)
    reduction = REDUCTIONS[op.op_type]
    if reduction.each:  # named: a square reads its operand twice
        x = let(w, reduction.each(x))
    value = f"pypto.{reduction.call}({x}, -1, True)"
    if reduction.after:
        value = reduction.after(value, w.rows.columns)
    _row_result(w, op, value, dtype)


# A Softmax's result from the row less its maximum, its exponentials and their sum
SOFTMAX_RESULTS: Mapping[str, Callable[[str, str, str], str]] = register_table("softmax_result", {
    "Softmax": lambda shifted, exp, total: f"pypto.div({exp}, {total})",
    "LogSoftmax": lambda shifted, exp, total: f"pypto.sub({shifted}, pypto.log({total}))",
})


def _softmax(w: Writer, op: RegionOp) -> None:
    """amax, sub, exp, sum, div: 4.6 us on [1,8,64,128] fp32, ahead of ``pypto.softmax``, which
    casts to fp32 inside (docs/pypto-ops.md, "Reductions")."""
    dtype = w.dtype(op.inputs[0])
    x = _row_input(w, op.inputs[0], dtype)
    w.tile((w.rows.rows, w.rows.columns), dtype)
    shifted = let(w, f"pypto.sub({x}, pypto.amax({x}, -1, True))")
    exp = let(w, f"pypto.exp({shifted})")
    total = let(w, f"pypto.sum({exp}, -1, True)")
    _row_result(w, op, SOFTMAX_RESULTS[op.op_type](shifted, exp, total), dtype)


def _layer_normalization(w: Writer, op: RegionOp) -> None:
    """(x - mean) * rsqrt(var + eps) * scale + bias, the variance as the mean square of the
    centred rows (5.25 us on 512x128 fp32 against 30.1 us for its 9 ONNX ops as kernels). An
    instance's or a group's rows are the same, with a scale and bias per row
    (``fusion/rows.py``)."""
    dtype = _compute_dtype(w, op, op.params["stash_type"] == 1)
    x, scale = (_row_input(w, name, dtype) for name in op.inputs[:2])
    w.tile((w.rows.rows, w.rows.columns), dtype)
    inverse = float_literal(1 / w.rows.columns)
    centred = let(w, f"pypto.sub({x}, pypto.mul(pypto.sum({x}, -1, True), {inverse}))")
    variance = let(w, f"pypto.mul(pypto.sum(pypto.mul({centred}, {centred}), -1, True), "
                      f"{inverse})")
    scaled = let(w, f"pypto.mul(pypto.mul({centred}, pypto.rsqrt(pypto.add({variance}, "
                    f"{float_literal(op.params['epsilon'])}))), {scale})")
    if len(op.inputs) > 2 and op.inputs[2]:
        scaled = f"pypto.add({scaled}, {_row_input(w, op.inputs[2], dtype)})"
    _row_result(w, op, scaled, dtype)


def lower_as_rows(w: Writer, op: RegionOp, rows: int, columns: int) -> None:
    """A Softmax, a LayerNormalization or a reduction over the last axis in a region not laid
    out as rows (an attention's head, ``codegen.matmul``; a LayerNorm prologue of a
    projection, or an RMSNorm's mean: ``fusion.normalising.normalising_prologue``): lowered as a
    row region's, on its ``[rows, columns]``, its parameters per column."""
    reduced = definition(op.op_type).row_result  # an RMSNorm's mean: one value per row
    kinds = {op.inputs[0]: FULL, op.outputs[0]: ROW if reduced else FULL,
             **{name: COLUMN for name in op.inputs[1:] if name and not reduced}}
    w.rows = RowLayout(rows, columns, MappingProxyType(kinds))
    try:
        LOWERINGS[op.op_type](w, op)
    finally:
        w.rows = None


LOWERINGS: dict[str, Callable[[Writer, RegionOp], None]] = {
    **{op: _reduce for op in REDUCTIONS}, **{op: _softmax for op in SOFTMAX_RESULTS},
    "LayerNormalization": _layer_normalization, "InstanceNormalization": _layer_normalization,
    "GroupNormalization": _layer_normalization,
}
