"""Lowerings of the ops the cube runs: MatMul and Gemm (2-D, or batched on equal batch axes),
a 1x1 convolution of one image as a matmul, and a region that is one batched MatMul with its
elementwise epilogue written as a loop of 2-D matmuls (``batched_matmul_loop``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import numpy as np

from pypto_offline.fusion.attention import HEADS_SPLIT
from pypto_offline.fusion.records import Region, RegionOp
from pypto_offline.importer.bands import bands_among
from pypto_offline.importer.contractions import INT8_CUBE_DEPTH
from pypto_offline.importer.masks import MASK_OPS, mask_makers
from pypto_offline.registry.ops import is_op, matmul_extents
from pypto_offline.pypto_kernels.folding import right_aligned
from pypto_offline.pypto_kernels.tiling import cube_tiles
from pypto_offline.pypto_kernels.codegen import elementwise, movement, reduction
from pypto_offline.pypto_kernels.codegen.bands import hold_band
from pypto_offline.pypto_kernels.codegen.elementwise import BINARY, UNARY
from pypto_offline.pypto_kernels.codegen.layout import shapes_of
from pypto_offline.pypto_kernels.codegen.writer import (MAX_RANK, CannotExpress, Writer,
                                                        is_scalar_constant, itemsize_of, let,
                                                        pypto_dtype)

# The most 2-D matmuls a batched one unrolls into (``batched_matmul_loop``): each is one cube
# task, and the loop is unrolled when PyPTO traces the kernel.
MAX_UNROLLED_MATMULS = 64
HEADS_OUTWARD = (0, 2, 1, 3)  # [B, H, S, D] -> [B, S, H, D]: attention's heads merged back


def _matmul(w: Writer, op: RegionOp) -> None:
    """A 2-D matmul when the right operand is a matrix (a weight: the left one's leading axes
    fold into M), else a batched one on the operands' own shapes (``importer/canonical.py``
    admits equal batch axes only; PyPTO 0.2.0 fails to compile a matmul of reshaped batched
    operands, docs/pypto-ops.md "MatMul"). A Gemm's ``transB`` is the cube's ``b_trans``. A
    third input is a per-column bias the cube adds as it writes out (a Gemm's C, or
    ``fusion/rules.bias_into_matmul``); the rest of the epilogue runs on vector tiles."""
    left, right, out = op.inputs[0], op.inputs[1], op.outputs[0]
    left_shape, right_shape = list(w.shape(left)), list(w.shape(right))
    rows, n = matmul_extents(op.op_type, list(w.shape(out)), len(right_shape))
    k = left_shape[-1]
    if len(right_shape) == 2:
        shapes = ([rows, k], right_shape, [rows, n])
    else:
        if len(left_shape) > MAX_RANK:
            raise CannotExpress(f"a rank-{len(left_shape)} batched MatMul")
        shapes = (left_shape, right_shape, left_shape[:-1] + [n])
    a, b = w.value(left, shapes[0]), w.value(right, shapes[1])
    bias = len(op.inputs) > 2 and bool(op.inputs[2])
    m_tiles, k_tiles, n_tiles = cube_tiles(rows, k, n, itemsize_of(w.dtype(left)),
                                           w.policy.budget_bytes, bias)
    w.emit(f"pypto.set_cube_tile_shapes({m_tiles}, {k_tiles}, {n_tiles})")
    if len(right_shape) == 2:
        w.product_rows, w.cube_rows = rows, m_tiles[0]
    extra = ", b_trans=True" if op.params.get("transB") else ""
    if bias:
        extra += f", extend_params={{'bias_tensor': {w.value(op.inputs[2], [1, n])}}}"
    w.assign(out, f"pypto.matmul({a}, {b}, {pypto_dtype(w.dtype(out))}{extra})", shapes[2])


def pointwise_conv(w: Writer, op: RegionOp) -> None:
    """A 1x1 convolution of one image as ``W[Cout, Cin] @ x[Cin, H*W]``."""
    image, weights = op.inputs[:2]
    channels = w.shape(image)[1]
    filters, pixels = matmul_extents("Conv", list(w.shape(op.outputs[0])), 2)
    if pixels == 1 and itemsize_of(w.dtype(image)) == 1 and len(op.inputs) == 2:
        _one_pixel_of_bytes(w, op, channels, filters)
        return
    conv_product(w, op, lambda: w.value(weights, [filters, channels]),
                 lambda: w.value(image, [channels, pixels]), channels)


def _one_pixel_of_bytes(w: Writer, op: RegionOp, channels: int, filters: int) -> None:
    """A 1x1 convolution of an 8-bit image of one pixel (a squeeze-and-excite's excitation of
    the pooled channels) as ``x[1, Cin] @ W[Cout, Cin]ᵀ``, its product a ``[1, Cout]`` row:
    as ``W @ x[Cin, 1]`` the image's int8 rows are one byte, and PyPTO 0.2.0 failed to parse
    the kernel (F21004; an 8-bit row must be whole 32-byte blocks). The image is made a row
    where it is quantised (``quantisation._quantize``). Measured: ppocr_cls_v2's excitations
    (32 -> 8 and 16 channels) and the unit model's (32 -> 32), bit-exact (docs/int8.md)."""
    image, weights = op.inputs[:2]
    a, b = w.value(image, [1, channels]), w.value(weights, [filters, channels])
    m_tiles, k_tiles, n_tiles = cube_tiles(1, channels, filters, 1, w.policy.budget_bytes)
    # the transposed int8 weights' side is the fractal's 32 deep too: at 8 or 16 filters
    # (ppocr_cls_v2's squeezes) the tile of cube_tiles failed to parse (F21004), at 32 compiled
    n_tiles = [max(side, INT8_CUBE_DEPTH) for side in n_tiles]
    w.emit(f"pypto.set_cube_tile_shapes({m_tiles}, {k_tiles}, {n_tiles})")
    w.product_rows, w.cube_rows = 1, m_tiles[0]
    w.assign(op.outputs[0], f"pypto.matmul({a}, {b}, {pypto_dtype(w.dtype(op.outputs[0]))}, "
                            "b_trans=True)", [1, filters])


