"""The emitter every lowering writes through: ``Writer`` holds the kernel body's lines and where
each tensor's elements are (which variable, under which shape), and sets the vector tile before
each op. Also the small facts every module shares: PyPTO's dtypes, its rank limit, and
``CannotExpress``, raised for a pattern outside PyPTO 0.2.0's limits."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.fusion.classify import BYTE_INTEGERS, kernel_dtype
from pypto_offline.fusion.records import Region
from pypto_offline.fusion.rows import RowLayout
from pypto_offline.importer.bands import Band, bands_among
from pypto_offline.registry.ops import is_cube_conv, is_op
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.tiling import BLOCK_BYTES, TilePolicy

PYPTO_DTYPES = {
    onnx.TensorProto.FLOAT: "pypto.DT_FP32", onnx.TensorProto.FLOAT16: "pypto.DT_FP16",
    onnx.TensorProto.BFLOAT16: "pypto.DT_BF16", onnx.TensorProto.INT32: "pypto.DT_INT32",
    onnx.TensorProto.INT64: "pypto.DT_INT64", onnx.TensorProto.INT8: "pypto.DT_INT8",
    onnx.TensorProto.UINT8: "pypto.DT_UINT8", onnx.TensorProto.INT16: "pypto.DT_INT16",
    onnx.TensorProto.BOOL: "pypto.DT_BOOL",
}
MAX_RANK = 4  # PyPTO 0.2.0's code generation: "exceed dimension limit" above this


class CannotExpress(Exception):
    """The region uses a pattern the generator cannot write in PyPTO 0.2.0."""


def itemsize_of(dtype: int) -> int:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype)).itemsize


def pypto_dtype(dtype: int) -> str:
    if dtype not in PYPTO_DTYPES:
        raise CannotExpress(f"no PyPTO dtype for ONNX type {onnx.TensorProto.DataType.Name(dtype)}")
    return PYPTO_DTYPES[dtype]


def is_scalar_constant(tensor: str, constants: Mapping[str, np.ndarray]) -> bool:
    return tensor in constants and np.asarray(constants[tensor]).size == 1


def has_convolution(region: Region) -> bool:
    """Whether the region holds a convolution on the cube (any but a depthwise one)."""
    return any(is_cube_conv(op.op_type, op.params) for op in region.simplified)


@dataclass
class Writer:
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
    # elements (a batched matmul's operands as 2-D rows: ``matmul.lower_batched_loop``).
    declared: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Tensors held per slice inside a loop (``matmul.lower_batched_loop``): the slice's shape.
    sliced: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Quantised tensors held as the fp32 integers they are (a QuantizeLinear's result only
    # dequantised inside the kernel: ``quantisation._quantize``), whatever their type says.
    in_fp32: set[str] = field(default_factory=set)
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
    # (``layout.flat_row``); None: each op runs on its own (rank-folded) shape. All its tensors
    # have the same element count.
    row: int | None = None
    # The rows a region with reductions runs on (``fusion/rows.py``); None: it has none.
    rows: RowLayout | None = None

    @cached_property
    def bands(self) -> dict[str, Band]:
        """The region's band constants (``importer/bands.py``): written, not read."""
        return bands_among(self.region.inputs, self.constants)

    @cached_property
    def convolution(self) -> bool:
        """Whether the region holds a convolution on the cube (``has_convolution``), asked per
        op."""
        return has_convolution(self.region)

    @cached_property
    def row_itemsize(self) -> int | None:
        """1 in a kernel that writes an 8-bit tensor whose rows, aligned for fp32 (8
        elements), would not be whole 32-byte blocks of int8: its tiles' rows are aligned to
        32 elements, so its QuantizeLinear casts under the tile it computes in (PyPTO 0.2.0
        wants 8-bit tile rows of whole blocks, and a tile changed in a kernel's middle made it
        stage the tensors through GM: docs/int8.md, "Kernels"). None (each tile aligned for its
        own type) in any other: aligning every quantising kernel so pads rows of one element
        32 times, and ppocr_cls_v2 then moved 14.78 MB against 13.59 MB unaligned (13.75 MB
        aligned only where a narrow 8-bit tensor is written)."""
        fp32_row = BLOCK_BYTES // 4
        narrow = any(is_op(op, "QuantizeLinear") and self.holds_8_bits(op.outputs[0])
                     and -(-self.shape(op.outputs[0])[-1] // fp32_row) * fp32_row % BLOCK_BYTES
                     for op in self.region.simplified)
        return 1 if narrow else None

    def holds_8_bits(self, tensor: str) -> bool:
        """Whether a quantised tensor must be made 8-bit: the kernel writes it, or an op of
        the kernel other than a ``DequantizeLinear`` reads it (the cube multiplies int8); one
        only dequantised in the kernel stays the fp32 integer it is rounded to (``in_fp32``)."""
        return tensor in self.region.outputs or tensor in self._read_undequantised

    @cached_property
    def _read_undequantised(self) -> frozenset[str]:
        """The tensors an op of the kernel other than a ``DequantizeLinear`` reads."""
        return frozenset(name for op in self.region.simplified
                         if not is_op(op, "DequantizeLinear") for name in op.inputs)

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
        if self.rows is not None and tensor in self.rows.expanded and prod(wanted) != prod(held):
            return self._expanded_rows(tensor, name, held, wanted)
        if len(wanted) > MAX_RANK:
            raise CannotExpress(f"rank {len(wanted)} of {tensor!r} exceeds PyPTO's {MAX_RANK}")
        return self._reshape(name, held, wanted, self.dtype(tensor))

    def _reshape(self, name: str, held: tuple[int, ...], wanted: tuple[int, ...],
                 dtype: int) -> str:
        """Variable ``name``, held in ``held``, reshaped to ``wanted``: once per pair."""
        key = (name, wanted)
        if key not in self._reshaped:
            source = self._owned(name, held, dtype)
            self.tile(wanted, dtype)
            self._reshaped[key] = self.fresh()
            self.emit(f"{self._reshaped[key]} = pypto.reshape({source}, {list(wanted)})")
        return self._reshaped[key]

    def expand(self, name: str, own: Sequence[int], shape: Sequence[int], dtype: int) -> str:
        """Variable ``name``, held in ``own``, broadcast to ``shape`` (the same rank), one axis
        per ``expand_clone``."""
        own, current = list(own), name
        for axis, (have, want) in enumerate(zip(own, shape)):
            if have != want:
                own[axis] = want
                self.tile(own, dtype)
                expanded = self.fresh()
                self.emit(f"{expanded} = pypto.expand_clone({current}, {own})")
                current = expanded
        return current

    def _expanded_rows(self, tensor: str, name: str, held: tuple[int, ...],
                       wanted: tuple[int, ...]) -> str:
        """A row region's EXPANDED input (``fusion/rows.py``) as its rows: broadcast in its own
        axes to its reader's shape, then laid out as the rows. An attention mask [1, 1, 64, 128]
        over [1, 8, 64, 128] scores, Mul, Add and Softmax in one kernel: 6.19 us in PyPTO's cost
        model, as with a mask as large as the scores (docs/pypto-ops.md, "Reductions")."""
        key = (name, wanted)  # the whole chain once per tensor, however often it is read
        if key not in self._reshaped:
            target = self.rows.expanded[tensor]
            if len(target) > MAX_RANK:
                raise CannotExpress(f"rank {len(target)} broadcast of {tensor!r} exceeds "
                                    f"PyPTO's {MAX_RANK}")
            dtype = self.dtype(tensor)
            own = (1,) * (len(target) - len(held)) + held
            aligned = self._reshape(name, held, own, dtype) if own != held else name
            self._reshaped[key] = self._reshape(self.expand(aligned, own, target, dtype),
                                                tuple(target), wanted, dtype)
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

    def alias(self, tensor: str, source: str) -> None:
        """``tensor`` holds the same elements as ``source``, in the same variable and shape."""
        self.names[tensor] = self.names[source]

    def fresh(self) -> str:
        self._count += 1
        return f"t{self._count}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def tile(self, shape, dtype: int, whole_axes=()) -> None:
        if self.rows is not None and self.rows.whole_rows and len(shape) == 2 \
                and tuple(shape) not in self.rows.own.values():
            # one tile of whole rows for every op of a row region, the reduced results
            # included: a reduction never splits its axis (fusion/rows.py); a convolution's
            # product in its own rows (OWN) is tiled as any 2-D tensor
            shape, whole_axes = (self.rows.rows, self.rows.columns), (1,)
        split = self.rows is not None and self.rows.split_columns and len(shape) == 2
        tile = self.policy.tile(tuple(shape), itemsize_of(dtype), tuple(whole_axes), split,
                                self.row_itemsize)
        tile = self._within_split_parts(tuple(shape), tile)
        self.set_tile(self._rows_within_cube_tile(tuple(shape), tile))

    @cached_property
    def _split_parts(self) -> dict[tuple[tuple[int, ...], int], int]:
        """(a Split's source shape with its axis zeroed, the axis) → the greatest common
        divisor of its parts' sizes."""
        parts = {}
        for op in self.region.simplified:
            if is_op(op, "Split"):
                shape = list(self.shape(op.inputs[0]))
                axis = op.params["axis"] % len(shape)
                shape[axis] = 0
                key = (tuple(shape), axis)
                parts[key] = int(np.gcd.reduce([parts.get(key, 0), *op.params["sizes"]]))
        return parts

    def _within_split_parts(self, shape: tuple[int, ...], tile: tuple[int, ...]
                            ) -> tuple[int, ...]:
        """A tile of a tensor shaped as a Split's source (its split axis aside), cut along that
        axis to a divisor of the parts' sizes, so no tile straddles two parts: nudenet's
        1x256x10x10 SiLU split into two 128-channel halves, under tiles of 12 channels, failed
        PyPTO's compile (FFFFFF) or, at other budgets, took 287 us; under 16 or 32 channels
        21.3 and 14.4 us (docs/pypto-ops.md, "Split")."""
        for (frame, axis), step in self._split_parts.items():
            if len(frame) != len(shape) or tile[axis] >= shape[axis] or step % tile[axis] == 0 \
                    or any(d != f for a, (d, f) in enumerate(zip(shape, frame)) if a != axis):
                continue
            tile = (*tile[:axis], _largest_divisor(step, tile[axis]), *tile[axis + 1:])
        return tile

    def _rows_within_cube_tile(self, shape: tuple[int, ...], tile: tuple[int, ...]
                               ) -> tuple[int, ...]:
        """A vector tile over a matmul's product rows, with its rows dividing the cube's M tile:
        a vector tile across two cube tiles made PyPTO stage the product through GM once more
        (ppocrv4_det's 384x192x400 fp32 Conv with HardSwish, cube M tile 192: 2,723,072 B read
        and 2,451,200 written under vector tiles of 10 rows, 2,115,072 and 1,228,800, the
        platform bound, under 8 or 16; docs/pypto-ops.md, "MatMul")."""
        if self.cube_rows is None or len(shape) != 2 or shape[0] != self.product_rows \
                or tile[0] >= shape[0] or self.cube_rows % tile[0] == 0:
            return tile
        return (_largest_divisor(self.cube_rows, tile[0]), *tile[1:])

    def set_tile(self, tile: tuple[int, ...]) -> None:
        """Emit ``tile`` as the vector tile of the ops that follow (not a transpose result's)."""
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
                self.set_tile(tile)
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


def _largest_divisor(number: int, at_most: int) -> int:
    """The largest divisor of ``number`` not above ``at_most``: a tile side that does not
    straddle two blocks of ``number`` (a cube tile's rows, a Split's parts)."""
    return next(d for d in range(min(at_most, number), 0, -1) if number % d == 0)


def let(w: Writer, expression: str) -> str:
    """A fresh variable holding ``expression``, for a temporary no tensor is held in."""
    name = w.fresh()
    w.emit(f"{name} = {expression}")
    return name


def full(w: Writer, shape, value, dtype: int) -> str:
    """A ``pypto.full`` tile of ``value``: a constant as a tensor where PyPTO takes no scalar."""
    if dtype in BYTE_INTEGERS:  # "unsupported type, dstDtypeStr: int8_t" in its code generation
        raise CannotExpress(f"PyPTO 0.2.0 fills no {onnx.TensorProto.DataType.Name(dtype)} tile "
                            "(GenDupOp)")
    dt = pypto_dtype(dtype)
    return f"pypto.full({list(shape)}, pypto.Element({dt}, {float_literal(value)}), {dt})"
