"""Shapes as onnxruntime computes them, to check and complete onnx's shape inference.

onnx's inference gets some ops wrong (STFT with ``onesided`` gives 512 bins where the op gives
257) and cannot see through others. With every graph input static, running the graph once shows
each tensor's real shape. It runs twice, on zeros and on ones: a tensor whose shape differs between
the two depends on data and stays symbolic. Inputs whose real values the caller gives (``--inputs``:
a Reshape's target shape, an Unsqueeze's axes) are fed those values in both runs instead.

The probe keeps every tensor of the graph, so before it (and before folding, which evaluates
constant subgraphs) ``check_memory`` refuses a model whose tensors, as onnx's shape inference sees
them, would not fit the budget (docs/outputs.md, "Resource limits").
"""
from __future__ import annotations

from typing import Collection, Mapping

import numpy as np
import onnx

from pypto_offline.errors import ModelError
from pypto_offline.importer.input_shapes import check_tensor_bytes, graph_inputs, human_bytes
from pypto_offline.runtime import CannotRun, run_model

# All tensors of one probe run together (it keeps every value; the two runs roughly double it).
# The corpus needs at most 670 MiB (ppocrv4_det at its bench shape); 2 GiB leaves room without
# letting a model take the machine's memory before any check. Also the bound on --inputs.
MAX_PROBE_BYTES = 2 << 30


def static_input_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]] | None:
    shapes = {}
    for value in graph_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if not value.type.HasField("tensor_type") or not all(d.HasField("dim_value") for d in dims):
            return None
        shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


def check_memory(model: onnx.ModelProto, label: str, known: Collection[str] = ()) -> None:
    """Refuse, before folding or probing, a model with a tensor larger than ``MAX_TENSOR_BYTES``
    or whose tensors together exceed ``MAX_PROBE_BYTES``, by the static shapes onnx's inference
    (with data propagation, so Shape → Concat → ConstantOfShape chains count) gives. Initializers
    named in ``known`` (the source's weights, already in memory) are not counted; those folding
    made are."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    except Exception:  # noqa: BLE001 - inference is an estimate here; the probe fails on its own
        inferred = model.graph
    sizes: dict[str, int] = {}
    for value in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        tensor_type = value.type.tensor_type
        dims = tensor_type.shape.dim
        if value.name in known or not value.type.HasField("tensor_type") \
                or not tensor_type.HasField("shape") \
                or not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
            continue
        sizes[value.name] = check_tensor_bytes([d.dim_value for d in dims], tensor_type.elem_type,
                                               f"{label}, tensor {value.name!r}")
    for tensor in model.graph.initializer:
        if tensor.name not in known:
            sizes[tensor.name] = check_tensor_bytes(tensor.dims, tensor.data_type,
                                                    f"{label}, folded constant {tensor.name!r}")
    total = sum(sizes.values())
    if total > MAX_PROBE_BYTES:
        raise ModelError(f"the model's tensors need {human_bytes(total)} together, more than the "
                         f"{human_bytes(MAX_PROBE_BYTES)} the importer may use to run it",
                         where=label, fix="give smaller input shapes (--input-shape)")


def probe(model: onnx.ModelProto, given: Mapping[str, np.ndarray] | None = None
          ) -> dict[str, tuple[np.dtype, tuple[int, ...] | None]]:
    """name → (dtype, shape or None if data-dependent) for every node output; {} if the inputs
    are not static or one of the two runs fails. Raises ``CannotRun`` if neither run works.
    Inputs in ``given`` are fed their values in every run."""
    shapes = static_input_shapes(model)
    if shapes is None:
        return {}
    given = dict(given or {})
    exposed = _expose_all_values(model)
    runs, errors = [], []
    # With every input given, the two runs would be the same run.
    fills = (0, 1) if any(v.name not in given for v in graph_inputs(model)) else (0,)
    for fill in fills:
        feeds = {value.name: given[value.name] if value.name in given
                 else np.full(shapes[value.name], fill, dtype=_np_dtype(value))
                 for value in graph_inputs(model)}
        try:
            runs.append(run_model(exposed, feeds))
        except CannotRun as error:
            errors.append(error)
    if len(errors) == len(fills):
        # Some inputs are invalid as all zeros (a Range step), none as zeros and as ones:
        # the model itself cannot run (mixed dtypes in one op, say).
        raise errors[-1]
    if errors:
        return {}
    first, second = runs[0], runs[-1]
    return {name: (array.dtype, array.shape if second[name].shape == array.shape else None)
            for name, array in first.items()
            if isinstance(array, np.ndarray) and isinstance(second.get(name), np.ndarray)}


def _np_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)


def every_value(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """Every node output's value in one run on ``feeds`` (the graph inputs with them): what a
    converted build's kernels are compared with (pypto_kernels/precision_check.py). The caller
    checks the memory first (``check_memory``)."""
    values = run_model(_expose_all_values(model), feeds)
    return {**values, **{name: np.asarray(value) for name, value in feeds.items()}}


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


