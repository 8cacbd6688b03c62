"""The model drawn as a layered graph, fused regions as single boxes, long boundary runs condensed.

A few hundred nodes must stay readable, so the drawing is of a condensed graph:
- every fused region is one box (clicking it opens its kernel card);
- a chain of ops outside every region, each with one producer and one consumer inside the chain,
  is one box that names how many ops it holds and which;
- the rest is one box per op, memory-bound ops left unfused marked with their reason.
Layers come from the longest path from the inputs (networkx), the order inside a layer from one
barycentre sweep, which removes most crossings in these mostly-chain-shaped models.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import onnx

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 168, 30, 16, 34, 12
MAX_LABEL = 24


@dataclass(frozen=True)
class Box:
    id: str
    kind: str           # "region", "unfused", "run", "op"
    label: str
    title: str          # tooltip: every op it stands for
    x: int
    y: int
    kernel: str = ""    # region id, for the click
    compiled: bool = True


@dataclass(frozen=True)
class Drawing:
    width: int
    height: int
    boxes: tuple[Box, ...]
    edges: tuple[tuple[int, int, int, int], ...]   # x1, y1, x2, y2


def op_graph(model: onnx.ModelProto) -> nx.DiGraph:
    """Nodes by id (first output name, as the fusion stage names them), edges along tensors."""
    graph = nx.DiGraph()
    producer = {}
    for index, node in enumerate(model.graph.node):
        node_id = node.output[0]
        graph.add_node(node_id, op_type=node.op_type, order=index)
        for out in node.output:
            producer[out] = node_id
    for node in model.graph.node:
        for name in node.input:
            if name in producer:
                graph.add_edge(producer[name], node.output[0])
    return graph


def condense(graph: nx.DiGraph, region_of: dict[str, str], unfused: dict[str, str]
             ) -> tuple[nx.DiGraph, dict[str, list[str]]]:
    """Quotient graph: a group per region, per boundary chain, per other node."""
    group_of = {node: region_of.get(node, node) for node in graph}
    quotient = nx.quotient_graph(graph, _partition(group_of), create_using=nx.DiGraph)
    members = {}
    for block in quotient.nodes:
        members[group_of[next(iter(block))]] = sorted(block, key=lambda n: graph.nodes[n]["order"])
    condensed = nx.relabel_nodes(quotient, {b: group_of[next(iter(b))] for b in quotient.nodes})
    return _merge_chains(condensed, members, set(region_of.values()) | set(unfused)), members


def _partition(group_of: dict[str, str]) -> list[set[str]]:
    blocks: dict[str, set[str]] = {}
    for node, group in group_of.items():
        blocks.setdefault(group, set()).add(node)
    return list(blocks.values())


def _merge_chains(graph: nx.DiGraph, members: dict[str, list[str]], keep: set[str]) -> nx.DiGraph:
    """Fold a plain op into its predecessor group while both sit on a simple chain."""
    graph = graph.copy()
    for node in list(nx.lexicographical_topological_sort(graph)):
        if node in keep or graph.in_degree(node) != 1:
            continue
        (pred,) = graph.predecessors(node)
        if pred in keep or graph.out_degree(pred) != 1:
            continue
        members[pred] = members[pred] + members.pop(node)
        for succ in list(graph.successors(node)):
            graph.add_edge(pred, succ)
        graph.remove_node(node)
    return graph


def layout(model: onnx.ModelProto, region_of: dict[str, str], compiled: dict[str, bool],
           unfused: dict[str, str]) -> Drawing:
    ops = op_graph(model)
    condensed, members = condense(ops, region_of, unfused)
    layers = _layers(condensed)
    positions = {}
    for row, layer in enumerate(layers):
        for column, node in enumerate(layer):
            positions[node] = (MARGIN + column * (BOX_W + GAP_X), MARGIN + row * (BOX_H + GAP_Y))
    boxes = tuple(_box(node, members[node], ops, positions[node], region_of, compiled, unfused)
                  for layer in layers for node in layer)
    edges = tuple((positions[a][0] + BOX_W // 2, positions[a][1] + BOX_H,
                   positions[b][0] + BOX_W // 2, positions[b][1])
                  for a, b in sorted(condensed.edges, key=lambda e: (positions[e[0]], positions[e[1]])))
    width = 2 * MARGIN + max((len(layer) for layer in layers), default=1) * (BOX_W + GAP_X)
    height = 2 * MARGIN + len(layers) * (BOX_H + GAP_Y)
    return Drawing(width, height, boxes, edges)


def _layers(graph: nx.DiGraph) -> list[list[str]]:
    """Longest-path layering, then each layer ordered by the mean column of its predecessors."""
    depth: dict[str, int] = {}
    for node in nx.lexicographical_topological_sort(graph):
        depth[node] = max((depth[p] + 1 for p in graph.predecessors(node)), default=0)
    layers: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for node in nx.lexicographical_topological_sort(graph):
        layers[depth[node]].append(node)
    column: dict[str, float] = {}
    for layer in layers:
        layer.sort(key=lambda n: (_barycentre(graph, n, column), n))
        column.update({node: index for index, node in enumerate(layer)})
    return layers


def _barycentre(graph: nx.DiGraph, node: str, column: dict[str, float]) -> float:
    placed = [column[p] for p in graph.predecessors(node) if p in column]
    return sum(placed) / len(placed) if placed else -1.0


def _box(node, members, ops, position, region_of, compiled, unfused) -> Box:
    types = [ops.nodes[m]["op_type"] for m in members]
    title = "\n".join(f"{ops.nodes[m]['op_type']} {m}" + (f": {unfused[m]}" if m in unfused else "")
                      for m in members)
    x, y = position
    if node in compiled:
        return Box(node, "region", _short(f"{node}: {'+'.join(types)}"), title, x, y, node,
                   compiled[node])
    if node in unfused:
        return Box(node, "unfused", _short(f"{types[0]} (not fused)"), title, x, y)
    if len(members) > 1:
        return Box(node, "run", _short(f"{len(members)} ops: {', '.join(dict.fromkeys(types))}"),
                   title, x, y)
    return Box(node, "op", _short(types[0]), title, x, y)


def _short(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 1] + "…"
