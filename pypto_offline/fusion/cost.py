"""The cost model: per kernel one launch plus its global-memory bytes at the target's bandwidth.

    time = launches × launch overhead + bytes ÷ bandwidth

A node's kernel reads its data inputs and writes its outputs; reshape-like nodes are metadata on
contiguous data and cost nothing. A fused region's lower bound writes its outputs once and reads
once the input elements they depend on (docs/figures.md). The target's bandwidth and launch
overhead are mostly estimates (see targets/).
"""
from __future__ import annotations

from math import prod
from typing import Iterable, Mapping, Sequence

import numpy as np

from pypto_offline.fusion.classify import kernel_dtype, node_tensors
from pypto_offline.fusion.records import Cost, RegionOp
from pypto_offline.fusion.rows import broadcasts_to
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.importer.input_shapes import tensor_bytes as bytes_of
from pypto_offline.registry.attributes import attribute, register
from pypto_offline.registry.ops import (MATMUL, READS_ALL, READS_WINDOW, contraction_shape,
                                        definition, is_depthwise_conv, kind_of, reads_of,
                                        stride_one_span)
from pypto_offline.targets import ASCEND910B, Target

# The cube of the 910B that PyPTO 0.2.0 compiles for: product tiles accumulate in fp32 in L0C,
# each side a whole number of 16-element fractals, an operand tile within L0A or L0B
# (targets/ascend, docs/figures.md). The kernel generator's cube tiles use the same figures.
CUBE_FRACTAL = 16
CUBE_ACCUMULATOR_BYTES = 4
L0C_BYTES = ASCEND910B.l0c_bytes.value
L0_BYTES = min(ASCEND910B.l0a_bytes.value, ASCEND910B.l0b_bytes.value)


def time_us(kernels: int, gm_bytes: int, target: Target) -> float:
    return kernels * target.launch_overhead_us.value + target.seconds_for_bytes(gm_bytes) * 1e6


def tensor_bytes(graph: ImportedGraph, names: Iterable[str]) -> int:
    return sum(graph.tensors[name].nbytes for name in names
               if name in graph.tensors and graph.tensors[name].shape is not None)


def node_cost(node: Node, graph: ImportedGraph, target: Target) -> Cost:
    if definition(node.op_type, node.domain).view_only:
        return Cost(0, 0, 0.0)
    gm_bytes = tensor_bytes(graph, node_tensors(node))
    return Cost(1, gm_bytes, time_us(1, gm_bytes, target))


def total(costs: Iterable[Cost], target: Target) -> Cost:
    costs = list(costs)
    kernels = sum(c.kernels for c in costs)
    gm_bytes = sum(c.gm_bytes for c in costs)
    return Cost(kernels, gm_bytes, time_us(kernels, gm_bytes, target))


def fused_cost(inputs: Iterable[str], outputs: Iterable[str], graph: ImportedGraph,
               target: Target, ops: Sequence[RegionOp] = ()) -> Cost:
    """The lower bound (docs/figures.md): outputs written once and, of each input, the elements
    some output depends on read once (``ops``, the region's program, tells which: all of them
    but for what a Slice, a cropping Pad or a pooling's windows leave out, the registry's
    ``reads``). A one-element constant is not read from global memory: the kernel
    holds it as an immediate (codegen's scalar constants), nor is a band (importer/bands.py). Either way a count above what any
    kernel must move would let a compiled kernel measure below its "lower bound"."""
    outputs = list(outputs)
    read = [name for name in inputs if not _immediate(name, graph)]
    needed = needed_elements(ops, read, outputs, graph)
    gm_bytes = sum(kernel_bytes(graph, name, needed[name]) for name in read if name in needed) \
        + sum(kernel_bytes(graph, name) for name in outputs
              if name in graph.tensors and graph.tensors[name].shape is not None)
    return Cost(1, gm_bytes, time_us(1, gm_bytes, target))


def kernel_bytes(graph: ImportedGraph, name: str, elements: int | None = None) -> int:
    """Bytes of ``elements`` of the tensor (all of them by default) as a kernel moves them: an
    int64 tensor as int32 (``classify.kernel_dtype``). asr_frontend_kaldi's index arithmetic on
    int64 [1, 200] tensors moved 3,204 B against a lower bound of 6,408 counted at 8 bytes an
    element."""
    info = graph.tensors[name]
    return bytes_of(info.shape if elements is None else (elements,), kernel_dtype(info.dtype))


