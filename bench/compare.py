"""Side by side with the tools a user would pick instead (not part of the test run).

    python -m bench.compare [--models a,b] [--targets kirin9050,ascend910b] [--cache-dir DIR]
                            [--cold-models a,b] [--keep-cold-caches DIR] [--no-iree] [--no-tvm]
                            [--out bench/results/compare] [--update]

Per model, on the corpus input shapes, all in one run:
- kernels after: pypto-offline against onnxruntime's optimised graph (ORT_ENABLE_EXTENDED and
  ORT_ENABLE_ALL, saved through ``optimized_model_filepath``), onnxslim, onnxoptimizer, IREE
  (llvm-cpu: dispatches plus fill and copy commands) and TVM Relax (``call_tir`` kernels after its
  standard fusion, ``bench/tvm_baseline.py``). Every graph is checked against onnxruntime
  running the original model on the same inputs;
- kernels are counted the same way for every ONNX graph: one per node, reshape-likes free (IREE and
  TVM are counted in their own IR, as their modules say);
- per target: GM bytes before / after / lower bound, PyPTO cost model fused against one kernel per
  op, tuned against default tiles;
- compile time (warm cache for every model; for ``--cold-models``, cold on a fresh cache and warm
  on the cache that cold build filled) against
  onnxslim and IREE, and the peak memory of each compile (largest process of the compile's tree).
Ratios only: no absolute time is a threshold. Writes compare.md, compare.json and PNG plots.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from bench import corpus
from bench.corpus_build import below_cell
from pypto_offline.registry.ops import definition

TILE_GAIN = 0.20
# Runs a command and writes its wall time and the peak RSS of its largest process to a file
# (RUSAGE_CHILDREN: every waited-for descendant, workers included).
MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[2:], capture_output=True, text=True)
json.dump({"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr[:4000],
           "seconds": time.perf_counter() - started,
           "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024},
          open(sys.argv[1], "w"))
"""


def measured(command: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as record:
        subprocess.run([sys.executable, "-c", MEASURE, record.name, *map(str, command)],
                       check=True)
        return json.loads(Path(record.name).read_text())


def static_model(name: str) -> onnx.ModelProto:
    """The corpus model with the corpus input shapes written into its graph inputs."""
    return with_input_shapes(onnx.load(corpus.model_path(name)), corpus.MODELS[name].input_shapes)


def with_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """``model`` with these static shapes written into its graph inputs (in place)."""
    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[value.name]:
                dims.add().dim_value = size
    return model


def kernel_count(model: onnx.ModelProto) -> int:
    """One kernel per node; reshape-likes only rewrite metadata (the rule pypto-offline counts by)."""
    return sum(not definition(n.op_type, n.domain).view_only for n in model.graph.node)


def run_plain(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in wanted})


def max_abs_diff(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    diffs = [float(np.max(np.abs(np.asarray(o, np.float64) - np.asarray(r, np.float64))))
             if np.asarray(r).size else 0.0 for o, r in zip(outputs, reference)]
    return max(diffs, default=0.0)


def ort_optimised(model: onnx.ModelProto, level: str, folder: Path) -> tuple[onnx.ModelProto, float]:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(folder / f"{level}.onnx")
    options.log_severity_level = 3
    started = time.perf_counter()
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    seconds = time.perf_counter() - started
    return onnx.load(options.optimized_model_filepath), seconds


def onnxslim_cli(source: Path, folder: Path) -> tuple[onnx.ModelProto, dict]:
    out = folder / "slim.onnx"
    run = measured([Path(sys.executable).with_name("onnxslim"), source, out])
    if run["returncode"] != 0:
        raise RuntimeError(run["stderr"])
    return onnx.load(out), run


def onnxoptimizer_passes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, float]:
    import onnxoptimizer

    started = time.perf_counter()
    optimised = onnxoptimizer.optimize(model, onnxoptimizer.get_fuse_and_elimination_passes())
    return optimised, time.perf_counter() - started


