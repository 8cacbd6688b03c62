"""Partition: maximal convex regions of fusable nodes on the DAG.

Regions grow by merging the two ends of a producer→consumer edge, in graph order. A merge is
refused when it would make the region non-convex (a path leaves the region and comes back, so that
fusing would create a cycle; checked by reachability on the graph of regions, searched only as far
as the consumer in graph order so that planning stays near-linear: docs/regions.md) or when the
working set of one tile of every tensor in the region would not fit the target's Unified Buffer,
or when a region holding a reduction could no longer run as rows (``rows``), or a matmul would no
longer be its region's root, unless the region is an attention's core (``attention_core``).
Regions keep several inputs and outputs and fan-out inside (Split → … → Concat, rotary, window
partition).
"""
from __future__ import annotations

from collections import deque
from math import prod
from typing import Mapping

import networkx as nx
import numpy as np

from pypto_offline.fusion.attention import attention_core, is_batched
from pypto_offline.fusion.classify import node_id, node_tensors
from pypto_offline.fusion.members import read_beyond, tensor_readers
from pypto_offline.fusion.normalising import normalising_epilogue, normalising_prologue
from pypto_offline.fusion.program import region_op
from pypto_offline.fusion.rows import NotRows, reduces_lone_elements, row_layout
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.registry.ops import (MATMUL, REDUCTION, data_inputs, definition, is_cube_conv,
                                        is_op, kind_of, matmul_extents, op_def)
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
    return Partition(graph, fusable, target).regions()


