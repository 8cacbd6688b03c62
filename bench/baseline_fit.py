"""Fit the unfused baseline's estimate (pypto_kernels/baseline.py) from measured ops.

    python -m bench.baseline_fit [--models a,b] [--targets kirin9050,ascend950] [--write]
    python -m bench.baseline_fit --classes matmul --merge --write   # one class's lines only

For each model and target: plan the fusion, measure every region's ops one kernel each with PyPTO
(through the shared per-op cache: an op measured before costs nothing), then fit, per cost-model
family, time = intercept + slope × KiB moved per op class, weighted for relative error. Prints the
fit and its error per op and per region; ``--write`` stores it as the estimate a default build
ships (``pypto_offline/pypto_kernels/baseline_fit.json``) and the table in
bench/results/baseline_fit/. ``--classes`` measures and fits only the ops of those classes; with
``--merge`` their lines replace the shipped ones of each family measured, the other classes'
stay as their own run made them. Not part of the test run: a cold fit compiles hundreds of
kernels.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench import corpus
from pypto_offline.fusion import plan_fusion
from pypto_offline.importer import import_model
from pypto_offline.offline_compiler.blob import write_atomically
from pypto_offline.pypto_kernels import baseline
from pypto_offline.pypto_kernels.compiler import setup_for
from pypto_offline.pypto_kernels.measured_baseline import single_op_costs, unfused_costs
from pypto_offline.pypto_kernels.platform import platform_of
from pypto_offline.targets import TARGETS

EXAMPLE = ("example", Path(__file__).resolve().parents[1] / "examples" / "example.onnx",
           {"x": [1, 3, 64, 64]})
RESULTS = Path(__file__).with_name("results") / "baseline_fit"


def model_sources(names: list[str]) -> list[tuple[str, Path, dict]]:
    return [EXAMPLE if name == "example" else
            (name, corpus.model_path(name), corpus.MODELS[name].input_shapes) for name in names]


def measure(name: str, path: Path, shapes: dict, target_name: str, cache_dir: Path | None,
            jobs: int, classes: tuple[str, ...] = baseline.OP_CLASSES) -> list[dict]:
    """One row per region: its ops' samples and measured times (None: an op did not compile),
    the ops of ``classes`` only."""
    target = TARGETS[target_name]
    graph = import_model(path, shapes)
    plan = plan_fusion(graph, target)
    setup = setup_for(target, cache_dir)
    regions = [replace(region, original=ops) for region in plan.regions
               if (ops := tuple(op for op in region.original
                                if baseline.op_class(op.op_type) in classes))]
    unfused_costs(graph, regions, setup, jobs=jobs)  # fills the cache
    constants = graph.constant_values()
    rows = []
    for region in regions:
        ops = single_op_costs(region, graph, setup, constants)  # all hits now
        rows.append({"model": name, "target": target_name, "region": region.id,
                     "ops": [{"op": s.original[0].op_type,
                              "sample": list(baseline.op_sample(s, graph)), "us": us}
                             for s, us in ops]})
    return rows


def fit(rows: list[dict], classes: tuple[str, ...] = baseline.OP_CLASSES
        ) -> tuple[dict, dict]:
    """The fit per family (the lines of ``classes``), and its error statistics."""
    by_family: dict[str, dict[tuple, float]] = {}
    for row in rows:
        family = _family(row)
        for op in row["ops"]:
            # one entry per distinct op (class, size): recurring ops count once
            if op["us"] and op["sample"][0] in classes:
                by_family.setdefault(family, {})[(op["op"], *op["sample"])] = op["us"]
    families, errors = {}, {}
    for family, measured in sorted(by_family.items()):
        samples = [(cls, kib) for (_, cls, kib) in measured]
        times = list(measured.values())
        lines = baseline.fit_family(samples, times)
        families[family] = {name: lines[name] for name in classes}
        op_errors = baseline.relative_errors(samples, times, families[family])
        errors[family] = {"ops": len(times), "median_rel_error": _q(op_errors, 50),
                          "p90_rel_error": _q(op_errors, 90),
                          "regions": _region_errors(rows, family, families[family])}
    return families, errors


def _family(row: dict) -> str:
    return baseline.cost_model_family(platform_of(TARGETS[row["target"]]))


def merged(shipped: dict, run: dict) -> dict:
    """The shipped fit with this run's families in: a family this run did not measure stays
    with its own run's provenance (``earlier``), if some target's platform still times on it."""
    used = {baseline.cost_model_family(platform_of(t)) for t in TARGETS.values()}
    kept = [f for f in shipped["families"] if f in used and f not in run["families"]]
    earlier = [p for p in shipped["provenance"].get("earlier", [])
               if set(p["families"]) & set(kept)]
    previous = {k: v for k, v in shipped["provenance"].items() if k != "earlier"}
    if set(kept) - {f for p in earlier for f in p["families"]}:
        earlier.append({**previous, "families": sorted(
            set(kept) - {f for p in earlier for f in p["families"]})})
    return {"families": {**{f: shipped["families"][f] for f in kept}, **run["families"]},
            "errors": {**{f: shipped["errors"][f] for f in kept}, **run["errors"]},
            "provenance": {**run["provenance"], "earlier": earlier}}


def merged_classes(shipped: dict, run: dict, classes: tuple[str, ...]) -> dict:
    """The shipped fit with this run's lines of ``classes`` in each family it measured, their
    errors and provenance beside the other classes' (``by_class``)."""
    families = {f: {**lines, **run["families"].get(f, {})}
                for f, lines in shipped["families"].items()}
    errors = {f: {**e, **({"by_class": {**e.get("by_class", {}),
                                        "+".join(classes): run["errors"][f]}}
                          if f in run["errors"] else {})}
              for f, e in shipped["errors"].items()}
    provenance = {**shipped["provenance"], "by_class": {
        **shipped["provenance"].get("by_class", {}), "+".join(classes): run["provenance"]}}
    return {"families": families, "errors": errors, "provenance": provenance}


