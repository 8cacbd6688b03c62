"""The records fusion hands to the kernel stage, the blob and the report: plain and immutable."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import onnx

# Why a memory-bound op stays outside a kernel; the report groups by these.
BOUNDARY = "boundary"            # not memory-bound, or a parameter only known at run time
CANNOT_EXPRESS = "cannot express"  # the kernel generator or the target cannot take it
DOES_NOT_PAY = "does not pay"    # the cost model finds no gain
FAILED_CHECK = "failed check"    # filled in by the kernel stage


@dataclass(frozen=True)
class RegionOp:
    """One op of a region's program: canonical parameters, tensors by name."""

    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Cost:
    """One or more kernels: launches, global-memory bytes, and the target's time estimate."""

    kernels: int
    gm_bytes: int
    time_us: float


@dataclass(frozen=True)
class Region:
    """A convex set of memory-bound nodes fused into one kernel."""

    id: str
    nodes: tuple[str, ...]          # node ids (first output name) in graph order
    inputs: tuple[str, ...]         # tensors read from global memory
    outputs: tuple[str, ...]        # tensors written to global memory
    original: tuple[RegionOp, ...]  # the ops as imported
    simplified: tuple[RegionOp, ...]  # after the view rewrite rules
    rules_applied: tuple[str, ...]
    unfused: Cost
    fused: Cost                     # lower bound: inputs once + outputs once, one launch
    # shape and ONNX element type of every tensor of the simplified program
    tensor_types: Mapping[str, tuple[tuple[int, ...], int]] = field(
        default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Unfused:
    """A memory-bound op left out of every kernel, and why."""

    node: str
    op_type: str
    category: str
    reason: str


@dataclass(frozen=True)
class Totals:
    nodes_before: int
    nodes_after: int
    kernels_before: int
    kernels_after: int
    fused_kernels: int
    ops_fused: int
    gm_bytes_before: int
    gm_bytes_after: int
    gm_bytes_lower_bound: int
    est_time_us_before: float
    est_time_us_after: float


@dataclass(frozen=True)
class Cut:
    """A planned region that could not ship, cut in two (``fusion.split``): why, the node ids of
    each part (graph order), the tensors the first part hands the second through global memory
    and the bytes that moves (each written once and read once)."""

    region: str
    reason: str
    parts: tuple[tuple[str, ...], tuple[str, ...]]
    tensors: tuple[str, ...]
    bytes_moved: int


@dataclass(frozen=True)
class FusionPlan:
    target: str
    regions: tuple[Region, ...]
    unfused: tuple[Unfused, ...]
    totals: Totals
    compiled_model: onnx.ModelProto
    # the regions cut because they could not ship, in the order they were cut; their parts
    # follow them in ``regions`` (ids ``part_id``), before ``without_regions`` drops the cut ones
    cuts: tuple[Cut, ...] = ()
