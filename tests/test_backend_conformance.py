"""Every ONNX backend node case of an in-scope op goes through the importer, comes out in canonical
form, and the normalised graph reproduces the case's expected outputs."""
from __future__ import annotations

import numpy as np
import pytest

from pypto_offline import import_model
from pypto_offline.runtime import run_model
from bench.backend_cases import in_scope_cases

CASES = in_scope_cases()
# Forms the importer leaves as boundaries on purpose (importer/canonical.py), and the reason it
# gives: a kernel writes no Mean/InvStdDev, a
# reduction without axes that is an identity is not one, a MatMul takes matrices with the
# same batch axes, a Gemm no alpha, beta, transA or full C, and a Conv is a kernel's only when
# it is a 1x1 one.
BOUNDARY_FORMS = {"LayerNormalization": "Mean or InvStdDev output is used",
                  "ReduceSum": "noop_with_empty_axes",
                  "MatMul": "a MatMul of matrices with equal batch axes",
                  "Gemm": "a Gemm A @ B(^T) + C with a per-column C",
                  "Conv": "the kernel generator takes a convolution of one image",
                  "BatchNormalization": "in training mode",
                  # per axis, blocked, float8/int4/int16 (importer/quantised.py)
                  "QuantizeLinear": "a quantisation of a tensor by one scale",
                  "DequantizeLinear": "a quantisation of a tensor by one scale",
                  # uint8 or a zero point (importer/contractions.py)
                  "ConvInteger": "integer contraction of int8 operands without zero points",
                  "MatMulInteger": "integer contraction of int8 operands without zero points"}
# Pooling the kernel generator writes as shifted views: 2-D, undilated, one output, the padding
# counted in a mean, no window past the input
POOL_BOUNDARIES = ("not a 2-D pooling of an NCHW tensor with one output",
                   "a dilated or column-major pooling", "a ceil_mode pooling with a window past",
                   "an AveragePool that leaves its padding out of the count")
# Ops the importer writes in other canonical ops (importer/batchnorm.py)
REWRITTEN = {"BatchNormalization": ["Mul", "Add"]}


def test_the_suite_covers_every_data_movement_op_and_reduction():
    covered = {case.op_type for case in CASES}
    for op in ("Slice", "Pad", "Tile", "Expand", "Concat", "Split", "Squeeze", "Unsqueeze",
               "Reshape", "Flatten", "Transpose", "Gather", "DepthToSpace", "SpaceToDepth",
               "Cast", "Identity", "Clip", "Where", "ReduceSum", "ReduceMean", "ReduceMax",
               "ReduceMin", "ReduceSumSquare", "ReduceL2", "Softmax", "LogSoftmax",
               "LayerNormalization"):
        assert op in covered, f"no backend case for {op}"
    assert len(CASES) >= 450  # 490 with onnx 1.23.2


def _is_tensor_case(case) -> bool:
    return all(isinstance(v, (np.ndarray, np.generic)) for v in list(case.inputs.values()) + case.outputs)


def _assert_same(expected, actual, case, name):
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), name
        for e, a in zip(expected, actual):
            _assert_same(e, a, case, name)
        return
    assert actual.shape == expected.shape, name
    if expected.dtype.kind in "OUS":
        assert np.array_equal(actual, expected), name
    else:
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   rtol=case.rtol, atol=case.atol, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_backend_case(case):
    graph = import_model(case.model)
    if [node.op_type for node in graph.nodes] == REWRITTEN.get(case.op_type):
        assert all(node.in_scope for node in graph.nodes), case.name
    else:
        _assert_canonical_or_a_boundary_form(case, graph)
    outputs = run_model(graph.model, case.inputs)
    names = [o.name for o in graph.model.graph.output]
    for name, expected in zip(names, case.outputs):
        _assert_same(expected, outputs[name], case, name)
        if isinstance(expected, np.ndarray):
            assert graph.tensors[name].shape == expected.shape, f"{name}: imported shape is wrong"


def _assert_canonical_or_a_boundary_form(case, graph):
    (node,) = graph.nodes
    expected = POOL_BOUNDARIES if case.op_type in ("MaxPool", "AveragePool") \
        else [BOUNDARY_FORMS.get(case.op_type)]
    if not node.in_scope and any(form and form in node.why_not_canonical for form in expected):
        pass  # the normalised graph must still reproduce the case (below)
    elif _is_tensor_case(case):
        assert node.in_scope, f"{case.name}: not normalised: {node.why_not_canonical}"
    else:  # Identity of a sequence or an optional passes through untouched, with its reason
        assert not node.in_scope and "not a tensor" in node.why_not_canonical
