"""The reference runtime: a blob's compiled graph executed on the host, the blob alone (no ONNX
model beside it). The contract a device loader implements is docs/runtime.md; how a kernel runs
here is its section "The reference runtime: how a kernel runs on the host".

    execution = execute(gear, records, graph, inputs, imported=..., target=...)
    execution.outputs, execution.kernels, execution.seconds

``CompiledModel.execute`` (api.py) picks the gear and calls this; ``run`` and the CLI's ``run``
use it (``kernels="pypto"``), ``verify`` too (``kernels="onnxruntime"``: every kernel as its
ops, onnxruntime's check of the graph, no PyPTO needed).

With ``kernels="pypto"`` the compiled graph is walked in its order: each call of a compiled
kernel runs its shipped program in a PyPTO worker (a SIM compile of the kernel's source at its
shipped tile with pass-verify on, whose interpreter fills the outputs: docs/pypto-recipes.md;
PyPTO 0.2.0 cannot load a compiled program back), on the values its inputs took; the nodes
between two such calls run in onnxruntime as one sub-model. A kernel PyPTO cannot run (PyPTO
missing, its source not the generator's, the worker failing) runs as its ops in onnxruntime
instead, its ``KernelRun`` saying why: the outputs are right either way.
"""
from __future__ import annotations

import importlib.util
import shutil
import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pypto_offline.errors import UsageError, WorkerCannotStart
from pypto_offline.fusion.lower import DOMAIN
from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.runtime import run_model

# How a kernel ran: by its shipped PyPTO program, or as its ops in onnxruntime.
BY_PYPTO, BY_ONNXRUNTIME = "pypto", "onnxruntime"
AS_ASKED = "run as its ops, as asked (kernels='onnxruntime')"


@dataclass(frozen=True)
class KernelRun:
    """One fused kernel of an execution: how it ran (``BY_PYPTO`` or ``BY_ONNXRUNTIME``, with
    why not by PyPTO) and its host seconds (None when it ran inside an onnxruntime session)."""

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


def execute(gear: int, records: Sequence[ptom_pb2.Kernel], graph: onnx.ModelProto,
            inputs: Mapping[str, np.ndarray], kernels: str = BY_PYPTO, *,
            imported: bytes = b"", target: str = "", cache_dir=None,
            timeout: float | None = None) -> Execution:
    """Gear ``gear``'s compiled ``graph`` (its kernels' records: ``records``) run on
    ``inputs``, already checked against the graph's inputs. ``kernels``: ``"pypto"``, each
    compiled kernel by its shipped program, derived from the gear's imported graph
    ``imported`` for the target named ``target`` (as verify derives it), in PyPTO workers
    staged in the kernel cache ``cache_dir`` (default: the user's; its host g++ cache is
    reused) within ``timeout`` seconds a kernel; or ``"onnxruntime"``, every kernel as its
    ops."""
    if kernels not in (BY_PYPTO, BY_ONNXRUNTIME):
        raise ValueError(f"kernels must be {BY_PYPTO!r} or {BY_ONNXRUNTIME!r}, not {kernels!r}")
    started = time.perf_counter()
    compiled = [k for k in records if k.compiled]
    why_not = AS_ASKED if kernels == BY_ONNXRUNTIME else _pypto_missing()
    if why_not or not compiled:  # one onnxruntime session for the whole graph
        outputs = run_model(graph, inputs)
        runs = tuple(KernelRun(k.id, BY_ONNXRUNTIME, why_not) for k in compiled)
    else:
        outputs, runs = _walk(compiled, graph, inputs, imported, target, cache_dir, timeout)
    return Execution(gear, outputs, runs, time.perf_counter() - started)


def _pypto_missing() -> str:
    """Why no kernel can run by PyPTO here before any worker starts, or ""."""
    return "" if importlib.util.find_spec("pypto") else "PyPTO is not installed"


def _walk(compiled, graph, inputs, imported, target, cache_dir, timeout):
    """The graph walked with its kernels by PyPTO, in one thread of the worker pool (a pool
    of its own, or a ``shared_workers`` block's): the fork server starts once for every kernel
    of the run, and an interrupt kills it (docs/workers.md)."""
    from pypto_offline.offline_compiler.source_check import derivation
    from pypto_offline.pypto_kernels.jobs import pool

    walk = _Walk(graph, compiled, dict(inputs), derivation(imported, target),
                 _Runner(cache_dir, timeout))
    return pool.each([walk], 1, _Walk.run)[0]