class Partition:
    """The graph of regions as merges make it: every node starts as its own region (named by
    its node id), a merge contracts a producer's region and a consumer's into one named by the
    producer's. ``steps`` counts the edges the convexity checks looked at (followed or pruned),
    the partition's one search: it grows with the ops (bench/scale.py,
    tests/test_fusion_scale.py)."""

    def __init__(self, graph: ImportedGraph, fusable: set[str], target: Target):
        self.graph, self.fusable, self.target = graph, fusable, target
        self.nodes = {node_id(n): n for n in graph.nodes}
        self.order = [node_id(n) for n in graph.nodes]
        self.position = {nid: index for index, nid in enumerate(self.order)}
        self.region_of = {nid: nid for nid in self.order}
        self.members = {nid: [nid] for nid in self.order}
        self.last = dict(self.position)  # a region's last node in graph order
        self.working = {nid: working_set(graph, [self.nodes[nid]]) for nid in self.order}
        self.constrained = {nid: int(nid in fusable and _constrains(graph, self.nodes[nid]))
                            for nid in self.order}  # how many members constrain a merge
        # how many members are batched MatMuls (an attention's scores), kept as regions merge
        self.batched = {nid: int(is_op(self.nodes[nid], "MatMul")
                                 and is_batched(graph, self.nodes[nid])) for nid in self.order}
        self.quotient = _node_graph(graph, self.position)
        self.readers = tensor_readers(graph)
        self.steps = 0
        for consumer in self.order:
            if consumer in fusable:
                self._grow(consumer)

    def regions(self) -> list[list[str]]:
        regions = [sorted(m, key=self.position.__getitem__) for m in self.members.values()
                   if len(m) > 1]
        return sorted(regions, key=lambda r: self.position[r[0]])

    def _grow(self, consumer: str) -> None:
        """Merge the consumer's region with each producer's region that keeps it fusable; once
        more over the producers refused where a merge changed the region (a producer that
        fed both the region and the consumer made a cycle until they were one: a precision
        mode's input Cast read by a block's first convolution and by its residual Add)."""
        while self._merge_producers(consumer):
            pass

    def _merge_producers(self, consumer: str) -> bool:
        """One pass of ``_grow``: whether it merged a producer and refused another."""
        merged = refused = False
        for producer in sorted(self.quotient.predecessors(self.region_of[consumer]),
                               key=self._holds_no_batched_matmul):
            a, b = producer, self.region_of[consumer]
            # A region of several nodes holds fusable nodes only (merges join no other), so
            # its name, one of its nodes, tells whether all of it is.
            if a == b or a not in self.fusable:
                continue
            if self.working[a] + self.working[b] > self.target.ub_plan_bytes.value:
                continue
            if self._creates_cycle(a, b, self.position[consumer]):
                refused = True
                continue
            if self.constrained[a] + self.constrained[b]:
                members = [self.nodes[m] for m in self.members[a] + self.members[b]]
                if not holds_together(self.graph, members, self.target, self.readers):
                    continue
            self._merge(a, b)
            merged = True
        return merged and refused

    def _holds_no_batched_matmul(self, region: str) -> bool:
        """A producer region holding a batched MatMul (an attention's scores) is merged first
        (sorted stably): its epilogue claims the consumer before a region without one does. An
        attention's mask made in the graph (a Where of the attention mask, read by every
        layer) took the first layer's scores Add into its region, and that attention stayed
        three kernels (BERT, GPT-2, LLaMA; docs/regions.md, "Attention")."""
        return not self.batched[region]

    def _creates_cycle(self, a: str, b: str, consumer: int) -> bool:
        """Merging producer region ``a`` into consumer region ``b`` (an edge a → b) makes a
        cycle iff a reaches b through a third region; b cannot reach a, the graph of regions
        staying acyclic.

        The search skips every region whose last node comes after the consumer. Consumers are
        taken in graph order (topological) and a merge joins the consumer's region with a
        producer's, so while this consumer's producers are tried every region of several nodes
        holds nodes up to the consumer only: a region with a later node is that one node, and
        every path from it runs through later nodes, never into b. Without this the search ran
        through the whole rest of the graph once per merge (quadratic on a chain)."""
        queue, seen = deque(), {b}
        self._enqueue(self.quotient.successors(a), queue, seen, consumer)
        while queue:
            current = queue.popleft()
            if self.quotient.has_edge(current, b):
                return True
            self._enqueue(self.quotient.successors(current), queue, seen, consumer)
        return False

    def _enqueue(self, regions, queue: deque, seen: set, consumer: int) -> None:
        for region in regions:
            self.steps += 1
            if region not in seen and self.last[region] <= consumer:
                seen.add(region)
                queue.append(region)

    def _merge(self, a: str, b: str) -> None:
        nx.contracted_nodes(self.quotient, a, b, self_loops=False, copy=False)
        for nid in self.members[b]:
            self.region_of[nid] = a
        self.members[a].extend(self.members.pop(b))
        self.working[a] += self.working.pop(b)
        self.last[a] = max(self.last[a], self.last.pop(b))
        self.constrained[a] += self.constrained.pop(b)
        self.batched[a] += self.batched.pop(b)


def holds_together(graph: ImportedGraph, members: list[Node], target: Target,
                   readers: Mapping[str, list[str]]) -> bool:
    """Whether these nodes may be one region as far as their ops go: a matmul is its root and a
    reduction's rows agree, or the nodes are an attention's core (``attention_core``; what
    ``Partition`` checks of a merge, convexity and UB aside). A part of a cut region is checked
    so (``fusion.split``). ``readers``: ``tensor_readers``."""
    return attention_core(graph, members, readers) or (
        _matmul_is_root(graph, members, target) and (
            bool(normalising_prologue(graph, members)) or normalising_epilogue(graph, members)
            or _rows_agree(graph, members, readers)))


