"""PyPTO kernel benchmark over the corpus (not part of the test run).

    python -m bench.kernels_bench [--models a,b] [--target kirin9050] [--unfused-sample 8]
                                  [--out bench/results/kernels]

Per model: regions compiled and functionally checked against fallen back (with reasons); GM bytes
counted from each compiled program against the region's lower bound; tuned tile against the default
tile; for a sample of regions, the fused kernel against the same ops compiled one kernel each (all
times from PyPTO's cost model, AICore end-to-end µs, tile search on both sides). Also the
Slice→Pad→Tile anchor (the pattern of the project's first fused kernel, docs/compile-time.md;
synthetic, labelled as such) and cold against warm compile time of one model. Ratios only: no absolute time is a threshold.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import corpus
from pypto_offline import import_model
from pypto_offline.fusion import plan_fusion
from pypto_offline.pypto_kernels import compile_kernels
from pypto_offline.pypto_kernels.compiler import setup_for
from pypto_offline.pypto_kernels.measured_baseline import unfused_costs
from pypto_offline.targets import TARGETS

GM_SLACK = 1.05
TILE_GAIN = 0.20


def bench_model(name: str, target, cache_dir: Path, jobs: int, sample: int) -> dict:
    spec = corpus.MODELS[name]
    graph = import_model(corpus.model_path(name), spec.input_shapes)
    plan = plan_fusion(graph, target)
    started = time.perf_counter()
    kernels = compile_kernels(graph, plan, target, cache_dir=cache_dir, jobs=jobs)
    seconds = time.perf_counter() - started
    regions = {r.id: r for r in plan.regions}
    rows = []
    for kernel in kernels:
        region = regions[kernel.region_id]
        row = {"region": kernel.region_id, "ops": [op.op_type for op in region.original],
               "compiled": kernel.compiled, "reason": kernel.fallback_reason,
               "lower_bound": region.fused.gm_bytes}
        if kernel.tuned_tile is not None:
            row.update(gm_measured=kernel.gm_bytes, tuned_us=kernel.tuned_tile.aicore_us,
                       default_us=kernel.default_tile.aicore_us if kernel.default_tile else None,
                       tuned_budget=kernel.tuned_tile.budget_bytes)
        rows.append(row)
    compiled = [r for r in rows if r["compiled"]]
    sampled = sorted(compiled, key=lambda r: -len(r["ops"]))[:sample]
    baselines = unfused_costs(graph, [regions[row["region"]] for row in sampled],
                              setup_for(target, cache_dir), jobs=jobs)
    for row in sampled:
        if baselines[row["region"]] is not None:
            row["unfused_us"] = baselines[row["region"]]
    return {"model": name, "regions": len(rows), "compiled": len(compiled),
            "fell_back": [(r["region"], r["reason"]) for r in rows if not r["compiled"]],
            "compile_seconds": round(seconds, 1), "kernels": rows}


def anchor_slice_pad_tile(target, cache_dir: Path) -> dict:
    """The Slice→Pad→Tile anchor: x[1,64,128,128] fp16, Slice H,W 8:120, Pad +16 bottom/right,
    Tile x2 on W. Synthetic: the pattern of the seed's claim, not a corpus model."""
    import numpy as np
    import onnx

    from tests.onnx_builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", [1, 64, 128, 128], onnx.TensorProto.FLOAT16)
    y = b.op("Slice", [x], starts=[8, 8], ends=[120, 120], axes=[2, 3])
    pad_value = b.const(np.float16(0), np.float16)
    pads = b.const([0, 0, 0, 0, 0, 0, 16, 16])
    padded = b.op("Pad", [y, pads, pad_value])
    tiled = b.op("Tile", [padded], repeats=[1, 1, 1, 2])
    graph = import_model(b.model(tiled))
    plan = plan_fusion(graph, target)
    (kernel,) = compile_kernels(graph, plan, target, cache_dir=cache_dir)
    (unfused,) = unfused_costs(graph, plan.regions, setup_for(target, cache_dir)).values()
    return {"fused_us": kernel.tuned_tile.aicore_us if kernel.compiled else None,
            "unfused_us": unfused, "compiled": kernel.compiled, "reason": kernel.fallback_reason}


