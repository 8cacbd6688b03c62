"""Cold and warm build time against IREE's compile time on the same static model, in the same run,
and the per-job overhead of a PyPTO worker (issue 17's must-show; not part of the test run).

    python -m bench.compile_time [--models a,b] [--no-example] [--target kirin9050] [--jobs 2]
                                 [--skip-cold] [--cache-dir DIR] [--no-iree]
                                 [--overhead-runs 5] [--out bench/results/compile_time]

Per model (the bundled example on x=1,3,64,64 first, then the corpus models on their corpus
input shapes and seeded inputs):
- cold: ``pypto-offline`` on the command line, as a user runs it (report included), on a fresh
  empty kernel cache folder of its own. The PyPTO calculator library
  (~/.cache/pypto-offline/calculator, built once per machine) stays shared: it is not part of a
  model's build. ``--skip-cold`` times the warm build only, on ``--cache-dir``;
- warm: the same build again on the cache the cold build filled;
- IREE: import + llvm-cpu compile to .vmfb of the same static model, shapes pinned as
  ``bench/iree_baseline.py`` does (a model IREE cannot compile is reported as such);
- what ships, so that a faster build that ships something else shows: the verification status,
  the compiled kernels and a digest of their sources.
The build's ``timings`` and PyPTO compile counts are read from its ``--json`` summary when it has
them ("n/a" otherwise). The per-job overhead is the wall time of ``jobs.executor.run_job`` on a job with
no candidate and on a one-candidate job of a tiny region, median of ``--overhead-runs``.
Writes OUT/compile_time_TARGET.{md,json} after every model. How to read the figures:
docs/compile-time-bench.md.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from bench import corpus
from bench.compare import cli_build, run_plain, with_input_shapes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = corpus.CorpusModel("example", {"x": corpus.InputSpec((1, 3, 64, 64))})
GOAL_RATIO = 10  # issue 17: a cold build within 10x of IREE's compile time
TIMING_KEYS = ("import_s", "plan_s", "kernels_s", "baseline_s", "verify_s", "write_s")
# The build summary's counts of PyPTO compiles done and served from the cache, looked up at its
# top level and in these sections (their exact place is the build's to choose).
COUNT_KEYS = {"pypto_compiles": ("pypto_compiles", "compiles"),
              "pypto_cache_hits": ("pypto_cache_hits", "cache_hits")}
COUNT_SECTIONS = ("timings", "pypto", "kernel_cache")


def model_source(spec: corpus.CorpusModel) -> Path:
    return ROOT / "examples" / "example.onnx" if spec is EXAMPLE else corpus.model_path(spec.name)


def build_row(summary: dict, message) -> dict:
    """What one build measured and what it shipped."""
    if message is None:
        return summary
    shipped = sorted((k.id, k.source) for k in message.kernels if k.compiled)
    digest = hashlib.sha256(json.dumps(shipped).encode()).hexdigest()[:12]
    counts = {name: found_count(summary, keys) for name, keys in COUNT_KEYS.items()}
    return {"seconds": summary["seconds"], "build_s": summary.get("compile_seconds"),
            "peak_mb": summary["peak_mb"],
            "kernels_compiled": summary["kernel_cache"]["compiled"],
            "cache_hits": summary["kernel_cache"]["hits"], **counts,
            "timings": summary.get("timings"),
            "verification": summary["verification"]["status"],
            "shipped_kernels": len(shipped), "fell_back": summary["pypto"]["fell_back"],
            "kernels_after": summary["kernels_after"], "shipped_digest": digest,
            "fell_back_reasons": sorted({k.fallback_reason.splitlines()[0][:120]
                                         for k in message.kernels if not k.compiled})}


def found_count(summary: dict, keys: tuple[str, ...]):
    for section in (summary, *(summary.get(s) for s in COUNT_SECTIONS)):
        if isinstance(section, dict):
            for key in keys:
                if isinstance(section.get(key), int):
                    return section[key]
    return None


def iree_row(spec: corpus.CorpusModel, folder: Path) -> dict:
    from bench import iree_baseline

    model = with_input_shapes(onnx.load(model_source(spec)), spec.input_shapes)
    source = folder / f"{spec.name}.static.onnx"
    onnx.save(model, source)
    feeds = spec.make_inputs(seed=0)
    return iree_baseline.compile_and_check(source, feeds, run_plain(model, feeds), folder)


def bench_model(spec: corpus.CorpusModel, args) -> dict:
    row = {"model": spec.name, "input_shapes": spec.input_shapes}
    with tempfile.TemporaryDirectory(prefix=f"compile-time-{spec.name}-") as scratch:
        folder = Path(scratch)
        cache = args.cache_dir if args.skip_cold else folder / "fresh-kernel-cache"
        build = lambda: build_row(*cli_build(  # noqa: E731
            model_source(spec), spec, args.target, cache, folder, "--jobs", str(args.jobs)))
        if not args.skip_cold:
            row["cold"] = build()
        row["warm"] = build()
        if not args.no_iree:
            row["iree"] = iree_row(spec, folder)
    return row


# ---- per-job overhead of a PyPTO worker, through the local executor's contract only ----

def tiny_region_job():
    """A one-candidate job of a tiny fused region (Add → Relu, 1x8x16x16 fp32), default tile:
    the region, graph, target and sources ``search.run_region_job`` takes."""
    from pypto_offline.api import get_target
    from pypto_offline.fusion import plan_fusion
    from pypto_offline.importer import import_model
    from pypto_offline.pypto_kernels.compiler import distinct_sources
    from pypto_offline.pypto_kernels.tiling import default_policy

    shape = [1, 8, 16, 16]
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        "tiny", [value("a"), value("b")], [value("y")]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = import_model(model)
    target = get_target("kirin9050")
    region = plan_fusion(graph, target).regions[0]
    constants = graph.constant_values()
    sources = distinct_sources(
        region, [default_policy(target.ub_plan_bytes.value)], constants)
    return region, graph, target, constants, sources


def timed_empty_job(folder: Path, target) -> float:
    from pypto_offline.pypto_kernels.codegen import KERNEL_FUNCTION
    from pypto_offline.pypto_kernels.jobs.executor import LocalExecutor, run_job
    from pypto_offline.pypto_kernels.jobs.protocol import Job, JobResult
    from pypto_offline.pypto_kernels.versions import DEFAULT_TIMEOUT_S

    folder.mkdir(parents=True)
    np.savez(folder / "inputs.npz")
    started = time.perf_counter()
    result = run_job(LocalExecutor(), folder, Job(KERNEL_FUNCTION, False, ()), target,
                     DEFAULT_TIMEOUT_S)
    seconds = time.perf_counter() - started
    if result != JobResult():
        raise RuntimeError(f"an empty PyPTO job did not come back empty: {result}")
    return seconds


def timed_tiny_job(folder: Path, tiny) -> float:
    from pypto_offline.pypto_kernels.compiler import setup_for
    from pypto_offline.pypto_kernels.region_data import region_data
    from pypto_offline.pypto_kernels.search import run_region_job

    region, graph, target, constants, sources = tiny
    arrays, reference = region_data(region, graph, constants)
    key = hashlib.sha256(next(iter(sources.values())).encode()).hexdigest()
    started = time.perf_counter()
    result = run_region_job(setup_for(target, folder.parent), folder, region, sources, key,
                            arrays, reference, False)
    seconds = time.perf_counter() - started
    if not result.candidates or not all(c.compiled for c in result.candidates):
        raise RuntimeError(f"the tiny region did not compile: {result}")
    return seconds


def job_overhead(runs: int) -> dict:
    """Wall time of ``runs`` empty jobs and ``runs`` one-candidate jobs through ``run_job``, all
    in one pool thread of one build, as a build's jobs run: its first job also pays the start of
    the thread's PyPTO worker (with a fork server, the torch + pypto imports), reported apart."""
    from pypto_offline.pypto_kernels.jobs import pool

    tiny = tiny_region_job()
    with tempfile.TemporaryDirectory(prefix="compile-time-jobs-") as scratch:
        jobs = Path(scratch) / "jobs"  # <root>/<staging>/<job>, as in a kernel cache

        def measure(_):
            first = timed_empty_job(jobs / "first", tiny[2])
            empty = [timed_empty_job(jobs / f"empty{i}", tiny[2]) for i in range(runs)]
            return first, empty, [timed_tiny_job(jobs / f"tiny{i}", tiny) for i in range(runs)]
        ((first, empty, one),) = pool.each([None], 1, measure)
    return {"runs": runs, "first_job_s": round(first, 3),
            "empty_job_s": round(statistics.median(empty), 3),
            "one_candidate_job_s": round(statistics.median(one), 3),
            "empty_job_all_s": [round(s, 3) for s in empty],
            "one_candidate_job_all_s": [round(s, 3) for s in one]}


