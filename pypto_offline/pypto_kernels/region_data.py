"""A region's functional check: its original ops as a model of their own, the seeded arguments
a kernel is run on, and onnxruntime's result on them (the reference a kernel must match)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper

from pypto_offline.fusion.classify import kernel_dtype
from pypto_offline.fusion.records import Region
from pypto_offline.importer import ImportedGraph
from pypto_offline.importer.bands import in_source
from pypto_offline.pypto_kernels.codegen.kernel import region_tolerance
from pypto_offline.runtime import kernel_check, run_model, within_tolerance

# The torch dtype a worker allocates a kernel's output in, by ONNX element type.
TORCH_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
                onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.INT32: "int32",
                onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT8: "int8",
                onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT16: "int16",
                onnx.TensorProto.BOOL: "bool"}


def output_specs(region: Region) -> tuple[dict, ...]:
    """The region's outputs as the worker allocates them."""
    return tuple({"shape": list(region.tensor_types[o][0]),
                  "dtype": TORCH_DTYPES[kernel_dtype(region.tensor_types[o][1])]}
                 for o in region.outputs)


def region_data(region: Region, graph: ImportedGraph, constants: dict):
    """Kernel arguments (seeded, or the constant's own value) and onnxruntime's result for the
    region's original ops on them."""
    rng = np.random.default_rng(0)

    def seeded(name: str) -> np.ndarray:
        info = graph.tensors[name]
        dtype = info.np_dtype
        if dtype == np.bool_:
            return rng.integers(0, 2, size=info.shape).astype(bool)
        if np.issubdtype(dtype, np.floating):
            return rng.uniform(-1.0, 1.0, size=info.shape).astype(dtype)
        return rng.integers(0, 4, size=info.shape).astype(dtype)
    arrays, feeds = kernel_arguments(region, constants, seeded)
    model = region_model(region, graph)
    outputs = run_model(model, feeds)
    reference = [in_kernel_dtype(outputs[name]) for name in region.outputs]
    if any(elem_type == onnx.TensorProto.FLOAT16 for _, elem_type in region.tensor_types.values()):
        return arrays, _per_op_where_apart(model, feeds, reference, region)
    return arrays, reference


def _per_op_where_apart(model: onnx.ModelProto, feeds: dict, reference: list,
                        region: Region) -> list:
    """onnxruntime's result, or where it is further from the region's ops evaluated one by one
    in their declared types (onnx's reference evaluator: each op's result rounded to fp16, an
    overflow an infinity) than the functional check's bound, the latter. onnxruntime's CPU
    provider runs an fp16 op it has no kernel for in fp32 and drops the casts between two such
    ops, so an fp16 intermediate it never rounds can be finite there and infinite in every fp16
    implementation: nemo80's sum of squares over 101 frames on the seeded data (76,547) under
    force_fp16, where the kernel divided by infinity as fp16 must and was 0.097 off onnxruntime
    (docs/precision.md). Where the two agree (every region of the corpus but nemo80's two),
    onnxruntime's result is kept."""
    import onnx.reference

    with np.errstate(all="ignore"):  # fp16's overflows are the point here, not news
        try:
            evaluated = onnx.reference.ReferenceEvaluator(model).run(None, dict(feeds))
        except Exception:  # noqa: BLE001 - an op the evaluator lacks: onnxruntime's stands
            return reference
        per_op = [in_kernel_dtype(np.asarray(value).astype(expected.dtype, copy=False))
                  for value, expected in zip(evaluated, reference)]
        apart = kernel_check(reference, per_op)
    if within_tolerance(apart["max_abs_diff"], region_tolerance(region), apart["magnitude"]):
        return reference
    return per_op


def kernel_arguments(region: Region, constants: dict, value_of: Callable[[str], np.ndarray]
                     ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """A kernel's arguments in order, in its element types (an int64 tensor narrowed to int32:
    classify.kernel_dtype): each constant's own value (a scalar or a band is in the source:
    importer/bands.py), and
    ``value_of`` each other input (the seeded check's, or the original model's:
    precision_check.py); and those values by name, as given."""
    arrays, feeds = [], {}
    for name in region.inputs:
        if name in constants:
            if not in_source(constants[name]):
                arrays.append(np.asarray(constants[name]))
            continue
        feeds[name] = value_of(name)
        arrays.append(feeds[name])
    return [in_kernel_dtype(a) for a in arrays], feeds


def in_kernel_dtype(array: np.ndarray) -> np.ndarray:
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    return array.astype(onnx.helper.tensor_dtype_to_np_dtype(kernel_dtype(elem_type)),
                        copy=False)


def region_model(region: Region, graph: ImportedGraph) -> onnx.ModelProto:
    """The region's original nodes as a model of their own (the functional check's reference)."""
    members = set(region.nodes)
    nodes = [n for n in graph.model.graph.node if n.output[0] in members]
    used = {name for n in nodes for name in n.input}
    initializers = [t for t in graph.model.graph.initializer if t.name in used]
    constant_names = {t.name for t in initializers}
    value_info = lambda name: helper.make_tensor_value_info(  # noqa: E731
        name, graph.tensors[name].dtype, list(graph.tensors[name].shape))
    model = helper.make_model(
        helper.make_graph(nodes, region.id,
                          [value_info(n) for n in region.inputs if n not in constant_names],
                          [value_info(n) for n in region.outputs], initializers),
        opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    return model
