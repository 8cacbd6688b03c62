"""Lowerings of the elementwise ops: PyPTO's unary and binary calls, comparisons, Where, Clip,
Cast, Pow, Reciprocal, Or, Mean, PRelu, IsNaN and IsInf, and the activations PyPTO has no single
call for (composed by ``activations.py``). Casts to integers use ``CAST_TRUNC`` (ONNX rounds
toward zero); PyPTO takes a scalar operand only on the right."""
from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np
import onnx

from pypto_offline.fusion.classify import FLOAT_DTYPES, HALF_DTYPES
from pypto_offline.fusion.records import RegionOp
from pypto_offline.registry.attributes import register_table
from pypto_offline.registry.ops import definition
from pypto_offline.pypto_kernels import activations
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.codegen.layout import (broadcast_to, compute_shape,
                                                        elementwise_shape)
from pypto_offline.pypto_kernels.codegen.writer import (CannotExpress, Writer, full,
                                                        is_scalar_constant, let, pypto_dtype)

# The PyPTO function an op is, registered with the op: a one-input call, or a binary one.
# Xor of bools is their inequality; PyPTO's bitwise ops do not compile (docs/pypto-ops.md)
PYPTO_CALL = "pypto_call"
UNARY = register_table(PYPTO_CALL, {
    "Relu": "relu", "Sigmoid": "sigmoid", "Exp": "exp", "Neg": "neg", "Abs": "abs",
    "Sqrt": "sqrt", "Log": "log", "Not": "logical_not"})
BINARY = register_table(PYPTO_CALL, {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "maximum", "Min": "minimum",
    "Sum": "add", "And": "logical_and", "Xor": "ne"})
# The largest finite value of each float type: IsInf's bound
FINITE_MAX = {onnx.TensorProto.FLOAT: 3.4028234663852886e38, onnx.TensorProto.FLOAT16: 65504.0,
              onnx.TensorProto.BFLOAT16: 3.3895313892515355e38}
# A comparison as (PyPTO compare, negated?) and the op that reads its operands swapped; PyPTO has
# eq, lt and gt, and logical_not (each checked in fp32 and int32, docs/pypto-ops.md).
COMPARISONS = register_table("comparison", {
    "Equal": ("eq", False, "Equal"), "Less": ("lt", False, "Greater"),
    "Greater": ("gt", False, "Less"), "LessOrEqual": ("gt", True, "GreaterOrEqual"),
    "GreaterOrEqual": ("lt", True, "LessOrEqual")})
FLT_MAX = 3.4028234663852886e38


def _per_element(w: Writer, op: RegionOp, expression: Callable[[str, list[int]], str]) -> None:
    """A one-input elementwise op: computed on a folded shape when above PyPTO's rank."""
    out = op.outputs[0]
    shape = elementwise_shape(w, out, op.inputs[0])
    value = w.value(op.inputs[0], shape)
    w.follow(shape, w.dtype(out), op.inputs)
    w.assign(out, expression(value, shape), shape)


def _unary(w: Writer, op: RegionOp) -> None:
    _per_element(w, op, lambda value, _: f"pypto.{UNARY[op.op_type]}({value})")


def _reciprocal(w: Writer, op: RegionOp) -> None:
    dtype = w.dtype(op.outputs[0])
    _per_element(w, op, lambda value, shape: f"pypto.div({full(w, shape, 1.0, dtype)}, {value})")


def _in_fp32(w: Writer, value: str, dtype: int) -> str:
    """``value`` cast to fp32 when it is half precision: a polynomial in fp16 loses digits."""
    if dtype not in HALF_DTYPES:
        return value
    return let(w, f"pypto.cast({value}, pypto.DT_FP32)")


def _back_from_fp32(value: str, dtype: int) -> str:
    if dtype not in HALF_DTYPES:
        return value
    return f"pypto.cast({value}, {pypto_dtype(dtype)})"


def _activation(w: Writer, op: RegionOp) -> None:
    """An elementwise op PyPTO has no single call for, composed by its builder
    (``activations.py``), in fp32 where the builder asks for it."""
    dtype = w.dtype(op.outputs[0])
    build = activations.BUILDERS[op.op_type]
    compute = onnx.TensorProto.FLOAT if definition(op.op_type).fp32_for_half else dtype

    out = op.outputs[0]
    shape = elementwise_shape(w, out, op.inputs[0])
    x = w.value(op.inputs[0], shape)
    w.follow(shape, compute, op.inputs)  # its temporaries are of the computing precision
    math = activations.Math(let=partial(let, w), params=op.params,
                            full=lambda value: full(w, shape, value, compute))
    value = build(math, _in_fp32(w, x, dtype) if compute != dtype else x)
    w.assign(out, _back_from_fp32(value, dtype) if compute != dtype else value, shape)


