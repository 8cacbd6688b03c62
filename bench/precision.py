"""The corpus in fp32 and in fp16 modes (docs/precision.md).

    python -m bench.precision --record NAME [--models example,a,b] [--modes m1,m2]
                              [--target kirin9050] [--cache-dir DIR] [--out bench/results/precision]
    python -m bench.precision --table NAME [--out ...]

``--record`` compiles and verifies each model in each precision mode and writes ``NAME.json``
(one row per build, written after each: an interrupted run keeps what it built): GM bytes after
fusion, the PyPTO cost model's summed fused time, the whole model's time (``model_us``), each
kernel's PyPTO time and bytes, the regions that fell back, each output's metrics against the
original model and each kernel's on its values, the verdict. ``--table`` writes ``NAME.md``: per
model, each fp16 mode against must_keep_origin_dtype (bytes; the whole model's time: each
kernel's launch with its PyPTO time, the build's estimate for the rest; the regions that fall
back only in fp16, ``fell_back_only_here``; the least cosine of an output and of a kernel).
Not part of the test run.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench import corpus  # noqa: E402
from bench.platforms import source  # noqa: E402

OUT = Path(__file__).resolve().with_name("results") / "precision"
# Classifiers whose top-1 class on the verification's inputs must be the fp32 model's
CLASSIFIERS = ("magika_v3_3", "ppocr_cls_v2")
MODES = "must_keep_origin_dtype,allow_mix_precision,force_fp16"
BASE = "must_keep_origin_dtype"


def record_build(name: str, target: str, mode: str, cache_dir: Path) -> dict:
    import pypto_offline
    from pypto_offline.errors import PyptoOfflineError

    path, shapes = source(name)
    try:
        compiled = pypto_offline.compile(path, target, shapes, cache_dir=cache_dir, verify=True,
                                         precision_mode=mode)
    except PyptoOfflineError as error:
        return {"model": name, "mode": mode, "error": str(error)}
    s = compiled.summary()
    check = s["verification"]
    top1 = same_top1(path, shapes, compiled) if name in CLASSIFIERS else None
    return {"model": name, "mode": mode, "gm_bytes_after": s["gm_bytes_after"],
            "pypto_us_fused": s["pypto"]["cost_us_fused"], "kernels_after": s["kernels_after"],
            "model_us": model_us(s, target),
            "kernels": [{"id": k["id"], "ops": k["ops"], "status": k["status"],
                         "pypto_us": k["tuned_us"], "gm_bytes": k["gm_bytes"]}
                        for k in s["kernels"]],
            "compiled": s["pypto"]["compiled"],
            "fell_back": sorted(k["id"] + ": " + (k["fallback_category"] or "")
                                for k in s["kernels"] if k["status"] == "fell_back"),
            "fell_back_ops": sorted("+".join(k["ops"]) for k in s["kernels"]
                                    if k["status"] == "fell_back"),
            "outputs": check["metrics"], "verification": check["status"],
            "kernels_beyond": check.get("kernels_beyond_thresholds", []),
            "kernel_cosines": {k["id"]: k["precision"]["cosine"] for k in s["kernels"]
                               if k["precision"] and "cosine" in k["precision"]},
            "kept_fp32": len((s["precision"] or {}).get("kept_fp32", [])),
            "beyond_fp16": len((s["precision"] or {}).get("beyond_fp16", [])),
            "same_top1": top1}


def model_us(summary: dict, target_name: str) -> float:
    """The whole model's time, one formula for every mode: a launch for every kernel (the
    target's launch cost), with each compiled kernel's PyPTO time and, for every other kernel
    (ops left unfused, regions that fell back), its bytes at the chip's bandwidth (the build's
    own estimate). Until run4 a compiled kernel was counted without its launch, so a build
    with more regions compiled, or fewer ops left out, looked faster by 20 us a kernel on
    kirin9050 whatever its kernels took. PyPTO's ``cost_us_fused``
    sums only the kernels it could compare with their ops unfused, a set that changes with
    the mode (a reduction left alone in fp32 joins its cast in fp16), so it cannot compare
    two modes."""
    from pypto_offline.fusion.cost import time_us
    from pypto_offline.targets import resolve_target

    target = resolve_target(target_name)
    compiled = [k for k in summary["kernels"] if k["status"] == "compiled"]
    # the build's estimate with each compiled kernel's bytes replaced by its PyPTO time
    return round(summary["est_time_us_after"] + sum(
        k["tuned_us"] - time_us(0, k["gm_bytes"], target) for k in compiled), 3)


def same_top1(path: Path, shapes: dict, compiled) -> bool:
    """The compiled graph's top-1 class (the argmax of its first output's last axis) is the
    original model's, on the verification's inputs (seed 0), for every row."""
    import onnx

    from pypto_offline.importer import import_model
    from pypto_offline.runtime import generate_inputs, in_input_types, run_model

    original = import_model(path, shapes).model
    feeds = generate_inputs(original, 0)
    graph = onnx.load_from_string(compiled.message.onnx_model)
    want = next(iter(run_model(original, feeds).values()))
    got = next(iter(run_model(graph, in_input_types(graph, feeds)).values()))
    return bool((want.argmax(-1) == got.argmax(-1)).all())


def record(args) -> int:
    path = args.out / f"{args.record}.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            row = record_build(name, args.target, mode, args.cache_dir)
            rows = [r for r in rows if (r["model"], r["mode"]) != (name, mode)] + [row]
            path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
            print(f"{name} {mode}: {row.get('error') or row['verification']}", file=sys.stderr,
                  flush=True)
    return 0


def fell_back_only_here(fell_back: list[str], in_base: list[str]) -> list[str]:
    """The regions (their ops joined by '+') that fell back in an fp16 mode but are no part of
    one that fell back in fp32: the conversion's Casts aside, their ops are not found among one
    fp32 fallback's (a fallback is cut in parts, each tried again: whisper80's fp32
    normalisation falls back whole, and in fp16 its parts, Casts in them, fall back too)."""
    def ops(joined: str) -> Counter:
        return Counter(op for op in joined.split("+") if op != "Cast")

    bases = [ops(joined) for joined in in_base]
    return sorted(joined for joined in set(fell_back)
                  if not any(ops(joined) <= base for base in bases))


def table(args) -> int:
    rows = json.loads((args.out / f"{args.table}.json").read_text())
    by = {(r["model"], r["mode"]): r for r in rows}
    lines = ["| model | mode | GM bytes vs fp32 | model µs (fp32) | kernels (fp32) | fall back "
             "only here | least output cosine | least kernel cosine | beyond fp16 | top-1 as "
             "fp32 | verification |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (name, mode), r in sorted(by.items()):
        base = by.get((name, BASE))
        if mode == BASE or base is None or "error" in r or "error" in base:
            if "error" in r:
                lines.append(f"| {name} | {mode} | error: {r['error'][:80]} | | | | | | | | |")
            continue
        only = fell_back_only_here(r["fell_back_ops"], base["fell_back_ops"])
        cosines = [m["cosine"] for m in r["outputs"].values()]
        lines.append(
            f"| {name} | {mode} | {r['gm_bytes_after'] / base['gm_bytes_after']:.2f} | "
            f"{_us(r.get('model_us'))} ({_us(base.get('model_us'))}) | {r['kernels_after']} "
            f"({base['kernels_after']}) | {len(only)} | {min(cosines, default=1):.6f} | "
            f"{min(r['kernel_cosines'].values(), default=1):.6f} | {r.get('beyond_fp16', '—')} "
            f"| {_yes(r.get('same_top1'))} | {r['verification']} |")
    (args.out / f"{args.table}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _yes(value) -> str:
    return "—" if value is None else "yes" if value else "NO"


def _us(value) -> str:
    return "—" if value is None else f"{value:.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record")
    parser.add_argument("--table")
    parser.add_argument("--models", default=",".join(["example", *corpus.MODELS]))
    parser.add_argument("--modes", default=MODES)
    parser.add_argument("--target", default="kirin9050")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path.home() / ".cache" / "pypto-offline" / "bench-precision")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    return record(args) if args.record else table(args) if args.table else parser.error(
        "give --record NAME or --table NAME")


if __name__ == "__main__":
    sys.exit(main())
