"""Fix the graph inputs' shapes from the caller, refuse impossible dimensions and tensors too large
to hold, and check the real input values a caller gives against the inputs they feed.

The memory limits are explained in docs/outputs.md ("Resource limits").
"""
from __future__ import annotations

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


def parse_shape_option(text: str) -> tuple[str, list[int]]:
    """``NAME=D0,D1,...`` (the CLI's ``--input-shape``) → (name, dims)."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--input-shape {text!r} is not NAME=D0,D1,...",
                         fix="for example --input-shape x=1,3,224,224")
    try:
        values = [int(d) for d in dims.split(",")] if dims.strip() else []
    except ValueError:
        raise UsageError(f"--input-shape {text!r}: dimensions must be whole numbers",
                         fix="for example --input-shape x=1,3,224,224") from None
    return name, values


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


def _dtype_name(elem_type: int) -> str:
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "?"


def human_bytes(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def check_tensor_bytes(dims: Sequence[int], elem_type: int, where: str) -> int:
    """The tensor's size in bytes; refuses one larger than ``MAX_TENSOR_BYTES``."""
    size = tensor_bytes(dims, elem_type)
    if size > MAX_TENSOR_BYTES:
        dtype = _dtype_name(elem_type)
        raise ModelError(f"a tensor of shape {list(dims)} ({dtype}) needs {human_bytes(size)}, "
                         f"more than the {human_bytes(MAX_TENSOR_BYTES)} a tensor may take here",
                         where=where, fix="give smaller shapes (--input-shape) or check the model")
    return size


def fix_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None,
                     label: str) -> None:
    """Write the caller's shapes into the graph inputs (in place) and validate declared dims."""
    inputs = {i.name: i for i in graph_inputs(model)}
    given = dict(input_shapes or {})
    unknown = sorted(set(given) - set(inputs))
    if unknown:
        raise UsageError(f"the model has no input {unknown[0]!r}", where=label,
                         fix=f"its inputs are: {', '.join(inputs) or '(none)'}")
    for name, value in inputs.items():
        where = f"{label}, input {name!r}"
        if not value.type.HasField("tensor_type"):
            continue  # sequences and optionals pass through; they cannot be fused
        shape = value.type.tensor_type.shape
        if name in given:
            dims = [int(d) for d in given[name]]
            check_dims(dims, where)
            check_tensor_bytes(dims, value.type.tensor_type.elem_type, where)
            if value.type.tensor_type.HasField("shape") and len(shape.dim) != len(dims):
                raise UsageError(f"the model declares rank {len(shape.dim)}, got {len(dims)} "
                                 f"dimensions {dims}", where=where,
                                 fix="give one number per dimension")
            _write_dims(value, dims)
        elif value.type.tensor_type.HasField("shape"):
            _check_declared(shape, where)
            if all(d.HasField("dim_value") for d in shape.dim):
                check_dims([d.dim_value for d in shape.dim], where)
                check_tensor_bytes([d.dim_value for d in shape.dim],
                                   value.type.tensor_type.elem_type, where)


def check_given_inputs(model: onnx.ModelProto, given: Mapping[str, np.ndarray],
                       label: str) -> None:
    """Real input values (``--inputs``) must name model inputs and match their dtype and shape:
    a wrong one would otherwise reach onnxruntime, or its fallback evaluator, which may broadcast
    it and report a meaningless result."""
    inputs = {v.name: v for v in graph_inputs(model)}
    for name, array in given.items():
        if name not in inputs:
            raise UsageError(f"--inputs names {name!r}, which is not a model input", where=label,
                             fix=f"the inputs are: {', '.join(inputs) or '(none)'}")
        value = inputs[name]
        where = f"{label}, input {name!r}"
        if not value.type.HasField("tensor_type") or not isinstance(array, np.ndarray):
            raise UsageError("--inputs gives an array for an input that is not a tensor",
                             where=where, fix="give arrays for tensor inputs only")
        expected = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        if array.dtype != expected:
            raise UsageError(f"--inputs gives dtype {array.dtype}, the model expects {expected}",
                             where=where, fix=f"convert it with .astype(numpy.{expected})")
        if value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                        for d in dims]
            if len(dims) != array.ndim or any(isinstance(d, int) and d != n
                                               for d, n in zip(declared, array.shape)):
                raise UsageError(f"--inputs gives shape {list(array.shape)}, the model expects "
                                 f"{declared}", where=where,
                                 fix="give an array of the input's shape (after --input-shape)")


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
            dim.dim_param = "dynamic"
