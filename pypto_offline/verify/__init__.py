"""Check a compiled graph against the original in onnxruntime.

    feeds = generate_inputs(model, seed=0)
    result = compare(original, compiled, feeds)

Inputs are seeded and respect each input's dtype and valid range (``runtime.generate_inputs``,
which the importer's own checks use too). Tolerances are per dtype; integers and booleans must
match exactly. Knows nothing of kernels or blobs. ``check_memory_limits`` applies the build's
memory limits to a graph before any input of it is made; ``load_inputs`` reads real inputs from
an .npz, sizes checked before any byte is decompressed (``read_inputs``: an .npz or
``NAME=FILE.npy,...``, for ``run``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

import math
import os
import zipfile
import zlib

import numpy as np
import onnx
import onnx.numpy_helper

from pypto_offline.errors import ModelError, UsageError
from pypto_offline.importer.input_shapes import (check_dims, check_tensor_bytes, graph_inputs,
                                                 human_bytes)
from pypto_offline.importer.precision import MAX_REL_DISTANCE, MIN_COSINE
from pypto_offline.importer.shape_probe import MAX_PROBE_BYTES, check_memory
from pypto_offline.registry.ops import is_op
from pypto_offline.runtime import (TOLERANCE, CannotRun, abs_diff, generate_inputs,
                                   in_input_types, precision_metrics, run_model)
from pypto_offline.user_files import open_regular

@dataclass(frozen=True)
class OutputCheck:
    name: str
    dtype: str
    max_abs_diff: float
    max_rel_diff: float
    tolerance: float
    passed: bool
    # msaccucmp's other metrics (docs/precision.md); 1, 0 and 0 for equal outputs
    cosine: float = 1.0
    rms: float = 0.0
    rel_distance: float = 0.0
    # an output a DequantizeLinear makes of int8/uint8 (``quantised_outputs``): its differences
    # in steps of its scale (``int8_steps``); None for any other output
    int8_steps: Mapping[str, float] | None = None


FP16_SMALLEST_NORMAL = float(np.finfo(np.float16).tiny)  # 2^-14: below it, subnormals


@dataclass(frozen=True)
class Thresholds:
    """What a converted model's outputs are held to against the original model (a cosine
    similarity and a relative Euclidean distance, as Ascend's msaccucmp reports them;
    docs/precision.md). None: the per-dtype tolerance on the largest difference, as for two
    computations of one graph."""

    min_cosine: float
    max_rel_distance: float = math.inf

    @classmethod
    def of(cls, mode: str) -> Thresholds:
        """A converting precision mode's (``precision.MIN_COSINE``, ``MAX_REL_DISTANCE``)."""
        return cls(MIN_COSINE[mode], MAX_REL_DISTANCE[mode])

    def holds(self, metrics: dict[str, float]) -> bool:
        """``metrics``: ``runtime.precision_metrics``'s. The cosine sees a direction, the
        distance a scale too (a weight saturated to fp16's range: cosine 1, distance 0.345). A
        kernel measured before blobs recorded the distance has none: its cosine decides."""
        return (metrics["cosine"] >= self.min_cosine and np.isfinite(metrics["max_abs"])
                and metrics.get("rel_distance", 0.0) <= self.max_rel_distance)

    def kernel_holds(self, metrics: dict[str, float]) -> bool:
        """A kernel's outputs on the original model's values: ``holds``, or every difference
        below fp16's smallest normal value (2^-14). Such values are fp16 subnormals, of a few
        significant bits: tf_convnext's layer scale (1e-6 times a block's output) came out of
        its kernel with cosine 0.947 and differences of about 1e-7. onnxruntime rounds an fp16
        op's output to fp16 as the chip does, so the model's outputs show what that costs
        (0.9999998 there); what the per-kernel check is for, an overflow onnxruntime computes
        past in fp32, is never that small (docs/precision.md)."""
        return self.holds(metrics) or metrics["max_abs"] < FP16_SMALLEST_NORMAL


@dataclass(frozen=True)
class Verification:
    status: str  # passed | failed
    outputs: tuple[OutputCheck, ...]
    error: str | None = None  # the compiled graph did not run at all
    # a quantised blob's outputs against the float model its QDQ model was made from
    # (``float_metrics``): reported, never part of the status (docs/int8.md "Verification")
    float_original: tuple[OutputCheck, ...] = ()

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=0.0)


