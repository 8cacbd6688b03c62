"""Row layout: how a region holding reductions runs, as 2-D rows.

Every reduction the compiler fuses reduces trailing axes (``classify``). A region holding
reductions runs on ``[R, C]`` rows: C the product of the reduced axes, R of the kept ones, the
same for every reduction of the region (IREE's reduction dispatches, TVM's kCommReduce root with
its elementwise producers and consumers). Each tensor of the region is then one of

    FULL [R, C]    the data being reduced, and anything elementwise on it
    ROW [R, 1]     a reduction's result (kept dims or not): a mean, a variance, a row maximum
    COLUMN [1, C]  a per-channel parameter: LayerNorm's gamma and beta, an attention mask row
    SCALAR [1, 1]  a one-element tensor
    OWN [Cout, H*W]  a convolution's product on the cube in its own rows, beside the region's
                   (a squeeze-and-excite's projection), and elementwise ops on it
                   (``RowLayout.own``, ``_on_own``)
    OWN_ROW [Cout, 1]  a per-channel parameter of such a product: a bias, or an int8
                   product's dequantising scale and shift (``_per_channel_of_own``)
    EXPANDED [R, C]  a region input broadcast over other axes than the rows' or the columns'
                   alone, expanded in UB to full rows: an attention mask [1, 1, S, S] over
                   [B, H, S, S] scores (``RowLayout.expanded``); or an elementwise op on such
                   inputs alone, computed on them expanded (a precision mode's Cast of the
                   mask, ``_on_expanded``)

so every op is a 2-D op broadcasting along at most one axis, which PyPTO does in place, and every
tile covers whole rows (``docs/pypto-ops.md``, "Reductions": a split reduced axis is 1.5-2x
slower, and in fp16 its partial sums round differently; a 4-D LayerNorm needs two
``expand_clone`` per parameter and is slower than the 2-D one).

``row_layout`` decides whether a program can run so; ``partition`` refuses a merge that would
make a region with a reduction fail it, and the kernel generator lowers such a region in rows.
``conv_rows`` lays a 1x1 convolution's region out on the rows of its product the same way,
where it can (its tiles need not hold whole rows).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from types import MappingProxyType
from typing import Collection, Mapping, Sequence

import numpy as np

from pypto_offline.fusion.records import RegionOp
from pypto_offline.registry.ops import (BROADCAST, ELEMENTWISE, REDUCTION, VIEW, definition,
                                        is_cube_conv, kind_of)

FULL, ROW, COLUMN, SCALAR, EXPANDED, OWN, OWN_ROW = (
    "full", "row", "column", "scalar", "expanded", "own", "own_row")


class NotRows(Exception):
    """The program cannot run as rows (the reason says which op and why)."""


@dataclass(frozen=True)
class RowLayout:
    rows: int
    columns: int
    kinds: Mapping[str, str]  # every tensor of the program → FULL, ROW, COLUMN or SCALAR
    whole_rows: bool = True   # a tile covers whole rows (a reduction's); False: any 2-D tile
    split_columns: bool = False  # a tile may cut a row (channel rows: a row is an image plane)
    # each EXPANDED tensor → the shape it is broadcast to (its reader's output) before it is
    # laid out as rows
    expanded: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # each OWN tensor → its own [Cout, H*W] rows (a convolution's product beside the region's);
    # each OWN_ROW tensor → the rows of the product it is a per-channel parameter of
    own: Mapping[str, tuple[int, int]] = field(default_factory=lambda: MappingProxyType({}))

    def shape(self, tensor: str) -> list[int]:
        kind = self.kinds[tensor]
        if kind == OWN:
            return list(self.own[tensor])
        if kind == OWN_ROW:
            return [self.own[tensor][0], 1]
        return [self.rows if kind in (FULL, ROW, EXPANDED) else 1,
                self.columns if kind in (FULL, COLUMN, EXPANDED) else 1]


def reduces_lone_elements(op: RegionOp, shape: Sequence[int]) -> bool:
    """A reduction over axes of one element that keeps each element as it is: a reshape of its
    input (``rules.reduction_over_one_element``), so no reduction to lay rows out for."""
    axes = op.params.get("axes")
    return definition(op.op_type).as_is_over_one and axes is not None \
        and all(shape[a] == 1 for a in axes)


def has_reduction(ops: Sequence[RegionOp]) -> bool:
    return any(kind_of(op.op_type) == REDUCTION for op in ops)


def trailing_axes(axes: Sequence[int], rank: int) -> bool:
    """Whether ``axes`` are the last ``len(axes)`` axes of a tensor of this rank."""
    return len(axes) > 0 and tuple(axes) == tuple(range(rank - len(axes), rank))


def reduced_rows(op: RegionOp, shape: Sequence[int]) -> tuple[int, int]:
    """The rows and columns a reduction of a tensor of ``shape`` reduces: the kept axes by the
    reduced (trailing) ones; a GroupNormalization's channels split into its groups, each group
    of an image one row."""
    start, groups = op.params["axes"][0], op.params.get("groups", 1)
    return prod(shape[:start]) * groups, prod(shape[start:]) // groups


def row_layout(ops: Sequence[RegionOp], shapes: Mapping[str, Sequence[int]],
               outputs: Collection[str] = ()) -> RowLayout:
    """The rows a program with reductions runs on; ``NotRows`` if it cannot. ``outputs``: the
    tensors read beyond the program, which an op on EXPANDED operands may not write
    (``_on_expanded``)."""
    rows, columns = _rows_and_columns(ops, shapes)
    kinds: dict[str, str] = {}
    expanded: dict[str, tuple[int, ...]] = {}
    sources: dict[str, list[str]] = {}  # an op on EXPANDED operands: its output → its operands
    own: dict[str, tuple[int, int]] = {}
    for op in ops:  # a computed tensor has its producer's kind first
        if definition(op.op_type).convolution:
            _conv_planes(op, shapes, rows, columns, kinds, own)
        elif _on_own(op, shapes, kinds, own, sources):
            continue
        elif not _on_expanded(op, shapes, rows, columns, kinds, sources):
            _assign(op, shapes, rows, columns, kinds, expanded)
    _expand_sources(sources, expanded, outputs)
    return RowLayout(rows, columns, MappingProxyType(kinds),
                     expanded=MappingProxyType(expanded), own=MappingProxyType(own))


def _own_from(name: str, frame: tuple[int, int], shapes, kinds: dict, own: dict,
              sources: dict) -> None:
    """An op on region inputs alone, taken for EXPANDED (``_on_expanded``) until a
    convolution's product in its own rows read it at that product's shape, in those rows
    instead, with its inputs (a precision mode's Cast of the model input that the block's
    residual adds back)."""
    for source in sources.pop(name, []):
        if prod(shapes[source]) != prod(frame):
            raise NotRows(f"{source!r} broadcasts into {name!r}, read in a product's rows")
        _own_from(source, frame, shapes, kinds, own, sources)
    kinds[name], own[name] = OWN, frame


def _on_own(op: RegionOp, shapes, kinds: dict, own: dict, sources: dict) -> bool:
    """An elementwise op or a reshape of a convolution's product in its own rows (OWN): the
    same rows, its other operands of the same shape (read in those rows) or scalars; any other
    op on it: ``NotRows``."""
    held = [name for name in op.inputs if name and kinds.get(name) == OWN]
    if not held:
        return False
    frame = own[held[0]]
    if kind_of(op.op_type, op.params) == VIEW:  # the same elements in the same order
        _set_own(op.outputs[0], frame, kinds, own, op)
        return True
    if not _keeps_shape(op):
        raise NotRows(f"{op.op_type} on a convolution's product in its own rows")
    out_shape = tuple(shapes[op.outputs[0]])
    if prod(out_shape) != prod(frame):
        raise NotRows(f"{op.op_type} broadcasts a convolution's product beyond its rows")
    for name in op.inputs:
        if not name or name in held:
            continue
        size = prod(shapes[name])
        if size == 1:
            _set(kinds, name, SCALAR, op)
        elif name in sources and tuple(shapes[name]) == out_shape:
            _own_from(name, frame, shapes, kinds, own, sources)
        elif tuple(shapes[name]) == out_shape:
            _set_own(name, frame, kinds, own, op)
        elif _per_channel_of_own(shapes[name], out_shape, frame):
            _set(kinds, name, OWN_ROW, op)
            if own.setdefault(name, frame) != frame:
                raise NotRows(f"{name!r} is a parameter of products of {own[name]} and {frame}")
        else:
            raise NotRows(f"{op.op_type} broadcasts {list(shapes[name])} over a convolution's "
                          f"product rows")
    _set_own(op.outputs[0], frame, kinds, own, op)
    return True


def _per_channel_of_own(shape, out_shape, frame: tuple[int, int]) -> bool:
    """Whether a tensor of ``shape`` broadcasts over an op's output in a product's own rows
    one value per row (per output channel): a ``[Cout, 1, 1]`` bias or dequantising scale over
    a ``[1, Cout, H, W]`` convolution's product, laid out as ``[Cout, 1]``. An int8 1x1
    convolution's dequantisation (``importer/quantised.py``) is such a Mul and Add: without it
    an int8 squeeze-and-excite's projection was cut from its block (docs/regions.md)."""
    split = _split(out_shape, frame[0])
    aligned = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return split is not None and len(aligned) == len(out_shape) \
        and aligned[:split] == tuple(out_shape[:split]) and all(d == 1 for d in aligned[split:])


