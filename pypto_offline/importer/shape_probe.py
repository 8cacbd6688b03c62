"""Shapes as onnxruntime computes them, to check and complete onnx's shape inference.

onnx's inference gets some ops wrong (STFT with ``onesided`` gives 512 bins where the op gives
257) and cannot see through others. With every graph input static, running the graph once shows
each tensor's real shape. It runs twice, on zeros and on ones: a tensor whose shape differs between
the two depends on data and stays symbolic.
"""
from __future__ import annotations

import numpy as np
import onnx

from pypto_offline.importer.input_shapes import graph_inputs
from pypto_offline.runtime import CannotRun, run_model


def static_input_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]] | None:
    shapes = {}
    for value in graph_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if not value.type.HasField("tensor_type") or not all(d.HasField("dim_value") for d in dims):
            return None
        shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


def probe(model: onnx.ModelProto) -> dict[str, tuple[np.dtype, tuple[int, ...] | None]]:
    """name → (dtype, shape or None if data-dependent) for every node output; {} if the inputs
    are not static or one of the two runs fails. Raises ``CannotRun`` if neither run works."""
    shapes = static_input_shapes(model)
    if shapes is None:
        return {}
    exposed = _expose_all_values(model)
    runs, errors = [], []
    for fill in (0, 1):
        feeds = {value.name: np.full(shapes[value.name], fill, dtype=_np_dtype(value))
                 for value in graph_inputs(model)}
        try:
            runs.append(run_model(exposed, feeds))
        except CannotRun as error:
            errors.append(error)
    if len(errors) == 2:
        # Some inputs are invalid as all zeros (a Range step), none as zeros and as ones:
        # the model itself cannot run (mixed dtypes in one op, say).
        raise errors[-1]
    if errors:
        return {}
    first, second = runs
    return {name: (array.dtype, array.shape if second[name].shape == array.shape else None)
            for name, array in first.items()
            if isinstance(array, np.ndarray) and isinstance(second.get(name), np.ndarray)}


def _np_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)


def _expose_all_values(model: onnx.ModelProto) -> onnx.ModelProto:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.value_info[:]  # a wrong inferred shape would make onnxruntime refuse the graph
    present = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in present:
                exposed.graph.output.add().name = name
                present.add(name)
    return exposed