def baselines(name: str, folder: Path, with_iree: bool, with_tvm: bool = True) -> dict:
    model = static_model(name)
    source = folder / f"{name}.static.onnx"
    onnx.save(model, source)
    feeds = corpus.MODELS[name].make_inputs(seed=0)
    reference = run_plain(model, feeds)
    rows = {"original": {"kernels": kernel_count(model)}}

    def graph_row(optimised, seconds, extra=None):
        try:
            diff = max_abs_diff(run_plain(optimised, feeds), reference)
        except Exception as error:  # noqa: BLE001 - a baseline that cannot run is a result
            diff = f"does not run: {str(error).splitlines()[0][:160]}"
        return {"kernels": kernel_count(optimised), "seconds": round(seconds, 3),
                "max_abs_diff": diff, **(extra or {})}

    for level in ("ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"):
        rows[level] = graph_row(*ort_optimised(model, level, folder))
    slim, run = onnxslim_cli(source, folder)
    rows["onnxslim"] = graph_row(slim, run["seconds"], {"peak_mb": round(run["peak_mb"])})
    if isinstance(rows["onnxslim"]["max_abs_diff"], str):
        # Seen on the ASR front ends: onnxslim breaks the model once its input shapes are static;
        # given the model as shipped (symbolic shapes) it works. Both results are kept.
        broken = rows["onnxslim"]
        slim, run = onnxslim_cli(corpus.model_path(name), folder)
        rows["onnxslim"] = graph_row(slim, run["seconds"], {"peak_mb": round(run["peak_mb"]),
                                                            "input": "as shipped",
                                                            "on_static_shapes": broken})
    rows["onnxoptimizer"] = graph_row(*onnxoptimizer_passes(model))
    if with_iree:
        from bench import iree_baseline

        rows["iree"] = iree_baseline.compile_and_check(source, feeds, reference, folder)
    if with_tvm:
        from bench import tvm_baseline

        rows["tvm"] = tvm_baseline.fuse_and_check(model, corpus.MODELS[name].input_shapes, feeds,
                                                  reference)
    return rows


def ours(name: str, target: str, cache: Path, folder: Path) -> dict:
    summary, message = cli_build(corpus.model_path(name), corpus.MODELS[name], target, cache,
                                 folder, "--no-report",
                                 "--measure-baseline")  # its unfused/fused ratio is a claim
    if message is None:
        return summary
    from pypto_offline.offline_compiler.summary import kernels_below_lower_bound

    kernels = [k for k in message.kernels if k.compiled]
    ratios = [k.tuned_tile.aicore_us / k.default_tile.aicore_us for k in kernels
              if k.default_tile.aicore_us]
    from bench.corpus_build import shipped_kernel_figures

    return {**summary, "tile_ratios": ratios,
            "gm_below_lower_bound": kernels_below_lower_bound(message),
            "shipped": shipped_kernel_figures(message),
            "tile_better": sum(r <= 1 - TILE_GAIN for r in ratios)}


def cli_build(source: Path, spec: corpus.CorpusModel, target: str, cache: Path, folder: Path,
              *options: str):
    """``pypto-offline`` on the command line, as a user runs it, on ``spec``'s input shapes and
    seeded inputs (checked against onnxruntime), timed: its ``--json`` summary with the wall
    seconds and peak MB of the whole process tree, and the blob's message (None, with
    ``{"error": ...}``, when the build failed)."""
    inputs = folder / f"{spec.name}.inputs.npz"
    np.savez(inputs, **spec.make_inputs(seed=0))
    blob = folder / f"{spec.name}.{target}.ptom"
    run = measured([sys.executable, "-m", "pypto_offline", source, "--target", target,
                    *spec.shape_args, "--inputs", inputs, "--cache-dir", cache, "-o", blob,
                    "--json", *options])
    if run["returncode"] not in (0, 1):  # 1: verification failed, the summary says so
        return {"error": (run["stderr"].strip().splitlines() or ["(no message)"])[-1]}, None
    from pypto_offline.offline_compiler import blob as blob_format

    summary = {**json.loads(run["stdout"]), "seconds": round(run["seconds"], 2),
               "peak_mb": round(run["peak_mb"])}
    return summary, blob_format.read(blob)


