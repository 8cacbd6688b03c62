"""The unfused baseline's estimate: what a region's ops would cost as one PyPTO kernel each,
without compiling them (docs/baseline.md).

A default build compiles only what it ships. The baseline it reports beside each fused kernel is
estimated per op from a linear fit of PyPTO cost-model times measured on the corpus
(``bench.baseline_fit`` writes ``baseline_fit.json`` from the per-op cache):

    time_us(op) = intercept[family][class] + per_kib[family][class] × KiB moved

``family`` is the cost model the target's platform times on (``cost_model_family``), ``class``
the kind of op (elementwise, data movement, transpose, matmul), "KiB moved" the op's own kernel
reading its inputs whole (one-element constants are immediates) and writing its outputs, and
for a matmul or convolution what the cube makes it move besides (operand re-reads, the product
handed to a vector bias, a convolution's staged taps: ``fusion/cost.py``). The fit ships
with the code, not from the user's cache, so the same model and options give the same blob
whatever the cache holds. ``--measure-baseline`` compiles every op instead
(``measured_baseline.unfused_costs``).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Iterable, Sequence

import numpy as np

from pypto_offline.fusion.cost import (cube_handoff_bytes, cube_reread_bytes, staging_bytes,
                                       tensor_bytes)
from pypto_offline.fusion.program import Program
from pypto_offline.fusion.records import Region, RegionOp
from pypto_offline.fusion.simplify import simplify
from pypto_offline.importer import ImportedGraph
from pypto_offline.importer.input_shapes import tensor_bytes as bytes_of
from pypto_offline.registry.ops import MATMUL, definition
from pypto_offline.pypto_kernels.jobs.protocol import HEADLINES, FailureKind
from pypto_offline.pypto_kernels.platform import Platform, platform_of
from pypto_offline.targets import Target

FIT_FILE = Path(__file__).with_name("baseline_fit.json")
MEASURED, ESTIMATED = "measured", "estimated"
CUBE = "matmul"  # the class of the ops the cube runs: MatMul, Gemm, Conv and their kin
OP_CLASSES = ("elementwise", "data", "transpose", CUBE)


def op_class(op_type: str) -> str:
    """An op that reorders axes is moved through TRANSPOSE_MOVEOUT, slower per byte than a
    straight copy; a matmul or convolution runs on the cube."""
    entry = definition(op_type)
    if entry.kind == MATMUL:
        return CUBE
    if entry.reorders:
        return "transpose"
    return "elementwise" if entry.pointwise else "data"


def slower_fused(fused_us: float, unfused_us: float, unfused_kernels: int,
                 launch_us: float) -> str | None:
    """Why a kernel does not pay under PyPTO's cost model, or None: its AICore time against its
    ops' as one kernel each, the launches fusing saves counted ((ops - 1) x ``launch_us``, the
    target's launch overhead). The arbiter of what ships (docs/baseline.md)."""
    launches = (unfused_kernels - 1) * launch_us
    if fused_us <= unfused_us + launches:
        return None
    return (f"{HEADLINES[FailureKind.SLOWER_FUSED]}: PyPTO's cost model gives {fused_us:.2f} us against {unfused_us:.2f} "
            f"us for its ops unfused and {launches:.1f} us of launches saved")


def heavier_and_untimed(moved: int, unfused_bytes: int) -> str:
    """Why a kernel that moves more bytes than its ops unfused does not ship when PyPTO cannot
    time its ops alone (docs/baseline.md, "When the estimate does not decide")."""
    return (f"{HEADLINES[FailureKind.SLOWER_FUSED]}: it moves {moved} B, more than its ops' "
            f"{unfused_bytes} B unfused, and PyPTO could not time its ops alone")


def cost_model_family(platform: Platform) -> str:
    """Which fit a platform's times follow: its cost tables (A5, or the 910B default), on the
    simulator's default machine (the 910B's 24 cube and 48 vector cores, 192 KiB of UB) or
    on the platform's cores and UB (a Kirin's one core): what a vector op's time depends on.
    A family without a fit gives no estimate (docs/baseline.md)."""
    tables = platform.cost_tables[0] if platform.cost_tables else "910B"
    if not platform.simulator:
        return tables
    return (f"{tables} on {platform.figure('cube_core_cnt')}+"
            f"{platform.figure('vector_core_cnt')} cores, UB {platform.figure('ub_size')}")


def kib_moved(single: Region, graph: ImportedGraph) -> float:
    """KiB the op's own kernel moves: its inputs read whole (but one-element constants, which
    the kernel holds as immediates, and bands it writes: importer/bands.py) and its outputs
    written."""
    read = [name for name in single.inputs if name not in graph.made_in_kernel]
    return tensor_bytes(graph, [*read, *single.outputs]) / 1024


def op_sample(single: Region, graph: ImportedGraph) -> tuple[str, float]:
    """What the estimate knows of one op: its class and the KiB it moves."""
    (op,) = single.original
    name = op_class(op.op_type)
    kib = kib_moved(single, graph)
    if name == CUBE:
        kib += cube_bytes(op, single.tensor_types) / 1024
    return name, kib