# ---- the tables ----

def seconds_cell(run: dict | None) -> str:
    """The process's wall seconds, and in brackets the build's own (after the imports)."""
    if run is None:
        return "—"
    if "error" in run:
        return f"✗ {run['error'][:60]}"
    inside = run.get("build_s")
    return f"{run['seconds']:.1f}" + ("" if inside is None else f" ({inside:.1f})")


def iree_cell(iree: dict | None) -> str:
    if iree is None:
        return "—"
    return f"{iree['seconds']:.1f}" if "seconds" in iree else f"✗ {iree['error'][:60]}"


def ratio_cell(cold: dict | None, iree: dict | None) -> str:
    """ours ÷ IREE, bold when it misses the goal; why not when either side has no time."""
    if iree is None:
        return "—"
    if "seconds" not in iree:
        return "IREE cannot compile"
    if not cold or "seconds" not in cold:
        return "—"
    ratio = cold["seconds"] / iree["seconds"]
    return f"{ratio:.1f}x" if ratio <= GOAL_RATIO else f"**{ratio:.1f}x**"


def counts_cell(run: dict | None) -> str:
    if not run or "error" in run:
        return "—"
    compiles = lambda key: "n/a" if run.get(key) is None else str(run[key])  # noqa: E731
    return (f"{run['kernels_compiled']} / {run['cache_hits']} / {compiles('pypto_compiles')} / "
            f"{compiles('pypto_cache_hits')}")


