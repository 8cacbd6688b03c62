"""The figures of a compiled model, as ``--json``, ``inspect``, ``verify`` and the report show them.

One function over the blob's message, so every place that shows a figure shows the same one;
``verify`` adds what it derived again of the kernel sources, which no blob holds.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

import onnx

from pypto_offline.fusion.split import part_id
from pypto_offline.importer.precision import MUST_KEEP
from pypto_offline.offline_compiler import gears as gear_table
from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.offline_compiler.source_check import SourceCheck
from pypto_offline.pypto_kernels.baseline import ESTIMATED
from pypto_offline.pypto_kernels.records import legacy_fallback_kind
from pypto_offline.registry.ops import INTEGER_CONTRACTIONS, is_op

NOT_MEASURED = "not measured"
# The version of every JSON output's keys (``summary.schema.json``, in this folder): a change of
# a key or of its meaning bumps it (docs/outputs.md, "JSON output").
# 8: each kernel's dtypes, int8 outputs' steps, metrics against a quantised blob's float
# original; 7: every gear's kernels and verdicts; 6: gears; 5: a kernel's cut; 4: precision mode and
# verification metrics; 3: the platform the kernels compiled under; 2: verification's checks run
# now apart from the build's record
SCHEMA_VERSION = 8


def measured(message, field: str):
    """The figure, or None when the blob says it was not measured (an absent `optional` field):
    a missing figure is shown as missing, never as 0 (docs/figures.md)."""
    return getattr(message, field) if message.HasField(field) else None


def shown(value, spec: str = ".2f", unit: str = "") -> str:
    """A figure as text: "not measured" for None, "inf" for an infinite one (the verification
    stores an infinite difference as the largest double, api._finite), else ``spec``."""
    if value is None:
        return NOT_MEASURED
    if math.isnan(value):
        return "nan"
    if not math.isfinite(value) or abs(value) >= sys.float_info.max:
        return "inf" if value > 0 else "-inf"
    return f"{value:{spec}}{unit}"


def tile_us(kernel: ptom_pb2.Kernel, tile: str) -> float | None:
    """A kernel's AICore time at its tuned or default tile, None when there is none."""
    return measured(getattr(kernel, tile), "aicore_us") if kernel.HasField(tile) else None


def kernels_below_lower_bound(message: ptom_pb2.CompiledModel) -> list[str]:
    """Compiled kernels whose GM bytes counted from their program are fewer than their lower
    bound (outputs once, the input elements they depend on once): impossible unless a count is
    wrong, so the benches check that this is empty (docs/figures.md)."""
    return [k.id for k in message.kernels if k.compiled
            and k.gm_bytes_read + k.gm_bytes_written < k.gm_bytes_lower_bound]