def cube_bytes(op: RegionOp, tensor_types) -> int:
    """What a matmul's or convolution's kernel of its own moves beyond reading its operands
    once and writing its product: the cube's operand re-reads, the product handed to a vector
    bias, a convolution's staged taps (``fusion/cost.py``). With them the KiB moved estimates
    a cube op within the error of the others (docs/baseline.md)."""
    image, out = tensor_types[op.inputs[0]], tensor_types[op.outputs[0]]
    return cube_reread_bytes([op], tensor_types) + cube_handoff_bytes([op], tensor_types) \
        + staging_bytes(op, image[0], out[0], bytes_of((), image[1]))


@lru_cache(maxsize=1)
def shipped_fit() -> dict:
    return json.loads(FIT_FILE.read_text())


def estimate_op_us(sample: tuple[str, float], lines: dict) -> float:
    """One op's time under ``lines``: one family's (intercept, per-KiB slope) by op class."""
    intercept, per_kib = lines[sample[0]]
    return intercept + per_kib * sample[1]


def estimate_region_us(samples: Iterable[tuple[str, float]], family: str) -> float | None:
    """None when an op is of a class the fit has no line for, or the family has no fit
    (``cost_model_family``)."""
    lines = shipped_fit()["families"].get(family)
    if lines is None:
        return None
    samples = list(samples)
    if any(s[0] not in lines for s in samples):
        return None
    return round(sum(estimate_op_us(s, lines) for s in samples), 3)


def fit_family(samples: Sequence[tuple[str, float]], times: Sequence[float]) -> dict:
    """Per op class, the intercept and slope minimising the *relative* error over the measured
    ops (rows weighted by 1/time: a 2 µs op matters as much as a 200 µs one), both kept ≥ 0.
    A class without two distinct sizes measured takes the pooled fit of all classes."""
    pooled = _fit_line([s[1] for s in samples], times)
    fitted = {}
    for name in OP_CLASSES:
        rows = [(s[1], t) for s, t in zip(samples, times) if s[0] == name]
        sizes = {kib for kib, _ in rows}
        fitted[name] = (_fit_line(*zip(*rows)) if len(sizes) >= 2 else pooled)
    return fitted


def _fit_line(kib: Sequence[float], times: Sequence[float]) -> list[float]:
    x = np.asarray(kib, dtype=np.float64)
    y = np.asarray(times, dtype=np.float64)
    weight = 1.0 / y
    design = np.stack([np.ones_like(x), x], axis=1) * weight[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, y * weight, rcond=None)
    if slope < 0:  # more bytes never cost less: a flat line at the weighted mean instead
        intercept, slope = float(np.sum(y * weight ** 2) / np.sum(weight ** 2)), 0.0
    if intercept < 0:
        intercept, slope = 0.0, float(np.sum(x * y * weight ** 2) / np.sum((x * weight) ** 2))
    return [round(float(intercept), 4), round(float(slope), 6)]


def relative_errors(samples: Sequence[tuple[str, float]], times: Sequence[float],
                    lines: dict) -> list[float]:
    """|estimate - measured| / measured of each op, under one family's ``lines``."""
    return [abs(estimate_op_us(s, lines) - t) / t for s, t in zip(samples, times)]


def estimated_unfused_costs(graph: ImportedGraph, regions: Sequence[Region], target: Target
                            ) -> dict[str, float | None]:
    """The estimated baseline of each region, by region id: no compile, no cache."""
    family = cost_model_family(platform_of(target))
    return {region.id: estimate_region_us(
        (op_sample(single, graph) for single in single_op_regions(region, graph)),
        family)
        for region in regions}


def single_op_regions(region: Region, graph: ImportedGraph) -> list[Region]:
    """Each device op of the region's original program as a region of its own, its program
    simplified as a planned region's is (a MaxPool becomes the views of its windows: the kernel
    generator lowers no pooling op as it is)."""
    singles = []
    for index, op in enumerate(region.original):
        if definition(op.op_type).view_only:  # a Reshape or an Identity in a program
            continue  # metadata on contiguous data: no kernel before fusion either
        names = list(op.inputs) + list(op.outputs)
        program = Program([op], tuple(op.inputs), tuple(op.outputs),
                          {n: tuple(graph.tensors[n].shape) for n in names},
                          {n: graph.tensors[n].dtype for n in names})
        applied = simplify(program)
        types = {n: (program.shapes[n], program.dtypes[n]) for n in program.shapes}
        singles.append(Region(
            id=f"{region.id}_op{index}", nodes=(op.outputs[0],), inputs=tuple(op.inputs),
            outputs=tuple(op.outputs), original=(op,), simplified=tuple(program.ops),
            rules_applied=tuple(applied), unfused=region.unfused, fused=region.fused,
            tensor_types=MappingProxyType(types)))
    return singles
