"""What the report shows, computed from the blob's message alone (so a blob regenerates it)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import onnx

from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.offline_compiler.summary import (NOT_MEASURED, baseline_estimated,
                                                  cut_parts, cut_summary, kernel_precision,
                                                  measured, precision_line, provenance, shown,
                                                  summarise, tile_us)
from pypto_offline.report import kernel_table
from pypto_offline.report.downloads import downloads, file_stem
from pypto_offline.report.dot import graphviz_version
from pypto_offline.report.graph_view import Drawing, GraphFacts, draw
from pypto_offline.report.tensors import TensorType, UNKNOWN, graph_io, tensor_types
from pypto_offline.report.plots import Series, bar_chart

# Shown instead of a wall-clock figure: reports, like blobs, are byte-identical between builds.
COMPILE_TIME_NOTE = ("not in the report: a wall-clock figure would make two identical builds "
                     "differ; the build prints it and --json gives compile_seconds and timings")

# Said at the top of every page, after what the kernels are (the blob's platform, docs/report.md).
NOTICE_TAIL = ("No device loader reads a .ptom yet. Figures marked estimate rest on target "
               "figures that are estimates (see the target's sources below).")
# A blob written before blobs recorded their platform: every such build compiled for the 910B.
LEGACY_PLATFORM = ("Kernels compiled by PyPTO 0.2.0 for its only platform, the Ascend 910B "
                   "(DAV_2201), within this target's Unified Buffer size.")


def platform_notice(message: ptom_pb2.CompiledModel) -> str:
    """What the kernels in the blob are: the platform they compiled under, and its figures that
    are estimates (docs/platform.md)."""
    if not message.HasField("platform"):
        return f"{LEGACY_PLATFORM} {NOTICE_TAIL}"
    p = message.platform
    estimates = [f"{f.name} {f.value} ({f.source})" for f in p.figures if f.estimate]
    guessed = f" Platform figures that are estimates: {'; '.join(estimates)}." if estimates \
        else ""
    return (f"Kernels are {p.description}; platform digest {p.digest[:16]}.{guessed} "
            f"{NOTICE_TAIL}")


@dataclass(frozen=True)
class Headline:
    label: str
    text: str
    estimate: bool = False
    kind: str = ""      # a CSS class: passed / failed / skipped for the verdict


def platform_line(platform: dict | None) -> str:
    """The platform in a few words: whose figures PyPTO compiled and timed the kernels with."""
    if platform is None:
        return "PyPTO 0.2.0's Ascend 910B platform (a blob from before platforms were recorded)"
    figures = {key: f["value"] for key, f in platform["figures"].items()}
    kind = "PyPTO's own platform" if platform["native"] else \
        f"{platform['isa']} code under the chip's figures"
    return (f"{platform['chip']}: {kind}; {figures['ai_core_cnt']} AI core(s), UB "
            f"{figures['ub_size']:,} B")


def platform_change(summary: dict) -> str:
    """What compiling under the chip's own platform changed (--compare-platform): why a blob for
    this chip differs from one compiled under the 910B's figures."""
    c = summary["platform_comparison"]
    return (f"tiles changed on {c['tiles_changed']} of "
            f"{c['kernels_compared']} kernels; PyPTO {shown(c['pypto_us'], ',.1f')} µs under "
            f"this platform against {shown(c['pypto_us_910b'], ',.1f')} µs under the 910B's "
            "(24 AI cores, UB 196,608 B): each kernel's tile table shows both")


def headline(summary: dict) -> list[Headline]:
    """The few facts a reader wants first, each also in the summary table below."""
    pypto, check = summary["pypto"], summary["verification"]
    before, after = summary["est_time_us_before"], summary["est_time_us_after"]
    fused, unfused = pypto["cost_us_fused"], pypto["cost_us_unfused"]
    cost = (NOT_MEASURED if fused is None or unfused is None else
            f"{shown(unfused, ',.1f')} µs unfused → {shown(fused, ',.1f')} µs fused over "
            f"{pypto['kernels_cost_compared']} kernels ({pypto['cost_us_unfused_basis']} "
            f"unfused)")
    return [
        Headline("Model → target", f"{summary['model']} → {summary['target']}"),
        Headline("Compiled under", platform_line(summary["platform"])),
        Headline("Precision", precision_line(summary)),
        Headline("Kernels", f"{summary['kernels_before']} → {summary['kernels_after']} "
                            f"({pypto['compiled']} fused kernels, {pypto['fell_back']} fell "
                            f"back)"),
        Headline("Estimated time on the target", f"{shown(before, ',.1f')} µs → "
                 f"{shown(after, ',.1f')} µs", estimate=True),
        *([Headline("Against PyPTO's 910B platform", platform_change(summary))]
          if summary["platform_comparison"] else []),
        Headline("PyPTO cost model", cost,
                 estimate=baseline_estimated(pypto)),
        Headline("Verification against onnxruntime", check["status"], kind=check["status"]),
    ]


