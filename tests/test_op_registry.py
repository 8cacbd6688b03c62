"""The op registry (importer/ops.py) is the one place that says what an op is: every stage agrees
with it, and every op fusion admits, the kernel generator writes."""
from __future__ import annotations

import pytest

from bench.backend_cases import in_scope_cases
from pypto_offline import import_model
from pypto_offline.fusion import make_region
from pypto_offline.fusion.classify import why_not_fusable
from pypto_offline.importer.canonical import NORMALISERS
from pypto_offline.importer.ops import KINDS, OPS, lowered_ops
from pypto_offline.pypto_kernels import codegen
from pypto_offline.pypto_kernels.tiling import default_policy
from pypto_offline.targets import TARGETS

# Ops only rewrite rules create inside a region's program (fusion/rules.py), never imported.
PROGRAM_ONLY_OPS = {"Roll"}


def test_every_op_has_a_kind_and_a_canonical_form():
    assert all(d.kind in KINDS and d.name == name for name, d in OPS.items())
    assert set(NORMALISERS) == set(OPS)


def test_the_generator_lowers_exactly_the_ops_the_registry_marks():
    marked = lowered_ops()
    assert {op for op in OPS if codegen.lowers(op)} == marked
    extra = set(codegen.LOWERINGS)  # the merged table: UNARY and BINARY ops included
    assert extra - set(OPS) == PROGRAM_ONLY_OPS


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_target_admits_exactly_what_lowers(target):
    """classify asks the registry, not the target, which ops a kernel can hold."""
    from pypto_offline.fusion.classify import why_not_fusable
    from tests.onnx_builders import one_node

    for op in ("Relu", "Erf", "Softplus"):
        graph = import_model(one_node(op, [2, 32], opset=18))
        verdict = why_not_fusable(graph.nodes[0], graph, TARGETS[target])
        assert (verdict is None) == (op in lowered_ops()), (op, verdict)


def _admitted_cases():
    target = TARGETS["kirin9050"]
    for case in in_scope_cases():
        graph = import_model(case.model)
        for node in graph.nodes:  # one, or the ops the importer writes it in (BatchNorm's)
            if why_not_fusable(node, graph, target) is None:
                yield f"{case.name}[{node.op_type}]", graph, node


ADMITTED = list(_admitted_cases())


def test_the_backend_cases_admit_every_lowered_op_kind():
    admitted = {node.op_type for _, _, node in ADMITTED}
    assert {OPS[op].kind for op in admitted} == set(KINDS)
    # (every LayerNormalization case also writes Mean and InvStdDev: not canonical)
    assert {"Softmax", "LogSoftmax", "ReduceMean", "DepthToSpace", "SpaceToDepth"} <= admitted


@pytest.mark.parametrize("name,graph,node", ADMITTED, ids=[c[0] for c in ADMITTED])
def test_every_admitted_op_lowers(name, graph, node):
    """What classify lets into a region, the generator writes: no region falls back for an op
    it was planned with (DepthToSpace once was admitted with no lowering)."""
    region = make_region("r", [node], graph, TARGETS["kirin9050"])
    policy = default_policy(TARGETS["kirin9050"].ub_plan_bytes.value)
    try:
        source = codegen.kernel_source(region, policy, graph.constant_values())
    except codegen.CannotExpress as why:
        # fusion admits rank 5 and 6 for what the generator folds inside a region; a lone op
        # whose own tensors do not fold to PyPTO's rank 4 is the one exception
        assert "fold" in str(why) or f"exceeds PyPTO's {codegen.MAX_RANK}" in str(why), why
        assert max(len(shape) for shape, _ in region.tensor_types.values()) > codegen.MAX_RANK \
            or node.op_type in ("DepthToSpace", "SpaceToDepth"), why
        return
    assert "def kernel(" in source
