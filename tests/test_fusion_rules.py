"""Each rewrite rule fires on its pattern, and the simplified region computes the same result."""
from __future__ import annotations

import numpy as np
import pytest

from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.onnx_builders import GraphBuilder


def simplified(model):
    graph, plan = fuse(model)
    (region,) = plan.regions
    assert_compiled_matches(graph, plan)
    return region


def ops_of(region):
    return [op.op_type for op in region.simplified]


def with_relu(_unused):
    """Regions need a kernel to save: a Relu after the chain makes the chain worth fusing."""
    b = GraphBuilder()
    x = b.input("x", [2, 6, 8, 10])
    return b, x


def test_slice_of_slice_becomes_one_slice():
    b, x = with_relu(None)
    y = b.op("Slice", [x], starts=[1, 2], ends=[6, 10], axes=[1, 3])
    y = b.op("Slice", [y], starts=[1, 0], ends=[4, 7], axes=[1, 3], steps=[2, 3])
    region = simplified(b.model(b.op("Relu", [y])))
    assert "slice_of_slice" in region.rules_applied
    assert ops_of(region) == ["Slice", "Relu"]
    (slice_op,) = [op for op in region.simplified if op.op_type == "Slice"]
    assert slice_op.params["starts"] == (0, 2, 0, 2) and slice_op.params["steps"] == (1, 2, 1, 3)


def test_pad_of_pad_adds_the_pads():
    b, x = with_relu(None)
    y = b.op("Pad", [x], pads=[0, 0, 1, 0, 0, 0, 0, 2], value=0.5)
    y = b.op("Pad", [y], pads=[0, 1, 0, 0, 0, 0, 3, 0], value=0.5)
    region = simplified(b.model(b.op("Relu", [y])))
    assert "pad_of_pad" in region.rules_applied and ops_of(region) == ["Pad", "Relu"]
    assert region.simplified[0].params["pads"] == (0, 1, 1, 0, 0, 0, 3, 2)


def test_slice_of_pad_cuts_the_data_first():
    b, x = with_relu(None)
    y = b.op("Pad", [x], pads=[0, 0, 2, 2, 0, 0, 2, 2], value=0.0)
    y = b.op("Slice", [y], starts=[1, 3], ends=[9, 14], axes=[2, 3])
    region = simplified(b.model(b.op("Relu", [y])))
    assert "slice_of_pad" in region.rules_applied
    assert ops_of(region) == ["Slice", "Pad", "Relu"]
    slice_op, pad_op = region.simplified[:2]
    assert slice_op.params["starts"] == (0, 0, 0, 1) and slice_op.params["ends"] == (2, 6, 7, 10)
    assert pad_op.params["pads"] == (0, 0, 1, 0, 0, 0, 0, 2)


def test_inverse_transposes_disappear_and_others_compose():
    b, x = with_relu(None)
    y = b.op("Transpose", [x], perm=[0, 2, 3, 1])
    y = b.op("Transpose", [y], perm=[0, 3, 1, 2])
    z = b.op("Transpose", [b.op("Transpose", [x], perm=[1, 0, 2, 3])], perm=[0, 1, 3, 2])
    graph, plan = fuse(b.model(b.op("Relu", [y]), b.op("Relu", [z])))
    assert_compiled_matches(graph, plan)
    inverse, composed = plan.regions  # the two chains share only the graph input
    assert ops_of(inverse) == ["Relu"]
    assert ops_of(composed) == ["Transpose", "Relu"]
    assert composed.simplified[0].params["perm"] == (1, 0, 3, 2)


def test_a_narrowing_cast_moves_before_the_moves_and_a_widening_one_after():
    import onnx

    b, x = with_relu(None)
    y = b.op("Relu", [x])
    y = b.op("Transpose", [b.op("Slice", [y], starts=[1], ends=[5], axes=[1])], perm=[0, 2, 3, 1])
    half = b.op("Cast", [y], to=onnx.TensorProto.FLOAT16)
    wide = b.op("Cast", [b.op("Relu", [half])], to=onnx.TensorProto.FLOAT)
    out = b.op("Neg", [b.op("Reshape", [wide, b.const([2, -1])])])
    region = simplified(b.model(out))
    assert {"narrowing_cast_before_movement",
            "widening_cast_after_movement"} <= set(region.rules_applied)
    assert ops_of(region) == ["Relu", "Cast", "Slice", "Transpose", "Relu", "Reshape", "Cast",
                              "Neg"]


