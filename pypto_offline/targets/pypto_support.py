"""What PyPTO 0.2.0 compiles and verifies in Tensor mode (docs/pypto-ops.md).

Ops not listed failed to compile or were not probed (no ``pypto.tanh``, no erf, no pow; only
constant padding). Elementwise tensors are limited to rank 4 and transposes to rank 5; the kernel
generator folds contiguous axes, so fusion admits tensors up to rank 6 and the generator splits a
region it cannot fold.
"""
from pypto_offline.importer.ops import lowered_ops
from pypto_offline.targets.descriptor import KernelSupport

PYPTO_0_2_0 = KernelSupport(
    ops=lowered_ops(),  # what the kernel generator lowers (importer/ops.py), nothing more
    max_rank=6,
    pad_modes=frozenset({"constant"}),
    source="docs/pypto-ops.md (op probe, 99 runs, fp32 and fp16)",
)