def check_memory_limits(model: onnx.ModelProto, where: str, fix: str) -> None:
    """The build's memory limits (docs/outputs.md, "Resource limits") on a graph about to run,
    before any input is allocated: each graph input static, within the bytes and elements a
    tensor may take (its bytes first, so the message gives the memory it would need), then every
    tensor onnx's shape inference sees, together (``shape_probe.check_memory``; initializers are
    in memory already and not counted). ``fix``: what the caller can do about a graph refused."""
    try:
        for value in graph_inputs(model):
            _check_input_memory(value, f"{where}, input {value.name!r}")
        check_memory(model, where, known={t.name for t in model.graph.initializer})
    except ModelError as error:
        raise ModelError(error.what, where=error.where, fix=fix) from None


def _check_input_memory(value: onnx.ValueInfoProto, where: str) -> None:
    tensor_type = value.type.tensor_type
    dims = tensor_type.shape.dim
    if not value.type.HasField("tensor_type") or not tensor_type.HasField("shape") \
            or not all(d.HasField("dim_value") for d in dims):
        raise ModelError("the input has no static shape", where=where)
    shape = [d.dim_value for d in dims]
    check_tensor_bytes(shape, tensor_type.elem_type, where)
    check_dims(shape, where)


def compare(reference: onnx.ModelProto, candidate: onnx.ModelProto,
            feeds: Mapping[str, np.ndarray], thresholds: Thresholds | None = None,
            run: Callable[[onnx.ModelProto, Mapping], dict] = run_model,
            float_original: onnx.ModelProto | None = None,
            propagated: Thresholds | None = None) -> Verification:
    """``candidate`` run by ``run`` (a blob's compiled graph: the reference runtime's
    executor) against ``reference`` run in onnxruntime, on ``feeds``; an output a
    DequantizeLinear makes of int8 held to ``int8_steps``. ``float_original``: the float model
    a quantised reference was made from, whose metrics are reported (``float_metrics``).
    ``propagated``: what an int8 output more than one step off is held to, where the reference
    computes its contractions otherwise (the QDQ model itself: in float) and an early layer's
    off-by-one may travel (None: it fails; docs/int8.md, "Verification")."""
    try:  # the original model takes float32 where a converted one takes fp16
        expected = run_model(reference, in_input_types(reference, feeds))
    except CannotRun as why:  # a custom-domain op: not the compiler's fault, nothing to check
        first = str(why).strip().splitlines()[0]
        raise ModelError(f"the model cannot be verified here: onnxruntime cannot run it on "
                         f"these inputs ({first})",
                         fix="give the inputs its shapes depend on with --inputs; --no-verify "
                             "builds it without the check") from None
    try:
        actual = run(candidate, feeds)
    except CannotRun as why:
        return Verification("failed", (), f"the compiled graph does not run: {why}")
    steps = quantised_outputs(reference)
    checks = tuple(_check(name, want, actual.get(name), thresholds, steps.get(name), propagated)
                   for name, want in expected.items())
    return Verification("passed" if all(c.passed for c in checks) else "failed", checks,
                        float_original=() if float_original is None
                        else float_metrics(float_original, actual, feeds))


def float_metrics(float_model: onnx.ModelProto, candidate_outputs: Mapping[str, np.ndarray],
                  feeds: Mapping[str, np.ndarray]) -> tuple[OutputCheck, ...]:
    """A quantised blob's outputs (``candidate_outputs``, from ``compare``'s run) against the
    float model its QDQ model was made from, run in onnxruntime on ``feeds``: the int8 model's
    accuracy, not the compiler's, so every check passes and only the metrics say anything."""
    expected = run_model(float_model, in_input_types(float_model, feeds))
    checks = (_check(name, want, candidate_outputs.get(name), None, None)
              for name, want in expected.items())
    return tuple(replace(c, passed=True) for c in checks)


def _check(name: str, expected, actual, thresholds: Thresholds | None,
           step: float | None = None, propagated: Thresholds | None = None) -> OutputCheck:
    dtype = str(np.asarray(expected).dtype)
    tolerance = TOLERANCE.get(dtype, 0.0)
    if actual is None or np.shape(actual) != np.shape(expected):
        return OutputCheck(name, dtype, float("inf"), float("inf"), tolerance, False, 0.0,
                           float("inf"), float("inf"))
    if dtype == "object":  # strings
        same = bool(np.array_equal(expected, actual))
        return OutputCheck(name, dtype, 0.0 if same else float("inf"), 0.0, 0.0, same)
    m = precision_metrics(expected, actual)
    float_output = np.issubdtype(np.asarray(expected).dtype, np.floating)
    passed = m["max_abs"] <= tolerance if thresholds is None or not float_output else \
        thresholds.holds(m)
    steps = int8_steps(expected, actual, step) if step is not None and float_output else None
    if steps is not None:  # a converting mode's thresholds may pass what one step does not
        passed = passed or steps["max_steps"] <= 1 or (
            propagated is not None and propagated.holds(m))
    return OutputCheck(name, dtype, m["max_abs"], m["max_rel"], tolerance, bool(passed),
                       m["cosine"], m["rms"], m["rel_distance"], steps)