TILE_CALL = re.compile(r"pypto\.set_vec_tile_shapes\(([^)]*)\)")


@dataclass(frozen=True)
class Figure:
    key: str        # the --json path, e.g. "pypto.cost_us_fused"
    label: str
    text: str       # as shown
    value: str      # as JSON, for checks against --json
    estimate: bool = False  # rests on target figures that are estimates


def summary_figures(summary: dict) -> list[Figure]:
    mb = lambda n: f"{n / 1e6:,.3f} MB"  # noqa: E731
    us = lambda v: shown(v, ",.2f", " µs")  # noqa: E731
    check, pypto = summary["verification"], summary["pypto"]
    rows = [
        ("model", "Model", summary["model"]), ("model_sha256", "Model sha256", None),
        ("target", "Target", summary["target"]),
        ("nodes_before", "Nodes before", None), ("nodes_after", "Nodes after", None),
        ("kernels_before", "Kernels before", None), ("kernels_after", "Kernels after", None),
        ("fused_kernels", "Fused kernels", None), ("ops_fused", "Ops fused", None),
        ("gm_bytes_before", "GM bytes before", mb(summary["gm_bytes_before"])),
        ("gm_bytes_after", "GM bytes after (measured)", mb(summary["gm_bytes_after"])),
        ("gm_bytes_lower_bound", "GM bytes lower bound", mb(summary["gm_bytes_lower_bound"])),
        ("est_time_us_before", "Estimated time before, on the target",
         us(summary["est_time_us_before"])),
        ("est_time_us_after", "Estimated time after, on the target",
         us(summary["est_time_us_after"])),
        ("pypto.compiled", "PyPTO kernels compiled", None),
        ("pypto.fell_back", "PyPTO kernels fallen back", None),
        ("pypto.cost_us_fused", "PyPTO cost model, fused", us(pypto["cost_us_fused"])),
        ("pypto.cost_us_unfused", "PyPTO cost model, one kernel per op",
         us(pypto["cost_us_unfused"])),
        ("pypto.cost_us_unfused_basis", "One kernel per op: measured or estimated",
         pypto["cost_us_unfused_basis"] or NOT_MEASURED),
        ("verification.status", "Verification (onnxruntime)", None),
        ("verification.max_abs_diff", "Max abs diff", shown(check["max_abs_diff"], ".3e")),
        ("build_record.kernels_checked", "Kernels checked at build time (PyPTO pass-verify)",
         None),
        ("build_record.kernels_passed", "Kernels passed", None),
    ]
    figures = []
    for key, label, text in rows:
        value = _lookup(summary, key)
        figures.append(Figure(key, label, str(value) if text is None else text,
                              json.dumps(value), key.startswith("est_time")
                              or (key == "pypto.cost_us_unfused"
                                  and baseline_estimated(pypto))))
    return figures


def _lookup(summary: dict, key: str):
    value = summary
    for part in key.split("."):
        value = value[part]
    return value


def kernel_cards(grouped: list[list[ptom_pb2.Kernel]], types: dict[str, TensorType]
                 ) -> list[dict]:
    """One card per group of identical kernels (kernel_table.groups), the first one's facts."""
    typed = lambda names: [(n, types.get(n, UNKNOWN).text) for n in names]  # noqa: E731
    return [{
        "id": k.id, "ids": [other.id for other in group], "compiled": k.compiled,
        "fallback_reason": k.fallback_reason,
        "signature": k.region_signature, "sha256": k.sha256, "platform": k.platform,
        "precision": kernel_precision(k), "cut": cut_summary(k),
        "cut_parts": cut_parts(k),
        "original": [_op(o) for o in k.original], "simplified": [_op(o) for o in k.simplified],
        "rules": list(k.rules_applied), "inputs": typed(k.inputs), "outputs": typed(k.outputs),
        "verdict": kernel_table.verdict(k),
        "source": k.source, "tile_shapes": tile_shapes(k.source),
        "tiles": [(name, _tile(getattr(k, field))) for name, field in
                  (("default", "default_tile"), ("tuned", "tuned_tile"),
                   ("910B platform", "platform_910b_tile"))
                  if k.compiled and k.HasField(field)],
        "candidates": [(_tile(c), k.HasField("tuned_tile") and c == k.tuned_tile)
                       for c in k.candidates],
        "bytes": {"unfused": k.gm_bytes_unfused, "lower_bound": k.gm_bytes_lower_bound,
                  "read": k.gm_bytes_read, "written": k.gm_bytes_written,
                  "measured": k.gm_bytes_read + k.gm_bytes_written,
                  "handoff": k.gm_bytes_handoff, "rereads": k.gm_bytes_cube_rereads},
        "kernels_unfused": k.kernels_unfused,
        "est_us": {"unfused": k.est_time_us_unfused, "fused": k.est_time_us_fused},
        "cost_us_unfused": measured(k, "cost_us_unfused"), "cost_basis": k.cost_us_unfused_basis,
        "functional_ok": k.functional_ok, "max_abs_diff": measured(k, "max_abs_diff"),
        "verdicts": [(v.pass_name, v.result) for v in k.verdicts],
        "artifacts": [(a.name, len(a.data), a.sha256) for a in k.artifacts],
    } for group in grouped for k in group[:1]]


