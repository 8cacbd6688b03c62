"""The op registry (registry/ops.py) is the one place that says what an op is: every stage agrees
with it, and every op fusion admits, the kernel generator writes."""
from __future__ import annotations

import json

import pytest

from bench.backend_cases import in_scope_cases
from pypto_offline import import_model
from pypto_offline.fusion import make_region, rules, views
from pypto_offline.fusion.classify import why_not_fusable
from pypto_offline.importer import encoding
from pypto_offline.importer.canonical import NORMALISERS
from pypto_offline.registry import attributes
from pypto_offline.registry.ops import (BROADCAST, DECOMPOSED_OPS, ELEMENTWISE, KINDS, OPS,
                                        POINTWISE_OPS, PROGRAM_ONLY_OPS, READS, READS_WINDOW,
                                        REDUCE_OPS, REDUCTION, ROW_RESULT_OPS,
                                        VIEW_TRANSFORM_OPS, WINDOW, definition, lowered_ops,
                                        marked)
from pypto_offline.pypto_kernels import activations, codegen
from pypto_offline.pypto_kernels.tiling import default_policy
from pypto_offline.targets import TARGETS
from tests.onnx_builders import one_node

# Reshape-likes a region's program holds as one Reshape (fusion/program.py): no table that
# works on programs needs them
RESHAPE_LIKES = marked("reshape_like") - {"Reshape"}

def _marked(field: str) -> set[str]:
    return {name for name, d in OPS.items() if getattr(d, field)}


def test_every_op_has_a_kind_and_a_canonical_form():
    assert all(d.kind in KINDS and d.name == name for name, d in OPS.items())
    assert set(NORMALISERS) == set(OPS)


def test_the_generator_lowers_exactly_the_ops_the_registry_marks():
    assert {op for op in OPS if codegen.lowers(op)} == lowered_ops()
    assert all(codegen.lowers(op) for op in PROGRAM_ONLY_OPS)
    assert set(codegen.LOWERINGS) - set(OPS) == PROGRAM_ONLY_OPS


def test_the_lowering_table_agrees_with_the_registry():
    """For codegen's merged ``LOWERINGS`` (once codegen is a package): every op it lowers is
    marked so, and only a decomposed op, a reshape-like or one of the generator's per-call
    tables lowers without an entry."""
    lowerings = codegen.LOWERINGS
    assert set(lowerings) - set(OPS) == PROGRAM_ONLY_OPS
    assert set(lowerings) & set(OPS) <= lowered_ops()
    assert not set(lowerings) & DECOMPOSED_OPS
    assert lowered_ops() - set(lowerings) <= \
        RESHAPE_LIKES | DECOMPOSED_OPS | set(codegen.UNARY) | set(codegen.BINARY)


def test_the_generator_tables_agree_with_the_kinds():
    assert {OPS[op].kind for op in codegen.UNARY} == {ELEMENTWISE}
    assert {OPS[op].kind for op in codegen.BINARY} == {BROADCAST}
    assert {OPS[op].kind for op in codegen.COMPARISONS} == {BROADCAST}
    assert {OPS[op].kind for op in codegen.REDUCTIONS} == {REDUCTION}
    assert set(codegen.REDUCTIONS) == ROW_RESULT_OPS  # one value per row, each op its own
    assert {OPS[op].kind for op in codegen.SOFTMAX_RESULTS} == {REDUCTION}
    assert {OPS[op].kind for op in activations.BUILDERS} == {ELEMENTWISE}


def test_commutative_ops_are_the_registrys():
    # a comparison reads its operands swapped as its mirror: itself, when it is commutative
    for op, (_, _, mirrored) in codegen.COMPARISONS.items():
        assert (mirrored == op) == OPS[op].commutative, op
        assert mirrored in codegen.COMPARISONS


def test_the_ops_computed_in_fp32_are_the_registrys_and_have_builders():
    assert _marked("fp32_for_half") <= set(activations.BUILDERS)  # only a builder changes it


def test_pointwise_and_flat_ops_are_defined_once():
    assert POINTWISE_OPS == _marked("pointwise")
    assert POINTWISE_OPS - _marked("flat") == {"Expand"}  # a broadcast adds elements


def test_decomposed_ops_are_the_registrys_and_have_no_lowering_of_their_own():
    assert DECOMPOSED_OPS == _marked("decomposed")
    assert DECOMPOSED_OPS <= lowered_ops()
    own = set(codegen.UNARY) | set(codegen.BINARY) | set(codegen.COMPARISONS) \
        | set(codegen.REDUCTIONS) | set(activations.BUILDERS)
    assert not DECOMPOSED_OPS & own


def test_the_view_algebra_is_the_registrys():
    transforms = {d.view for d in OPS.values() if d.view}
    assert transforms == set(views.TRANSFORMS)
    assert VIEW_TRANSFORM_OPS == _marked("view")
    # every view op says when it moves nothing (an Identity always does: the program drops it)
    assert VIEW_TRANSFORM_OPS - {"Identity"} <= set(rules.MOVES_NOTHING_WHEN)
    stack = views.ViewStack.of((2, 3))
    assert stack.apply("Roll", {"axis": 0, "shift": 1}) is None  # not a view op
    assert stack.apply("Squeeze", {"axes": (0,)}) is None  # a Reshape inside a program