# Both sides are (q - zero_point) * scale rounded to fp32, so a difference is a whole number of
# steps up to fp32's rounding of each: at most 255 steps * 2^-24 each, below 2e-5 of a step.
# Within this fraction of a whole number of steps, a difference is that number.
STEP_SLACK = 1e-3


def int8_steps(expected: np.ndarray, actual: np.ndarray, scale: float) -> dict:
    """The differences of a dequantised int8 output in steps of its ``scale``: ``off_by_one``
    elements one step apart (both sides rounded a value on either side of a rounding boundary
    to neighbouring integers: onnxruntime's float contraction and the compiler's exact int32
    one), ``max_steps`` the largest difference rounded up (0: bit-exact). The check passes an
    output of at most one step (docs/int8.md, "Verification")."""
    steps = abs_diff(expected, actual) / scale
    within = steps <= 1 + STEP_SLACK
    largest = float(steps.max(initial=0.0))
    return {"scale": float(scale), "off_by_one": int(np.count_nonzero(within & (steps > 0))),
            "max_steps": int(math.ceil(largest - STEP_SLACK)) if np.isfinite(largest)
            else np.iinfo(np.int64).max, "elements": int(steps.size)}


# The ops a quantised graph holds and a float one does not (QDQ and QOperator formats)
QUANTISED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "MatMulInteger", "ConvInteger",
                           "QLinearMatMul", "QLinearConv", "DynamicQuantizeLinear"})


def float_original_of(quantised: onnx.ModelProto, model: onnx.ModelProto) -> bool:
    """Whether ``model`` can be the float model the quantised graph ``quantised`` was made
    from: ``quantised`` holds quantised ops and ``model`` none, with the same input and output
    names (``quantize_static`` keeps them). What it cannot check, the weights, is why only
    metrics against it are reported (``float_metrics``)."""
    def ops(graph: onnx.ModelProto) -> set[str]:
        return {node.op_type for node in graph.graph.node}

    def names(graph: onnx.ModelProto) -> tuple:
        weights = {t.name for t in graph.graph.initializer}
        return ({v.name for v in graph.graph.input if v.name not in weights},
                [v.name for v in graph.graph.output])

    return bool(ops(quantised) & QUANTISED_OPS) and not ops(model) & QUANTISED_OPS \
        and names(quantised) == names(model)


QUANTISED_DTYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8})


def quantised_outputs(model: onnx.ModelProto) -> dict[str, float]:
    """Each output of ``model`` a per-tensor ``DequantizeLinear`` makes of an int8 or uint8
    tensor, with its scale: the outputs held to ``int8_steps``."""
    constants = {t.name: t for t in model.graph.initializer}
    constants.update((node.output[0], attribute.t) for node in model.graph.node
                     if is_op(node, "Constant") for attribute in node.attribute
                     if attribute.name == "value")
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*model.graph.input, *model.graph.value_info, *model.graph.output)}
    types.update((name, t.data_type) for name, t in constants.items())
    made_by = {node.output[0]: node for node in model.graph.node if node.output}
    found = {}
    for output in model.graph.output:
        node = made_by.get(output.name)
        if node is None or not is_op(node, "DequantizeLinear") or node.input[1] not in constants:
            continue
        scale = onnx.numpy_helper.to_array(constants[node.input[1]])
        zero_point = node.input[2] if len(node.input) > 2 and node.input[2] else None
        quantised = types.get(zero_point) if zero_point else types.get(node.input[0])
        if scale.size == 1 and quantised in QUANTISED_DTYPES and float(scale.ravel()[0]) > 0:
            found[output.name] = float(scale.ravel()[0])
    return found


NPZ_FIX = "give an .npz made with numpy.savez, one array per input name"


