"""Canonical forms of the contractions: MatMul, Gemm and Conv (depthwise as its taps, any other
as the cube's matmul). Registered with ``node_context.normaliser`` as the other ops' forms are;
``canonical`` imports this module so that every normaliser is known wherever it is imported."""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from pypto_offline.importer.node_context import (NodeContext, NotCanonical, as_ints,
                                                 normaliser, window_extents, window_pads)
from pypto_offline.registry.ops import INTEGER_CONTRACTIONS, definition, is_op

MATMUL_FORM = "the kernel generator takes a MatMul of matrices with equal batch axes"


# PyPTO 0.2.0's cube takes an ND operand whose inner (last) axis is below 65535 ("inner axis must
# be less than 65535", CheckOperandShapeBound; docs/pypto-ops.md, "MatMul"). Past it, a 1x1
# Conv on a 320x320 image (x[16, 102400], ppocrv4_det) recorded and then failed PyPTO's parser
# (F21004, FFFFFF): such a contraction stays a boundary, with this reason.
CUBE_INNER_AXIS_LIMIT = 65535


def _within_cube_bound(form: str, inner_axes: dict[str, int]) -> None:
    for operand, extent in inner_axes.items():
        if extent >= CUBE_INNER_AXIS_LIMIT:
            raise NotCanonical(f"{form} ({operand}'s inner axis of {extent} is not below "
                               f"PyPTO's cube limit of {CUBE_INNER_AXIS_LIMIT})")


INTEGER_FORM = ("the kernel generator takes an integer contraction of int8 operands without "
                "zero points, one group and a depth that is a multiple of 32")
# PyPTO 0.2.0's int8 fractal is 16 x 32: an int8 matmul whose depth (K) is not a multiple of 32
# failed to parse (F21004, a 1x1 Conv of 16 channels; 32 and 128 compiled, exact). quantised.py
# leaves such a contraction float; pypto_kernels/tiling.py aligns int8 K tiles to it
# (docs/int8.md, "Regions").
INT8_CUBE_DEPTH = 32


def _int8_without_offsets(ctx: NodeContext) -> None:
    """MatMulInteger/ConvInteger: PyPTO 0.2.0's cube multiplies int8 by int8 into int32 and
    takes no offset (docs/int8.md, "What PyPTO 0.2.0 does"). A uint8 operand, a zero point
    that is not a constant 0 (QOperator models, onnxruntime's dynamic quantisation), a grouped
    convolution or a depth the int8 fractal does not divide stays a boundary that onnxruntime
    computes."""
    if not is_op(ctx.node, INTEGER_CONTRACTIONS):
        return
    for index in (0, 1):
        if ctx.dtypes.get(ctx.node.input[index]) != onnx.TensorProto.INT8:
            dtype = onnx.TensorProto.DataType.Name(ctx.dtypes.get(ctx.node.input[index]) or 0)
            raise NotCanonical(f"{INTEGER_FORM} (operand {index} is {dtype})")
    for name in ctx.node.input[2:4]:
        if name and (name not in ctx.constants or ctx.constants[name].any()):
            raise NotCanonical(f"{INTEGER_FORM} (zero point {name!r} is not a constant 0)")
    weights = ctx.in_shape(1)
    convolution = definition(ctx.node.op_type).convolution
    if convolution and int(ctx.attr("group", 1)) != 1:
        raise NotCanonical(f"{INTEGER_FORM} ({ctx.attr('group', 1)} groups)")
    depth = int(np.prod(weights[1:])) if convolution else ctx.in_shape(0)[-1]
    if too_shallow_for_int8(depth):
        raise NotCanonical(f"{INTEGER_FORM} ({too_shallow_for_int8(depth)})")


def too_shallow_for_int8(depth: int) -> str | None:
    """Why an int8 contraction of this depth cannot go on the cube, or None when it can."""
    if depth % INT8_CUBE_DEPTH == 0:
        return None
    return (f"a depth of {depth}, not a multiple of {INT8_CUBE_DEPTH}: PyPTO 0.2.0's int8 "
            "fractal is 32 deep")


@normaliser("MatMul", "MatMulInteger")
def _matmul(ctx: NodeContext) -> dict[str, Any]:
    """Canonical: both operands of rank 2 or more, and the right one 2-D (a weight) or with the
    left one's batch axes. A 1-D operand or batch axes that broadcast stay a boundary."""
    _int8_without_offsets(ctx)
    left, right = ctx.in_shape(0), ctx.in_shape(1)
    if len(left) < 2 or len(right) < 2:
        raise NotCanonical(f"{MATMUL_FORM} (a 1-D operand)")
    if len(right) > 2 and tuple(left[:-2]) != tuple(right[:-2]):
        raise NotCanonical(f"{MATMUL_FORM} (batch axes {list(left[:-2])} and "
                           f"{list(right[:-2])} broadcast)")
    _within_cube_bound(MATMUL_FORM, {"the left operand": left[-1], "the right operand": right[-1]})
    return {}