def bench_model(name: str, targets: list[str], cache: Path, cold: bool, with_iree: bool,
                keep_cold: Path | None = None, with_tvm: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        row = {"model": name, "baselines": baselines(name, folder, with_iree, with_tvm),
               "targets": {}}
        for target in targets:
            entry = {}
            # cold: a fresh cache, and warm means the same build again on what it filled
            used = _fresh_cache(keep_cold or folder, f"{name}-{target}") if cold else cache
            if cold:
                entry["cold"] = ours(name, target, used, folder)
            entry["warm"] = ours(name, target, used, folder)
            if "error" not in entry["warm"] and entry["warm"]["kernel_cache"]["compiled"]:
                entry["warm"] = ours(name, target, used, folder)  # the first run filled it
            row["targets"][target] = entry
    return row


def _fresh_cache(root: Path, name: str) -> Path:
    """An empty cache folder for a cold build (kept when under ``--keep-cold-caches``)."""
    path = root / f"fresh-cache-{name}"
    if path.exists() and any(path.iterdir()):
        raise SystemExit(f"{path} is not empty: a cold build needs a fresh cache folder")
    return path


def _fmt_diff(value) -> str:
    return f"{value:.1e}" if isinstance(value, float) else "✗"


def markdown(rows: list[dict], targets: list[str]) -> str:
    lines = ["## Kernels after (max abs diff against onnxruntime on the original model)", "",
             "| model | original | ORT extended | ORT all | onnxslim | onnxoptimizer | IREE "
             "dispatch+fill+copy | TVM Relax | "
             + " | ".join(f"pypto-offline {t}" for t in targets) + " |",
             "|---" * (8 + len(targets)) + "|"]
    for r in rows:
        b = r["baselines"]
        cells = [str(b["original"]["kernels"])]
        for key in ("ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL", "onnxslim", "onnxoptimizer"):
            shipped = "†" if b[key].get("input") == "as shipped" else ""
            cells.append(f"{b[key]['kernels']}{shipped} ({_fmt_diff(b[key]['max_abs_diff'])})")
        iree = b.get("iree")
        cells.append("—" if iree is None else
                     f"{iree['kernels']} = {iree['dispatches']}+{iree['fills']}+{iree['copies']} "
                     f"({_fmt_diff(iree['max_abs_diff'])})" if "kernels" in iree else
                     f"✗ {iree['error'][:60]}")
        tvm = b.get("tvm")  # rows measured before TVM was an anchor have none
        cells.append("—" if tvm is None else
                     f"{tvm['kernels']} ({_fmt_diff(tvm.get('max_abs_diff'))})" if "kernels" in tvm
                     else f"✗ {tvm['error'][:60]}")
        for t in targets:
            warm = r["targets"].get(t, {}).get("warm")
            cells.append("— (not run)" if warm is None else "✗" if "error" in warm else
                         f"{warm['kernels_after']} ({_fmt_diff(warm['verification']['max_abs_diff'])})")
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    lines += ["", "† onnxslim broke the model with static input shapes (its output does not run in "
              "onnxruntime); the figure is for the model as shipped, with symbolic shapes.",
              "", "## Ratios (pypto-offline, per target)", "",
              "| model | target | kernels ours/ORT-all | ours/IREE | ours/TVM | GM after/LB "
              "| kernels GM < LB | GM before/after | "
              "PyPTO unfused/fused | tiles ≥20% better | median tuned/default | compile s cold / warm "
              "| onnxslim s | IREE s | ours÷IREE cold / warm | peak MB ours cold / warm / IREE "
              "| conv kernels: GM/LB |",
              "|---" * 17 + "|"]
    for r in rows:
        b = r["baselines"]
        for t in (t for t in targets if t in r["targets"]):
            w, c = r["targets"][t]["warm"], r["targets"][t].get("cold")
            if "error" in w:
                lines.append(f"| {r['model']} | {t} | ✗ {w['error'][:80]} |" + " |" * 14)
                continue
            iree = b.get("iree", {})
            lines.append(" | ".join([
                f"| {r['model']}", t,
                _ratio(w["kernels_after"], b["ORT_ENABLE_ALL"]["kernels"]),
                _ratio(w["kernels_after"], iree.get("kernels")),
                _ratio(w["kernels_after"], b.get("tvm", {}).get("kernels")),
                _ratio(w["gm_bytes_after"], w["gm_bytes_lower_bound"]),
                below_cell(w),
                _ratio(w["gm_bytes_before"], w["gm_bytes_after"]),
                _ratio(w["pypto"]["cost_us_unfused"], w["pypto"]["cost_us_fused"]),
                f"{w['tile_better']}/{len(w['tile_ratios'])}",
                f"{statistics.median(w['tile_ratios']):.2f}" if w["tile_ratios"] else "—",
                f"{c['seconds'] if c and 'seconds' in c else '—'} / {w['seconds']}",
                str(b["onnxslim"]["seconds"]), str(iree.get("seconds", "—")),
                " / ".join(_ratio(ours_s, iree.get("seconds"))
                           for ours_s in (c.get("seconds") if c else None, w["seconds"])),
                f"{c['peak_mb'] if c and 'peak_mb' in c else '—'} / {w['peak_mb']} / "
                f"{iree.get('peak_mb', '—')}",
                f"{convolution_cell(w)} |"]))
    return "\n".join(lines)


def convolution_cell(warm: dict) -> str:
    """The kernels holding a windowed convolution: how many, and the least, median and most of
    their GM bytes over their lower bound (rows measured before issue 37 have none)."""
    kernels = (warm.get("shipped") or {}).get("convolutions")
    if kernels is None:
        return "—"
    if not kernels:
        return "0"
    ratios = sorted(k["gm_bytes"] / k["gm_bytes_lower_bound"] for k in kernels)
    return (f"{len(kernels)}: {ratios[0]:.2f}x / {statistics.median(ratios):.2f}x / "
            f"{ratios[-1]:.2f}x")


def invariant_broken(rows: list[dict]) -> list[str]:
    return [f"INVARIANT BROKEN: {r['model']} {t} ({run}): kernels {', '.join(below)} measure "
            f"fewer GM bytes than their lower bound"
            for r in rows for t, entry in r["targets"].items() for run, result in entry.items()
            for below in [result.get("gm_below_lower_bound")] if below]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if a and b else "—"


def plots(rows: list[dict], targets: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"] for r in rows]
    tools = [("original", lambda b, r: b["original"]["kernels"]),
             ("ORT all", lambda b, r: b["ORT_ENABLE_ALL"]["kernels"]),
             ("onnxslim", lambda b, r: b["onnxslim"]["kernels"]),
             ("onnxoptimizer", lambda b, r: b["onnxoptimizer"]["kernels"]),
             ("IREE", lambda b, r: b.get("iree", {}).get("kernels", 0)),
             ("TVM Relax", lambda b, r: b.get("tvm", {}).get("kernels", 0)),
             (f"pypto-offline {targets[0]}",
              lambda b, r: r["targets"].get(targets[0], {}).get("warm", {}).get("kernels_after", 0))]
    x = np.arange(len(names))
    width = 0.8 / len(tools)
    fig, ax = plt.subplots(figsize=(12, 5))
    for index, (label, value) in enumerate(tools):
        ax.bar(x + index * width, [value(r["baselines"], r) for r in rows], width, label=label)
    ax.set_xticks(x + 0.4 - width / 2, names, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("kernels launched")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("Kernels after each tool (same counting rule)")
    fig.tight_layout()
    fig.savefig(out / "kernels.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(12, 4))
    for index, target in enumerate(targets):
        warm = [r["targets"].get(target, {}).get("warm", {}) for r in rows]
        ax.bar(x + index * 0.4, [w["gm_bytes_after"] / w["gm_bytes_lower_bound"]
                                 if "gm_bytes_after" in w else 0 for w in warm], 0.4, label=target)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x + 0.2, names, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("GM bytes after / lower bound")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gm_bytes.png", dpi=110)
    plt.close(fig)


def merged(previous: list[dict], fresh: list[dict]) -> list[dict]:
    """``previous`` rows with this run's in their place: a model's targets measured now replace
    the same targets, its other targets stay (the baselines are this run's)."""
    by_model = {row["model"]: row for row in previous}
    for row in fresh:
        old = by_model.get(row["model"], {"targets": {}})
        by_model[row["model"]] = {**row, "targets": {**old["targets"], **row["targets"]}}
    order = list(corpus.MODELS)
    return sorted(by_model.values(), key=lambda row: order.index(row["model"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(corpus.MODELS))
    parser.add_argument("--targets", default="kirin9050,ascend910b")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="kernel cache for the warm builds (default: the user cache)")
    parser.add_argument("--cold-models", default="",
                        help="also compile these on a fresh cache (cold)")
    parser.add_argument("--keep-cold-caches", type=Path, default=None,
                        help="keep each cold build's cache in this folder (to reuse its kernels)")
    parser.add_argument("--no-iree", action="store_true")
    parser.add_argument("--no-tvm", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results/compare"))
    parser.add_argument("--update", action="store_true",
                        help="keep the other models' and targets' rows already in "
                        "OUT/compare.json")
    args = parser.parse_args(argv)
    from pypto_offline.pypto_kernels.cache import default_cache_dir

    cache = args.cache_dir or default_cache_dir()
    targets = args.targets.split(",")
    cold = set(filter(None, args.cold_models.split(",")))
    rows: list[dict] = []
    written, shown_targets = rows, targets
    for name in args.models.split(","):
        rows.append(bench_model(name, targets, cache, name in cold, not args.no_iree,
                                args.keep_cold_caches, not args.no_tvm))
        below = sum(len(run.get("gm_below_lower_bound") or []) for entry in
                    rows[-1]["targets"].values() for run in entry.values())
        print(f"{name}: done; kernels below their GM lower bound (all runs): {below}",
              file=sys.stderr, flush=True)
        for line in invariant_broken(rows[-1:]):
            print(line, file=sys.stderr, flush=True)
        written, shown_targets = write_results(rows, targets, args.out, args.update)
    plots(written, shown_targets, args.out)
    print(markdown(written, shown_targets))
    return 1 if invariant_broken(written) else 0  # flagged above, model by model


def write_results(rows: list[dict], targets: list[str], out: Path, update: bool
                  ) -> tuple[list[dict], list[str]]:
    """compare.json and compare.md with the rows so far (after every model, so a long run
    that stops keeps what it measured), merged into the rows already there with ``update``.
    Each file is written to a temporary name and renamed into place."""
    out.mkdir(parents=True, exist_ok=True)
    if update and (out / "compare.json").exists():
        rows = merged(json.loads((out / "compare.json").read_text()), rows)
        targets = list(dict.fromkeys(t for row in rows for t in row["targets"]))
    for name, text in (("compare.json", json.dumps(rows, indent=1, default=str)),
                       ("compare.md", markdown(rows, targets) + "\n")):
        partial = out / f".{name}.partial"
        partial.write_text(text)
        partial.replace(out / name)
    return rows, targets


if __name__ == "__main__":
    sys.exit(main())
