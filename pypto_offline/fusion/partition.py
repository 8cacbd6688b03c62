"""Partition: maximal convex regions of fusable nodes on the DAG.

Regions grow by merging the two ends of a producer→consumer edge, in graph order. A merge is
refused when it would make the region non-convex (a path leaves the region and comes back, so that
fusing would create a cycle; checked by reachability on the graph of regions) or when the working
set of one tile of every tensor in the region would not fit the target's Unified Buffer, or when a
region holding a reduction could no longer run as rows (``rows``), or a matmul would no longer
be its region's root. Regions
keep several inputs and outputs and fan-out inside (Split → … → Concat, rotary, window partition).
"""
from __future__ import annotations

from collections import deque
from math import prod

import networkx as nx

from pypto_offline.fusion.classify import node_id, node_tensors
from pypto_offline.fusion.program import region_op
from pypto_offline.fusion.rows import NotRows, reduces_lone_elements, row_layout
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.importer.ops import (MATMUL, REDUCTION, data_inputs, kind_of,
                                        matmul_extents, op_def)
from pypto_offline.targets import Target

# PyPTO's data-movement tiles need a last dimension of a multiple of 32 bytes.
ROW_ALIGN_BYTES = 32


def min_tile_bytes(graph: ImportedGraph, name: str) -> int:
    """One tile of the innermost axis (a row, 32-byte aligned): what any tiling keeps in UB."""
    info = graph.tensors[name]
    row = (info.shape[-1] if info.shape else 1) * info.np_dtype.itemsize
    return -(-row // ROW_ALIGN_BYTES) * ROW_ALIGN_BYTES if prod(info.shape or (1,)) else 0


def partition(graph: ImportedGraph, fusable: set[str], target: Target) -> list[list[str]]:
    """Regions as lists of node ids in graph order; only regions of two or more nodes."""
    nodes = {node_id(n): n for n in graph.nodes}
    order = [node_id(n) for n in graph.nodes]
    region_of = {nid: nid for nid in order}
    members = {nid: [nid] for nid in order}
    working = {nid: _working_set(graph, [nodes[nid]]) for nid in order}
    quotient = _node_graph(graph)
    for consumer in order:
        if consumer not in fusable:
            continue
        for producer in list(quotient.predecessors(region_of[consumer])):
            a, b = producer, region_of[consumer]
            if a == b or not (set(members[a]) <= fusable):
                continue
            if working[a] + working[b] > target.ub_plan_bytes.value:
                continue
            if _creates_cycle(quotient, a, b):
                continue
            merged = [nodes[m] for m in members[a] + members[b]]
            if not _matmul_is_root(graph, merged, target) or not _rows_agree(graph, merged):
                continue
            _merge(quotient, a, b, region_of, members, working)
    regions = [sorted(m, key=order.index) for m in members.values() if len(m) > 1]
    return sorted(regions, key=lambda r: order.index(r[0]))


def _matmul_is_root(graph: ImportedGraph, members: list[Node], target: Target) -> bool:
    """A region holds at most one matmul, as its root (IREE's root op, TVM's kOutEWiseFusable):
    no reduction beside it, its operands from outside the region, and every other member fed
    from inside it: its epilogue (bias, activation, residual, output reshape or transpose). An
    epilogue reorders axes only after a matmul whose rows and columns PyPTO compiles so
    (``KernelSupport.matmul_reorder_align``)."""
    matmuls = [n for n in members if kind_of(n.op_type) == MATMUL]
    if not matmuls:
        return True
    if len(matmuls) > 1 or any(kind_of(n.op_type) == REDUCTION for n in members):
        return False
    produced = {name for n in members for name in n.outputs}
    (root,) = matmuls
    if any(name in produced for name in root.inputs):
        return False
    if any(op_def(n.op_type).reorders for n in members) and not _aligned_matmul(graph, root,
                                                                              target):
        return False
    return all(any(name in produced for name in data_inputs(n.op_type, n.inputs))
               for n in members if n is not root)


def _aligned_matmul(graph: ImportedGraph, matmul: Node, target: Target) -> bool:
    rows, columns = matmul_extents(matmul.op_type, graph.tensors[matmul.outputs[0]].shape,
                                   len(graph.tensors[matmul.inputs[1]].shape))
    align = target.kernels.matmul_reorder_align
    return rows % align == 0 and columns % align == 0


def _rows_agree(graph: ImportedGraph, members: list[Node]) -> bool:
    """A region with a reduction must run as rows (``rows``): a merge that breaks that is
    refused, as one that overflows UB is. Most merges hold no reduction: they are told from the
    registry's kinds, without building the region's ops (this runs for every merge tried)."""
    if not any(kind_of(n.op_type) == REDUCTION
               and not reduces_lone_elements(n, graph.tensors[n.inputs[0]].shape) for n in members):
        return True
    ops = [region_op(n, {name: graph.tensors[name].shape for name in n.outputs}) for n in members]
    shapes = {name: graph.tensors[name].shape for op in ops for name in op.inputs + op.outputs
              if name}
    try:
        row_layout(ops, shapes)
    except NotRows:
        return False
    return True


def _node_graph(graph: ImportedGraph) -> nx.DiGraph:
    producer = {name: node_id(n) for n in graph.nodes for name in n.outputs if name}
    dag = nx.DiGraph()
    dag.add_nodes_from(node_id(n) for n in graph.nodes)
    for n in graph.nodes:
        for name in n.inputs:
            if name in producer:
                dag.add_edge(producer[name], node_id(n))
    return dag


def _working_set(graph: ImportedGraph, nodes: list[Node]) -> int:
    names = {name for n in nodes for name in node_tensors(n)}
    return sum(min_tile_bytes(graph, name) for name in names if graph.tensors.get(name)
               and graph.tensors[name].shape is not None)


def _creates_cycle(quotient: nx.DiGraph, a: str, b: str) -> bool:
    """Merging a and b is a cycle iff one reaches the other through a third region."""
    return _reaches_indirectly(quotient, a, b) or _reaches_indirectly(quotient, b, a)


def _reaches_indirectly(quotient: nx.DiGraph, source: str, target: str) -> bool:
    queue = deque(s for s in quotient.successors(source) if s != target)
    seen = set(queue)
    while queue:
        current = queue.popleft()
        if current == target:
            return True
        for nxt in quotient.successors(current):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return False


def _merge(quotient, a, b, region_of, members, working) -> None:
    nx.contracted_nodes(quotient, a, b, self_loops=False, copy=False)
    for nid in members[b]:
        region_of[nid] = a
    members[a].extend(members.pop(b))
    working[a] += working.pop(b)
