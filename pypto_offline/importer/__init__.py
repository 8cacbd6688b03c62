"""ONNX → an in-memory graph with static shapes and every in-scope op in canonical form.

    graph = import_model("model.onnx", input_shapes={"x": [1, 3, 224, 224]})

Steps, each in its own module: load (external data kept inside the model's folder) → structural
checks and onnx's checker → fix input shapes → fold with onnxscript's optimizer → BatchNorms into
the weights before them (``batchnorm``) → shapes checked and completed by running the graph
(``shape_probe``) → normalise in-scope ops → records.
"""
from __future__ import annotations

import os
import time
from typing import Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.errors import ModelError
from pypto_offline.importer import batchnorm, folding, masks, quantised, shape_probe
from pypto_offline.importer.graph import ImportedGraph, ImportStats, Node, TensorInfo
from pypto_offline.importer.input_shapes import (check_dims, check_given_inputs, fix_input_shapes,
                                                 graph_inputs)
from pypto_offline.importer.loading import load_model
from pypto_offline.importer.normalise import normalise_graph
from pypto_offline.importer.validation import check_structure, default_opset, run_checker
from pypto_offline.registry.ops import is_op
from pypto_offline.runtime import CannotRun, in_input_types

__all__ = ["ImportedGraph", "ImportStats", "Node", "TensorInfo", "import_model"]

# Folding can make a Shape static that the first probe left open, and the next probe then sees
# further; three rounds reach the fixed point on every corpus model.
MAX_PROBE_ROUNDS = 3


def import_model(source: "str | os.PathLike | bytes | onnx.ModelProto",
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 base_dir: "str | os.PathLike | None" = None, *,
                 inputs: Mapping[str, np.ndarray] | None = None,
                 must_run: bool = False,
                 dims: Mapping[str, int] | None = None,
                 input_dtypes: Mapping[str, np.dtype] | None = None) -> ImportedGraph:
    """Load, check, fold and normalise a model. Raises ``PyptoOfflineError`` on bad input.

    ``inputs``: real values of some inputs (checked against them), fed to the shape probe so a
    model whose shapes depend on them (a Reshape's shape given as an input) gets static shapes.
    ``must_run``: the model will be verified in onnxruntime, so one that cannot run there (a
    custom-domain op) is refused now rather than after the whole compile.
    ``dims``: symbolic dimensions fixed by name in every input that has them (``--dim``);
    ``input_shapes`` wins for the inputs it names.
    ``input_dtypes``: the blob's own dtype of an input whose ``inputs`` value is not in the
    model's (``--input_fp16_nodes``: float16); the probe gets it in the model's type.
    """
    started = time.perf_counter()
    model, label = load_model(source, base_dir)
    nodes_in_source = len(model.graph.node)
    opset = default_opset(model, label)
    check_structure(model, label)
    run_checker(model, label)
    fix_input_shapes(model, input_shapes, label, dims)
    check_given_inputs(model, inputs or {}, label, input_dtypes)
    given = in_input_types(model, inputs or {})
    model, probed, cannot_run, integer = _fold_to_fixed_point(model, given, label)
    nodes_after_folding = len(model.graph.node)
    inferred = _inferred_types(model)
    tensors, corrected = _merge_shapes(model, inferred, probed, label)
    shapes = {name: info.shape for name, info in tensors.items()}
    dtypes = {name: info.dtype for name, info in tensors.items()}
    model, records = normalise_graph(model, opset, shapes, dtypes, label)
    # After normalising, whose messages name the node and the fix. A model with ops of other
    # domains may need another runtime: only a pure-ONNX model must run here.
    if cannot_run is not None and all(n.domain in ("", "ai.onnx") for n in model.graph.node):
        first = str(cannot_run).strip().splitlines()[0]
        raise ModelError(f"onnxruntime cannot run the model: {first}", where=label,
                         fix="re-export the model; it must run in onnxruntime as it is"
                         + ("" if given else ", or give the inputs its shapes depend on "
                                             "with --inputs"))
    if cannot_run is not None and must_run:
        first = str(cannot_run).strip().splitlines()[0]
        raise ModelError(f"the model cannot be verified here: onnxruntime cannot run it ({first})",
                         where=label, fix="--no-verify builds it without the check")
    _write_value_info(model, tensors)
    stats = ImportStats(
        nodes_in_source=nodes_in_source,
        nodes_after_folding=nodes_after_folding,
        nodes_normalised=_count_normalised(records),
        shapes_corrected=tuple(corrected),
        quantised=integer,
        seconds=time.perf_counter() - started)
    return ImportedGraph(
        model=model, opset=opset, nodes=tuple(records), tensors=tensors,
        inputs=tuple(v.name for v in graph_inputs(model)),
        outputs=tuple(o.name for o in model.graph.output),
        constants=frozenset(t.name for t in model.graph.initializer),
        symbolic=tuple(sorted(name for name, info in tensors.items() if info.shape is None)),
        stats=stats)


