"""How import and fusion planning grow with the size of a model: a chain of elementwise ops and
parallel branches off one op, at 1k, 3k and 10k ops (issue 34, row 13). No PyPTO.

    python -m bench.scale [--sizes 1000,3000,10000] [--shapes chain,branches] [--target kirin9050]
                          [--repeat 3] [--out bench/results/scale]

Each case runs in a fresh Python process of its own (``--case SHAPE:OPS``), so that its peak
resident memory (``ru_maxrss``) is its own: the parent writes the synthetic ONNX model (built
with onnx.helper), the child imports it (``import_model``) and plans its fusion
(``plan_fusion``), timing each, and prints one JSON line; of ``--repeat`` runs of a case the
fastest counts (the machine is shared: the least disturbed run). The table gives the times, the
peak memory, the regions planned and the work of the partition's convexity checks (edges looked
at, ``fusion.partition.Partition.steps``); then the growth ratio of import + planning from the
smallest size to the largest, which must stay within ``GOAL_RATIO`` (near-linear: 10x the ops,
at most 15x the time), and of each alone. Writes OUT/scale.json and OUT/README.md (numbers,
machine, commit).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
GOAL_RATIO = 15  # issue 34: planning 10x the ops takes at most 15x the time
SHAPE = [1, 16, 64]  # one row of 256 B: regions of a few hundred ops fill the UB
# Elementwise ops the partition fuses, in turn along a chain or a branch.
ELEMENTWISE = ("Add", "Mul", "Relu", "Neg", "Sigmoid", "Abs")
BRANCH_DEPTH = 4


def _op(kind: str, source: str, out: str) -> onnx.NodeProto:
    inputs = [source, "half"] if kind in ("Add", "Mul") else [source]
    return helper.make_node(kind, inputs, [out], name=out)


def _model(nodes: list[onnx.NodeProto], output: str, shape=None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def chain_model(ops: int) -> onnx.ModelProto:
    """x → op_0 → op_1 → … → op_{ops-1}: one long path, every op fusable."""
    nodes, current = [], "x"
    for i in range(ops):
        nodes.append(_op(ELEMENTWISE[i % len(ELEMENTWISE)], current, f"c{i}"))
        current = f"c{i}"
    return _model(nodes, current, SHAPE)


def branches_model(ops: int) -> onnx.ModelProto:
    """One op (the hub) feeding (ops - 2) / BRANCH_DEPTH chains of BRANCH_DEPTH ops side by
    side, joined by one Concat: ``ops`` nodes, a hub with thousands of consumers, a Concat with
    thousands of producers."""
    branches = max(1, (ops - 2) // BRANCH_DEPTH)
    nodes = [helper.make_node("Relu", ["x"], ["hub"], name="hub")]
    ends = []
    for b in range(branches):
        current = "hub"
        for d in range(BRANCH_DEPTH):
            out = f"b{b}_{d}"
            nodes.append(_op(ELEMENTWISE[(b + d) % len(ELEMENTWISE)], current, out))
            current = out
        ends.append(current)
    nodes.append(helper.make_node("Concat", ends, ["joined"], name="joined", axis=0))
    return _model(nodes, "joined", [SHAPE[0] * branches] + SHAPE[1:])


SHAPES = {"chain": chain_model, "branches": branches_model}


def run_case(shape: str, ops: int, path: Path, target: str) -> dict:
    """In this process (fresh: ``--case``): import and plan the model at ``path``."""
    import resource
    import time

    from pypto_offline import import_model
    from pypto_offline.fusion import plan_fusion
    from pypto_offline.fusion.classify import why_not_fusable
    from pypto_offline.fusion.partition import Partition
    from pypto_offline.targets import TARGETS

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    graph = import_model(path)
    imported = time.perf_counter()
    plan = plan_fusion(graph, TARGETS[target])
    planned = time.perf_counter()
    # the partition's search work, counted on a partition of its own (not timed)
    fusable = {n.outputs[0] for n in graph.nodes if why_not_fusable(n, graph, TARGETS[target])
               is None}
    steps = Partition(graph, fusable, TARGETS[target]).steps
    return {
        "shape": shape, "ops": ops, "nodes": len(graph.nodes),
        "import_s": round(imported - started, 3), "plan_s": round(planned - imported, 3),
        "total_s": round(planned - started, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_before_mb": round(rss_before / 1024, 1),
        "regions": len(plan.regions), "ops_fused": plan.totals.ops_fused,
        "partition_steps": steps,
    }


def measure(shape: str, ops: int, target: str, folder: Path) -> dict:
    """One case in a fresh Python process, on a model written here."""
    path = folder / f"{shape}_{ops}.onnx"
    path.write_bytes(SHAPES[shape](ops).SerializeToString())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "bench.scale", "--case", f"{shape}:{ops}",
                           "--model", str(path), "--target", target],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def growth(rows: list[dict], shape: str, key: str = "total_s") -> float:
    """Import + planning time (``key``) of the largest size over the smallest."""
    mine = sorted((r for r in rows if r["shape"] == shape), key=lambda r: r["ops"])
    return round(mine[-1][key] / max(mine[0][key], 1e-9), 2)


def growth_text(shape: str, ratios: dict, sizes: list[int]) -> str:
    return (f"{shape}: import + planning {ratios['total'][shape]:.1f}x from {sizes[0]:,} to "
            f"{sizes[-1]:,} ops (goal at most {GOAL_RATIO}x); import alone "
            f"{ratios['import'][shape]:.1f}x, planning alone {ratios['plan'][shape]:.1f}x")


def table(rows: list[dict]) -> str:
    lines = ["| shape | ops | nodes | import s | plan s | total s | peak RSS MB | regions | "
             "ops fused | partition steps |", "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['ops']:,} | {r['nodes']:,} | {r['import_s']:.2f} | "
                     f"{r['plan_s']:.2f} | {r['total_s']:.2f} | {r['peak_rss_mb']:.0f} | "
                     f"{r['regions']:,} | {r['ops_fused']:,} | {r['partition_steps']:,} |")
    return "\n".join(lines)


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "pypto_offline", "bench"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return done.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in
                 Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = f"{names[0]} x{len(names)}" if names else cpu
    except OSError:
        pass
    return f"{cpu}, Python {platform.python_version()}, load {os.getloadavg()[0]:.1f} at start"


def write(out: Path, rows: list[dict], ratios: dict, header: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps({**header, "ratios": ratios, "rows": rows},
                                               indent=1) + "\n")
    verdicts = "\n".join(f"- {growth_text(shape, ratios, header['sizes'])}"
                         for shape in ratios["total"])
    (out / "README.md").write_text(
        f"# Import and planning time against model size (issue 34, row 13)\n\n"
        f"`python -m bench.scale` at commit {header['commit']}, {header['date']}, target "
        f"{header['target']}; machine: {header['machine']}. Each case in a fresh process, the "
        f"fastest of {header['repeat']} runs; "
        f"peak RSS is the process's own (`ru_maxrss`, Python, onnx and numpy included: "
        f"`rss_before_mb` in scale.json is what the process held before importing the "
        f"model). Models: `bench/scale.py` (a chain of elementwise ops; a hub op feeding chains "
        f"of {BRANCH_DEPTH} ops side by side, joined by one Concat).\n\n"
        f"{table(rows)}\n\nGrowth of import + planning:\n\n{verdicts}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,3000,10000")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--target", default="kirin9050")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest counts")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale"))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # SHAPE:OPS, in the child process
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        shape, ops = args.case.split(":")
        print(json.dumps(run_case(shape, int(ops), Path(args.model), args.target)))
        return 0
    sizes = sorted(int(s) for s in args.sizes.split(","))
    shapes = args.shapes.split(",")
    header = {"commit": _commit(), "date": datetime.datetime.now(datetime.timezone.utc)
              .strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(), "target": args.target,
              "sizes": sizes, "repeat": args.repeat}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for shape in shapes:
            for ops in sizes:  # the fastest of --repeat runs: the least disturbed by load
                runs = [measure(shape, ops, args.target, Path(folder))
                        for _ in range(args.repeat)]
                rows.append({**min(runs, key=lambda r: r["total_s"]), "runs": len(runs)})
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    ratios = {name: {shape: growth(rows, shape, f"{name}_s") for shape in shapes}
              for name in ("total", "import", "plan")}
    print(table(rows))
    for shape in shapes:
        print(growth_text(shape, ratios, sizes))
    write(Path(args.out), rows, ratios, header)
    return 0 if all(ratio <= GOAL_RATIO for ratio in ratios["total"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