def summarise(message: ptom_pb2.CompiledModel,
              sources: SourceCheck | Mapping[int, SourceCheck] | None = None,
              gear: int | None = None) -> dict:
    """``sources``: the kernel sources as ``verify`` derived them again, per gear (one
    SourceCheck: the first gear's; None: not derived). A blob of gears: the figures of the
    graph (nodes, kernels, bytes, times) are the first gear's, each gear's in ``gears``; what the
    build did is every gear's (docs/gears.md, "How a gear's verdict reaches the build's"): the
    kernels of every gear (each with its ``gear``), their counts, and the verification of the
    worst gear, so that a build of gears is as strict as the strictest of its gears alone.
    ``gear``: that gear alone, every figure its own (``inspect --gear``)."""
    per_gear = _gear_records(message, _by_gear(sources))
    if gear is not None:
        per_gear = [per_gear[gear]]
    m = gear_table.build_of(message, per_gear[0].index)  # the figures' gear: its own record
    t = m.totals
    kernels = [kernel for g in per_gear for kernel in g.kernels]
    checked = [k for k in kernels if k.verdicts]
    dtypes = tensor_dtypes(message.source_onnx_model)
    return {
        "schema_version": SCHEMA_VERSION,
        "model": message.provenance.model_name,
        "model_sha256": message.provenance.model_sha256,
        "target": message.target.name, "platform": platform_summary(message),
        "precision_mode": m.precision.mode if m.HasField("precision") else MUST_KEEP,
        "precision": precision_summary(m),
        "platform_comparison": platform_comparison(m),
        "nodes_before": t.nodes_before, "nodes_after": t.nodes_after,
        "kernels_before": t.kernels_before, "kernels_after": t.kernels_after,
        "fused_kernels": t.fused_kernels, "ops_fused": t.ops_fused,
        "gm_bytes_before": t.gm_bytes_before, "gm_bytes_after": t.gm_bytes_after,
        "gm_bytes_lower_bound": t.gm_bytes_lower_bound,
        "est_time_us_before": round(t.est_time_us_before, 3),
        "est_time_us_after": round(t.est_time_us_after, 3),
        "pypto": {"compiled": sum(g.totals.pypto_compiled for g in per_gear),
                  "fell_back": sum(g.totals.pypto_fell_back for g in per_gear),
                  "cost_us_fused": measured(t, "cost_us_fused"),
                  "cost_us_unfused": measured(t, "cost_us_unfused"),
                  "cost_us_unfused_basis": t.cost_us_unfused_basis or None,
                  "kernels_cost_compared": t.kernels_cost_compared},
        "verification": worst_verification(per_gear),
        # what the blob says its build checked of each kernel (PyPTO's pass-verify against
        # onnxruntime): its record, not run again by anything that reads the blob
        "build_record": {"kernels_checked": len(checked),
                         "kernels_passed": sum(k.functional_ok for k in checked)},
        "kernels": [{**kernel_summary(k, dtypes), "gear": g.index}
                    for g in per_gear for k in g.kernels],
        "gears": [_gear_summary(g) for g in per_gear],
    }


@dataclass(frozen=True)
class _GearRecord:
    """One gear as the summary reads it: its own record (figures, verification), its kernels
    with those stored in an earlier gear resolved, and its verification's dict."""

    index: int
    shapes: dict
    totals: ptom_pb2.Totals
    kernels: list
    referenced: int
    verification: dict


def _by_gear(sources) -> Mapping[int, SourceCheck]:
    if sources is None:
        return {}
    return {0: sources} if isinstance(sources, SourceCheck) else sources


def _gear_records(message: ptom_pb2.CompiledModel, sources: Mapping[int, SourceCheck]
                  ) -> list[_GearRecord]:
    records = []
    for index, shapes in enumerate(gear_table.shapes_of(message)):
        own = gear_table.build_of(message, index)
        kernels = gear_table.gear_kernels(message, index)
        records.append(_GearRecord(
            index, shapes, own.totals, kernels,
            sum(k.HasField("stored_in_gear") for k in own.kernels),
            verification(own, sources.get(index), kernels)))
    return records


def _gear_summary(gear: _GearRecord) -> dict:
    t = gear.totals
    return {"index": gear.index, "inputs": {name: list(dims) for name, dims in gear.shapes.items()},
            "kernels_after": t.kernels_after, "fused_kernels": t.fused_kernels,
            "gm_bytes_after": t.gm_bytes_after,
            "est_time_us_after": round(t.est_time_us_after, 3),
            "cost_us_fused": measured(t, "cost_us_fused"),
            "kernels_stored": len(gear.kernels) - gear.referenced,
            "kernels_referenced": gear.referenced,
            "compiled": t.pypto_compiled, "fell_back": t.pypto_fell_back,
            "verification": gear.verification}


# The order of verdicts, worst first: a build of gears has its worst gear's.
STATUS_ORDER = ("failed", "skipped", "passed")


def worst_verification(gears: Sequence[_GearRecord]) -> dict:
    """The verification of the gear whose status is worst (the first such gear), with the
    gear named and every failed gear listed: the build's verdict (docs/gears.md)."""
    worst = min(gears, key=lambda g: STATUS_ORDER.index(g.verification["status"]))
    failed = [g.index for g in gears if g.verification["status"] == "failed"]
    return {**worst.verification, "gear": worst.index, "failed_gears": failed}


def verification_failed(summary: dict) -> bool:
    """Whether the check failed, of any gear."""
    return summary["verification"]["status"] == "failed" or any(
        gear["verification"]["status"] == "failed" for gear in summary["gears"])


