"""A region's simplified program → a readable PyPTO Tensor-mode module.

One ``@pypto.frontend.jit`` kernel per region: region inputs then outputs as typed
``pypto.Tensor`` arguments, one statement per op, ``out[:] = value`` for each output. It keeps within
PyPTO 0.2.0's limits (docs/pypto-ops.md):
- pads on any side and with any value as ``concat`` with ``full`` blocks;
- transposes as chains of axis swaps;
- broadcasts as ``expand_clone`` one axis at a time;
- casts to integers with ``CAST_TRUNC`` (ONNX rounds toward zero);
- strided slices through ``index_select``;
- constant Gathers as views concatenated in a plain ``for`` loop (no comprehension: the parser
  refuses them);
- a vector tile set before every op, from the tiling policy;
- a view (Split, Slice, crop) copied with ``clone`` before it is reshaped: PyPTO's SplitReshape
  pass takes minutes on a reshaped view (docs/compile-time.md, "Reshaped views").
A pattern outside these limits raises ``CannotExpress`` and the region falls back to unfused ops.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from math import prod
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.fusion.classify import BYTE_INTEGERS, FLOAT_DTYPES, HALF_DTYPES, kernel_dtype
from pypto_offline.fusion.records import Region, RegionOp
from pypto_offline.fusion.rules import DECOMPOSED
from pypto_offline.fusion.rows import (NotRows, RowLayout, channel_rows, conv_rows, has_reduction,
                                       row_layout)
from pypto_offline.importer.ops import POINTWISE_OPS, VIEW_ONLY_OPS, matmul_extents
from pypto_offline.pypto_kernels import activations
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.folding import fold_broadcast, fold_transpose, right_aligned
from pypto_offline.pypto_kernels.tiling import BLOCK_BYTES, TilePolicy, cube_tiles

PYPTO_DTYPES = {
    onnx.TensorProto.FLOAT: "pypto.DT_FP32", onnx.TensorProto.FLOAT16: "pypto.DT_FP16",
    onnx.TensorProto.BFLOAT16: "pypto.DT_BF16", onnx.TensorProto.INT32: "pypto.DT_INT32",
    onnx.TensorProto.INT64: "pypto.DT_INT64", onnx.TensorProto.INT8: "pypto.DT_INT8",
    onnx.TensorProto.UINT8: "pypto.DT_UINT8", onnx.TensorProto.INT16: "pypto.DT_INT16",
    onnx.TensorProto.BOOL: "pypto.DT_BOOL",
}
UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Exp": "exp", "Neg": "neg", "Abs": "abs",
         "Sqrt": "sqrt", "Log": "log", "Not": "logical_not"}
# Xor of bools is their inequality; PyPTO's bitwise ops do not compile (docs/pypto-ops.md)
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "maximum",
          "Min": "minimum", "Sum": "add", "And": "logical_and", "Xor": "ne"}
COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "And", "Xor"})
# The largest finite value of each float type: IsInf's bound
FINITE_MAX = {onnx.TensorProto.FLOAT: 3.4028234663852886e38, onnx.TensorProto.FLOAT16: 65504.0,
              onnx.TensorProto.BFLOAT16: 3.3895313892515355e38}
# A comparison as (PyPTO compare, negated?) and the op that reads its operands swapped; PyPTO has
# eq, lt and gt, and logical_not (each checked in fp32 and int32, docs/pypto-ops.md).
COMPARISONS = {"Equal": ("eq", False, "Equal"), "Less": ("lt", False, "Greater"),
               "Greater": ("gt", False, "Less"), "LessOrEqual": ("gt", True, "GreaterOrEqual"),
               "GreaterOrEqual": ("lt", True, "LessOrEqual")}
# Ops that map element i of their inputs to element i of their output, whatever the layout.
FLAT_OPS = (POINTWISE_OPS - {"Expand"}) | {"Reshape", "Identity"}
# The row length hardly matters (256 B to 2 KiB rows gave the same tasks and times on nudenet's
# 1x128x10x10 SiLU); what pays is that no row pads.
FLAT_ROW_BYTES = 512
MAX_CONCAT_INPUTS = 128  # PyPTO's documented limit for one concat
# The passes whose lowered graph pass-verify interprets and compares with the tensor graph, besides
# the tensor graph itself (compared with onnxruntime's result): the last one before codegen, so
# the check spans the whole pipeline end to end. PyPTO's default also checks five intermediate
# passes, which only tell which pass broke and cost most of a checked compile (ppocrv4_det's
# 1x16x320x320 HardSwish region: 24 s with all passes, 9-14 s with this one, 3 s for the tensor
# graph alone). docs/compile-time.md.
VERIFIED_PASSES = ("CodegenPreproc",)
FLT_MAX = 3.4028234663852886e38


class CannotExpress(Exception):
    """The region uses a pattern the generator cannot write in PyPTO 0.2.0."""


# Every kernel's function has this one name, so that two regions doing the same work give the
# same module text: one cache entry and one compile for both (IREE's dispatch deduplication).
KERNEL_FUNCTION = "kernel"
# The module constant listing every argument's shape when some argument is declared in a shape
# other than its tensor's (``_Writer.declared``): the worker passes the same elements viewed so.
ARGUMENT_SHAPES = "ARGUMENT_SHAPES"
MAX_RANK = 4  # PyPTO 0.2.0's code generation: "exceed dimension limit" above this


@dataclass
class _Writer:
    """Emits the kernel body. Every tensor is a variable holding its elements in row-major order
    under some shape (its own, or a folded one); ``value`` reshapes on demand, so a rank-5/6
    tensor that only feeds folded ops is never created in the kernel."""

    region: Region
    policy: TilePolicy
    constants: Mapping[str, np.ndarray]
    lines: list[str] = field(default_factory=list)
    names: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    _reshaped: dict[tuple[str, tuple[int, ...]], str] = field(default_factory=dict)
    # Variables that are views of another variable (``view``), and their copies (``_owned``).
    _views: set[str] = field(default_factory=set)
    _copies: dict[str, str] = field(default_factory=dict)
    # Region outputs a Concat writes part by part (``assembled_outputs``): tensor -> argument.
    assembled: dict[str, str] = field(default_factory=dict)
    # Region inputs and outputs whose kernel argument is declared in another shape of the same
    # elements (a batched matmul's operands as 2-D rows: ``_batched_matmul_loop``).
    declared: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Tensors held per slice inside a loop (``_batched_matmul_loop``): the slice's shape.
    sliced: dict[str, tuple[int, ...]] = field(default_factory=dict)
    indent: int = 1
    # The tile a transpose's result was made under, and the ops that follow it (``follow``).
    tiles: dict[str, tuple[int, ...]] = field(default_factory=dict)
    current_tile: tuple[int, ...] | None = None
    _following: bool = False  # the current tile is a transpose result's (``follow``)
    # A 2-D matmul's product rows and the cube's M tile over them (``_rows_within_cube_tile``).
    product_rows: int | None = None
    cube_rows: int | None = None
    _count: int = 0
    # The row length, in elements, of a purely elementwise region the policy lays out in rows
    # (``flat_row``); None: each op runs on its own (rank-folded) shape. All its tensors have
    # the same element count.
    row: int | None = None
    # The rows a region with reductions runs on (``fusion/rows.py``); None: it has none.
    rows: RowLayout | None = None

    @cached_property
    def convolution(self) -> bool:
        """Whether the region holds a 1x1 convolution (``has_convolution``), asked per op."""
        return has_convolution(self.region)

    def flat(self, tensor: str) -> list[int]:
        """The tensor as rows of ``row`` elements."""
        return [prod(self.shape(tensor)) // self.row, self.row]

    def shape(self, tensor: str) -> tuple[int, ...]:
        if tensor in self.sliced:
            return self.sliced[tensor]
        return tuple(self.region.tensor_types[tensor][0])

    def dtype(self, tensor: str) -> int:
        """The element type the kernel holds the tensor in (``classify.kernel_dtype``)."""
        return kernel_dtype(self.region.tensor_types[tensor][1])

    def value(self, tensor: str, as_shape: Sequence[int] | None = None) -> str:
        """The tensor as a variable of shape ``as_shape`` (default: its own shape)."""
        if tensor not in self.names:
            raise CannotExpress(f"tensor {tensor!r} is used before it is computed")
        name, held = self.names[tensor]
        wanted = tuple(as_shape) if as_shape is not None else self.shape(tensor)
        wanted = wanted or (1,)
        if held == wanted or is_scalar_constant(tensor, self.constants):
            return name
        if len(wanted) > MAX_RANK:
            raise CannotExpress(f"rank {len(wanted)} of {tensor!r} exceeds PyPTO's {MAX_RANK}")
        key = (name, wanted)
        if key not in self._reshaped:
            source = self._owned(name, held, self.dtype(tensor))
            self.tile(wanted, self.dtype(tensor))
            self._reshaped[key] = self.fresh()
            self.emit(f"{self._reshaped[key]} = pypto.reshape({source}, {list(wanted)})")
        return self._reshaped[key]

    def _owned(self, name: str, shape: tuple[int, ...], dtype: int) -> str:
        """``name``, or a copy of it when it is a view. PyPTO 0.2.0's SplitReshape pass moves a
        reshaped view one element at a time (a COPY_IN and a COPY_OUT each): compile time and
        program size grow with its elements, and nudenet's YOLO head (a 1x64x2100 Split output
        reshaped to 1x4x16x2100) never compiled within 300 s; 3 s with the copy, which costs
        one UB copy per tile. docs/compile-time.md, "Reshaped views"."""
        if name not in self._views:
            return name
        if name not in self._copies:
            self.tile(shape, dtype)
            self._copies[name] = self.fresh()
            self.emit(f"{self._copies[name]} = pypto.clone({name})")
        return self._copies[name]

    def view(self, tensor: str, expression: str, shape: Sequence[int] | None = None) -> str:
        """Like ``assign``, for an expression that is a view of another variable."""
        name = self.assign(tensor, expression, shape)
        self._views.add(name)
        return name

    def var(self, tensor: str) -> str:
        return self.value(tensor)

    def hold(self, tensor: str, name: str, shape: Sequence[int]) -> None:
        """``tensor``'s elements are in variable ``name`` under ``shape``."""
        self.names[tensor] = (name, tuple(shape) or (1,))

    def fresh(self) -> str:
        self._count += 1
        return f"t{self._count}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def tile(self, shape, dtype: int, whole_axes=()) -> None:
        if self.rows is not None and self.rows.whole_rows and len(shape) == 2:
            # one tile of whole rows for every op of a row region, the reduced results
            # included: a reduction never splits its axis (fusion/rows.py)
            shape, whole_axes = (self.rows.rows, self.rows.columns), (1,)
        split = self.rows is not None and self.rows.split_columns and len(shape) == 2
        tile = self.policy.tile(tuple(shape), itemsize_of(dtype), tuple(whole_axes), split)
        self._set_tile(_rows_within_cube_tile(self, tuple(shape), tile))

    def _set_tile(self, tile: tuple[int, ...]) -> None:
        self.current_tile, self._following = tuple(tile), False
        self.emit(f"pypto.set_vec_tile_shapes({', '.join(map(str, tile))})")

    def follow(self, shape, dtype: int, tensors: Sequence[str]) -> None:
        """The tile for an op on ``shape``: the one a transpose's result among ``tensors`` was
        made under, held in that shape, else the policy's. PyPTO tiles a transpose over its
        input, so its result comes in the input's tile swapped; an op after it under any other
        tile made PyPTO stage the result through GM (a [64, 400] fp32 transpose then an add:
        167,936 B read under the own tile, 102,400 under the swapped one; docs/pypto-ops.md,
        "Transposes")."""
        for tensor in tensors:
            name, held = self.names.get(tensor, ("", ()))
            tile = self.tiles.get(name)
            if tile is not None and held == tuple(shape) and len(tile) == len(shape):
                self._set_tile(tile)
                self._following = True
                return
        self.tile(shape, dtype)

    def assign(self, tensor: str, expression: str, shape: Sequence[int] | None = None) -> str:
        name = self.fresh()
        self.emit(f"{name} = {expression}")
        self.hold(tensor, name, self.shape(tensor) if shape is None else shape)
        if self._following:  # its result comes in the same tile: whoever reads it follows too
            self.tiles[name] = self.current_tile
        return name