def timings_cell(run: dict | None) -> str:
    if not run or "error" in run:
        return "—"
    timings = run.get("timings") or {}
    return " / ".join("n/a" if timings.get(k) is None else f"{timings[k]:.1f}"
                      for k in TIMING_KEYS)


def shipped_cell(run: dict | None) -> str:
    if not run or "error" in run:
        return "—"
    reasons = "; ".join(run.get("fell_back_reasons") or [])
    return (f"{run['verification']}; {run['shipped_kernels']} kernels "
            f"({run['fell_back']} fell back{': ' + reasons[:80] if reasons else ''}) "
            f"`{run['shipped_digest']}`")


def markdown(results: dict) -> str:
    lines = [f"# Compile time, {results['target']}: ours cold / warm against IREE", "",
             f"- command: `{results['command']}`",
             f"- commit {results['commit']}, {results['machine']}, {results['date']}",
             "- cold: a fresh empty kernel cache per model; the PyPTO calculator library "
             "(~/.cache/pypto-offline/calculator) is shared. Warm: the same build again on that "
             "cache. IREE: import + llvm-cpu compile to .vmfb of the same static model.",
             "- cold s, warm s: wall seconds of the `pypto-offline` process (in brackets: the "
             "build's own `compile_seconds`, after Python's imports); cold / IREE on wall seconds.",
             "", "| model | cold s | warm s | IREE s | cold / IREE | kernels compiled / cache "
             "hits / PyPTO compiles / PyPTO cache hits (cold) | timings cold: "
             + " / ".join(TIMING_KEYS) + " | shipped (cold) | shipped (warm) |",
             "|---" * 9 + "|"]
    for row in results["models"]:
        cold, warm, iree = row.get("cold"), row.get("warm"), row.get("iree")
        lines.append(" | ".join([f"| {row['model']}", seconds_cell(cold), seconds_cell(warm),
                                 iree_cell(iree), ratio_cell(cold, iree), counts_cell(cold),
                                 timings_cell(cold), shipped_cell(cold),
                                 shipped_cell(warm)]) + " |")
    overhead = results.get("job_overhead")
    if overhead:
        lines += ["", f"Per-job overhead of a PyPTO worker (`jobs.executor.run_job` in one build's "
                  f"pool thread, median of {overhead['runs']}): empty job "
                  f"{overhead['empty_job_s']:.2f} s; one-candidate job of a tiny region "
                  f"(Add → Relu, 1x8x16x16 fp32) {overhead['one_candidate_job_s']:.2f} s; the "
                  f"thread's first job, which also starts its worker, "
                  f"{overhead.get('first_job_s', float('nan')):.2f} s."]
    lines += ["", f"Ratios above {GOAL_RATIO}x (the goal) are in bold. Times are wall seconds on "
              "a machine shared with other work: compare ratios within one run."]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    def git(*argv):
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain").strip() else "")