class _Runner:
    """Runs one kernel's shipped program in a PyPTO worker; made on the first kernel (the
    kernel cache it stages jobs in is opened then)."""

    def __init__(self, cache_dir, timeout: float | None):
        self._cache_dir, self._timeout, self._setup = cache_dir, timeout, None
        self.gone = ""  # why no worker can start here: every kernel after runs as its ops

    def setup(self, target):
        from pypto_offline.pypto_kernels.cache import KernelCache
        from pypto_offline.pypto_kernels.jobs.executor import LocalExecutor
        from pypto_offline.pypto_kernels.search import Setup
        from pypto_offline.pypto_kernels.versions import DEFAULT_TIMEOUT_S

        if self._setup is None:
            self._setup = Setup(target, KernelCache(self._cache_dir), LocalExecutor(),
                                self._timeout or DEFAULT_TIMEOUT_S)
        return self._setup

    def run(self, record: ptom_pb2.Kernel, region, arrays: list, target) -> list | str:
        """The kernel's outputs in the region's types, or why it did not run."""
        from pypto_offline.pypto_kernels.jobs.protocol import OUTPUTS_FILE
        from pypto_offline.pypto_kernels.search import run_region_job
        from pypto_offline.pypto_kernels.tiling import TilePolicy

        tile = record.tuned_tile
        policy = TilePolicy(tile.budget_bytes, tile.swapped_transposes, tile.flat_rows,
                            tile.vec_merge)
        try:
            setup = self.setup(target)
        except UsageError as error:  # a kernel cache it cannot stage in: no job can run
            self.gone = f"no PyPTO job can be staged: {error}"
            return self.gone
        staged = setup.cache.staging()  # where the fork servers take jobs (jobs/executor.py)
        try:
            # named by its region's signature: the blob keeps no cache key (its module's name)
            result = run_region_job(setup, staged / "run", region, {policy: record.source},
                                    record.region_signature, arrays, (), verify=True,
                                    save_outputs=True)
            answer = result.candidates[0] if result.candidates else None
            saved = staged / "run" / OUTPUTS_FILE
            if answer is None or not answer.compiled or not saved.exists():
                return "the PyPTO worker did not run it: " + (
                    (answer.error if answer else None)
                    or (result.failure.reason if result.failure else "no answer"))
            with np.load(saved) as data:
                return [_in_graph_type(data[f"out{i}"], region.tensor_types[name])
                        for i, name in enumerate(region.outputs)]
        except WorkerCannotStart as error:
            self.gone = f"no PyPTO worker starts here: {error}"
            return self.gone
        finally:
            shutil.rmtree(staged, ignore_errors=True)


def _in_graph_type(array: np.ndarray, tensor_type) -> np.ndarray:
    """A kernel's output as the graph types it (an int64 tensor runs as int32 in a kernel:
    classify.kernel_dtype)."""
    shape, elem_type = tensor_type
    return array.astype(helper.tensor_dtype_to_np_dtype(elem_type), copy=False).reshape(shape)


