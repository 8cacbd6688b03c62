"""Planning grows near-linearly with the ops (issue 34, row 13): the partition's convexity check
searched the whole rest of the graph once per merge (4.5M successor steps for a 3,000-op chain,
11.2 s). The work is counted, not timed: ``Partition.steps``, the edges the checks looked at.
Wall times at 1k, 3k and 10k ops: ``python -m bench.scale`` (bench/results/scale/)."""
from __future__ import annotations

import pytest

from bench.scale import branches_model, chain_model
from pypto_offline import import_model
from pypto_offline.fusion.classify import node_id, why_not_fusable
from pypto_offline.fusion.partition import Partition
from pypto_offline.targets import TARGETS


def partitioned(model, target: str = "kirin9050") -> tuple:
    graph = import_model(model)
    fusable = {node_id(n) for n in graph.nodes
               if why_not_fusable(n, graph, TARGETS[target]) is None}
    return graph, Partition(graph, fusable, TARGETS[target])


@pytest.mark.parametrize("build", [chain_model, branches_model])
def test_planning_3000_ops_takes_near_linear_work(build):
    graph, small = partitioned(build(1000))
    graph, done = partitioned(build(3000))
    # A chain: one edge per merge (3,000). Branches: the hub's 750 consumers, looked at once
    # per merge into the hub's region until its UB is full (171k). main's search took ~1,500
    # steps per merge of the chain (4.5M).
    assert done.steps <= 100 * len(graph.nodes), done.steps
    assert done.steps <= 4 * small.steps, (small.steps, done.steps)  # 3x the ops: not 9x
    regions = done.regions()
    fused = [nid for region in regions for nid in region]
    assert len(fused) == len(set(fused))  # no node in two regions
    if build is chain_model:  # every op fuses, in regions the UB bounds
        assert len(fused) == 3000 and len(regions) > 1
    else:  # every branch fuses; the join (a Concat of 749 tensors) fits no UB
        assert len(fused) == len(graph.nodes) - 1
