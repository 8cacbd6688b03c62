"""Pipeline orchestration: import → fusion → PyPTO kernels → the blob message.

A region whose kernel cannot be written, compiled or checked falls back to unfused ops (the plan
is re-lowered without it). Global-memory bytes after fusion count each shipped kernel's traffic as
measured in its compiled program; the lower bound stays inputs once + outputs once per region.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Generator, Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.errors import UsageError
from pypto_offline.fusion import FusionPlan, Region, plan_fusion, with_parts, without_regions
from pypto_offline.fusion.records import DOES_NOT_PAY, FAILED_CHECK
from pypto_offline.importer import ImportedGraph, import_model, precision
from pypto_offline.importer.input_format import check_input_format
from pypto_offline.importer.input_shapes import graph_inputs, symbolic_input_error
from pypto_offline.importer.shape_probe import check_memory, every_value
from pypto_offline.registry.ops import MATMUL, kind_of
from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.offline_compiler.options import BuildOptions
from pypto_offline.offline_compiler.messages import (kernel_message, platform_message,
                                                     precision_message, provenance_message,
                                                     target_descriptor, totals_message)
from pypto_offline.offline_compiler.rounds import Compiles, Steps, in_rounds
from pypto_offline.progress import SILENT, Labelled, Progress, Timings
from pypto_offline.runtime import generate_inputs, in_input_types
from pypto_offline.pypto_kernels import Kernel, setup_for
from pypto_offline.pypto_kernels.baseline import (CUBE, ESTIMATED, MEASURED,
                                                  estimated_unfused_costs, heavier_and_untimed,
                                                  op_class, slower_fused)
from pypto_offline.pypto_kernels.jobs.protocol import FailureKind
from pypto_offline.pypto_kernels.measured_baseline import unfused_costs
from pypto_offline.pypto_kernels.precision_check import KernelPrecision, check_kernels
from pypto_offline.pypto_kernels.platform import STOCK_PLATFORM, platform_figures, platform_of
from pypto_offline.pypto_kernels.search import Setup
from pypto_offline.targets import Target
from pypto_offline.user_files import read_regular


@dataclass(frozen=True)
class BuildResult:
    message: ptom_pb2.CompiledModel
    graph: ImportedGraph
    plan: FusionPlan
    kernels: tuple[Kernel, ...]
    # the kernels of a first plan that a re-plan replaced (matmuls split from their epilogue):
    # their compiles are this build's work too, and the re-plan finds them in the cache
    replaced: tuple[Kernel, ...] = ()
    # the imported graph in its own precision, when a precision mode converted it: what the
    # build's verification compares with (the blob keeps the converted one only)
    original: onnx.ModelProto | None = None

    def kernel_cache(self) -> dict[str, int]:
        """Kernels compiled by PyPTO in this build, kernels taken from a cache entry made before
        it ("hits"), and the PyPTO compiles it ran, over every plan it compiled."""
        earlier = {k.cache_key for k in self.replaced if k.reached_pypto and not k.from_cache}
        ours = [k.reached_pypto and (not k.from_cache or k.cache_key in earlier)
                for k in self.kernels]
        return {"hits": sum(k.from_cache and not own for k, own in zip(self.kernels, ours)),
                "compiled": sum(ours),
                "pypto_compiles": sum(k.pypto_compiles for k in (*self.replaced, *self.kernels))}


@dataclass
class BuildContext:
    """What every compile of a build, and of the builds run with it (a blob's gears, every
    round), shares, made once from the first build's options: per target (a --compare-platform
    round compiles under PyPTO's 910B platform too), the kernel cache, where the jobs run and
    a job's time limit (``pypto_kernels.Setup``); and the options saying how kernels compile
    (jobs, tile search)."""
    options: BuildOptions
    setups: dict[Target, Setup] = field(default_factory=dict)

    def setup(self, target: Target) -> Setup:
        if target not in self.setups:
            options = self.options
            self.setups[target] = setup_for(target, options.cache_dir, options.executor,
                                            options.kernel_timeout_s, options.cache_trust)
        return self.setups[target]


def model_bytes(source) -> tuple[bytes, str]:
    """The source model's bytes (for its sha256) and a name without any folder."""
    if isinstance(source, onnx.ModelProto):
        return source.SerializeToString(), source.graph.name or "model"
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), "model"
    path = Path(source)
    try:
        return read_regular(path, "the model's path", "give the path of an .onnx file"), \
            path.name
    except OSError as error:
        raise UsageError(f"cannot read the model: {error.strerror}", where=str(path),
                         fix="check the model path") from None