def _clip(w: Writer, op: RegionOp) -> None:
    if w.dtype(op.inputs[0]) not in FLOAT_DTYPES:
        _integer_clip(w, op)
        return
    # a bound within the type's finite range (a missing one is its largest value): fp32's
    # largest is no fp16 (PyPTO's mins refused it, MINSOpError: asr_frontend_kaldi's Clip
    # converted, docs/precision.md); no value of the type lies beyond it anyway
    largest = FINITE_MAX[w.dtype(op.inputs[0])]
    low = -largest if op.params["min"] is None else max(float(op.params["min"]), -largest)
    high = largest if op.params["max"] is None else min(float(op.params["max"]), largest)
    _per_element(w, op, lambda value, _: f"pypto.clip({value}, {float_literal(low)}, "
                                         f"{float_literal(high)})")


def _integer_clip(w: Writer, op: RegionOp) -> None:
    """min(max(x, low), high) with full tiles of the bounds: PyPTO's clip takes no integer
    tensor (FC0001) and compares integers with integer tiles only (``_compare``)."""
    low, high = op.params["min"], op.params["max"]
    if low is None and high is None:
        w.alias(op.outputs[0], op.inputs[0])
        return
    dtype = w.dtype(op.outputs[0])

    def expression(value: str, shape) -> str:
        if low is not None:
            value = f"pypto.maximum({value}, {full(w, shape, low, dtype)})"
        if high is not None:
            value = f"pypto.minimum({value}, {full(w, shape, high, dtype)})"
        return value
    _per_element(w, op, expression)


def _cast(w: Writer, op: RegionOp) -> None:
    out = op.outputs[0]
    to = pypto_dtype(w.dtype(out))
    mode = ", pypto.CastMode.CAST_TRUNC" if np.issubdtype(
        onnx.helper.tensor_dtype_to_np_dtype(w.dtype(out)), np.integer) else ""
    _per_element(w, op, lambda value, _: f"pypto.cast({value}, {to}{mode})")


def _binary(w: Writer, op: RegionOp, scalar_first: ScalarFirst | None = None) -> None:
    """A binary op of BINARY, variadic for some; PyPTO takes a scalar only on the right, so a
    scalar first swaps sides for a commutative op, else ``scalar_first`` rewrites it."""
    out = op.outputs[0]
    if len(op.inputs) == 1:  # a variadic Max, Min or Sum of one tensor: that tensor
        w.alias(out, op.inputs[0])
        return
    if all(is_scalar_constant(name, w.constants) for name in op.inputs):
        raise CannotExpress("an op on compile-time constants only")
    shape, owns = compute_shape(w, out, op.inputs)
    operands = _binary_operands(w, op, shape, owns)
    function = BINARY[op.op_type]
    if is_scalar_constant(op.inputs[0], w.constants):  # PyPTO takes scalars on the right
        if definition(op.op_type).commutative:
            operands.reverse()
        elif scalar_first is not None:
            operands, function = scalar_first(w, op, operands, shape)
        else:
            raise CannotExpress(f"{op.op_type} with a scalar on the left")
    expression = operands[0]
    for operand in operands[1:]:
        expression = f"pypto.{function}({expression}, {operand})"
    w.follow(shape, w.dtype(out), op.inputs)
    w.assign(out, expression, shape)


# How a binary op that does not commute takes a scalar first: its operands and PyPTO call
ScalarFirst = Callable[[Writer, RegionOp, "list[str]", "list[int]"], "tuple[list[str], str]"]


def _difference(w: Writer, op: RegionOp) -> None:
    """Sub; a scalar minus a tensor as the tensor negated plus the scalar."""
    _binary(w, op, lambda w, op, operands, shape: ([f"pypto.neg({operands[1]})", operands[0]],
                                                   "add"))


def _quotient(w: Writer, op: RegionOp) -> None:
    """Div; a scalar over a tensor (RMSNorm's 1 / sqrt(...)) with the scalar as a full tile."""
    def numerator_tile(w: Writer, op: RegionOp, operands: list[str], shape) -> tuple:
        numerator = np.asarray(w.constants[op.inputs[0]]).reshape(-1)[0]
        return [full(w, shape, numerator, w.dtype(op.outputs[0])), operands[1]], BINARY["Div"]
    _binary(w, op, numerator_tile)


