"""The Python API, mirroring the command line.

    compiled = pypto_offline.compile("model.onnx", target="kirin9050",
                                     input_shapes={"x": [1, 3, 224, 224]})
    compiled.verify()               # onnxruntime: the compiled graph against the imported one
                                    # (a loaded blob's kernel sources derived again, too)
    compiled.save("model.kirin9050.ptom", report="model.kirin9050.report.html")  # as a pair
    compiled.summary()              # the figures `pypto-offline --json` prints
    again = pypto_offline.load("model.kirin9050.ptom")

This module and the ``cli`` package are the only places that call every stage.
"""
from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from pypto_offline.errors import UsageError
from pypto_offline.importer.input_shapes import check_given_inputs
from pypto_offline.offline_compiler import BuildOptions, blob, build, build_together, ptom_pb2
from pypto_offline.offline_compiler.options import KEYWORDS
from pypto_offline.offline_compiler import gears as gear_table
from pypto_offline.offline_compiler.execute import BY_ONNXRUNTIME, BY_PYPTO, Execution, execute
from pypto_offline.offline_compiler.source_check import SourceCheck, recheck_sources
from pypto_offline.offline_compiler.summary import kernel_precision, summarise
from pypto_offline.progress import SILENT, Progress, Timings
# the API's resource checks and blocks (``api.executor``, ``api.shared_workers``, ...)
from pypto_offline.resources import (check_cache, check_limits, executor,  # noqa: F401
                                     shared_workers)
from pypto_offline.runtime import finite
from pypto_offline.targets import Target, known_names, resolve_target
from pypto_offline.importer.precision import FORCE_FP16
from pypto_offline.verify import (OutputCheck, Thresholds, Verification, check_memory_limits,
                                  compare, float_original_of, generate_inputs)


def get_target(name: str) -> Target:
    """The target of a target's or a chip's name, in any case (``targets.resolve_target``)."""
    target = resolve_target(name)
    if target is None:
        raise UsageError(f"unknown target {name!r}",
                         fix=f"choose one of {', '.join(known_names())} (any case)")
    return target


