"""Run an ONNX model on the CPU: onnxruntime, or onnx's reference evaluator where onnxruntime
lacks an op or a dtype (float8, int4, ...). Shared by the shape probe, the checks and the tests."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx


# Absolute tolerance per output dtype when two computations of the same graph are compared
# (fp32 as the fusion issue requires); integers and booleans must match exactly.
TOLERANCE = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


class CannotRun(RuntimeError):
    """Neither onnxruntime nor the reference evaluator could run the model."""


def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Output name → value: an array, or a list of arrays for a sequence."""
    names = [o.name for o in model.graph.output]
    try:
        outputs = _as_declared_dtypes(model, _run_onnxruntime(model, feeds))
    except Exception as ort_error:  # noqa: BLE001 - any refusal sends us to the evaluator
        try:
            import onnx.reference

            outputs = onnx.reference.ReferenceEvaluator(model).run(None, dict(feeds))
        except Exception as ref_error:  # noqa: BLE001
            raise CannotRun(f"onnxruntime: {ort_error}; reference evaluator: {ref_error}") from None
    return {name: out if isinstance(out, list) else np.asarray(out)
            for name, out in zip(names, outputs) if out is not None}


def _run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # errors arrive as exceptions; keep its log off the terminal
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def _as_declared_dtypes(model: onnx.ModelProto, outputs: list) -> list:
    """onnxruntime returns float8 outputs as raw uint8 bits: view them as the declared dtype."""
    fixed = []
    for value, out in zip(model.graph.output, outputs):
        elem_type = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        if elem_type and isinstance(out, np.ndarray):
            declared = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
            if out.dtype != declared and out.dtype.itemsize == declared.itemsize \
                    and out.dtype.kind in "ui" and declared.kind not in "uib":
                out = out.view(declared)
        fixed.append(out)
    return fixed


def abs_diff(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Elementwise |expected - actual| in float64; NaNs or equal infinities in the same places
    count as equal, any other NaN as an infinite difference."""
    a, b = np.asarray(expected, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    same = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    with np.errstate(invalid="ignore"):  # inf - inf is NaN where `same` already decided
        return np.nan_to_num(np.where(same, 0.0, np.abs(a - b)), nan=np.inf)


def max_abs_diff(expected: np.ndarray, actual: np.ndarray) -> float:
    if expected.shape != actual.shape:
        return float("inf")
    if expected.size == 0:
        return 0.0
    if not np.issubdtype(expected.dtype, np.number) and expected.dtype != np.bool_:
        return 0.0 if np.array_equal(expected, actual) else float("inf")
    return float(abs_diff(expected, actual).max())
