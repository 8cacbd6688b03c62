"""Build ``examples/example.onnx``, the small model the README's first command compiles.

A 3x3 Conv feeds the anchor chain Slice → Pad → Tile → Transpose → Reshape → Add (in fp32 the Conv is a
kernel of its own: its kernel would stage more through GM than fusing saves; in fp16 it roots it); the
Reshape's target comes from a Shape → Gather → Concat subgraph, as exporters write it, so the
import has something to fold. Synthetic on purpose: it shows the tool working, it backs no claim.
Run ``python examples/make_example.py`` to rebuild it (deterministic bytes).
"""
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "conv_w"),
        numpy_helper.from_array(np.array([0, 4, 4], np.int64), "starts"),
        numpy_helper.from_array(np.array([16, 60, 60], np.int64), "ends"),
        numpy_helper.from_array(np.array([1, 2, 3], np.int64), "axes"),
        numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 8, 8], np.int64), "pads"),
        numpy_helper.from_array(np.array(0.0, np.float32), "pad_value"),
        numpy_helper.from_array(np.array([1, 1, 1, 2], np.int64), "repeats"),
        numpy_helper.from_array(np.array([0], np.int64), "batch_axis"),
        numpy_helper.from_array(np.array([-1, 128], np.int64), "tail_shape"),
        numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Slice", ["conv", "starts", "ends", "axes"], ["sliced"], name="slice"),
        helper.make_node("Pad", ["sliced", "pads", "pad_value"], ["padded"], name="pad"),
        helper.make_node("Tile", ["padded", "repeats"], ["tiled"], name="tile"),
        helper.make_node("Transpose", ["tiled"], ["transposed"], name="transpose",
                         perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        helper.make_node("Gather", ["x_shape", "batch_axis"], ["batch"], name="batch", axis=0),
        helper.make_node("Concat", ["batch", "tail_shape"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["transposed", "target"], ["reshaped"], name="reshape"),
        helper.make_node("Add", ["reshaped", "bias"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "example_slice_pad_tile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1024, 128])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="pypto-offline examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    target = Path(__file__).with_name("example.onnx")
    target.write_bytes(build().SerializeToString())
    print(target)