def conv_product(w: Writer, op: RegionOp, weights: Callable[[], str],
                 columns: Callable[[], str], depth: int) -> None:
    """A convolution's output as ``weights[Cout, depth] @ columns[depth, Ho*Wo]`` plus the bias
    as a ``[Cout, 1]`` column: the weights and the image as they are for a 1x1 one, the taps'
    columns (and block-diagonal weights when grouped) for any other (``convolution.py``)."""
    image, out = op.inputs[0], op.outputs[0]
    filters, pixels = matmul_extents("Conv", list(w.shape(out)), 2)
    shape = [filters, pixels]
    a = weights()
    b = columns()
    m_tiles, k_tiles, n_tiles = cube_tiles(filters, depth, pixels,
                                           itemsize_of(w.dtype(image)), w.policy.budget_bytes)
    w.emit(f"pypto.set_cube_tile_shapes({m_tiles}, {k_tiles}, {n_tiles})")
    w.product_rows, w.cube_rows = filters, m_tiles[0]
    value = let(w, f"pypto.matmul({a}, {b}, {pypto_dtype(w.dtype(out))})")
    if len(op.inputs) > 2 and op.inputs[2]:
        bias = w.value(op.inputs[2], [filters, 1])
        w.tile(shape, w.dtype(out))
        value = f"pypto.add({value}, {bias})"
    w.assign(out, value, shape)


# What a batched matmul's loop applies to each slice in UB: PyPTO elementwise calls, and the
# Cast an fp16 mode adds after them
LOOP_EPILOGUE_OPS = frozenset({*UNARY, *BINARY, "Cast"})
# What makes an attention's mask in the loop (``importer.masks.mask_makers``: the reshapes
# among them are one Reshape in a region's program), each op in its own shapes
MASK_LOWERINGS = {**{op: elementwise.LOWERINGS[op] for op in MASK_OPS},
                  "Reshape": movement.LOWERINGS["Reshape"]}


