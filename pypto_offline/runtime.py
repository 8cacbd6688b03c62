"""Run an ONNX model on the CPU: onnxruntime, or onnx's reference evaluator where onnxruntime
lacks an op or a dtype (float8, int4, ...); seeded inputs to run it on. Shared by the shape
probe, the importer's and the build's checks and the tests.

Inputs are seeded and respect each input's dtype and valid range: an integer that indexes a Gather
stays within the indexed axis (token ids within the vocabulary), a length equals its axis, a mask
is ones."""
from __future__ import annotations

import itertools
from typing import Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.registry.ops import is_op

# Ops an index tensor passes through unchanged on its way to a Gather.
INDEX_PASS_THROUGH = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity",
                                "Expand"})


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


# fp16's largest finite value: a converted weight saturates to it, a value past it is reported
FP16_MAX = float(np.finfo(np.float16).max)


def kernel_check(expected: list, outputs: list, saturating: Sequence[bool] = ()) -> dict:
    """A kernel's outputs against a reference, by the one comparison every check uses (equal
    infinities and NaNs in the same places are equal: an attention mask holds -inf), and the
    metrics of its least similar float output, with the largest relative distance of any
    (each output is held to both bounds: docs/precision.md). ``saturating``, per output: that
    fp16 output against the reference as fp16 can tell them (``saturated_fp16``)."""
    pairs = [saturated_fp16(want, np.asarray(actual)) if saturate else (want, actual)
             for (want, actual), saturate in itertools.zip_longest(
                 zip(expected, outputs), saturating[:len(outputs)], fillvalue=False)]
    metrics = [precision_metrics(want, np.asarray(actual)) for want, actual in pairs
               if want.dtype.kind == "f" and want.shape == np.shape(actual)]
    least = min(metrics, key=lambda m: m["cosine"], default=None)
    if least is not None:
        least = {**least, "rel_distance": max(m["rel_distance"] for m in metrics)}
    return {"max_abs_diff": max((max_abs_diff(w, a) for w, a in pairs), default=0.0),
            "magnitude": max((magnitude(w) for w in expected), default=0.0),
            "metrics": least}


def saturated_fp16(expected: np.ndarray, actual: np.ndarray) -> tuple:
    """(expected, actual), for an fp16 ``actual`` against a float reference, each clipped to
    fp16's range, infinities included: what an fp16 tensor can tell. A kernel's fp16 output
    against the original model's fp32 values (``pypto_kernels/precision_check.py``) where the
    model holds a value past 65,504 (GPT-2's and Llama's causal mask, torch's float32 minimum
    added to the scores) can hold at best -65,504; it holds -inf, the same to what reads it (a
    softmax's exponential is 0 either way). Whether such an overflow harms is seen by the
    kernels that read it, which run on the model's values rounded to fp16 (infinities there):
    so only an output that kernels alone read is compared so (``Job.saturated_outputs``); one
    an unfused op or the model's output reads is compared as it is, since onnxruntime's run of
    those computes fp16 ops in fp32 and cannot see the overflow (docs/precision.md)."""
    if actual.dtype != np.float16 or np.asarray(expected).dtype.kind != "f":
        return expected, actual
    return (np.clip(np.asarray(expected, dtype=np.float64), -FP16_MAX, FP16_MAX),
            np.clip(actual.astype(np.float64), -FP16_MAX, FP16_MAX))


def magnitude(values: np.ndarray) -> float:
    """The largest finite absolute value of a float tensor (0 for others, or none)."""
    values = np.asarray(values)
    if values.dtype.kind != "f" or values.size == 0:
        return 0.0
    finite_values = np.abs(values[np.isfinite(values)], dtype=np.float64)
    return float(finite_values.max(initial=0.0))


def within_tolerance(diff: float, tolerance: float, largest: float) -> bool:
    """A kernel's largest difference within its type's tolerance, scaled by the reference's
    magnitude above 1: a float type's spacing grows with the value (fp16's is 32 at 65504, where
    a kernel adding in fp32 and one rounding each step to fp16 differ by up to 16), so a fixed
    bound fails every correct kernel whose values are large (docs/precision.md). As the importer
    checks a folded BatchNorm and the backend conformance cases are held."""
    return diff <= tolerance * max(1.0, largest)


def finite(value: float) -> float:
    """An infinite figure (an fp16 overflow's difference) as the largest double: protobuf and
    JSON keep that."""
    return value if np.isfinite(value) else float(np.finfo(np.float64).max)