def _keeps_shape(op: RegionOp) -> bool:
    """An elementwise op or an Identity: its output has its (broadcast) operands' shape, which
    an Expand's has not."""
    entry = definition(op.op_type)
    return entry.pointwise and entry.view != "expand"


def _set_own(tensor: str, frame: tuple[int, int], kinds: dict, own: dict, op: RegionOp) -> None:
    _set(kinds, tensor, OWN, op)
    own[tensor] = frame


def _on_expanded(op: RegionOp, shapes, rows: int, columns: int, kinds: dict,
                 sources: dict) -> bool:
    """An elementwise op on region inputs (or on such ops' results) none of whose tensors is
    a row layout: EXPANDED too, computed on its operands expanded to the rows of its reader
    (``_expand_sources``). Under a precision mode an attention mask ``[1, 1, S, S]`` arrives
    fp32 and its Cast to fp16 joins the region: without this the Softmax stayed a kernel of
    its own (issue 37)."""
    if not _keeps_shape(op):
        return False
    operands = [name for name in op.inputs if name and prod(shapes[name]) > 1]
    if not operands or any(name in kinds and name not in sources for name in operands):
        return False
    try:
        _frame_kind(shapes[op.outputs[0]], rows, columns, [], op)
        return False  # laid out as rows as it is
    except NotRows:
        pass
    for name in [*operands, op.outputs[0]]:
        _set(kinds, name, EXPANDED, op)
    for name in op.inputs:  # a Where's two values: before, no kind, and the generator failed
        if name and name not in operands:
            _set(kinds, name, SCALAR, op)
    sources[op.outputs[0]] = operands
    return True


