"""New tensor and node names for the importer's rewrites: never one the model already uses (a
hostile model may name its tensors as a rewrite would)."""
from __future__ import annotations

import onnx


def names_in(graph: onnx.GraphProto) -> set[str]:
    """Every tensor and node name of ``graph`` (inputs, initializers, outputs, nodes)."""
    taken = {t.name for t in graph.initializer} | {v.name for v in graph.input}
    taken |= {v.name for v in graph.output} | {n.name for n in graph.node}
    taken |= {name for n in graph.node for name in (*n.input, *n.output)}
    return taken


def unused_name(name: str, taken: set[str]) -> str:
    """``name``, or with the first ``_N`` suffix that makes it new; then taken."""
    candidate, count = name, 0
    while candidate in taken:
        count += 1
        candidate = f"{name}_{count}"
    taken.add(candidate)
    return candidate
