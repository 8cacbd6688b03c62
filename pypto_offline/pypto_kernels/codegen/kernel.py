"""A region's module text: the layout planned (``layout``), the arguments held, each op lowered
through the merged table (``lowering``) or the region written as a loop of 2-D matmuls
(``matmul.batched_matmul_loop``), each output stored, and the header and signature around it."""
from __future__ import annotations

from math import prod
from typing import Mapping

import numpy as np
import onnx

from pypto_offline.fusion.records import Region
from pypto_offline.fusion.rows import channel_rows, has_reduction
from pypto_offline.registry.ops import REDUCTION, definition, kind_of
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.jobs.protocol import ARGUMENT_SHAPES
from pypto_offline.pypto_kernels.tiling import TilePolicy
from pypto_offline.runtime import TOLERANCE
from pypto_offline.pypto_kernels.codegen.layout import (annotation, argument_shape,
                                                        assembled_outputs, conv_rows_of, flat_row,
                                                        row_layout_of, shapes_of,
                                                        share_assembled_inputs, within_rank)
from pypto_offline.pypto_kernels.codegen import reduction
from pypto_offline.pypto_kernels.codegen.bands import hold_band
from pypto_offline.pypto_kernels.codegen.lowering import lower
from pypto_offline.pypto_kernels.codegen.matmul import batched_matmul_loop, lower_batched_loop
from pypto_offline.pypto_kernels.codegen.writer import (MAX_RANK, CannotExpress, Writer,
                                                        is_scalar_constant)

# The passes whose lowered graph pass-verify interprets and compares with the tensor graph, besides
# the tensor graph itself (compared with onnxruntime's result): the last one before codegen, so
# the check spans the whole pipeline end to end. PyPTO's default also checks five intermediate
# passes, which only tell which pass broke and cost most of a checked compile (ppocrv4_det's
# 1x16x320x320 HardSwish region: 24 s with all passes, 9-14 s with this one, 3 s for the tensor
# graph alone). docs/compile-time.md.
VERIFIED_PASSES = ("CodegenPreproc",)
# Every kernel's function has this one name, so that two regions doing the same work give the
# same module text: one cache entry and one compile for both (IREE's dispatch deduplication).
KERNEL_FUNCTION = "kernel"
# ``ARGUMENT_SHAPES`` (jobs/protocol.py): the module constant listing every argument's shape when
# some argument is declared in a shape other than its tensor's (``Writer.declared``); the worker
# passes the same elements viewed so.


def kernel_source(region: Region, policy: TilePolicy, constants: Mapping[str, np.ndarray]) -> str:
    """The module text; ``constants`` are region inputs known at compile time (inlined if scalar)."""
    w = Writer(region, policy, constants)
    loop = batched_matmul_loop(region, constants)
    if loop is None or loop.softmax is None:  # an attention's loop lays out each head alone
        _plan_layout(w)
    inputs = _hold_inputs(w, bands_per_slice=loop is not None)
    outputs = {tensor: f"out{index}" for index, tensor in enumerate(region.outputs)}
    w.assembled = assembled_outputs(region)
    share_assembled_inputs(w)
    if loop is not None:
        lower_batched_loop(w, loop, inputs, outputs[loop.output])
    else:
        _lower_program(w, outputs)
    merge = [f"    pypto.set_pass_options(vec_nbuffer_setting={{-1: {policy.vec_merge}}})"] \
        if policy.vec_merge else []
    return "\n".join(_header(w, inputs, outputs) + merge + w.lines) + "\n"


def _plan_layout(w: Writer) -> None:
    """Flat rows where the policy asks for them, the rows of a region with reductions, or a
    convolution's or the channels' rows; channel rows cut along the row declare the kernel's
    arguments as those rows."""
    region, constants = w.region, w.constants
    if w.policy.flat_rows:
        w.row = flat_row(region, constants)
    if has_reduction(region.simplified):
        # a projection's LayerNorm is the one reduction, lowered as rows on its own
        w.rows = None if _normalised_projection(region) else row_layout_of(region)
    else:
        w.rows = conv_rows_of(region, w.policy) or channel_rows(region.simplified,
                                                                shapes_of(region))
    if w.rows is not None and w.rows.split_columns:  # channel rows: the arguments are rows
        w.declared.update({tensor: tuple(w.rows.shape(tensor))  # (a convolution's own
                           for tensor in region.inputs + region.outputs  # operands are not)
                           if tensor in w.rows.kinds
                           and not is_scalar_constant(tensor, constants)})
    w.declared.update({tensor: tuple(within_rank(w.shape(tensor)))
                       for tensor in region.inputs + region.outputs
                       if len(w.shape(tensor)) > MAX_RANK and tensor not in w.declared})