def build(source, target: Target, options: BuildOptions, progress: Progress = SILENT,
          timings: Timings | None = None) -> BuildResult:
    """``progress`` hears of each stage and finished kernel; ``timings`` gets the seconds of the
    stages run here (import, plan, kernels, baseline). Neither changes the result."""
    return build_together([(source, options)], target, progress, timings)[0]


def build_together(builds: Sequence[tuple[object, BuildOptions]], target: Target,
                   progress: Progress = SILENT, timings: Timings | None = None,
                   labels: Sequence[str] = ()) -> list[BuildResult]:
    """Each (source, options)'s build, in order, run in rounds (``rounds.in_rounds``): every
    build's kernels of one stage compiled in one round of the pool. The options may differ in
    their shapes and inputs only (a blob's gears): the first one's say how kernels compile.
    Each result is the one ``build`` gives alone. ``labels``: each build's name in its stages."""
    first = builds[0][1]
    if any(replace(options, input_shapes=first.input_shapes, dims=first.dims,
                   inputs=first.inputs) != first for _, options in builds):
        raise ValueError("builds run together may differ in their shapes and inputs only")
    timings = timings or Timings()
    context = BuildContext(first)
    steps = [build_steps(source, target, options, context,
                         Labelled(progress, labels[index]) if labels else progress, timings)
             for index, (source, options) in enumerate(builds)]
    return in_rounds(steps, context, progress, timings)


def build_steps(source, target: Target, options: BuildOptions, context: BuildContext,
                progress: Progress, timings: Timings) -> Steps:
    """One build, yielding a ``rounds.Compiles`` where it needs kernels (``rounds``);
    ``context``: what its compiles share with the builds run with it."""
    from pypto_offline import __version__

    platform_figures(target)  # a target whose platform lacks a figure stops here, at once
    raw, name = model_bytes(source)
    progress.stage("importing")
    with timings.stage("import_s"):
        graph = import_model(source, options.input_shapes, inputs=options.inputs,
                             must_run=options.verify, dims=options.dims,
                             input_dtypes=_blob_input_dtypes(options))
        _require_static_inputs(graph, name)
        check_input_format(graph, options.input_format)
        original, graph, conversion = _in_precision(graph, target, options)
    progress.stage("planning fusion")
    with timings.stage("plan_s"):
        plan = plan_fusion(graph, target)
    progress.stage(f"compiling {len(plan.regions)} kernels with PyPTO")
    kernels = yield Compiles(graph, tuple(plan.regions), target)
    alone, replaced = _matmuls_to_split(plan, kernels), ()
    if alone:  # their epilogues are fused again without them, as IREE splits a dispatch
        progress.stage(f"{len(alone)} matmul kernels failed with their epilogue: re-planning")
        with timings.stage("plan_s"):
            plan = plan_fusion(graph, target, alone)
        replaced = kernels
        kernels = yield Compiles(graph, tuple(plan.regions), target)
    plan, kernels, baseline = yield from _cut_until_shipped(graph, plan, kernels, target,
                                                            context, progress, timings)
    failed = {k.region_id: (_category(k), k.fallback_reason) for k in kernels if not k.compiled}
    with timings.stage("plan_s"):  # re-lowering without the fallen-back regions is planning
        shipped = without_regions(plan, graph, target, failed) if failed else plan
    on_910b = yield from _on_910b_platform(graph, plan, target, progress,
                                              options.compare_platform)
    values = _original_values(original, options, timings)
    precision_of = _kernel_precision(values, graph, plan, kernels, context.setup(target),
                                     context.options.jobs, progress, timings)
    platform = platform_of(target)
    message = ptom_pb2.CompiledModel(
        target=target_descriptor(target),
        provenance=provenance_message(__version__, raw, name, options),
        onnx_model=shipped.compiled_model.SerializeToString(),
        source_onnx_model=graph.model.SerializeToString(),
        input_names=list(graph.inputs), platform=platform_message(platform))
    if conversion is not None:
        message.precision.CopyFrom(precision_message(conversion, precision.beyond_fp16(
            graph.model, {n: t.dtype == onnx.TensorProto.FLOAT16 for n, t in graph.tensors.items()},
            values.values, values.names)))
    regions = {r.id: r for r in plan.regions}
    cuts = {c.region: c for c in plan.cuts}
    message.kernels.extend(kernel_message(regions[k.region_id], k, baseline, platform,
                                           on_910b.get(k.region_id),
                                           precision_of.get(k.region_id),
                                           cuts.get(k.region_id)) for k in kernels)
    message.unfused.extend(ptom_pb2.Unfused(node=u.node, op_type=u.op_type, category=u.category,
                                            reason=u.reason) for u in shipped.unfused)
    message.totals.CopyFrom(totals_message(shipped, kernels, baseline, target))
    message.verification.status = "skipped"
    return BuildResult(message, graph, shipped, kernels, replaced, original)