@dataclass(frozen=True)
class BatchedLoop:
    """A region that is one batched MatMul of two region inputs, an elementwise epilogue on
    region inputs and scalars, and the output, maybe with the heads moved behind the rows. An
    attention's core (``fusion.attention.attention_core``) adds a Softmax over the product's
    rows and maybe a second MatMul of the probabilities by a region input (``values``)."""
    matmul: RegionOp
    epilogue: tuple[RegionOp, ...]
    heads_outward: bool
    output: str
    softmax: RegionOp | None = None
    cast: RegionOp | None = None  # the probabilities' to the values' type
    values: RegionOp | None = None
    # each operand whose heads a Transpose in the region splits → that Transpose's input, a
    # [B, S, H, D] projection read a head at a time (``fusion.attention.HEADS_SPLIT``)
    split: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # the ops making an attention's mask from region inputs (``importer.masks.mask_makers``),
    # by each slice: its scores read it as a [rows, columns] matrix (``_make_mask``)
    mask: tuple[RegionOp, ...] = ()


def batched_matmul_loop(region: Region, constants: Mapping[str, np.ndarray]
                        ) -> BatchedLoop | None:
    """The region as a loop of 2-D matmuls, each slice's epilogue (elementwise ops and the
    Casts an fp16 mode adds: without them llama's mixed-precision attention scores were one
    4-D matmul, 12.0 us against fp32's loop, 7.7) applied in UB and the result assembled at
    its place in the output, or None. As one 4-D matmul, PyPTO wrote the product
    to GM and read it back for the epilogue or the transpose: tf_swin's attention (16 windows x
    2 heads of 16x16x16 fp32) times V then the heads moved behind the rows read 131,072 B and
    wrote 98,304 in 17.6 us; as 32 matmuls assembled, the lower bound's 65,536 and 32,768 in
    7.6 us (docs/pypto-ops.md, "MatMul")."""
    ops = list(region.simplified)
    shapes = shapes_of(region)
    split = {}
    while ops and is_op(ops[0], "Transpose") and ops[0].inputs[0] in region.inputs \
            and tuple(ops[0].params["perm"]) in HEADS_SPLIT.values():
        transpose = ops.pop(0)
        split[transpose.outputs[0]] = transpose
    mask = mask_makers(ops, region.inputs.__contains__)
    ops = [op for op in ops if op not in mask]
    whole = {t for op in mask for t in op.outputs} | set(bands_among(region.inputs, constants))
    if not ops or not is_op(ops[0], "MatMul") or len(ops[0].inputs) != 2 \
            or not all(t in region.inputs or t in split for t in ops[0].inputs) \
            or not _split_as(split, ops[0].inputs, ("q", "kt")):
        return None
    left, right = (shapes[t] for t in ops[0].inputs)
    batch = left[:-2]
    if len(left) < 3 or len(right) != len(left) or right[:-2] != batch \
            or not 2 <= prod(batch) <= MAX_UNROLLED_MATMULS:
        return None
    current, product_shape, epilogue = ops[0].outputs[0], shapes[ops[0].outputs[0]], []
    rest = ops[1:]
    while rest and is_op(rest[0], LOOP_EPILOGUE_OPS):
        op = rest.pop(0)
        others = [t for t in op.inputs if t != current]
        if op.inputs.count(current) != 1 or shapes[op.outputs[0]] != product_shape or not all(
                is_scalar_constant(t, constants) or (
                    t in region.inputs and _slices_along(shapes[t], product_shape))
                or (t in whole and _one_matrix(shapes[t], product_shape))
                for t in others):
            return None
        epilogue.append(op)
        current = op.outputs[0]
    softmax = cast = values = None
    if _reads_next(rest, "Softmax", current) \
            and tuple(rest[0].params["axes"]) == (len(product_shape) - 1,):
        softmax = rest.pop(0)
        current = softmax.outputs[0]
        if _reads_next(rest, "Cast", current):
            cast = rest.pop(0)  # to the values' type, in a mixed precision mode
            current = cast.outputs[0]
        if rest and _values_of(rest[0], current, region, shapes, split):
            values = rest.pop(0)
            current = values.outputs[0]
    heads_outward = _reads_next(rest, "Transpose", current) \
        and tuple(rest[0].params["perm"]) == HEADS_OUTWARD
    if heads_outward:
        current = rest.pop(0).outputs[0]
    if _reads_next(rest, "Reshape", current):
        current = rest.pop(0).outputs[0]
    if rest or list(region.outputs) != [current]:
        return None
    if (cast is not None and values is None) or (split and softmax is None) \
            or set(split) - {*ops[0].inputs, *(values.inputs[1:] if values else ())}:
        return None
    return BatchedLoop(ops[0], tuple(epilogue), heads_outward, current, softmax, cast, values,
                       MappingProxyType({t: op.inputs[0] for t, op in split.items()}),
                       tuple(mask))