def _expand_sources(sources: dict, expanded: dict, outputs: Collection[str]) -> None:
    """Each operand of an op on EXPANDED operands broadcast to the shape its result is read
    in, the chain back to the region's inputs; ``NotRows`` for a result read beyond the
    program (it would be written in its rows) or read by nothing that broadcasts it."""
    for result in reversed(list(sources)):  # a chain's last op first
        if result in outputs or result not in expanded:
            raise NotRows(f"{result!r} is computed from tensors broadcast across rows and "
                          "read in its own shape")
        for name in sources[result]:
            if expanded.setdefault(name, expanded[result]) != expanded[result]:
                raise NotRows(f"{name!r} is broadcast to {list(expanded[name])} and to "
                              f"{list(expanded[result])}")


def conv_rows(ops: Sequence[RegionOp], shapes: Mapping[str, Sequence[int]]
              ) -> RowLayout | None:
    """The rows of a convolution's region on the cube: its product is ``[Cout, H*W]`` as the
    cube writes it (``codegen.matmul.conv_product``), so its elementwise epilogue runs on those
    rows, a per-channel operand as a ``[Cout, 1]`` row, and the product is reshaped once, at the
    output. Reshaped to 4-D first, PyPTO staged it through GM once more: nudenet's 128x128x400
    Conv with bias and SiLU read 1.30 MB and wrote 1.02 MB in 28.1 us, in rows 0.67 and 0.41 MB
    in 17.7 us (docs/pypto-ops.md, "MatMul"). Any tile fits: nothing reduces a row. None when
    the region holds no convolution, or an op that moves elements across its rows (a Split of
    the channels, a Concat)."""
    convs = [op for op in ops if is_cube_conv(op.op_type, op.params)]
    if len(convs) != 1 or has_reduction(ops):
        return None
    out = tuple(shapes[convs[0].outputs[0]])
    rows, columns = out[1], prod(out[2:])
    kinds: dict[str, str] = {convs[0].outputs[0]: FULL}
    try:
        for op in ops:
            if op is not convs[0]:
                _assign(op, shapes, rows, columns, kinds)
    except NotRows:
        return None
    return RowLayout(rows, columns, MappingProxyType(kinds), whole_rows=False)