GEMM_FORM = "the kernel generator takes a Gemm A @ B(^T) + C with a per-column C"


@normaliser("Gemm")
def _gemm(ctx: NodeContext) -> dict[str, Any]:
    """Canonical: ``A @ B + C`` or ``A @ B^T + C`` (PyPTO's ``b_trans``), alpha and beta 1, C
    absent or one value per column (the cube adds it, docs/pypto-ops.md "MatMul"). Parameter:
    ``transB``, ONNX's own name, so the compiled graph writes the Gemm back as it is."""
    n = ctx.in_shape(1)[0 if ctx.attr("transB", 0) else 1]
    bias = ctx.in_shape(2) if len(ctx.node.input) > 2 and ctx.node.input[2] else None
    if ctx.attr("transA", 0) or ctx.attr("alpha", 1.0) != 1.0 or ctx.attr("beta", 1.0) != 1.0:
        raise NotCanonical(f"{GEMM_FORM} (transA, alpha or beta)")
    if bias is not None and (len(bias) not in (1, 2) or bias[-1] != n
                             or any(d != 1 for d in bias[:-1])):
        raise NotCanonical(f"{GEMM_FORM} (C of shape {list(bias)})")
    _within_cube_bound(GEMM_FORM, {"A": ctx.in_shape(0)[-1], "B": ctx.in_shape(1)[-1]})
    return {"transB": int(ctx.attr("transB", 0))}


CONV_FORM = ("the kernel generator takes a convolution of one image: a depthwise one (a group "
             "per channel) as its taps, any other as a matmul of its weights and its taps' "
             "columns")
# The window the kernel writes as its taps (codegen/convolution.py): MobileNet's and PP-LCNet's
# 3x3 and 5x5, strided and dilated by 2 at most
WINDOW_LIMITS = {"kernel_shape": 5, "strides": 2, "dilations": 2}
# A grouped convolution that is not depthwise is one matmul of block-diagonal weights (zeros
# beside each group's block, codegen/convolution.py): the cube does ``groups`` times the work
MAX_GROUPS = 8


@normaliser("Conv", "ConvInteger")
def _conv(ctx: NodeContext) -> dict[str, Any]:
    """Canonical: a convolution of one 2-D image, of one group or depthwise (a group per input
    channel, one filter each), with a small window. A 1x1 one of one group with unit strides
    and dilations and no padding has no parameters (``W[Cout, Cin] @ x[Cin, H*W]``); any other
    has its window, strides, dilations, group and explicit pads (``auto_pad`` resolved).
    PyPTO 0.2.0's own conv is not usable (docs/pypto-ops.md, "Depthwise convolution"): a larger
    window, stride or dilation, or more than ``MAX_GROUPS`` groups, stays a boundary."""
    _int8_without_offsets(ctx)
    image, weights = ctx.in_shape(0), ctx.in_shape(1)
    for name in ctx.node.input[2:]:
        if name:
            ctx.shape(name)
    if len(image) != 4 or image[0] != 1:
        raise NotCanonical(f"{CONV_FORM} (input {list(image)})")
    window = {"kernel_shape": tuple(as_ints(ctx.attr("kernel_shape", weights[2:]))),
              "strides": tuple(as_ints(ctx.attr("strides", [1, 1]))),
              "dilations": tuple(as_ints(ctx.attr("dilations", [1, 1])))}
    group = int(ctx.attr("group", 1))
    reach = tuple((k - 1) * d + 1 for k, d in zip(window["kernel_shape"], window["dilations"]))
    pads = window_pads(ctx, image[2:], reach, window["strides"])
    if group == 1 and not any(pads) and all(d == 1 for v in window.values() for d in v):
        _within_cube_bound(CONV_FORM, {"the weight": weights[1], "the image": image[2] * image[3]})
        return {}
    depthwise = group == image[1] == weights[0] and weights[1] == 1
    if not depthwise and group > MAX_GROUPS:
        raise NotCanonical(f"{CONV_FORM} ({group} groups of {image[1]} channels, not "
                           f"depthwise: at most {MAX_GROUPS})")
    for name, limit in WINDOW_LIMITS.items():
        if max(window[name]) > limit:
            raise NotCanonical(f"{CONV_FORM} ({name} {list(window[name])}: at most {limit})")
    out = ctx.shape(ctx.node.output[0])[2:]
    if tuple(out) != window_extents(image[2:], pads, reach, window["strides"]):
        raise NotCanonical(f"{CONV_FORM} (output {list(out)} does not follow its window)")
    if not depthwise:
        _within_cube_bound(CONV_FORM, {"the weight": image[1] * weights[2] * weights[3],
                                       "the columns": out[0] * out[1]})
    # not an ONNX attribute: which lowering takes it (ops.is_depthwise_conv; encoding drops it)
    return {**window, "pads": pads, "group": group, "depthwise": int(depthwise)}