def _region_errors(rows: list[dict], family: str, family_fit: dict) -> dict:
    errors = []
    for row in rows:
        if _family(row) != family:
            continue
        times = [op["us"] for op in row["ops"]]
        if not times or None in times or any(op["sample"][0] not in family_fit
                                             for op in row["ops"]):
            continue
        samples = [tuple(op["sample"]) for op in row["ops"]]
        estimate = sum(baseline.estimate_op_us(s, family_fit) for s in samples)
        errors.append(abs(estimate - sum(times)) / sum(times))
    return {"count": len(errors), "median_rel_error": _q(errors, 50),
            "p90_rel_error": _q(errors, 90)}


def _q(values: list[float], percentile: int) -> float | None:
    return round(float(np.percentile(values, percentile)), 3) if values else None


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="example,asr_frontend_kaldi,magika_v3_3,"
                                            "tf_gpt2_decoder_kv,tf_bert_encoder,tf_vit")
    parser.add_argument("--targets", default="kirin9050,ascend950")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--classes", default=",".join(baseline.OP_CLASSES),
                        help="measure and fit the ops of these classes only")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--merge", action="store_true",
                        help="keep the shipped fit's families this run does not measure (those "
                             "some target still times on), each with the provenance of its run")
    args = parser.parse_args(argv)
    classes = tuple(args.classes.split(","))
    some = classes != baseline.OP_CLASSES  # one class's lines, the others as shipped
    rows = []
    for name, path, shapes in model_sources(args.models.split(",")):
        for target in args.targets.split(","):
            rows += measure(name, path, shapes, target, args.cache_dir, args.jobs, classes)
            print(f"measured {name} for {target}: {len(rows)} regions so far", file=sys.stderr,
                  flush=True)
    families, errors = fit(rows, classes)
    provenance = {"commit": _commit(), "date": datetime.date.today().isoformat(),
                  "models": args.models.split(","), "targets": args.targets.split(","),
                  "command": "python -m bench.baseline_fit " + " ".join(argv or sys.argv[1:]),
                  "machine_cores": os.cpu_count()}
    result = {"families": families, "errors": errors, "provenance": provenance}
    if args.merge:
        result = merged_classes(baseline.shipped_fit(), result, classes) if some else \
            merged(baseline.shipped_fit(), result)
    print(json.dumps(result, indent=1))
    if args.write:
        write_atomically(baseline.FIT_FILE, (json.dumps(result, indent=1, sort_keys=True)
                                             + "\n").encode())
        RESULTS.mkdir(parents=True, exist_ok=True)
        measured_file = RESULTS / (f"measured_ops.{'+'.join(classes)}.json" if some
                                   else "measured_ops.json")
        if args.merge and not some:  # the rows of the families kept, then this run's
            rows = [row for row in json.loads(measured_file.read_text())
                    if _family(row) in result["families"] and _family(row) not in families
                    and row["target"] not in args.targets.split(",")] + rows
        write_atomically(measured_file,
                         (json.dumps(rows, indent=1, sort_keys=True) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
