"""Rewrite rules over a region's program, one small function each (onnxscript's rewrite rules are
the model). A rule looks at one op and its producers and returns the ops that replace it, or None.
Rules only ever reroute an op to read from earlier tensors; ``Program.prune`` then drops what no
output needs any more.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np
import onnx

from pypto_offline.fusion.program import Program
from pypto_offline.fusion.records import RegionOp
from pypto_offline.fusion.rows import reduces_lone_elements
from pypto_offline.fusion.views import ViewStack
from pypto_offline.registry.attributes import register_table
from pypto_offline.registry.ops import BROADCASTING_OPS, DECOMPOSED_OPS, VIEW_TRANSFORM_OPS, is_op

Rule = Callable[[Program, RegionOp], "list[RegionOp] | None"]
ANY_OP = None  # a rule's roots: every op


def rewrites(roots: str | frozenset[str] | None):
    """Registers a rule with the ops it rewrites (its pattern's root, as onnxscript's rewrite
    patterns and tinygrad's ``PatternMatcher`` index theirs): ``simplify`` asks it about those
    ops only, so the rule itself never tests which op it was given."""
    def register(rule: Rule) -> Rule:
        rule.roots = frozenset(roots.split()) if isinstance(roots, str) else roots
        return rule
    return register


def made_by(prog: Program, name: str, op_types: str | frozenset[str]) -> RegionOp | None:
    """The op of the program that computes ``name`` when it is one of ``op_types`` (a name, or
    names separated by spaces, or a set): a pattern's producer."""
    producer = prog.producer(name)
    return producer if producer is not None and is_op(producer, op_types) else None


def _op(op_type, inputs, outputs, **params) -> RegionOp:
    return RegionOp(op_type, tuple(inputs), tuple(outputs), MappingProxyType(params))


def _identity(source: str, op: RegionOp) -> list[RegionOp]:
    return [_op("Identity", [source], op.outputs)]


def _single_producer(prog: Program, op: RegionOp, op_type: str) -> RegionOp | None:
    return made_by(prog, op.inputs[0], op_type)


def _same_shape(prog: Program, op: RegionOp) -> bool:
    return prog.shapes[op.inputs[0]] == prog.shapes[op.outputs[0]]


# When an op moves nothing: full Slice, zero Pad, identity Transpose, same-shape Reshape or
# Expand, Tile by ones, Cast to the same type, one-input Concat, one-output Split. Keyed by
# registry ops (tests/test_op_registry.py: every view op but Identity has an entry).
MOVES_NOTHING = "moves_nothing_when"
MOVES_NOTHING_WHEN: Mapping[str, Callable[[Program, RegionOp], bool]] = register_table(
    MOVES_NOTHING, {
    "Slice": lambda prog, op: _same_shape(prog, op) and all(s == 1 for s in op.params["steps"]),
    "Pad": lambda prog, op: all(v == 0 for v in op.params["pads"]),
    "Transpose": lambda prog, op: list(op.params["perm"]) == sorted(op.params["perm"]),
    "Reshape": _same_shape,
    "Expand": _same_shape,
    "Tile": lambda prog, op: all(r == 1 for r in op.params["repeats"]),
    "Cast": lambda prog, op: prog.dtypes[op.inputs[0]] == prog.dtypes[op.outputs[0]],
    "Concat": lambda prog, op: len(op.inputs) == 1,
    "Split": lambda prog, op: len(op.outputs) == 1,
})


@rewrites(ANY_OP)
def no_op(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """An op that moves nothing (``MOVES_NOTHING_WHEN``) is its input."""
    moves_nothing = MOVES_NOTHING_WHEN.get(op.op_type)
    return _identity(op.inputs[0], op) if moves_nothing and moves_nothing(prog, op) else None


@rewrites(ANY_OP)
def reduction_over_one_element(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """A ReduceMean, ReduceSum, ReduceMax or ReduceMin (``OpDef.as_is_over_one``) whose axes
    all have one element is a reshape of its input (silero_vad's ReduceMean over such an axis,
    which no row layout takes: "a reduction over one element")."""
    if not reduces_lone_elements(op, prog.shapes[op.inputs[0]]):
        return None
    return [_op("Reshape", [op.inputs[0]], op.outputs, shape=tuple(prog.shapes[op.outputs[0]]))]


@rewrites(VIEW_TRANSFORM_OPS - {"Identity"})  # the program drops an Identity
def view_chain(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """A chain of view ops whose composed index map is the identity, or a plain reshape of the
    chain's start, becomes that (inverse transposes, reshape round trips, reshape chains)."""
    chain = [op]
    while (producer := made_by(prog, chain[-1].inputs[0], VIEW_TRANSFORM_OPS)) is not None:
        chain.append(producer)
    if len(chain) < 2:
        return None
    start = chain[-1].inputs[0]
    stack = ViewStack.of(prog.shapes[start])
    for step in reversed(chain):
        stack = stack.apply(step.op_type, step.params)
        if stack is None:
            return None
    if stack.is_identity:
        return _identity(start, op)
    covers_input = np.prod(stack.shape) == np.prod(prog.shapes[start])  # not just a prefix
    if len(stack.views) == 1 and stack.views[0].is_contiguous and covers_input:
        return [_op("Reshape", [start], op.outputs, shape=tuple(stack.shape))]
    return None


def compose_slices(outer, inner, dims) -> tuple[tuple, tuple, tuple]:
    """Slice(Slice(x)) as one Slice of x: start, end, step per axis."""
    starts, ends, steps = [], [], []
    for (s1, e1, st1), (s2, e2, st2), dim in zip(zip(*inner), zip(*outer), dims):
        count = len(range(s2, e2, st2))
        start, step = s1 + s2 * st1, st1 * st2
        if count == 0:
            start, end, step = 0, 0, 1
        else:
            end = start + count * step
            end = max(end, -1) if step < 0 else min(end, dim)
        starts.append(start)
        ends.append(end)
        steps.append(step)
    return tuple(starts), tuple(ends), tuple(steps)


@rewrites("Slice")
def slice_of_slice(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    inner = _single_producer(prog, op, "Slice")
    if inner is None:
        return None
    source = inner.inputs[0]
    starts, ends, steps = compose_slices(
        (op.params["starts"], op.params["ends"], op.params["steps"]),
        (inner.params["starts"], inner.params["ends"], inner.params["steps"]),
        prog.shapes[source])
    return [_op("Slice", [source], op.outputs, starts=starts, ends=ends, steps=steps)]


def _constant_pad(pad: RegionOp | None) -> bool:
    return pad is not None and pad.params["mode"] == "constant"


@rewrites("Pad")
def pad_of_pad(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    inner = _single_producer(prog, op, "Pad")
    if not _constant_pad(op) or not _constant_pad(inner) \
            or inner.params["value"] != op.params["value"] \
            or min(op.params["pads"] + inner.params["pads"]) < 0:
        return None
    pads = tuple(a + b for a, b in zip(op.params["pads"], inner.params["pads"]))
    return [_op("Pad", [inner.inputs[0]], op.outputs, pads=pads, mode="constant",
                value=op.params["value"])]


@rewrites("Slice")
def slice_of_pad(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """Slice(Pad(x)) → Pad(Slice(x)): cut the data first, pad only what the window keeps. Also
    for a Pad several slices read (swin's cyclic shift, a pooling's windows): each pads its own
    piece, which measured faster (swin's pad + roll: 4.0 against 5.3 us at its GM lower bound;
    a 3x3 MaxPool of 1x16x32x32: 36 against 46 us) though the pooling reads more."""
    pad = _single_producer(prog, op, "Pad")
    if not _constant_pad(pad) or any(s != 1 for s in op.params["steps"]) \
            or min(pad.params["pads"]) < 0:
        return None
    source = pad.inputs[0]
    dims = prog.shapes[source]
    rank = len(dims)
    starts, ends, pads_before, pads_after = [], [], [], []
    for axis, dim in enumerate(dims):
        before = pad.params["pads"][axis]
        lo, hi = op.params["starts"][axis], op.params["ends"][axis]
        data_lo, data_hi = max(lo - before, 0), min(hi - before, dim)
        if data_lo >= data_hi:
            return None  # the window holds only padding on this axis
        starts.append(data_lo)
        ends.append(data_hi)
        pads_before.append(max(before - lo, 0))
        pads_after.append(max(hi - (before + dim), 0))
    sliced = prog.new_tensor(source, [e - s for s, e in zip(starts, ends)], "slice")
    return [_op("Slice", [source], [sliced], starts=tuple(starts), ends=tuple(ends),
                steps=(1,) * rank),
            _op("Pad", [sliced], op.outputs, pads=tuple(pads_before + pads_after),
                mode="constant", value=pad.params["value"])]


@rewrites("Transpose")
def transpose_of_transpose(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    inner = _single_producer(prog, op, "Transpose")
    if inner is None:
        return None
    perm = tuple(inner.params["perm"][p] for p in op.params["perm"])
    return [_op("Transpose", [inner.inputs[0]], op.outputs, perm=perm)]


@rewrites("Slice")
def slice_before_transpose(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """Slice(Transpose(x)) → Transpose(Slice(x)): move less data, and PyPTO 0.2.0 cannot take a
    view of a transposed tile."""
    transpose = _single_producer(prog, op, "Transpose")
    if transpose is None:
        return None
    perm = transpose.params["perm"]
    source = transpose.inputs[0]
    starts, ends, steps = [0] * len(perm), list(prog.shapes[source]), [1] * len(perm)
    for out_axis, in_axis in enumerate(perm):
        starts[in_axis] = op.params["starts"][out_axis]
        ends[in_axis] = op.params["ends"][out_axis]
        steps[in_axis] = op.params["steps"][out_axis]
    out_shape = prog.shapes[op.outputs[0]]
    sliced_shape = [0] * len(perm)
    for out_axis, in_axis in enumerate(perm):
        sliced_shape[in_axis] = out_shape[out_axis]
    sliced = prog.new_tensor(source, sliced_shape, "slice")
    return [_op("Slice", [source], [sliced], starts=tuple(starts), ends=tuple(ends),
                steps=tuple(steps)),
            _op("Transpose", [sliced], op.outputs, perm=tuple(perm))]


@rewrites("Reshape")
def reshape_of_reshape(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    inner = _single_producer(prog, op, "Reshape")
    if inner is None:
        return None
    return [_op("Reshape", [inner.inputs[0]], op.outputs, shape=op.params["shape"])]


def _axis_slice(op: RegionOp | None, axis: int, dims) -> tuple[str, int, int] | None:
    """(source, start, end) if the Slice ``op`` cuts only ``axis`` of its source with step 1."""
    if op is None or any(s != 1 for s in op.params["steps"]):
        return None
    for other, (s, e, d) in enumerate(zip(op.params["starts"], op.params["ends"], dims)):
        if other != axis and (s, e) != (0, d):
            return None
    return op.inputs[0], op.params["starts"][axis], op.params["ends"][axis]


@rewrites("Concat")
def slices_concat_roll(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """Concat(x[k:], x[:k]) along one axis is a roll of x by k (a cyclic shift)."""
    if len(op.inputs) != 2:
        return None
    axis = op.params["axis"]
    parts = []
    for name in op.inputs:
        producer = made_by(prog, name, "Slice")
        source_dims = prog.shapes[producer.inputs[0]] if producer is not None else ()
        parts.append(_axis_slice(producer, axis, source_dims))
    if None in parts or parts[0][0] != parts[1][0]:
        return None
    (source, s0, e0), (_, s1, e1) = parts
    dim = prog.shapes[source][axis]
    if not (e0 == dim and s1 == 0 and e1 == s0 and 0 < s0 < dim):
        return None
    return [_op("Roll", [source], op.outputs, axis=axis, shift=s0)]


@rewrites("Concat")
def split_then_concat(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """Concat of every part of a Split, in order, on the same axis, is the Split's input."""
    split = made_by(prog, op.inputs[0], "Split")
    if split is None or tuple(op.inputs) != tuple(split.outputs) \
            or split.params["axis"] != op.params["axis"]:
        return None
    return _identity(split.inputs[0], op)


@rewrites(BROADCASTING_OPS)
def expand_into_broadcast(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """An Expand feeding a broadcasting op is done by the op's own broadcast."""
    inputs = list(op.inputs)
    for i, name in enumerate(inputs):
        producer = made_by(prog, name, "Expand")
        if producer is None:
            continue
        trial = inputs[:i] + [producer.inputs[0]] + inputs[i + 1:]
        try:
            shape = np.broadcast_shapes(*(prog.shapes[n] for n in trial))
        except ValueError:
            continue
        if tuple(shape) == prog.shapes[op.outputs[0]]:
            return [RegionOp(op.op_type, tuple(trial), op.outputs, op.params)]
    return None


def _row_vector(shape: tuple[int, ...], columns: int) -> bool:
    """A shape that broadcasts one value per column: ``[N]``, ``[1, N]``, ``[1, 1, N]``..."""
    return len(shape) >= 1 and shape[-1] == columns and all(d == 1 for d in shape[:-1])


@rewrites("Add")
def bias_into_matmul(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """``Add(MatMul(a, W), bias)`` with a per-column bias becomes one MatMul that adds the bias
    in the cube's write-out (PyPTO's ``bias_tensor``): the product never crosses to a vector
    tile through GM, so a MatMul with its bias alone moves its lower bound (2.8 us against
    6.7 us for 16x64x128 fp32; docs/pypto-ops.md, "MatMul"). Only a 2-D weight (the folded
    form codegen writes), a product read by this Add alone, and a bias of the product's dtype."""
    for product, bias in (op.inputs, op.inputs[::-1]):
        matmul = made_by(prog, product, "MatMul")
        if matmul is None or len(matmul.inputs) != 2 \
                or product in prog.outputs or len(prog.consumers(product)) != 1:
            continue
        shape = prog.shapes[product]
        if len(prog.shapes[matmul.inputs[1]]) == 2 and _row_vector(prog.shapes[bias], shape[-1]) \
                and prog.shapes[op.outputs[0]] == shape \
                and prog.dtypes[bias] == prog.dtypes[product]:
            return [RegionOp("MatMul", (*matmul.inputs, bias), op.outputs, matmul.params)]
    return None


@rewrites("Transpose")
def transpose_back_through_binary(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """``Transpose(Add(T(x), y), inverse of T)`` is ``Add(x, Transpose(y))``: a round trip
    through another layout for one elementwise op (ConvNeXt's layer scale and residual, NHWC to
    NCHW and back) becomes one transpose of the other operand. Each transpose of a computed
    tensor is a GM round trip: on tf_convnext's 64x64x16 matmul with its layer scale the
    kernel read 41,088 B and wrote 20,480 in 26.1 us, with the residual transposed instead
    32,896 and 12,288 in 13.8 us (docs/pypto-ops.md, "MatMul"). Only for an op whose operands
    both have its output's shape (or one is a scalar) and whose result this Transpose alone
    reads."""
    inner = made_by(prog, op.inputs[0], BROADCASTING_OPS)
    if inner is None or len(inner.inputs) != 2 \
            or inner.outputs[0] in prog.outputs or len(prog.consumers(inner.outputs[0])) != 1:
        return None
    perm, shape = tuple(op.params["perm"]), prog.shapes[inner.outputs[0]]
    for side, name in enumerate(inner.inputs):
        undone, other = made_by(prog, name, "Transpose"), inner.inputs[1 - side]
        if undone is None or name in prog.outputs \
                or len(prog.consumers(name)) != 1 \
                or tuple(undone.params["perm"][p] for p in perm) != tuple(range(len(perm))) \
                or (prog.shapes[other] != shape and np.prod(prog.shapes[other]) != 1):
            continue
        operands = [undone.inputs[0], other]
        ops = []
        if prog.shapes[other] == shape:
            moved = prog.new_tensor(other, [shape[p] for p in perm], "transposed")
            ops.append(_op("Transpose", [other], [moved], perm=perm))
            operands[1] = moved
        if side == 1:
            operands.reverse()
        return ops + [RegionOp(inner.op_type, tuple(operands), op.outputs, inner.params)]
    return None


# Ops that only move, drop or repeat elements: an elementwise Cast commutes with each of them
MOVES_ELEMENTS = frozenset({"Transpose", "Reshape", "Slice", "Expand"})


def _float_width(dtype: int) -> int | None:
    """Bytes of a floating element type, None for any other (casts to and from integers stay
    where the model has them)."""
    np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
    return np_dtype.itemsize if np_dtype.kind == "f" else None


def _float_cast_widens(prog: Program, cast: RegionOp) -> bool | None:
    """True for a cast to a wider float type, False to a narrower one, None otherwise."""
    before, after = (_float_width(prog.dtypes[cast.inputs[0]]),
                     _float_width(prog.dtypes[cast.outputs[0]]))
    return None if before is None or after is None or before == after else after > before


def _only_for(prog: Program, name: str) -> bool:
    """Whether the tensor is internal to the program and read by one op."""
    return name not in prog.outputs and len(prog.consumers(name)) == 1


@rewrites("Cast")
def narrowing_cast_before_movement(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """``Cast(M(x), to a narrower float)`` is ``M(Cast(x))`` for an op M that only moves
    elements (``MOVES_ELEMENTS``): the move then carries half the bytes, and the cast runs
    under the tiles of the op that computed x. Under allow_mix_precision an fp32 LayerNorm whose
    result is reshaped, sliced and transposed into an fp16 convolution ends in such a cast
    (magika's): after the transpose to [1, 256, 512, 1] the cast's tiles held one element per
    32-byte block, and every tile that fitted kirin9050's UB cost PyPTO 1,718 us or more
    against 128 us for the same region in fp32 (docs/precision.md)."""
    moved = made_by(prog, op.inputs[0], MOVES_ELEMENTS)
    if moved is None or _float_cast_widens(prog, op) is not False \
            or not _only_for(prog, op.inputs[0]):
        return None
    source = moved.inputs[0]
    cast = prog.new_tensor(op.outputs[0], prog.shapes[source], "cast")
    return [RegionOp("Cast", (source,), (cast,), op.params),
            RegionOp(moved.op_type, (cast, *moved.inputs[1:]), op.outputs, moved.params)]


@rewrites(MOVES_ELEMENTS)
def widening_cast_after_movement(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """``M(Cast(x, to a wider float))`` is ``Cast(M(x))``: the same rule the other way, so a
    move carries the narrower type whichever side of it the cast was."""
    cast = made_by(prog, op.inputs[0], "Cast")
    if cast is None or not _float_cast_widens(prog, cast) \
            or not _only_for(prog, op.inputs[0]):
        return None
    moved = prog.new_tensor(cast.inputs[0], prog.shapes[op.outputs[0]], "moved")
    return [RegionOp(op.op_type, (cast.inputs[0], *op.inputs[1:]), (moved,), op.params),
            RegionOp("Cast", (moved,), op.outputs, cast.params)]


def _lowest(dtype: int) -> float:
    """What a max ignores: -inf, or an integer type's least value."""
    np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
    return float(np.iinfo(np_dtype).min) if np_dtype.kind in "iu" else float("-inf")




# How each decomposed pooling combines its window's views
POOL_COMBINES = MappingProxyType({"MaxPool": "Max", "AveragePool": "Mean"})


@rewrites(DECOMPOSED_OPS)  # the kernel generator never sees them
def pool_as_window_views(prog: Program, op: RegionOp) -> list[RegionOp] | None:
    """A MaxPool or AveragePool as the views its windows read: padded (with -inf for a max,
    zeros for a mean), then for each column of the window a view with the strides, combined
    by Max or Mean, then the same over the window's rows (pooling is separable: kh + kw views
    instead of kh * kw). Each view is a strided Slice; the generator keeps them all in UB."""
    source, out = op.inputs[0], op.outputs[0]
    p = op.params
    (kh, kw), (sh, sw), (top, left, bottom, right) = p["kernel_shape"], p["strides"], p["pads"]
    n, c, height, width = prog.shapes[source]
    out_h, out_w = prog.shapes[out][2:]
    combine = POOL_COMBINES[op.op_type]
    ops, current = [], source
    if any(p["pads"]):
        height, width = height + top + bottom, width + left + right
        current = prog.new_tensor(source, [n, c, height, width], "padded")
        ops.append(_op("Pad", [source], [current], mode="constant",
                       value=_lowest(prog.dtypes[source]) if combine == "Max" else 0.0,
                       pads=(0, 0, top, left, 0, 0, bottom, right)))
    for axis, (size, stride, extent) in ((3, (kw, sw, out_w)), (2, (kh, sh, out_h))):
        shape = list(prog.shapes[current])
        shape[axis] = extent
        views = []
        for offset in range(size):
            starts, ends, steps = [0, 0, 0, 0], list(prog.shapes[current]), [1, 1, 1, 1]
            # one element needs no stride (a one-index index_select failed PyPTO's check)
            starts[axis], ends[axis] = offset, offset + (extent - 1) * stride + 1
            steps[axis] = stride if extent > 1 else 1
            views.append(prog.new_tensor(source, shape, f"window{axis}_{offset}"))
            ops.append(_op("Slice", [current], [views[-1]], starts=tuple(starts),
                           ends=tuple(ends), steps=tuple(steps)))
        combined = out if axis == 2 else prog.new_tensor(source, shape, "columns")
        ops.append(_op(combine, views, [combined]))
        current = combined
    return ops


RULES: tuple[Rule, ...] = (
    no_op, reduction_over_one_element, view_chain, slice_of_slice, pad_of_pad, slice_of_pad,
    transpose_of_transpose, slice_before_transpose, reshape_of_reshape, slices_concat_roll, split_then_concat,
    expand_into_broadcast, bias_into_matmul, transpose_back_through_binary,
    narrowing_cast_before_movement, widening_cast_after_movement, pool_as_window_views,
)
