"""Classification: which nodes are memory-bound ops the target's kernels can take.

Memory-bound = the ops of the registry (``registry/ops.py``: data movement, elementwise math,
reductions over trailing axes), in canonical form. Anything
else is a boundary. A memory-bound op the target cannot take (a dtype it lacks, an op or mode the
kernel generator cannot express, a rank too high) stays out with that reason.
"""
from __future__ import annotations

from types import MappingProxyType

import numpy as np
import onnx

from pypto_offline.fusion.records import BOUNDARY, CANNOT_EXPRESS
from pypto_offline.fusion.program import region_op
from pypto_offline.fusion.rows import (NotRows, reduced_rows, reduces_lone_elements, row_layout,
                                       trailing_axes)
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.registry.attributes import attribute, register
from pypto_offline.registry.ops import (POOL_OPS, REDUCTION, data_inputs,
                                        in_scope, kind_of, op_def)
from pypto_offline.targets import Target

__all__ = ["node_id", "node_tensors", "why_not_fusable"]


# No target's kernels take int64 (targets/): a kernel holds an int64 tensor as int32, narrowed
# on its way in and widened on its way out at the kernel's boundary, as ATC narrows a model's
# int64 inputs (attention masks, lengths, token ids). A constant beyond int32 keeps its op out.
KERNEL_DTYPES = MappingProxyType({onnx.TensorProto.INT64: onnx.TensorProto.INT32})
INT32_RANGE = (-(2**31), 2**31 - 1)
HALF_DTYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
FLOAT_DTYPES = HALF_DTYPES | {onnx.TensorProto.FLOAT}
BYTE_INTEGERS = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8})


def kernel_dtype(elem_type: int) -> int:
    """The element type a kernel holds a tensor of the model's ``elem_type`` in."""
    return KERNEL_DTYPES.get(elem_type, elem_type)


def node_id(node: Node) -> str:
    """Tensor names are unique (SSA), node names are not: a node is known by its first output."""
    return node.outputs[0]


def node_tensors(node: Node) -> list[str]:
    """The data tensors a kernel for this node would read and write (parameters excluded)."""
    inputs = data_inputs(node.op_type, node.inputs) if node.in_scope else list(node.inputs)
    return [name for name in list(inputs) + list(node.outputs) if name]


def why_not_fusable(node: Node, graph: ImportedGraph, target: Target) -> tuple[str, str] | None:
    """(category, reason) if the node cannot join a kernel; None if it can."""
    if not in_scope(node.op_type, node.domain):
        return BOUNDARY, f"{node.op_type} is not a memory-bound op"
    if not node.in_scope:
        return BOUNDARY, node.why_not_canonical or "not in canonical form"
    kernels = target.kernels
    if not op_def(node.op_type).lowers:
        return CANNOT_EXPRESS, (op_def(node.op_type).why_not or
                                f"the kernel generator ({kernels.source}) has no {node.op_type}")
    refusal = attribute(REFUSES, node.op_type, lambda node, kernels: None)(node, kernels)
    if refusal is not None:
        return CANNOT_EXPRESS, refusal
    for name in node_tensors(node):
        info = graph.tensors.get(name)
        if info is None or info.shape is None:
            return BOUNDARY, f"tensor {name!r} has no static shape"
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(kernel_dtype(info.dtype))).name
        if dtype not in target.dtypes.value:
            return CANNOT_EXPRESS, f"{target.name} kernels take no {info.np_dtype.name} ({name!r})"
        if info.dtype in KERNEL_DTYPES and name in graph.constants \
                and not _fits_int32(graph, name):
            return CANNOT_EXPRESS, (f"int64 constant {name!r} holds values beyond int32, which "
                                    "kernels hold int64 tensors in")
        if len(info.shape) > kernels.max_rank:
            return CANNOT_EXPRESS, f"rank {len(info.shape)} of {name!r} exceeds {kernels.max_rank}"
    first = node.inputs[0]  # the others have its type, but for Pow's exponent (cast to it)
    if graph.tensors[first].dtype in BYTE_INTEGERS \
            and attribute(FILLS_TILES, node.op_type, lambda node: False)(node):
        return CANNOT_EXPRESS, (f"this {node.op_type} needs tiles of constants, and PyPTO 0.2.0 "
                                "fills no 8-bit integer tile (GenDupOp)")
    if op_def(node.op_type).floats_only and graph.tensors[first].dtype not in FLOAT_DTYPES:
        return CANNOT_EXPRESS, (f"{node.op_type} of {graph.tensors[first].np_dtype.name} "
                                f"({first!r}): its lowering computes in floating point")
    if kind_of(node.op_type) == REDUCTION:
        return _why_no_rows(node, graph, target)
    return None


# Why the kernel generator cannot write a node of the op with its parameters, or None
REFUSES = "refuses_parameters"
# Whether the op's lowering fills tiles with constants, which PyPTO 0.2.0 cannot for 8 bits
FILLS_TILES = "fills_tiles"


@register(REFUSES, "Pad")
def _pad_mode(node: Node, kernels) -> str | None:
    mode = node.params["mode"]
    return None if mode in kernels.pad_modes else f"Pad mode {mode!r} is not expressible"


@register(REFUSES, "Slice")
def _negative_step(node: Node, kernels) -> str | None:
    return "Slice with a negative step is not expressible" \
        if any(step < 0 for step in node.params["steps"]) else None


# An integer Clip compares with tiles of its bounds; a padded pooling pads with them.
register(FILLS_TILES, "Clip")(lambda node: True)
register(FILLS_TILES, POOL_OPS)(lambda node: any(node.params["pads"]))


def _fits_int32(graph: ImportedGraph, name: str) -> bool:
    value = graph.constant(name)
    return value.size == 0 or INT32_RANGE[0] <= value.min() and value.max() <= INT32_RANGE[1]


# Tiles of whole rows a reduction's kernel keeps in UB at once (its input, the row results and
# the elementwise work around them): a longer row cannot run as rows (fusion/rows.py).
ROW_TILES_IN_UB = 4


def _why_no_rows(node: Node, graph: ImportedGraph, target: Target) -> tuple[str, str] | None:
    info = graph.tensors[node.inputs[0]]
    axes = node.params["axes"]
    if reduces_lone_elements(node, info.shape):
        return None  # a reshape (rules.reduction_over_one_element)
    if not trailing_axes(axes, len(info.shape)):
        return CANNOT_EXPRESS, (f"{node.op_type} over axes {list(axes)}: only trailing axes "
                                "reduce in rows")
    op = region_op(node, {name: graph.tensors[name].shape for name in node.outputs})
    row_bytes = reduced_rows(op, info.shape)[1] * np.dtype(info.np_dtype).itemsize
    if row_bytes * ROW_TILES_IN_UB > target.ub_plan_bytes.value:
        return CANNOT_EXPRESS, (f"{node.op_type} over rows of {row_bytes} bytes: "
                                f"{ROW_TILES_IN_UB} whole rows do not fit {target.name}'s UB")
    try:  # its parameters fit its rows (a batch of one image for per-row scales, ...)
        row_layout([op], {name: graph.tensors[name].shape for name in op.inputs + op.outputs
                          if name})
    except NotRows as why:
        return CANNOT_EXPRESS, f"{node.op_type} does not run as rows: {why}"
    return None