def _hold_inputs(w: Writer, bands_per_slice: bool) -> dict[str, str]:
    """Each region input held in its argument ``in<i>``, a scalar constant as a literal, a band
    written from its bounds (``bands.hold_band``; in a loop of matmuls, by each slice:
    ``matmul.lower_batched_loop``); the arguments by tensor."""
    inputs = {}
    for index, tensor in enumerate(w.region.inputs):
        if is_scalar_constant(tensor, w.constants):
            w.hold(tensor, float_literal(np.asarray(w.constants[tensor]).reshape(-1)[0]), ())
            continue
        if tensor in w.bands:
            if not bands_per_slice:
                hold_band(w, tensor, w.bands[tensor])
            continue
        inputs[tensor] = f"in{index}"
        w.hold(tensor, f"in{index}", w.declared.get(tensor, w.shape(tensor)))
    return inputs


# PyPTO's pass-verify compares a kernel's interpreted outputs with the reference within this
# absolute and relative error when none is given (pypto 0.2.0 config.py)
PYPTO_VERIFY_TOLERANCE = 1e-3


def region_tolerance(region: Region) -> float:
    """The functional check's bound: the per-dtype tolerance of the least precise type the
    region computes in, not only of its outputs (an fp16 kernel cast to an fp32 output carries
    fp16's error: docs/precision.md)."""
    def tolerance(elem_type: int) -> float:
        return TOLERANCE.get(str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))), 0.0)

    return max((tolerance(elem_type) for _, elem_type in region.tensor_types.values()),
               default=0.0)


def _verify_tolerance(region: Region) -> list[str]:
    """PyPTO's pass-verify held to the region's tolerance where it is wider than PyPTO's own
    (an fp16 softmax's 0.005 failed its 1e-3: docs/precision.md); other modules say nothing,
    as they always did."""
    tolerance = region_tolerance(region)
    if tolerance <= PYPTO_VERIFY_TOLERANCE:
        return []
    return [f"          \"pass_verify_error_tol\": [{tolerance!r}, {tolerance!r}],"]


def _header(w: Writer, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> list[str]:
    """The module's docstring, imports, verify options, argument shapes and signature."""
    arguments = [f"{name}: {annotation(w, tensor)}"
                 for tensor, name in [*inputs.items(), *outputs.items()]]
    header = [
        f'"""PyPTO kernel: {", ".join(op.op_type for op in w.region.original)}.',
        "",
        "Generated by pypto-offline; tiles chosen by its tiling policy. Compiled in SIM run mode",
        'under the target\'s platform (the blob records which: docs/platform.md)."""',
        "import os",
        "",
        "import pypto",
        "",
        "VERIFY = {\"enable_pass_verify\": os.environ.get(\"PYPTO_OFFLINE_VERIFY_DIR\") is not None,",
        f"          \"pass_verify_pass_filter\": {list(VERIFIED_PASSES)!r},",
        *_verify_tolerance(w.region),
        "          \"pass_verify_save_tensor_dir\": os.environ.get(\"PYPTO_OFFLINE_VERIFY_DIR\", \"\")}",
    ]
    if w.declared:
        shapes = [argument_shape(w, tensor) for tensor in [*inputs, *outputs]]
        header.append(f"{ARGUMENT_SHAPES} = {shapes!r}")
    return header + [
        "",
        "",
        "@pypto.frontend.jit(runtime_options={\"run_mode\": pypto.RunMode.SIM}, verify_options=VERIFY)",
        f"def {KERNEL_FUNCTION}({', '.join(arguments)}):",
    ]


def _normalised_projection(region: Region) -> bool:
    """A projection (MatMul, Gemm) with a LayerNorm before or after it, the region's one
    reduction (``fusion.normalising.normalising_prologue``, ``normalising_epilogue``)."""
    return any(definition(op.op_type).projection for op in region.simplified)


def _lower_program(w: Writer, outputs: Mapping[str, str]) -> None:
    """One statement per op, then ``out[:] = value`` for each output not assembled already."""
    for op in w.region.simplified:
        if w.rows is None and kind_of(op.op_type, op.params) == REDUCTION:
            shape = w.shape(op.inputs[0])
            reduction.lower_as_rows(w, op, prod(shape[:-1]), shape[-1])
            continue
        lower(w, op)
    for tensor, name in outputs.items():
        if tensor in w.assembled:
            continue
        value = _as_tensor(w, tensor)
        w.follow(argument_shape(w, tensor), w.dtype(tensor), [tensor])
        w.emit(f"{name}[:] = {value}")


def _as_tensor(w: Writer, tensor: str) -> str:
    """A region output must be a tensor value (not an inlined scalar) of PyPTO's rank. An output
    that is a kernel argument itself (the simplified program only renames or reshapes it) is
    copied through a full view: PyPTO refuses ``out[:] = in``."""
    if is_scalar_constant(tensor, w.constants):
        raise CannotExpress(f"output {tensor!r} is a compile-time constant")
    value = w.value(tensor, w.declared.get(tensor))
    if value.startswith("in"):
        shape = list(argument_shape(w, tensor))
        return f"pypto.view({value}, {shape}, {[0] * len(shape)})"
    return value
