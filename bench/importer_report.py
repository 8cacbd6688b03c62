"""Importer figures for the notes: backend conformance per op, and the corpus round trip per model.

    python -m bench.importer_report        # Markdown tables on stdout
"""
from __future__ import annotations

import sys
import time
from collections import Counter

import numpy as np
import onnx

from bench import corpus
from bench.backend_cases import in_scope_cases
from pypto_offline import import_model
from pypto_offline.runtime import max_abs_diff, run_model


def _case_passes(case) -> bool:
    try:
        graph = import_model(case.model)
        outputs = run_model(graph.model, case.inputs)
    except Exception:  # noqa: BLE001 - a report counts failures, it does not stop on them
        return False
    names = [o.name for o in graph.model.graph.output]
    for name, expected in zip(names, case.outputs):
        actual = outputs.get(name)
        if isinstance(expected, list):
            if not isinstance(actual, list) or len(actual) != len(expected):
                return False
            continue
        if actual is None or actual.shape != expected.shape:
            return False
        if expected.dtype.kind not in "OUS" and not np.allclose(
                actual.astype(np.float64), expected.astype(np.float64), rtol=case.rtol,
                atol=case.atol, equal_nan=True):
            return False
    return True


def conformance_table() -> list[str]:
    total, passed, normalised = Counter(), Counter(), Counter()
    for case in in_scope_cases():
        total[case.op_type] += 1
        passed[case.op_type] += _case_passes(case)
        normalised[case.op_type] += import_model(case.model).nodes[0].in_scope
    rows = ["| op | cases | normalised | outputs reproduced |", "|---|---|---|---|"]
    rows += [f"| {op} | {total[op]} | {normalised[op]} | {passed[op]} |" for op in sorted(total)]
    rows.append(f"| **all** | {sum(total.values())} | {sum(normalised.values())} | "
                 f"{sum(passed.values())} |")
    return rows


def corpus_table() -> list[str]:
    rows = ["| model | opset | nodes in source | after folding | in scope | symbolic | "
            "max abs diff | import s |", "|---|---|---|---|---|---|---|---|"]
    for name, spec in corpus.MODELS.items():
        path = corpus.model_path(name)
        started = time.perf_counter()
        graph = import_model(path, spec.input_shapes)
        seconds = time.perf_counter() - started
        feeds = spec.make_inputs(seed=0)
        expected, actual = run_model(onnx.load(path), feeds), run_model(graph.model, feeds)
        diff = max(max_abs_diff(v, actual[k]) for k, v in expected.items())
        summary = graph.summary()
        rows.append(f"| {name} | {graph.opset} | {summary['nodes_in_source']} | "
                    f"{summary['nodes_after_folding']} | {summary['in_scope']} | "
                    f"{len(graph.symbolic)} | {diff:.2e} | {seconds:.2f} |")
    return rows


def main() -> int:
    print("\n".join(conformance_table()))
    print()
    print("\n".join(corpus_table()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