def precision_summary(message: ptom_pb2.CompiledModel) -> dict | None:
    """A converting mode's record (docs/precision.md): the ops kept in fp32 and why, the weights
    saturated to fp16's range; None for a graph compiled in the types it came with."""
    if not message.HasField("precision"):
        return None
    p = message.precision
    return {"kept_fp32": [{"node": k.node, "op_type": k.op_type, "reason": k.reason}
                          for k in p.kept],
            "clamped": [_beyond_range(c) for c in p.clamped],
            "beyond_fp16": [_beyond_range(c) for c in p.beyond]}


def _beyond_range(c: ptom_pb2.Precision.Clamped) -> dict:
    return {"tensor": c.tensor, "node": c.node, "values": c.values, "largest": c.largest}


def precision_line(summary: dict) -> str:
    """The precision mode in a few words, as the CLI and the report's headline say it."""
    mode, record = summary["precision_mode"], summary["precision"]
    if record is None:
        return f"{mode} (the graph's own types)"
    kept, clamped = len(record["kept_fp32"]), len(record["clamped"])
    beyond = len(record["beyond_fp16"])
    return (f"{mode}: float ops in fp16, {kept} kept in fp32"
            + (f", {clamped} weights saturated to fp16's range" if clamped else "")
            + (f", {beyond} fp16 tensors beyond its range on the verification's inputs"
               if beyond else ""))


def platform_summary(message: ptom_pb2.CompiledModel) -> dict | None:
    """What the kernels compiled under (docs/platform.md); None for a blob written before
    blobs recorded it (all compiled under PyPTO 0.2.0's 910B platform)."""
    if not message.HasField("platform"):
        return None
    p = message.platform
    return {"chip": p.chip, "native": p.native, "isa": p.isa, "file": p.file, "digest": p.digest,
            "description": p.description,
            "figures": {f.name: {"value": int(f.value), "source": f.source,
                                 "estimate": f.estimate} for f in p.figures},
            "simulator": list(p.simulator)}


def _tile_shape(tile: ptom_pb2.TileChoice) -> dict:
    return {"budget_bytes": tile.budget_bytes, "swapped_transposes": tile.swapped_transposes,
            "flat_rows": tile.flat_rows}


def platform_comparison(message: ptom_pb2.CompiledModel) -> dict | None:
    """With --compare-platform: of the shipped kernels searched again under PyPTO's 910B
    platform, how many shipped another tile here, and PyPTO's summed times here and there."""
    pairs = [(k.tuned_tile, k.platform_910b_tile) for k in message.kernels
             if k.compiled and k.HasField("platform_910b_tile")]
    if not pairs:
        return None
    return {"kernels_compared": len(pairs),
            "tiles_changed": sum(_tile_shape(own) != _tile_shape(stock) or
                                 own.vec_merge != stock.vec_merge for own, stock in pairs),
            "pypto_us": round(sum(measured(own, "aicore_us") or 0 for own, _ in pairs), 3),
            "pypto_us_910b": round(sum(measured(s, "aicore_us") or 0 for _, s in pairs), 3)}


def verification(build: ptom_pb2.CompiledModel, sources: SourceCheck | None,
                 kernels: Sequence[ptom_pb2.Kernel]) -> dict:
    """The checks of one gear's compiled model (``build``: its own record; ``kernels``: its
    kernels resolved): onnxruntime's (as recorded: by the build, or by the ``verify`` that ran it
    now) and the kernel sources derived again, when they were (``kernel_sources``, None
    otherwise); ``status`` is failed if either failed."""
    record = build.verification
    onnxruntime = record.status or "skipped"
    differ = sources is not None and not sources.passed or bool(record.kernels_beyond)
    return {
        "status": "failed" if differ else onnxruntime,
        "onnxruntime": onnxruntime,
        "max_abs_diff": max((o.max_abs_diff for o in record.outputs), default=None),
        "reference": record.reference or None,
        "metrics": {o.name: {**output_metrics(o), "passed": o.passed, **_int8_steps(o)}
                    for o in record.outputs},
        # verify --onnx naming a quantised blob's float original: reported, never failing
        "float_original": {o.name: output_metrics(o) for o in record.float_original} or None,
        "thresholds": ({"min_cosine": record.thresholds.min_cosine,
                        **_recorded(record.thresholds, "max_rel_distance")}
                       if record.HasField("thresholds") else None),
        # a failed output first: the cosine alone does not say which failed
        "worst_output": min(record.outputs, key=lambda o: (o.passed, o.cosine)).name
        if record.HasField("thresholds") and record.outputs else None,
        "kernels_beyond_thresholds": list(record.kernels_beyond),
        "worst_kernel": worst_kernel(kernels, record.kernels_beyond),
        "saturated_weights": saturated_weights(build, kernels),
        "kernel_sources": None if sources is None else {
            "compiled": sources.compiled, "matching": sources.matching,
            "differing": [{"id": m.kernel, "reason": m.reason} for m in sources.mismatches],
            "fell_back": list(sources.fell_back)}}


