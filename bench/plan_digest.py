"""A digest of the fusion plans of the example and the corpus models, to tell whether a change
to the compiler moved any of them.

    python -m bench.plan_digest --out before.json       # under the tree to compare against
    python -m bench.plan_digest --out after.json
    python -m bench.plan_digest --compare before.json after.json

Per model and target: every region (its nodes, inputs, outputs, simplified program with its
parameters, rules applied, unfused and fused cost figures), every unfused op (category and
reason), the totals, a hash of the compiled ONNX model and of each region's kernel source
under the default tile policy and its flat-row variant. Nothing is compiled by PyPTO.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from bench import corpus
from pypto_offline import import_model
from pypto_offline.fusion import plan_fusion
from pypto_offline.pypto_kernels import codegen
from pypto_offline.pypto_kernels.tiling import default_policy
from pypto_offline.targets import TARGETS

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "example.onnx"


def _models() -> dict[str, tuple[Path, dict]]:
    models = {"example": (EXAMPLE, {"x": [1, 3, 64, 64]})}
    models.update({name: (corpus.model_path(name), spec.input_shapes)
                   for name, spec in corpus.MODELS.items()})
    return models


def _hash(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _kernel_sources(region, target, constants) -> list[str]:
    """A hash of the source under the default policy and its flat-row variant, or the reason
    the generator gives for not writing it."""
    policy = default_policy(target.ub_plan_bytes.value)
    digests = []
    for variant in (policy, replace(policy, flat_rows=True)):
        try:
            digests.append(_hash(codegen.kernel_source(region, variant, constants)))
        except codegen.CannotExpress as why:
            digests.append(f"cannot express: {why}")
    return digests


def _region(region, target, constants) -> dict:
    return {
        "id": region.id, "nodes": list(region.nodes), "inputs": list(region.inputs),
        "outputs": list(region.outputs), "rules": list(region.rules_applied),
        "program": [[op.op_type, list(op.inputs), list(op.outputs),
                     {k: repr(v) for k, v in op.params.items()}] for op in region.simplified],
        "unfused": asdict(region.unfused), "fused": asdict(region.fused),
        "kernel_sources": _kernel_sources(region, target, constants),
    }


def plan_digest(path: Path, shapes: dict, target_name: str) -> dict:
    graph = import_model(path, shapes)
    target = TARGETS[target_name]
    plan = plan_fusion(graph, target)
    constants = graph.constant_values()
    return {
        "regions": [_region(r, target, constants) for r in plan.regions],
        "unfused": [asdict(u) for u in plan.unfused],
        "totals": asdict(plan.totals),
        "compiled_model": _hash(plan.compiled_model.SerializeToString(deterministic=True)),
    }


def digest(names: list[str] | None, targets: list[str]) -> dict:
    result = {}
    for name, (path, shapes) in _models().items():
        if names and name not in names:
            continue
        for target in targets:
            result[f"{name}/{target}"] = plan_digest(path, shapes, target)
            print(f"{name}/{target}", file=sys.stderr)
    return result


def _differences(before, after, where: str = ""):
    """Paths where two JSON values differ, with both values."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            yield from _differences(before.get(key), after.get(key), f"{where}/{key}")
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after)):
            yield from _differences(b, a, f"{where}[{i}]")
    elif before != after:
        yield where, before, after


def compare(before_path: str, after_path: str) -> int:
    before, after = (json.loads(Path(p).read_text()) for p in (before_path, after_path))
    found = list(_differences(before, after))
    for where, b, a in found:
        print(f"{where}:\n  before {json.dumps(b)[:300]}\n  after  {json.dumps(a)[:300]}")
    print(f"{len(found)} difference(s) over {len(after)} plans")
    return 1 if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the digest here (JSON)")
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--targets", default="kirin9050,ascend910b")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    result = digest(args.models.split(",") if args.models else None, args.targets.split(","))
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
