"""Lookups over one ``onnx.GraphProto`` that the importer's quantisation rewrites share
(``qoperator.py``, ``uint8_activations.py``, ``quantised.py``): its constants and the readers of
each tensor, built once per import rather than once per rewrite."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


class Constants:
    """A graph's initializers by name, each decoded to numpy once, and only when read: a
    quantised model's weights are most of its bytes, and the rewrites mostly read scalar scales
    and zero points."""

    def __init__(self, graph: onnx.GraphProto):
        self._protos = {t.name: t for t in graph.initializer}
        self._values: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._protos

    def __iter__(self):
        return iter(self._protos)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._values:
            self._values[name] = numpy_helper.to_array(self._protos[name])
        return self._values[name]

    def get(self, name: str) -> np.ndarray | None:
        return self[name] if name in self._protos else None

    def data_type(self, name: str) -> int:
        """The ONNX element type of constant ``name``, without decoding it."""
        return self._protos[name].data_type

    def record(self, value: np.ndarray, name: str) -> onnx.TensorProto:
        """A new constant ``name`` (a name the caller made unused), known from now on; the
        caller adds the returned initializer to the graph."""
        tensor = numpy_helper.from_array(value, name)
        self._protos[name] = tensor
        self._values[name] = np.asarray(value)
        return tensor


def readers_of(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Each tensor's reader nodes in graph order, a node once however often it reads it."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(node)
    return readers


def names_in_subgraphs(graph: onnx.GraphProto) -> set[str]:
    """The tensors a node's subgraph (an If's branch, a Loop's body) reads: a rewrite that
    renames a tensor must leave these alone."""
    return {name for node in graph.node for a in node.attribute if a.g
            for sub in a.g.node for name in sub.input}


def forget_type(graph: onnx.GraphProto, tensor: str) -> None:
    """Drop ``tensor``'s declared type (a rewrite changed it, or the tensor is gone): shape
    inference gives it again where it still exists."""
    kept = [v for v in graph.value_info if v.name != tensor]
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)
