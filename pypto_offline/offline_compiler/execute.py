"""The reference runtime: a blob's compiled graph executed on the host, the blob alone (no ONNX
model beside it). The contract a device loader implements is docs/runtime.md.

    execution = execute(gear_build, graph, inputs)   # outputs, how each kernel ran, the time

``CompiledModel.execute`` (api.py) picks the gear and calls this; ``run`` and the CLI's ``run``
use it, ``verify`` too (with every kernel as its ops: onnxruntime's check of the graph).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.runtime import run_model

# How a kernel ran: by its shipped PyPTO program, or as its ops in onnxruntime.
BY_PYPTO, BY_ONNXRUNTIME = "pypto", "onnxruntime"


@dataclass(frozen=True)
class KernelRun:
    """One fused kernel of an execution: how it ran (``BY_PYPTO`` or ``BY_ONNXRUNTIME``, with
    why not by PyPTO) and its host seconds (None when it ran inside a whole-graph session)."""

    id: str
    by: str
    why: str = ""
    seconds: float | None = None


@dataclass(frozen=True)
class Execution:
    """The outputs of one run of a gear's compiled graph (by the graph's output names, in its
    order), how each compiled kernel ran, and the host wall time of the whole run."""

    gear: int
    outputs: dict[str, np.ndarray]
    kernels: tuple[KernelRun, ...]
    seconds: float


def execute(gear: int, kernels: Sequence[ptom_pb2.Kernel], graph: onnx.ModelProto,
            inputs: Mapping[str, np.ndarray]) -> Execution:
    """Gear ``gear``'s compiled ``graph`` (its kernels' records: ``kernels``) run on
    ``inputs``, already checked against the graph's inputs. Every kernel runs as its ops in
    onnxruntime."""
    started = time.perf_counter()
    outputs = run_model(graph, inputs)
    kernels = tuple(KernelRun(k.id, BY_ONNXRUNTIME, "run as its ops")
                    for k in kernels if k.compiled)
    return Execution(gear, outputs, kernels, time.perf_counter() - started)