def test_a_cast_whose_moved_input_is_also_read_stays():
    import onnx

    b, x = with_relu(None)
    y = b.op("Transpose", [b.op("Relu", [x])], perm=[0, 2, 3, 1])
    half = b.op("Cast", [y], to=onnx.TensorProto.FLOAT16)
    region = simplified(b.model(b.op("Relu", [half]), b.op("Neg", [y])))
    assert "narrowing_cast_before_movement" not in region.rules_applied
    assert ops_of(region).index("Transpose") < ops_of(region).index("Cast")


def test_slice_moves_before_a_transpose():
    b, x = with_relu(None)
    y = b.op("Transpose", [x], perm=[0, 3, 1, 2])
    y = b.op("Slice", [y], starts=[1, 2], ends=[9, 5], axes=[1, 3], steps=[2, 1])
    region = simplified(b.model(b.op("Relu", [y])))
    assert "slice_before_transpose" in region.rules_applied
    assert ops_of(region) == ["Slice", "Transpose", "Relu"]
    slice_op = region.simplified[0]
    assert slice_op.params["starts"] == (0, 0, 2, 1) and slice_op.params["steps"] == (1, 1, 1, 2)


def test_reshape_chain_becomes_one_reshape():
    b, x = with_relu(None)
    y = b.op("Reshape", [x], shape=[12, 80])
    y = b.op("Unsqueeze", [y], axes=[0])
    y = b.op("Reshape", [y], shape=[2, 6, 80])
    region = simplified(b.model(b.op("Relu", [b.op("Neg", [y])])))
    assert ops_of(region) == ["Reshape", "Neg", "Relu"]


def test_slices_and_concat_make_a_roll():
    b, x = with_relu(None)
    tail = b.op("Slice", [x], starts=[3], ends=[8], axes=[2])
    head = b.op("Slice", [x], starts=[0], ends=[3], axes=[2])
    y = b.op("Concat", [tail, head], axis=2)
    region = simplified(b.model(b.op("Relu", [y])))
    assert "slices_concat_roll" in region.rules_applied
    assert ops_of(region) == ["Roll", "Relu"]
    assert dict(region.simplified[0].params) == {"axis": 2, "shift": 3}


def test_split_then_concat_of_all_parts_is_the_input():
    b, x = with_relu(None)
    parts = b.op("Split", [x], outputs=3, axis=1, split=[1, 2, 3])
    y = b.op("Concat", parts, axis=1)
    region = simplified(b.model(b.op("Relu", [y])))
    assert "split_then_concat" in region.rules_applied and ops_of(region) == ["Relu"]


def test_expand_feeding_an_elementwise_op_is_a_broadcast():
    b = GraphBuilder()
    x, scale = b.input("x", [2, 6, 8, 10]), b.input("scale", [1, 6, 1, 1])
    wide = b.op("Expand", [scale], shape=[2, 6, 8, 10])
    region = simplified(b.model(b.op("Relu", [b.op("Mul", [x, wide])])))
    assert "expand_into_broadcast" in region.rules_applied and ops_of(region) == ["Mul", "Relu"]


@pytest.mark.parametrize("op_type,kwargs", [
    ("Slice", {"starts": [0], "ends": [10], "axes": [3]}),
    ("Pad", {"pads": [0] * 8, "value": 0.0}),
    ("Transpose", {"perm": [0, 1, 2, 3]}),
    ("Tile", {"repeats": [1, 1, 1, 1]}),
    ("Expand", {"shape": [2, 6, 8, 10]}),
])
def test_no_ops_vanish(op_type, kwargs):
    b, x = with_relu(None)
    y = b.op(op_type, [x], **kwargs)
    graph, plan = fuse(b.model(b.op("Relu", [b.op("Neg", [y])])))
    (region,) = plan.regions
    assert ops_of(region) == ["Neg", "Relu"]


def test_the_issue_chain_simplifies_to_one_view_op_per_axis_group():
    """Two Slices, an all-zero Pad, inverse Transposes and two Reshapes."""
    b, x = with_relu(None)
    y = b.op("Slice", [x], starts=[1], ends=[7], axes=[2])
    y = b.op("Slice", [y], starts=[1], ends=[5], axes=[2])
    y = b.op("Pad", [y], pads=[0] * 8, value=0.0)
    y = b.op("Transpose", [y], perm=[0, 2, 1, 3])
    y = b.op("Transpose", [y], perm=[0, 2, 1, 3])
    y = b.op("Reshape", [y], shape=[12, 4, 10])
    y = b.op("Reshape", [y], shape=[2, 6, 40])
    region = simplified(b.model(b.op("Relu", [y])))
    assert len(region.original) == 8
    assert ops_of(region) == ["Slice", "Reshape", "Relu"]