def output_metrics(check: ptom_pb2.OutputCheck) -> dict:
    """An output's msaccucmp metrics against what it was compared with (docs/precision.md)."""
    return {"cosine": check.cosine, "max_abs": check.max_abs_diff, "max_rel": check.max_rel_diff,
            "rms": check.rms, **_recorded(check, "rel_distance")}


def _int8_steps(check: ptom_pb2.OutputCheck) -> dict:
    """A dequantised int8 output's differences in steps of its scale (docs/int8.md)."""
    if not check.HasField("int8_steps"):
        return {}
    steps = check.int8_steps
    return {"int8_steps": {"scale": steps.scale, "off_by_one": steps.off_by_one,
                           "max_steps": steps.max_steps, "elements": steps.elements}}


def kernel_precision(kernel: ptom_pb2.Kernel) -> dict | None:
    """A converted build's kernel on the original model's values (docs/precision.md): its
    least similar output's metrics, or why it was not measured; None when not checked."""
    if not kernel.HasField("precision"):
        return None
    p = kernel.precision
    if p.why_not:
        return {"why_not": p.why_not}
    return {"cosine": p.cosine, "max_abs": p.max_abs, "max_rel": p.max_rel, "rms": p.rms,
            **_recorded(p, "rel_distance")}


def _recorded(message, field: str) -> dict:
    """``{field: value}`` where the message has it: a blob checked before the relative
    distance was recorded has none, which is not a distance of 0."""
    return {field: getattr(message, field)} if message.HasField(field) else {}


def worst_kernel(kernels: Sequence[ptom_pb2.Kernel], beyond: Sequence[str] = ()) -> str | None:
    """The measured kernel least similar to the original model: where a converted build's
    error comes from first. One beyond the thresholds (``beyond``) first: a kernel that scales
    its outputs wrong keeps a cosine of 1."""
    measured = [k for k in kernels if k.HasField("precision") and not k.precision.why_not]
    return min(measured, key=lambda k: (k.id not in beyond, k.precision.cosine)).id \
        if measured else None


def saturated_weights(build: ptom_pb2.CompiledModel, kernels: Sequence[ptom_pb2.Kernel]
                      ) -> list[dict]:
    """A converted build whose check failed: the weights its conversion saturated to fp16's
    range (``precision.clamped``), each with the kernel that reads it (None: its reader runs
    unfused), what a failure the cosine cannot see (a scale) most likely comes from; none for
    a build that passed (docs/precision.md)."""
    record = build.verification
    if record.status != "failed" and not record.kernels_beyond:
        return []
    reading: dict[str, str] = {}
    for kernel in kernels:
        for name in kernel.inputs:
            reading.setdefault(name, kernel.id)
    return [{**_beyond_range(c), "kernel": reading.get(c.tensor)}
            for c in build.precision.clamped]


def fallback_category(kernel: ptom_pb2.Kernel) -> str:
    """Why a kernel that fell back did: the category its build recorded, or for a blob written
    before categories were recorded, the one its reason's first words name ("other": none)."""
    if kernel.fallback_category:
        return kernel.fallback_category
    legacy = legacy_fallback_kind(kernel.fallback_reason)
    return legacy.value if legacy else "other"