def _reads_next(rest: Sequence[RegionOp], op_type: str, current: str) -> bool:
    """Whether the next op of the loop's program is ``op_type`` reading ``current`` first."""
    return bool(rest) and is_op(rest[0], op_type) and rest[0].inputs[0] == current


def _one_matrix(shape: Sequence[int], product: Sequence[int]) -> bool:
    """Whether an operand is one ``[rows, columns]`` matrix for every slice of the product."""
    return _slices_along(shape, product) and prod(shape[:-2]) == 1


def _split_as(split: Mapping[str, RegionOp], operands: Sequence[str], roles: Sequence[str]
              ) -> bool:
    """Whether each operand a Transpose splits is split as its role wants (``HEADS_SPLIT``)."""
    return all(tuple(split[t].params["perm"]) == HEADS_SPLIT[role]
               for t, role in zip(operands, roles) if t in split)


def _values_of(op: RegionOp, probabilities: str, region: Region, shapes,
               split: Mapping[str, RegionOp]) -> bool:
    """Whether ``op`` multiplies the probabilities by a region input of the same batch axes
    (an attention's V, or its heads split in the region), 2-D slice by slice."""
    if not is_op(op, "MatMul") or op.inputs[0] != probabilities or not (
            op.inputs[1] in region.inputs or _split_as(split, op.inputs[1:], ("v",))
            and op.inputs[1] in split):
        return False
    left, right = shapes[probabilities], shapes[op.inputs[1]]
    return len(right) == len(left) and right[:-1] == left[:-2] + left[-1:]


def _slices_along(shape: Sequence[int], product: Sequence[int]) -> bool:
    """Whether an epilogue operand broadcasts to the product with whole or unit batch axes and
    a [rows, columns] slice of unit or whole extents (and so has a 2-D slice per matmul)."""
    if len(shape) > len(product):
        return False
    return all(have in (1, want) for have, want in zip(right_aligned(shape, len(product)),
                                                        product))


