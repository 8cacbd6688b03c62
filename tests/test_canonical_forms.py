"""One canonical form per op: the same parameters whatever the opset encoding, and the rewritten
node computes what the original did."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx import TensorProto

from pypto_offline import ModelError, import_model
from pypto_offline.runtime import run_model
from tests.onnx_builders import one_node, seeded

I64 = np.int64


def canonical(model):
    graph = import_model(model)
    (node,) = graph.nodes
    assert node.in_scope, node.why_not_canonical
    return graph, node


def assert_same_result(model, graph, x):
    original = run_model(model, {"x": x})
    rewritten = run_model(graph.model, {"x": x})
    for name, value in original.items():
        np.testing.assert_array_equal(rewritten[name], value)


def test_slice_attribute_form_and_input_form_agree():
    old = one_node("Slice", [4, 10], opset=9, starts=[1], ends=[-1], axes=[1])
    new = one_node("Slice", [4, 10], opset=13, params={"s": np.array([1], I64),
                                                      "e": np.array([-1], I64),
                                                      "a": np.array([1], I64)})
    _, old_node = canonical(old)
    _, new_node = canonical(new)
    assert old_node.params == new_node.params == {"starts": (0, 1), "ends": (4, 9), "steps": (1, 1)}


def test_slice_clamps_out_of_range_and_handles_negative_steps():
    model = one_node("Slice", [6, 8], opset=13, params={
        "s": np.array([-100, 2**62], I64), "e": np.array([2**62, -100], I64),
        "a": np.array([0, 1], I64), "st": np.array([2, -3], I64)})
    graph, node = canonical(model)
    assert node.params == {"starts": (0, 7), "ends": (6, -1), "steps": (2, -3)}
    x = seeded([6, 8])
    np.testing.assert_array_equal(run_model(graph.model, {"x": x})["y0"], x[0:6:2, 7::-3])
    assert graph.tensors["y0"].shape == (3, 3)


def test_pad_v2_attribute_form_equals_input_form_with_axes():
    v2 = one_node("Pad", [2, 3, 4], opset=2, pads=[0, 1, 0, 0, 2, 3], value=1.5)
    v18 = one_node("Pad", [2, 3, 4], opset=18, params={
        "p": np.array([1, 0, 2, 3], I64), "v": np.array(1.5, np.float32), "a": np.array([1, -1], I64)})
    g2, n2 = canonical(v2)
    g18, n18 = canonical(v18)
    assert n2.params == n18.params == {"pads": (0, 1, 0, 0, 2, 3), "mode": "constant", "value": 1.5}
    x = seeded([2, 3, 4])
    np.testing.assert_array_equal(run_model(g2.model, {"x": x})["y0"],
                                  run_model(g18.model, {"x": x})["y0"])


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_records_non_constant_modes(mode):
    model = one_node("Pad", [3, 4], opset=11, params={"p": np.array([0, 1, 0, 2], I64)}, mode=mode)
    graph, node = canonical(model)
    assert node.params == {"pads": (0, 1, 0, 2), "mode": mode, "value": None}
    assert_same_result(model, graph, seeded([3, 4]))


@pytest.mark.parametrize("opset,kwargs,params", [
    (11, {"split": [2, 4]}, None),
    (13, {}, {"s": np.array([2, 4], I64)}),
])
def test_split_sizes_whatever_the_encoding(opset, kwargs, params):
    model = one_node("Split", [3, 6], opset=opset, params=params, outputs=2, axis=-1, **kwargs)
    _, node = canonical(model)
    assert node.params == {"axis": 1, "sizes": (2, 4)}


def test_split_18_num_outputs_leaves_a_smaller_last_part():
    model = one_node("Split", [7, 2], opset=18, outputs=3, axis=0, num_outputs=3)
    graph, node = canonical(model)
    assert node.params == {"axis": 0, "sizes": (3, 3, 1)}
    assert_same_result(model, graph, seeded([7, 2]))


def test_squeeze_and_unsqueeze_axes_are_sorted_and_non_negative():
    _, squeeze11 = canonical(one_node("Squeeze", [1, 3, 1], opset=11, axes=[-1, 0]))
    _, squeeze13 = canonical(one_node("Squeeze", [1, 3, 1], opset=13))
    _, unsqueeze = canonical(one_node("Unsqueeze", [3], opset=13,
                                      params={"a": np.array([-1, 0], I64)}))
    assert squeeze11.params == squeeze13.params == {"axes": (0, 2)}
    assert unsqueeze.params == {"axes": (0, 2)}


@pytest.mark.parametrize("target,allowzero,expected", [
    ([0, -1], 0, (2, 12)),
    ([-1, 4], 0, (6, 4)),
    ([3, 2, 4], 1, (3, 2, 4)),
])
def test_reshape_resolves_zero_and_minus_one(target, allowzero, expected):
    model = one_node("Reshape", [2, 3, 4], opset=14, params={"s": np.array(target, I64)},
                     allowzero=allowzero)
    graph, node = canonical(model)
    assert node.params == {"shape": expected}
    assert_same_result(model, graph, seeded([2, 3, 4]))


def test_reshape_that_does_not_multiply_out_names_the_node():
    model = one_node("Reshape", [2, 3], opset=13, params={"s": np.array([4, -1], I64)},
                     out_shape=[4, 2])
    with pytest.raises(ModelError, match="the_reshape.*do not multiply out"):
        import_model(model)


def test_transpose_flatten_gather_defaults_are_explicit():
    _, transpose = canonical(one_node("Transpose", [2, 3, 4], opset=13))
    _, flatten = canonical(one_node("Flatten", [2, 3, 4], opset=13, axis=-1))
    graph, gather = canonical(one_node("Gather", [5, 2], opset=13,
                                       params={"i": np.array([-1, 0], I64)}))
    assert transpose.params == {"perm": (2, 1, 0)}
    assert flatten.params == {"axis": 2}
    assert gather.params["axis"] == 0 and gather.params["indices"].tolist() == [4, 0]
    x = seeded([5, 2])
    np.testing.assert_array_equal(run_model(graph.model, {"x": x})["y0"], x[[4, 0]])


@pytest.mark.parametrize("image, in_scope", [([1, 2, 256, 255], True), ([1, 2, 256, 256], False)])
def test_a_1x1_conv_past_the_cube_inner_axis_limit_stays_a_boundary(image, in_scope):
    """PyPTO's cube takes an operand's inner axis below 65535: a 1x1 Conv on 256x256 pixels
    (x[2, 65536]) failed its parser after recording (ppocrv4_det's 320x320 ones, F21004)."""
    weights = np.ones((4, 2, 1, 1), np.float32)
    graph = import_model(one_node("Conv", image, opset=13, params={"w": weights}))
    (node,) = graph.nodes
    assert node.in_scope is in_scope, node.why_not_canonical
    if not in_scope:
        assert "inner axis of 65536 is not below PyPTO's cube limit of 65535" \
            in node.why_not_canonical


def test_gather_with_run_time_indices_stays_a_boundary():
    model = one_node("Gather", [5, 2], opset=13, runtime_inputs=[("idx", TensorProto.INT64, [3])])
    graph = import_model(model)
    (node,) = graph.nodes
    assert not node.in_scope and "computed at run time" in node.why_not_canonical


def test_clip_6_attributes_and_11_inputs_agree():
    _, clip6 = canonical(one_node("Clip", [4], opset=6, min=-1.0, max=2.0))
    _, clip11 = canonical(one_node("Clip", [4], opset=11, params={
        "lo": np.array(-1.0, np.float32), "hi": np.array(2.0, np.float32)}))
    _, clip_max_only = canonical(one_node("Clip", [4], opset=13, params={
        "lo": None, "hi": np.array(2.0, np.float32)}))
    assert clip6.params == clip11.params == {"min": -1.0, "max": 2.0}
    assert clip_max_only.params == {"min": None, "max": 2.0}


def test_elementwise_and_depth_to_space_defaults_are_filled_in():
    _, leaky = canonical(one_node("LeakyRelu", [4], opset=16))
    _, d2s = canonical(one_node("DepthToSpace", [1, 8, 2, 2], opset=13, blocksize=2))
    assert leaky.params == {"alpha": pytest.approx(0.01)}
    assert d2s.params == {"blocksize": 2, "mode": "DCR"}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_slice_means_what_numpy_slicing_means(data):
    shape = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1))
    bound = st.integers(-9, 9) | st.sampled_from([2**62, -(2**62)])
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    opset = data.draw(st.sampled_from([9, 13])) if all(s == 1 for s in steps) else 13
    # ONNX Slice is numpy's basic slicing; declaring the output shape keeps empty results valid
    numpy_index = [slice(None)] * len(shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        numpy_index[axis] = slice(start, end, step)
    out_shape = list(np.empty(shape)[tuple(numpy_index)].shape)
    if opset == 9:
        model = one_node("Slice", shape, opset=9, starts=starts, ends=ends, axes=axes,
                         out_shape=out_shape)
    else:
        model = one_node("Slice", shape, opset=13, params={
            "s": np.array(starts, I64), "e": np.array(ends, I64), "a": np.array(axes, I64),
            "st": np.array(steps, I64)}, out_shape=out_shape)
    graph, node = canonical(model)
    x = seeded(shape)
    index = tuple(slice(s, None if e == -1 and st < 0 else e, st)
                  for s, e, st in zip(node.params["starts"], node.params["ends"],
                                      node.params["steps"]))
    expected = run_model(model, {"x": x})["y0"]
    np.testing.assert_array_equal(x[index], expected)
    np.testing.assert_array_equal(run_model(graph.model, {"x": x})["y0"], expected)
    assert graph.tensors["y0"].shape == expected.shape


def test_other_domains_and_control_flow_pass_through_untouched():
    from onnx import helper

    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "then", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "else", [],
                              [helper.make_tensor_value_info("n", TensorProto.FLOAT, [2])])
    nodes = [
        helper.make_node("If", ["flag"], ["y"], name="branchy", then_branch=branch,
                         else_branch=other),
        helper.make_node("MyOp", ["y"], ["z"], name="custom", domain="com.example", alpha=2.0),
    ]
    graph = helper.make_graph(
        nodes, "flow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    imported = import_model(model)
    assert [(n.op_type, n.in_scope) for n in imported.nodes] == [("If", False), ("MyOp", False)]
    for before, after in zip(model.graph.node, imported.model.graph.node):
        assert before == after
