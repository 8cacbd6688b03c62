"""Why memory-bound ops stay unfused, model by model (issue 19): each corpus model built through
the whole pipeline (estimated baseline, tile search), its unfused ops counted by category and
its planned regions that fell back counted by cause: a PyPTO compile that failed, a failed
functional check, a time-out, or another reason. Not part of the test run: it compiles every
kernel.

    python -m bench.fallbacks [--targets kirin9050] [--models a,b] [--out FILE.json]

Run it at two commits (``PYTHONPATH`` to the older one's checkout) to compare them: the record
names the commit it measured.
"""
from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

from bench import corpus
import pypto_offline
from pypto_offline.offline_compiler.summary import fallback_category

def measure(name: str, target: str, cache_dir: Path | None, jobs: int) -> dict:
    spec = corpus.MODELS[name]
    started = time.perf_counter()
    compiled = pypto_offline.compile(corpus.model_path(name), target, spec.input_shapes,
                                     cache_dir=cache_dir, jobs=jobs)
    message = compiled.message
    unfused = collections.Counter(u.category for u in message.unfused)
    ops_left = collections.Counter(f"{u.op_type}: {u.reason[:90]}" for u in message.unfused
                                   if u.category == "cannot express")
    fell_back = [k for k in message.kernels if not k.compiled]
    return {"model": name, "target": target, "kernels_before": message.totals.kernels_before,
            "kernels_after": message.totals.kernels_after,
            "fused_kernels": sum(k.compiled for k in message.kernels),
            "unfused_by_category": dict(sorted(unfused.items())),
            "cannot_express": dict(ops_left.most_common()),
            "fell_back_by_cause": dict(sorted(collections.Counter(
                fallback_category(k) for k in fell_back).items())),
            "fell_back": {k.id: k.fallback_reason[:200] for k in fell_back},
            "seconds": round(time.perf_counter() - started, 1)}


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=Path(pypto_offline.__file__).parent)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="kirin9050")
    parser.add_argument("--models", default=",".join(corpus.MODELS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench/results/fallbacks/fallbacks.json"))
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"commit": commit(), "rows": []}
    for name in args.models.split(","):
        for target in args.targets.split(","):
            row = measure(name, target, args.cache_dir, args.jobs)
            record["rows"].append(row)
            print(f"{name} {target}: kernels {row['kernels_before']} -> {row['kernels_after']}, "
                  f"unfused {row['unfused_by_category']}, fell back "
                  f"{row['fell_back_by_cause']} ({row['seconds']} s)", flush=True)
            staged = args.out.with_suffix(".tmp")
            staged.write_text(json.dumps(record, indent=1))
            staged.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