def _matmul_is_root(graph: ImportedGraph, members: list[Node], target: Target) -> bool:
    """A region holds at most one matmul, as its root (IREE's root op, TVM's kOutEWiseFusable),
    or several convolutions with a reduction (``_convolutions_with_a_reduction``): no
    reduction beside it (but a convolution's: a reduction of its channels' planes, the
    product rows, ``rows._conv_planes``), its operands from outside the region, and every other
    member fed from inside it: its epilogue (bias, activation, residual, output reshape or
    transpose), or a Cast between float types (of an operand the epilogue reads: GPT-2's past keys, fp32 model inputs cast to fp16
    for the Concat with the new ones under allow_mix_precision, a kernel of their own before). An
    epilogue reorders axes only after a matmul whose rows and columns PyPTO compiles so
    (``KernelSupport.matmul_reorder_align``)."""
    matmuls = [n for n in members if kind_of(n.op_type, n.params) == MATMUL]
    if not matmuls:
        return True
    if len(matmuls) > 1:
        return _convolutions_with_a_reduction(members, matmuls)
    produced = {name for n in members for name in n.outputs}
    (root,) = matmuls
    normalised = normalising_prologue(graph, members)
    # a convolution's epilogue may reduce its planes (``rows._conv_planes``); a MatMul's may
    # not, but for a LayerNorm of its rows
    if not is_cube_conv(root.op_type, root.params) and not normalised \
            and any(kind_of(n.op_type) == REDUCTION for n in members) \
            and not normalising_epilogue(graph, members):
        return False
    if any(name in produced for name in root.inputs[1:]):  # weights always from outside
        return False
    prologue = normalised or _quantising_prologue(members, root, produced)
    if prologue is None:  # its data operand made in the region: a convolution's image only
        return _elementwise_around_a_pointwise_conv(members, root) \
            or _convolutions_with_a_reduction(members, matmuls)
    if any(op_def(n.op_type).reorders for n in members) and not _aligned_matmul(graph, root,
                                                                              target):
        return False
    return all(any(name in produced for name in data_inputs(n.op_type, n.inputs))
               or _float_cast(graph, n) or is_op(n, "DequantizeLinear")
               for n in members if n is not root and n not in prologue)


def _quantising_prologue(members: list[Node], root: Node, produced: set[str]) -> list[Node]:
    """The QuantizeLinear (and the DequantizeLinear after it, for a float matmul; the Pad with
    zeros before it, for a convolution of an image padded with its zero point,
    ``importer/quantised._quantised_with_padding``) making a matmul's data operand (a MatMul's
    left one, a Conv's image) from a float tensor from outside the region: the kernel quantises
    the operand in UB and the cube multiplies it, one kernel where the float model has one
    (docs/int8.md, "Regions"). Or a DequantizeLinear alone, of an int8 tensor from outside the
    region, for a float matmul (``fusion/dequantise_in_readers.py``): the kernel reads int8.
    Empty if the matmul's data operand comes from outside, None if it comes from inside
    otherwise (its weights come from outside: ``_matmul_is_root``)."""
    by_output = {name: node for node in members for name in node.outputs}
    chain, operand = [], root.inputs[0]
    for op_type, wanted in _QUANTISING_CHAIN:
        node = by_output.get(operand)
        if node is not None and is_op(node, op_type) and wanted(node):
            chain.append(node)
            operand = node.inputs[0]
    if operand not in produced and (
            [n.op_type for n in chain] == ["DequantizeLinear"]
            or any(is_op(n, "QuantizeLinear") for n in chain)):
        return chain
    return None if root.inputs[0] in produced else []


def _elementwise_around_a_pointwise_conv(members: list[Node], root: Node) -> bool:
    """A 1x1 convolution whose image elementwise ops in the region make, and nothing but
    elementwise ops beside it: the activation (and BatchNorm) of a depthwise convolution left
    to its own kernel, as PP-LCNet's blocks have it, computed in UB and multiplied by the cube
    in the convolution's kernel, one launch fewer and about the bytes of the two kernels
    (docs/regions.md, "An elementwise prologue")."""
    return is_cube_conv(root.op_type, root.params) and not root.params and all(
        definition(n.op_type).elementwise for n in members if n is not root)


def _pads_with_zeros(node: Node) -> bool:
    return node.params.get("mode") == "constant" and not node.params.get("value")