def cube_reread_bytes(ops: Sequence[RegionOp], tensor_types) -> int:
    """GM bytes a kernel's matmuls must read beyond each operand once, on the 910B PyPTO 0.2.0
    compiles for: the cube reads the left operand once per N tile of the product and the right
    one once per M tile, each cube task on its own, and a product tile accumulates in L0C
    (128 KiB). The least over every tile that fits L0C (and L0A/L0B with a one-fractal K
    side), per matmul (per slice of a batched one): a 1x1 convolution of 192 filters over a
    1600-pixel image in fp32 re-reads its 147 KiB weight at least 12 times. What the kernel's
    own tiles re-read beyond this floor is the generator's (``tiling.cube_tiles``); the floor is
    the platform's (docs/figures.md, "The platform bound")."""
    total = 0
    for op in ops:
        if kind_of(op.op_type, op.params) != MATMUL:
            continue
        (left, left_dtype), (right, right_dtype) = (tensor_types[t] for t in op.inputs[:2])
        out = list(tensor_types[op.outputs[0]][0])
        left_bytes, right_bytes = bytes_of((), left_dtype), bytes_of((), right_dtype)
        m, n, k, slices = contraction_shape(op.op_type, left, right, out)
        if definition(op.op_type).convolution:  # its weights are the left factor
            left_bytes, right_bytes = right_bytes, left_bytes
        total += slices * min(
            operand_rereads(m, k, n, m_side, n_side, left_bytes, right_bytes)
            for m_side, n_side in product_tiles(L0C_BYTES, max(left_bytes, right_bytes)))
    return total


