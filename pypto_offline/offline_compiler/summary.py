"""The figures of a compiled model, as ``--json``, ``inspect``, ``verify`` and the report show them.

One function over the blob's message, so every place that shows a figure shows the same one.
"""
from __future__ import annotations

from pypto_offline.offline_compiler import ptom_pb2


def summarise(message: ptom_pb2.CompiledModel) -> dict:
    m, t, v = message, message.totals, message.verification
    checked = [k for k in m.kernels if k.verdicts]
    return {
        "model": m.provenance.model_name, "model_sha256": m.provenance.model_sha256,
        "target": m.target.name,
        "nodes_before": t.nodes_before, "nodes_after": t.nodes_after,
        "kernels_before": t.kernels_before, "kernels_after": t.kernels_after,
        "fused_kernels": t.fused_kernels, "ops_fused": t.ops_fused,
        "gm_bytes_before": t.gm_bytes_before, "gm_bytes_after": t.gm_bytes_after,
        "gm_bytes_lower_bound": t.gm_bytes_lower_bound,
        "est_time_us_before": round(t.est_time_us_before, 3),
        "est_time_us_after": round(t.est_time_us_after, 3),
        "pypto": {"compiled": t.pypto_compiled, "fell_back": t.pypto_fell_back,
                  "cost_us_fused": t.cost_us_fused, "cost_us_unfused": t.cost_us_unfused},
        "verification": {
            "status": v.status or "skipped",
            "max_abs_diff": max((o.max_abs_diff for o in v.outputs), default=None),
            "kernels_checked": len(checked),
            "kernels_passed": sum(k.functional_ok for k in checked)},
    }


def provenance(message: ptom_pb2.CompiledModel) -> dict:
    """The tool versions and the build options a blob records, as inspect and the report show."""
    p = message.provenance
    return {"tool": p.tool_version, "pypto": p.pypto_version, "onnx": p.onnx_version,
            "onnxruntime": p.onnxruntime_version, "options": dict(sorted(p.options.items()))}