def _any(node: Node) -> bool:
    return True


# The ops that may make a matmul's data operand in a quantising prologue, from the matmul back,
# each with what it must be to take part
_QUANTISING_CHAIN = (("DequantizeLinear", _any), ("QuantizeLinear", _any),
                     ("Pad", _pads_with_zeros))


def _convolutions_with_a_reduction(members: list[Node], matmuls: list[Node]) -> bool:
    """Several convolutions on the cube in one region: a squeeze-and-excite block (expansion,
    pooling, excitation, gate, projection), whose pooling's rows (``rows.row_layout``) hold
    every product, as those rows, one value per row, or in its own rows (OWN): every matmul a
    convolution of one image, a reduction among the members, and nothing that reorders axes.
    A MobileNetV3 inverted residual was 4 kernels, 101.6 us summed; as one, 99.2 us
    (docs/regions.md)."""
    return all(is_cube_conv(n.op_type, n.params) for n in matmuls) and any(
        kind_of(n.op_type) == REDUCTION for n in members) and not any(
        op_def(n.op_type).reorders for n in members)


def _float_cast(graph: ImportedGraph, node: Node) -> bool:
    """A Cast from one float type to another: a precision mode's conversion of an operand."""
    return is_op(node, "Cast") and all(
        np.dtype(graph.tensors[name].np_dtype).kind == "f" for name in (*node.inputs, *node.outputs))


def _aligned_matmul(graph: ImportedGraph, matmul: Node, target: Target) -> bool:
    rows, columns = matmul_extents(matmul.op_type, graph.tensors[matmul.outputs[0]].shape,
                                   len(graph.tensors[matmul.inputs[1]].shape))
    align = target.kernels.matmul_reorder_align
    return rows % align == 0 and columns % align == 0


def _rows_agree(graph: ImportedGraph, members: list[Node],
                readers: Mapping[str, list[str]]) -> bool:
    """A region with a reduction must run as rows (``rows``): a merge that breaks that is
    refused, as one that overflows UB is. Most merges hold no reduction: ``Partition`` tells
    them by its count of members that ``_constrains`` and calls this for the others only."""
    if not any(_constrains(graph, n) for n in members if kind_of(n.op_type) == REDUCTION):
        return True
    ops = [region_op(n, {name: graph.tensors[name].shape for name in n.outputs}) for n in members]
    shapes = {name: graph.tensors[name].shape for op in ops for name in op.inputs + op.outputs
              if name}
    try:
        row_layout(ops, shapes, read_beyond(members, graph, readers))
    except NotRows:
        return False
    return True


def _node_graph(graph: ImportedGraph, position: dict[str, int]) -> nx.DiGraph:
    producer = {name: node_id(n) for n in graph.nodes for name in n.outputs if name}
    dag = nx.DiGraph()
    dag.add_nodes_from(node_id(n) for n in graph.nodes)
    for n in graph.nodes:
        for name in n.inputs:
            if name in producer:
                if position[producer[name]] >= position[node_id(n)]:
                    raise ValueError(f"node {node_id(n)!r} comes before its producer "
                                     f"{producer[name]!r}: the importer sorts the graph")
                dag.add_edge(producer[name], node_id(n))
    return dag


def working_set(graph: ImportedGraph, nodes: list[Node]) -> int:
    names = {name for n in nodes for name in node_tensors(n)}
    return sum(min_tile_bytes(graph, name) for name in names if graph.tensors.get(name)
               and graph.tensors[name].shape is not None)


def _constrains(graph: ImportedGraph, node: Node) -> bool:
    """A matmul, or a reduction over more than lone elements: a merge of a region holding one
    is checked op by op (``_matmul_is_root``, ``_rows_agree``); any other merge passes both."""
    kind = kind_of(node.op_type, node.params)
    return kind == MATMUL or (kind == REDUCTION and not reduces_lone_elements(
        node, graph.tensors[node.inputs[0]].shape))
