"""The cost model: per kernel one launch plus its global-memory bytes at the target's bandwidth.

    time = launches × launch overhead + bytes ÷ bandwidth

A node's kernel reads its data inputs and writes its outputs; reshape-like nodes are metadata on
contiguous data and cost nothing. A fused region's lower bound reads its inputs once and writes its
outputs once. The target's bandwidth and launch overhead are mostly estimates (see targets/).
"""
from __future__ import annotations

from typing import Iterable

from pypto_offline.fusion.classify import VIEW_ONLY_OPS, node_tensors
from pypto_offline.fusion.records import Cost
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.targets import Target


def time_us(kernels: int, gm_bytes: int, target: Target) -> float:
    return kernels * target.launch_overhead_us.value + target.seconds_for_bytes(gm_bytes) * 1e6


def tensor_bytes(graph: ImportedGraph, names: Iterable[str]) -> int:
    return sum(graph.tensors[name].nbytes for name in names
               if name in graph.tensors and graph.tensors[name].shape is not None)


def node_cost(node: Node, graph: ImportedGraph, target: Target) -> Cost:
    if node.op_type in VIEW_ONLY_OPS and node.domain in ("", "ai.onnx"):
        return Cost(0, 0, 0.0)
    gm_bytes = tensor_bytes(graph, node_tensors(node))
    return Cost(1, gm_bytes, time_us(1, gm_bytes, target))


def total(costs: Iterable[Cost], target: Target) -> Cost:
    costs = list(costs)
    kernels = sum(c.kernels for c in costs)
    gm_bytes = sum(c.gm_bytes for c in costs)
    return Cost(kernels, gm_bytes, time_us(kernels, gm_bytes, target))


def fused_cost(inputs: Iterable[str], outputs: Iterable[str], graph: ImportedGraph,
               target: Target) -> Cost:
    gm_bytes = tensor_bytes(graph, inputs) + tensor_bytes(graph, outputs)
    return Cost(1, gm_bytes, time_us(1, gm_bytes, target))
