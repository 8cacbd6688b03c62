"""The limits of what PyPTO 0.2.0 compiles and verifies in Tensor mode (docs/pypto-ops.md).

Which ops lower is the op registry's (``registry/ops.py``). Only constant padding. Elementwise
tensors are limited to rank 4 and transposes to rank 5; the kernel generator folds contiguous
axes, so fusion admits tensors up to rank 6 and the generator splits a region it cannot fold. A
matmul result of odd rows reshaped and transposed (tf_vit's keys, 65 tokens) did not compile
within 300 s, nor with 33 rows in 60 s, where 4, 20, 34, 36, 48 and 64 rows compile in under a
second (docs/pypto-ops.md, "MatMul").
"""
from pypto_offline.targets.descriptor import KernelSupport

PYPTO_0_2_0 = KernelSupport(
    max_rank=6,
    pad_modes=frozenset({"constant"}),
    matmul_reorder_align=2,
    source="docs/pypto-ops.md (op probe, 99 runs, fp32 and fp16)",
)
