"""Each target under its own platform inside PyPTO, against the 910B platform (docs/platform.md).

    python -m bench.platforms --record NAME [--models example,a,b] [--targets t1,t2]
                              [--cache-dir DIR] [--out bench/results/platforms]
    python -m bench.platforms --table NAME --against BASE [--out ...]

``--record`` compiles (and verifies) each model for each target and writes ``NAME.json``: per
build its kernels, the platform its blob records, and per kernel the shipped tile, its PyPTO
cost-model time and UB peak, and the candidates PyPTO refused with its reason. Run with the
code before issue 35 (``PYTHONPATH=<a worktree of 850135c> python bench/platforms.py``) it records
the same builds under PyPTO 0.2.0's 910B platform, which every target compiled under then (the
three Kirin targets identically: one UB plan, one platform; so one Kirin target stands for all).

``--table`` writes ``NAME.md``: per target and model, kernels, the kernels whose shipped tile
changed against ``BASE``, and the summed PyPTO time here and there. Not part of the test run.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a file, with another tree's pypto_offline first on the path
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench import corpus  # noqa: E402

OUT = Path(__file__).resolve().with_name("results") / "platforms"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "example.onnx"
DEFAULT_MODELS = "example,ppocr_cls_v2,tf_bert_encoder,silero_vad_16k_static"
KIRIN = ("kirin90", "kirin9030", "kirin9050")


def source(name: str) -> tuple[Path, dict]:
    if name == "example":
        return EXAMPLE, {"x": [1, 3, 64, 64]}
    return corpus.model_path(name), corpus.MODELS[name].input_shapes


def tile_of(kernel) -> dict | None:
    if not kernel.HasField("tuned_tile"):
        return None
    t = kernel.tuned_tile
    return {"budget": t.budget_bytes, "swapped": t.swapped_transposes, "flat": t.flat_rows,
            "merge": t.vec_merge, "us": t.aicore_us if t.HasField("aicore_us") else None,
            "ub": t.ub_bytes if t.HasField("ub_bytes") else None}


def record_build(name: str, target: str, cache_dir: Path) -> dict:
    import pypto_offline

    path, shapes = source(name)
    compiled = pypto_offline.compile(path, target, shapes, cache_dir=cache_dir, verify=True)
    summary = compiled.summary()
    kernels = [{"id": k.id, "ops": [op.op_type for op in k.original], "compiled": k.compiled,
                "tile": tile_of(k) if k.compiled else None,
                "refused": [c.error for c in k.candidates if getattr(c, "error", "")]}
               for k in compiled.message.kernels]
    return {"model": name, "target": target, "kernels_after": summary["kernels_after"],
            "compiled": summary["pypto"]["compiled"],
            "verification": summary["verification"]["status"],
            "platform": summary.get("platform"), "kernels": kernels}


def record(args) -> int:
    """Each build's row, written after each build (an interrupted run keeps what it built);
    rows already in ``NAME.json`` for another model or target stay."""
    path = args.out / f"{args.record}.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        for target in args.targets.split(","):
            row = record_build(name, target, args.cache_dir / target)
            rows = [r for r in rows if (r["model"], r["target"]) != (name, target)] + [row]
            path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
            print(f"{name} {target}: {row['kernels_after']} kernels, {row['compiled']} compiled, "
                  f"{row['verification']}", file=sys.stderr, flush=True)
    return 0


def _base_for(base: dict, model: str, target: str) -> dict | None:
    """The 910B-platform build a build compares against: its own target's, or for a Kirin
    target any Kirin target's (they compiled identically under the 910B platform)."""
    names = KIRIN if target in KIRIN else (target,)
    return next((base[(model, t)] for t in names if (model, t) in base), None)


def _pypto_us(row: dict) -> float:
    return round(sum(k["tile"]["us"] or 0 for k in row["kernels"] if k["tile"]), 3)


def table(args) -> int:
    rows = json.loads((args.out / f"{args.table}.json").read_text())
    base = {(r["model"], r["target"]): r for r in
            json.loads((args.out / f"{args.against}.json").read_text())}
    lines = [f"# Each target under its own platform ({args.table}) against the 910B platform "
             f"({args.against})", "",
             "| target | platform | model | kernels | compiled | verified | tiles changed | "
             "refused candidates | PyPTO µs (own) | PyPTO µs (910B platform) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: (r["target"], r["model"])):
        before = _base_for(base, row["model"], row["target"])
        tiles = {k["id"]: k["tile"] for k in before["kernels"]} if before else {}
        changed = sum(1 for k in row["kernels"] if k["tile"] and k["id"] in tiles and
                      _shape(k["tile"]) != _shape(tiles[k["id"]]))
        compared = sum(1 for k in row["kernels"] if k["tile"] and tiles.get(k["id"]))
        platform = row["platform"] or {}
        kind = "native" if platform.get("native") else "overlay"
        lines.append(
            f"| {row['target']} | {platform.get('chip', '?')} ({kind}) | {row['model']} | "
            f"{row['kernels_after']} | {row['compiled']} | {row['verification']} | "
            f"{changed} of {compared} | {sum(len(k['refused']) for k in row['kernels'])} | "
            f"{_pypto_us(row)} | {_pypto_us(before) if before else '—'} |")
    (args.out / f"{args.table}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _shape(tile: dict) -> tuple:
    return tile["budget"], tile["swapped"], tile["flat"], tile["merge"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record")
    parser.add_argument("--table")
    parser.add_argument("--against")
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--targets", default="kirin90,kirin9030,kirin9050,ascend910b,ascend950")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "bench-platforms")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if bool(args.record) == bool(args.table) or (args.table and not args.against):
        parser.error("give --record NAME, or --table NAME --against BASE")
    return record(args) if args.record else table(args)


if __name__ == "__main__":
    sys.exit(main())
