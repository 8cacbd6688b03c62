"""Fix the graph inputs' shapes from the caller, and refuse impossible dimensions."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.errors import ModelError, UsageError

# PyPTO indexes tensors with int32 ("shape size of tensor must less than or equal to INT32_MAX"),
# so no tensor the compiler handles may hold more elements than that.
MAX_ELEMENTS = 2**31 - 1


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
            if value.type.tensor_type.HasField("shape") and len(shape.dim) != len(dims):
                raise UsageError(f"the model declares rank {len(shape.dim)}, got {len(dims)} "
                                 f"dimensions {dims}", where=where,
                                 fix="give one number per dimension")
            _write_dims(value, dims)
        elif value.type.tensor_type.HasField("shape"):
            _check_declared(shape, where)
            if all(d.HasField("dim_value") for d in shape.dim):
                check_dims([d.dim_value for d in shape.dim], where)


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