class CompiledModel:
    """A compiled model: the blob's content, with the operations a user runs on it."""

    def __init__(self, message: ptom_pb2.CompiledModel, kernel_cache: dict | None = None,
                 timings: Timings | None = None, loaded_from: Path | None = None):
        self.message = message
        self._reference: onnx.ModelProto | None = None
        # a quantised blob's float original (``use_reference``): metrics only (docs/int8.md)
        self._float_original: onnx.ModelProto | None = None
        # A build of gears: each gear's build as it came from the pipeline, with its reference
        # (None for a loaded blob, whose gears ``gear`` unpacks)
        self._gears: list[CompiledModel] | None = None
        # Per gear, the compiled graph ``run`` runs, parsed once; and every gear's input shapes
        self._run_graphs: dict[int, onnx.ModelProto] = {}
        self._gear_shapes: list[dict[str, tuple[int, ...]]] | None = None
        # The blob's path for a loaded blob (None for a build): its sources are then no build's
        # of this process, and ``verify`` derives them again.
        self.loaded_from = loaded_from
        # The last ``verify``'s kernel sources derived again (None: not derived); not in the
        # blob, whose record is the build's.
        self.source_check: SourceCheck | None = None
        # a blob of gears: each gear's, as ``verify`` derived them (the summary's per gear)
        self._gear_sources: dict[int, SourceCheck] = {}
        # How this build got its kernels ({"hits": n, "compiled": m}, where compiled counts
        # PyPTO compiles: a region the generator refused is in neither); not in the blob,
        # which must not depend on the state of a cache.
        self.kernel_cache = kernel_cache
        # Where this build's time went (None for a loaded blob); not in the blob nor the
        # report, which must not depend on the clock (docs/outputs.md).
        self.timings = timings

    def use_reference(self, original_model) -> None:
        """Check against the original model file instead of the imported graph in the blob;
        it must be the model the blob was compiled from. A quantised blob also takes the float
        model its QDQ model was made from (its inputs and outputs): its metrics are reported,
        the check stays against the QDQ model (docs/int8.md, "Verification")."""
        import hashlib

        from pypto_offline.offline_compiler.build import model_bytes

        raw, name = model_bytes(original_model)
        if hashlib.sha256(raw).hexdigest() != self.message.provenance.model_sha256:
            model = onnx.load_from_string(raw)
            if float_original_of(onnx.load_from_string(self.message.source_onnx_model), model):
                self._float_original = model
                return
            raise UsageError(f"{name} is not the model this blob was compiled from "
                             f"({self.message.provenance.model_name}, sha256 "
                             f"{self.message.provenance.model_sha256[:12]}…)",
                             fix="pass the original model (a quantised blob: or the float "
                                 "model its QDQ model was made from), or omit --onnx")
        self._reference = onnx.load_from_string(raw)

    @property
    def target(self) -> str:
        return self.message.target.name

    def save(self, path, report=None) -> Path:
        """Write the blob, and with ``report`` its HTML report, as a pair: both are rendered and
        staged first, so a report that cannot be made or written leaves no blob either."""
        files = {}
        with self._timed("write_s"):  # rendering the report included
            if report is not None:
                from pypto_offline.report import render_report

                blob.check_outputs({"the report": Path(report)}, {"the blob": Path(path)})
                files[Path(report)] = render_report(self.message).encode()
            files[Path(path)] = self.to_bytes()  # last: no blob appears before its report
            blob.write_together(files)
        return Path(path)

    def _timed(self, stage: str):
        """A block counted in this build's timings; a loaded blob's work is no build's."""
        return self.timings.stage(stage) if self.timings else nullcontext()

    def to_bytes(self) -> bytes:
        return blob.to_bytes(self.message)

    @property
    def gear_count(self) -> int:
        return gear_table.gear_count(self.message)

    def gear(self, index: int) -> CompiledModel:
        """Gear ``index`` (in the order built) as a model of its own: its whole build, checked
        against its own reference (docs/gears.md)."""
        self._check_gear(index)
        if not self.message.gears:
            return self
        if self._gears:
            return self._gears[index]
        one = CompiledModel(gear_table.gear_build(self.message, index),
                            loaded_from=self.loaded_from)
        one._reference, one._float_original = self._reference, self._float_original
        return one

    def _check_gear(self, index: int) -> int:
        if not 0 <= index < self.gear_count:
            raise UsageError(f"--gear {index}: the blob has {self.gear_count} gear(s)",
                             where=self.label, fix=f"give 0 to {self.gear_count - 1}")
        return index

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of the gear whose input shapes ``inputs`` match exactly
        (``execute``)."""
        return self.execute(inputs).outputs

    def execute(self, inputs: Mapping[str, np.ndarray], gear: int | None = None,
                kernels: str = BY_PYPTO, cache_dir=None) -> Execution:
        """The compiled graph of the gear whose input shapes ``inputs`` match exactly (or of
        ``gear``, whose shapes they must have), run by the reference runtime
        (``offline_compiler.execute``, docs/runtime.md); inputs of any other shapes are refused
        with the gears listed: the run-time contract (docs/gears.md). ``kernels``: ``"pypto"``
        runs each compiled kernel by its shipped program in a PyPTO worker staged in the kernel
        cache ``cache_dir`` (a kernel PyPTO cannot run runs as its ops, its ``KernelRun``
        saying why); ``"onnxruntime"`` runs every kernel as its ops (no PyPTO needed)."""
        if self._gear_shapes is None:
            self._gear_shapes = gear_table.shapes_of(self.message)
        given = {n: np.shape(v) for n, v in inputs.items()}
        if gear is None:
            index = gear_table.pick(self._gear_shapes, given)
        else:  # that gear's shapes, or the refusal naming them
            index = self._check_gear(gear)
            gear_table.pick([self._gear_shapes[index]], given)
        if index not in self._run_graphs:
            self._run_graphs[index] = onnx.load_from_string(
                gear_table.gear_graph(self.message, index))
        graph = self._run_graphs[index]
        check_given_inputs(graph, inputs, self.label)  # the blob's own dtypes, as onnxruntime's
        return execute(index, gear_table.gear_kernels(self.message, index), graph, inputs,
                       kernels, target=self.target, cache_dir=cache_dir,
                       imported=gear_table.gear_graph(self.message, index, "source_onnx_model"))

    def verify(self, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
               sources: bool | None = None, gear: int | None = None) -> Checked:
        """Every gear checked (``gear``: that one only) as ``verify_shape`` checks a blob of
        one shape, each verdict recorded in its gear's build; the result of the last one
        failed, else of the last one checked."""
        if not self.message.gears:
            self._check_gear(gear or 0)
            return self.verify_shape(inputs, seed, sources)
        results, shapes = [], gear_table.shapes_of(self.message)
        given = gear_inputs(inputs or {}, shapes, self.label)
        for index in range(self.gear_count) if gear is None else [self._check_gear(gear)]:
            one = self.gear(index)
            results.append(one.verify_shape(given[index], seed, sources))
            gear_table.build_of(self.message, index).verification.CopyFrom(
                one.message.verification)
            if one.source_check is not None:
                self._gear_sources[index] = one.source_check
            if index == 0 or results[-1].status == "failed":
                self.source_check = one.source_check
        failed = [r for r in results if r.status == "failed"]
        return (failed or results)[-1]

    def verify_shape(self, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
                     sources: bool | None = None) -> Checked:
        """Check the model now (docs/outputs.md, "What verify re-checks"). First the build's
        memory limits on both graphs, before any input is made. Then the compiled graph and the
        imported graph run in onnxruntime on the same inputs (``inputs`` by name, the rest
        generated within each input's range; that verdict is recorded in the model). With
        ``sources`` (by default for a loaded blob: a build's sources are the ones it has just
        generated), every compiled kernel's source derived again from the blob's graph and tile
        and compared (``offline_compiler.source_check``)."""
        imported = onnx.load_from_string(self.message.source_onnx_model)
        reference = self._reference or imported
        compiled = onnx.load_from_string(self.message.onnx_model)
        for graph, which in ((imported, "its imported graph"), (compiled, "its compiled graph")):
            check_memory_limits(graph, f"{self.label}, {which}", fix=REBUILD_SMALLER)
        given = dict(inputs or {})  # in the blob's own dtypes: compare casts for the original
        check_given_inputs(imported, given, self.label)
        thresholds = self._thresholds()
        with self._timed("verify_s"):
            result = compare(reference, compiled, generate_inputs(imported, seed, given),
                             thresholds, run=self._as_its_ops,
                             float_original=self._float_original,
                             propagated=self._propagated())
        self._record(result, seed, bool(given), thresholds)
        if self.loaded_from is not None if sources is None else sources:
            self.source_check = recheck_sources(self.message)
        return Checked(result, self.source_check, tuple(self.message.verification.kernels_beyond))

    def _as_its_ops(self, graph: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
        """The compiled graph run by the reference runtime with every kernel as its ops:
        verify's run, ``run``'s executor without PyPTO."""
        return execute(0, self.message.kernels, graph, feeds, BY_ONNXRUNTIME).outputs

    def _thresholds(self) -> Thresholds | None:
        """A converted model against the original (the build's own, or ``use_reference``'s) is
        held to its mode's thresholds; against the blob's converted graph, or unconverted, to
        the per-dtype tolerance (docs/precision.md)."""
        if self._reference is None or not self.message.HasField("precision"):
            return None
        return Thresholds.of(self.message.precision.mode)

    def _propagated(self) -> Thresholds | None:
        """An int8 output more than one step off the original model, which computes its
        contractions in float where the blob's are exact int32 (an early layer's off-by-one
        travels): held to force_fp16's thresholds; against the imported graph, the same integer
        arithmetic, it fails (docs/int8.md, "Verification")."""
        return Thresholds.of(FORCE_FP16) if self._reference is not None else None

    def _kernels_beyond(self, thresholds: Thresholds) -> list[str]:
        """The kernels the build ran on the original model's values whose outputs are beyond
        the thresholds (onnxruntime runs most fp16 ops in fp32 and cannot see them fail:
        docs/precision.md)."""
        return [k.id for k in self.message.kernels
                if k.HasField("precision") and not k.precision.why_not
                and not thresholds.kernel_holds(kernel_precision(k))]

    def _record(self, result, seed: int, inputs_given: bool,
                thresholds: Thresholds | None) -> None:
        """The onnxruntime verdict, in the blob's message."""
        record = self.message.verification
        record.Clear()
        record.status, record.seed, record.inputs_given = result.status, seed, inputs_given
        if self.message.HasField("precision"):  # which graph the converted one was held to
            record.reference = "original model" if self._reference is not None \
                else "imported graph"
        if thresholds is not None:
            record.thresholds.min_cosine = thresholds.min_cosine
            record.thresholds.max_rel_distance = thresholds.max_rel_distance
            record.kernels_beyond.extend(self._kernels_beyond(thresholds))
        record.outputs.extend(map(_output_record, result.outputs))
        record.float_original.extend(map(_output_record, result.float_original))

    @property
    def label(self) -> str:
        """The model in messages: the blob's path, or the name of the model built."""
        if self.loaded_from is not None:
            return str(self.loaded_from)
        return self.message.provenance.model_name or "the model"

    def summary(self, gear: int | None = None) -> dict:
        """The figures ``--json`` prints: of every gear (docs/gears.md), or of ``gear`` alone."""
        if gear is not None:
            self._check_gear(gear)
        return summarise(self.message, self._gear_sources or self.source_check, gear)

    def write_report(self, path) -> Path:
        """The HTML fusion report, made from the blob's content alone (``pypto-offline report``
        gives the same page from the saved blob)."""
        from pypto_offline.report import write_report

        return write_report(Path(path), self.message)


