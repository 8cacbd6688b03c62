"""Fix the graph inputs' shapes from the caller, refuse impossible dimensions and tensors too large
to hold, and check the real input values a caller gives against the inputs they feed.

The memory limits are explained in docs/outputs.md ("Resource limits").
"""
from __future__ import annotations

import ast
import operator

from typing import Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.errors import ModelError, UsageError

# PyPTO indexes tensors with int32 ("shape size of tensor must less than or equal to INT32_MAX"),
# so no tensor the compiler handles may hold more elements than that.
MAX_ELEMENTS = 2**31 - 1
# No single tensor the importer computes or is given may need more than this: the shape probe
# holds every tensor of the graph at once, and an on-device activation of this size is already
# far beyond any NPU's memory. A 1e8-element float32 tensor (400 MB) is refused.
MAX_TENSOR_BYTES = 256 << 20
# The name ``_check_declared`` gives an exporter's -1 (a dynamic dimension without a name): no
# --dim can fix it, as --dim matches the names the model declares.
UNNAMED = "dynamic"


class GivenShape(list):
    """An input's shape as the command line gave it: its dimensions, and the option that gave
    them, ``--input-shape`` (NAME=DIMS) or ATC's ``--input_shape`` (NAME:DIMS;...), two syntaxes:
    a message about the shape names the one the user typed (``shape_option``)."""

    def __init__(self, dims=(), option: str = "--input-shape"):
        super().__init__(dims)
        self.option = option


def shape_option(dims: Sequence[int]) -> str:
    """The option that gave a shape; ``--input-shape`` for the Python API's plain lists."""
    return getattr(dims, "option", "--input-shape")


def parse_shape_option(text: str) -> tuple[str, GivenShape]:
    """``NAME=D0,D1,...`` (the CLI's ``--input-shape``) → (name, dims)."""
    name, sep, dims = text.rpartition("=")
    example = "for example --input-shape x=1,3,224,224"
    if not sep or not name:
        raise UsageError(f"--input-shape {text!r} is not NAME=D0,D1,...", fix=example)
    return name, GivenShape(_whole_numbers(dims, f"--input-shape {text!r}", example))


def parse_atc_shapes(text: str) -> list[tuple[str, GivenShape]]:
    """``NAME:D0,D1,...;NAME:D0,...`` (ATC's ``--input_shape``) → [(name, dims), ...]. The name
    is what precedes the last colon, as a TensorFlow name ``x:0`` may hold one; an empty part (a
    trailing ``;``) is skipped."""
    example = 'for example --input_shape "x:1,3,224,224;y:1,16"'
    shapes = []
    for part in filter(str.strip, text.split(";")):
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise UsageError(f"--input_shape {text!r}: {part!r} is not NAME:D0,D1,...",
                             fix=example)
        dims = _whole_numbers(dims, f"--input_shape {text!r}", example)
        shapes.append((name, GivenShape(dims, "--input_shape")))
    if not shapes:
        raise UsageError(f"--input_shape {text!r} names no input", fix=example)
    return shapes


