"""Int8 between kernels: each ``DequantizeLinear`` of an activation joins its reader's region.

The partition grows regions from consumers to producers, so a ``QuantizeLinear ->
DequantizeLinear`` pair (the requantisation a QDQ model writes after each quantised op) joins its
producer's region, and that kernel writes the dequantised fp32 tensor for the next one to read:
4 bytes an element cross GM where the QDQ model's own tensor is int8. This pass moves each such
``DequantizeLinear`` (one per reader: ``importer/quantised._one_dequantisation_per_reader``) into
its reader's region, as that kernel's prologue, so the producer writes the int8 tensor and the
reader reads it (docs/int8.md, "Regions").

A move keeps both regions convex: the DQ is a sink of the region it leaves (its one reader is
elsewhere), and it enters a region holding its only reader through which, the region being
convex, no path from the region comes back to the DQ's input. It is made only where the reader's
region still holds together (``partition.holds_together``: a matmul reading it takes it as a
dequantising prologue) and still fits the Unified Buffer, and the region left holds together
(a reduction's rows with the quantised tensor as an output); a reader in no region makes a region of
two with it (its kernel then reads int8 instead of fp32, one kernel as before).
"""
from __future__ import annotations

from typing import Sequence

from pypto_offline.fusion.classify import node_id
from pypto_offline.fusion.members import tensor_readers
from pypto_offline.fusion.partition import holds_together, working_set
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.registry.ops import is_op
from pypto_offline.targets import Target

DEQUANTIZE = "DequantizeLinear"


def dequantise_in_readers(graph: ImportedGraph, regions: Sequence[Sequence[str]],
                          fusable: set[str], target: Target) -> list[list[str]]:
    """``regions`` (node ids in graph order, as ``partition`` makes them) with each movable DQ
    moved to its reader's region; regions of fewer than two nodes dropped, graph order kept."""
    moves = _Regions(graph, regions, target)
    for node in graph.nodes:
        reader = _only_fusable_reader(node, graph, moves.readers, fusable)
        if reader is not None and node_id(node) in fusable:
            moves.move_if_both_hold(node_id(node), reader)
    return moves.regions()


class _Regions:
    """The regions as the moves change them: each one's members, and each member's region."""

    def __init__(self, graph: ImportedGraph, regions: Sequence[Sequence[str]], target: Target):
        self.graph, self.target = graph, target
        self.nodes = {node_id(n): n for n in graph.nodes}
        self.position = {nid: index for index, nid in enumerate(self.nodes)}
        self.members = [list(r) for r in regions]
        self.region_of = {nid: index for index, r in enumerate(self.members) for nid in r}
        self.readers = tensor_readers(graph)

    def move_if_both_hold(self, dq: str, reader: str) -> None:
        """Move ``dq`` into ``reader``'s region (one of two with it, if it has none) when that
        region still holds together and fits UB, and the one it leaves holds together too."""
        if dq in self.region_of and self.region_of[dq] == self.region_of.get(reader):
            return
        joined = self._of(reader) + [dq] if reader in self.region_of else [reader, dq]
        left = [m for m in self._of(dq) if m != dq] if dq in self.region_of else []
        if not self._holds(joined) or (len(left) > 1 and not self._holds(left)) \
                or working_set(self.graph, self._nodes(joined)) > self.target.ub_plan_bytes.value:
            return
        if dq in self.region_of:
            self._of(dq).remove(dq)
        if reader not in self.region_of:
            self.region_of[reader] = len(self.members)
            self.members.append([reader])
        self.region_of[dq] = self.region_of[reader]
        self._of(reader).append(dq)

    def regions(self) -> list[list[str]]:
        kept = [sorted(r, key=self.position.__getitem__) for r in self.members if len(r) > 1]
        return sorted(kept, key=lambda r: self.position[r[0]])

    def _of(self, nid: str) -> list[str]:
        return self.members[self.region_of[nid]]

    def _nodes(self, ids: list[str]) -> list[Node]:
        return [self.nodes[m] for m in ids]

    def _holds(self, ids: list[str]) -> bool:
        return holds_together(self.graph, self._nodes(ids), self.target, self.readers)


def _only_fusable_reader(node: Node, graph: ImportedGraph, readers, fusable: set[str]
                         ) -> str | None:
    """The one node reading this DQ of an activation's output, if it may join a kernel."""
    if not is_op(node, DEQUANTIZE) or node.inputs[0] in graph.constants \
            or node.outputs[0] in graph.outputs:
        return None
    who = readers.get(node.outputs[0], [])
    return who[0] if len(who) == 1 and who[0] in fusable else None