def _rows_within_cube_tile(w: _Writer, shape: tuple[int, ...], tile: tuple[int, ...]
                           ) -> tuple[int, ...]:
    """A vector tile over a matmul's product rows, with its rows dividing the cube's M tile: a
    vector tile across two cube tiles made PyPTO stage the product through GM once more
    (ppocrv4_det's 384x192x400 fp32 Conv with HardSwish, cube M tile 192: 2,723,072 B read and
    2,451,200 written under vector tiles of 10 rows, 2,115,072 and 1,228,800, the platform
    bound, under 8 or 16; docs/pypto-ops.md, "MatMul")."""
    if w.cube_rows is None or len(shape) != 2 or shape[0] != w.product_rows \
            or tile[0] >= shape[0] or w.cube_rows % tile[0] == 0:
        return tile
    rows = next(d for d in range(min(tile[0], w.cube_rows), 0, -1) if w.cube_rows % d == 0)
    return (rows, *tile[1:])


def _conv_rows(region: Region, policy: TilePolicy) -> RowLayout | None:
    """A 1x1 convolution's product rows (``fusion/rows.conv_rows``), cut along the row where one
    row is larger than the candidate's budget, as channel rows are: whole, ppocrv4_det's
    32->48 and 48->48 Convs (with bias and HardSwish) on 160x160 images took vector tiles of
    one 25,600-element fp32 row (100 KiB, with the epilogue's beyond UB), and PyPTO's parser
    failed them (FFFFFF); cut, both compile and pass the check."""
    rows = conv_rows(region.simplified, _shapes(region))
    if rows is None:
        return None
    product = next(op.outputs[0] for op in region.simplified if op.op_type == "Conv")
    if rows.columns * itemsize_of(region.tensor_types[product][1]) > policy.budget_bytes:
        return replace(rows, split_columns=True)
    return rows


def itemsize_of(dtype: int) -> int:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype)).itemsize


def pypto_dtype(dtype: int) -> str:
    if dtype not in PYPTO_DTYPES:
        raise CannotExpress(f"no PyPTO dtype for ONNX type {onnx.TensorProto.DataType.Name(dtype)}")
    return PYPTO_DTYPES[dtype]


