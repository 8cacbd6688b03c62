"""The report's kernel table: one row per distinct kernel (identical ones grouped ×N) with a
verdict a reader can act on: what fusing it gains, or why it fell back.

The gain is the PyPTO cost model's (the region's ops as one kernel each against the fused
kernel, both under the blob's platform) where the blob holds both figures; else the
target's estimate (docs/report.md, "Verdicts").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.offline_compiler.summary import (fallback_category, kernel_dtypes, measured,
                                                  tile_us)
from pypto_offline.report.tensors import UNKNOWN, TensorType

# Within this factor of 1 a kernel is "even": the cost model's noise, not a gain or a loss.
EVEN = 1.05


@dataclass(frozen=True)
class Verdict:
    kind: str                   # "pays", "even", "slower", "fell-back"
    text: str                   # "pays 3.1×", "fell back: compile failed"
    speedup: float | None       # unfused time / fused time
    basis: str                  # where the speed-up comes from
    estimate: bool              # rests on estimated figures
    reason: str = ""            # a fallback's whole reason
    category: str = ""          # and its category (summary.fallback_category)


def verdict(kernel: ptom_pb2.Kernel) -> Verdict:
    if not kernel.compiled:
        category = fallback_category(kernel)
        cut = ", cut in two" if kernel.HasField("cut") else ""
        return Verdict("fell-back", f"fell back: {category}{cut}", None, "", False,
                       kernel.fallback_reason, category)
    speedup, basis, estimate = _speedup(kernel)
    if speedup is None:
        return Verdict("even", "compiled (no time to compare)", None, basis, estimate)
    kind = "pays" if speedup >= EVEN else "slower" if speedup <= 1 / EVEN else "even"
    return Verdict(kind, f"{kind} {speedup:.1f}×", speedup, basis, estimate)


def _speedup(kernel: ptom_pb2.Kernel) -> tuple[float | None, str, bool]:
    fused, unfused = tile_us(kernel, "tuned_tile"), measured(kernel, "cost_us_unfused")
    if fused and unfused is not None:
        basis = kernel.cost_us_unfused_basis or "measured"
        return unfused / fused, f"PyPTO cost model, unfused {basis}", basis == "estimated"
    if kernel.est_time_us_fused > 0:
        return (kernel.est_time_us_unfused / kernel.est_time_us_fused,
                "target estimate (bytes and launches)", True)
    return None, "", False


@dataclass(frozen=True)
class Row:
    ids: tuple[str, ...]        # the kernels this row stands for, identical programs
    ops: tuple[str, ...]
    verdict: Verdict
    gm_bytes: int               # per kernel: measured from the program; fallen back, unfused
    gm_bytes_unfused: int
    time_us: float | None       # PyPTO cost model, tuned tile, per kernel
    dtypes: str = ""            # ``dtypes_text``

    @property
    def count(self) -> int:
        return len(self.ids)


def groups(message: ptom_pb2.CompiledModel, types: Mapping[str, TensorType]
           ) -> list[list[ptom_pb2.Kernel]]:
    """Kernels that run the same program on tensors of the same types, with the same outcome,
    in the order of their first kernel: the report shows each group once."""
    found: dict[tuple, list[ptom_pb2.Kernel]] = {}
    for kernel in message.kernels:
        key = (program(kernel, types), kernel.compiled, kernel.fallback_reason)
        found.setdefault(key, []).append(kernel)
    return list(found.values())


def program(kernel: ptom_pb2.Kernel, types: Mapping[str, TensorType]) -> tuple:
    """The kernel's simplified ops with each tensor named by its first use and its type: two
    transformer layers' attention kernels compare equal, though their tensors' names differ
    (the blob's region signature keeps the names)."""
    index: dict[str, int] = {}
    number = lambda name: index.setdefault(name, len(index))  # noqa: E731
    ops = tuple((op.op_type, op.params_json, tuple(map(number, op.inputs)),
                 tuple(map(number, op.outputs))) for op in kernel.simplified)
    return ops, tuple(types.get(name, UNKNOWN) for name in index)


def dtypes_text(kernel: ptom_pb2.Kernel, types: Mapping[str, TensorType]) -> str:
    """``float32, int8 → int8 (int32 accumulate)``: the distinct dtypes of a kernel's inputs and
    of its outputs (``summary.kernel_dtypes``), and its integer matmul's accumulator."""
    dtypes = kernel_dtypes(kernel, {name: t.dtype for name, t in types.items()})
    distinct = lambda names: ", ".join(dict.fromkeys(names))  # noqa: E731
    accumulate = f" ({dtypes['accumulate']} accumulate)" if dtypes["accumulate"] else ""
    return f"{distinct(dtypes['in'])} → {distinct(dtypes['out'])}{accumulate}"


def rows(grouped: list[list[ptom_pb2.Kernel]], types: Mapping[str, TensorType] | None = None
         ) -> list[Row]:
    """One row per group of ``groups``."""
    return [_row(kernels, types or {}) for kernels in grouped]


def _row(kernels: list[ptom_pb2.Kernel], types: Mapping[str, TensorType]) -> Row:
    first = kernels[0]
    measured_bytes = first.gm_bytes_read + first.gm_bytes_written
    return Row(tuple(k.id for k in kernels), tuple(op.op_type for op in first.original),
               verdict(first), measured_bytes if first.compiled else first.gm_bytes_unfused,
               first.gm_bytes_unfused, tile_us(first, "tuned_tile"), dtypes_text(first, types))
