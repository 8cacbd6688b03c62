"""Fusion figures per corpus model and target, with the check against onnxruntime.

    python -m bench.fusion_report [--targets kirin9050,ascend910b]   # Markdown on stdout

Estimated times use the target descriptors, whose bandwidth and launch cost are mostly estimates;
the ratio before/after is the figure to read, not the absolute microseconds.
"""
from __future__ import annotations

import argparse
import sys

from bench import corpus
from pypto_offline import import_model
from pypto_offline.fusion import plan_fusion
from pypto_offline.targets import TARGETS
from pypto_offline.verify import compare


def rows(targets: list[str]) -> list[str]:
    header = ["| model | target | nodes | kernels before → after | fused regions | ops fused | "
              "GM MB before → after | est. speed-up | max abs diff |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines = []
    for name, spec in corpus.MODELS.items():
        graph = import_model(corpus.model_path(name), spec.input_shapes)
        for target in targets:
            plan = plan_fusion(graph, TARGETS[target])
            t = plan.totals
            check = compare(graph.model, plan.compiled_model, spec.make_inputs(seed=0))
            lines.append(
                f"| {name} | {target} | {t.nodes_before} → {t.nodes_after} | "
                f"{t.kernels_before} → {t.kernels_after} | {t.fused_kernels} | {t.ops_fused} | "
                f"{t.gm_bytes_before / 1e6:.2f} → {t.gm_bytes_after / 1e6:.2f} | "
                f"{t.est_time_us_before / t.est_time_us_after:.2f}× | "
                f"{check.max_abs_diff:.1e} ({check.status}) |")
    return header + lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS))
    args = parser.parse_args(argv)
    print("\n".join(rows(args.targets.split(","))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