def kernel_source(region: Region, policy: TilePolicy, constants: Mapping[str, np.ndarray]) -> str:
    """The module text; ``constants`` are region inputs known at compile time (inlined if scalar)."""
    w = _Writer(region, policy, constants)
    if policy.flat_rows:
        w.row = flat_row(region, constants)
    if has_reduction(region.simplified):
        w.rows = _row_layout(region)
    else:
        w.rows = _conv_rows(region, policy) or channel_rows(region.simplified, _shapes(region))
    if w.rows is not None and w.rows.split_columns:  # channel rows: the arguments are rows
        w.declared.update({tensor: tuple(w.rows.shape(tensor))  # (a convolution's own
                           for tensor in region.inputs + region.outputs  # operands are not)
                           if tensor in w.rows.kinds
                           and not is_scalar_constant(tensor, constants)})
    inputs = {}
    for index, tensor in enumerate(region.inputs):
        if is_scalar_constant(tensor, constants):
            w.hold(tensor, float_literal(np.asarray(constants[tensor]).reshape(-1)[0]), ())
            continue
        inputs[tensor] = f"in{index}"
        w.hold(tensor, f"in{index}", w.declared.get(tensor, w.shape(tensor)))
    outputs = {tensor: f"out{index}" for index, tensor in enumerate(region.outputs)}
    w.assembled = assembled_outputs(region)
    _share_assembled_inputs(w)
    loop = batched_matmul_loop(region, constants)
    if loop is not None:
        _batched_matmul_loop(w, loop, inputs, outputs[loop.output])
    else:
        _lower_program(w, outputs)
    arguments = [f"{name}: {_annotation(w, tensor)}"
                 for tensor, name in [*inputs.items(), *outputs.items()]]
    header = [
        f'"""PyPTO kernel: {", ".join(op.op_type for op in region.original)}.',
        "",
        "Generated by pypto-offline; tiles chosen by its tiling policy. Compiled in SIM run mode",
        'for the Ascend 910B platform (the only one PyPTO 0.2.0 ships)."""',
        "import os",
        "",
        "import pypto",
        "",
        "VERIFY = {\"enable_pass_verify\": os.environ.get(\"PYPTO_OFFLINE_VERIFY_DIR\") is not None,",
        f"          \"pass_verify_pass_filter\": {list(VERIFIED_PASSES)!r},",
        "          \"pass_verify_save_tensor_dir\": os.environ.get(\"PYPTO_OFFLINE_VERIFY_DIR\", \"\")}",
    ]
    if w.declared:
        shapes = [_argument_shape(w, tensor) for tensor in [*inputs, *outputs]]
        header.append(f"{ARGUMENT_SHAPES} = {shapes!r}")
    header += [
        "",
        "",
        "@pypto.frontend.jit(runtime_options={\"run_mode\": pypto.RunMode.SIM}, verify_options=VERIFY)",
        f"def {KERNEL_FUNCTION}({', '.join(arguments)}):",
    ]
    merge = [f"    pypto.set_pass_options(vec_nbuffer_setting={{-1: {policy.vec_merge}}})"] \
        if policy.vec_merge else []
    return "\n".join(header + merge + w.lines) + "\n"


def _lower_program(w: _Writer, outputs: Mapping[str, str]) -> None:
    """One statement per op, then ``out[:] = value`` for each output not assembled already."""
    for op in w.region.simplified:
        _lower(w, op)
    for tensor, name in outputs.items():
        if tensor in w.assembled:
            continue
        value = _as_tensor(w, tensor)
        w.follow(_argument_shape(w, tensor), w.dtype(tensor), [tensor])
        w.emit(f"{name}[:] = {value}")


def has_convolution(region: Region) -> bool:
    return any(op.op_type == "Conv" for op in region.simplified)


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
            if op.op_type == "Concat" and op.outputs[0] in arguments
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


def _share_assembled_inputs(w: _Writer) -> None:
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


def _read_again_elementwise(w: _Writer, tensor: str) -> bool:
    """Whether a float kernel input is read more than once, each time by an assembled output
    or an elementwise op on its own shape (which can all share one copy in UB)."""
    if is_scalar_constant(tensor, w.constants) or w.dtype(tensor) not in FLOAT_DTYPES:
        return False
    readers = [op for op in w.region.simplified if tensor in op.inputs]
    return sum(op.inputs.count(tensor) for op in readers) >= 2 and all(
        op.outputs[0] in w.assembled
        or (op.op_type in POINTWISE_OPS and w.shape(op.outputs[0]) == w.shape(tensor))
        for op in readers)


def _shapes(region: Region) -> dict[str, tuple[int, ...]]:
    return {tensor: shape for tensor, (shape, _) in region.tensor_types.items()}


def _row_layout(region: Region) -> RowLayout:
    try:
        return row_layout(region.simplified, _shapes(region))
    except NotRows as why:
        raise CannotExpress(f"a reduction region that does not run as rows: {why}") from None


def flat_row(region: Region, constants: Mapping[str, np.ndarray]) -> int | None:
    """The row length (elements, ``FLAT_ROW_BYTES`` at most, 32-byte aligned) in which a purely
    elementwise region can run on its elements laid out in rows, or None. Purely elementwise:
    every op maps element i of its inputs to element i of its output, so every tensor has the
    same element count and nothing broadcasts. (A Split would qualify on paper, but viewing rows
    of a computed tensor made PyPTO spill it to GM: nudenet's SiLU->Split read and wrote 2-4x
    its lower bound.)"""
    if any(op.op_type not in FLAT_OPS for op in region.simplified):
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


def _argument_shape(w: _Writer, tensor: str) -> tuple[int, ...]:
    # PyPTO has no rank-0 tensors: scalars travel as [1]
    return tuple(w.declared.get(tensor, w.shape(tensor))) or (1,)


def _annotation(w: _Writer, tensor: str) -> str:
    return f"pypto.Tensor({_argument_shape(w, tensor)!r}, {pypto_dtype(w.dtype(tensor))})"


def is_scalar_constant(tensor: str, constants: Mapping[str, np.ndarray]) -> bool:
    return tensor in constants and np.asarray(constants[tensor]).size == 1


def _as_tensor(w: _Writer, tensor: str) -> str:
    """A region output must be a tensor value (not an inlined scalar) of PyPTO's rank. An output
    that is a kernel argument itself (the simplified program only renames or reshapes it) is
    copied through a full view: PyPTO refuses ``out[:] = in``."""
    if is_scalar_constant(tensor, w.constants):
        raise CannotExpress(f"output {tensor!r} is a compile-time constant")
    value = w.value(tensor, w.declared.get(tensor))
    if value.startswith("in"):
        shape = list(w.shape(tensor)) or [1]
        return f"pypto.view({value}, {shape}, {[0] * len(shape)})"
    return value


def lowers(op_type: str) -> bool:
    """Whether the generator has a lowering for the op (``importer/ops.py`` marks the same).
    A region's program holds its reshape-likes as one Reshape (``fusion/program.py``), and
    a rewrite rule writes the ``DECOMPOSED`` ops as others (``fusion/rules.py``)."""
    return op_type in VIEW_ONLY_OPS or op_type in _LOWERINGS or op_type in UNARY \
        or op_type in BINARY or op_type in DECOMPOSED