def _whole_numbers(text: str, option: str, example: str) -> list[int]:
    try:
        return [int(d) for d in text.split(",")] if text.strip() else []
    except ValueError:
        raise UsageError(f"{option}: dimensions must be whole numbers", fix=example) from None


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs: graph inputs that no initializer backs."""
    initialized = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initialized]


def check_dims(dims: Sequence[int], where: str) -> None:
    for dim in dims:
        if dim < 0:
            raise ModelError(f"dimension {dim} is negative", where=where,
                             fix="dimensions are sizes: give a positive number")
        if dim > MAX_ELEMENTS:
            raise ModelError(f"dimension {dim} is larger than {MAX_ELEMENTS}", where=where,
                             fix="check the shape: no tensor can be this large")
    if int(np.prod([int(d) for d in dims], dtype=object)) > MAX_ELEMENTS:
        raise ModelError(f"shape {list(dims)} has more than {MAX_ELEMENTS} elements", where=where,
                         fix="check the shape: the compiler handles tensors up to 2^31-1 elements")


def tensor_bytes(dims: Sequence[int], elem_type: int) -> int:
    """Bytes a tensor of this shape and ONNX element type needs (at least one byte an element:
    the packed 4-bit types are held unpacked by every runtime here)."""
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 1
    return int(np.prod([int(d) for d in dims], dtype=object)) * max(itemsize, 1)


def dtype_name(elem_type: int) -> str:
    """numpy's name of an ONNX element type (float32, int64), else ONNX's own (bfloat16), else
    ``type 31`` for a number ONNX does not define (a damaged or hostile model's)."""
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        pass
    if not elem_type:
        return "?"
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type {elem_type}"


def human_bytes(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def check_tensor_bytes(dims: Sequence[int], elem_type: int, where: str) -> int:
    """The tensor's size in bytes; refuses one larger than ``MAX_TENSOR_BYTES``."""
    size = tensor_bytes(dims, elem_type)
    if size > MAX_TENSOR_BYTES:
        dtype = dtype_name(elem_type)
        raise ModelError(f"a tensor of shape {list(dims)} ({dtype}) needs {human_bytes(size)}, "
                         f"more than the {human_bytes(MAX_TENSOR_BYTES)} a tensor may take here",
                         where=where, fix="give smaller shapes (--input-shape) or check the model")
    return size


def fix_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None,
                     label: str, dims: Mapping[str, int] | None = None) -> None:
    """Write the caller's shapes into the graph inputs (in place) and validate declared dims.
    ``dims`` fixes symbolic dimensions by name (``--dim batch=1``) in every input that has them;
    a shape in ``input_shapes`` wins for the input it names. A given shape must keep the
    model's static dimensions: only its symbolic ones are the caller's to choose."""
    inputs = {i.name: i for i in graph_inputs(model)}
    given = dict(input_shapes or {})
    named = dict(dims or {})
    unknown = sorted(set(given) - set(inputs))
    if unknown:
        raise UsageError(f"the model has no input {unknown[0]!r}", where=label,
                         fix=f"its inputs are: {', '.join(inputs) or '(none)'}")
    check_named_dims(inputs.values(), named, label)
    for name, value in inputs.items():
        where = f"{label}, input {name!r}"
        if not value.type.HasField("tensor_type"):
            continue  # sequences and optionals pass through; they cannot be fused
        shape = value.type.tensor_type.shape
        if name in given:
            dims_given = [int(d) for d in given[name]]
            check_dims(dims_given, where)
            _check_not_empty(dims_given, where)
            check_tensor_bytes(dims_given, value.type.tensor_type.elem_type, where)
            if value.type.tensor_type.HasField("shape"):
                _check_keeps_static_dims(shape, dims_given, where, shape_option(given[name]))
            _write_dims(value, dims_given)
        elif value.type.tensor_type.HasField("shape"):
            _fix_named_dims(shape, named)
            _check_declared(shape, where)
            if all(d.HasField("dim_value") for d in shape.dim):
                check_dims([d.dim_value for d in shape.dim], where)
                check_tensor_bytes([d.dim_value for d in shape.dim],
                                   value.type.tensor_type.elem_type, where)


def _check_not_empty(dims: Sequence[int], where: str) -> None:
    """A shape the user gives with a dimension of 0 is refused: the input would be empty, a
    kernel over it fails PyPTO's compile, and a batch or sequence of 0 is a slip. (A model that
    declares an empty input itself, as some ONNX backend cases do, is the model's own.)"""
    if 0 in dims:
        raise UsageError(f"shape {list(dims)} has a dimension of size 0: the input would be empty",
                         where=where, fix="give every dimension a size of at least 1")


def symbolic_dims(value: onnx.ValueInfoProto) -> list[str]:
    """The names of an input's symbolic dimensions, in order, each once (those ``--dim`` can
    fix: not an exporter's -1 nor a dimension without a name; for an expression of names, as
    ``past + 4``, the names in it)."""
    shape = value.type.tensor_type.shape
    return list(dict.fromkeys(name for d in shape.dim
                              if not d.HasField("dim_value") and d.dim_param
                              and d.dim_param != UNNAMED for name in _names_in(d.dim_param)))


# An exporter's expression of dimensions: torch.export names a mask over the past and the new
# tokens ``past + 4``. Longer text is a name, not parsed (a hostile model's nesting is no load).
MAX_EXPRESSION = 100
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def dim_size(param: str, dims: Mapping[str, int]) -> int | None:
    """A symbolic dimension's size from the named ones (``--dim``): by its name, or the value
    of an expression of names and whole numbers with ``+ - * // %``; None when it needs a
    name not given."""
    if param in dims:
        return int(dims[param])
    tree = _expression(param)
    return None if tree is None else _evaluate(tree, dims)


def _expression(param: str):
    if len(param) > MAX_EXPRESSION:
        return None
    try:
        return ast.parse(param, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _names_in(param: str) -> list[str]:
    """The names an expression of dimensions is made of (itself when it is none)."""
    tree = _expression(param)
    names = [] if tree is None else [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]
    if tree is None or _evaluate(tree, dict.fromkeys(names, 1)) is None:
        return [param]
    return names


def _evaluate(node, dims: Mapping[str, int]) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return int(dims[node.id]) if node.id in dims else None
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _evaluate(node.left, dims), _evaluate(node.right, dims)
        if left is None or right is None or (
                isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0):
            return None
        return _ARITHMETIC[type(node.op)](left, right)
    return None


def symbolic_input_error(value: onnx.ValueInfoProto, label: str) -> UsageError:
    """The error for an input left without a static shape, naming what would fix it: ``--dim``
    for each of its named symbolic dims when that is enough, else ``--input-shape``."""
    name = value.name
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return UsageError(f"input {name!r} has no declared shape: give --input-shape "
                          f"{name}=D0,D1,...", where=label)
    names = symbolic_dims(value)
    unnamed = sum(not d.HasField("dim_value") and d.dim_param in ("", UNNAMED)
                  for d in tensor.shape.dim)
    has = [f"symbolic dims {names}"] if names else []
    has += [f"{unnamed} dynamic dim(s) without a name"] if unnamed else []
    has = has or ["no static shape"]
    by_name = "" if unnamed else " ".join(f"--dim {n}=N" for n in names) + " or "
    return UsageError(f"input {name!r} has {' and '.join(has)}: give {by_name}--input-shape "
                      f"{name}=...", where=label)


def check_named_dims(inputs, dims: Mapping[str, int], label: str) -> None:
    """A ``--dim`` must name a symbolic dimension of some input (a typo would otherwise fix
    nothing and surface later as an input left dynamic) and give it a size."""
    declared = list(dict.fromkeys(name for value in inputs if value.type.HasField("tensor_type")
                                  for name in symbolic_dims(value)))
    for name, size in dims.items():
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) \
                or not 1 <= size <= MAX_ELEMENTS:
            raise UsageError(f"--dim {name}={size}: a dimension is a whole number from 1 to "
                             f"{MAX_ELEMENTS}", where=label, fix="for example --dim batch=1")
        if name not in declared:
            raise UsageError(f"--dim {name!r} names no symbolic dimension of the model's inputs",
                             where=label, fix=f"its symbolic dimensions are: "
                                              f"{', '.join(declared) or '(none)'}")


def _fix_named_dims(shape: onnx.TensorShapeProto, dims: Mapping[str, int]) -> None:
    for dim in shape.dim:
        size = None if dim.HasField("dim_value") else dim_size(dim.dim_param, dims)
        if size is not None:
            dim.dim_value = size  # clears dim_param: one of the two is set


def _check_keeps_static_dims(shape: onnx.TensorShapeProto, dims: Sequence[int], where: str,
                             option: str) -> None:
    """A given shape has the declared rank and every static dimension the model declares: a
    model built for 224x224 does not compute the same thing at 256x256, so a shape that
    contradicts it is the caller's mistake, not a choice. Declared sizes 0 and -1 are
    exporters' ways to write "dynamic" and constrain nothing."""
    if len(shape.dim) != len(dims):
        raise UsageError(f"the model declares rank {len(shape.dim)}, got {len(dims)} "
                         f"dimensions {dims}", where=where, fix="give one number per dimension")
    declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                else (d.dim_param or "?") for d in shape.dim]
    for axis, (fixed, size) in enumerate(zip(declared, dims)):
        if isinstance(fixed, int) and fixed != size:
            raise UsageError(f"{option} gives {list(dims)}, but the model declares "
                             f"{declared}: dimension {axis} is static, {fixed}", where=where,
                             fix="keep the model's static dimensions; only its symbolic ones "
                                 "can be given")


