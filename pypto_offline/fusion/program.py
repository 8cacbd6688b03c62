"""A region's program: its ops in canonical form, with the shape and dtype of every tensor.

Reshape, Squeeze, Unsqueeze and Flatten all become one ``Reshape`` to a concrete shape: inside a
kernel they are the same view op. Rewrite rules replace ops; ``prune`` drops what no output needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

from pypto_offline.fusion.records import RegionOp
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.registry.ops import data_inputs, definition, is_op


@dataclass
class Program:
    ops: list[RegionOp]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, int]
    _fresh: int = field(default=0, repr=False)

    def producer(self, name: str) -> RegionOp | None:
        for op in self.ops:
            if name in op.outputs:
                return op
        return None

    def consumers(self, name: str) -> list[RegionOp]:
        return [op for op in self.ops if name in op.inputs]

    def new_tensor(self, like: str, shape: Iterable[int], hint: str) -> str:
        """A fresh tensor name with the dtype of ``like``."""
        self._fresh += 1
        name = f"{like}__{hint}{self._fresh}"
        self.shapes[name] = tuple(shape)
        self.dtypes[name] = self.dtypes[like]
        return name

    def replace(self, old: RegionOp, new: list[RegionOp]) -> None:
        index = self.ops.index(old)
        self.ops[index:index + 1] = new

    def prune(self) -> None:
        """Drop ops none of whose outputs is needed; fold away Identity where it is not an output."""
        self._bypass_identities()
        needed = set(self.outputs)
        kept: list[RegionOp] = []
        for op in reversed(self.ops):
            if any(name in needed for name in op.outputs):
                kept.append(op)
                needed.update(op.inputs)
        self.ops = list(reversed(kept))

    def _bypass_identities(self) -> None:
        for op in list(self.ops):
            if is_op(op, "Identity") and op.outputs[0] not in self.outputs:
                source, alias = op.inputs[0], op.outputs[0]
                self.ops = [_rename_input(o, alias, source) for o in self.ops if o is not op]


def _rename_input(op: RegionOp, old: str, new: str) -> RegionOp:
    if old not in op.inputs:
        return op
    return RegionOp(op.op_type, tuple(new if n == old else n for n in op.inputs), op.outputs,
                    op.params)


def region_op(node: Node, shapes: Mapping[str, tuple[int, ...]]) -> RegionOp:
    """The program op for an imported node (reshape-likes become one Reshape)."""
    if definition(node.op_type).reshape_like:
        out = node.outputs[0]
        return RegionOp("Reshape", (node.inputs[0],), (out,),
                        MappingProxyType({"shape": tuple(shapes[out])}))
    return RegionOp(node.op_type, tuple(data_inputs(node.op_type, node.inputs)),
                    tuple(node.outputs), node.params)


def build_program(graph: ImportedGraph, nodes: list[Node], inputs: tuple[str, ...],
                  outputs: tuple[str, ...]) -> Program:
    ops = [region_op(node, {n: graph.tensors[n].shape for n in node.outputs}) for node in nodes]
    names = set(inputs) | {name for op in ops for name in op.inputs + op.outputs}
    return Program(ops=ops, inputs=inputs, outputs=outputs,
                   shapes={n: tuple(graph.tensors[n].shape) for n in names},
                   dtypes={n: graph.tensors[n].dtype for n in names})
