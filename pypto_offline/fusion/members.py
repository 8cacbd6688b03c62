"""What a set of a region's nodes makes and reads: the helpers every rule of what a region may
hold (``partition``, ``attention``, ``normalising``) asks."""
from __future__ import annotations

from typing import Mapping

from pypto_offline.fusion.classify import node_id
from pypto_offline.importer import ImportedGraph, Node


def outputs_of(nodes: list[Node]) -> set[str]:
    return {name for n in nodes for name in n.outputs}


def chain_into(node: Node, members: list[Node], produced: set[str]) -> list[Node] | None:
    """The members before ``node`` along its one input made in the region, each taking one
    input made there (the others from outside: a scale, a mask), first to last; None if one
    takes two."""
    by_output = {name: n for n in members for name in n.outputs}
    chain, current = [], node
    while True:
        made = [name for name in current.inputs if name in produced]
        if len(made) > 1:
            return None
        if not made:
            return chain[::-1]
        current = by_output[made[0]]
        chain.append(current)


def tensor_readers(graph: ImportedGraph) -> dict[str, list[str]]:
    """Tensor name → the ids of the nodes that take it as an input."""
    readers: dict[str, list[str]] = {}
    for n in graph.nodes:
        for name in n.inputs:
            readers.setdefault(name, []).append(node_id(n))
    return readers


def read_beyond(members: list[Node], graph: ImportedGraph,
                readers: Mapping[str, list[str]]) -> tuple[str, ...]:
    """The tensors these nodes write that a node beyond them reads, or the graph returns: a
    region's outputs."""
    inside = {node_id(n) for n in members}
    graph_outputs = set(graph.outputs)
    return tuple(dict.fromkeys(
        name for n in members for name in n.outputs if name in graph_outputs
        or any(reader not in inside for reader in readers.get(name, ()))))


def made_before(node: Node, members: list[Node]) -> list[Node]:
    """The members ``node``'s inputs are made by, transitively, in no particular order."""
    by_output = {name: n for n in members for name in n.outputs}
    found, stack = [], [name for name in node.inputs if name]
    while stack:
        maker = by_output.get(stack.pop())
        if maker is not None and maker not in found:
            found.append(maker)
            stack.extend(name for name in maker.inputs if name)
    return found