# A blob's shapes are its build's: a graph beyond the memory limits is made smaller there.
REBUILD_SMALLER = "rebuild the model with smaller --input-shape"


@dataclass(frozen=True)
class Checked:
    """What ``CompiledModel.verify`` checked now: the onnxruntime run and, when they were
    derived again, the kernel sources; ``status`` is failed if either failed."""

    onnxruntime: Verification
    sources: SourceCheck | None
    # a converted build's kernels beyond its thresholds on the original model's values
    kernels_beyond: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        sources_differ = self.sources is not None and not self.sources.passed
        return "failed" if sources_differ or self.kernels_beyond or \
            self.onnxruntime.status == "failed" else "passed"


def _with_option_keywords(function):
    """``compile`` as ``help()`` and editors show it: the build options' keywords, with their
    defaults and the command line's help, in place of ``**options``."""
    shown = [keyword for name, keyword in KEYWORDS.items() if name != "input_shapes"]
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind is not p.VAR_KEYWORD]
    parameters += [inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=k.default)
                   for k in shown]
    function.__signature__ = inspect.signature(function).replace(parameters=parameters)
    function.__doc__ = (function.__doc__ or "") + "\n\n    Options:\n\n" + "\n".join(
        f"    ``{k.name}={k.default!r}``: {'/'.join(k.flags) + ': ' if k.flags else ''}{k.help}"
        for k in shown)
    return function


