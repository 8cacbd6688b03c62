"""Structural checks with messages that name the node, before onnx's checker sees the model.

onnx's checker reports a cycle or a dangling input as "graph is not topologically sorted"; these
checks say which node and which tensor instead, and put a merely unsorted graph in order.
"""
from __future__ import annotations

import networkx as nx
import onnx

from pypto_offline.errors import ModelError

# onnx's own limit on the opset it knows; newer models need a newer onnx package.
MAX_KNOWN_OPSET = onnx.defs.onnx_opset_version()


def node_label(node: onnx.NodeProto, index: int) -> str:
    return f"node {node.name or '#' + str(index)} ({node.op_type})"


def default_opset(model: onnx.ModelProto, label: str) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise ModelError("the model imports no version of the default ONNX domain", where=label,
                         fix="re-export with an opset_import for domain ''")
    opset = versions[0]
    if opset < 1 or opset > MAX_KNOWN_OPSET:
        raise ModelError(f"default-domain opset {opset} is outside 1..{MAX_KNOWN_OPSET}",
                         where=label, fix="re-export with a released opset")
    return opset


def check_structure(model: onnx.ModelProto, label: str) -> None:
    """Duplicate or undefined tensors, unknown ops and cycles; sorts the nodes if needed."""
    graph = model.graph
    opset = default_opset(model, label)
    defined = _defined_names(graph, label)
    for index, node in enumerate(graph.node):
        _check_known_op(node, index, opset, label)
        for name in node.input:
            if name and name not in defined:
                raise ModelError(f"input {name!r} is not produced by any node, initializer or graph "
                                 f"input", where=f"{label}, {node_label(node, index)}",
                                 fix="the graph is broken: re-export the model")
    for output in graph.output:
        if output.name not in defined:
            raise ModelError(f"graph output {output.name!r} is not produced by any node",
                             where=label, fix="re-export the model")
    _sort_or_report_cycle(graph, label)


def _defined_names(graph: onnx.GraphProto, label: str) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            if name in defined:
                raise ModelError(f"tensor {name!r} is defined twice",
                                 where=f"{label}, {node_label(node, index)}",
                                 fix="every tensor name must be unique: re-export the model")
            defined.add(name)
    return defined


def _check_known_op(node: onnx.NodeProto, index: int, opset: int, label: str) -> None:
    if node.domain not in ("", "ai.onnx"):
        return  # other domains pass through untouched
    try:
        onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        raise ModelError(f"{node.op_type!r} is not an ONNX operator at opset {opset}",
                         where=f"{label}, {node_label(node, index)}",
                         fix="use a standard op or give the custom op its own domain") from None


def _sort_or_report_cycle(graph: onnx.GraphProto, label: str) -> None:
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output if name}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(graph.node)))
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name in producer:
                dag.add_edge(producer[name], i)
    if not nx.is_directed_acyclic_graph(dag):
        cycle = [u for u, _ in nx.find_cycle(dag)]
        names = " -> ".join(node_label(graph.node[i], i) for i in cycle + cycle[:1])
        raise ModelError(f"the graph has a cycle: {names}", where=label,
                         fix="ONNX graphs must be acyclic: re-export the model")
    order = list(nx.lexicographical_topological_sort(dag))
    if order != sorted(order):
        nodes = [graph.node[i] for i in order]
        del graph.node[:]
        graph.node.extend(nodes)


def run_checker(model: onnx.ModelProto, label: str) -> None:
    """onnx's checker, its message reduced to its first line."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0]
        raise ModelError(f"the ONNX checker rejects the model: {first}", where=label,
                         fix="re-export the model or fix the reported field") from None
