"""TVM Relax as a baseline: import the static ONNX model, fuse it the standard way, count, check.

    python -m bench.tvm_baseline [--models a,b] [--no-run]
                                 [--out bench/results/compare/tvm_relax.json]

Counted: the ``call_tir`` calls left in the ``main`` function after ``from_onnx`` and LegalizeOps,
AnnotateTIROpPattern, FuseOps, FuseTIR (one ``tvm.transform.Sequential``: TVM's standard operator
fusion); each is one TIR kernel launched per call. Nothing else runs before the count: no
FoldConstant (on nudenet it fails, on a shape it cannot make static) and no DeadCodeElimination, so
a kernel that computes from weights alone still counts, and runs every call in what is built.
Every input shape is pinned twice, written into the graph inputs (``bench.compare.static_model``)
and given as ``shape_dict``; weights are constants (``keep_params_in_input=False``). Nothing in the
model is rewritten: where TVM's importer cannot take an op (seen: LSTM, STFT, a Reshape whose
target shape comes from a Shape -> Cast chain, arithmetic on a Shape), the failure is the result,
``{"error": "import: ..."}``.

``seconds``: the import plus the four passes, what the count costs. Then the fused module is built
for ``llvm`` with ``tvm.compile`` (``build_seconds``; on a CPU its default pipeline fuses and
schedules nothing more) and run in TVM's VM on the seeded inputs ``bench.compare`` uses:
``max_abs_diff`` is against onnxruntime running the same static model, or a string when the module
does not build (seen: shape arithmetic LegalizeOps left as Relax ops) or run; the count stands.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

PASSES = ("LegalizeOps", "AnnotateTIROpPattern", "FuseOps", "FuseTIR")
OUT = Path("bench/results/compare/tvm_relax.json")


def import_model(model: onnx.ModelProto, shapes: dict[str, list[int]]):
    """The Relax module of ``model``; on failure the error names the ONNX op it failed on."""
    from tvm.relax.frontend.onnx import from_onnx

    said = io.StringIO()
    try:
        # The importer prints "Error converting operator X, with inputs: ..." (the inputs' whole
        # IR) before it re-raises, and onnx's checker warns about the exported models' quirks.
        with contextlib.redirect_stdout(said), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return from_onnx(model, shape_dict=shapes, keep_params_in_input=False)
    except Exception as error:
        op = next((line.split(",")[0].removeprefix("Error converting operator ")
                   for line in said.getvalue().splitlines()
                   if line.startswith("Error converting operator ")), None)
        raise RuntimeError(f"{op}: {_first_line(error)}" if op else _first_line(error)) from error


def fuse(module):
    import tvm
    from tvm import relax

    return tvm.transform.Sequential([getattr(relax.transform, p)() for p in PASSES])(module)


def count_kernels(module) -> int:
    import tvm
    from tvm import relax

    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and \
                expr.op.name == "relax.call_tir":
            calls.append(expr)

    relax.analysis.post_order_visit(module["main"], visit)
    return len(calls)


def fuse_and_check(model: onnx.ModelProto, shapes: dict[str, list[int]], feeds: dict,
                   reference: list | None, run: bool = True) -> dict:
    """The row for ``model``: kernels, seconds and, when ``run``, build_seconds and max_abs_diff."""
    import tvm.relax.frontend.onnx  # noqa: F401 - loading TVM (seconds, once) is not the model's

    started = time.perf_counter()
    try:
        module = import_model(model, shapes)
    except Exception as error:  # noqa: BLE001 - a model TVM cannot import is a result
        return {"error": f"import: {str(error)[:200]}"}
    try:
        fused = fuse(module)
    except Exception as error:  # noqa: BLE001 - so is one TVM's own passes cannot fuse
        return {"error": f"fuse: {_first_line(error)[:200]}"}
    row = {"kernels": count_kernels(fused), "seconds": round(time.perf_counter() - started, 2)}
    if not run:
        return row
    from bench.compare import max_abs_diff

    started = time.perf_counter()
    try:
        executable = _build(fused)
    except Exception as error:  # noqa: BLE001 - the count stands without a build
        return {**row, "max_abs_diff": f"does not build: {_first_line(error)[:160]}"}
    row["build_seconds"] = round(time.perf_counter() - started, 2)
    try:
        row["max_abs_diff"] = max_abs_diff(_run(executable, model, feeds), reference)
    except Exception as error:  # noqa: BLE001 - a module that cannot run is a result
        row["max_abs_diff"] = f"does not run: {_first_line(error)[:160]}"
    return row


def _build(fused):
    import tvm

    return tvm.compile(fused, target="llvm")


def _run(executable, model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import tvm
    from tvm import relax

    machine = relax.VirtualMachine(executable, tvm.cpu())
    initialisers = {t.name for t in model.graph.initializer}
    # main's parameters are the graph inputs in graph order (their names may be sanitised)
    args = [tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input
            if i.name not in initialisers]
    result = machine["main"](*args)
    results = [result] if hasattr(result, "numpy") else list(result)  # one output is not a tuple
    return [r.numpy() for r in results]


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def measure(name: str, run: bool = True) -> dict:
    """``fuse_and_check`` on a corpus model, the way ``bench.compare`` sets it up."""
    from bench import corpus
    from bench.compare import run_plain, static_model

    model = static_model(name)
    feeds = corpus.MODELS[name].make_inputs(seed=0)
    reference = run_plain(model, feeds) if run else None
    return fuse_and_check(model, corpus.MODELS[name].input_shapes, feeds, reference, run)


def main(argv: list[str] | None = None) -> int:
    from bench import corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(corpus.MODELS))
    parser.add_argument("--no-run", action="store_true", help="count only: no llvm build or run")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    results = {}
    for name in args.models.split(","):
        results[name] = measure(name, run=not args.no_run)
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
