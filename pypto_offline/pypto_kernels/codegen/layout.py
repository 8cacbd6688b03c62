"""The layout planner: which shape each tensor and op runs in. A region with reductions runs in
rows (``fusion/rows.py``), a 1x1 convolution's in its product rows, a purely elementwise one
maybe in flat rows (``flat_row``), any other on its own shapes, folded above PyPTO's rank and
kept in the shape a computed operand is held in. Also the kernel's argument shapes, and which
outputs a Concat assembles part by part."""
from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Mapping, Sequence

import numpy as np

from pypto_offline.fusion.classify import FLOAT_DTYPES, kernel_dtype
from pypto_offline.fusion.records import Region, RegionOp
from pypto_offline.fusion.rows import NotRows, RowLayout, conv_rows, row_layout
from pypto_offline.registry.ops import definition, is_cube_conv, is_op
from pypto_offline.pypto_kernels.folding import fold_broadcast, right_aligned
from pypto_offline.pypto_kernels.tiling import BLOCK_BYTES, TilePolicy
from pypto_offline.pypto_kernels.codegen.writer import (MAX_RANK, CannotExpress, Writer,
                                                        has_convolution, is_scalar_constant,
                                                        itemsize_of, pypto_dtype)

# The row length hardly matters (256 B to 2 KiB rows gave the same tasks and times on nudenet's
# 1x128x10x10 SiLU); what pays is that no row pads.
FLAT_ROW_BYTES = 512


def shapes_of(region: Region) -> dict[str, tuple[int, ...]]:
    return {tensor: shape for tensor, (shape, _) in region.tensor_types.items()}


def row_layout_of(region: Region) -> RowLayout:
    """The rows a region with reductions runs on, or ``CannotExpress``."""
    try:
        return row_layout(region.simplified, shapes_of(region), region.outputs)
    except NotRows as why:
        raise CannotExpress(f"a reduction region that does not run as rows: {why}") from None


def conv_rows_of(region: Region, policy: TilePolicy) -> RowLayout | None:
    """A 1x1 convolution's product rows (``fusion/rows.conv_rows``), cut along the row where one
    row is larger than the candidate's budget, as channel rows are: whole, ppocrv4_det's
    32->48 and 48->48 Convs (with bias and HardSwish) on 160x160 images took vector tiles of
    one 25,600-element fp32 row (100 KiB, with the epilogue's beyond UB), and PyPTO's parser
    failed them (FFFFFF); cut, both compile and pass the check."""
    rows = conv_rows(region.simplified, shapes_of(region))
    if rows is None:
        return None
    product = next(op.outputs[0] for op in region.simplified
                   if is_cube_conv(op.op_type, op.params))
    if rows.columns * itemsize_of(region.tensor_types[product][1]) > policy.budget_bytes:
        return replace(rows, split_columns=True)
    return rows