def channel_rows(ops: Sequence[RegionOp], shapes: Mapping[str, Sequence[int]]
                 ) -> RowLayout | None:
    """The rows of an elementwise region that broadcasts a per-channel operand (a bias, a
    BatchNorm's scale and shift, a squeeze-and-excite gate) over NCHW tensors: ``[N * C, H * W]``,
    the operand a ``[C, 1]`` row broadcast along one axis, which PyPTO does in place. On the 4-D
    tensors it took two ``expand_clone`` calls, each a full-size tile in UB: ppocrv4_det's
    ConvTranspose bias, BatchNorm affine and ReLU on 1x24x320x320 found no tile within
    kirin9050's UB (the smallest needed 194,592 B). None when the region holds anything but
    elementwise and view ops, or broadcasts nothing per channel."""
    gates = [op for op in ops if _channel_gate(op, shapes)]
    if any(kind_of(op.op_type, op.params) not in (ELEMENTWISE, BROADCAST, VIEW) and op not in gates
           for op in ops):
        return None
    full = max((tuple(shapes[name]) for op in ops for name in op.outputs), key=prod)
    if len(full) < 3:
        return None
    rows, columns = prod(full[:2]), prod(full[2:])
    kinds: dict[str, str] = {}
    try:
        for op in ops:
            if op in gates:  # its product is [C, 1] as the cube writes it: a per-channel row
                _set(kinds, op.outputs[0], ROW if prod(shapes[op.outputs[0]]) == rows
                     else FULL, op)
                continue
            _assign(op, shapes, rows, columns, kinds)
    except NotRows:
        return None
    if ROW not in kinds.values() or rows == columns:
        return None
    return RowLayout(rows, columns, MappingProxyType(kinds), whole_rows=False,
                     split_columns=True)


def _channel_gate(op: RegionOp, shapes) -> bool:
    """A 1x1 convolution of a pooled image (1x1 pixels): a squeeze-and-excite branch's, whose
    product is one value per channel."""
    return is_cube_conv(op.op_type, op.params) and prod(shapes[op.outputs[0]][2:]) == 1


def _rows_and_columns(ops, shapes) -> tuple[int, int]:
    found = set()
    for op in ops:
        if kind_of(op.op_type) == REDUCTION and not reduces_lone_elements(op, shapes[op.inputs[0]]):
            shape = tuple(shapes[op.inputs[0]])
            axes = op.params["axes"]
            if not trailing_axes(axes, len(shape)):
                raise NotRows(f"{op.op_type} reduces axes {list(axes)}, not trailing ones")
            found.add(reduced_rows(op, shape))
    if len(found) != 1:
        raise NotRows("no reduction" if not found else
                      f"reductions over different rows {sorted(found)}")
    rows, columns = found.pop()
    if columns == 1:
        raise NotRows("a reduction over one element")
    return rows, columns


def _set(kinds: dict, tensor: str, kind: str, op: RegionOp) -> None:
    if kinds.setdefault(tensor, kind) != kind:
        raise NotRows(f"{tensor!r} is used as {kinds[tensor]} and as {kind} ({op.op_type})")


def _assign(op: RegionOp, shapes, rows: int, columns: int, kinds: dict,
            expanded: dict | None = None) -> None:
    """The kinds of the op's tensors; ``expanded`` (a reduction's rows only): where an operand
    broadcast across rows may be EXPANDED, recorded with the shape it broadcasts to."""
    kind = kind_of(op.op_type, op.params)
    if kind == REDUCTION and reduces_lone_elements(op, shapes[op.inputs[0]]):
        kind = VIEW  # a reshape
    if kind == REDUCTION:
        _reduction(op, shapes, rows, columns, kinds)
    elif kind == VIEW:  # the same elements in the same order: the same rows
        source = op.inputs[0]
        if source not in kinds:
            _set(kinds, source, _frame_kind(shapes[source], rows, columns, [], op), op)
        _set(kinds, op.outputs[0], kinds[source], op)
    elif definition(op.op_type).pointwise:  # elementwise, or a broadcast (Expand)
        _broadcasting(op, shapes, rows, columns, kinds, expanded)
    else:
        raise NotRows(f"{op.op_type} moves elements across rows")


def _reduction(op: RegionOp, shapes, rows: int, columns: int, kinds: dict) -> None:
    _set(kinds, op.inputs[0], FULL, op)
    # LayerNormalization's scale and bias apply over the columns; an instance's or a group's
    # per row (one image's channels or groups: a batch of several repeats them, which no row
    # holds, nor does a per-channel scale of groups of several channels)
    per_row = definition(op.op_type).per_row_parameters
    for parameter in op.inputs[1:]:
        if parameter:
            size = prod(shapes[parameter])
            _set(kinds, parameter, SCALAR if size == 1 else ROW if per_row else COLUMN, op)
            if size not in (1, rows if per_row else columns):
                raise NotRows(f"{op.op_type} parameter {parameter!r} of {size} elements "
                              f"for {rows} rows of {columns}")
    out_kind = ROW if definition(op.op_type).row_result else FULL
    _set(kinds, op.outputs[0], out_kind, op)


