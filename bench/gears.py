"""Gears against separate builds (issue 38, docs/gears.md): each model's gears built as one
blob, cold, and as one build per gear, cold, in one run: wall time, kernels stored against
kernels referenced, blob bytes, every gear verified.

    python -m bench.gears --out bench/results/gears [--models ppocrv4_rec,asr_frontend_kaldi]

The cases: the corpus's KV-cache decoders exported with a symbolic past
(``corpus.dynamic_past_path``) at past lengths 16, 32, 64 and 128; ppocrv4_rec's text lines 160,
320 and 640 wide; asr_frontend_kaldi on 0.5, 1 and 2 s of audio.

Each build is ``python -m pypto_offline`` in a process of its own (``--json``), as a pipeline
runs it. Cold: the blob of gears starts from an empty kernel cache; the separate builds from
another empty one, which they share in turn (a pipeline's cache), so a kernel two gears share
compiles once either way. The separate builds give each gear's shapes outright.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import corpus

OUT = Path(__file__).resolve().with_name("results") / "gears"
TARGET = "kirin9050"

PASTS, WIDTHS, SAMPLES = (16, 32, 64, 128), (160, 320, 640), (8000, 16000, 32000)
# model → (its file, what its gears are, the gear options, each gear's options for a build of
# its shapes alone)
CASES = {
    **{name: (lambda name=name: corpus.dynamic_past_path(name),
              "past " + "/".join(map(str, PASTS)),
              ["--dim", "past=" + ",".join(map(str, PASTS))],
              [["--dim", f"past={past}"] for past in PASTS]) for name in corpus.DYNAMIC_PAST},
    "ppocrv4_rec": (lambda: corpus.model_path("ppocrv4_rec"),
                    "width " + "/".join(map(str, WIDTHS)),
                    ["--input_shape", "x:1,3,48,-1", "--dynamic_dims",
                     ";".join(map(str, WIDTHS))],
                    [["--input_shape", f"x:1,3,48,{w}"] for w in WIDTHS]),
    "asr_frontend_kaldi": (lambda: corpus.model_path("asr_frontend_kaldi"),
                           "samples " + "/".join(map(str, SAMPLES)),
                           ["--dim", "batch_size=1", "--dim",
                            "N=" + ",".join(map(str, SAMPLES))],
                           [["--dim", "batch_size=1", "--dim", f"N={n}"] for n in SAMPLES]),
}


def build(model: Path, options: list[str], out: Path, cache: Path) -> tuple[dict, float]:
    """One build's --json summary and its wall time."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pypto_offline", str(model), "--target", TARGET,
                           "-o", str(out), "--no-report", "--json", "--quiet", "--cache-dir",
                           str(cache), *options], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{model.name} {' '.join(options)}: exit {done.returncode}\n"
                         f"{done.stderr[-2000:]}")
    return json.loads(done.stdout), seconds


def measure(name: str) -> dict:
    path, label, geared_options, separate_options = CASES[name]
    model = path()
    with tempfile.TemporaryDirectory(prefix="bench-gears-") as folder:
        work = Path(folder)
        summary, geared_s = build(model, geared_options, work / "gears.ptom", work / "cache1")
        separate = [build(model, options, work / f"gear{i}.ptom", work / "cache2")
                    for i, options in enumerate(separate_options)]
        separate_bytes = sum((work / f"gear{i}.ptom").stat().st_size
                             for i in range(len(separate)))
        geared_bytes = (work / "gears.ptom").stat().st_size
    gears = summary["gears"]
    return {"model": name, "label": label, "gears": [g["inputs"] for g in gears],
            "geared_s": round(geared_s, 1),
            "separate_s": round(sum(s for _, s in separate), 1),
            "kernels_stored": sum(g["kernels_stored"] for g in gears),
            "kernels_referenced": sum(g["kernels_referenced"] for g in gears),
            "kernels_separate": sum(len(s["kernels"]) for s, _ in separate),
            "kernels_after": [g["kernels_after"] for g in gears],
            "separate_kernels_after": [s["kernels_after"] for s, _ in separate],
            "blob_bytes": geared_bytes, "separate_blob_bytes": separate_bytes,
            "verified": [g["verification"]["status"] for g in gears],
            "separate_verified": [s["verification"]["status"] for s, _ in separate],
            "pypto_compiles": summary["kernel_cache"]["pypto_compiles"],
            "separate_pypto_compiles": sum(s["kernel_cache"]["pypto_compiles"]
                                           for s, _ in separate)}


def table(rows: list[dict]) -> str:
    lines = ["| model | gears | build s: gears / separate | kernels stored + referenced "
             "(separate) | PyPTO compiles (separate) | blob bytes (separate) | verified |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['label']} | {r['geared_s']} / {r['separate_s']} "
            f"({r['geared_s'] / r['separate_s']:.2f}x) | {r['kernels_stored']} + "
            f"{r['kernels_referenced']} ({r['kernels_separate']}) | {r['pypto_compiles']} "
            f"({r['separate_pypto_compiles']}) | {r['blob_bytes']:,} "
            f"({r['separate_blob_bytes']:,}) | {', '.join(r['verified'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        rows.append(measure(name))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        (args.out / "gears.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "gears.md").write_text(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