@_with_option_keywords
def compile(model, target: str = "kirin9050",  # noqa: A001 - the API's verb
            input_shapes: Mapping[str, Sequence[int]] | None = None, *,
            progress: Progress = SILENT,
            gears: Sequence[Mapping[str, Sequence[int]]] | None = None,
            **options) -> CompiledModel:
    """Compile ``model`` for ``target``. ``options``: the build's options, the keywords below
    (``offline_compiler/options.py`` spells each once, and the command line's flag for it).
    ``verify``: also run the onnxruntime check (with ``inputs``), and refuse up front a model
    it could not run. ``progress``: told of each stage and finished kernel
    (``pypto_offline.progress``; by default nothing is printed). ``gears``: each gear's input
    shapes (``importer.gears.plan`` gives them from ATC's options or ``--dim`` lists), two or
    more: one blob of every gear, built in one pool on one kernel cache, each verified with
    ``verify`` (docs/gears.md)."""
    options = BuildOptions.from_keywords(input_shapes=input_shapes, **options)
    get_target(target)
    if gears is not None:
        if len(gears) < 2:
            raise UsageError(f"{len(gears)} gear(s): a blob of gears has two or more",
                             fix="give one shape as input_shapes")
        return _compile_gears(model, get_target(target), options, gears, progress)
    timings = Timings()
    result = build(model, get_target(target), options, progress, timings)
    compiled_model = _built(result, timings)
    if options.verify:
        progress.stage("verifying against onnxruntime")
        compiled_model.verify(options.inputs)
    return compiled_model