def kernel_summary(kernel: ptom_pb2.Kernel, dtypes: Mapping[str, str] | None = None) -> dict:
    """One planned region's kernel: compiled, or fallen back with its category and reason;
    ``dtypes``: every tensor's (``tensor_dtypes``), for its ``dtypes``."""
    tile = kernel.tuned_tile if kernel.HasField("tuned_tile") else None
    on_910b = kernel.platform_910b_tile if kernel.HasField("platform_910b_tile") else None
    return {"id": kernel.id, "ops": [op.op_type for op in kernel.original],
            "status": "compiled" if kernel.compiled else "fell_back",
            "fallback_category": None if kernel.compiled else fallback_category(kernel),
            "fallback_reason": None if kernel.compiled else kernel.fallback_reason,
            "tile": None if tile is None else _tile_shape(tile),
            "tuned_us": tile_us(kernel, "tuned_tile"),
            "tile_910b": None if on_910b is None else {
                **_tile_shape(on_910b), "aicore_us": measured(on_910b, "aicore_us")},
            "default_us": tile_us(kernel, "default_tile"),
            "gm_bytes": kernel.gm_bytes_read + kernel.gm_bytes_written,
            "gm_bytes_lower_bound": kernel.gm_bytes_lower_bound,
            "gm_bytes_handoff": kernel.gm_bytes_handoff,
            "gm_bytes_cube_rereads": kernel.gm_bytes_cube_rereads,
            "precision": kernel_precision(kernel), "cut": cut_summary(kernel),
            "dtypes": kernel_dtypes(kernel, dtypes or {})}




def kernel_dtypes(kernel: ptom_pb2.Kernel, dtypes: Mapping[str, str]) -> dict:
    """The element types of a kernel's inputs and outputs, in order (as the imported graph
    declares them: "unknown" where it does not), and the accumulator of its integer matmul or
    convolution ("int32"; None for a kernel without one)."""
    accumulators = {dtypes.get(op.outputs[0], "unknown") for op in kernel.original
                    if is_op(op, INTEGER_CONTRACTIONS) and op.outputs}
    return {"in": [dtypes.get(name, "unknown") for name in kernel.inputs],
            "out": [dtypes.get(name, "unknown") for name in kernel.outputs],
            "accumulate": ", ".join(sorted(accumulators)) or None}


def tensor_dtypes(imported: bytes) -> dict[str, str]:
    """Every named tensor's element type in the blob's imported graph (``source_onnx_model``:
    the importer wrote a value_info for each), numpy's names. A gear's tensors have the first
    gear's types: gears differ in shapes only."""
    from pypto_offline.report.tensors import tensor_types  # the report's one reading of it

    return {name: t.dtype for name, t in tensor_types(onnx.load_from_string(imported)).items()}


def cut_parts(kernel: ptom_pb2.Kernel) -> list[tuple[str, list[str]]]:
    """Each part of a cut region: the id its kernel takes if it pays (``fusion.split.part_id``)
    and its node ids; none for a region not cut."""
    if not kernel.HasField("cut"):
        return []
    return [(part_id(kernel.id, index), list(nodes))
            for index, nodes in enumerate((kernel.cut.first, kernel.cut.second))]


def baseline_estimated(pypto: Mapping) -> bool:
    """Whether the summary's unfused baseline (``pypto``: its ``pypto`` section) is the
    estimate of the ops' cost, not their compiled kernels' measure."""
    return pypto["cost_us_unfused_basis"] == ESTIMATED


def cut_summary(kernel: ptom_pb2.Kernel) -> dict | None:
    """A region that could not ship, cut in two (docs/regions.md, "Split, never drop")."""
    if not kernel.HasField("cut"):
        return None
    cut = kernel.cut
    return {"parts": [list(cut.first), list(cut.second)], "tensors": list(cut.tensors),
            "bytes_moved": cut.bytes_moved}


def provenance(message: ptom_pb2.CompiledModel) -> dict:
    """The tool versions and the build options a blob records, as inspect and the report show."""
    p = message.provenance
    return {"tool": p.tool_version, "pypto": p.pypto_version, "onnx": p.onnx_version,
            "onnxruntime": p.onnxruntime_version, "options": dict(sorted(p.options.items()))}