def flat_row(region: Region, constants: Mapping[str, np.ndarray]) -> int | None:
    """The row length (elements, ``FLAT_ROW_BYTES`` at most, 32-byte aligned) in which a purely
    elementwise region can run on its elements laid out in rows, or None. Purely elementwise:
    every op maps element i of its inputs to element i of its output, so every tensor has the
    same element count and nothing broadcasts. (A Split would qualify on paper, but viewing rows
    of a computed tensor made PyPTO spill it to GM: nudenet's SiLU->Split read and wrote 2-4x
    its lower bound.)"""
    if any(not definition(op.op_type).flat for op in region.simplified):
        return None
    tensors = [t for t in region.tensor_types if not is_scalar_constant(t, constants)]
    counts = {prod(region.tensor_types[t][0]) for t in tensors}
    if len(counts) != 1:
        return None
    count = counts.pop()
    itemsizes = [itemsize_of(kernel_dtype(region.tensor_types[t][1])) for t in tensors]
    align = max(BLOCK_BYTES // min(itemsizes), 1)
    widest = max(align, FLAT_ROW_BYTES // max(itemsizes) // align * align)
    return next((n for n in range(widest, 0, -align) if count % n == 0), None)


def flat_rows_change_the_tiling(region: Region, policy: TilePolicy,
                                constants: Mapping[str, np.ndarray]) -> bool:
    """Whether the flat-row layout tiles the region differently from its own shapes (the cheap
    analytic check the tile search runs before compiling it). Its only gain is fewer or fuller
    tasks (``flat_row``): where every tensor's own tiles are as many as the rows' tiles and as
    full (no padded row), both compile to the same work and the cost model times them alike
    (magika's 1x2048x64 fp32 elementwise region: 13.458 / 7.214 / 5.279 us at 8 / 16 / 32 KiB in
    either layout), so the flat one is not compiled. docs/compile-time.md."""
    row = flat_row(region, constants)
    if row is None:
        return False  # the same source as the own layout (``kernel_source``): deduplicated
    for tensor, (shape, dtype) in region.tensor_types.items():
        if is_scalar_constant(tensor, constants):
            continue
        own = tuple(shape) or (1,)
        rows = (prod(own) // row, row)
        itemsize = itemsize_of(dtype)
        if len(own) > MAX_RANK or _tiling(own, policy.tile(own, itemsize)) != \
                _tiling(rows, policy.tile(rows, itemsize)):
            return True
    return False


def _tiling(shape: Sequence[int], tile: Sequence[int]) -> tuple[int, int]:
    """Tasks and elements per task (padding included) of a tensor cut into tiles."""
    return prod(-(-extent // side) for extent, side in zip(shape, tile)), prod(tile)


def assembled_outputs(region: Region) -> dict[str, str]:
    """Region outputs that a Concat makes and no op of the region reads, by output argument.
    Each part is assembled into the argument at its offset instead: a concat of a computed part
    made PyPTO stage that part through GM (nudenet's SiLU then Concat of 3 x 1x64x20x20 fp32:
    409,600 B read and written, 15.2 us; assembled, the lower bound's 307,200 each way and
    5.5 us). Not beside a convolution: ppocrv4_det's 1x1 Conv, HardSwish and Concat needed
    133,824 B of UB so (122,880 planned), and its Conv split off; tf_gpt2's Gemm with its KV
    cache Concat gained (9.75 -> 9.16 us). Not of kernel inputs only: nothing is staged then,
    and silero's Concat of two 1x1x128 inputs took 2.6 us as one concat, 5.3 as two assembles.
    docs/pypto-ops.md, "Concat outputs"."""
    if has_convolution(region):
        return {}
    read = {tensor for op in region.simplified for tensor in op.inputs}
    arguments = {tensor: f"out{index}" for index, tensor in enumerate(region.outputs)}
    return {op.outputs[0]: arguments[op.outputs[0]] for op in region.simplified
            if is_op(op, "Concat") and op.outputs[0] in arguments
            and op.outputs[0] not in read and region.outputs.count(op.outputs[0]) == 1
            and _aligned_parts(region, op) and not set(op.inputs) <= set(region.inputs)}


def _aligned_parts(region: Region, op: RegionOp) -> bool:
    """Whether every part of a Concat starts on a 32-byte block along its axis, or the axis is
    not the innermost (an fp16 concat of ``[.., 5]`` and ``[.., 3]`` failed on alignment)."""
    shape, dtype = region.tensor_types[op.outputs[0]]
    dtype = kernel_dtype(dtype)
    if op.params["axis"] != len(shape) - 1:
        return True
    offsets = np.cumsum([region.tensor_types[t][0][-1] for t in op.inputs])[:-1]
    return all(int(o) * itemsize_of(dtype) % BLOCK_BYTES == 0 for o in offsets)


def share_assembled_inputs(w: Writer) -> None:
    """A kernel input assembled into an output and read by elementwise ops too is read from GM
    by each: ``add(x, 0.0)`` once, then every use reads that copy in UB (nudenet's C2f Concat of
    ``x`` and ``x + SiLU(y)``: 409,600 B read against 307,200)."""
    parts = {tensor for op in w.region.simplified if op.outputs[0] in w.assembled
             for tensor in op.inputs}
    for tensor in w.region.inputs:
        if tensor in parts and _read_again_elementwise(w, tensor):
            name, shape = w.names[tensor]
            w.tile(shape, w.dtype(tensor))
            w.assign(tensor, f"pypto.add({name}, 0.0)", shape)


def _read_again_elementwise(w: Writer, tensor: str) -> bool:
    """Whether a float kernel input is read more than once, each time by an assembled output
    or an elementwise op on its own shape (which can all share one copy in UB)."""
    if is_scalar_constant(tensor, w.constants) or w.dtype(tensor) not in FLOAT_DTYPES:
        return False
    readers = [op for op in w.region.simplified if tensor in op.inputs]
    return sum(op.inputs.count(tensor) for op in readers) >= 2 and all(
        op.outputs[0] in w.assembled
        or (definition(op.op_type).pointwise and w.shape(op.outputs[0]) == w.shape(tensor))
        for op in readers)


def argument_shape(w: Writer, tensor: str) -> tuple[int, ...]:
    # PyPTO has no rank-0 tensors: scalars travel as [1]
    return tuple(w.declared.get(tensor, w.shape(tensor))) or (1,)


def annotation(w: Writer, tensor: str) -> str:
    """A kernel argument's type: ``pypto.Tensor`` of its declared shape and dtype."""
    return f"pypto.Tensor({argument_shape(w, tensor)!r}, {pypto_dtype(w.dtype(tensor))})"


def compute_shape(w: Writer, out: str, inputs) -> tuple[list[int], list]:
    """Where a broadcasting op runs: its output shape, folded when above PyPTO's rank."""
    if w.row is not None:  # nothing broadcasts in a flat region (``flat_row``)
        return w.flat(out), [w.flat(out)] * len(inputs)
    if w.rows is not None:
        return w.rows.shape(out), [w.rows.shape(name) for name in inputs]
    shape = at_least_2d(w.shape(out))
    held = _held_fold(w, shape, inputs)
    if held is not None:
        return held
    if len(shape) <= MAX_RANK:
        return shape, [None] * len(inputs)
    folded, operands = fold_broadcast(shape, [w.shape(n) for n in inputs])
    if len(folded) > MAX_RANK:
        raise CannotExpress(f"rank {len(shape)} broadcast does not fold to {MAX_RANK} axes")
    return folded, operands


def _held_fold(w: Writer, shape: list[int], inputs) -> tuple[list[int], list] | None:
    """Where a broadcasting op runs on the shape a computed operand is held in
    (``held_shape``): that operand's shape when nothing broadcasts, or the folded broadcast
    when it is the held one; None when no operand is held so."""
    tensors = [name for name in inputs if not is_scalar_constant(name, w.constants)]
    aligned = [right_aligned(w.shape(n), len(shape)) for n in tensors]
    for name in tensors:
        held = held_shape(w, name)
        if held is None or len(held) > MAX_RANK:
            continue
        if all(a == shape for a in aligned) and prod(held) == prod(shape):
            return held, [held if n in tensors else None for n in inputs]
        folded, operands = fold_broadcast(shape, [w.shape(n) for n in inputs])
        if operands[list(inputs).index(name)] == held and len(folded) <= MAX_RANK:
            return folded, operands
    return None


def elementwise_shape(w: Writer, tensor: str, source: str | None = None) -> list[int]:
    """An elementwise op runs on any row-major shape of its tensor: the shape its computed
    ``source`` is held in (``held_shape``), else its own with the leading axes folded."""
    if w.row is not None:
        return w.flat(tensor)
    if w.rows is not None:
        return w.rows.shape(tensor)
    held = held_shape(w, source) if source is not None else None
    if held is not None and prod(held) == prod(w.shape(tensor)):
        return held
    return within_rank(at_least_2d(w.shape(tensor)))


def within_rank(shape: Sequence[int]) -> list[int]:
    """``shape`` with its leading axes merged down to PyPTO's rank (the same row-major
    elements)."""
    shape = list(shape)
    return shape if len(shape) <= MAX_RANK else [prod(shape[:-3])] + shape[-3:]


def at_least_2d(shape: Sequence[int]) -> list[int]:
    """A vector (or a scalar) as one row: PyPTO's clip and round take rank 2 to 4 only
    ("shape.size() only support 2~4", FC0000)."""
    return [1] * (2 - len(shape)) + list(shape)


def held_shape(w: Writer, tensor: str) -> list[int] | None:
    """The shape a computed tensor is held in when it differs from its own, else None. An op
    on it runs in that shape where it can: a reshape of a computed tensor can cost PyPTO a GM
    round trip (tf_convnext's layer scale on a [64, 16] product reshaped to [1, 8, 8, 16] and
    back for the transpose to NCHW; docs/pypto-ops.md, "MatMul"). Not in a convolution's
    region: its layout is ``conv_rows``'s choice, and where that keeps the 4-D layout (a Split
    or Concat of the channels) ppocrv4_det's Conv, HardSigmoid and Concat failed to compile
    with its epilogue on the 2-D product (FFFFFF)."""
    if tensor not in w.names or is_scalar_constant(tensor, w.constants) \
            or w.convolution:
        return None
    name, held = w.names[tensor]
    if name.startswith("in") or held == (tuple(w.shape(tensor)) or (1,)):
        return None
    return list(held)


def broadcast_to(w: Writer, tensor: str, shape, own=None) -> str:
    """The tensor broadcast to ``shape``: reshaped to ``own`` (its shape right-aligned to the
    rank of ``shape``, or a folded form of it), then expanded one axis per call."""
    if is_scalar_constant(tensor, w.constants):
        return w.value(tensor)
    shape = list(shape)
    own = list(own) if own is not None else \
        right_aligned(w.shape(tensor), len(shape))
    return w.expand(w.value(tensor, own), own, shape, w.dtype(tensor))
