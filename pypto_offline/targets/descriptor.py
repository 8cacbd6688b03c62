"""Immutable chip descriptors. Every figure carries its source; estimates say so.

Sources are the keys of ``shared/targets.md`` §0 (RT = hicann/runtime platform inis, WHEEL = the
pypto 0.2.0 wheel, PY = hicann/pypto, RM = Huawei's roadmap, GZ = a rumour page) and
``shared/pypto-cpu.md`` for what PyPTO 0.2.0 can express.
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
    """What the kernel generator (PyPTO 0.2.0 in Tensor mode) can express, per its CPU probe."""

    ops: frozenset[str]
    max_rank: int
    pad_modes: frozenset[str]
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

    def figures(self) -> dict[str, Figure]:
        return {k: v for k, v in vars(self).items() if isinstance(v, Figure)}

    def seconds_for_bytes(self, nbytes: int) -> float:
        return nbytes / (self.gm_bandwidth_gbps.value * 1e9)