def _in_precision(graph: ImportedGraph, target: Target, options: BuildOptions):
    """(the graph in its own precision or None, the graph to compile, the conversion or None):
    a converting mode's graph is imported again, its casts folded and its shapes checked by
    running it (docs/precision.md)."""
    options.keep_dtype.check_against(graph.model)
    options.half_io.check_against(graph.model, options.precision_mode)
    if not precision.converts(options.precision_mode):
        return None, graph, None
    cube_fp32 = bool(target.cube_fp32.value) if target.cube_fp32 else False
    converted, conversion = precision.to_half(graph.model, options.precision_mode,
                                              options.keep_dtype, cube_fp32, options.half_io)
    half = import_model(converted, inputs=options.inputs, must_run=options.verify)
    return graph.model, replace(half, stats=graph.stats), conversion


def _blob_input_dtypes(options: BuildOptions) -> dict[str, np.dtype]:
    """The inputs the blob takes in another dtype than the model declares: float16 for those
    ``--input_fp16_nodes`` names under a converting mode. ``--inputs`` gives them so, as the
    blob's ``verify`` and ``run`` take them; only the checks against the original model cast
    them to its float32 (``runtime.in_input_types``)."""
    if not precision.converts(options.precision_mode):
        return {}
    return {name: np.dtype(np.float16) for name in options.half_io.inputs}


@dataclass(frozen=True)
class OriginalValues:
    """Every tensor's value when the original model (the imported graph before a precision
    mode converted it) runs on the verification's inputs (seed 0, and ``--inputs``), and its
    input and output names, in order."""

    values: Mapping[str, np.ndarray]
    names: tuple[Sequence[str], Sequence[str]]


def _original_values(original: onnx.ModelProto | None, options: BuildOptions,
                     timings: Timings) -> OriginalValues:
    if original is None:
        return OriginalValues({}, ((), ()))
    with timings.stage("kernels_s"):
        check_memory(original, "the original model", {t.name for t in original.graph.initializer})
        given = in_input_types(original, options.inputs)
        values = every_value(original, generate_inputs(original, 0, given))
    return OriginalValues(values, ([v.name for v in graph_inputs(original)],
                                   [o.name for o in original.graph.output]))


def _kernel_precision(original: OriginalValues, graph: ImportedGraph, plan: FusionPlan,
                      kernels: Sequence[Kernel], setup: Setup, jobs: int,
                      progress, timings: Timings) -> dict[str, KernelPrecision]:
    """A converted build's kernels against the original model, on its values:
    ``pypto_kernels/precision_check.py``. Empty for a graph compiled in its own types."""
    if not original.values or not kernels:
        return {}
    progress.stage("running the kernels on the original model's values (precision check)")
    with timings.stage("kernels_s"):
        return check_kernels(kernels, {r.id: r for r in plan.regions}, graph, original.values,
                             original.names, setup, jobs)


def _cut_until_shipped(graph: ImportedGraph, plan: FusionPlan, kernels: Sequence[Kernel],
                       target: Target, context: BuildContext, progress: Progress,
                       timings: Timings
                       ) -> Generator[Compiles, tuple, tuple[FusionPlan, tuple[Kernel, ...],
                                                             Baseline]]:
    """Split, never drop (docs/regions.md): a region whose kernel cannot ship (it failed, or
    the cost model finds it slower than its ops unfused) is cut in two and its parts are
    compiled, again until every part ships or is one op. Returns the plan with every region
    planned and its cuts, every kernel (a slower one marked fallen back) and the baseline of
    every compiled one."""
    batch, every, judged = tuple(kernels), (), None
    while True:
        compiled = {k.region_id for k in batch if k.compiled}
        with timings.stage("baseline_s"):
            baseline = unfused_baseline(graph, [r for r in plan.regions if r.id in compiled],
                                        target, context, progress)
            baseline = _measured_where_the_estimate_cannot_judge(
                graph, plan, batch, baseline, target, context, progress)
        judged = baseline if judged is None else judged.joined(baseline)
        batch = _slower_fallen_back(batch, plan, baseline, target)
        every += batch
        cannot_ship = {k.region_id: k.fallback_reason for k in batch if not k.compiled}
        cut_before = len(plan.cuts)
        with timings.stage("plan_s"):
            plan, parts = with_parts(plan, graph, target, cannot_ship)
        if not parts:
            return plan, every, judged
        progress.stage(f"{len(plan.cuts) - cut_before} regions that could not ship cut in two: "
                       f"compiling {len(parts)} parts with PyPTO")
        batch = yield Compiles(graph, tuple(parts), target)


