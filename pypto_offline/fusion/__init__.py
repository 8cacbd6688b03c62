"""Fusion: decide what becomes one kernel.

    plan = plan_fusion(imported_graph, target)

Passes, one per file: ``classify`` (memory-bound and expressible on the target) → ``partition``
(maximal convex regions within the Unified Buffer) → ``simplify`` (view rewrite rules over each
region's program, ``rules`` and ``views``) → ``cost`` (fuse only where it pays) → ``lower`` (the
compiled ONNX graph with one function call per region).
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

from pypto_offline.fusion.classify import node_id, node_tensors, why_not_fusable
from pypto_offline.fusion.cost import (fused_cost, node_cost, time_us, total,
                                       why_staging_does_not_pay)
from pypto_offline.fusion.dequantise_in_readers import dequantise_in_readers
from pypto_offline.fusion.lower import compiled_model
from pypto_offline.fusion.members import read_beyond, tensor_readers
from pypto_offline.fusion.partition import partition
from pypto_offline.fusion.program import Program, build_program
from pypto_offline.fusion.records import (DOES_NOT_PAY, Cost, Cut, FusionPlan, Region, RegionOp,
                                          Totals, Unfused)
from pypto_offline.fusion.simplify import simplify
from pypto_offline.fusion.split import cut_in_two, members_of, part_id
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.registry.ops import definition, in_scope
from pypto_offline.targets import Target

__all__ = ["Cost", "Cut", "FusionPlan", "Region", "RegionOp", "Totals", "Unfused", "make_region",
           "plan_fusion", "with_parts", "without_regions"]


def plan_fusion(graph: ImportedGraph, target: Target,
                boundaries: Mapping[str, tuple[str, str]] | None = None) -> FusionPlan:
    """``boundaries``: node id -> (category, reason) for nodes kept out of every region beyond
    what classify says (a matmul whose kernel with its epilogue did not compile)."""
    verdicts = _verdicts(graph, target)
    verdicts.update(boundaries or {})
    fusable = {nid for nid, verdict in verdicts.items() if verdict is None}
    nodes = {node_id(n): n for n in graph.nodes}
    readers = tensor_readers(graph)
    regions: list[Region] = []
    refused: dict[str, tuple[str, str]] = {}
    for members in dequantise_in_readers(graph, partition(graph, fusable, target), fusable,
                                         target):
        region = make_region(f"region_{len(regions)}", [nodes[m] for m in members], graph,
                             target, readers)
        why = _why_it_does_not_pay(region)
        if why is None:
            regions.append(region)
        else:
            refused.update({m: (DOES_NOT_PAY, why) for m in members})
    return _plan(graph, target, regions, verdicts, refused)


def without_regions(plan: FusionPlan, graph: ImportedGraph, target: Target,
                    failed: dict[str, tuple[str, str]]) -> FusionPlan:
    """The plan again with some regions fallen back to unfused ops; ``failed`` maps a region id
    to (category, reason), e.g. a kernel that failed its check."""
    verdicts = _verdicts(graph, target)
    refused = {nid: failed[r.id] for r in plan.regions if r.id in failed for nid in r.nodes}
    refused.update({u.node: (u.category, u.reason) for u in plan.unfused
                    if verdicts[u.node] is None})
    kept = [r for r in plan.regions if r.id not in failed]
    return _plan(graph, target, kept, verdicts, refused, plan.cuts)


def with_parts(plan: FusionPlan, graph: ImportedGraph, target: Target,
               cannot_ship: Mapping[str, str]) -> tuple[FusionPlan, tuple[Region, ...]]:
    """Split, never drop (``fusion/split.py``): each region of ``cannot_ship`` (region id ->
    why) cut in two and its parts planned again. A part of two nodes or more that pays fused is
    a new region, after the plan's; the others' ops ship alone, as a region of two nodes does
    (not cut: its parts would be its ops). Returns the plan with the new regions and the cuts
    (its totals and compiled model are those of before: ``without_regions`` drops what does not
    ship and makes them again) and the new regions, to compile."""
    to_cut = [r for r in plan.regions if r.id in cannot_ship and len(r.nodes) > 2]
    if not to_cut:  # most builds: no graph-wide tables for nothing
        return plan, ()
    nodes = {node_id(n): n for n in graph.nodes}
    readers = tensor_readers(graph)
    cuts: list[Cut] = []
    parts: list[Region] = []
    for region in to_cut:
        cut = cut_in_two(region.id, [nodes[nid] for nid in region.nodes],
                         cannot_ship[region.id], graph, target, readers)
        if cut is None:
            continue
        cuts.append(cut)
        for index, members in enumerate(members_of(cut, nodes)):
            if len(members) > 1:
                part = make_region(part_id(region.id, index), members, graph, target, readers)
                if _why_it_does_not_pay(part) is None:
                    parts.append(part)
    return replace(plan, regions=plan.regions + tuple(parts),
                   cuts=plan.cuts + tuple(cuts)), tuple(parts)


def _plan(graph, target, regions, verdicts, refused, cuts=()) -> FusionPlan:
    model = compiled_model(graph, regions)
    unfused = _unfused(graph, verdicts, regions, refused)
    return FusionPlan(target.name, tuple(regions), tuple(unfused),
                      _totals(graph, regions, model, target), model, tuple(cuts))


def make_region(region_id: str, members: list[Node], graph: ImportedGraph, target: Target,
                readers: Mapping[str, list[str]] | None = None) -> Region:
    """The region of these nodes (in graph order), as the partition makes it: its boundary,
    program, rewrites and cost figures. Tests use it for a region of one op, which the
    partition never makes (it saves nothing). ``readers``: ``tensor_readers(graph)``, made once
    for a plan's every region rather than once per region."""
    inputs, outputs = _boundary_tensors(members, graph,
                                        tensor_readers(graph) if readers is None else readers)
    program = build_program(graph, members, inputs, outputs)
    original = tuple(program.ops)
    applied = simplify(program)
    region = Region(
        id=region_id, nodes=tuple(node_id(n) for n in members), inputs=inputs, outputs=outputs,
        original=original, simplified=tuple(program.ops), rules_applied=tuple(applied),
        unfused=total((node_cost(n, graph, target) for n in members), target),
        fused=fused_cost(inputs, outputs, graph, target, original),
        tensor_types=MappingProxyType({name: (program.shapes[name], program.dtypes[name])
                                       for name in _program_tensors(program)}))
    return region