def _compile_gears(model, target: Target, options: BuildOptions,
                   shapes: Sequence[Mapping[str, Sequence[int]]], progress) -> CompiledModel:
    """Every gear built in rounds in one worker pool on one kernel cache (each round compiles
    every gear's regions together; a kernel the gears share compiles once), verified, then
    packed into one message (docs/gears.md)."""
    from pypto_offline.pypto_kernels.jobs.pool import in_shared_pool

    gear_table.check_distinct(shapes)  # before any work: a blob it writes must load
    timings = Timings()
    label = str(model) if isinstance(model, (str, Path)) else "the model"
    given = gear_inputs(options.inputs, shapes, label)  # before any work
    builds = [(model, replace(options, input_shapes=dict(gear), dims={}, inputs=inputs))
              for gear, inputs in zip(shapes, given)]
    labels = [f"gear {index} ({gear_table.shapes_text(gear)})" for index, gear in enumerate(shapes)]
    with nullcontext() if in_shared_pool() else shared_workers(options.jobs):
        results = build_together(builds, target, progress, timings, labels)
    cache = [r.kernel_cache() for r in results]
    # each gear's row: every input its graph takes (a reader refuses a row that is not)
    compiled_model = CompiledModel(
        gear_table.pack([(gear_table.graph_shapes(r.graph.model), r.message) for r in results]),
        {key: sum(c[key] for c in cache) for key in cache[0]}, timings)
    compiled_model._gears = [_built(r) for r in results]
    if options.verify:
        progress.stage("verifying every gear against onnxruntime")
        compiled_model.verify(options.inputs)
    return compiled_model


def _built(result, timings: Timings | None = None) -> CompiledModel:
    """A build's model, checked against the graph in its own precision (a converting mode's
    original) where it has one, else the imported graph in the blob."""
    compiled_model = CompiledModel(result.message, result.kernel_cache(), timings)
    compiled_model._reference = result.original
    return compiled_model


def _output_record(o: OutputCheck) -> ptom_pb2.OutputCheck:
    """One output's check as the blob records it (an infinite figure as the largest double)."""
    record = ptom_pb2.OutputCheck(
        name=o.name, dtype=o.dtype, max_abs_diff=finite(o.max_abs_diff),
        max_rel_diff=finite(o.max_rel_diff), tolerance=o.tolerance, passed=o.passed,
        cosine=o.cosine, rms=finite(o.rms), rel_distance=finite(o.rel_distance))
    if o.int8_steps is not None:
        record.int8_steps.CopyFrom(ptom_pb2.Int8Steps(**o.int8_steps))
    return record


def gear_inputs(inputs: Mapping[str, np.ndarray], gears: Sequence[Mapping[str, Sequence[int]]],
                where: str) -> list[dict[str, np.ndarray]]:
    """The given inputs each gear takes: those of its shapes (``--inputs`` of one size serve the
    gear of that size; the other gears' inputs are generated). An array of a shape no gear
    takes is refused, as a build of one shape refuses it, rather than left unused."""
    for name, value in inputs.items():
        taken = [tuple(gear[name]) for gear in gears if name in gear]
        if taken and tuple(np.shape(value)) not in taken:
            listed = " | ".join(f"gear {index}: {gear_table.shapes_text({name: gear[name]})}"
                                for index, gear in enumerate(gears) if name in gear)
            raise UsageError(f"--inputs gives shape {list(np.shape(value))}, which no gear "
                             f"takes ({listed})", where=f"{where}, input {name!r}",
                             fix="give the input one gear's shape, or build a gear for it")
    return [{name: value for name, value in inputs.items()
             if name not in gear or tuple(np.shape(value)) == tuple(gear[name])}
            for gear in gears]


def input_names(model) -> list[str]:
    """The names of a model's graph inputs (its initializers left out)."""
    from pypto_offline.importer.input_shapes import graph_inputs
    from pypto_offline.importer.loading import load_model

    return [value.name for value in graph_inputs(load_model(model)[0])]


def load(path, expected_target: str | None = None) -> CompiledModel:
    expected = get_target(expected_target).name if expected_target else None
    return CompiledModel(blob.read(Path(path), expected), loaded_from=Path(path))