def _binary_operands(w: Writer, op: RegionOp, shape, owns) -> list[str]:
    """The operands broadcast to ``shape``. In a row region PyPTO broadcasts a [R, 1] or [1, C]
    right operand in place (docs/pypto-ops.md, "Reductions"); a smaller left operand of a
    commutative op swaps sides, any other is expanded."""
    names, shape = list(op.inputs), list(shape)
    if w.rows is None:
        return [broadcast_to(w, name, shape, own) for name, own in zip(names, owns)]
    if len(names) == 2 and owns[0] != shape and owns[1] == shape \
            and definition(op.op_type).commutative and not is_scalar_constant(names[0], w.constants):
        names, owns = names[::-1], owns[::-1]
    operands = [broadcast_to(w, names[0], shape, owns[0])]
    for name, own in zip(names[1:], owns[1:]):
        one_axis = sum(have != want for have, want in zip(own, shape)) <= 1
        operands.append(w.value(name, own) if one_axis else broadcast_to(w, name, shape, own))
    return operands


def _combined(w: Writer, op: RegionOp, combine: Callable[[list[str]], str]) -> None:
    """An n-ary op of its operands broadcast to its shape, as ``combine`` writes it; a scalar
    constant only after a tensor (PyPTO takes scalars on the right)."""
    out = op.outputs[0]
    if is_scalar_constant(op.inputs[0], w.constants):
        raise CannotExpress(f"{op.op_type} with a scalar first")
    shape, owns = compute_shape(w, out, op.inputs)
    operands = _binary_operands(w, op, shape, owns)
    w.follow(shape, w.dtype(out), op.inputs)
    w.assign(out, combine(operands), shape)


def _logical_or(w: Writer, op: RegionOp) -> None:
    """not(and(not a, not b)): PyPTO's bitwise_or does not compile for bools."""
    def combine(operands: list[str]) -> str:
        both_false = " ".join(f"pypto.logical_and(pypto.logical_not({o})," for o in operands[:-1])
        return (f"pypto.logical_not({both_false} pypto.logical_not({operands[-1]})"
                f"{')' * (len(operands) - 1)})")
    _combined(w, op, combine)


def _mean(w: Writer, op: RegionOp) -> None:
    if len(op.inputs) == 1:  # of one tensor: that tensor
        w.alias(op.outputs[0], op.inputs[0])
        return

    def combine(operands: list[str]) -> str:
        total = operands[0]
        for operand in operands[1:]:
            total = f"pypto.add({total}, {operand})"
        return f"pypto.mul({total}, {float_literal(1 / len(operands))})"
    _combined(w, op, combine)


def _prelu(w: Writer, op: RegionOp) -> None:
    """x where x >= 0, slope * x elsewhere, the slope broadcast to x (PyPTO's prelu takes a
    1-D weight only and failed to compile with one: PRELUOpError)."""
    _combined(w, op, lambda operands: f"pypto.where(pypto.lt({operands[0]}, 0.0), pypto.mul("
                                      f"{operands[0]}, {operands[1]}), {operands[0]})")


def _where(w: Writer, op: RegionOp) -> None:
    out = op.outputs[0]
    shape, owns = compute_shape(w, out, op.inputs)
    args = [broadcast_to(w, name, shape, own) for name, own in zip(op.inputs, owns)]
    w.follow(shape, w.dtype(out), op.inputs)
    chosen = f"pypto.where({', '.join(args)})"
    if all(is_scalar_constant(name, w.constants) for name in op.inputs[1:]) and \
            w.dtype(out) != onnx.TensorProto.FLOAT:
        # of two Python floats PyPTO makes an fp32 tensor, which an fp16 op or output then
        # refuses (F21004: a converted BERT's attention mask, docs/precision.md)
        chosen = f"pypto.cast({chosen}, {pypto_dtype(w.dtype(out))})"
    w.assign(out, chosen, shape)


def _float_test(w: Writer, op: RegionOp, test: Callable[[str, str], str]) -> None:
    """A bool tensor of ``test(x, the largest finite value)``, tiled by its operand's dtype."""
    source, out = op.inputs[0], op.outputs[0]
    dtype = w.dtype(source)
    shape = elementwise_shape(w, out, source)
    x = w.value(source, shape)
    w.follow(shape, dtype, op.inputs)
    w.assign(out, test(x, float_literal(FINITE_MAX[dtype])), shape)