def _lower(w: _Writer, op: RegionOp) -> None:
    lower = _LOWERINGS.get(op.op_type)
    if lower is None:
        if op.op_type in UNARY:
            lower = _unary
        elif op.op_type in BINARY:
            lower = _binary
        else:
            raise CannotExpress(f"no PyPTO lowering for {op.op_type}")
    lower(w, op)


def _view(w: _Writer, op: RegionOp) -> None:  # Slice
    source, out = op.inputs[0], op.outputs[0]
    p = op.params
    if any(step < 0 for step in p["steps"]):
        raise CannotExpress("Slice with a negative step")
    shape = w.shape(out)
    spans = [max(e - s, 0) for s, e in zip(p["starts"], p["ends"])]
    window = [min(span, dim) for span, dim in zip(spans, w.shape(source))]
    w.tile(window, w.dtype(out))
    current = w.view(out, f"pypto.view({w.var(source)}, {list(window)}, {list(p['starts'])})")
    for axis, step in enumerate(p["steps"]):
        if step != 1:
            w.tile(shape, w.dtype(out))
            index = f"pypto.arange(0, {window[axis]}, {step})"
            current = w.assign(out, f"pypto.index_select({current}, {axis}, {index})")


def _full(w: _Writer, shape, value, dtype: int) -> str:
    if dtype in BYTE_INTEGERS:  # "unsupported type, dstDtypeStr: int8_t" in its code generation
        raise CannotExpress(f"PyPTO 0.2.0 fills no {onnx.TensorProto.DataType.Name(dtype)} tile "
                            "(GenDupOp)")
    dt = pypto_dtype(dtype)
    return f"pypto.full({list(shape)}, pypto.Element({dt}, {float_literal(value)}), {dt})"


def _pad(w: _Writer, op: RegionOp) -> None:
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
            parts.insert(0, _full(w, shape[:axis] + [begins[axis]] + shape[axis + 1:], value, dtype))
        if ends[axis]:
            parts.append(_full(w, shape[:axis] + [ends[axis]] + shape[axis + 1:], value, dtype))
        shape[axis] += begins[axis] + ends[axis]
        w.tile(shape, dtype, whole_axes=(axis,))
        current = w.assign(out, f"pypto.concat([{', '.join(parts)}], {axis})")
    if current == w.var(source):
        w.assign(out, current)


def _native_pad(shape, begins, ends, value) -> bool:
    return len(shape) >= 2 and not any(begins) and not any(ends[:-2]) \
        and float(value) in (0.0, float("inf"), float("-inf"))


def _tile(w: _Writer, op: RegionOp) -> None:
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


def _broadcast_to(w: _Writer, tensor: str, shape, own=None) -> str:
    """The tensor broadcast to ``shape``: reshaped to ``own`` (its shape right-aligned to the
    rank of ``shape``, or a folded form of it), then expanded one axis per call."""
    if is_scalar_constant(tensor, w.constants):
        return w.value(tensor)
    shape = list(shape)
    own = list(own) if own is not None else \
        right_aligned(w.shape(tensor), len(shape))
    current = w.value(tensor, own)
    dtype = w.dtype(tensor)
    for axis, (have, want) in enumerate(zip(own, shape)):
        if have != want:
            own[axis] = want
            w.tile(own, dtype)
            name = w.fresh()
            w.emit(f"{name} = pypto.expand_clone({current}, {own})")
            current = name
    return current


def _compute_shape(w: _Writer, out: str, inputs) -> tuple[list[int], list]:
    """Where a broadcasting op runs: its output shape, folded when above PyPTO's rank."""
    if w.row is not None:  # nothing broadcasts in a flat region (``flat_row``)
        return w.flat(out), [w.flat(out)] * len(inputs)
    if w.rows is not None:
        return w.rows.shape(out), [w.rows.shape(name) for name in inputs]
    shape = _at_least_2d(w.shape(out))
    held = _held_fold(w, shape, inputs)
    if held is not None:
        return held
    if len(shape) <= MAX_RANK:
        return shape, [None] * len(inputs)
    folded, operands = fold_broadcast(shape, [w.shape(n) for n in inputs])
    if len(folded) > MAX_RANK:
        raise CannotExpress(f"rank {len(shape)} broadcast does not fold to {MAX_RANK} axes")
    return folded, operands


def _held_fold(w: _Writer, shape: list[int], inputs) -> tuple[list[int], list] | None:
    """Where a broadcasting op runs on the shape a computed operand is held in
    (``_held_shape``): that operand's shape when nothing broadcasts, or the folded broadcast
    when it is the held one; None when no operand is held so."""
    tensors = [name for name in inputs if not is_scalar_constant(name, w.constants)]
    aligned = [right_aligned(w.shape(n), len(shape)) for n in tensors]
    for name in tensors:
        held = _held_shape(w, name)
        if held is None or len(held) > MAX_RANK:
            continue
        if all(a == shape for a in aligned) and prod(held) == prod(shape):
            return held, [held if n in tensors else None for n in inputs]
        folded, operands = fold_broadcast(shape, [w.shape(n) for n in inputs])
        if operands[list(inputs).index(name)] == held and len(folded) <= MAX_RANK:
            return folded, operands
    return None


def _expand(w: _Writer, op: RegionOp) -> None:
    out = op.outputs[0]
    shape, (own,) = _compute_shape(w, out, op.inputs)
    w.hold(out, _broadcast_to(w, op.inputs[0], shape, own), shape)


def _concat(w: _Writer, op: RegionOp) -> None:
    axis, out = op.params["axis"], op.outputs[0]
    if out in w.assembled:
        _assemble_concat(w, op, w.assembled[out])
        return
    if len(op.inputs) > MAX_CONCAT_INPUTS:
        raise CannotExpress(f"Concat of {len(op.inputs)} inputs")
    # the inputs first: a reshaped or broadcast input sets its own tile, which must not be the
    # one the concat runs under (nudenet's YOLO head: the last input's tile, 193,568 B of UB)
    parts = ", ".join(_broadcast_to(w, name, w.shape(name)) for name in op.inputs)
    w.tile(w.shape(out), w.dtype(out), whole_axes=(axis,))
    w.assign(out, f"pypto.concat([{parts}], {axis})")


def _assemble_concat(w: _Writer, op: RegionOp, target: str) -> None:
    """A Concat that is a region output, written into the output argument part by part
    (``assembled_outputs``); no output statement follows it (PyPTO refuses an ``out[:] =``
    beside an ``assemble`` into the same ``out``, F21005)."""
    axis, offset = op.params["axis"], 0
    for tensor in op.inputs:
        shape, dtype = list(w.shape(tensor)), w.dtype(tensor)
        part = _full(w, shape, np.asarray(w.constants[tensor]).reshape(-1)[0], dtype) \
            if is_scalar_constant(tensor, w.constants) else _broadcast_to(w, tensor, shape)
        w.tile(shape, dtype)
        offsets = [offset if a == axis else 0 for a in range(len(shape))]
        w.emit(f"pypto.assemble({part}, {offsets}, {target})")
        offset += shape[axis]


def _split(w: _Writer, op: RegionOp) -> None:
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