def precision_metrics(expected: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """Ascend's msaccucmp metrics of ``actual`` against ``expected`` (docs/precision.md):
    cosine similarity (1 for equal tensors, two zero ones included; 0 where either holds a NaN
    or an infinity the other does not: an fp16 overflow), the largest absolute and relative
    differences, the root mean square difference and the relative Euclidean distance
    (``rel_distance``: ``relative_distance``), in float64."""
    diff = abs_diff(expected, actual)
    if diff.size == 0:
        return {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0, "rms": 0.0, "rel_distance": 0.0}
    scale = np.maximum(np.abs(np.asarray(expected, dtype=np.float64)), 1e-12)
    with np.errstate(over="ignore"):  # an fp16 overflow's difference squared: inf, as it is
        rms = float(np.sqrt(np.mean(np.square(diff))))
    return {"cosine": _cosine(expected, actual), "max_abs": float(diff.max()),
            "max_rel": float(np.nan_to_num(diff / scale, nan=np.inf).max()), "rms": rms,
            "rel_distance": relative_distance(expected, diff)}


def relative_distance(expected: np.ndarray, diff: np.ndarray) -> float:
    """msaccucmp's RelativeEuclideanDistance, ||actual - expected|| / ||expected|| (``diff``:
    ``abs_diff``'s): the error against the reference's magnitude as a whole. The cosine is blind
    to scale (a weight of 1e5 saturated to 65,504 scales an output by 0.655 at cosine 1) and
    ``max_rel`` is not robust (an element near 0 makes it huge); this is neither. 0 for equal
    tensors, infinite for a difference from a zero one; the reference's infinities, equal in
    ``actual`` where ``diff`` says so, count as 0 in both norms (docs/precision.md)."""
    with np.errstate(over="ignore"):
        distance = float(np.linalg.norm(diff.ravel()))
        if distance == 0.0:
            return 0.0
        reference = np.asarray(expected, dtype=np.float64).ravel()
        norm = float(np.linalg.norm(np.where(np.isfinite(reference), reference, 0.0)))
    return distance / norm if norm else float("inf")


def _cosine(expected, actual) -> float:
    a = np.asarray(expected, dtype=np.float64).ravel()
    b = np.asarray(actual, dtype=np.float64).ravel()
    if np.array_equal(a, b, equal_nan=True):
        return 1.0
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return 0.0
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms else 0.0


def in_input_types(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """``feeds`` in the element types ``model`` declares for its inputs: the original model's
    float32 where a converted one takes fp16 (``--input_fp16_nodes``, docs/precision.md). For
    the checks against the original model only: ``--inputs`` must be in the blob's own dtypes
    (``input_shapes.check_given_inputs``), never cast to them."""
    declared = {v.name: v.type.tensor_type.elem_type for v in model.graph.input
                if v.type.HasField("tensor_type")}
    return {name: value.astype(onnx.helper.tensor_dtype_to_np_dtype(declared[name]), copy=False)
            if declared.get(name) and isinstance(value, np.ndarray) else value
            for name, value in feeds.items()}


def generate_inputs(model: onnx.ModelProto, seed: int = 0,
                    given: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input with a static shape; ``given`` ones are kept."""
    rng = np.random.default_rng(seed)
    initialized = {t.name for t in model.graph.initializer}
    feeds = dict(given or {})
    for value in model.graph.input:
        if value.name in initialized or value.name in feeds:
            continue
        tensor_type = value.type.tensor_type
        shape = [d.dim_value for d in tensor_type.shape.dim]
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        feeds[value.name] = _one_input(model, value.name, shape, dtype, rng)
    return feeds


def _one_input(model, name, shape, dtype, rng) -> np.ndarray:
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.issubdtype(dtype, np.floating):
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    lowered = name.lower()
    if "mask" in lowered:
        return np.ones(shape, dtype=dtype)
    if "len" in lowered:
        return np.full(shape, _longest_axis(model), dtype=dtype)
    bound = _gather_bound(model, name)
    return rng.integers(0, bound if bound else 2, size=shape).astype(dtype)


def _longest_axis(model: onnx.ModelProto) -> int:
    """A length input is valid when it equals the longest axis of the float inputs."""
    sizes = [d.dim_value for v in model.graph.input
             if v.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
             for d in v.type.tensor_type.shape.dim]
    return max(sizes, default=1)


def _gather_bound(model: onnx.ModelProto, name: str) -> int | None:
    """Size of the axis a Gather indexes with this input (through casts and reshapes)."""
    shapes = _static_shapes(model)
    frontier, seen = [name], set()
    while frontier:
        current = frontier.pop()
        seen.add(current)
        for node in model.graph.node:
            if current not in node.input:
                continue
            if is_op(node, "Gather") and list(node.input).index(current) == 1:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                data_shape = shapes.get(node.input[0])
                if data_shape:
                    return data_shape[axis]
            if is_op(node, INDEX_PASS_THROUGH):
                frontier.extend(o for o in node.output if o not in seen)
    return None


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    for value in list(model.graph.input) + list(model.graph.value_info):
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes
