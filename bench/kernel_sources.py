"""Every kernel source the compiler would generate, hashed: a proof that a change to the kernel
generator leaves its output byte-identical.

For the bundled example and every corpus model (``bench/corpus.py``), for each target: import the
model and plan its fusion as the build does (``import_model``, ``plan_fusion``), then for every
region generate the module of every tile candidate the compiler would try
(``tiling.candidate_policies`` under the target's UB plan, as ``compiler.compile_region`` does,
plus ``tiling.default_policy`` and the ``tiling.MERGE_CAPS`` variants of the smallest policy), or
the ``CannotExpress`` reason. Then ONNX's backend node cases of the registry's ops
(``bench.backend_cases``), one region per op fusion admits, the same way: they reach the
lowerings no corpus region uses. No PyPTO compile happens: code generation is pure Python.

It uses only public names that the single-file generator and the package both have, so the same
file runs against either (point ``PYTHONPATH`` at the checkout to measure).

    python -m bench.kernel_sources --out before.json
    python -m bench.kernel_sources --out after.json --compare before.json   # exit 1 on a diff
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

EXAMPLE_SHAPES = {"x": [1, 3, 64, 64]}


def models(names: list[str] | None) -> dict[str, tuple[object, dict]]:
    """Model name -> (model or path, input shapes): the example, the corpus (fetched if
    missing), then ONNX's backend node cases of the ops in the registry
    (``bench.backend_cases``), one region per op, which reach the lowerings no corpus region
    uses."""
    import pypto_offline
    from bench import corpus
    from bench.backend_cases import in_scope_cases

    # beside the package measured (this file may be run from a copy elsewhere)
    example = Path(pypto_offline.__file__).resolve().parent.parent / "examples" / "example.onnx"
    chosen = {"example": (example, EXAMPLE_SHAPES)}
    for name, model in corpus.MODELS.items():
        chosen[name] = (corpus.model_path(name), model.input_shapes)
    for case in in_scope_cases():
        chosen[f"backend/{case.name}"] = (case.model, {})
    return {name: chosen[name] for name in (names or chosen)}


def policies_of(region, target) -> list:
    """The tile candidates ``compiler.compile_region`` would try for the region, the default,
    and the merge-capped variants of the smallest one, each once, in a fixed order."""
    from pypto_offline.pypto_kernels import tiling
    from pypto_offline.pypto_kernels.compiler import largest_tensor_bytes

    ub = target.ub_plan_bytes.value
    searched = tiling.candidate_policies(ub, largest_tensor_bytes(region))
    smallest = min(searched, key=lambda p: p.budget_bytes)
    capped = [replace(smallest, vec_merge=cap) for cap in tiling.MERGE_CAPS]
    return list(dict.fromkeys([*searched, tiling.default_policy(ub), *capped]))


def region_sources(region, target, constants) -> dict[str, str]:
    """Policy name -> sha256 of the module, or "cannot: reason"."""
    from pypto_offline.pypto_kernels import codegen

    out = {}
    for policy in policies_of(region, target):
        try:
            text = codegen.kernel_source(region, policy, constants)
        except codegen.CannotExpress as why:
            out[policy.name] = f"cannot: {why}"
            continue
        out[policy.name] = hashlib.sha256(text.encode()).hexdigest()
    return out


def model_sources(source, shapes: dict, one_op: bool = False) -> dict[str, dict] | str:
    """Target -> region id -> policy name -> hash, for one model, whose regions are the fusion
    plan's, or with ``one_op`` one region per op fusion admits (as ``tests/test_op_registry``
    makes them: the plan makes no region of one op); for a model the importer refuses, why."""
    from pypto_offline.errors import UsageError
    from pypto_offline.importer import import_model
    from pypto_offline.targets import TARGETS

    try:
        graph = import_model(str(source) if isinstance(source, Path) else source, shapes)
    except UsageError as why:
        return f"not imported: {why}"
    constants = graph.constant_values()
    result = {}
    for name, target in TARGETS.items():
        regions = one_op_regions(graph, target) if one_op else planned_regions(graph, target)
        result[name] = {region.id: region_sources(region, target, constants)
                        for region in regions}
    return result


def planned_regions(graph, target) -> list:
    from pypto_offline.fusion import plan_fusion

    return list(plan_fusion(graph, target).regions)


def one_op_regions(graph, target) -> list:
    from pypto_offline.fusion import make_region
    from pypto_offline.fusion.classify import why_not_fusable

    return [make_region(f"op{index}_{node.op_type}", [node], graph, target)
            for index, node in enumerate(graph.nodes)
            if why_not_fusable(node, graph, target) is None]


def differences(mine: dict, other: dict, where: tuple = ()) -> list[str]:
    """Every leaf that differs, or is in one file only, as ``a/b/c: x != y``."""
    if not isinstance(mine, dict) or not isinstance(other, dict):
        return [] if mine == other else [f"{'/'.join(where)}: {other!r} -> {mine!r}"]
    lines = []
    for key in sorted(set(mine) | set(other)):
        if key not in mine or key not in other:
            side = "only in the compared file" if key not in mine else "only in this run"
            lines.append(f"{'/'.join(where + (key,))}: {side}")
        else:
            lines += differences(mine[key], other[key], where + (key,))
    return lines


def count_sources(result: dict) -> tuple[int, int]:
    """(sources hashed, candidates the generator cannot express)."""
    leaves = [v for targets in result.values() if isinstance(targets, dict)
              for regions in targets.values() for policies in regions.values()
              for v in policies.values()]
    cannot = sum(v.startswith("cannot: ") for v in leaves)
    return len(leaves) - cannot, cannot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--compare", type=Path, help="a JSON of an earlier run to diff against")
    parser.add_argument("models", nargs="*", help="example and/or corpus names (default: all)")
    args = parser.parse_args(argv)
    result = {}
    for name, (path, shapes) in models(args.models).items():
        result[name] = model_sources(path, shapes, one_op=name.startswith("backend/"))
        if not name.startswith("backend/"):
            print(f"{name}: {sum(len(r) for r in result[name].values())} regions over "
                  f"{len(result[name])} targets", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    sources, cannot = count_sources(result)
    print(f"{sources} sources hashed, {cannot} candidates cannot be expressed -> {args.out}")
    if args.compare is None:
        return 0
    lines = differences(result, json.loads(args.compare.read_text()))
    print("\n".join(lines) if lines else f"no differences from {args.compare}")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