def _program_tensors(program: Program) -> list[str]:
    names = list(program.inputs) + [n for op in program.ops for n in op.inputs + op.outputs]
    return list(dict.fromkeys(names))


def _boundary_tensors(members: list[Node], graph: ImportedGraph,
                      readers: Mapping[str, list[str]]):
    produced = {name for n in members for name in n.outputs}
    read = [name for n in members for name in node_tensors(n)
            if name not in produced and name not in n.outputs]
    return tuple(dict.fromkeys(read)), read_beyond(members, graph, readers)


def _verdicts(graph: ImportedGraph, target: Target) -> dict[str, tuple[str, str] | None]:
    """Node id -> why it cannot join a kernel (``classify``), or does not pay to (a convolution
    whose kernel stages more through GM than fusing saves, ``cost.why_staging_does_not_pay``);
    None if it may."""
    verdicts = {}
    for n in graph.nodes:
        verdict = why_not_fusable(n, graph, target)
        staged = why_staging_does_not_pay(n, graph, target) if verdict is None else None
        verdicts[node_id(n)] = (DOES_NOT_PAY, staged) if staged else verdict
    return verdicts


def _why_it_does_not_pay(region: Region) -> str | None:
    if region.unfused.kernels == 0:
        return "metadata only: no kernel to save"
    if region.unfused.kernels == 1:
        return "one kernel already: fusing saves no launch and no traffic"
    if region.fused.time_us >= region.unfused.time_us:
        return (f"estimated {region.fused.time_us:.2f} us fused against "
                f"{region.unfused.time_us:.2f} us unfused")
    return None


def _unfused(graph, verdicts, regions, refused) -> list[Unfused]:
    fused = {nid for region in regions for nid in region.nodes}
    result = []
    for node in graph.nodes:
        nid = node_id(node)
        if nid in fused or not in_scope(node.op_type, node.domain):
            continue
        if verdicts[nid] is not None:
            category, reason = verdicts[nid]
        elif nid in refused:
            category, reason = refused[nid]
        elif definition(node.op_type).view_only:
            category, reason = DOES_NOT_PAY, "metadata only: no kernel to save"
        else:
            category, reason = DOES_NOT_PAY, "no fusable neighbour"
        result.append(Unfused(nid, node.op_type, category, reason))
    return result


def _totals(graph, regions, model, target: Target) -> Totals:
    before = total((node_cost(n, graph, target) for n in graph.nodes), target)
    saved_kernels = sum(r.unfused.kernels for r in regions) - len(regions)
    saved_bytes = sum(r.unfused.gm_bytes - r.fused.gm_bytes for r in regions)
    kernels_after = before.kernels - saved_kernels
    bytes_after = before.gm_bytes - saved_bytes
    return Totals(
        nodes_before=len(graph.nodes), nodes_after=len(model.graph.node),
        kernels_before=before.kernels, kernels_after=kernels_after, fused_kernels=len(regions),
        ops_fused=sum(len(r.nodes) for r in regions),
        gm_bytes_before=before.gm_bytes, gm_bytes_after=bytes_after,
        gm_bytes_lower_bound=bytes_after,
        est_time_us_before=before.time_us, est_time_us_after=time_us(kernels_after, bytes_after,
                                                                     target))