def _tile(tile: ptom_pb2.TileChoice) -> dict:
    """One tile row of a kernel card; a figure the blob does not hold is None (not measured)."""
    return {"budget_bytes": tile.budget_bytes, "tasks": tile.tasks,
            "swapped_transposes": tile.swapped_transposes, "flat_rows": tile.flat_rows,
            "vec_merge": tile.vec_merge, "ub_bytes": measured(tile, "ub_bytes"),
            "aicore_us": measured(tile, "aicore_us"), "total_us": measured(tile, "total_us"),
            "error": tile.error}


def tile_shapes(source: str) -> list[tuple[str, str]]:
    """(statement, tile shape) for every statement of the generated kernel that sets a tile:
    the shapes of the tuned kernel, read from its source (the blob keeps that one)."""
    pairs, shape = [], None
    for line in source.splitlines():
        found = TILE_CALL.search(line)
        if found:
            shape = found.group(1)
        elif shape is not None and line.strip():
            pairs.append((line.strip(), f"({shape})"))
            shape = None
    return pairs


def _op(op: ptom_pb2.Op) -> dict:
    return {"op_type": op.op_type, "inputs": list(op.inputs), "outputs": list(op.outputs),
            "params": op.params_json}


def unfused_groups(message: ptom_pb2.CompiledModel) -> list[tuple[str, list]]:
    """Every memory-bound op left unfused, grouped by category (largest group first)."""
    groups: dict[str, list] = {}
    for u in message.unfused:
        groups.setdefault(u.category, []).append(u)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))


def graph_drawing(message: ptom_pb2.CompiledModel, model: onnx.ModelProto,
                  types: dict[str, TensorType]) -> Drawing:
    return draw(GraphFacts(
        model, types, region_of={node: k.id for k in message.kernels for node in k.nodes},
        compiled={k.id: k.compiled for k in message.kernels},
        unfused={u.node: f"{u.category}: {u.reason}" for u in message.unfused}))


def plots(message: ptom_pb2.CompiledModel) -> list[str]:
    kernels = [k for k in message.kernels if k.compiled]
    if not kernels:
        return []
    labels = [f"{k.id} ({len(k.original)} ops)" for k in kernels]
    kb = lambda n: n / 1024  # noqa: E731
    return [
        bar_chart("Global-memory traffic per kernel", labels, [
            Series("ops unfused", tuple(kb(k.gm_bytes_unfused) for k in kernels)),
            Series("fused, measured", tuple(kb(k.gm_bytes_read + k.gm_bytes_written)
                                            for k in kernels)),
            Series("lower bound", tuple(kb(k.gm_bytes_lower_bound) for k in kernels))], "KiB"),
        bar_chart("Estimated time on the target per kernel", labels, [
            Series("ops unfused", tuple(k.est_time_us_unfused for k in kernels)),
            Series("fused", tuple(k.est_time_us_fused for k in kernels))], "µs, estimate"),
        bar_chart("PyPTO cost model per kernel", labels, [
            Series("default tile", tuple(tile_us(k, "default_tile") for k in kernels)),
            Series("tuned tile", tuple(tile_us(k, "tuned_tile") for k in kernels))], "µs"),
    ]


def context(message: ptom_pb2.CompiledModel) -> dict:
    summary = summarise(message)
    model = onnx.load_from_string(message.source_onnx_model)
    types = tensor_types(model)
    inputs, outputs = graph_io(model, types)
    grouped = kernel_table.groups(message, types)
    return {"summary": summary, "headline": headline(summary),
            "figures": summary_figures(summary), "platform_notice": platform_notice(message),
            "compile_time_note": COMPILE_TIME_NOTE, "provenance": provenance(message),
            "graphviz": graphviz_version(), "model_inputs": inputs, "model_outputs": outputs,
            "target": message.target.name, "target_notes": message.target.notes,
            "target_figures": list(message.target.figures),
            "kernels": kernel_cards(grouped, types),
            "kernel_rows": kernel_table.rows(grouped, types),
            "unfused": unfused_groups(message), "unfused_count": len(message.unfused),
            "graph": graph_drawing(message, model, types), "plots": plots(message),
            "downloads": downloads(message, summary), "file_stem": file_stem(message),
            "verification": message.verification}