def moves_more_than_its_ops(kernel: Kernel, region: Region) -> bool:
    """Whether a compiled kernel moves more GM bytes (as measured in its program) than its ops
    would unfused, each reading its inputs and writing its outputs once: a convolution's
    staging, a tile's padding. Such a kernel ships only if PyPTO measures it faster than its
    ops (docs/baseline.md, "When the estimate does not decide")."""
    return kernel.compiled and kernel.gm_bytes > region.unfused.gm_bytes


def _estimate_cannot_judge(kernel: Kernel, region: Region, baseline: Baseline,
                           target: Target) -> bool:
    """Whether an estimated baseline is not evidence enough to judge a compiled kernel: it
    moves more bytes than its ops, or it holds a cube op (whose line errs by about half,
    docs/baseline.md) and the estimate would drop it."""
    if not kernel.compiled:
        return False
    return moves_more_than_its_ops(kernel, region) or (
        any(op_class(op.op_type) == CUBE for op in region.original)
        and bool(slower_than_unfused([kernel], {region.id: region}, baseline, target)))


def _measured_where_the_estimate_cannot_judge(
        graph: ImportedGraph, plan: FusionPlan, kernels: Sequence[Kernel], baseline: Baseline,
        target: Target, context: BuildContext, progress: Progress) -> Baseline:
    """``baseline`` with the ops of each kernel the estimate cannot judge
    (``_estimate_cannot_judge``) measured with PyPTO, through the per-op cache."""
    regions = {r.id: r for r in plan.regions}
    unsure = [regions[k.region_id] for k in kernels if k.region_id in regions
              and _estimate_cannot_judge(k, regions[k.region_id], baseline, target)]
    if baseline.basis == MEASURED or not unsure:
        return baseline
    progress.stage(f"measuring the unfused baseline of the kernels an estimate cannot judge "
                   f"({len(unsure)})")
    measured = unfused_costs(graph, unsure, context.setup(target), jobs=context.options.jobs)
    timed = {region_id: us for region_id, us in measured.items() if us is not None}
    return baseline.joined(Baseline(timed, baseline.basis, frozenset(timed),
                                    frozenset(measured) - frozenset(timed)))


def _slower_fallen_back(kernels: Sequence[Kernel], plan: FusionPlan, baseline: Baseline,
                        target: Target) -> tuple[Kernel, ...]:
    """The cost model as arbiter: a kernel slower than its ops unfused is dropped (its ops ship
    unfused, or its region is cut), and so is one that moves more bytes than its ops whose ops
    could not be measured alone."""
    slower = slower_than_unfused(kernels, {r.id: r for r in plan.regions}, baseline, target)
    return tuple(replace(k, compiled=False, fallback_reason=slower[k.region_id],
                         fallback_kind=FailureKind.SLOWER_FUSED, artifacts={})
                 if k.region_id in slower else k for k in kernels)


def _on_910b_platform(graph, plan: FusionPlan, target: Target, progress, compare: bool):
    """With ``compare`` (--compare-platform): the tile each shipped region's search picks
    under PyPTO's 910B platform (as every target compiled before it had its own), by region id;
    the same candidates and UB plan, another platform (docs/platform.md). Empty without it."""
    if not compare or platform_of(target).native:
        return {}
    progress.stage("searching the same tiles under PyPTO's 910B platform (--compare-platform)")
    kernels = yield Compiles(graph, tuple(plan.regions),
                             replace(target, pypto_platform=STOCK_PLATFORM))
    return {k.region_id: k.tuned_tile for k in kernels if k.compiled and k.tuned_tile}


