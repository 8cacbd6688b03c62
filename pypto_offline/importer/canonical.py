"""One canonical form per in-scope op, whatever opset and encoding the source used.

Each normaliser reads a node in its opset's encoding (attributes before opset 10/11/13, inputs
after) and returns canonical parameters: every axis explicit and non-negative, every index
resolved and clamped, every default filled in. ``encoding.encode`` writes them back as a node
valid at the model's opset, so the normalised graph still runs in onnxruntime.

A parameter computed at run time makes the op a boundary (``NotCanonical``); an impossible one (a
Reshape whose sizes do not multiply out) is a ``ModelError`` naming the node.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

# the contractions', normalisations' and quantisations' normalisers register themselves
from pypto_offline.importer import contractions, normalisations, quantised  # noqa: F401
from pypto_offline.importer.node_context import (NORMALISERS, NodeContext, NotCanonical,
                                                 as_ints, normaliser, schema_attributes,
                                                 window_extents, window_pads)
from pypto_offline.registry.ops import ELEMENTWISE_OPS, GLOBAL_POOL_OPS, REDUCE_OPS

FLT_MAX = float(np.finfo(np.float32).max)


def normalise(ctx: NodeContext) -> dict[str, Any]:
    return NORMALISERS[ctx.node.op_type](ctx)


def _scalar(value: np.ndarray | None) -> Any:
    return None if value is None else np.asarray(value).reshape(-1)[0].item()


# ---------------------------------------------------------------- Slice


def slice_bounds(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX Slice's clamping: returns (start, end) with end == -1 meaning 'past the front'."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


def slice_length(start: int, end: int, step: int) -> int:
    return len(range(start, end, step))


@normaliser("Slice")
def _slice(ctx: NodeContext) -> dict[str, Any]:
    shape = ctx.in_shape()
    rank = len(shape)
    if ctx.opset < 10:
        starts, ends = ctx.attr("starts", []), ctx.attr("ends", [])
        axes, steps = ctx.attr("axes", list(range(len(starts)))), [1] * len(starts)
    else:
        starts, ends = as_ints(ctx.const(1)), as_ints(ctx.const(2))
        axes_value, steps_value = ctx.const(3), ctx.const(4)
        axes = list(range(len(starts))) if axes_value is None else as_ints(axes_value)
        steps = [1] * len(starts) if steps_value is None else as_ints(steps_value)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error("starts, ends, axes and steps have different lengths")
    full_starts, full_ends, full_steps = [0] * rank, list(shape), [1] * rank
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis = ctx.axis(axis, rank)
        if step == 0:
            raise ctx.error("a Slice step is 0")
        full_starts[axis], full_ends[axis] = slice_bounds(start, end, step, shape[axis])
        full_steps[axis] = step
    return {"starts": tuple(full_starts), "ends": tuple(full_ends), "steps": tuple(full_steps)}


# ---------------------------------------------------------------- Pad


@normaliser("Pad")
def _pad(ctx: NodeContext) -> dict[str, Any]:
    rank = len(ctx.in_shape())
    if ctx.opset < 11:
        pads = list(ctx.attr("pads", ctx.attr("paddings", [])))
        mode = ctx.attr("mode", b"constant")
        value = float(ctx.attr("value", 0.0))
        axes = list(range(rank))
    else:
        pads = as_ints(ctx.const(1))
        mode = ctx.attr("mode", b"constant")
        value = _scalar(ctx.const(2))
        value = 0 if value is None else value
        axes_value = ctx.const(3)
        axes = list(range(rank)) if axes_value is None else as_ints(axes_value)
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"Pad has {len(pads)} pads for {len(axes)} axes")
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        axis = ctx.axis(axis, rank)
        full[axis], full[axis + rank] = pads[i], pads[i + len(axes)]
    return {"pads": tuple(full), "mode": mode, "value": value if mode == "constant" else None}


# ---------------------------------------------------------------- Tile, Expand, Concat, Split


@normaliser("Tile")
def _tile(ctx: NodeContext) -> dict[str, Any]:
    repeats = as_ints(ctx.const(1))
    if len(repeats) != len(ctx.in_shape()):
        raise ctx.error(f"Tile has {len(repeats)} repeats for rank {len(ctx.in_shape())}")
    return {"repeats": tuple(repeats)}


@normaliser("Expand")
def _expand(ctx: NodeContext) -> dict[str, Any]:
    try:
        shape = np.broadcast_shapes(ctx.in_shape(), tuple(as_ints(ctx.const(1))))
    except ValueError:
        raise ctx.error(f"Expand cannot broadcast {list(ctx.in_shape())} to "
                        f"{as_ints(ctx.const(1))}") from None
    return {"shape": tuple(int(d) for d in shape)}


@normaliser("Concat")
def _concat(ctx: NodeContext) -> dict[str, Any]:
    axis = ctx.axis(ctx.attr("axis", 0), len(ctx.in_shape()))
    return {"axis": axis}


def split_sizes(ctx: NodeContext, dim: int) -> list[int]:
    outputs = len(ctx.node.output)
    if ctx.opset < 13:
        sizes = ctx.attr("split")
        sizes = None if sizes is None else list(sizes)
    else:
        given = ctx.const(1)
        sizes = None if given is None else as_ints(given)
    if sizes is None:
        if ctx.attr("num_outputs") is not None:  # opset 18: the last part may be smaller
            part = -(-dim // outputs)
            sizes = [min(part, dim - i * part) for i in range(outputs)]
        elif dim % outputs == 0:
            sizes = [dim // outputs] * outputs
        else:
            raise ctx.error(f"axis of size {dim} does not split evenly into {outputs} outputs")
    if sum(sizes) != dim or len(sizes) != outputs:
        raise ctx.error(f"split sizes {sizes} do not cover the axis of size {dim} in {outputs} parts")
    return sizes


@normaliser("Split")
def _split(ctx: NodeContext) -> dict[str, Any]:
    shape = ctx.in_shape()
    axis = ctx.axis(ctx.attr("axis", 0), len(shape))
    sizes = split_sizes(ctx, shape[axis])
    return {"axis": axis, "sizes": tuple(sizes)}


# ---------------------------------------------------------------- Reshapes


def _axes_operand(ctx: NodeContext) -> list[int] | None:
    if ctx.opset < 13:
        axes = ctx.attr("axes")
        return None if axes is None else list(axes)
    value = ctx.const(1)
    return None if value is None else as_ints(value)


@normaliser("Squeeze")
def _squeeze(ctx: NodeContext) -> dict[str, Any]:
    shape = ctx.in_shape()
    axes = _axes_operand(ctx)
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    axes = sorted({ctx.axis(a, len(shape)) for a in axes})
    if any(shape[a] != 1 for a in axes):
        raise ctx.error(f"Squeeze of axes {axes} whose size is not 1 in shape {list(shape)}")
    return {"axes": tuple(axes)}


@normaliser("Unsqueeze")
def _unsqueeze(ctx: NodeContext) -> dict[str, Any]:
    axes = _axes_operand(ctx) or []
    rank = len(ctx.in_shape()) + len(axes)
    normalised = sorted({ctx.axis(a, rank) for a in axes})
    if len(normalised) != len(axes):
        raise ctx.error(f"Unsqueeze repeats an axis in {axes}")
    return {"axes": tuple(normalised)}


def resolve_reshape(ctx: NodeContext, shape: Sequence[int], target: Sequence[int],
                    allowzero: bool) -> list[int]:
    """Replace 0 (copy, unless allowzero) and -1 (infer) by sizes; refuse sizes that disagree."""
    out = [shape[i] if d == 0 and not allowzero and i < len(shape) else d
           for i, d in enumerate(target)]
    total = int(np.prod(shape, dtype=np.int64))
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise ctx.error(f"Reshape target {list(target)} is invalid (one -1 at most, no other "
                        f"negative size)")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ctx.error(f"Reshape of {list(shape)} ({total} elements) to {list(target)}: "
                            f"the sizes do not multiply out")
        out[out.index(-1)] = total // known
    if int(np.prod(out, dtype=np.int64)) != total:
        raise ctx.error(f"Reshape of {list(shape)} ({total} elements) to {list(target)}: "
                        f"the sizes do not multiply out")
    return out


@normaliser("Reshape")
def _reshape(ctx: NodeContext) -> dict[str, Any]:
    shape = ctx.in_shape()
    target = list(ctx.attr("shape", [])) if ctx.opset < 5 else as_ints(ctx.const(1))
    allowzero = bool(ctx.attr("allowzero", 0))
    out = resolve_reshape(ctx, shape, target, allowzero)
    if 0 in out and 5 <= ctx.opset < 14:  # before allowzero, a literal 0 means 'copy'
        raise NotCanonical("a zero-sized Reshape needs opset 14 (allowzero)")
    return {"shape": tuple(out)}


@normaliser("Flatten")
def _flatten(ctx: NodeContext) -> dict[str, Any]:
    rank = len(ctx.in_shape())
    axis = ctx.attr("axis", 1)
    if not -rank <= axis <= rank:
        raise ctx.error(f"Flatten axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return {"axis": axis}


@normaliser("Transpose")
def _transpose(ctx: NodeContext) -> dict[str, Any]:
    rank = len(ctx.in_shape())
    perm = list(ctx.attr("perm", list(range(rank))[::-1]))
    perm = [ctx.axis(p, rank) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"Transpose perm {perm} is not a permutation of rank {rank}")
    return {"perm": tuple(perm)}


# ---------------------------------------------------------------- Gather, DepthToSpace, ...


@normaliser("Gather")
def _gather(ctx: NodeContext) -> dict[str, Any]:
    shape = ctx.in_shape()
    axis = ctx.axis(ctx.attr("axis", 0), len(shape))
    indices = np.asarray(ctx.const(1), dtype=np.int64)  # NotCanonical when data-dependent
    dim = shape[axis]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise ctx.error(f"Gather index out of range for an axis of size {dim}")
    indices = np.where(indices < 0, indices + dim, indices)
    return {"axis": axis, "indices": indices}


@normaliser("Clip")
def _clip(ctx: NodeContext) -> dict[str, Any]:
    ctx.in_shape()
    if ctx.opset < 11:
        return {"min": float(ctx.attr("min", -FLT_MAX)), "max": float(ctx.attr("max", FLT_MAX))}
    return {"min": _scalar(ctx.const(1)), "max": _scalar(ctx.const(2))}


@normaliser("BatchNormalization")
def _batch_normalization(ctx: NodeContext) -> dict[str, Any]:
    """The importer folds every inference BatchNormalization with constant parameters into the
    weights before it or writes it as Mul and Add (``importer/batchnorm.py``): one left here
    cannot be either."""
    raise NotCanonical("a BatchNormalization in training mode, with parameters computed at run "
                       "time or an input of unknown rank, is neither folded into the weights "
                       "before it nor written as a per-channel Mul and Add")


# ---------------------------------------------------------------- reductions


# The opset from which a reduction takes its axes as an input rather than an attribute.
AXES_AS_INPUT_SINCE = {"ReduceSum": 13}
AXES_AS_INPUT_SINCE_DEFAULT = 18


def axes_as_input(op_type: str, opset: int) -> bool:
    return opset >= AXES_AS_INPUT_SINCE.get(op_type, AXES_AS_INPUT_SINCE_DEFAULT)


@normaliser(*sorted(REDUCE_OPS))
def _reduce(ctx: NodeContext) -> dict[str, Any]:
    rank = len(ctx.in_shape())
    if axes_as_input(ctx.node.op_type, ctx.opset):
        value = ctx.const(1)
        axes = None if value is None or np.asarray(value).size == 0 else as_ints(value)
        if axes is None and ctx.attr("noop_with_empty_axes", 0):
            raise NotCanonical("no axes with noop_with_empty_axes: the op is an identity")
    else:
        axes = ctx.attr("axes")
    axes = range(rank) if axes is None else axes
    normalised = sorted({ctx.axis(a, rank) for a in axes})
    return {"axes": tuple(normalised), "keepdims": int(ctx.attr("keepdims", 1))}


@normaliser(*sorted(GLOBAL_POOL_OPS))
def _global_pool(ctx: NodeContext) -> dict[str, Any]:
    """The mean or maximum over every axis after batch and channels, kept as ones."""
    rank = len(ctx.in_shape())
    if rank < 3:
        raise NotCanonical(f"a rank-{rank} input has no spatial axes")
    return {"axes": tuple(range(2, rank)), "keepdims": 1}


# The windows a pooling op may have to be written as its shifted views (one per window row and
# column: pooling is separable): ppocr_cls's 2x2/2, ppocrv4_rec's 3x2/3x2, YOLOv8's SPPF 5x5/1.
MAX_POOL_WINDOW, MAX_POOL_STRIDE = 5, 3


@normaliser("MaxPool")
def _pool(ctx: NodeContext) -> dict[str, Any]:
    """2-D pooling of an NCHW tensor: its window, strides and padding explicit (``auto_pad``
    resolved), no dilation, no indices output; MaxPool pads with -inf."""
    shape = ctx.in_shape()
    if len(shape) != 4 or any(ctx.node.output[1:]):
        raise NotCanonical("not a 2-D pooling of an NCHW tensor with one output")
    kernel = tuple(as_ints(ctx.attr("kernel_shape")))
    strides = tuple(as_ints(ctx.attr("strides", [1, 1])))
    if any(d != 1 for d in ctx.attr("dilations", [1, 1])) or ctx.attr("storage_order", 0):
        raise NotCanonical("a dilated or column-major pooling")
    if max(kernel) > MAX_POOL_WINDOW or max(strides) > MAX_POOL_STRIDE:
        raise NotCanonical(f"a {list(kernel)} window with strides {list(strides)}: at most "
                           f"{MAX_POOL_WINDOW} and {MAX_POOL_STRIDE}")
    pads = window_pads(ctx, shape[2:], kernel, strides)
    if tuple(ctx.shape(ctx.node.output[0])[2:]) != window_extents(shape[2:], pads, kernel,
                                                                  strides):
        raise NotCanonical("a ceil_mode pooling with a window past the input")
    return {"kernel_shape": kernel, "strides": strides, "pads": pads}


@normaliser("AveragePool")
def _average_pool(ctx: NodeContext) -> dict[str, Any]:
    """A pooling (``_pool``) whose padding is zeros counted in the mean: a mean that leaves
    padding out of its count is not canonical."""
    params = _pool(ctx)
    params["count_include_pad"] = int(ctx.attr("count_include_pad", 0))
    if any(params["pads"]) and not params["count_include_pad"]:
        raise NotCanonical("an AveragePool that leaves its padding out of the count")
    return params


def _schema_attributes_of_static_tensors(ctx: NodeContext) -> dict[str, Any]:
    for name in ctx.node.input:
        if name:
            ctx.shape(name)
    return schema_attributes(ctx)


# The elementwise ops without a normaliser of their own, and those whose attributes are their
# whole parameter set (SpaceToDepth gained `mode` at opset 28, so a hand-written list would
# silently drop it)
normaliser(*(ELEMENTWISE_OPS | {"Cast", "Identity", "DepthToSpace", "SpaceToDepth"})
           - set(NORMALISERS))(_schema_attributes_of_static_tensors)
