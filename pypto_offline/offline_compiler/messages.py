"""The blob's messages (offline_compiler/ptom.proto) made from a build's records: the target,
the provenance, each kernel with its tiles and figures, the totals. One place for the mapping
from the compiler's records to the schema; ``build.build_steps`` assembles them."""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Sequence

import numpy as np
import onnx

from pypto_offline.fusion import Cut, FusionPlan, Region
from pypto_offline.fusion.cost import cube_handoff_bytes, cube_reread_bytes
from pypto_offline.fusion.records import RegionOp
from pypto_offline.importer import precision
from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.pypto_kernels import Kernel
from pypto_offline.pypto_kernels.baseline import MEASURED
from pypto_offline.pypto_kernels.platform import ISA, Platform
from pypto_offline.pypto_kernels.precision_check import KernelPrecision
from pypto_offline.pypto_kernels.records import TileResult
from pypto_offline.pypto_kernels.versions import PYPTO_VERSION
from pypto_offline.runtime import finite
from pypto_offline.targets import Target

if TYPE_CHECKING:  # build imports this module
    from pypto_offline.offline_compiler.build import Baseline
    from pypto_offline.offline_compiler.options import BuildOptions


def precision_message(conversion: precision.Conversion,
                      beyond: Sequence[precision.Clamped]) -> ptom_pb2.Precision:
    def clamped(c: precision.Clamped) -> ptom_pb2.Precision.Clamped:
        return ptom_pb2.Precision.Clamped(tensor=c.tensor, node=c.node, values=c.values,
                                          largest=c.largest)
    return ptom_pb2.Precision(
        mode=conversion.mode,
        kept=[ptom_pb2.Precision.Kept(node=k.node, op_type=k.op_type, reason=k.reason)
              for k in conversion.kept],
        clamped=[clamped(c) for c in conversion.clamped], beyond=[clamped(c) for c in beyond])


def target_descriptor(target: Target) -> ptom_pb2.TargetDescriptor:
    figures = [ptom_pb2.Figure(name=name, value=json.dumps(f.value), source=f.source,
                               estimate=f.estimate) for name, f in target.figures().items()]
    return ptom_pb2.TargetDescriptor(name=target.name, figures=figures, notes=target.notes)


def provenance_message(tool_version: str, raw: bytes, name: str, options: BuildOptions):
    import onnxruntime

    return ptom_pb2.Provenance(
        tool_version=tool_version, pypto_version=PYPTO_VERSION, onnx_version=onnx.__version__,
        onnxruntime_version=onnxruntime.__version__, model_name=name,
        model_sha256=hashlib.sha256(raw).hexdigest(), options=options.provenance())


def op_message(op: RegionOp) -> ptom_pb2.Op:
    """A program op as the blob records it: canonical parameters as JSON, keys sorted."""
    params = {k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v)
              for k, v in op.params.items()}
    return ptom_pb2.Op(op_type=op.op_type, inputs=list(op.inputs), outputs=list(op.outputs),
                       params_json=json.dumps(params, sort_keys=True, default=list))


def region_signature(region: Region) -> str:
    text = json.dumps({"ops": [op_message(op).SerializeToString(deterministic=True).hex()
                               for op in region.simplified],
                       "types": sorted((k, list(v[0]), v[1]) for k, v in
                                       region.tensor_types.items())})
    return hashlib.sha256(text.encode()).hexdigest()


def tile_choice(tile) -> ptom_pb2.TileChoice | None:
    """A figure PyPTO did not give stays absent (docs/figures.md): None is not 0."""
    if tile is None:
        return None
    return ptom_pb2.TileChoice(budget_bytes=tile.budget_bytes, tasks=tile.tasks,
                               swapped_transposes=tile.swapped_transposes,
                               flat_rows=tile.flat_rows, vec_merge=tile.vec_merge,
                               error=tile.error or "", **_present(
                                   aicore_us=tile.aicore_us, total_us=tile.total_us,
                                   ub_bytes=tile.ub_bytes))


def _present(**figures) -> dict:
    """The figures that were measured, for the `optional` fields of a message."""
    return {name: value for name, value in figures.items() if value is not None}


def platform_message(platform: Platform) -> ptom_pb2.Platform:
    """The platform the kernels compiled under, as the blob records it (docs/platform.md)."""
    figures = [ptom_pb2.Figure(name=key, value=str(f.value), source=f.source,
                               estimate=f.estimate) for key, f in platform.figures]
    return ptom_pb2.Platform(chip=platform.chip, native=platform.native, isa=ISA,
                             file=platform.file_name, digest=platform.digest,
                             description=platform.description(), figures=figures,
                             simulator=platform.simulator)