def lower_batched_loop(w: Writer, loop: BatchedLoop, inputs: Mapping[str, str],
                       target: str) -> None:
    """``batched_matmul_loop``'s region: its operands and output declared as 2-D rows, one
    2-D matmul per batch index on views, the epilogue lowered on the slice, each result
    assembled into the output."""
    (left, right), product = loop.matmul.inputs, loop.matmul.outputs[0]
    *batch, m, k = w.shape(left)
    n = w.shape(right)[-1]
    count = prod(batch)
    columns = w.shape(loop.values.inputs[1])[-1] if loop.values else n  # of each slice's result
    for tensor, rows in ((left, m), (right, k)) + (
            ((loop.values.inputs[1], n),) if loop.values else ()):
        _declare_operand(w, loop, tensor, rows)
    heads = batch[-1] if loop.heads_outward else 1
    w.declared[loop.output] = (count // heads * m, heads * columns)
    operands = {t for op in loop.epilogue for t in op.inputs
                if t in inputs and t != product and not is_scalar_constant(t, w.constants)}
    for tensor in sorted(operands):
        own = w.shape(tensor)
        w.declared[tensor] = (prod(own[:-1]), own[-1])
    cube = _cube_tiles_line(w, m, k, n, left)
    if not loop.values:  # one product: its tiles once, before the loop
        w.emit(cube)
    indexes = [f"b{axis}" if extent > 1 else "0" for axis, extent in enumerate(batch)]
    loops = [(index, extent) for index, extent in zip(indexes, batch) if extent > 1]
    for index, extent in loops:
        w.emit(f"for {index} in range({extent}):")
        w.indent += 1
    slice_index = _flat_index(indexes, batch)
    a = _operand_slice(w, loop, left, inputs, (m, k), indexes, slice_index)
    b = _operand_slice(w, loop, right, inputs, (k, n), indexes, slice_index)
    w.sliced[product] = (m, n)
    if loop.values:  # two products of other shapes: each one's tiles before it
        w.emit(cube)
    transposed = ", b_trans=True" if right in loop.split else ""  # Kᵀ as K's [S, D] head
    w.assign(product, f"pypto.matmul({a}, {b}, {pypto_dtype(w.dtype(product))}{transposed})",
             (m, n))
    for tensor in sorted(operands):
        _hold_slice(w, tensor, inputs[tensor], indexes, batch)
    _make_mask(w, loop)
    for op in loop.epilogue:  # LOOP_EPILOGUE_OPS only (``batched_matmul_loop``)
        w.sliced[op.outputs[0]] = (m, n)
        elementwise.LOWERINGS[op.op_type](w, op)
    last = loop.epilogue[-1].outputs[0] if loop.epilogue else product
    if loop.softmax:
        last = _softmax_of_slice(w, loop.softmax, m, n)
    if loop.cast:
        w.sliced[loop.cast.outputs[0]] = (m, n)
        elementwise.LOWERINGS["Cast"](w, loop.cast)
        last = loop.cast.outputs[0]
    if loop.values:
        last = _values_product(w, loop, inputs, (indexes, slice_index), m, n, columns)
    result = w.value(last, (m, columns))
    if loop.heads_outward:
        offsets = f"[{_flat_index(indexes[:-1], batch[:-1])} * {m}, {indexes[-1]} * {columns}]"
    else:
        offsets = f"[{slice_index} * {m}, 0]"
    w.tile((m, columns), w.dtype(last))
    w.emit(f"pypto.assemble({result}, {offsets}, {target})")
    w.indent -= len(loops)


def _make_mask(w: Writer, loop: BatchedLoop) -> None:
    """The region's bands and mask, made by each slice in their own shapes, and what the
    slice's epilogue reads of them held as its ``[rows, columns]`` matrix. Made once before
    the loop, PyPTO 0.2.0 staged them through GM for the loop's vector ops (GPT-2's core:
    15,632 B moved and 14.3 us against 14,400 B and 13.3 us made per head; BERT's 37,920 B and
    15.3 us against 32,896 and 13.3: its inputs, its output and the cube's hand-off, no mask;
    docs/regions.md, "Masks made in the kernel")."""
    for tensor, band in w.bands.items():
        hold_band(w, tensor, band)
    made = set(w.bands)
    for op in loop.mask:
        lowering = MASK_LOWERINGS.get(op.op_type)
        if lowering is None:
            raise CannotExpress(f"{op.op_type} making an attention's mask")
        lowering(w, op)
        made.update(op.outputs)
    for tensor in sorted(made & {t for op in loop.epilogue for t in op.inputs}):
        matrix = tuple(w.shape(tensor)[-2:])
        name = w.value(tensor, matrix)
        w.sliced[tensor] = matrix
        w.hold(tensor, name, matrix)


def _cube_tiles_line(w: Writer, m: int, k: int, n: int, left: str) -> str:
    m_tiles, k_tiles, n_tiles = cube_tiles(m, k, n, itemsize_of(w.dtype(left)),
                                           w.policy.budget_bytes)
    return f"pypto.set_cube_tile_shapes({m_tiles}, {k_tiles}, {n_tiles})"


def _softmax_of_slice(w: Writer, op: RegionOp, m: int, n: int) -> str:
    """The Softmax of one head's ``[m, n]`` scores, lowered as a row region's (each row whole
    in the tile, ``codegen.reduction``): the slice is the rows."""
    w.sliced[op.outputs[0]] = (m, n)
    reduction.lower_as_rows(w, op, m, n)
    return op.outputs[0]


def _values_product(w: Writer, loop: BatchedLoop, inputs: Mapping[str, str], where,
                    m: int, n: int, columns: int) -> str:
    """One head's probabilities ``[m, n]`` by its values ``[n, columns]``, a view of the
    region input declared as 2-D rows (``where``: the loop's indexes and slice index)."""
    op = loop.values
    probabilities, values = op.inputs
    out = op.outputs[0]
    view = _operand_slice(w, loop, values, inputs, (n, columns), *where)
    w.emit(_cube_tiles_line(w, m, n, columns, probabilities))
    w.sliced[out] = (m, columns)
    w.assign(out, f"pypto.matmul({w.value(probabilities, (m, n))}, {view}, "
                  f"{pypto_dtype(w.dtype(out))})", (m, columns))
    return out


def _declare_operand(w: Writer, loop: BatchedLoop, tensor: str, rows: int) -> None:
    """A product's operand declared as 2-D rows: its slices stacked, ``[count * rows, cols]``;
    a projection whose heads the region splits as its own ``[B * S, H * D]`` rows."""
    if tensor in loop.split:
        tokens, projection = loop.split[tensor], w.shape(loop.split[tensor])
        w.declared[tokens] = (prod(projection[:2]), prod(projection[2:]))
        return
    shape = w.shape(tensor)
    w.declared[tensor] = (prod(shape[:-2]) * rows, shape[-1])


def _operand_slice(w: Writer, loop: BatchedLoop, tensor: str, inputs: Mapping[str, str],
                   shape: tuple[int, int], indexes: Sequence[str], slice_index: str) -> str:
    """The variable of one slice of a product's operand: rows of the stacked slices, or head
    ``h`` of batch ``b`` of a projection the region splits, its ``[S, D]`` block at
    ``[b * S, h * D]`` (for Kᵀ the block of K, multiplied transposed)."""
    view = w.fresh()
    if tensor in loop.split:
        _, tokens, _, depth = w.shape(loop.split[tensor])
        batch, head = indexes[-2:]
        w.emit(f"{view} = pypto.view({inputs[loop.split[tensor]]}, [{tokens}, {depth}], "
               f"[{batch} * {tokens}, {head} * {depth}])")
    else:
        w.emit(f"{view} = pypto.view({inputs[tensor]}, {list(shape)}, "
               f"[{slice_index} * {shape[0]}, 0])")
    return view


def _flat_index(indexes: Sequence[str], extents: Sequence[int]) -> str:
    """The row-major position of a batch index as an expression of the loop variables."""
    terms = [f"{index} * {prod(extents[axis + 1:])}" if prod(extents[axis + 1:]) > 1 else index
             for axis, index in enumerate(indexes) if index != "0"]
    return f"({' + '.join(terms)})" if terms else "0"


def _hold_slice(w: Writer, tensor: str, argument: str, indexes, batch) -> None:
    """An epilogue operand's 2-D slice for the loop's batch index (a unit batch axis of the
    operand stays at 0: the slice broadcasts)."""
    own = right_aligned(w.shape(tensor), len(batch) + 2)
    used = [index if extent > 1 else "0" for index, extent in zip(indexes, own[:-2])]
    rows, columns = own[-2:]
    w.sliced[tensor] = (rows, columns)
    if prod(own[:-2]) == 1:  # the whole operand, declared as its 2-D slice
        w.hold(tensor, argument, (rows, columns))
        return
    name = w.fresh()
    w.emit(f"{name} = pypto.view({argument}, [{rows}, {columns}], "
           f"[{_flat_index(used, own[:-2])} * {rows}, 0])")
    w.hold(tensor, name, (rows, columns))


LOWERINGS: dict[str, Callable[[Writer, RegionOp], None]] = {
    "MatMul": _matmul, "Gemm": _matmul, "MatMulInteger": _matmul,
}