def write_results(results: dict, out: Path) -> None:
    from pypto_offline.offline_compiler.blob import write_together

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"compile_time_{results['target']}"
    write_together({stem.with_suffix(".json"): json.dumps(results, indent=1).encode(),
                    stem.with_suffix(".md"): markdown(results).encode()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(corpus.MODELS),
                        help="corpus models, comma-separated (default: all)")
    parser.add_argument("--no-example", action="store_true", help="leave out the bundled example")
    parser.add_argument("--target", default="kirin9050")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--skip-cold", action="store_true",
                        help="warm builds only, on --cache-dir")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="the kernel cache of --skip-cold (default: the user cache)")
    parser.add_argument("--no-iree", action="store_true")
    parser.add_argument("--overhead-runs", type=int, default=5,
                        help="jobs timed for the per-job overhead (0: not measured)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/compile_time"))
    args = parser.parse_args(argv)
    if args.skip_cold and args.cache_dir is None:
        from pypto_offline.pypto_kernels.cache import default_cache_dir

        args.cache_dir = default_cache_dir()
    specs = ([] if args.no_example else [EXAMPLE]) + \
        [corpus.MODELS[name] for name in filter(None, args.models.split(","))]
    results = {"target": args.target, "commit": _commit(),
               "machine": f"nproc {os.cpu_count()}, load {os.getloadavg()[0]:.1f} at start",
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "command": shlex.join(["python", "-m", "bench.compile_time",
                                      *(sys.argv[1:] if argv is None else argv)]),
               "models": []}
    if args.overhead_runs:
        results["job_overhead"] = job_overhead(args.overhead_runs)
        print(f"per-job overhead: {results['job_overhead']}", file=sys.stderr, flush=True)
    for spec in specs:
        results["models"].append(bench_model(spec, args))
        row = results["models"][-1]
        print(f"{spec.name}: cold {seconds_cell(row.get('cold'))} s, warm "
              f"{seconds_cell(row['warm'])} s, IREE {iree_cell(row.get('iree'))}, "
              f"ratio {ratio_cell(row.get('cold'), row.get('iree'))}", file=sys.stderr, flush=True)
        write_results(results, args.out)
    write_results(results, args.out)
    print(markdown(results))
    failed = [r["model"] for r in results["models"] for run in (r.get("cold"), r["warm"])
              if run and (run.get("verification") == "failed" or "error" in run)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
