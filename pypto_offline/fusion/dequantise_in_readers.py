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
dequantising prologue) and still fits the Unified Buffer; a reader in no region makes a region of
two with it (its kernel then reads int8 instead of fp32, one kernel as before).
"""
from __future__ import annotations

from typing import Sequence

from pypto_offline.fusion.classify import node_id
from pypto_offline.fusion.partition import holds_together, tensor_readers, working_set
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.targets import Target

DEQUANTIZE = "DequantizeLinear"


def dequantise_in_readers(graph: ImportedGraph, regions: Sequence[Sequence[str]],
                          fusable: set[str], target: Target) -> list[list[str]]:
    """``regions`` (node ids in graph order, as ``partition`` makes them) with each movable DQ
    moved to its reader's region; regions of fewer than two nodes dropped, graph order kept."""
    nodes = {node_id(n): n for n in graph.nodes}
    position = {nid: index for index, nid in enumerate(nodes)}
    members = [list(r) for r in regions]
    region_of = {nid: index for index, r in enumerate(members) for nid in r}
    readers = tensor_readers(graph)
    for node in graph.nodes:
        reader = _only_fusable_reader(node, graph, readers, fusable)
        nid = node_id(node)
        if reader is None or region_of.get(nid) == region_of.get(reader, -1) \
                or nid not in fusable:
            continue
        target_members = members[region_of[reader]] if reader in region_of else [reader]
        joined = [nodes[m] for m in target_members + [nid]]
        if not holds_together(graph, joined, target, readers) \
                or working_set(graph, joined) > target.ub_plan_bytes.value:
            continue
        _move(nid, reader, members, region_of)
    kept = [sorted(r, key=position.__getitem__) for r in members if len(r) > 1]
    return sorted(kept, key=lambda r: position[r[0]])


def _only_fusable_reader(node: Node, graph: ImportedGraph, readers, fusable: set[str]
                         ) -> str | None:
    """The one node reading this DQ of an activation's output, if it may join a kernel."""
    if node.op_type != DEQUANTIZE or node.inputs[0] in graph.constants \
            or node.outputs[0] in graph.outputs:
        return None
    who = readers.get(node.outputs[0], [])
    return who[0] if len(who) == 1 and who[0] in fusable else None


def _move(dq: str, reader: str, members: list[list[str]], region_of: dict[str, int]) -> None:
    if dq in region_of:
        members[region_of[dq]].remove(dq)
    if reader not in region_of:
        region_of[reader] = len(members)
        members.append([reader])
    region_of[dq] = region_of[reader]
    members[region_of[reader]].append(dq)