def _matmuls_to_split(plan: FusionPlan, kernels: Sequence[Kernel]) -> dict[str, tuple[str, str]]:
    """Node id -> (category, reason) of each matmul whose region's kernel did not compile (a
    tile that overflows UB, a PyPTO failure): it becomes a kernel of its own."""
    failed = {k.region_id: k for k in kernels if not k.compiled}
    split = {}
    for region in plan.regions:
        if region.id in failed:
            kernel = failed[region.id]
            for op in region.original:  # a node is known by its first output (classify)
                if kind_of(op.op_type, op.params) == MATMUL:
                    split[op.outputs[0]] = (_category(kernel), "its kernel with its epilogue "
                                                               f"failed: {kernel.fallback_reason}")
    return split


def slower_than_unfused(kernels: Sequence[Kernel], regions: Mapping[str, Region],
                        baseline: "Baseline", target: Target) -> dict[str, str]:
    """Region id -> why, for each compiled kernel that PyPTO's cost model finds slower than its
    ops unfused (``baseline.slower_fused``; IREE and TVM fuse by rule, here the build's measured
    or estimated baseline decides)."""
    slower = {}
    for kernel in kernels:
        region = regions[kernel.region_id]
        unfused = baseline.of(kernel.region_id)
        fused = kernel.tuned_tile.aicore_us if kernel.compiled else None
        why = None if unfused is None or fused is None else slower_fused(
            fused, unfused, region.unfused.kernels, target.launch_overhead_us.value)
        if why:
            slower[kernel.region_id] = f"{why} ({baseline.basis_of(kernel.region_id)})"
        elif kernel.region_id in baseline.untimed and moves_more_than_its_ops(kernel, region):
            slower[kernel.region_id] = heavier_and_untimed(kernel.gm_bytes,
                                                           region.unfused.gm_bytes)
    return slower


@dataclass(frozen=True)
class Baseline:
    """The unfused figure of each shipped region (None: not measurable), and how it was had."""

    costs_us: Mapping[str, float | None]
    basis: str  # MEASURED or ESTIMATED: the build's
    # Regions measured in a build that estimates: their kernels the estimate cannot judge
    # (``_estimate_cannot_judge``)
    measured: frozenset[str] = frozenset()
    # and those whose ops PyPTO could not time alone (their estimate stands, if any)
    untimed: frozenset[str] = frozenset()

    def of(self, region_id: str) -> float | None:
        return self.costs_us.get(region_id)

    def basis_of(self, region_id: str) -> str:
        return MEASURED if region_id in self.measured else self.basis

    def joined(self, later: Baseline) -> Baseline:
        """This baseline and a later round's, of other regions (a cut's parts)."""
        return Baseline({**self.costs_us, **later.costs_us}, later.basis,
                        self.measured | later.measured, self.untimed | later.untimed)


def unfused_baseline(graph: ImportedGraph, regions: Sequence[Region], target: Target,
                     context: BuildContext, progress: Progress) -> Baseline:
    """Measured with PyPTO under --measure-baseline; otherwise the shipped estimate, which costs
    no compile and does not depend on what a cache holds (docs/baseline.md)."""
    if not context.options.measure_baseline:
        progress.stage("estimating the unfused baseline")
        return Baseline(estimated_unfused_costs(graph, regions, target), ESTIMATED)
    progress.stage("measuring the unfused baseline")
    return Baseline(unfused_costs(graph, regions, context.setup(target),
                                  jobs=context.options.jobs), MEASURED)


def _require_static_inputs(graph: ImportedGraph, name: str) -> None:
    """An offline model has static shapes: every input's shape must be known (as ATC asks for
    --input_shape on a dynamic model). The error names the input's symbolic dims."""
    declared = {value.name: value for value in graph.model.graph.input}
    for input_name in graph.inputs:
        if graph.tensors[input_name].shape is None:
            raise symbolic_input_error(declared[input_name], name)


def _category(kernel: Kernel) -> str:
    """Why its ops ship unfused: the kernel's fallback kind (a PyPTO compile that failed, a
    failed check, a time-out, ...; ``jobs.protocol.FailureKind``)."""
    if kernel.fallback_kind is FailureKind.SLOWER_FUSED:
        return DOES_NOT_PAY  # the cost model's verdict, as for a region planned unfused
    return kernel.fallback_kind.value if kernel.fallback_kind else FAILED_CHECK
