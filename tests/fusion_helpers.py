"""Run the importer and the fusion planner on a model, and check the compiled graph."""
from __future__ import annotations

from pypto_offline import import_model
from pypto_offline.fusion import plan_fusion
from pypto_offline.targets import TARGETS
from pypto_offline.verify import compare, generate_inputs


def fuse(model, target: str = "kirin9050", input_shapes=None):
    graph = import_model(model, input_shapes)
    plan = plan_fusion(graph, TARGETS[target])
    return graph, plan


def assert_compiled_matches(graph, plan, seed: int = 0):
    feeds = generate_inputs(graph.model, seed)
    result = compare(graph.model, plan.compiled_model, feeds)
    assert result.status == "passed", result.outputs
    return result


def io_bytes(graph, names) -> int:
    return sum(graph.tensors[n].nbytes for n in names)