def test_reductions_over_lone_elements_are_the_registrys():
    assert _marked("as_is_over_one") <= REDUCE_OPS  # those with explicit axes


def test_what_an_op_reads_is_one_of_three():
    assert {d.reads for d in OPS.values()} <= set(READS)
    assert {n for n, d in OPS.items() if d.reads == READS_WINDOW} == \
        {n for n, d in OPS.items() if d.kind == WINDOW}


def test_every_op_has_an_encoding_and_an_unknown_one_raises():
    assert set(encoding.ENCODERS) == set(OPS)
    with pytest.raises(ValueError, match="no encoding for Roll"):
        encoding.encode("Roll", {}, ["x"], ["y"], 18, 1, lambda name, value: name)


def _one_op_bound(model, op_type: str) -> tuple[int, int, int]:
    """(bytes of the lower bound, of the input, of the output) of a region of one node."""
    graph = import_model(model)
    node = graph.nodes[0]
    assert node.op_type == op_type and node.in_scope, node
    region = make_region("r", [node], graph, TARGETS["kirin9050"])
    return (region.fused.gm_bytes, graph.tensors[node.inputs[0]].nbytes,
            graph.tensors[node.outputs[0]].nbytes)


def test_a_pooling_bound_counts_what_its_windows_cover():
    """A 2x2/2 MaxPool of 5x5 planes steps over the last row and column: 16 of 25 read."""
    model = one_node("MaxPool", [1, 2, 5, 5], opset=18, kernel_shape=[2, 2], strides=[2, 2])
    bound, read, written = _one_op_bound(model, "MaxPool")
    assert bound == read * 16 // 25 + written
    padded = one_node("MaxPool", [1, 2, 5, 5], opset=18, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    bound, read, written = _one_op_bound(padded, "MaxPool")
    assert bound == read + written  # every element in some window; the padding is no input


def test_a_permutation_bound_counts_its_whole_input():
    model = one_node("DepthToSpace", [1, 8, 2, 2], opset=18, blocksize=2)
    bound, read, written = _one_op_bound(model, "DepthToSpace")
    assert bound == read + written


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


def test_an_attribute_is_registered_with_a_defined_op_once():
    with pytest.raises(KeyError, match="registered for Frobnicate, which registry/ops.py"):
        attributes.register("test_attribute", "Frobnicate")(1)
    attributes.register("test_attribute_once", "Relu")(1)
    with pytest.raises(ValueError, match="'test_attribute_once' of Relu registered twice"):
        attributes.register("test_attribute_once", "Relu")(2)


def test_what_a_stage_does_with_an_op_is_registered_with_it():
    """A refusal (fusion/classify.py) and the ONNX ops a program op is written as
    (fusion/lower.py) are found by asking the registry about the op."""
    from pypto_offline.fusion import classify, lower
    assert set(attributes.attributes_of("Pad")) >= {classify.REFUSES}
    assert attributes.attributes_of("Roll")[lower.AS_ONNX] is lower.roll_as_slices
    assert set(attributes.registered(classify.FILLS_TILES)) == {"Clip", "MaxPool", "AveragePool"}


def test_every_rewrite_rule_names_the_ops_it_rewrites():
    """``simplify`` asks a rule about its roots only (``rules.rewrites``): a rule without them
    would be asked about no op; roots name registry or program-only ops."""
    for rule in rules.RULES:
        assert hasattr(rule, "roots"), rule.__name__
        assert rule.roots is rules.ANY_OP or rule.roots <= set(OPS) | PROGRAM_ONLY_OPS, rule


def test_an_op_the_registry_lacks_is_of_no_kind():
    assert definition("Roll").kind == "" and not definition("Roll").pointwise
    assert not definition("Reshape", "com.microsoft").view_only
    assert definition("Reshape").view_only and definition("Squeeze").reshape_like
    assert not definition("Identity").reshape_like


def test_the_op_command_shows_what_each_stage_registered_with_an_op(capfd):
    """``pypto-offline op Pad``: its entry, the behaviour each stage registered with it and the
    rewrite rules rooted at it, in one place."""
    from pypto_offline import cli
    assert cli.main(["op", "Pad", "--json"]) == 0
    shown = json.loads(capfd.readouterr().out)
    assert shown["entry"]["kind"] == "injective" and shown["entry"]["view"] == "pad"
    from pypto_offline.fusion import classify
    for attribute, value in ((codegen.lowering.LOWERING, codegen.LOWERINGS["Pad"]),
                             (classify.REFUSES, attributes.attribute(classify.REFUSES, "Pad"))):
        assert shown["registered"][attribute] == f"{value.__module__}.{value.__qualname__}"
    assert {"normaliser", "encoder", "moves_nothing_when", "reads_all_when"} \
        <= set(shown["registered"])
    assert shown["rewrite_rules"] == ["view_chain", "pad_of_pad"]
    assert cli.main(["op", "Celu"]) == 0
    assert f"{activations.BUILDER:20s} {activations.__name__}.celu" in capfd.readouterr().out


def test_the_op_command_refuses_an_op_the_registry_lacks(capfd):
    from pypto_offline import cli
    assert cli.main(["op", "relu"]) == 2
    err = capfd.readouterr().err
    assert "'relu' is not an op the registry defines" in err and "Traceback" not in err