def load_inputs(path) -> dict[str, np.ndarray]:
    """The arrays of an .npz, by name. Its zip directory and each .npy header are read first, so
    an archive that would decompress to more than ``MAX_PROBE_BYTES`` (a zip bomb), an array whose
    header disagrees with its size (truncated), or a pickled object is refused before any data is
    decompressed. Every failure is a ``UsageError``; only a regular file is opened, once."""
    try:
        with open_regular(path, "--inputs", NPZ_FIX) as stream, \
                zipfile.ZipFile(stream) as archive:
            members = archive.infolist()
            total = sum(member.file_size for member in members)
            if total > MAX_PROBE_BYTES:
                raise UsageError(f"--inputs would decompress to {human_bytes(total)}, more "
                                 f"than the {human_bytes(MAX_PROBE_BYTES)} allowed",
                                 where=str(path), fix=NPZ_FIX)
            for member in members:
                where = f"{path}, {member.filename}"
                if not member.filename.endswith(".npy"):
                    raise UsageError("the archive holds a file that is not an .npy array",
                                     where=where, fix=NPZ_FIX)
                with archive.open(member) as array:  # decompresses only the header's bytes
                    _check_npy_header(array, member.file_size, where, NPZ_FIX)
            stream.seek(0)
            with np.load(stream, allow_pickle=False) as data:
                return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        raise UsageError(f"cannot read --inputs: {error}", where=str(path), fix=NPZ_FIX) from None


def _check_npy_header(stream, size: int, where: str, fix: str) -> None:
    """An .npy's header read from ``stream`` (``size`` bytes in all): no Python objects, and
    the shape × itemsize it declares exactly the data it holds (not truncated, not padded)."""
    version = np.lib.format.read_magic(stream)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read_header(stream, max_header_size=10_000)
    data_bytes = size - stream.tell()
    if dtype.hasobject:
        raise UsageError("the array holds Python objects, which are not read (they could run "
                         "code)", where=where, fix=fix)
    expected = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if expected != data_bytes:
        raise UsageError(f"the array's header says shape {list(shape)} {dtype} ({expected} "
                         f"bytes) but it holds {data_bytes} bytes: the file is truncated or "
                         f"damaged", where=where, fix=fix)


NPY_FIX = ("give --inputs an .npz, or NAME=FILE.npy,... with each file made by numpy.save "
           "(one array per input name)")


def read_inputs(spec: str) -> dict[str, np.ndarray]:
    """``run --inputs``: an .npz (``load_inputs``), or ``NAME=FILE.npy,...``, each .npy read as
    safely (a regular file, its header checked before its data is read, no pickles, all of
    them within the .npz's budget). An existing file of that name is an .npz, whatever it
    holds: the form is told by the path, not guessed from a '='."""
    files = input_files(spec)
    if None in files:
        return load_inputs(spec)
    arrays: dict[str, np.ndarray] = {}
    budget = MAX_PROBE_BYTES
    for name, path in files.items():
        size, arrays[name] = _load_npy(path, f"{path} (--inputs {name})", budget)
        budget -= size
    return arrays


def input_files(spec: str) -> dict[str | None, str]:
    """The files ``read_inputs`` reads for ``spec``: ``{None: spec}`` for an .npz, else each
    input's .npy by its name (``NAME=FILE.npy,...``, every item checked)."""
    if os.path.isfile(spec) or "=" not in spec:
        return {None: spec}
    files: dict[str | None, str] = {}
    for item in spec.split(","):
        name, _, path = (part.strip() for part in item.partition("="))
        if not name or not path:
            raise UsageError(f"--inputs item {item!r} is not NAME=FILE.npy", fix=NPY_FIX)
        if name in files:
            raise UsageError(f"--inputs names {name!r} twice", fix="give each input once")
        files[name] = path
    return files


def _load_npy(path: str, where: str, budget: int) -> tuple[int, np.ndarray]:
    """One .npy of ``NAME=FILE.npy`` (its size in bytes, its array): at most ``budget`` bytes,
    checked from its size first."""
    try:
        with open_regular(path, "--inputs", NPY_FIX) as stream:
            size = os.fstat(stream.fileno()).st_size
            if size > budget:
                raise UsageError(f"--inputs would read {human_bytes(size)} more, past the "
                                 f"{human_bytes(MAX_PROBE_BYTES)} allowed", where=where,
                                 fix=NPY_FIX)
            _check_npy_header(stream, size, where, NPY_FIX)
            stream.seek(0)
            return size, np.load(stream, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise UsageError(f"cannot read --inputs: {error}", where=where, fix=NPY_FIX) from None
