"""Immutable chip descriptors. Every figure carries its source; estimates say so.

Sources are the keys of docs/target-sources.md (RT = hicann/runtime platform inis, WHEEL = the
pypto 0.2.0 wheel, PY = hicann/pypto, RM = Huawei's roadmap, GZ = a rumour page) and
docs/pypto-ops.md for what PyPTO 0.2.0 can express.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    """A number with where it comes from; ``estimate`` marks values not found in any source."""

    value: Any
    source: str
    estimate: bool = False

    def __str__(self) -> str:
        return f"{self.value} (estimate: {self.source})" if self.estimate else \
            f"{self.value} ({self.source})"


@dataclass(frozen=True)
class KernelSupport:
    """Limits of what the kernel generator (PyPTO 0.2.0 in Tensor mode) can express, per its CPU
    probe. Which ops it lowers is the op registry's (``registry/ops.py``): one generator serves
    every target."""

    max_rank: int
    pad_modes: frozenset[str]
    # A matmul's epilogue may reorder axes (Transpose, DepthToSpace) only when the matmul's
    # output rows and columns are multiples of this many elements.
    matmul_reorder_align: int
    source: str


@dataclass(frozen=True)
class Target:
    name: str
    soc_version: Figure
    npu_arch: Figure
    ai_cores: Figure
    ub_bytes: Figure
    ub_plan_bytes: Figure  # UB less a reserved margin: what tiling may fill
    gm_bandwidth_gbps: Figure
    launch_overhead_us: Figure
    dtypes: Figure  # element types a kernel may read or write (numpy names)
    kernels: KernelSupport
    notes: str = ""
    # The rest of each chip's description (one core's GM port, gm_bytes_per_cycle_per_core at
    # clock_mhz, costs a convolution's staging: fusion/cost.why_staging_does_not_pay).
    cce_arch: Figure | None = None
    aiv_cores: Figure | None = None
    ai_cpus: Figure | None = None  # the AI CPUs that schedule its tasks (0: none on the chip)
    coupled: Figure | None = None
    clock_mhz: Figure | None = None
    l1_bytes: Figure | None = None
    l0a_bytes: Figure | None = None
    l0b_bytes: Figure | None = None
    l0c_bytes: Figure | None = None
    l2_bytes: Figure | None = None
    ub_block_bytes: Figure | None = None
    vector_bytes_per_cycle: Figure | None = None
    cube_mkn_fp16: Figure | None = None
    gm_bytes_per_cycle_per_core: Figure | None = None
    max_block_dim: Figure | None = None
    gm_atomics: Figure | None = None
    hw_cross_core_sync: Figure | None = None
    packaging: Figure | None = None
    # The precision mode its own offline compiler uses when none is given (ATC's
    # --precision_mode; docs/precision.md), and whether its cube takes fp32 operands (what
    # allow_fp32_to_fp16 keeps in fp32 on it)
    precision_mode: Figure | None = None
    cube_fp32: Figure | None = None
    # Which platform PyPTO compiles this target's kernels under (docs/platform.md): the chip's
    # own ("chip"), or PyPTO 0.2.0's 910B platform ("910b"), which every target compiled under
    # before; the second is a build's comparison (--compare-platform), not a chip's figure.
    pypto_platform: str = "chip"

    def figures(self) -> dict[str, Figure]:
        """Every figure the descriptor carries (those not known for this chip are absent)."""
        return {k: v for k, v in vars(self).items() if isinstance(v, Figure)}

    def seconds_for_bytes(self, nbytes: int) -> float:
        return nbytes / (self.gm_bandwidth_gbps.value * 1e9)

    def seconds_for_bytes_on_one_core(self, nbytes: int) -> float:
        """At one AI core's GM port (its bytes per cycle at its clock), where the chip gives
        both; else at the chip's bandwidth."""
        if self.gm_bytes_per_cycle_per_core is None or self.clock_mhz is None:
            return self.seconds_for_bytes(nbytes)
        return nbytes / (self.gm_bytes_per_cycle_per_core.value * self.clock_mhz.value * 1e6)
