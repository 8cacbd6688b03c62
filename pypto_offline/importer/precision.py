"""Precision modes: a float32 graph converted to what the NPU computes in (docs/precision.md).

    converted, conversion = to_half(graph.model, "allow_mix_precision", keep, cube_fp32=False)

The four modes are ATC's ``--precision_mode``; ``--keep_dtype`` (ATC's file: one node name per
line, or ``OpType::NAME`` for every op of that type) keeps ops in their original precision. The
conversion itself is onnxruntime's float16 converter (``convert_float_to_float16``): model inputs
and outputs keep their declared types, initializers saturate to fp16's range, and every op kept
in fp32 sits between casts, which the kernels fuse. What this module decides is which ops stay in
fp32, and why:

- ``force_fp16``: none but those onnxruntime's CPU provider has no fp16 kernel for (the reference
  run needs one) and those ``--keep_dtype`` names;
- ``allow_fp32_to_fp16``: the matrix ops (the cube's) in fp16 where the chip's cube takes no
  fp32 (``Target.cube_fp32``), every other op in fp32;
- ``allow_mix_precision``: the op registry's ``precision_reduce`` (ATC's ops-info key): False
  ops in fp32, True ops in fp16, the others as their data inputs are (fp32 when any is);
- ``must_keep_origin_dtype``: no conversion.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from pypto_offline.errors import UsageError
from pypto_offline.registry.ops import (INTEGER_CONTRACTIONS, MATMUL, QUANTISATION_OPS,
                                        data_inputs, is_op, kind_of, op_def)
from pypto_offline.runtime import FP16_MAX
from pypto_offline.user_files import read_regular

FORCE_FP16 = "force_fp16"
ALLOW_FP32_TO_FP16 = "allow_fp32_to_fp16"
MUST_KEEP = "must_keep_origin_dtype"
ALLOW_MIX = "allow_mix_precision"
MODES = (FORCE_FP16, ALLOW_FP32_TO_FP16, MUST_KEEP, ALLOW_MIX)  # ATC's order

# The cosine similarity every float output must keep against the original model, per mode
# (docs/precision.md): force_fp16's error is what it is, 0.99 marks a model it broke.
MIN_COSINE = {FORCE_FP16: 0.99, ALLOW_FP32_TO_FP16: 0.999, ALLOW_MIX: 0.999}
# and the relative Euclidean distance each may reach (runtime.relative_distance), as the cosine
# is blind to scale (a weight of 1e5 saturated to 65,504: 0.345). Measured: ppocrv4_det's
# output, the corpus's largest, 0.057 in both modes (docs/precision.md).
MAX_REL_DISTANCE = {FORCE_FP16: 0.1, ALLOW_FP32_TO_FP16: 0.1, ALLOW_MIX: 0.1}

_FLOAT = onnx.TensorProto.FLOAT
# what importer/quantised.py writes after an integer product: Cast, Mul by S, Add of C
DEQUANTISING_STEPS = ("Cast", "Mul", "Add")
# A --keep_dtype file names nodes of one model: a million names fit in 16 MiB
MAX_KEEP_DTYPE_BYTES = 16 << 20
KEEP_DTYPE_FIX = ("give one node name per line, or OpType::NAME for every op of that type "
                  "(ATC's --keep_dtype format)")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"unknown precision mode {mode!r}",
                         fix=f"choose one of {', '.join(MODES)} (ATC's --precision_mode)")
    return mode


def converts(mode: str) -> bool:
    return mode != MUST_KEEP


@dataclass(frozen=True)
class KeepDtype:
    """``--keep_dtype``: node names and op types whose ops keep their original precision."""

    nodes: frozenset[str] = frozenset()
    op_types: frozenset[str] = frozenset()
    source: str = ""  # the file it came from, for messages

    @property
    def lines(self) -> list[str]:
        """Its content in a canonical order (what the blob's provenance records)."""
        return sorted(self.nodes) + [f"OpType::{t}" for t in sorted(self.op_types)]

    def keeps(self, node: onnx.NodeProto) -> bool:
        return node.name in self.nodes or node.op_type in self.op_types

    def check_against(self, model: onnx.ModelProto) -> None:
        """Every line names a node or an op type of the model: a typo would keep nothing."""
        names = {n.name for n in model.graph.node}
        types = {n.op_type for n in model.graph.node}
        for name in sorted(self.nodes - names):
            raise UsageError(f"--keep_dtype names {name!r}, which is no node of the model",
                             where=self.source, fix=KEEP_DTYPE_FIX)
        for op_type in sorted(self.op_types - types):
            raise UsageError(f"--keep_dtype names OpType::{op_type}, and the model has no "
                             f"{op_type} op", where=self.source, fix=KEEP_DTYPE_FIX)


def read_keep_dtype(path) -> KeepDtype:
    """ATC's file: a node name per line, ``OpType::NAME`` for a type; blank lines ignored."""
    try:
        raw = read_regular(path, "--keep_dtype", KEEP_DTYPE_FIX, MAX_KEEP_DTYPE_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read --keep_dtype: {error}", where=str(path),
                         fix=KEEP_DTYPE_FIX) from None
    if len(raw) > MAX_KEEP_DTYPE_BYTES:
        raise UsageError(f"--keep_dtype is over {MAX_KEEP_DTYPE_BYTES // (1 << 20)} MiB",
                         where=str(path), fix=KEEP_DTYPE_FIX)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    types = {line.split("::", 1)[1].strip() for line in lines if line.startswith("OpType::")}
    if "" in types:
        raise UsageError("--keep_dtype has an OpType:: line without a type", where=str(path),
                         fix=KEEP_DTYPE_FIX)
    nodes = {line for line in lines if not line.startswith("OpType::")}
    return KeepDtype(frozenset(nodes), frozenset(types), str(path))


@dataclass(frozen=True)
class HalfIO:
    """ATC's ``--input_fp16_nodes`` (model inputs given in fp16) and ``--output_type FP16``
    (every float output in fp16); otherwise a converted model keeps its declared types at its
    boundary, a cast after each input and before each output."""

    inputs: tuple[str, ...] = ()
    outputs: bool = False

    def check_against(self, model: onnx.ModelProto, mode: str) -> None:
        if (self.inputs or self.outputs) and not converts(mode):
            raise UsageError("--input_fp16_nodes and --output_type FP16 give fp16 inputs or "
                             f"outputs to a converted model, and {MUST_KEEP} converts nothing",
                             fix="add --precision_mode force_fp16 (or another converting mode)")
        floats = {v.name for v in model.graph.input if v.type.tensor_type.elem_type == _FLOAT}
        for name in self.inputs:
            if name not in floats:
                raise UsageError(f"--input_fp16_nodes names {name!r}, which is no float32 input "
                                 f"of the model", fix="name float32 model inputs, separated by ';'")

    def kept_fp32(self, model: onnx.ModelProto) -> list[str]:
        """The converter's ``keep_io_types``: the boundary tensors that keep float32."""
        inputs = [v.name for v in model.graph.input if v.name not in self.inputs]
        return inputs + ([] if self.outputs else [o.name for o in model.graph.output])


def half_io(input_fp16_nodes: str | None, output_type: str | None) -> HalfIO:
    """ATC's spellings: ``--input_fp16_nodes "a;b"``, ``--output_type FP16`` or ``FP32``."""
    if output_type not in (None, "FP32", "FP16"):
        raise UsageError(f"--output_type {output_type!r} is not supported",
                         fix="give FP16 (every float output in fp16) or FP32 (the default); "
                             "ATC's per-output form is not read")
    inputs = tuple(n.strip() for n in (input_fp16_nodes or "").split(";") if n.strip())
    return HalfIO(inputs, output_type == "FP16")


@dataclass(frozen=True)
class Kept:
    """An op left in fp32 by a converting mode, and why."""

    node: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class Clamped:
    """A tensor with values beyond fp16's range: a weight the conversion saturates to +-65504
    (``node``: its first reader), or an activation an fp16 op makes infinite (``node``: its
    producer; ``beyond_fp16``)."""

    tensor: str
    node: str
    values: int
    largest: float


@dataclass(frozen=True)
class Conversion:
    mode: str
    kept: tuple[Kept, ...] = ()
    clamped: tuple[Clamped, ...] = ()


def to_half(model: onnx.ModelProto, mode: str, keep: KeepDtype = KeepDtype(),
            cube_fp32: bool = False, io: HalfIO = HalfIO()) -> tuple[onnx.ModelProto, Conversion]:
    """``model`` (the imported graph: names on every node, types on every tensor) converted by
    ``mode``; the original is not changed."""
    check_mode(mode)
    if not converts(mode):
        return model, Conversion(mode)
    from onnxruntime.transformers.float16 import convert_float_to_float16

    kept = _kept_in_fp32(model, mode, keep, cube_fp32)
    converted = convert_float_to_float16(
        onnx.ModelProto.FromString(model.SerializeToString()), keep_io_types=io.kept_fp32(model),
        max_finite_val=FP16_MAX, disable_shape_infer=True,
        node_block_list=[k.node for k in kept])
    converted = _sorted(_join_fp32_runs(converted))
    floats = _float_tensors(model)
    nodes = {n.name: n for n in model.graph.node}
    reported = tuple(k for k in kept if any(name in floats for name in
                                            [*nodes[k.node].input, *nodes[k.node].output]))
    return converted, Conversion(mode, reported, _clamped(model, {k.node for k in kept}))


def _join_fp32_runs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The converter casts every kept op's output to fp16 and back to fp32 for the next kept op
    (measured on magika's LayerNorm: its sums rounded to fp16 between two fp32 ops, a variance
    off by 8 %): a kept op reads the fp32 value itself; a cast to fp16 no op reads is dropped."""
    graph = model.graph
    # only the converter's own casts of a kept op's fp32 output: a model's Cast of an integer
    # (int64 -> fp16 once converted) read back in fp32 is no round trip (asr_frontend_nemo80)
    to_fp16 = {n.output[0]: n.input[0] for n in graph.node
               if _is_cast(n, onnx.TensorProto.FLOAT16) and _casts_fp32(n.name)}
    outputs = {o.name for o in graph.output}
    round_trips = {n.output[0]: to_fp16[n.input[0]] for n in graph.node
                   if _is_cast(n, _FLOAT) and n.input[0] in to_fp16}
    # one that gives a graph output keeps its name: it casts the fp32 value (to fp32) instead
    nodes = [n for n in graph.node if not (_is_cast(n, _FLOAT) and n.output[0] in round_trips
                                           and n.output[0] not in outputs)]
    for node in nodes:
        if _is_cast(node, _FLOAT) and node.output[0] in outputs & round_trips.keys():
            node.input[0] = round_trips[node.output[0]]
        node.input[:] = [round_trips.get(name, name) for name in node.input]
    read = {name for n in nodes for name in n.input} | outputs
    nodes = [n for n in nodes if not (_is_cast(n, onnx.TensorProto.FLOAT16)
                                      and n.output[0] in to_fp16 and n.output[0] not in read)]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _casts_fp32(node_name: str) -> bool:
    """One of the converter's casts of an fp32 value to fp16: a kept op's output, or a float32
    model input (``graph_input_castN``)."""
    prefix = INPUT_CAST.rstrip("_")
    return node_name.endswith(TO_FP16_NODE) or (
        node_name.startswith(prefix) and node_name[len(prefix):].isdigit())


def _is_cast(node: onnx.NodeProto, to: int) -> bool:
    return is_op(node, "Cast") and any(a.name == "to" and a.i == to for a in node.attribute)


def _sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """The converter appends its casts at the end: nodes in an order that runs (onnx's checker
    asks for one), by onnx-ir's stable topological sort."""
    import onnx_ir

    graph = onnx_ir.from_proto(model)
    graph.graph.sort()
    return onnx_ir.to_proto(graph)


# The converter's names for the tensors it adds (onnxruntime.transformers.float16), and the
# original tensor each stands for: an fp32 value of a kept op's output, a cast model input or
# output.
KEPT_SUFFIX = "_cast_to_fp16"
TO_FP16_NODE = KEPT_SUFFIX + "_node"
INPUT_CAST = "graph_input_cast_"
OUTPUT_CAST = "graph_output_cast_"


def original_name(name: str, inputs: Sequence[str], outputs: Sequence[str]) -> str:
    """The tensor of the original model a converted graph's tensor holds (in another type);
    ``inputs``, ``outputs``: the original model's, in order."""
    if name.startswith(INPUT_CAST) and name[len(INPUT_CAST):].isdigit():
        return inputs[int(name[len(INPUT_CAST):])]
    if name.startswith(OUTPUT_CAST) and name[len(OUTPUT_CAST):].isdigit():
        return outputs[int(name[len(OUTPUT_CAST):])]
    return name.removesuffix(KEPT_SUFFIX)


def beyond_fp16(converted: onnx.ModelProto, half: Mapping[str, bool],
                original: Mapping[str, np.ndarray], names) -> tuple[Clamped, ...]:
    """The converted graph's fp16 tensors whose values, in the original model's run on the
    verification inputs, are finite and beyond fp16's range: an fp16 op there gives an
    infinity (reported, never shipped silently). ``half``: which tensors are fp16."""
    producer = {out: node.name for node in converted.graph.node for out in node.output}
    found = []
    for name, is_half in half.items():
        value = original.get(original_name(name, *names)) if is_half else None
        if value is None or np.asarray(value).dtype.kind != "f":
            continue
        magnitudes = np.abs(np.asarray(value, dtype=np.float64))
        beyond = magnitudes[np.isfinite(magnitudes) & (magnitudes > FP16_MAX)]
        if beyond.size:
            found.append(Clamped(name, producer.get(name, name), int(beyond.size),
                                 float(beyond.max())))
    return tuple(found)


def _kept_in_fp32(model: onnx.ModelProto, mode: str, keep: KeepDtype, cube_fp32: bool
                  ) -> list[Kept]:
    """The ops that stay fp32, in graph (topological) order: a grey op under
    allow_mix_precision follows the ops before it."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    fp32: set[str] = set()
    kept = []
    made_by = {name: node for node in model.graph.node for name in node.output}
    for node in model.graph.node:
        if not node.name:
            raise ValueError(f"an imported {node.op_type} node has no name")  # importer's bug
        follows = any(name in fp32 for name in data_inputs(node.op_type, node.input))
        reason = (_by_keep(node, keep) or _by_runtime(node, DEFAULT_OP_BLOCK_LIST)
                  or _by_quantisation(node, made_by) or _by_mode(node, mode, cube_fp32, follows))
        if reason:
            kept.append(Kept(node.name, node.op_type, reason))
            fp32.update(node.output)
    return kept


def _by_keep(node, keep: KeepDtype) -> str:
    return "--keep_dtype names it" if keep.keeps(node) else ""


def _by_runtime(node, block_list) -> str:
    return ("onnxruntime's CPU provider has no fp16 kernel for it (the reference run needs one)"
            if node.op_type in block_list else "")


def _by_quantisation(node, made_by: Mapping[str, onnx.NodeProto]) -> str:
    """A quantisation and a dequantisation stay fp32 in every mode: the int8 integers they
    make are the QDQ model's own (an fp16 scale would move them a step), and ONNX takes their
    scale in the input's type. So does an integer product's dequantisation (its Cast, Mul by
    the scale and Add of the shift, ``importer/quantised.py``): the int32 accumulator passes
    fp16's range (a 1x1 convolution of 32 channels: 112,357), and rounding the sum to fp16
    moved the requantised int8 a step from onnxruntime's. The float ops between them follow
    the mode (docs/int8.md)."""
    if is_op(node, QUANTISATION_OPS):
        return "a (de)quantisation: its int8 integers are the quantised model's, made in fp32"
    chain = [node]  # back from the node through the dequantisation's Add, Mul and Cast
    while is_op(chain[-1], DEQUANTISING_STEPS) and chain[-1].input \
            and chain[-1].input[0] in made_by and len(chain) <= len(DEQUANTISING_STEPS):
        chain.append(made_by[chain[-1].input[0]])
    steps = [n.op_type for n in reversed(chain)]
    if steps[0] in INTEGER_CONTRACTIONS and steps[1:] == list(DEQUANTISING_STEPS[:len(steps) - 1]):
        return ("an integer product's dequantisation: its int32 accumulator passes fp16's "
                "range, and its sum is what the QDQ model quantises in fp32")
    return ""


def _by_mode(node, mode: str, cube_fp32: bool, follows_fp32: bool) -> str:
    if mode == ALLOW_FP32_TO_FP16:
        if kind_of(node.op_type) == MATMUL and not cube_fp32:
            return ""
        return ("allow_fp32_to_fp16 keeps it in fp32 (the chip's cube takes fp32)"
                if kind_of(node.op_type) == MATMUL else
                "allow_fp32_to_fp16 keeps vector ops in fp32")
    if mode == ALLOW_MIX:
        definition = op_def(node.op_type, node.domain)
        reduce = definition.precision_reduce if definition else None
        if reduce is False:
            return "allow_mix_precision computes it in fp32 (precision_reduce false)"
        if reduce is None and follows_fp32:
            return "allow_mix_precision: it follows its fp32 input"
    return ""


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    graph = model.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    names = {v.name for v in values if v.type.tensor_type.elem_type == _FLOAT}
    return names | {t.name for t in graph.initializer if t.data_type == _FLOAT}


def _clamped(model: onnx.ModelProto, kept: set[str]) -> tuple[Clamped, ...]:
    """Weights read by an op converted to fp16 that hold finite values beyond its range."""
    readers: dict[str, str] = {}
    for node in model.graph.node:
        if node.name not in kept:
            for name in node.input:
                readers.setdefault(name, node.name)
    found = []
    for tensor in model.graph.initializer:
        if tensor.data_type != _FLOAT or tensor.name not in readers:
            continue
        values = np.abs(numpy_helper.to_array(tensor))
        beyond = values[np.isfinite(values) & (values > FP16_MAX)]
        if beyond.size:
            found.append(Clamped(tensor.name, readers[tensor.name], int(beyond.size),
                                 float(beyond.max())))
    return tuple(found)
