"""A gear's modelled device time, from the blob alone (``pypto-offline run``, docs/runtime.md):
what one run would take on the target by the figures the build recorded, never measured here.

    time = modelled_time(message, gear)      # time.total_us, time.kernels, time.unfused_us

Per compiled kernel: PyPTO's cost-model time of its tuned tile (``TileChoice.aicore_us``, a
simulation of the chip) plus one launch (the target's ``launch_overhead_us``, an estimate). The
ops left unfused: the build's bandwidth model (``Totals.est_time_us_after``, a launch per op and
its bytes at the chip's GM bandwidth) less the compiled kernels' share of it, so each op is
counted once. The target's figures are the ones the blob records, not this version's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pypto_offline.offline_compiler import gears as gear_table
from pypto_offline.offline_compiler import ptom_pb2

# How a kernel's own time was had: PyPTO's simulation of its compiled program, or (a kernel whose
# simulation gave no figure) the bandwidth model's time for the bytes its program moves
BY_COST_MODEL, BY_BANDWIDTH = "pypto cost model", "bandwidth estimate"


@dataclass(frozen=True)
class KernelTime:
    id: str
    kernel_us: float
    launch_us: float
    basis: str  # BY_COST_MODEL or BY_BANDWIDTH

    @property
    def total_us(self) -> float:
        return self.kernel_us + self.launch_us


@dataclass(frozen=True)
class DeviceTime:
    """One run of a gear on the target, modelled: its compiled kernels and its unfused ops."""

    kernels: tuple[KernelTime, ...]
    unfused_us: float       # the ops left out of kernels, by the bandwidth model
    unfused_ops: int
    launch_us: float        # the target's launch cost per kernel (the blob's figure)
    launch_estimate: bool   # that figure is an estimate (every target's is, today)

    @property
    def total_us(self) -> float:
        return sum(k.total_us for k in self.kernels) + self.unfused_us

    def as_dict(self) -> dict:
        """The ``--json`` form (summary.schema.json, ``run``'s ``device``)."""
        return {"total_us": round(self.total_us, 3), "unfused_us": round(self.unfused_us, 3),
                "unfused_ops": self.unfused_ops, "launch_us": self.launch_us,
                "estimate": True,
                "kernels": [{"id": k.id, "kernel_us": round(k.kernel_us, 3),
                             "launch_us": k.launch_us, "total_us": round(k.total_us, 3),
                             "basis": k.basis} for k in self.kernels]}


def modelled_time(message: ptom_pb2.CompiledModel, gear: int) -> DeviceTime:
    """Gear ``gear``'s modelled device time (the module's docstring says how)."""
    figures = {f.name: f for f in message.target.figures}
    launch = float(json.loads(figures["launch_overhead_us"].value))
    bytes_per_us = float(json.loads(figures["gm_bandwidth_gbps"].value)) * 1e3
    build = gear_table.build_of(message, gear)
    kernels = tuple(_kernel_time(k, launch, bytes_per_us)
                    for k in gear_table.gear_kernels(message, gear) if k.compiled)
    # est_time_us_after counts each compiled kernel as a launch and the bytes its program moves
    # (offline_compiler/messages.totals_message); what is left is the unfused ops' launches and bytes
    modelled_kernels = sum(launch + _moved(k) / bytes_per_us
                           for k in gear_table.gear_kernels(message, gear) if k.compiled)
    unfused_us = max(0.0, build.totals.est_time_us_after - modelled_kernels)
    return DeviceTime(kernels, unfused_us, len(build.unfused), launch,
                      figures["launch_overhead_us"].estimate)


def _kernel_time(kernel: ptom_pb2.Kernel, launch: float, bytes_per_us: float) -> KernelTime:
    if kernel.tuned_tile.HasField("aicore_us"):
        return KernelTime(kernel.id, kernel.tuned_tile.aicore_us, launch, BY_COST_MODEL)
    return KernelTime(kernel.id, _moved(kernel) / bytes_per_us, launch, BY_BANDWIDTH)


def _moved(kernel: ptom_pb2.Kernel) -> int:
    return kernel.gm_bytes_read + kernel.gm_bytes_written