def _transpose(w: _Writer, op: RegionOp) -> None:
    _permute(w, op.inputs[0], op.outputs[0], list(w.shape(op.inputs[0])), list(op.params["perm"]))


def _permute(w: _Writer, source: str, out: str, shape: list[int], perm: list[int]) -> None:
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
            raise CannotExpress(f"rank {len(perm)} transpose does not fold to {MAX_RANK} axes")
    current = w.value(source, shape)
    dtype, over_input = w.dtype(out), w.policy.swap_transpose_tiles
    for i, j in swaps_for(perm):
        before = tuple(shape)
        shape[i], shape[j] = shape[j], shape[i]
        # the search's other orientation runs under the input's tile, the default the output's
        tile = _transpose_input_tile(w, current, before, dtype, i, j) if over_input \
            else w.policy.tile(tuple(shape), itemsize_of(dtype))
        w._set_tile(tile)
        name = w.fresh()
        w.emit(f"{name} = pypto.transpose({current}, {i}, {j})")
        if over_input:  # its result comes in the input's tile swapped (``_Writer.follow``)
            w.tiles[name] = _swapped(tile, i, j)
        current = name
    w.hold(out, current, shape)


def _swapped(tile: Sequence[int], i: int, j: int) -> tuple[int, ...]:
    tile = list(tile)
    tile[i], tile[j] = tile[j], tile[i]
    return tuple(tile)


def _transpose_input_tile(w: _Writer, value: str, shape: Sequence[int], dtype: int, i: int,
                          j: int) -> tuple[int, ...]:
    """A transpose's tile, over its input (PyPTO's reading): the tile ``value`` was made under
    where it came from a transpose (``_Writer.tiles``), else the policy's for its shape, which
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


def _reshape(w: _Writer, op: RegionOp) -> None:
    """No op of its own: the output holds the same elements. Materialised (as a reshape from the
    underlying variable) only when a consumer needs this shape."""
    source, out = op.inputs[0], op.outputs[0]
    if source not in w.names:
        raise CannotExpress(f"tensor {source!r} is used before it is computed")
    w.names[out] = w.names[source]


def _identity(w: _Writer, op: RegionOp) -> None:
    w.names[op.outputs[0]] = w.names[op.inputs[0]]


def _gather(w: _Writer, op: RegionOp) -> None:
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


def _where(w: _Writer, op: RegionOp) -> None:
    out = op.outputs[0]
    shape, owns = _compute_shape(w, out, op.inputs)
    args = [_broadcast_to(w, name, shape, own) for name, own in zip(op.inputs, owns)]
    w.follow(shape, w.dtype(out), op.inputs)
    w.assign(out, f"pypto.where({', '.join(args)})", shape)


def _elementwise_shape(w: _Writer, tensor: str, source: str | None = None) -> list[int]:
    """An elementwise op runs on any row-major shape of its tensor: the shape its computed
    ``source`` is held in (``_held_shape``), else its own with the leading axes folded."""
    if w.row is not None:
        return w.flat(tensor)
    if w.rows is not None:
        return w.rows.shape(tensor)
    held = _held_shape(w, source) if source is not None else None
    if held is not None and prod(held) == prod(w.shape(tensor)):
        return held
    shape = _at_least_2d(w.shape(tensor))
    return shape if len(shape) <= MAX_RANK else [prod(shape[:-3])] + shape[-3:]


def _at_least_2d(shape: Sequence[int]) -> list[int]:
    """A vector (or a scalar) as one row: PyPTO's clip and round take rank 2 to 4 only
    ("shape.size() only support 2~4", FC0000)."""
    return [1] * (2 - len(shape)) + list(shape)


def _held_shape(w: _Writer, tensor: str) -> list[int] | None:
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


def _per_element(w: _Writer, op: RegionOp, expression: Callable[[str, list[int]], str]) -> None:
    """A one-input elementwise op: computed on a folded shape when above PyPTO's rank."""
    out = op.outputs[0]
    shape = _elementwise_shape(w, out, op.inputs[0])
    value = w.value(op.inputs[0], shape)
    w.follow(shape, w.dtype(out), op.inputs)
    w.assign(out, expression(value, shape), shape)


def _unary(w: _Writer, op: RegionOp) -> None:
    _per_element(w, op, lambda value, _: f"pypto.{UNARY[op.op_type]}({value})")


def _reciprocal(w: _Writer, op: RegionOp) -> None:
    dtype = w.dtype(op.outputs[0])
    _per_element(w, op, lambda value, shape: f"pypto.div({_full(w, shape, 1.0, dtype)}, {value})")


def _in_fp32(w: _Writer, value: str, dtype: int) -> str:
    """``value`` cast to fp32 when it is half precision: a polynomial in fp16 loses digits."""
    if dtype not in HALF_DTYPES:
        return value
    return _let(w, f"pypto.cast({value}, pypto.DT_FP32)")


def _back_from_fp32(value: str, dtype: int) -> str:
    if dtype not in HALF_DTYPES:
        return value
    return f"pypto.cast({value}, {pypto_dtype(dtype)})"


def _activation(w: _Writer, op: RegionOp) -> None:
    """An elementwise op PyPTO has no single call for, composed by its builder
    (``activations.py``), in fp32 where the builder asks for it."""
    dtype = w.dtype(op.outputs[0])
    build = activations.BUILDERS[op.op_type]
    compute = onnx.TensorProto.FLOAT if op.op_type in activations.FP32 else dtype

    out = op.outputs[0]
    shape = _elementwise_shape(w, out, op.inputs[0])
    x = w.value(op.inputs[0], shape)
    w.follow(shape, compute, op.inputs)  # its temporaries are of the computing precision
    math = activations.Math(let=partial(_let, w), params=op.params,
                            full=lambda value: _full(w, shape, value, compute))
    value = build(math, _in_fp32(w, x, dtype) if compute != dtype else x)
    w.assign(out, _back_from_fp32(value, dtype) if compute != dtype else value, shape)


def _clip(w: _Writer, op: RegionOp) -> None:
    if w.dtype(op.inputs[0]) not in FLOAT_DTYPES:
        _integer_clip(w, op)
        return
    low = -FLT_MAX if op.params["min"] is None else float(op.params["min"])
    high = FLT_MAX if op.params["max"] is None else float(op.params["max"])
    _per_element(w, op, lambda value, _: f"pypto.clip({value}, {float_literal(low)}, "
                                         f"{float_literal(high)})")


def _integer_clip(w: _Writer, op: RegionOp) -> None:
    """min(max(x, low), high) with full tiles of the bounds: PyPTO's clip takes no integer
    tensor (FC0001) and compares integers with integer tiles only (``_compare``)."""
    low, high = op.params["min"], op.params["max"]
    if low is None and high is None:
        _identity(w, op)
        return
    dtype = w.dtype(op.outputs[0])

    def expression(value: str, shape) -> str:
        if low is not None:
            value = f"pypto.maximum({value}, {_full(w, shape, low, dtype)})"
        if high is not None:
            value = f"pypto.minimum({value}, {_full(w, shape, high, dtype)})"
        return value
    _per_element(w, op, expression)


def _cast(w: _Writer, op: RegionOp) -> None:
    out = op.outputs[0]
    to = pypto_dtype(w.dtype(out))
    mode = ", pypto.CastMode.CAST_TRUNC" if np.issubdtype(
        onnx.helper.tensor_dtype_to_np_dtype(w.dtype(out)), np.integer) else ""
    _per_element(w, op, lambda value, _: f"pypto.cast({value}, {to}{mode})")