def _conv_planes(op: RegionOp, shapes, rows: int, columns: int, kinds: dict,
                 own: dict) -> None:
    """A convolution of one image writes each output channel's plane: on the cube as its
    ``[Cout, H*W]`` product rows (``codegen.matmul.conv_product``), a depthwise one as its
    channels' planes (``codegen.convolution``), reshaped to rows once. When they are the rows
    of a reduction over each channel's pixels (a squeeze-and-excite's GlobalAveragePool),
    FULL; one pixel per row of them (the excitation's last 1x1 convolution), ROW; any other
    product on the cube keeps its own rows (OWN). Its operands are read as the lowering takes
    them, not laid out as rows."""
    n, filters, *pixels = shapes[op.outputs[0]]
    pixels = prod(pixels)
    if n == 1 and (filters, pixels) == (rows, columns):
        _set(kinds, op.outputs[0], FULL, op)
    elif n == 1 and (filters, pixels) == (rows, 1):
        _set(kinds, op.outputs[0], ROW, op)
    elif n == 1 and is_cube_conv(op.op_type, op.params):
        _set_own(op.outputs[0], (filters, pixels), kinds, own, op)
    else:
        raise NotRows(f"{op.op_type} writes {filters} planes of {pixels} pixels, not the "
                      f"{rows}x{columns} rows of the region's reduction")


def _frame_kind(shape, rows: int, columns: int, known: list[str], op: RegionOp) -> str:
    """The kind of a tensor of this shape, where the sizes alone may be ambiguous (R == C):
    ``known`` are the kinds of the op's operands already placed."""
    size = prod(shape)
    if size == 1:
        return SCALAR
    if size == rows * columns:
        return FULL
    if size == rows and size != columns:
        return ROW
    if size == columns and size != rows:
        return COLUMN
    if size == rows == columns:
        placed = {k for k in known if k in (ROW, COLUMN)}
        if len(placed) == 1:
            return placed.pop()
    raise NotRows(f"{op.op_type} on a {list(shape)} tensor, which is not a row layout of "
                  f"{rows}x{columns}")


def _split(shape, rows: int) -> int | None:
    """The axis where the output's kept axes end: prod(shape[:j]) == rows."""
    for j in range(len(shape) + 1):
        if prod(shape[:j]) == rows:
            return j
    return None


def _broadcasting(op: RegionOp, shapes, rows: int, columns: int, kinds: dict,
                  expanded: dict | None) -> None:
    out = op.outputs[0]
    out_shape = tuple(shapes[out])
    operands = [name for name in op.inputs if name]
    known = [kinds[name] for name in operands if name in kinds]
    out_kind = _frame_kind(out_shape, rows, columns, known, op)
    _set(kinds, out, out_kind, op)
    for name in operands:
        shape = tuple(shapes[name])
        try:
            kind = _operand_kind(shape, out_shape, out_kind, rows, op)
        except NotRows:
            if expanded is None or out_kind != FULL or not broadcasts_to(shape, out_shape):
                raise
            kind = EXPANDED
            if expanded.setdefault(name, out_shape) != out_shape:
                raise NotRows(f"{name!r} is broadcast to {list(expanded[name])} and to "
                              f"{list(out_shape)}") from None
        _set(kinds, name, kind, op)


def broadcasts_to(shape: Sequence[int], out_shape: Sequence[int]) -> bool:
    """Whether ``shape`` broadcasts to ``out_shape`` (numpy's rule)."""
    try:
        return np.broadcast_shapes(tuple(shape), tuple(out_shape)) == tuple(out_shape)
    except ValueError:
        return False


def _operand_kind(shape, out_shape, out_kind: str, rows: int, op: RegionOp) -> str:
    rank = len(out_shape)
    aligned = (1,) * (rank - len(shape)) + shape
    if aligned == out_shape:
        return out_kind
    if prod(shape) == 1:
        return SCALAR
    if out_kind != FULL:  # a ROW or COLUMN result: its operands are the same or scalars
        raise NotRows(f"{op.op_type} broadcasts a {list(shape)} operand within a {out_kind}")
    split = _split(out_shape, rows)
    if split is not None:
        kept, reduced = aligned[:split], aligned[split:]
        if kept == out_shape[:split] and all(d == 1 for d in reduced):
            return ROW
        if all(d == 1 for d in kept) and reduced == out_shape[split:]:
            return COLUMN
    raise NotRows(f"{op.op_type} broadcasts {list(shape)} to {list(out_shape)} across rows")
