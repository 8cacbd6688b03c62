"""Lowerings of an activation's quantisation (docs/int8.md): ``DequantizeLinear`` reads the
int8 tensor and computes in fp32, ``QuantizeLinear`` writes int8. Both per tensor
(``importer/quantised.py``). Measured exact against numpy in PyPTO 0.2.0's interpreter: int8 ->
fp32 casts; fp32 -> int32 rounds half to even by default (ONNX's rounding); int32 -> fp16 ->
int8 keeps an integer of [-128, 255] as it is."""
from __future__ import annotations

from typing import Callable

import onnx

from pypto_offline.fusion.records import RegionOp
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.codegen.layout import elementwise_shape
from pypto_offline.pypto_kernels.codegen.writer import Writer, full, let, pypto_dtype
from pypto_offline.pypto_kernels.tiling import BLOCK_BYTES

FLOAT = onnx.TensorProto.FLOAT
# The values each quantised type holds: a Q saturates to them
SATURATION = {onnx.TensorProto.INT8: (-128, 127), onnx.TensorProto.UINT8: (0, 255)}


def _in_fp32(w: Writer, op: RegionOp) -> tuple[str, list[int]]:
    """The op's input as fp32 (cast from any other type), and the shape it runs on; the tile
    is fp32's, what its temporaries are held in."""
    out = op.outputs[0]
    shape = elementwise_shape(w, out, op.inputs[0])
    value = w.value(op.inputs[0], shape)
    w.follow(shape, FLOAT, op.inputs)
    if w.dtype(op.inputs[0]) != FLOAT and op.inputs[0] not in w.in_fp32:
        value = let(w, f"pypto.cast({value}, pypto.DT_FP32)")
    return value, shape


def _dequantize(w: Writer, op: RegionOp) -> None:
    """``(x - zero_point) * scale`` in fp32; cast to the output's type if it is another."""
    value, shape = _in_fp32(w, op)
    zero, scale = op.params["zero_point"], op.params["scale"]
    if zero:
        value = f"({value} - {float_literal(float(zero))})"
    value = f"{value} * {float_literal(scale)}"
    out_dtype = w.dtype(op.outputs[0])
    if out_dtype != FLOAT:
        value = f"pypto.cast({value}, {pypto_dtype(out_dtype)})"
    w.assign(op.outputs[0], value, shape)


def _quantize(w: Writer, op: RegionOp) -> None:
    """``saturate(round_half_even(x / scale) + zero_point)``: the division as ONNX writes it
    (a product by 1/scale rounds differently), the bounds in fp32, the rounding by the cast to
    int32, the zero point added to the rounded integer, then through fp16 to the 8-bit type
    (PyPTO 0.2.0 casts int32 to no 8-bit type).

    A quantised tensor only dequantised inside the kernel stays the fp32 integer it is (its
    ``DequantizeLinear`` reads it as it is: exact, integers of fewer than 24 bits): no 8-bit
    tile in the kernel's middle, and two casts fewer than holding it as int32."""
    value, shape = _in_fp32(w, op)
    low, high = SATURATION[op.params["to"]]
    zero = float(op.params["zero_point"])
    value = let(w, f"pypto.div({value}, {full(w, shape, op.params['scale'], FLOAT)})")
    # rounded before the zero point is added, as ONNX writes it: x / scale + zero_point in fp32
    # rounds (0.5000001 - 128 is -127.5), and the cast then rounded to the even neighbour, one
    # step off onnxruntime (nudenet's input quantisation). The bounds are taken first, less the
    # zero point: integers, so clamping before rounding is clamping after it.
    value = (f"pypto.minimum(pypto.maximum({value}, {float_literal(low - zero)}), "
             f"{float_literal(high - zero)})")
    value = f"pypto.cast({value}, pypto.DT_INT32)"
    out = op.outputs[0]
    eight_bits = w.holds_8_bits(out)
    if zero or not eight_bits:  # integers of fewer than 24 bits: exact in fp32
        value = f"pypto.cast({value}, pypto.DT_FP32)"
    if zero:
        value = f"{value} + {float_literal(zero)}"
    if not eight_bits:
        w.in_fp32.add(out)
        w.assign(out, value, shape)
        return
    rounded = let(w, value)
    if len(shape) == 2 and shape[-1] == 1 < shape[0]:
        # a column (a pooled channel per row) made a row of the same elements: an 8-bit row
        # of one byte is not a whole block (``matmul._one_pixel_of_bytes``)
        shape = [1, shape[0]]
        w.tile(shape, FLOAT)
        rounded = let(w, f"pypto.reshape({rounded}, {shape})")
    # a tile row of an 8-bit type must be whole 32-byte blocks ("lastDimBytes % BLOCK_SIZE ==
    # 0": a 24-wide fp32 tile cast to int8 failed); only then each cast under its own type's
    # tile: a tile changed in a kernel's middle made PyPTO stage the tensors through GM (a
    # Q/DQ chain of ppocr_cls_v2: 2.69 MB moved under changed tiles, 308 KB, its lower bound,
    # under one; docs/int8.md, "Kernels")
    narrow = w.current_tile[-1] % BLOCK_BYTES != 0
    if narrow:
        w.tile(shape, onnx.TensorProto.FLOAT16)
    half = let(w, f"pypto.cast({rounded}, pypto.DT_FP16)")
    if narrow:
        w.tile(shape, op.params["to"])
    w.assign(out, f"pypto.cast({half}, {pypto_dtype(op.params['to'])})", shape)


LOWERINGS: dict[str, Callable[[Writer, RegionOp], None]] = {
    "DequantizeLinear": _dequantize, "QuantizeLinear": _quantize,
}