def _binary(w: _Writer, op: RegionOp) -> None:
    out = op.outputs[0]
    if len(op.inputs) == 1:  # a variadic Max, Min or Sum of one tensor: that tensor
        _identity(w, op)
        return
    if all(is_scalar_constant(name, w.constants) for name in op.inputs):
        raise CannotExpress("an op on compile-time constants only")
    shape, owns = _compute_shape(w, out, op.inputs)
    operands = _binary_operands(w, op, shape, owns)
    function = BINARY[op.op_type]
    if is_scalar_constant(op.inputs[0], w.constants):  # PyPTO takes scalars on the right
        if op.op_type == "Sub":
            operands = [f"pypto.neg({operands[1]})", operands[0]]
            function = "add"
        elif op.op_type in COMMUTATIVE:
            operands.reverse()
        elif op.op_type == "Div":  # RMSNorm's 1 / sqrt(...): the scalar as a full tile
            numerator = np.asarray(w.constants[op.inputs[0]]).reshape(-1)[0]
            operands[0] = _full(w, shape, numerator, w.dtype(out))
        else:
            raise CannotExpress(f"{op.op_type} with a scalar on the left")
    expression = operands[0]
    for operand in operands[1:]:
        expression = f"pypto.{function}({expression}, {operand})"
    w.follow(shape, w.dtype(out), op.inputs)
    w.assign(out, expression, shape)


def _binary_operands(w: _Writer, op: RegionOp, shape, owns) -> list[str]:
    """The operands broadcast to ``shape``. In a row region PyPTO broadcasts a [R, 1] or [1, C]
    right operand in place (docs/pypto-ops.md, "Reductions"); a smaller left operand of a
    commutative op swaps sides, any other is expanded."""
    names, shape = list(op.inputs), list(shape)
    if w.rows is None:
        return [_broadcast_to(w, name, shape, own) for name, own in zip(names, owns)]
    if len(names) == 2 and owns[0] != shape and owns[1] == shape \
            and op.op_type in COMMUTATIVE and not is_scalar_constant(names[0], w.constants):
        names, owns = names[::-1], owns[::-1]
    operands = [_broadcast_to(w, names[0], shape, owns[0])]
    for name, own in zip(names[1:], owns[1:]):
        one_axis = sum(have != want for have, want in zip(own, shape)) <= 1
        operands.append(w.value(name, own) if one_axis else _broadcast_to(w, name, shape, own))
    return operands


def _combined(w: _Writer, op: RegionOp, combine: Callable[[list[str]], str]) -> None:
    """An n-ary op of its operands broadcast to its shape, as ``combine`` writes it; a scalar
    constant only after a tensor (PyPTO takes scalars on the right)."""
    out = op.outputs[0]
    if len(op.inputs) == 1 and op.op_type == "Mean":  # of one tensor: that tensor
        _identity(w, op)
        return
    if is_scalar_constant(op.inputs[0], w.constants):
        raise CannotExpress(f"{op.op_type} with a scalar first")
    shape, owns = _compute_shape(w, out, op.inputs)
    operands = _binary_operands(w, op, shape, owns)
    w.follow(shape, w.dtype(out), op.inputs)
    w.assign(out, combine(operands), shape)


def _logical_or(w: _Writer, op: RegionOp) -> None:
    """not(and(not a, not b)): PyPTO's bitwise_or does not compile for bools."""
    def combine(operands: list[str]) -> str:
        both_false = " ".join(f"pypto.logical_and(pypto.logical_not({o})," for o in operands[:-1])
        return (f"pypto.logical_not({both_false} pypto.logical_not({operands[-1]})"
                f"{')' * (len(operands) - 1)})")
    _combined(w, op, combine)


def _mean(w: _Writer, op: RegionOp) -> None:
    def combine(operands: list[str]) -> str:
        total = operands[0]
        for operand in operands[1:]:
            total = f"pypto.add({total}, {operand})"
        return f"pypto.mul({total}, {float_literal(1 / len(operands))})"
    _combined(w, op, combine)


def _prelu(w: _Writer, op: RegionOp) -> None:
    """x where x >= 0, slope * x elsewhere, the slope broadcast to x (PyPTO's prelu takes a
    1-D weight only and failed to compile with one: PRELUOpError)."""
    _combined(w, op, lambda operands: f"pypto.where(pypto.lt({operands[0]}, 0.0), pypto.mul("
                                      f"{operands[0]}, {operands[1]}), {operands[0]})")


def _float_test(w: _Writer, op: RegionOp) -> None:
    """IsNaN as x != x; IsInf as |x| (or x, or -x) beyond the largest finite value. A bool
    tensor, tiled by its operand's dtype."""
    source, out = op.inputs[0], op.outputs[0]
    dtype = w.dtype(source)
    shape = _elementwise_shape(w, out, source)
    x = w.value(source, shape)
    w.follow(shape, dtype, op.inputs)
    bound = float_literal(FINITE_MAX[dtype])
    if op.op_type == "IsNaN":
        expression = f"pypto.ne({x}, {x})"
    elif op.params.get("detect_positive", 1) and op.params.get("detect_negative", 1):
        expression = f"pypto.gt(pypto.abs({x}), {bound})"
    elif op.params.get("detect_positive", 1):
        expression = f"pypto.gt({x}, {bound})"
    elif op.params.get("detect_negative", 1):
        expression = f"pypto.gt(pypto.neg({x}), {bound})"
    else:  # neither sign detected: false everywhere
        expression = f"pypto.lt(pypto.abs({x}), -1.0)"
    w.assign(out, expression, shape)


def _compare(w: _Writer, op: RegionOp) -> None:
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
    shape, owns = _compute_shape(w, out, names)
    left, right = _binary_operands(w, RegionOp(op.op_type, tuple(names), op.outputs), shape,
                                   owns)
    if is_scalar_constant(names[1], w.constants) and dtype not in FLOAT_DTYPES:
        right = _full(w, shape, np.asarray(w.constants[names[1]]).reshape(-1)[0], dtype)
    expression = f"pypto.{function}({left}, {right})"
    w.follow(shape, dtype, names)
    w.assign(out, f"pypto.logical_not({expression})" if negated else expression, shape)


def _roll(w: _Writer, op: RegionOp) -> None:
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


def _pow(w: _Writer, op: RegionOp) -> None:
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
        -1.0: lambda x, shape: f"pypto.div({_full(w, shape, 1.0, dtype)}, {x})",
    }
    value = float(np.asarray(w.constants[exponent]).reshape(-1)[0])
    _per_element(w, op, forms.get(value, lambda x, _: f"pypto.pow({x}, {float_literal(value)})"))


def _row_input(w: _Writer, tensor: str, dtype: int) -> str:
    """A row region's tensor as its [R, C] / [R, 1] / [1, C] variable, cast to ``dtype``."""
    value = w.value(tensor, w.rows.shape(tensor))
    if dtype == w.dtype(tensor):
        return value
    w.tile(w.rows.shape(tensor), dtype)
    name = w.fresh()
    w.emit(f"{name} = pypto.cast({value}, {pypto_dtype(dtype)})")
    return name


