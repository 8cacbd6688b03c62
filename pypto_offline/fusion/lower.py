"""The compiled graph: each fused region becomes one node calling an ONNX local function.

The function lives in the ``pypto.offline`` domain; its body is the region's simplified program,
encoded at the model's opset (a function must use the model's opset) with parameters as Constant
nodes. The calling node carries the kernel id and the region's figures as attributes, so the model
loads in onnxruntime and in Netron and says what was fused.
"""
from __future__ import annotations

from types import MappingProxyType

import networkx as nx
import numpy as np
import onnx
from onnx import helper, numpy_helper

from pypto_offline.fusion.program import Program
from pypto_offline.fusion.records import Region, RegionOp
from pypto_offline.importer import ImportedGraph
from pypto_offline.importer.encoding import encode
from pypto_offline.registry.attributes import attribute, register

DOMAIN = "pypto.offline"
DOMAIN_VERSION = 1


# The ONNX ops a program op is written as, where it is not one itself (registered with the op)
AS_ONNX = "as_onnx_ops"


@register(AS_ONNX, "Roll")
def roll_as_slices(op: RegionOp, program: Program) -> list[RegionOp]:
    """Roll has no ONNX op: x[k:] then x[:k], concatenated."""
    source = op.inputs[0]
    dims = program.shapes[source]
    axis, shift = op.params["axis"], op.params["shift"]
    parts = []
    for index, (lo, hi) in enumerate(((shift, dims[axis]), (0, shift))):
        starts = tuple(lo if a == axis else 0 for a in range(len(dims)))
        ends = tuple(hi if a == axis else d for a, d in enumerate(dims))
        parts.append(RegionOp("Slice", (source,), (f"{op.outputs[0]}__roll{index}",),
                              MappingProxyType({"starts": starts, "ends": ends,
                                                "steps": (1,) * len(dims)})))
    concat = RegionOp("Concat", tuple(p.outputs[0] for p in parts), op.outputs,
                      MappingProxyType({"axis": axis}))
    return parts + [concat]


@register(AS_ONNX, "MatMul")
def matmul_with_bias_as_add(op: RegionOp, program: Program) -> list[RegionOp]:
    """A MatMul with a bias (``rules.bias_into_matmul``) is ONNX's MatMul, then Add."""
    if len(op.inputs) == 2:
        return [op]
    product = f"{op.outputs[0]}__product"
    program.shapes[product] = program.shapes[op.outputs[0]]
    program.dtypes[product] = program.dtypes[op.outputs[0]]
    return [RegionOp("MatMul", op.inputs[:2], (product,), op.params),
            RegionOp("Add", (product, op.inputs[2]), op.outputs, MappingProxyType({}))]


def _as_onnx_ops(op: RegionOp, program: Program) -> list[RegionOp]:
    """The program op as ops ONNX has."""
    as_onnx = attribute(AS_ONNX, op.op_type)
    return [op] if as_onnx is None else as_onnx(op, program)


def function_body(program: Program, opset: int) -> list[onnx.NodeProto]:
    nodes: list[onnx.NodeProto] = []
    for op in program.ops:
        for step in _as_onnx_ops(op, program):
            nodes.extend(_encode_with_constants(step, program, opset))
    return nodes


def _encode_with_constants(op: RegionOp, program: Program, opset: int) -> list[onnx.NodeProto]:
    constants: list[onnx.NodeProto] = []

    def make_constant(param: str, value: np.ndarray) -> str:
        name = f"{op.outputs[0]}__{param}"
        constants.append(helper.make_node("Constant", [], [name],
                                          value=numpy_helper.from_array(value, name)))
        return name

    dtype = program.dtypes.get(op.inputs[0], 0) if op.inputs else 0
    node = encode(op.op_type, op.params, op.inputs, op.outputs, opset, dtype, make_constant)
    return constants + [node]


def region_function(region: Region, program: Program, opset: int) -> onnx.FunctionProto:
    return helper.make_function(
        DOMAIN, region.id, list(region.inputs), list(region.outputs),
        function_body(program, opset), [helper.make_opsetid("", opset)])


def region_call(region: Region) -> onnx.NodeProto:
    return helper.make_node(
        region.id, list(region.inputs), list(region.outputs), name=region.id, domain=DOMAIN,
        kernel_id=region.id, fused_ops=len(region.original),
        simplified_ops=len(region.simplified),
        ops=",".join(op.op_type for op in region.original),
        gm_bytes_unfused=region.unfused.gm_bytes, gm_bytes_fused=region.fused.gm_bytes,
        kernels_unfused=region.unfused.kernels)


def program_of(region: Region) -> Program:
    """The simplified program again, from the region record alone."""
    return Program(ops=list(region.simplified), inputs=region.inputs, outputs=region.outputs,
                   shapes={n: tuple(t[0]) for n, t in region.tensor_types.items()},
                   dtypes={n: t[1] for n, t in region.tensor_types.items()})


def compiled_model(graph: ImportedGraph, regions: list[Region]) -> onnx.ModelProto:
    """The imported model with every region replaced by its function call, in topological order."""
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    fused = {nid for region in regions for nid in region.nodes}
    kept = [n for n in model.graph.node if n.output[0] not in fused]
    calls = [region_call(region) for region in regions]
    nodes = _topological(kept + calls)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.functions.extend(region_function(region, program_of(region), graph.opset)
                           for region in regions)
    if regions:
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    _drop_dead_value_info(model)
    return model


def _topological(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    producer = {name: i for i, n in enumerate(nodes) for name in n.output if name}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(nodes)))
    for i, n in enumerate(nodes):
        for name in n.input:
            if name in producer and producer[name] != i:
                dag.add_edge(producer[name], i)
    return [nodes[i] for i in nx.lexicographical_topological_sort(dag)]


def _drop_dead_value_info(model: onnx.ModelProto) -> None:
    """Tensors now internal to a function no longer exist in the main graph."""
    live = {name for n in model.graph.node for name in list(n.input) + list(n.output)}
    kept = [v for v in model.graph.value_info if v.name in live]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    used = live | {o.name for o in model.graph.output}
    initializers = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(initializers)