def _fold_to_fixed_point(model: onnx.ModelProto, given: Mapping[str, np.ndarray], label: str):
    """(folded model, probed shapes, the error if onnxruntime cannot run the model at all,
    what ``quantised`` made integer). Each fold and each probe runs only once its model's
    tensors fit the memory budget."""
    # The source's weights are in memory already, as initializers or as Constant nodes (which
    # folding lifts to initializers of the same name): only what is computed counts.
    weights = {t.name for t in model.graph.initializer}
    weights |= {n.output[0] for n in model.graph.node if is_op(n, "Constant") and n.output}
    shape_probe.check_memory(model, label, weights)
    model = batchnorm.fold_batch_norms(folding.fold(model))
    model, integer = quantised.fold_quantised(model)
    integer = integer.summary()
    try:
        shape_probe.check_memory(model, label, weights)
        probed = shape_probe.probe(model, given)
        for _ in range(MAX_PROBE_ROUNDS):
            if not _has_foldable_shape_ops(model, probed):
                break
            known = {name: shape for name, (_, shape) in probed.items() if shape is not None}
            model = folding.fold(model, known)
            shape_probe.check_memory(model, label, weights)
            probed = shape_probe.probe(model, given)
        # each mask copy has its original's type and shape: no probe runs again for them
        probed.update({copy: probed[original] for copy, original
                       in masks.one_mask_per_reader(model.graph).items() if original in probed})
    except CannotRun as error:
        return model, {}, error, integer
    return model, probed, None, integer


def _has_foldable_shape_ops(model: onnx.ModelProto, probed) -> bool:
    """A Shape or Size node whose input the probe saw with a static shape can still be folded."""
    static = {name for name, (_, shape) in probed.items() if shape is not None}
    static |= {v.name for v in graph_inputs(model)}
    return any(is_op(node, "Shape Size") and node.input[0] in static
               for node in model.graph.node)


def _inferred_types(model: onnx.ModelProto) -> dict[str, tuple[int, tuple | None]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is a hint here; the probe below is the ground truth
        inferred = model
    graph = inferred.graph
    types = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if not value.type.HasField("tensor_type"):
            continue
        tensor_type = value.type.tensor_type
        shape = None
        dims = tensor_type.shape.dim
        # Exporters declare unknown sizes as -1 as well as by name.
        if tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value >= 0
                                                 for d in dims):
            shape = tuple(d.dim_value for d in tensor_type.shape.dim)
        types[value.name] = (tensor_type.elem_type, shape)
    for tensor in graph.initializer:
        types[tensor.name] = (tensor.data_type, tuple(tensor.dims))
    return types


def _merge_shapes(model, inferred, probed, label):
    """Probe shapes win over inferred ones; returns TensorInfo per tensor and the corrected names."""
    tensors: dict[str, TensorInfo] = {}
    corrected = []
    names = [v.name for v in model.graph.input] + [t.name for t in model.graph.initializer]
    names += [name for node in model.graph.node for name in node.output if name]
    for name in dict.fromkeys(names):
        elem_type, shape = inferred.get(name, (0, None))
        if name in probed:
            probe_dtype, probe_shape = probed[name]
            if shape is not None and probe_shape is not None and shape != probe_shape:
                corrected.append(name)
            shape = probe_shape if probe_shape is not None else shape
            elem_type = elem_type or onnx.helper.np_dtype_to_tensor_dtype(probe_dtype)
        if elem_type == 0:
            continue  # sequences, maps, optionals: not tensors the compiler handles
        if shape is not None:
            check_dims(shape, f"{label}, tensor {name!r}")
        tensors[name] = TensorInfo(name, elem_type, shape)
    return tensors, corrected


def _write_value_info(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo]) -> None:
    """Record every static shape in the model itself, for onnxruntime, Netron and later stages."""
    graph = model.graph
    boundary = {v.name for v in graph.input} | {v.name for v in graph.output}
    boundary |= {t.name for t in graph.initializer}
    del graph.value_info[:]
    for name, info in tensors.items():
        if name not in boundary and info.shape is not None:
            graph.value_info.append(onnx.helper.make_tensor_value_info(name, info.dtype, info.shape))


def _count_normalised(records: list[Node]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in records:
        if node.in_scope:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))