def _compute_dtype(w: _Writer, op: RegionOp, stash: bool) -> int:
    """fp32 for a half-precision normalisation that asks for it (LayerNormalization's
    stash_type 1): fp16 LayerNorm accumulated in fp32 is 4x closer to the reference
    (docs/pypto-ops.md, "Reductions")."""
    dtype = w.dtype(op.inputs[0])
    half = dtype in HALF_DTYPES
    return onnx.TensorProto.FLOAT if half and stash else dtype


def _row_result(w: _Writer, op: RegionOp, value: str, dtype: int) -> None:
    out = op.outputs[0]
    if dtype != w.dtype(out):
        w.tile(w.rows.shape(out), w.dtype(out))
        value = f"pypto.cast({value}, {pypto_dtype(w.dtype(out))})"
    w.assign(out, value, w.rows.shape(out))


def _let(w: _Writer, expression: str) -> str:
    name = w.fresh()
    w.emit(f"{name} = {expression}")
    return name


REDUCTIONS = {"ReduceSum": "sum", "ReduceMean": "sum", "ReduceMax": "amax", "ReduceMin": "amin",
              "ReduceSumSquare": "sum", "ReduceL2": "sum", "GlobalAveragePool": "sum",
              "GlobalMaxPool": "amax"}
MEANS = frozenset({"ReduceMean", "GlobalAveragePool"})


def _reduce(w: _Writer, op: RegionOp) -> None:
    """Over the columns of the rows (``fusion/rows.py``): the reduced axis is whole in a tile."""
    dtype = w.dtype(op.inputs[0])
    x = _row_input(w, op.inputs[0], dtype)
    w.tile((w.rows.rows, w.rows.columns), dtype)
    if op.op_type in ("ReduceSumSquare", "ReduceL2"):
        x = _let(w, f"pypto.mul({x}, {x})")
    value = f"pypto.{REDUCTIONS[op.op_type]}({x}, -1, True)"
    if op.op_type in MEANS:
        value = f"pypto.mul({value}, {float_literal(1 / w.rows.columns)})"
    elif op.op_type == "ReduceL2":
        value = f"pypto.sqrt({value})"
    _row_result(w, op, value, dtype)


def _softmax(w: _Writer, op: RegionOp) -> None:
    """amax, sub, exp, sum, div: 4.6 us on [1,8,64,128] fp32, ahead of ``pypto.softmax``, which
    casts to fp32 inside (docs/pypto-ops.md, "Reductions")."""
    dtype = w.dtype(op.inputs[0])
    x = _row_input(w, op.inputs[0], dtype)
    w.tile((w.rows.rows, w.rows.columns), dtype)
    shifted = _let(w, f"pypto.sub({x}, pypto.amax({x}, -1, True))")
    exp = _let(w, f"pypto.exp({shifted})")
    total = _let(w, f"pypto.sum({exp}, -1, True)")
    value = f"pypto.sub({shifted}, pypto.log({total}))" if op.op_type == "LogSoftmax" \
        else f"pypto.div({exp}, {total})"
    _row_result(w, op, value, dtype)


def _layer_normalization(w: _Writer, op: RegionOp) -> None:
    """(x - mean) * rsqrt(var + eps) * scale + bias, the variance as the mean square of the
    centred rows (5.25 us on 512x128 fp32 against 30.1 us for its 9 ONNX ops as kernels). An
    instance's or a group's rows are the same, with a scale and bias per row
    (``fusion/rows.py``)."""
    dtype = _compute_dtype(w, op, op.params["stash_type"] == 1)
    x, scale = (_row_input(w, name, dtype) for name in op.inputs[:2])
    w.tile((w.rows.rows, w.rows.columns), dtype)
    inverse = float_literal(1 / w.rows.columns)
    centred = _let(w, f"pypto.sub({x}, pypto.mul(pypto.sum({x}, -1, True), {inverse}))")
    variance = _let(w, f"pypto.mul(pypto.sum(pypto.mul({centred}, {centred}), -1, True), "
                       f"{inverse})")
    scaled = _let(w, f"pypto.mul(pypto.mul({centred}, pypto.rsqrt(pypto.add({variance}, "
                     f"{float_literal(op.params['epsilon'])}))), {scale})")
    if len(op.inputs) > 2 and op.inputs[2]:
        scaled = f"pypto.add({scaled}, {_row_input(w, op.inputs[2], dtype)})"
    _row_result(w, op, scaled, dtype)


def _matmul(w: _Writer, op: RegionOp) -> None:
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


# The most 2-D matmuls a batched one unrolls into (``batched_matmul_loop``): each is one cube
# task, and the loop is unrolled when PyPTO traces the kernel.
MAX_UNROLLED_MATMULS = 64
HEADS_OUTWARD = (0, 2, 1, 3)  # [B, H, S, D] -> [B, S, H, D]: attention's heads merged back


@dataclass(frozen=True)
class BatchedLoop:
    """A region that is one batched MatMul of two region inputs, an elementwise epilogue on
    region inputs and scalars, and the output, maybe with the heads moved behind the rows."""
    matmul: RegionOp
    epilogue: tuple[RegionOp, ...]
    heads_outward: bool
    output: str


def batched_matmul_loop(region: Region, constants: Mapping[str, np.ndarray]
                        ) -> BatchedLoop | None:
    """The region as a loop of 2-D matmuls, each slice's epilogue applied in UB and the result
    assembled at its place in the output, or None. As one 4-D matmul, PyPTO wrote the product
    to GM and read it back for the epilogue or the transpose: tf_swin's attention (16 windows x
    2 heads of 16x16x16 fp32) times V then the heads moved behind the rows read 131,072 B and
    wrote 98,304 in 17.6 us; as 32 matmuls assembled, the lower bound's 65,536 and 32,768 in
    7.6 us (docs/pypto-ops.md, "MatMul")."""
    ops = list(region.simplified)
    shapes = _shapes(region)
    if not ops or ops[0].op_type != "MatMul" or len(ops[0].inputs) != 2 \
            or not all(t in region.inputs for t in ops[0].inputs):
        return None
    left, right = (shapes[t] for t in ops[0].inputs)
    batch = left[:-2]
    if len(left) < 3 or len(right) != len(left) or right[:-2] != batch \
            or not 2 <= prod(batch) <= MAX_UNROLLED_MATMULS:
        return None
    current, product_shape, epilogue = ops[0].outputs[0], shapes[ops[0].outputs[0]], []
    rest = ops[1:]
    while rest and (rest[0].op_type in UNARY or rest[0].op_type in BINARY):
        op = rest.pop(0)
        others = [t for t in op.inputs if t != current]
        if op.inputs.count(current) != 1 or shapes[op.outputs[0]] != product_shape or not all(
                is_scalar_constant(t, constants) or (
                    t in region.inputs and _slices_along(shapes[t], product_shape))
                for t in others):
            return None
        epilogue.append(op)
        current = op.outputs[0]
    heads_outward = bool(rest) and rest[0].op_type == "Transpose" \
        and rest[0].inputs[0] == current and tuple(rest[0].params["perm"]) == HEADS_OUTWARD
    if heads_outward:
        current = rest.pop(0).outputs[0]
    if rest and rest[0].op_type == "Reshape" and rest[0].inputs[0] == current:
        current = rest.pop(0).outputs[0]
    if rest or list(region.outputs) != [current]:
        return None
    return BatchedLoop(ops[0], tuple(epilogue), heads_outward, current)