def _is_nan(w: Writer, op: RegionOp) -> None:
    """x != x."""
    _float_test(w, op, lambda x, bound: f"pypto.ne({x}, {x})")


def _is_inf(w: Writer, op: RegionOp) -> None:
    """|x| (or x, or -x, as the op detects either sign) beyond the largest finite value."""
    _float_test(w, op, lambda x, bound: _beyond(op, x, bound))


def _beyond(op: RegionOp, x: str, bound: str) -> str:
    positive, negative = op.params.get("detect_positive", 1), op.params.get("detect_negative", 1)
    if positive and negative:
        return f"pypto.gt(pypto.abs({x}), {bound})"
    if positive:
        return f"pypto.gt({x}, {bound})"
    if negative:
        return f"pypto.gt(pypto.neg({x}), {bound})"
    return f"pypto.lt(pypto.abs({x}), -1.0)"  # neither sign detected: false everywhere


def _compare(w: Writer, op: RegionOp) -> None:
    """A bool tensor, tiled by its operands' dtype. PyPTO takes a scalar only on the right and
    only a float one: an integer scalar is a full tile."""
    out, names = op.outputs[0], list(op.inputs)
    if all(is_scalar_constant(name, w.constants) for name in names):
        raise CannotExpress("an op on compile-time constants only")
    function, negated, mirrored = COMPARISONS[op.op_type]
    if is_scalar_constant(names[0], w.constants):
        names.reverse()
        function, negated, _ = COMPARISONS[mirrored]
    dtype = w.dtype(names[0])
    shape, owns = compute_shape(w, out, names)
    left, right = _binary_operands(w, RegionOp(op.op_type, tuple(names), op.outputs), shape,
                                   owns)
    if is_scalar_constant(names[1], w.constants) and dtype not in FLOAT_DTYPES:
        right = full(w, shape, np.asarray(w.constants[names[1]]).reshape(-1)[0], dtype)
    expression = f"pypto.{function}({left}, {right})"
    w.follow(shape, dtype, names)
    w.assign(out, f"pypto.logical_not({expression})" if negated else expression, shape)


def _pow(w: Writer, op: RegionOp) -> None:
    """The exponents exporters write (LayerNorm's square, GELU-tanh's cube, a square root) as
    the ops they stand for, any other constant or tensor exponent with ``pypto.pow`` (checked
    in fp32 and fp16, a negative base with an integral exponent included)."""
    base, exponent = op.inputs
    dtype = w.dtype(op.outputs[0])
    if not is_scalar_constant(exponent, w.constants):
        cast = w.dtype(exponent) != dtype  # an integer exponent, in the base's type
        _combined(w, op, lambda operands: f"pypto.pow({operands[0]}, " + (
            f"pypto.cast({operands[1]}, {pypto_dtype(dtype)}))" if cast else f"{operands[1]})"))
        return
    forms = {
        1.0: lambda x, _: x,
        2.0: lambda x, _: f"pypto.mul({x}, {x})",
        3.0: lambda x, _: f"pypto.mul(pypto.mul({x}, {x}), {x})",
        0.5: lambda x, _: f"pypto.sqrt({x})",
        -0.5: lambda x, _: f"pypto.rsqrt({x})",
        -1.0: lambda x, shape: f"pypto.div({full(w, shape, 1.0, dtype)}, {x})",
    }
    value = float(np.asarray(w.constants[exponent]).reshape(-1)[0])
    _per_element(w, op, forms.get(value, lambda x, _: f"pypto.pow({x}, {float_literal(value)})"))


LOWERINGS: dict[str, Callable[[Writer, RegionOp], None]] = {
    **{op: _unary for op in UNARY},
    # Sub and Div take a scalar first their own way
    **{op: _binary for op in BINARY.keys() - {"Sub", "Div"}}, "Sub": _difference, "Div": _quotient,
    **{op: _compare for op in COMPARISONS}, **{op: _activation for op in activations.BUILDERS},
    "Cast": _cast, "Where": _where, "Reciprocal": _reciprocal, "Clip": _clip, "Pow": _pow,
    "Or": _logical_or, "Mean": _mean, "PRelu": _prelu, "IsNaN": _is_nan, "IsInf": _is_inf,
}