def operand_rereads(m: int, k: int, n: int, m_side: int, n_side: int, left_bytes: int,
                    right_bytes: int) -> int:
    """Bytes an m x k x n matmul's cube reads beyond each operand once under product tiles of
    ``m_side`` x ``n_side``: the left operand once per N tile, the right one once per M tile."""
    return m * k * left_bytes * (-(-n // n_side) - 1) \
        + k * n * right_bytes * (-(-m // m_side) - 1)


def product_tiles(product_bytes: int, itemsize: int, n_cap: int | None = None,
                  m: int | None = None) -> list[tuple[int, int]]:
    """Each M side of whole fractals with the widest N side whose fp32 product tile holds in
    ``product_bytes``, both within L0A and L0B (a side by the 16-element K side at the least);
    with ``m``, only sides that divide it or cover it: ppocrv4_det's 384-filter Conv under M
    tiles of 224 and 160 wrote its product once more than under two of 192 (docs/pypto-ops.md,
    "MatMul")."""
    widest = L0_BYTES // (CUBE_FRACTAL * itemsize) // CUBE_FRACTAL * CUBE_FRACTAL
    tiles = []
    for m_side in range(CUBE_FRACTAL, widest + 1, CUBE_FRACTAL):
        if m is not None and m % m_side and m_side < m:
            continue  # M tiles of one size: a last, partial one staged the product through GM
        n_side = min(widest, n_cap or widest,
                     product_bytes // (CUBE_ACCUMULATOR_BYTES * m_side) // CUBE_FRACTAL
                     * CUBE_FRACTAL)
        if n_side >= CUBE_FRACTAL:
            tiles.append((m_side, n_side))
    return tiles


def cube_handoff_bytes(ops: Sequence[RegionOp], tensor_types) -> int:
    """GM bytes a kernel moves beyond its lower bound because PyPTO 0.2.0 compiles for the
    Ascend 910B, whose cube and vector cores are separate: a matmul product that a vector op
    reads is written to GM by the cube core and read back by a vector core (a Conv's bias is
    such a vector op). Nothing a kernel generator can avoid; a matmul whose product is the
    kernel's output alone, or whose bias the cube adds, moves none (docs/pypto-ops.md,
    "MatMul")."""
    readers = {name for op in ops for name in op.inputs}
    handoff = 0
    for op in ops:
        if kind_of(op.op_type, op.params) != MATMUL:
            continue
        product = op.outputs[0]
        vector_bias = definition(op.op_type).convolution and len(op.inputs) > 2 \
            and bool(op.inputs[2])
        if product in readers or vector_bias:
            handoff += 2 * bytes_of(*tensor_types[product])
    return handoff


# A strided convolution's taps view the padded image's stride phases once their reads reach
# this many bytes (codegen/convolution._StridePhases); below it each tap views its stride-1
# span and gathers every s-th row and column. Measured with PyPTO's cost model on kirin9050
# (docs/pypto-ops.md, "Strided convolutions"): the phases' extra steps cost small images more
# time than the bytes they save (taps' reads of 18 KB: 38.9 -> 71.2 us; 74 KB: 96.0 -> 111.8
# us for 670 -> 405 KB moved); from 115 KB they pay in time as in bytes (3x3 32->64 on 20x20:
# 256.8 -> 169.4 us, 1.86 -> 1.22 MB).
STRIDE_PHASES_FROM_BYTES = 96 * 1024


def reads_stride_phases(params: Mapping, channels: int, out, itemsize: int) -> bool:
    """Whether a strided convolution's kernel reads its taps from the padded image's stride
    phases: its taps' reads (each tap ``channels`` planes of the output's extent) reach
    ``STRIDE_PHASES_FROM_BYTES``."""
    reads = prod(params["kernel_shape"]) * channels * prod(out[2:]) * itemsize
    return max(params["strides"]) > 1 and reads >= STRIDE_PHASES_FROM_BYTES


def staging_bytes(op: Node, image, out, itemsize: int) -> int:
    """GM bytes a convolution's kernel moves beyond its lower bound because PyPTO 0.2.0 takes
    no view of a tile in UB (docs/pypto-ops.md, "Depthwise convolution"): the padded image
    written by each padding step and read back by the next, each tap's view of it (its
    stride-1 span, or with stride phases its output's extent and the phases written once:
    ``reads_stride_phases``), and for a convolution on the cube its taps' columns written and
    read by the cube; the bound reads the image once. Below what PyPTO measures (3x3
    depthwise, C=32, 40x40: 2.77 MB estimated, 3.23 measured beyond the bound; 3x3 16->32,
    stride 2, 32x32: 0.89 MB, 0.95 measured), so a bound too. 0 for any other op and for a
    1x1 convolution (the image is the cube's operand as it is)."""
    if not definition(op.op_type).convolution or not op.params:
        return 0
    channels, height, width = image[1:]
    top, left, bottom, right = op.params["pads"]
    taps = prod(op.params["kernel_shape"])
    phased = reads_stride_phases(op.params, channels, out, itemsize)
    span = prod(out[2:]) if phased else prod(stride_one_span(out, op.params["strides"])[2:])
    moved = taps * channels * span
    padded = channels * (height + top + bottom) * (width + left + right)
    # each padding step (pad the bottom and right, a zero strip to the left, one on top:
    # codegen/convolution._padded) writes the padded image, and the next reads it back
    steps = bool(bottom or right) + bool(left) + bool(top)
    moved += (2 * steps - 1) * padded if steps else 0
    if phased:  # the padded image reshaped to rows of phases, and the phases gathered
        moved += 2 * padded
    if not is_depthwise_conv(op.op_type, op.params):
        moved += 2 * taps * channels * prod(out[2:])
    return max(moved - prod(image), 0) * itemsize


def why_staging_does_not_pay(node: Node, graph: ImportedGraph, target: Target) -> str | None:
    """Why a convolution stays out of kernels: what its kernel stages through GM
    (``staging_bytes``) costs more than the most fusing it saves, a launch and its output's
    round trip to GM (written by it, read by its epilogue). None when it may pay.

    The staging is costed at one AI core's GM port, not the chip's bandwidth: PyPTO's cost
    model moves it at 8-17 GB/s on kirin9050 and 9-25 GB/s on the 910B (staged bytes over the
    whole kernel's time, so a ceiling), where the chip's figures say 50 and 1,420 GB/s; at the
    chip's rate fp16 halved the estimate and fused convolutions whose kernels then cost more
    than the fp32 build's (docs/regions.md, "Whether it pays")."""
    image, out = graph.tensors[node.inputs[0]], graph.tensors[node.outputs[0]]
    # the image's element is what is staged (an int8 one for a ConvInteger, int32 out)
    staged = staging_bytes(node, image.shape, out.shape, image.np_dtype.itemsize)
    if not staged:
        return None
    cost = target.seconds_for_bytes_on_one_core(staged) * 1e6
    saved = time_us(1, 2 * out.nbytes, target)
    if cost < saved:
        return None
    return (f"its kernel would stage {staged} B through GM ({cost:.1f} us at one core's GM "
            f"port: PyPTO 0.2.0 takes no view of a tile in UB), more than the {saved:.1f} us "
            "fusing saves (a launch and its output's round trip)")


def _immediate(name: str, graph: ImportedGraph) -> bool:
    """A constant the kernel holds in its source: one element, or a band it writes from
    bounds (``ImportedGraph.made_in_kernel``)."""
    return name in graph.made_in_kernel


def needed_elements(ops: Sequence[RegionOp], inputs: Sequence[str], outputs: Sequence[str],
                    graph: ImportedGraph) -> dict[str, int]:
    """Per input, how many of its elements the outputs depend on: masks propagated from the
    outputs back through the program. Without a program every element counts."""
    shape = lambda name: tuple(graph.tensors[name].shape)  # noqa: E731
    if not ops:
        return {name: int(np.prod(shape(name), dtype=np.int64)) for name in inputs
                if graph.tensors[name].shape is not None}
    masks = {name: np.ones(shape(name), bool) for name in outputs}
    for op in reversed(ops):
        wanted = [masks.get(name) for name in op.outputs]
        if all(m is None for m in wanted):
            continue
        for index, name in enumerate(op.inputs):
            if name and graph.tensors.get(name) is not None and graph.tensors[name].shape \
                    is not None:
                need = _input_needs(op, index, wanted, shape(name))
                masks[name] = need if name not in masks else masks[name] | need
    return {name: int(masks[name].sum()) if name in masks else 0 for name in inputs}


# The elements of an op's (first) input its wanted output elements need, where an exact rule
# says (registered with the op): ``(op, wanted output mask, input shape) -> input mask``
INPUT_NEEDS = "input_needs"
# When an op that may leave part of its input unread (``OpDef.reads``) reads it all
READS_ALL_WHEN = "reads_all_when"
register(INPUT_NEEDS, "Transpose")(
    lambda op, out, in_shape: out.transpose(np.argsort(op.params["perm"])))
register(READS_ALL_WHEN, "Pad")(lambda op: min(op.params.get("pads", (-1,))) >= 0)  # no crop


def _input_needs(op: RegionOp, index: int, wanted: list, in_shape: tuple) -> np.ndarray:
    """The elements of input ``index`` that the wanted output elements depend on, or a subset
    of them where no exact rule applies (never a superset: the bound must stay a bound)."""
    out = wanted[0] if len(wanted) == 1 else None
    if out is not None and definition(op.op_type).view_only and index == 0:
        return out.reshape(in_shape)
    exact = attribute(INPUT_NEEDS, op.op_type)
    if out is not None and exact is not None and index == 0:
        return exact(op, out, in_shape)
    if out is not None and definition(op.op_type).pointwise and broadcasts_to(in_shape, out.shape):
        return _reduce_to(out, in_shape)
    reads = reads_of(op.op_type, op.params)
    if out is not None and reads == READS_WINDOW and index == 0:
        return _window_needs(op, out, in_shape)
    # An op that may leave some of its input unread counts none of it without an exact rule (a
    # loose bound is still a bound; a count too high is not); a Pad that crops nothing reads all,
    # and so does a window op its parameters (a depthwise convolution's weights and bias)
    reads_all = reads == READS_ALL or (reads == READS_WINDOW and index > 0) or (
        index == 0 and attribute(READS_ALL_WHEN, op.op_type, lambda op: False)(op))
    every_output = all(m is not None and m.all() for m in wanted)
    return np.full(in_shape, reads_all and every_output)


def _window_needs(op: RegionOp, out: np.ndarray, in_shape: tuple) -> np.ndarray:
    """The elements of a pooling's or depthwise convolution's NCHW input that the windows of
    the wanted outputs cover: not the padding, nor a tail the strides step over (a 2x2/2 window
    over 5 rows reads 4), nor the rows a dilated window steps over."""
    (kh, kw), (sh, sw) = op.params["kernel_shape"], op.params["strides"]
    dh, dw = op.params.get("dilations", (1, 1))
    top, left = op.params["pads"][:2]
    height, width = in_shape[2:]
    need = np.zeros(in_shape, bool)
    for dy in range(kh):
        rows = np.arange(out.shape[2]) * sh + dy * dh - top
        row_ok = (rows >= 0) & (rows < height)
        for dx in range(kw):
            cols = np.arange(out.shape[3]) * sw + dx * dw - left
            col_ok = (cols >= 0) & (cols < width)
            covered = out[:, :, row_ok][:, :, :, col_ok]
            need[:, :, rows[row_ok][:, None], cols[col_ok]] |= covered
    return need


def _slice_window(op: RegionOp, out: np.ndarray, in_shape: tuple) -> np.ndarray:
    need = np.zeros(in_shape, bool)
    window = tuple(slice(start, None if end < 0 else end, step) for start, end, step in
                   zip(op.params["starts"], op.params["ends"], op.params["steps"]))
    need[window] = out
    return need


register(INPUT_NEEDS, "Slice")(_slice_window)


def _reduce_to(out: np.ndarray, in_shape: tuple) -> np.ndarray:
    extra = out.ndim - len(in_shape)
    need = out.any(axis=tuple(range(extra))) if extra else out
    axes = tuple(i for i, size in enumerate(in_shape) if size == 1 and need.shape[i] != 1)
    return need.any(axis=axes, keepdims=True) if axes else need
