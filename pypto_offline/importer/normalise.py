"""The normalisation pass: every in-scope node rewritten into its canonical form."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from pypto_offline.importer.canonical import normalise
from pypto_offline.importer.node_context import NodeContext, NotCanonical
from pypto_offline.importer.encoding import encode
from pypto_offline.importer.graph import Node
from pypto_offline.registry.ops import data_inputs
from pypto_offline.registry.ops import in_scope
from pypto_offline.importer.validation import node_label


def normalise_graph(model: onnx.ModelProto, opset: int, shapes: Mapping[str, tuple | None],
                    dtypes: Mapping[str, int], label: str) -> tuple[onnx.ModelProto, list[Node]]:
    """Return the rewritten model and the node records, in graph order."""
    graph = model.graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    new_nodes: list[onnx.NodeProto] = []
    records: list[Node] = []
    added: list[onnx.TensorProto] = []
    for index, node in enumerate(graph.node):
        if not in_scope(node.op_type, node.domain):
            new_nodes.append(node)
            records.append(_record(node))
            continue
        ctx = NodeContext(node, opset, f"{label}, {node_label(node, index)}", constants, shapes,
                          dtypes)
        try:
            _require_tensors(node, dtypes)
            params = normalise(ctx)
        except NotCanonical as why:
            new_nodes.append(node)
            records.append(_record(node, why_not=str(why)))
            continue
        inputs = data_inputs(node.op_type, node.input)
        make_initializer = _initializer_maker(node.output[0], added)
        rewritten = encode(node.op_type, params, inputs, node.output, opset,
                           dtypes.get(inputs[0], 0) if inputs else 0, make_initializer, node.name)
        new_nodes.append(rewritten)
        records.append(_record(rewritten, params=params))
    del graph.node[:]
    graph.node.extend(new_nodes)
    # a graph normalised before (a converted one, imported again: docs/precision.md) holds the
    # parameters under the names they get again: the new values replace the old
    renamed = {t.name for t in added}
    kept = [t for t in graph.initializer if t.name not in renamed]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    _drop_unused_initializers(graph)
    return model, records


def _initializer_maker(prefix: str, sink: list[onnx.TensorProto]):
    def make(param: str, value: np.ndarray) -> str:
        name = f"{prefix}__{param}"
        sink.append(numpy_helper.from_array(value, name))
        return name
    return make


def _require_tensors(node: onnx.NodeProto, dtypes: Mapping[str, int]) -> None:
    for name in list(node.input) + list(node.output):
        if name and name not in dtypes:
            raise NotCanonical(f"{name!r} is not a tensor (a sequence or an optional)")


def _freeze(value):
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
    return value


def _record(node: onnx.NodeProto, params: dict | None = None, why_not: str | None = None) -> Node:
    frozen = MappingProxyType({k: _freeze(v) for k, v in (params or {}).items()})
    return Node(name=node.name, op_type=node.op_type, domain=node.domain,
                inputs=tuple(node.input), outputs=tuple(node.output), params=frozen,
                in_scope=params is not None, why_not_canonical=why_not)


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input}
    used |= {o.name for o in graph.output} | {i.name for i in graph.input}
    used |= _names_used_by_subgraphs(graph)
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _names_used_by_subgraphs(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for node in graph.node:
        for attribute in node.attribute:
            for sub in list(attribute.g.node and [attribute.g]) + list(attribute.graphs):
                names |= {n for inner in sub.node for n in inner.input}
                names |= _names_used_by_subgraphs(sub)
    return names
