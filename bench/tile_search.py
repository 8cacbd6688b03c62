"""How often the pruned tile search keeps the best tile (pypto_kernels/tiling.py, search_rounds).

    python -m bench.tile_search BLOB_FOLDER [--target kirin9050] [--out bench/results/tile_search]

Reads blobs built with the full search (every candidate budget compiled: code before the pruning,
or a build with ``SEARCHED_BUDGETS`` raised), re-plans each model, and counts for how many compiled
kernels the tuned tile's budget is among the first k budgets of the search order, for k = 1..4.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import corpus
from pypto_offline.fusion import plan_fusion
from pypto_offline.importer import import_model
from pypto_offline.offline_compiler import blob
from pypto_offline.offline_compiler.blob import write_atomically
from pypto_offline.pypto_kernels.search import largest_tensor_bytes
from pypto_offline.pypto_kernels.tiling import SEARCHED_BUDGETS, candidate_policies
from pypto_offline.targets import TARGETS

RESULTS = Path(__file__).with_name("results") / "tile_search"


def searched_budgets(blob_path: Path, target_name: str) -> list[dict]:
    """Per compiled kernel of the blob: the budgets in search order and the tuned one."""
    message = blob.read(blob_path)
    name = message.provenance.model_name.removesuffix(".onnx")
    tuned = {k.id: k.tuned_tile.budget_bytes for k in message.kernels
             if k.compiled and k.HasField("tuned_tile")}
    target = TARGETS[target_name]
    plan = plan_fusion(import_model(corpus.model_path(name), corpus.MODELS[name].input_shapes),
                       target)
    ub = target.ub_plan_bytes.value
    return [{"model": name, "region": r.id, "tuned": tuned[r.id],
             "order": sorted({p.budget_bytes for p in
                              candidate_policies(ub, largest_tensor_bytes(r))}, reverse=True)}
            for r in plan.regions if r.id in tuned]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("blobs", type=Path)
    parser.add_argument("--target", default="kirin9050")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = []
    for path in sorted(args.blobs.glob(f"*.{args.target}.ptom")):
        rows += searched_budgets(path, args.target)
    found = {k: sum(row["tuned"] in row["order"][:k] for row in rows) for k in (1, 2, 3, 4)}
    summary = {"kernels": len(rows), "best_within_first_k_budgets": found,
               "searched_budgets": SEARCHED_BUDGETS,
               "mean_budgets_per_kernel": round(sum(len(r["order"]) for r in rows)
                                                / max(len(rows), 1), 2)}
    print(json.dumps(summary, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out / f"tile_search_{args.target}.json", (json.dumps(
        {"summary": summary, "kernels": rows}, indent=1, sort_keys=True) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