def _linear(bias_shape, residual=False, weight_rank=2):
    """x @ W + bias (+ a residual read of the product when ``residual``), then a Relu."""
    b = GraphBuilder()
    x = b.input("x", [1, 8, 16])
    weight = np.ones((16, 32) if weight_rank == 2 else (1, 16, 32), np.float32) * 0.1
    product = b.op("MatMul", [x, b.const(weight)])
    y = b.op("Add", [product, b.const(np.arange(np.prod(bias_shape), dtype=np.float32)
                                      .reshape(bias_shape))])
    if residual:
        y = b.op("Add", [y, product])
    return b.model(b.op("Relu", [y]))


def test_a_per_column_bias_joins_its_matmul():
    region = simplified(_linear([32]))
    assert "bias_into_matmul" in region.rules_applied
    assert ops_of(region) == ["MatMul", "Relu"] and len(region.simplified[0].inputs) == 3


@pytest.mark.parametrize("bias_shape, residual, weight_rank", [
    ([8, 1], False, 2),    # one value per row: the cube adds a bias per column only
    ([1, 8, 32], False, 2),  # a full tensor, not a bias
    ([32], True, 2),       # the product is read again: the Add cannot take its place
    ([32], False, 3),      # a batched weight: codegen's folded 2-D form is the only one
])
def test_no_bias_joins_a_matmul_it_does_not_fit(bias_shape, residual, weight_rank):
    graph, plan = fuse(_linear(bias_shape, residual, weight_rank))
    assert_compiled_matches(graph, plan)
    for region in plan.regions:
        assert "bias_into_matmul" not in region.rules_applied
        assert all(len(op.inputs) == 2 for op in region.simplified if op.op_type == "MatMul")


def _layer_scale_residual(residual_shape, scale_shape=(16,), read_twice=False):
    """ConvNeXt's block tail: NHWC product times a layer scale, to NCHW, plus the residual, and
    back to NHWC for the next block."""
    b = GraphBuilder()
    x, r = b.input("x", [1, 4, 4, 16]), b.input("r", residual_shape)
    scaled = b.op("Mul", [b.op("Relu", [x]), b.const(np.full(scale_shape, 0.5, np.float32))])
    nchw = b.op("Transpose", [scaled], perm=[0, 3, 1, 2])
    total = b.op("Add", [r, nchw])
    outputs = [b.op("Transpose", [total], perm=[0, 2, 3, 1])]
    if read_twice:
        outputs.append(b.op("Relu", [nchw]))
    return b.model(*outputs)


def test_a_transpose_undone_after_an_elementwise_op_moves_to_the_other_operand():
    region = simplified(_layer_scale_residual([1, 16, 4, 4]))
    assert "transpose_back_through_binary" in region.rules_applied
    assert ops_of(region) == ["Relu", "Mul", "Transpose", "Add"]
    transpose, add = region.simplified[2:]
    assert transpose.inputs == ("r",) and transpose.params["perm"] == (0, 2, 3, 1)
    assert add.inputs[0] == transpose.outputs[0]  # the operands keep their order


@pytest.mark.parametrize("residual_shape, read_twice", [
    ([1, 16, 1, 1], False),  # a broadcast residual: its transpose would not have the shape
    ([1, 16, 4, 4], True),   # the NCHW tensor is read again: both layouts are needed
])
def test_a_transpose_stays_where_moving_it_saves_nothing(residual_shape, read_twice):
    graph, plan = fuse(_layer_scale_residual(residual_shape, read_twice=read_twice))
    assert_compiled_matches(graph, plan)
    for region in plan.regions:
        assert "transpose_back_through_binary" not in region.rules_applied


@pytest.mark.parametrize("op_type", ["ReduceMean", "ReduceMax", "ReduceSum"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_reduction_over_lone_elements_is_a_reshape(op_type, keepdims):
    """silero_vad's ReduceMean over an axis of one element: no row layout takes it ("a reduction
    over one element"), and it is only a reshape of its input."""
    b = GraphBuilder()
    x = b.input("x", [2, 1, 8, 10])
    y = b.op(op_type, [b.op("Neg", [x]), b.const(np.array([1], np.int64))], keepdims=keepdims)
    region = simplified(b.model(b.op("Relu", [y])))
    assert "reduction_over_one_element" in region.rules_applied
    assert op_type not in ops_of(region) and "Relu" in ops_of(region)
