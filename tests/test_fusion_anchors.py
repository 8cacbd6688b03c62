"""The three anchor patterns of the fusion issue each become exactly one kernel whose global-memory
bytes equal the lower bound: inputs read once, outputs written once."""
from __future__ import annotations

import onnx
import pytest

from tests.fusion_helpers import assert_compiled_matches, fuse, io_bytes
from tests.onnx_builders import GraphBuilder


def slice_pad_tile_transpose_reshape_add():
    b = GraphBuilder()
    x, bias = b.input("x", [1, 16, 64, 64]), b.input("bias", [128])
    y = b.op("Slice", [x], starts=[4, 4], ends=[60, 60], axes=[2, 3])
    y = b.op("Pad", [y], pads=[0, 0, 0, 0, 0, 0, 8, 8], value=0.0)
    y = b.op("Tile", [y], repeats=[1, 1, 1, 2])
    y = b.op("Transpose", [y], perm=[0, 2, 1, 3])
    y = b.op("Reshape", [y], shape=[1, -1, 128])
    return b.model(b.op("Add", [y, bias]))


def channel_shuffle():
    """ShuffleNet v2: concatenate two branches, shuffle channels in 2 groups, split again."""
    b = GraphBuilder()
    left, right = b.input("left", [1, 58, 28, 28]), b.input("right", [1, 58, 28, 28])
    y = b.op("Concat", [left, right], axis=1)
    y = b.op("Reshape", [y], shape=[1, 2, 58, 28, 28])
    y = b.op("Transpose", [y], perm=[0, 2, 1, 3, 4])
    y = b.op("Reshape", [y], shape=[1, 116, 28, 28])
    first, second = b.op("Split", [y], outputs=2, axis=1, split=[58, 58])
    return b.model(first, second)


def rotary():
    """x * cos + rotate_half(x) * sin, rotate_half = concat(-x[..., d/2:], x[..., :d/2])."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 16, 64])
    cos, sin = b.input("cos", [1, 1, 16, 64]), b.input("sin", [1, 1, 16, 64])
    first = b.op("Slice", [x], starts=[0], ends=[32], axes=[3])
    second = b.op("Slice", [x], starts=[32], ends=[64], axes=[3])
    rotated = b.op("Concat", [b.op("Neg", [second]), first], axis=3)
    return b.model(b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [rotated, sin])]))


# Input bytes no output depends on, which the lower bound does not read (docs/figures.md): x
# outside its Slice window (16 channels of 64x64, of which 56x56 are kept).
UNREAD = {slice_pad_tile_transpose_reshape_add: 16 * (64 * 64 - 56 * 56) * 4}


@pytest.mark.parametrize("target", ["kirin9050", "ascend910b"])
@pytest.mark.parametrize("build", [slice_pad_tile_transpose_reshape_add, channel_shuffle, rotary])
def test_anchor_is_one_kernel_at_the_lower_bound(build, target):
    graph, plan = fuse(build(), target)
    totals = plan.totals
    assert totals.kernels_before >= 3
    assert totals.kernels_after == 1 and totals.fused_kernels == 1
    (region,) = plan.regions
    lower_bound = io_bytes(graph, graph.inputs) + io_bytes(graph, graph.outputs) \
        - UNREAD.get(build, 0)
    assert region.fused.gm_bytes == lower_bound == totals.gm_bytes_after
    assert totals.gm_bytes_after < totals.gm_bytes_before
    assert totals.est_time_us_after < totals.est_time_us_before
    assert_compiled_matches(graph, plan)


def test_compiled_anchor_is_a_valid_model_with_one_function_call():
    graph, plan = fuse(rotary())
    model = plan.compiled_model
    onnx.checker.check_model(model, full_check=True)
    (call,) = model.graph.node
    assert call.domain == "pypto.offline" and call.op_type == plan.regions[0].id
    (function,) = model.functions
    assert function.name == call.op_type and function.domain == "pypto.offline"
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in call.attribute}
    assert attributes["fused_ops"] == len(plan.regions[0].original) == 7
    assert attributes["kernel_id"] == b"region_0"