def check_given_inputs(model: onnx.ModelProto, given: Mapping[str, np.ndarray],
                       label: str, dtypes: Mapping[str, np.dtype] | None = None) -> None:
    """Real input values (``--inputs``) must name model inputs and match their dtype exactly and
    their shape: a wrong one would otherwise reach onnxruntime, or its fallback evaluator, which
    may broadcast or cast it and report a meaningless result. ``dtypes``: the blob's own dtype
    where it is not the model's (``--input_fp16_nodes``: float16, docs/outputs.md)."""
    inputs = {v.name: v for v in graph_inputs(model)}
    dtypes = dtypes or {}
    for name, array in given.items():
        if name not in inputs:
            raise UsageError(f"--inputs names {name!r}, which is not a model input", where=label,
                             fix=f"the inputs are: {', '.join(inputs) or '(none)'}")
        value = inputs[name]
        where = f"{label}, input {name!r}"
        if not value.type.HasField("tensor_type") or not isinstance(array, np.ndarray):
            raise UsageError("--inputs gives an array for an input that is not a tensor",
                             where=where, fix="give arrays for tensor inputs only")
        _check_dtype(array, value, dtypes.get(name), where)
        if value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                        for d in dims]
            if len(dims) != array.ndim or any(isinstance(d, int) and d != n
                                               for d, n in zip(declared, array.shape)):
                raise UsageError(f"--inputs gives shape {list(array.shape)}, the model expects "
                                 f"{declared}", where=where,
                                 fix="give an array of the input's shape (after --input-shape)")