class _Walk:
    """One execution of a compiled graph with its kernels by PyPTO: ``values`` holds every
    tensor computed so far, by name."""

    def __init__(self, graph: onnx.ModelProto, compiled, values: dict, source, runner):
        self.model, self.nodes = graph, list(graph.graph.node)
        self.records = {k.id: k for k in compiled}
        self.values, self.source, self.runner = values, source, runner
        self.runs: dict[str, KernelRun] = {}
        self.outputs = [o.name for o in graph.graph.output]
        self.last_read = _last_readers(self.nodes, self.outputs)
        self.weights = {t.name: t for t in graph.graph.initializer}
        self.types = {v.name: v for v in [*graph.graph.input, *graph.graph.value_info,
                                          *graph.graph.output]}

    def run(self) -> tuple[dict[str, np.ndarray], tuple[KernelRun, ...]]:
        pending = 0  # the first node not run yet: nodes from there run in onnxruntime
        for index, node in enumerate(self.nodes):
            record = self.records.get(node.op_type) if node.domain == DOMAIN else None
            if record is None:
                continue
            why_not = self._why_not(record)
            if why_not:  # runs inside the next onnxruntime sub-model
                self.runs[record.id] = KernelRun(record.id, BY_ONNXRUNTIME, why_not)
                continue
            self._in_onnxruntime(pending, index)
            if self._by_pypto(record):
                pending = index + 1
            else:
                pending = index
        self._in_onnxruntime(pending, len(self.nodes))
        outputs = {name: self._value(name) for name in self.outputs}
        never = KernelRun("", BY_ONNXRUNTIME, "the compiled graph never calls it")
        return ({n: v for n, v in outputs.items() if v is not None},
                tuple(self.runs.get(k) or replace(never, id=k) for k in self.records))

    def _why_not(self, record: ptom_pb2.Kernel) -> str:
        """Why the kernel cannot run by PyPTO, known before running it, or "". Only the source
        the build's generator writes for the kernel's region runs (a blob is hostile input:
        verify's check, offline_compiler/source_check.py)."""
        if self.runner.gone:
            return self.runner.gone
        if isinstance(self.source, str):
            return f"its source {self.source}"
        differs = self.source.why_it_differs(record)
        return f"its shipped source is not run: {differs}" if differs else ""

    def _by_pypto(self, record: ptom_pb2.Kernel) -> bool:
        from pypto_offline.pypto_kernels.region_data import kernel_arguments

        started = time.perf_counter()
        region = self.source.region(record)
        arrays, _ = kernel_arguments(region, self.source.constants, self.values.__getitem__)
        outputs = self.runner.run(record, region, arrays, self.source.target)
        seconds = time.perf_counter() - started
        if isinstance(outputs, str):
            self.runs[record.id] = KernelRun(record.id, BY_ONNXRUNTIME, outputs)
            return False
        self.values.update(zip(region.outputs, outputs))
        self.runs[record.id] = KernelRun(record.id, BY_PYPTO, "", seconds)
        return True

    def _in_onnxruntime(self, start: int, end: int) -> None:
        """Nodes ``start`` to ``end`` (excluded) as one sub-model in onnxruntime: it takes the
        values they read, and gives those read after it (or the graph's outputs)."""
        nodes = self.nodes[start:end]
        wanted = [name for node in nodes for name in node.output
                  if name and self.last_read.get(name, -1) >= end]
        if not wanted:  # nothing after them reads what they make
            return
        made = {name for node in nodes for name in node.output if name}
        read = set().union(*(_reads(node) for node in nodes)) - made
        feeds = {name: self.values[name] for name in sorted(read) if name in self.values}
        weights = [self.weights[name] for name in sorted(read - set(feeds))
                   if name in self.weights]
        called = {node.op_type for node in nodes if node.domain == DOMAIN}
        sub_model = helper.make_model(
            helper.make_graph(nodes, f"nodes_{start}_{end}",
                              [self._typed(name, value) for name, value in feeds.items()],
                              [self.types.get(name) or onnx.ValueInfoProto(name=name)
                               for name in wanted], weights),
            opset_imports=list(self.model.opset_import),
            functions=[f for f in self.model.functions if f.name in called])
        sub_model.ir_version = self.model.ir_version
        self.values.update(run_model(sub_model, feeds))

    def _typed(self, name: str, value) -> onnx.ValueInfoProto:
        """A sub-model's input: as the graph declares it, else as the value is."""
        if name in self.types:
            return self.types[name]
        array = np.asarray(value)
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                             list(array.shape))

    def _value(self, name: str):
        if name in self.values:
            return self.values[name]
        return numpy_helper.to_array(self.weights[name]) if name in self.weights else None


def _last_readers(nodes: Sequence[onnx.NodeProto], outputs: Sequence[str]) -> dict[str, float]:
    """Each tensor's last reader (a node's index; the graph's outputs are read at the end)."""
    last: dict[str, float] = {}
    for index, node in enumerate(nodes):
        for name in _reads(node):
            last[name] = index
    last.update({name: float("inf") for name in outputs})
    return last


def _reads(node: onnx.NodeProto) -> set[str]:
    """The tensors a node reads: its inputs, and the outer tensors its subgraphs (an If's
    branches, a Loop's body) name."""
    names = {name for name in node.input if name}
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
            inner = {v.name for v in graph.input} | {t.name for t in graph.initializer} | \
                {name for n in graph.node for name in n.output}
            names |= set().union(*(_reads(n) for n in graph.node)) - inner
    return names
