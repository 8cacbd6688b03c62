"""Split, never drop: a planned region that cannot ship is cut in two convex parts, each of
which is planned again (docs/regions.md, "Split, never drop").

A region's nodes are in graph order, a topological order. Every prefix of it is convex, and so
is the rest: a path from a node of the prefix that left the region and came back into the prefix
would run through nodes of the region (it is convex) that come between the two in graph order,
so in the prefix. The cut is the prefix, among those whose parts may each be a region
(``partition.holds_together``), that moves the fewest bytes: the tensors the first part writes
for the second, each written to global memory once and read back once. Of equal cuts the most
even is taken, so a chain halves and the parts of parts end within a logarithm of its length.
A part of one op is no region: the op ships alone, as every op of a region that falls back
whole did before.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from pypto_offline.fusion.classify import node_id
from pypto_offline.fusion.cost import tensor_bytes
from pypto_offline.fusion.partition import holds_together
from pypto_offline.fusion.records import Cut
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.registry.ops import data_inputs
from pypto_offline.targets import Target


def part_id(region_id: str, index: int) -> str:
    """The id of a cut region's part: ``region_3`` → ``region_3_0`` and ``region_3_1``."""
    return f"{region_id}_{index}"


def cut_in_two(region_id: str, members: Sequence[Node], reason: str, graph: ImportedGraph,
               target: Target, readers: Mapping[str, list[str]]) -> Cut | None:
    """The cut of a region of these nodes (graph order) that moves the fewest bytes, or None
    when no prefix leaves two parts that may each be a region (a region of one node).
    ``readers``: ``members.tensor_readers(graph)``."""
    best: tuple[tuple[int, int], Cut] | None = None
    for split in range(1, len(members)):
        first, second = list(members[:split]), list(members[split:])
        tensors = _handed_over(first, second)
        moved = 2 * tensor_bytes(graph, tensors)
        rank = (moved, abs(len(members) - 2 * split))
        if best is not None and rank >= best[0]:
            continue
        if not (holds_together(graph, first, target, readers)
                and holds_together(graph, second, target, readers)):
            continue
        best = rank, Cut(region_id, reason, (_ids(first), _ids(second)), tensors, moved)
    return None if best is None else best[1]


def members_of(cut: Cut, nodes: Mapping[str, Node]) -> tuple[list[Node], list[Node]]:
    first, second = cut.parts
    return [nodes[nid] for nid in first], [nodes[nid] for nid in second]


def _handed_over(first: list[Node], second: list[Node]) -> tuple[str, ...]:
    produced = {name for n in first for name in n.outputs if name}
    read = [name for n in second for name in data_inputs(n.op_type, n.inputs) if name]
    return tuple(dict.fromkeys(name for name in read if name in produced))


def _ids(nodes: list[Node]) -> tuple[str, ...]:
    return tuple(node_id(n) for n in nodes)
