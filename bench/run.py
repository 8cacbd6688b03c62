"""``pypto-offline run --loop 20`` on corpus models (issue 51, docs/runtime.md): each blob's host
time per run and its modelled device time, next to onnxruntime's own time for the original model
on the same inputs, in the same process.

    python -m bench.run --out bench/results/run [--models asr_frontend_kaldi,...] [--loop 20]

Each model is built for the target in a process of its own (``python -m pypto_offline``, the
default kernel cache: warm when the corpus was built before), its .onnx left aside; then, here,
``run`` (``cli.main``, --json) executes the blob alone --loop times on the corpus's seeded inputs,
and onnxruntime runs the original model as many times (one session, made before the clock
starts, as ais_bench times a loaded model). The outputs are compared too: ``run`` is a reference
runtime, its outputs must be onnxruntime's.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import corpus

OUT = Path(__file__).resolve().with_name("results") / "run"
TARGET = "kirin9050"
# Small corpus models that build in seconds from a warm cache (bench/results/corpus_build/)
MODELS = ("asr_frontend_kaldi", "silero_vad_16k_static", "asr_frontend_nemo80",
          "asr_frontend_whisper80_conv")


def build(name: str, blob: Path) -> float:
    """The model's blob for TARGET (its seconds), built without verification: ``run`` is
    compared with onnxruntime here."""
    model = corpus.MODELS[name]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pypto_offline", str(corpus.model_path(name)),
                           "--target", TARGET, *model.shape_args, "-o", str(blob), "--no-report",
                           "--no-verify", "--quiet"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: build exit {done.returncode}\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def run_blob(blob: Path, inputs: Path, outputs: Path, loop: int) -> dict:
    """``pypto-offline run --json`` in this process: its summary."""
    from pypto_offline import cli

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main(["run", str(blob), "--inputs", str(inputs), "--output-dir", str(outputs),
                         "--loop", str(loop), "--json"])
    if code != 0:
        raise SystemExit(f"{blob.name}: run exit {code}")
    return json.loads(stdout.getvalue())


def onnxruntime_times(name: str, feeds: dict, loop: int) -> tuple[list[float], list]:
    """onnxruntime's seconds per run of the original model, and its outputs."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(corpus.model_path(name)),
                                           providers=["CPUExecutionProvider"])
    seconds, outputs = [], None
    for _ in range(loop):
        started = time.perf_counter()
        outputs = session.run(None, feeds)
        seconds.append(time.perf_counter() - started)
    return seconds, outputs


def max_difference(summary: dict, expected: list) -> float:
    worst = 0.0
    for output, want in zip(summary["outputs"], expected):
        got = np.load(output["file"], allow_pickle=False)
        if got.shape != np.shape(want):
            return float("inf")
        if got.size:
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    return worst


def measure(name: str, loop: int) -> dict:
    model = corpus.MODELS[name]
    feeds = model.make_inputs(seed=0)
    with tempfile.TemporaryDirectory(prefix="bench-run-") as folder:
        work = Path(folder)
        build_s = build(name, work / f"{name}.ptom")
        np.savez(work / "inputs.npz", **feeds)
        summary = run_blob(work / f"{name}.ptom", work / "inputs.npz", work / "outputs", loop)
        ort_seconds, expected = onnxruntime_times(name, feeds, loop)
        difference = max_difference(summary, expected)
    host, device = summary["host"], summary["device"]
    by = sorted({k["by"] for k in summary["kernels"]})
    return {"model": name, "target": TARGET, "loop": loop, "build_s": round(build_s, 1),
            "run_ms": {"min": host["min_ms"], "median": host["median_ms"],
                       "max": host["max_ms"]},
            "onnxruntime_ms": {"min": round(min(ort_seconds) * 1e3, 3),
                               "median": round(statistics.median(ort_seconds) * 1e3, 3),
                               "max": round(max(ort_seconds) * 1e3, 3)},
            "device_us": device["total_us"], "device_kernels": len(device["kernels"]),
            "device_kernels_us": round(sum(k["total_us"] for k in device["kernels"]), 3),
            "device_unfused_us": device["unfused_us"], "unfused_ops": device["unfused_ops"],
            "launch_us": device["launch_us"], "kernels_run_by": by,
            "max_abs_diff_vs_onnxruntime": difference}


def table(rows: list[dict]) -> str:
    lines = ["| model | runs | run: host ms min / median / max | onnxruntime ms min / median / "
             "max | modelled device µs (kernels + unfused) | kernels run by | max abs diff |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        run, ort = r["run_ms"], r["onnxruntime_ms"]
        lines.append(
            f"| {r['model']} | {r['loop']} | {run['min']:.3f} / {run['median']:.3f} / "
            f"{run['max']:.3f} | {ort['min']:.3f} / {ort['median']:.3f} / {ort['max']:.3f} | "
            f"{r['device_us']:.1f} ({r['device_kernels']} kernels {r['device_kernels_us']:.1f} + "
            f"{r['unfused_ops']} ops {r['device_unfused_us']:.1f}) | "
            f"{', '.join(r['kernels_run_by']) or '-'} | {r['max_abs_diff_vs_onnxruntime']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--loop", type=int, default=20)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        rows.append(measure(name, args.loop))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        (args.out / "run.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "run.md").write_text(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
