"""A region's simplified program → a readable PyPTO Tensor-mode module.

One ``@pypto.frontend.jit`` kernel per region: region inputs then outputs as typed
``pypto.Tensor`` arguments, one statement per op, ``out[:] = value`` for each output. It keeps within
PyPTO 0.2.0's limits (docs/pypto-ops.md):
- pads on any side and with any value as ``concat`` with ``full`` blocks;
- transposes as chains of axis swaps;
- broadcasts as ``expand_clone`` one axis at a time;
- casts to integers with ``CAST_TRUNC`` (ONNX rounds toward zero);
- strided slices through ``index_select``;
- constant Gathers as views concatenated in a plain ``for`` loop (no comprehension: the parser
  refuses them);
- a vector tile set before every op, from the tiling policy;
- a view (Split, Slice, crop) copied with ``clone`` before it is reshaped: PyPTO's SplitReshape
  pass takes minutes on a reshaped view (docs/compile-time.md, "Reshaped views").
A pattern outside these limits raises ``CannotExpress`` and the region falls back to unfused ops.

The modules: ``writer`` (the emitter and the shared dtype facts), ``layout`` (which shape each op
runs in), one per op kind with its own ``LOWERINGS`` table (``movement``, ``elementwise``,
``reduction``, ``matmul``), ``lowering`` (the merged table and the dispatch) and ``kernel`` (the
module text, ``kernel_source``).
"""
from pypto_offline.pypto_kernels.activations import literal as float_literal
from pypto_offline.pypto_kernels.codegen.elementwise import (BINARY, COMPARISONS,
                                                             FINITE_MAX, FLT_MAX, UNARY)
from pypto_offline.pypto_kernels.codegen.kernel import (ARGUMENT_SHAPES, KERNEL_FUNCTION,
                                                        VERIFIED_PASSES, kernel_source,
                                                        region_tolerance)
from pypto_offline.pypto_kernels.codegen.layout import (FLAT_ROW_BYTES,
                                                        assembled_outputs, flat_row,
                                                        flat_rows_change_the_tiling)
from pypto_offline.pypto_kernels.codegen.lowering import LOWERINGS, lowers
from pypto_offline.pypto_kernels.codegen.matmul import (HEADS_OUTWARD, MAX_UNROLLED_MATMULS,
                                                        BatchedLoop, batched_matmul_loop)
from pypto_offline.pypto_kernels.codegen.movement import MAX_CONCAT_INPUTS, swaps_for
from pypto_offline.pypto_kernels.codegen.reduction import REDUCTIONS, SOFTMAX_RESULTS
from pypto_offline.pypto_kernels.codegen.writer import (MAX_RANK, PYPTO_DTYPES, CannotExpress,
                                                        Writer, has_convolution,
                                                        is_scalar_constant, itemsize_of,
                                                        pypto_dtype)

__all__ = [
    "ARGUMENT_SHAPES", "BINARY", "BatchedLoop", "COMPARISONS", "CannotExpress",
    "FINITE_MAX", "FLAT_ROW_BYTES", "FLT_MAX", "HEADS_OUTWARD", "KERNEL_FUNCTION",
    "LOWERINGS", "MAX_CONCAT_INPUTS", "MAX_RANK", "MAX_UNROLLED_MATMULS", "PYPTO_DTYPES",
    "REDUCTIONS", "SOFTMAX_RESULTS", "UNARY", "VERIFIED_PASSES", "Writer", "assembled_outputs",
    "batched_matmul_loop", "flat_row", "flat_rows_change_the_tiling", "float_literal",
    "has_convolution", "is_scalar_constant", "itemsize_of", "kernel_source", "lowers",
    "pypto_dtype", "region_tolerance", "swaps_for",
]