def _check_dtype(array: np.ndarray, value: onnx.ValueInfoProto, blob_dtype: np.dtype | None,
                 where: str) -> None:
    """Exactly the dtype the blob takes, as onnxruntime requires: a cast would hide a wrong
    file (float64 values rounded, int32 widened) behind a check that passes."""
    declared = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    expected = np.dtype(blob_dtype or declared)
    if array.dtype != expected:
        option = " (--input_fp16_nodes)" if expected != declared else ""
        raise UsageError(f"--inputs gives dtype {array.dtype}, the model expects "
                         f"{expected}{option}", where=where,
                         fix=f"convert it with .astype(numpy.{expected})")


def _write_dims(value: onnx.ValueInfoProto, dims: Sequence[int]) -> None:
    shape = value.type.tensor_type.shape
    del shape.dim[:]
    for dim in dims:
        shape.dim.add().dim_value = dim


def _check_declared(shape: onnx.TensorShapeProto, where: str) -> None:
    # Exporters write -1 for "dynamic"; any other negative size, or an absurd one, is corrupt.
    for dim in shape.dim:
        if dim.HasField("dim_value"):
            if dim.dim_value < -1:
                raise ModelError(f"declared dimension {dim.dim_value} is negative", where=where,
                                 fix="fix the model's input shape or pass --input-shape")
            if dim.dim_value > MAX_ELEMENTS:
                raise ModelError(f"declared dimension {dim.dim_value} is absurdly large",
                                 where=where, fix="fix the model's input shape or pass --input-shape")
        if dim.HasField("dim_value") and dim.dim_value == -1:
            dim.Clear()
            dim.dim_param = UNNAMED
