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

from dataclasses import dataclass
from typing import Callable, Mapping

import math
import os
import zipfile
import zlib

import numpy as np
import onnx

from pypto_offline.errors import ModelError, UsageError
from pypto_offline.importer.input_shapes import (check_dims, check_tensor_bytes, graph_inputs,
                                                 human_bytes)
from pypto_offline.importer.precision import MAX_REL_DISTANCE, MIN_COSINE
from pypto_offline.importer.shape_probe import MAX_PROBE_BYTES, check_memory
from pypto_offline.runtime import (TOLERANCE, CannotRun, generate_inputs, in_input_types,
                                   precision_metrics, run_model)
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
            run: Callable[[onnx.ModelProto, Mapping], dict] = run_model) -> Verification:
    """``candidate`` run by ``run`` (a blob's compiled graph: the reference runtime's
    executor) against ``reference`` run in onnxruntime, on ``feeds``."""
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
    checks = tuple(_check(name, want, actual.get(name), thresholds)
                   for name, want in expected.items())
    return Verification("passed" if all(c.passed for c in checks) else "failed", checks)


def _check(name: str, expected, actual, thresholds: Thresholds | None) -> OutputCheck:
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
    return OutputCheck(name, dtype, m["max_abs"], m["max_rel"], tolerance, bool(passed),
                       m["cosine"], m["rms"], m["rel_distance"])


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
