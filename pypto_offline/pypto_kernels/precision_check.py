"""A converted build's kernels against the model in its own precision (docs/precision.md).

onnxruntime's CPU provider runs most fp16 ops in fp32 (it inserts casts around those it has no
fp16 kernel for), so the whole-model check sees the rounding of tensors to fp16 between ops, not
what an fp16 kernel computes. What the kernel computes is seen here, as msaccucmp compares a
dump: each shipped kernel runs once more, on the values its inputs take when the original model
runs on the verification inputs (rounded to the kernel's types), and its outputs are compared
with the original model's values of the same tensors. An fp16 overflow (a square of 300) is an
infinity here, a cosine of 0.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from pypto_offline.fusion.classify import node_id
from pypto_offline.fusion.records import Region
from pypto_offline.importer import ImportedGraph
from pypto_offline.importer.precision import original_name
from pypto_offline.pypto_kernels.jobs import pool
from pypto_offline.pypto_kernels.jobs.protocol import FailureKind
from pypto_offline.pypto_kernels.records import Kernel, TileResult
from pypto_offline.pypto_kernels.region_data import kernel_arguments
from pypto_offline.pypto_kernels.search import Setup, run_region_job
from pypto_offline.pypto_kernels.tiling import TilePolicy

@dataclass(frozen=True)
class KernelPrecision:
    """One kernel's outputs against the original model's: ``runtime.precision_metrics`` of its
    least similar output, or why it was not measured."""

    region_id: str
    metrics: dict | None
    why_not: str = ""


def check_kernels(kernels: Sequence[Kernel], regions: Mapping[str, Region],
                  graph: ImportedGraph, original: Mapping[str, np.ndarray],
                  names: tuple[Sequence[str], Sequence[str]], setup: Setup, jobs: int
                  ) -> dict[str, KernelPrecision]:
    """Each compiled kernel's precision by region id. ``original``: every tensor's value in the
    original model's run; ``names``: that model's input and output names, in order."""
    constants = graph.constant_values()
    shipped = [k for k in kernels if _tile_of(k) is not None]
    read_by_kernels = read_by_kernels_alone(
        graph, [regions[k.region_id] for k in kernels if k.compiled])

    def check(kernel: Kernel) -> KernelPrecision:
        region = regions[kernel.region_id]
        data = _data(region, graph, constants, original, names)
        if isinstance(data, str):
            return KernelPrecision(region.id, None, data)
        saturated = tuple(i for i, name in enumerate(region.outputs) if name in read_by_kernels)
        return KernelPrecision(region.id, *_run(kernel, region, setup, *data, saturated))
    return {p.region_id: p for p in pool.each(shipped, jobs, check)}


def read_by_kernels_alone(graph: ImportedGraph, compiled: Sequence[Region]) -> set[str]:
    """The tensors that only compiled kernels read (none of the model's outputs): where an fp16
    kernel's overflow is seen by the kernels reading it, which run on the model's values
    rounded to fp16, so its output may be compared as fp16 can tell it
    (``runtime.saturated_fp16``). A tensor an unfused op or the model's output reads is
    compared as it is: onnxruntime's run of the model computes those fp16 ops in fp32 and
    would not see the overflow (docs/precision.md)."""
    in_kernels = {node for region in compiled for node in region.nodes}
    readers: dict[str, list[str]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node_id(node))
    return {name for name, nodes in readers.items()
            if name not in graph.outputs and all(node in in_kernels for node in nodes)}


def _data(region: Region, graph: ImportedGraph, constants: dict, original, names):
    """(the kernel's arguments, the original values of its outputs), or why there are none."""
    def value(name: str):
        return original.get(original_name(name, *names))

    def in_its_type(name: str) -> np.ndarray:
        with np.errstate(over="ignore"):  # beyond fp16: reported (precision.beyond_fp16)
            return np.asarray(value(name)).astype(graph.tensors[name].np_dtype)
    missing = [n for n in region.inputs if n not in constants and value(n) is None]
    if missing:
        return f"the original model has no tensor {missing[0]!r} stands for"
    arrays, _ = kernel_arguments(region, constants, in_its_type)
    expected = [value(name) for name in region.outputs]
    if any(e is None for e in expected):
        return "the original model has no tensor one of its outputs stands for"
    return arrays, [np.asarray(e) for e in expected]


def _tile_of(kernel: Kernel) -> TileResult | None:
    """The tile a kernel runs with: the shipped one, or for a kernel that failed its functional
    check (an fp16 overflow onnxruntime's fp32 arithmetic does not have: the region's ops then
    run unfused, in fp16 on the chip as well), the fastest candidate that compiled."""
    if kernel.compiled:
        return kernel.tuned_tile
    if kernel.fallback_kind is not FailureKind.CHECK_FAILED or not kernel.source:
        return None
    compiled = [c for c in kernel.candidates if c.aicore_us is not None and not c.error]
    return min(compiled, key=lambda c: (c.aicore_us, c.total_us or 0), default=None)


def _run(kernel: Kernel, region: Region, setup: Setup, arrays, expected,
         saturated: tuple[int, ...]) -> tuple:
    tile = _tile_of(kernel)
    policy = TilePolicy(tile.budget_bytes, tile.swapped_transposes, tile.flat_rows,
                        tile.vec_merge)
    staged = setup.cache.staging()  # where the fork servers take jobs (jobs/executor.py)
    try:
        result = run_region_job(setup, staged / "precision", region, {policy: kernel.source},
                                kernel.cache_key, arrays, expected, verify=True,
                                original_reference=True, saturated_outputs=saturated)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    answer = result.candidates[0] if result.candidates else None
    if answer is None or not answer.compiled or answer.metrics is None:
        reason = (answer.error if answer else None) or (result.failure.reason
                                                       if result.failure else "no answer")
        return None, f"the kernel did not run on the model's values: {reason}"
    return answer.metrics, ""
