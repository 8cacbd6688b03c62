"""ReduceL1, the op docs/architecture.md ("Adding an op") adds as its worked example: the sum of
|x| over axes, its axes an attribute before opset 18 and an input from 18. Imported into its
canonical form at both opsets, written as ``pypto.abs`` then ``pypto.sum`` over the rows, and
compiled with the real PyPTO into a kernel that matches onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from pypto_offline import import_model
from pypto_offline.fusion import make_region
from pypto_offline.fusion.classify import why_not_fusable
from pypto_offline.fusion.lower import compiled_model
from pypto_offline.pypto_kernels import codegen
from pypto_offline.pypto_kernels.compiler import compile_regions, setup_for
from pypto_offline.pypto_kernels.tiling import default_policy
from pypto_offline.runtime import run_model
from pypto_offline.targets import TARGETS
from pypto_offline.verify import compare, generate_inputs
from tests.onnx_builders import one_node

SHAPE = (2, 4, 16, 32)
TARGET = TARGETS["kirin9050"]
FLOAT, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
# (opset, axes, keepdims): the last axis and the last two, kept and dropped, the axes an
# attribute (opset 13) and an input (opset 18)
CASES = [(opset, axes, keepdims) for opset in (13, 18) for axes in ((-1,), (2, 3))
         for keepdims in (0, 1)]
CASE_IDS = [f"opset{opset}-axes{'_'.join(map(str, axes))}-keepdims{keepdims}"
            for opset, axes, keepdims in CASES]
# ... each in fp32, and one in fp16 (summed in fp16: rows are whole in a tile, docs/pypto-ops.md)
COMPILED = [(*case, FLOAT) for case in CASES] + [(18, (2, 3), 0, FLOAT16)]
COMPILED_IDS = CASE_IDS + ["opset18-axes2_3-keepdims0-fp16"]


def reduce_l1(opset: int, axes, keepdims: int, dtype: int = FLOAT, shape=SHAPE, **attrs):
    """A model of one ReduceL1, its axes written as the opset says."""
    if opset < 18:
        return one_node("ReduceL1", shape, opset=opset, axes=list(axes), keepdims=keepdims,
                        x_dtype=dtype, **attrs)
    return one_node("ReduceL1", shape, opset=opset, params={"axes": np.array(axes, np.int64)},
                    keepdims=keepdims, x_dtype=dtype, **attrs)


def _region(graph):
    (node,) = graph.nodes
    assert node.in_scope, node.why_not_canonical
    assert why_not_fusable(node, graph, TARGET) is None
    # the partition makes no region of one op (it saves nothing): the region is the op's own
    return make_region("reduce_l1", [node], graph, TARGET)


@pytest.mark.parametrize("opset,axes,keepdims", CASES, ids=CASE_IDS)
def test_both_encodings_import_to_one_canonical_form(opset, axes, keepdims):
    graph = import_model(reduce_l1(opset, axes, keepdims))
    (node,) = graph.nodes
    assert node.in_scope and node.op_type == "ReduceL1"
    assert node.params == {"axes": tuple(a % len(SHAPE) for a in axes), "keepdims": keepdims}
    feeds = generate_inputs(graph.model, 0)
    original = run_model(reduce_l1(opset, axes, keepdims), feeds)["y0"]
    np.testing.assert_allclose(run_model(graph.model, feeds)["y0"], original, rtol=1e-6)


def test_no_axes_with_noop_with_empty_axes_is_an_identity_left_as_it_was():
    graph = import_model(one_node("ReduceL1", SHAPE, opset=18, noop_with_empty_axes=1))
    (node,) = graph.nodes
    assert not node.in_scope and "noop_with_empty_axes" in node.why_not_canonical


def test_the_kernel_sums_the_absolute_values_of_each_row():
    graph = import_model(reduce_l1(18, (-1,), 1))
    source = codegen.kernel_source(_region(graph), default_policy(TARGET.ub_plan_bytes.value),
                                   graph.constant_values())
    absolute = source.index("pypto.abs(")
    assert source.index("pypto.sum(", absolute) > absolute


def test_over_one_element_it_is_refused_not_made_a_reshape():
    """ReduceL1 is not ``as_is_over_one``: |x| of a lone element is not x. A ReduceMean over an
    axis of one element is rewritten as a reshape (``rules.reduction_over_one_element``); a
    ReduceL1 is not, and no row layout takes it, so onnxruntime keeps computing it."""
    mean = import_model(one_node("ReduceMean", (2, 4, 16, 1), opset=13, axes=[-1]))
    assert "reduction_over_one_element" in _region(mean).rules_applied
    graph = import_model(reduce_l1(13, (-1,), 1, shape=(2, 4, 16, 1)))
    verdict = why_not_fusable(graph.nodes[0], graph, TARGET)
    assert verdict is not None and "a reduction over one element" in verdict[1]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    graphs = [import_model(reduce_l1(*case)) for case in COMPILED]
    regions = [(_region(graph), graph) for graph in graphs]
    setup = setup_for(TARGET, tmp_path_factory.mktemp("kernel-cache"))
    return graphs, regions, compile_regions(regions, setup, search=False)


@pytest.mark.pypto
@pytest.mark.parametrize("index", range(len(COMPILED)), ids=COMPILED_IDS)
def test_the_kernel_compiles_passes_its_check_and_matches_onnxruntime(compiled, index):
    """The kernel passes its functional check (PyPTO's interpreter runs it on seeded inputs in
    [-1, 1), against onnxruntime's result for the op: ``region_data.py``), and the compiled
    graph, the op replaced by its region's function (written back at the model's opset by
    ``encoding.ENCODERS``), matches onnxruntime."""
    graphs, regions, kernels = compiled
    graph, (region, _), kernel = graphs[index], regions[index], kernels[index]
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert kernel.source.count("pypto.abs(") == 1  # the kernel compiled is the one of the op
    model = reduce_l1(*COMPILED[index])
    feeds = generate_inputs(model, index)
    result = compare(model, compiled_model(graph, [region]), feeds)
    assert result.status == "passed", result.outputs