def kernel_message(region: Region, kernel: Kernel, baseline: Baseline, platform: Platform,
                    on_910b: TileResult | None, precision_of: KernelPrecision | None = None,
                    cut: Cut | None = None) -> ptom_pb2.Kernel:
    message = ptom_pb2.Kernel(
        id=region.id, region_signature=region_signature(region), nodes=list(region.nodes),
        inputs=list(region.inputs), outputs=list(region.outputs),
        original=[op_message(op) for op in region.original],
        simplified=[op_message(op) for op in region.simplified],
        rules_applied=list(region.rules_applied), compiled=kernel.compiled,
        fallback_reason=kernel.fallback_reason or "", source=kernel.source,
        fallback_category=kernel.fallback_kind.value if kernel.fallback_kind else "",
        gm_bytes_unfused=region.unfused.gm_bytes, gm_bytes_lower_bound=region.fused.gm_bytes,
        gm_bytes_read=kernel.gm_bytes_read, gm_bytes_written=kernel.gm_bytes_written,
        gm_bytes_handoff=cube_handoff_bytes(region.simplified, region.tensor_types),
        gm_bytes_cube_rereads=cube_reread_bytes(region.simplified, region.tensor_types),
        kernels_unfused=region.unfused.kernels, est_time_us_unfused=region.unfused.time_us,
        est_time_us_fused=region.fused.time_us, functional_ok=kernel.functional_ok,
        platform=platform.description(), **_present(max_abs_diff=kernel.max_abs_diff),
        **_unfused_figure(baseline.of(region.id) if kernel.compiled else None,
                          baseline.basis_of(region.id)),
        verdicts=[ptom_pb2.PassVerdict(pass_name=p, result=r) for p, r in kernel.verdicts],
        artifacts=[ptom_pb2.Artifact(name=n, data=d, sha256=hashlib.sha256(d).hexdigest())
                   for n, d in sorted(kernel.artifacts.items())],
        candidates=[tile_choice(tile) for tile in kernel.candidates])
    for field_name, tile in (("default_tile", kernel.default_tile),
                             ("tuned_tile", kernel.tuned_tile),
                             ("platform_910b_tile", on_910b if kernel.compiled else None)):
        if tile is not None:
            getattr(message, field_name).CopyFrom(tile_choice(tile))
    if precision_of is not None:
        message.precision.CopyFrom(ptom_pb2.KernelPrecision(
            why_not=precision_of.why_not, **{name: finite(value) for name, value in
                                             (precision_of.metrics or {}).items()}))
    if cut is not None:
        first, second = cut.parts
        message.cut.CopyFrom(ptom_pb2.Cut(first=first, second=second, tensors=cut.tensors,
                                          bytes_moved=cut.bytes_moved))
    message.sha256 = hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()
    return message


def _unfused_figure(cost_us: float | None, basis: str) -> dict:
    """A shipped kernel's unfused baseline and its basis, both absent when not measurable."""
    return {} if cost_us is None else {"cost_us_unfused": round(cost_us, 3),
                                       "cost_us_unfused_basis": basis}


def totals_message(plan: FusionPlan, kernels: Sequence[Kernel], baseline: Baseline, target: Target
            ) -> ptom_pb2.Totals:
    from pypto_offline.fusion.cost import time_us

    t = plan.totals
    shipped = {r.id for r in plan.regions}
    compiled = [k for k in kernels if k.compiled and k.region_id in shipped]
    lower_bounds = {r.id: r.fused.gm_bytes for r in plan.regions}
    measured_after = t.gm_bytes_after + sum(k.gm_bytes - lower_bounds[k.region_id]
                                            for k in compiled)
    # fused against unfused over the same kernels: those whose baseline compiled too; with none,
    # both figures stay absent (not measured), never a sum of nothing shown as 0
    paired = [k for k in compiled
              if baseline.of(k.region_id) is not None and k.tuned_tile.aicore_us is not None]
    pairs = [(k.tuned_tile.aicore_us, baseline.of(k.region_id)) for k in paired]
    # measured only where every figure summed is (a build that estimates measures some)
    basis = MEASURED if all(baseline.basis_of(k.region_id) == MEASURED for k in paired) \
        else baseline.basis
    costs = {"cost_us_fused": round(sum(f for f, _ in pairs), 3),
             "cost_us_unfused": round(sum(u for _, u in pairs), 3),
             "cost_us_unfused_basis": basis} if pairs else {}
    return ptom_pb2.Totals(
        nodes_before=t.nodes_before, nodes_after=t.nodes_after, kernels_before=t.kernels_before,
        kernels_after=t.kernels_after, fused_kernels=t.fused_kernels, ops_fused=t.ops_fused,
        gm_bytes_before=t.gm_bytes_before, gm_bytes_after=measured_after,
        gm_bytes_lower_bound=t.gm_bytes_lower_bound, est_time_us_before=t.est_time_us_before,
        est_time_us_after=time_us(t.kernels_after, measured_after, target),
        pypto_compiled=len(compiled), pypto_fell_back=len(kernels) - len(compiled),
        kernels_cost_compared=len(pairs), **costs)
