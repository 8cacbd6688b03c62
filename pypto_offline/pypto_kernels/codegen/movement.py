"""Lowerings of the ops that move data without arithmetic: Slice, Pad, Tile, Expand, Concat,
Split, Transpose, Reshape, Identity, Gather, Roll, DepthToSpace and SpaceToDepth. PyPTO 0.2.0
pads as ``concat`` with ``full`` blocks, transposes as chains of axis swaps, broadcasts one axis
at a time, slices with a stride through ``index_select`` and gathers constant indices as views
concatenated in a plain ``for`` loop (its parser refuses comprehensions)."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from pypto_offline.fusion.records import RegionOp
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.folding import Window, fold_slice, fold_transpose
from pypto_offline.pypto_kernels.tiling import BLOCK_BYTES
from pypto_offline.pypto_kernels.codegen.layout import broadcast_to, compute_shape
from pypto_offline.pypto_kernels.codegen.writer import (MAX_RANK, CannotExpress, Writer, full,
                                                        is_scalar_constant, itemsize_of)

MAX_CONCAT_INPUTS = 128  # PyPTO's documented limit for one concat


def _slice(w: Writer, op: RegionOp) -> None:
    source, out = op.inputs[0], op.outputs[0]
    p = op.params
    if any(step < 0 for step in p["steps"]):
        raise CannotExpress("Slice with a negative step")
    spans = [max(e - s, 0) for s, e in zip(p["starts"], p["ends"])]
    taken = Window(tuple(w.shape(source)), tuple(p["starts"]),
                   tuple(min(span, dim) for span, dim in zip(spans, w.shape(source))),
                   tuple(p["steps"]))
    if len(taken.shape) > MAX_RANK:
        taken = fold_slice(taken)
        if len(taken.shape) > MAX_RANK:
            raise CannotExpress(f"rank {len(spans)} slice does not fold to {MAX_RANK} axes")
    shape = [-(-span // step) for span, step in zip(taken.spans, taken.steps)]
    window = list(taken.spans)
    w.tile(window, w.dtype(out))
    current = w.view(out, f"pypto.view({w.value(source, taken.shape)}, {window}, "
                          f"{list(taken.starts)})", window)
    for axis, step in enumerate(taken.steps):
        if step != 1:
            w.tile(shape, w.dtype(out))
            current = w.assign(out, every_step(current, axis, window[axis], step), shape)


def every_step(value: str, axis: int, span: int, step: int) -> str:
    """Every ``step``-th element along ``axis`` of a variable ``span`` long there: PyPTO 0.2.0
    has no strided view (docs/pypto-ops.md), ``index_select`` takes them."""
    return f"pypto.index_select({value}, {axis}, pypto.arange(0, {span}, {step}))"


def _pad(w: Writer, op: RegionOp) -> None:
    source, out = op.inputs[0], op.outputs[0]
    pads, value, dtype = op.params["pads"], op.params["value"] or 0, w.dtype(out)
    rank = len(pads) // 2
    current, shape = w.var(source), list(w.shape(source))
    begins, ends = list(pads[:rank]), list(pads[rank:])
    if min(pads) < 0:  # crop first
        starts = [max(-b, 0) for b in begins]
        shape = [d - max(-b, 0) - max(-e, 0) for d, b, e in zip(shape, begins, ends)]
        w.tile(shape, dtype)
        current = w.view(out, f"pypto.view({current}, {shape}, {starts})")
        begins, ends = [max(b, 0) for b in begins], [max(e, 0) for e in ends]
    if _native_pad(shape, begins, ends, value):
        # pypto.pad: bottom/right of the last two axes, value 0 or ±inf, a 4-entry list
        right, bottom = ends[-1], ends[-2] if rank >= 2 else 0
        shape = [d + e for d, e in zip(shape, ends)]
        w.tile(shape, dtype)
        w.assign(out, f'pypto.pad({current}, [0, {right}, 0, {bottom}], "constant", '
                      f"{float_literal(value)})")
        return
    for axis in range(rank):
        if begins[axis] == 0 and ends[axis] == 0:
            continue
        parts = [current]
        if begins[axis]:
            parts.insert(0, full(w, shape[:axis] + [begins[axis]] + shape[axis + 1:], value, dtype))
        if ends[axis]:
            parts.append(full(w, shape[:axis] + [ends[axis]] + shape[axis + 1:], value, dtype))
        shape[axis] += begins[axis] + ends[axis]
        w.tile(shape, dtype, whole_axes=(axis,))
        current = w.assign(out, f"pypto.concat([{', '.join(parts)}], {axis})")
    if current == w.var(source):
        w.assign(out, current)


def _native_pad(shape, begins, ends, value) -> bool:
    return len(shape) >= 2 and not any(begins) and not any(ends[:-2]) \
        and float(value) in (0.0, float("inf"), float("-inf"))


def _tile(w: Writer, op: RegionOp) -> None:
    source, out = op.inputs[0], op.outputs[0]
    current, shape = w.var(source), list(w.shape(source))
    for axis, repeats in enumerate(op.params["repeats"]):
        if repeats == 1:
            continue
        if repeats > MAX_CONCAT_INPUTS:
            raise CannotExpress(f"Tile by {repeats} exceeds concat's {MAX_CONCAT_INPUTS} inputs")
        shape[axis] *= repeats
        w.tile(shape, w.dtype(out), whole_axes=(axis,))
        current = w.assign(out, f"pypto.concat([{', '.join([current] * repeats)}], {axis})")
    if current == w.var(source):
        w.assign(out, current)


def _expand(w: Writer, op: RegionOp) -> None:
    out = op.outputs[0]
    shape, (own,) = compute_shape(w, out, op.inputs)
    w.hold(out, broadcast_to(w, op.inputs[0], shape, own), shape)


def _concat(w: Writer, op: RegionOp) -> None:
    axis, out = op.params["axis"], op.outputs[0]
    if out in w.assembled:
        _assemble_concat(w, op, w.assembled[out])
        return
    if len(op.inputs) > MAX_CONCAT_INPUTS:
        raise CannotExpress(f"Concat of {len(op.inputs)} inputs")
    # the inputs first: a reshaped or broadcast input sets its own tile, which must not be the
    # one the concat runs under (nudenet's YOLO head: the last input's tile, 193,568 B of UB)
    parts = ", ".join(broadcast_to(w, name, w.shape(name)) for name in op.inputs)
    w.tile(w.shape(out), w.dtype(out), whole_axes=(axis,))
    w.assign(out, f"pypto.concat([{parts}], {axis})")


def _assemble_concat(w: Writer, op: RegionOp, target: str) -> None:
    """A Concat that is a region output, written into the output argument part by part
    (``layout.assembled_outputs``); no output statement follows it (PyPTO refuses an
    ``out[:] =`` beside an ``assemble`` into the same ``out``, F21005)."""
    axis, offset = op.params["axis"], 0
    for tensor in op.inputs:
        shape, dtype = list(w.shape(tensor)), w.dtype(tensor)
        part = full(w, shape, np.asarray(w.constants[tensor]).reshape(-1)[0], dtype) \
            if is_scalar_constant(tensor, w.constants) else broadcast_to(w, tensor, shape)
        w.tile(shape, dtype)
        offsets = [offset if a == axis else 0 for a in range(len(shape))]
        w.emit(f"pypto.assemble({part}, {offsets}, {target})")
        offset += shape[axis]


def _split(w: Writer, op: RegionOp) -> None:
    source, axis = op.inputs[0], op.params["axis"]
    offset = 0
    for out, size in zip(op.outputs, op.params["sizes"]):
        shape = w.shape(out)
        offsets = [offset if a == axis else 0 for a in range(len(shape))]
        w.tile(shape, w.dtype(out))
        w.view(out, f"pypto.view({w.var(source)}, {list(shape)}, {offsets})")
        offset += size


def swaps_for(perm) -> list[tuple[int, int]]:
    """Axis swaps whose composition is ``perm`` (selection order)."""
    current, swaps = list(range(len(perm))), []
    for i, wanted in enumerate(perm):
        j = current.index(wanted)
        if j != i:
            swaps.append((i, j))
            current[i], current[j] = current[j], current[i]
    return swaps


def _transpose(w: Writer, op: RegionOp) -> None:
    _permute(w, op.inputs[0], op.outputs[0], list(w.shape(op.inputs[0])), list(op.params["perm"]))


def _permute(w: Writer, source: str, out: str, shape: list[int], perm: list[int]) -> None:
    """``out`` = ``source`` viewed as ``shape`` with its axes permuted by ``perm``: folded
    (``fold_transpose``) above PyPTO's rank and wherever that takes fewer swaps, since each
    swap of a computed tensor is a GM round trip: tf_swin's key projection, a 256x32x32 matmul
    reshaped to [16, 16, 2, 16] and swapped (1, 2) then (2, 3), read 102,528 B and wrote 98,304
    in 14.8 us; folded to one swap of [16, 16, 32], 69,760 and 65,536 (the lower bound plus
    the hand-off) in 8.1 us (docs/pypto-ops.md, "MatMul")."""
    folded_shape, folded_perm = fold_transpose(shape, perm)
    if len(shape) > MAX_RANK or len(swaps_for(folded_perm)) < len(swaps_for(perm)):
        shape, perm = folded_shape, folded_perm
        if len(shape) > MAX_RANK:
            raise CannotExpress(f"rank {len(perm)} transpose of {source!r} does not fold to "
                                f"{MAX_RANK} axes")
    current = w.value(source, shape)
    dtype, over_input = w.dtype(out), w.policy.swap_transpose_tiles
    for i, j in swaps_for(perm):
        before = tuple(shape)
        shape[i], shape[j] = shape[j], shape[i]
        # the search's other orientation runs under the input's tile, the default the output's
        tile = _transpose_input_tile(w, current, before, dtype, i, j) if over_input \
            else w.policy.tile(tuple(shape), itemsize_of(dtype))
        w.set_tile(tile)
        name = w.fresh()
        w.emit(f"{name} = pypto.transpose({current}, {i}, {j})")
        if over_input:  # its result comes in the input's tile swapped (``Writer.follow``)
            w.tiles[name] = _swapped(tile, i, j)
        current = name
    w.hold(out, current, shape)


def _swapped(tile: Sequence[int], i: int, j: int) -> tuple[int, ...]:
    tile = list(tile)
    tile[i], tile[j] = tile[j], tile[i]
    return tuple(tile)


def _transpose_input_tile(w: Writer, value: str, shape: Sequence[int], dtype: int, i: int,
                          j: int) -> tuple[int, ...]:
    """A transpose's tile, over its input (PyPTO's reading): the tile ``value`` was made under
    where it came from a transpose (``Writer.tiles``), else the policy's for its shape, which
    is what its producer ran under. Where the axis that becomes the innermost would not be a
    whole number of 32-byte blocks, it is rounded up to one (a tile that no longer matches its
    producer's, which costs a round trip, but compiles). docs/pypto-ops.md, "Transposes"."""
    tile = list(w.tiles.get(value) or w.policy.tile(tuple(shape), itemsize_of(dtype)))
    last = len(shape) - 1
    if last in (i, j):
        inner = i + j - last
        align = max(BLOCK_BYTES // itemsize_of(dtype), 1)
        if tile[inner] < shape[inner] and tile[inner] % align:
            tile[inner] = min(-(-tile[inner] // align) * align, -(-shape[inner] // align) * align)
    return tuple(tile)


def _reshape(w: Writer, op: RegionOp) -> None:
    """No op of its own: the output holds the same elements. Materialised (as a reshape from the
    underlying variable) only when a consumer needs this shape."""
    source, out = op.inputs[0], op.outputs[0]
    if source not in w.names:
        raise CannotExpress(f"tensor {source!r} is used before it is computed")
    w.alias(out, source)


def _identity(w: Writer, op: RegionOp) -> None:
    w.alias(op.outputs[0], op.inputs[0])


def _gather(w: Writer, op: RegionOp) -> None:
    source, out = op.inputs[0], op.outputs[0]
    axis, indices = op.params["axis"], [int(i) for i in np.asarray(op.params["indices"]).reshape(-1)]
    if len(indices) > MAX_CONCAT_INPUTS:
        raise CannotExpress(f"Gather of {len(indices)} indices exceeds concat's limit")
    part = list(w.shape(source))
    part[axis] = 1
    offsets = ["i" if a == axis else "0" for a in range(len(part))]
    held = w.var(source)  # before the loop: a reshape it needs is emitted outside the loop body
    parts = w.fresh()
    w.tile(part, w.dtype(out))
    w.emit(f"{parts} = []")
    w.emit(f"for i in {indices}:")
    w.emit(f"    {parts}.append(pypto.view({held}, {part}, [{', '.join(offsets)}]))")
    gathered = part[:axis] + [len(indices)] + part[axis + 1:]
    w.tile(gathered, w.dtype(out), whole_axes=(axis,))
    if len(indices) > 1:
        w.assign(out, f"pypto.concat({parts}, {axis})", gathered)
    else:  # a scalar index drops the axis: the same elements, held as `gathered`
        w.view(out, f"{parts}[0]", gathered)


def _roll(w: Writer, op: RegionOp) -> None:
    source, out = op.inputs[0], op.outputs[0]
    axis, shift = op.params["axis"], op.params["shift"]
    shape = list(w.shape(source))
    tail = shape[:axis] + [shape[axis] - shift] + shape[axis + 1:]
    head = shape[:axis] + [shift] + shape[axis + 1:]
    at = [shift if a == axis else 0 for a in range(len(shape))]
    held = w.var(source)  # before the tile: a reshape it needs sets a tile of its own
    w.tile(shape, w.dtype(out), whole_axes=(axis,))
    w.assign(out, f"pypto.concat([pypto.view({held}, {tail}, {at}), "
                  f"pypto.view({held}, {head}, {[0] * len(shape)})], {axis})")


# DepthToSpace and SpaceToDepth as the reshape-transpose-reshape ONNX defines them; the 6-D
# transpose folds to rank 4 (``fold_transpose``) for DCR DepthToSpace and SpaceToDepth.


def _space_to_depth(w: Writer, op: RegionOp) -> None:
    n, c, h, width = w.shape(op.inputs[0])
    b = op.params["blocksize"]
    _permute(w, op.inputs[0], op.outputs[0], [n, c, h // b, b, width // b, b], [0, 3, 5, 1, 2, 4])


def _depth_to_space(w: Writer, op: RegionOp) -> None:
    n, c, h, width = w.shape(op.inputs[0])
    b = op.params["blocksize"]
    if op.params.get("mode", "DCR") == "DCR":
        shape, perm = [n, b, b, c // (b * b), h, width], [0, 3, 4, 1, 5, 2]
    else:
        shape, perm = [n, c // (b * b), b, b, h, width], [0, 1, 4, 2, 5, 3]
    _permute(w, op.inputs[0], op.outputs[0], shape, perm)


LOWERINGS: dict[str, Callable[[Writer, RegionOp], None]] = {
    "Slice": _slice, "Pad": _pad, "Tile": _tile, "Expand": _expand, "Concat": _concat,
    "Split": _split, "Transpose": _transpose, "Reshape": _reshape, "Identity": _identity,
    "Gather": _gather, "Roll": _roll, "DepthToSpace": _depth_to_space,
    "SpaceToDepth": _space_to_depth,
}