def _slices_along(shape: Sequence[int], product: Sequence[int]) -> bool:
    """Whether an epilogue operand broadcasts to the product with whole or unit batch axes and
    a [rows, columns] slice of unit or whole extents (and so has a 2-D slice per matmul)."""
    if len(shape) > len(product):
        return False
    return all(have in (1, want) for have, want in zip(right_aligned(shape, len(product)),
                                                        product))


def _batched_matmul_loop(w: _Writer, loop: BatchedLoop, inputs: Mapping[str, str],
                         target: str) -> None:
    """``batched_matmul_loop``'s region: its operands and output declared as 2-D rows, one
    2-D matmul per batch index on views, the epilogue lowered on the slice, each result
    assembled into the output."""
    (left, right), product = loop.matmul.inputs, loop.matmul.outputs[0]
    *batch, m, k = w.shape(left)
    n = w.shape(right)[-1]
    count = prod(batch)
    w.declared[left], w.declared[right] = (count * m, k), (count * k, n)
    heads = batch[-1] if loop.heads_outward else 1
    w.declared[loop.output] = (count // heads * m, heads * n)
    operands = {t for op in loop.epilogue for t in op.inputs
                if t in inputs and t != product and not is_scalar_constant(t, w.constants)}
    for tensor in sorted(operands):
        own = w.shape(tensor)
        w.declared[tensor] = (prod(own[:-1]), own[-1])
    m_tiles, k_tiles, n_tiles = cube_tiles(m, k, n, itemsize_of(w.dtype(left)),
                                           w.policy.budget_bytes)
    w.emit(f"pypto.set_cube_tile_shapes({m_tiles}, {k_tiles}, {n_tiles})")
    indexes = [f"b{axis}" if extent > 1 else "0" for axis, extent in enumerate(batch)]
    loops = [(index, extent) for index, extent in zip(indexes, batch) if extent > 1]
    for index, extent in loops:
        w.emit(f"for {index} in range({extent}):")
        w.indent += 1
    a, b, slice_index = w.fresh(), w.fresh(), _flat_index(indexes, batch)
    w.emit(f"{a} = pypto.view({inputs[left]}, [{m}, {k}], [{slice_index} * {m}, 0])")
    w.emit(f"{b} = pypto.view({inputs[right]}, [{k}, {n}], [{slice_index} * {k}, 0])")
    w.sliced[product] = (m, n)
    w.assign(product, f"pypto.matmul({a}, {b}, {pypto_dtype(w.dtype(product))})", (m, n))
    for tensor in sorted(operands):
        _hold_slice(w, tensor, inputs[tensor], indexes, batch)
    for op in loop.epilogue:
        w.sliced[op.outputs[0]] = (m, n)
        _lower(w, op)
    result = w.value((loop.epilogue[-1].outputs[0] if loop.epilogue else product), (m, n))
    if loop.heads_outward:
        offsets = f"[{_flat_index(indexes[:-1], batch[:-1])} * {m}, {indexes[-1]} * {n}]"
    else:
        offsets = f"[{slice_index} * {m}, 0]"
    w.tile((m, n), w.dtype(product))
    w.emit(f"pypto.assemble({result}, {offsets}, {target})")
    w.indent -= len(loops)


def _flat_index(indexes: Sequence[str], extents: Sequence[int]) -> str:
    """The row-major position of a batch index as an expression of the loop variables."""
    terms = [f"{index} * {prod(extents[axis + 1:])}" if prod(extents[axis + 1:]) > 1 else index
             for axis, index in enumerate(indexes) if index != "0"]
    return f"({' + '.join(terms)})" if terms else "0"


def _hold_slice(w: _Writer, tensor: str, argument: str, indexes, batch) -> None:
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


def _pointwise_conv(w: _Writer, op: RegionOp) -> None:
    """A 1x1 convolution of one image as ``W[Cout, Cin] @ x[Cin, H*W]`` plus the bias as a
    ``[Cout, 1]`` column (``importer/canonical.py`` admits no other)."""
    image, weights, out = op.inputs[0], op.inputs[1], op.outputs[0]
    channels = w.shape(image)[1]
    filters, pixels = matmul_extents("Conv", list(w.shape(out)), 2)
    shape = [filters, pixels]
    a, b = w.value(weights, [filters, channels]), w.value(image, [channels, pixels])
    m_tiles, k_tiles, n_tiles = cube_tiles(filters, channels, pixels,
                                           itemsize_of(w.dtype(image)), w.policy.budget_bytes)
    w.emit(f"pypto.set_cube_tile_shapes({m_tiles}, {k_tiles}, {n_tiles})")
    w.product_rows, w.cube_rows = filters, m_tiles[0]
    value = _let(w, f"pypto.matmul({a}, {b}, {pypto_dtype(w.dtype(out))})")
    if len(op.inputs) > 2 and op.inputs[2]:
        bias = w.value(op.inputs[2], [filters, 1])
        w.tile(shape, w.dtype(out))
        value = f"pypto.add({value}, {bias})"
    w.assign(out, value, shape)


def _depth_to_space(w: _Writer, op: RegionOp) -> None:
    """DepthToSpace and SpaceToDepth as the reshape-transpose-reshape ONNX defines them; the
    6-D transpose folds to rank 4 (``fold_transpose``) for DCR DepthToSpace and SpaceToDepth."""
    n, c, h, width = w.shape(op.inputs[0])
    b = op.params["blocksize"]
    if op.op_type == "SpaceToDepth":
        shape, perm = [n, c, h // b, b, width // b, b], [0, 3, 5, 1, 2, 4]
    elif op.params.get("mode", "DCR") == "DCR":
        shape, perm = [n, b, b, c // (b * b), h, width], [0, 3, 4, 1, 5, 2]
    else:
        shape, perm = [n, c // (b * b), b, b, h, width], [0, 1, 4, 2, 5, 3]
    _permute(w, op.inputs[0], op.outputs[0], shape, perm)


_LOWERINGS: dict[str, Callable[[_Writer, RegionOp], None]] = {
    "Slice": _view, "Pad": _pad, "Tile": _tile, "Expand": _expand, "Concat": _concat,
    "Split": _split, "Transpose": _transpose, "Reshape": _reshape, "Identity": _identity,
    "Gather": _gather, "Cast": _cast, "Where": _where, "Reciprocal": _reciprocal, "Clip": _clip,
    "Roll": _roll, "Pow": _pow, **{op: _activation for op in activations.BUILDERS},
    "Or": _logical_or, "Mean": _mean, "PRelu": _prelu, "IsNaN": _float_test,
    "IsInf": _float_test,
    "MatMul": _matmul, "Gemm": _matmul, "Conv": _pointwise_conv,
    "Softmax": _softmax, "LogSoftmax": _softmax, **{op: _compare for op in COMPARISONS},
    "LayerNormalization": _layer_normalization, "InstanceNormalization": _layer_normalization,
    "GroupNormalization": _layer_normalization, "DepthToSpace": _depth_to_space,
    "SpaceToDepth": _depth_to_space, **{op: _reduce for op in REDUCTIONS},
}