def cold_and_warm(name: str, target, jobs: int) -> dict:
    spec = corpus.MODELS[name]
    graph = import_model(corpus.model_path(name), spec.input_shapes)
    plan = plan_fusion(graph, target)
    with tempfile.TemporaryDirectory() as fresh:
        timings = []
        for _ in range(2):
            started = time.perf_counter()
            kernels = compile_kernels(graph, plan, target, cache_dir=Path(fresh), jobs=jobs)
            timings.append((time.perf_counter() - started, sum(not k.from_cache for k in kernels)))
    return {"model": name, "cold_s": round(timings[0][0], 2), "warm_s": round(timings[1][0], 3),
            "warm_compiles": timings[1][1]}


def summarise(models: list[dict], anchor: dict, rebuild: dict) -> str:
    lines = ["| model | regions | compiled+checked | fell back | GM ≤ 1.05×LB | tile ≥20% better "
             "| median tuned/default | compile s |", "|---|---|---|---|---|---|---|---|"]
    gains, speedups, misses = [], [], []
    for m in models:
        done = [k for k in m["kernels"] if k["compiled"]]
        within = [k for k in done if k["gm_measured"] <= GM_SLACK * k["lower_bound"]]
        better = [k for k in done if k["default_us"] and k["tuned_us"] <= (1 - TILE_GAIN) * k["default_us"]]
        ratios = [k["tuned_us"] / k["default_us"] for k in done if k["default_us"]]
        gains += ratios
        misses += [(m["model"], k["region"], round(k["gm_measured"] / k["lower_bound"], 2),
                    "+".join(k["ops"])) for k in done if k not in within]
        speedups += [k["unfused_us"] / k["tuned_us"] for k in done if k.get("unfused_us")]
        lines.append(f"| {m['model']} | {m['regions']} | {m['compiled']} | {len(m['fell_back'])} | "
                     f"{len(within)}/{len(done)} | {len(better)}/{len(done)} | "
                     f"{statistics.median(ratios) if ratios else float('nan'):.2f} | "
                     f"{m['compile_seconds']} |")
    lines.append("")
    lines.append(f"Fused against one-kernel-per-op (sampled regions, PyPTO cost model): median "
                 f"{statistics.median(speedups) if speedups else float('nan'):.2f}× over "
                 f"{len(speedups)} regions; tuned/default tile median "
                 f"{statistics.median(gains) if gains else float('nan'):.2f}.")
    if anchor.get("fused_us") and anchor.get("unfused_us"):
        lines.append(f"Slice→Pad→Tile anchor (synthetic, 1x64x128x128 fp16): fused "
                     f"{anchor['fused_us']:.2f} µs against {anchor['unfused_us']:.2f} µs unfused "
                     f"= {anchor['unfused_us'] / anchor['fused_us']:.2f}×.")
    lines.append(f"Compile {rebuild['model']}: cold {rebuild['cold_s']} s, warm {rebuild['warm_s']} s "
                 f"({rebuild['warm_compiles']} PyPTO compiles when warm).")
    lines.append("")
    lines.append(f"Kernels above 1.05× the lower bound ({len(misses)}):")
    lines += [f"- {m} {r}: {ratio}× ({ops})" for m, r, ratio, ops in misses]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(corpus.MODELS))
    parser.add_argument("--target", default="kirin9050")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--unfused-sample", type=int, default=6)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--rebuild-model", default="asr_frontend_whisper80_conv")
    parser.add_argument("--out", type=Path, default=Path("bench/results/kernels"))
    args = parser.parse_args(argv)
    target = TARGETS[args.target]
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="kernel-bench-"))
    models = []
    for name in args.models.split(","):
        models.append(bench_model(name, target, cache_dir, args.jobs, args.unfused_sample))
        print(f"{name}: {models[-1]['compiled']}/{models[-1]['regions']} compiled "
              f"in {models[-1]['compile_seconds']} s", file=sys.stderr, flush=True)
    anchor = anchor_slice_pad_tile(target, cache_dir)
    rebuild = cold_and_warm(args.rebuild_model, target, args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.json").write_text(json.dumps(
        {"target": args.target, "models": models, "anchor": anchor, "rebuild": rebuild},
        indent=1, default=str))
    table = summarise(models, anchor, rebuild)
    (args.out / "kernels.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
