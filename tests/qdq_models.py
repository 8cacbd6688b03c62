"""Small QDQ models for unit tests (issue 52), made as a phone pipeline makes them: a float model
quantised by onnxruntime's ``quantize_static`` (``bench.int8.quantise``: QDQ format, per-channel
int8 weights, int8 activations, MinMax on seeded random calibration batches).

Each builder returns ``(qdq_model, fp32_model)`` as protos (as tests/onnx_builders.py does): the
tests compare the QDQ build's kernels with the fp32 model's. The same bytes on every call (seeded
weights and calibration; quantize_static is deterministic). ``BUILDERS`` names them all.
``dequantised_twice`` is a QDQ pattern written by hand, the one model here quantize_static
did not make.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.int8 import quantise
from tests.onnx_builders import GraphBuilder

CALIBRATION = 8
IMAGE = (1, 32, 16, 16)  # NCHW: 32 channels, the depth of PyPTO's int8 fractal (docs/int8.md)


def calibration_feeds(model: onnx.ModelProto, batches: int = CALIBRATION) -> list[dict]:
    """Seeded standard-normal batches for every input (seeds 1..batches; tests use seed 0)."""
    return [inputs_of(model, seed) for seed in range(1, batches + 1)]


def inputs_of(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {value.name: rng.standard_normal(
        [d.dim_value for d in value.type.tensor_type.shape.dim]).astype(np.float32)
        for value in model.graph.input}


def _weight(shape, seed: int) -> np.ndarray:
    """He-scaled seeded weights: activations stay of order 1 layer after layer."""
    fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def _bias(size: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(size) * 0.1).astype(np.float32)


def _conv(b: GraphBuilder, x: str, c_in: int, c_out: int, kernel: int, seed: int,
          group: int = 1) -> str:
    weight = b.const(_weight((c_out, c_in // group, kernel, kernel), seed))
    return b.op("Conv", [x, weight, b.const(_bias(c_out, seed + 100))], group=group,
                kernel_shape=[kernel, kernel], pads=[kernel // 2] * 4)


def _quantised(fp32: onnx.ModelProto, **how) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    # no quant_pre_process: its graph optimisation would fuse MatMul + Add into a Gemm, and
    # these models are the op patterns they are named for
    return quantise(fp32, calibration_feeds(fp32), prepare=False, **how), fp32


def matmul_bias_relu() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Relu(x[64,128] @ W[128,64] + b[64])."""
    b = GraphBuilder()
    x = b.input("x", [64, 128])
    y = b.op("MatMul", [x, b.const(_weight((128, 64), 1))])
    y = b.op("Relu", [b.op("Add", [y, b.const(_bias(64, 2))])])
    return _quantised(b.model(y))


def conv1x1_relu() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Relu(Conv 1x1, 32 -> 64 channels) on 1x32x16x16."""
    b = GraphBuilder()
    y = b.op("Relu", [_conv(b, b.input("x", IMAGE), 32, 64, 1, seed=3)])
    return _quantised(b.model(y))


def conv3x3_relu() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Relu(Conv 3x3 pad 1, 32 -> 32 channels) on 1x32x16x16."""
    b = GraphBuilder()
    y = b.op("Relu", [_conv(b, b.input("x", IMAGE), 32, 32, 3, seed=4)])
    return _quantised(b.model(y))


def conv3x3_qoperator() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Conv 3x3 pad 1, 32 -> 32 channels, then 1x1, 32 -> 32, on 1x32x16x16, quantised in
    QOperator format: QuantizeLinear, two QLinearConv, DequantizeLinear."""
    b = GraphBuilder()
    y = _conv(b, _conv(b, b.input("x", IMAGE), 32, 32, 3, seed=8), 32, 32, 1, seed=9)
    return _quantised(b.model(y), qoperator=True)


def residual_uint8() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """``residual_convs`` quantised with uint8 activations (quantize_static's default)."""
    b = GraphBuilder()
    r = b.op("Relu", [_conv(b, b.input("x", IMAGE), 32, 32, 1, seed=6)])
    y = b.op("Add", [_conv(b, r, 32, 32, 1, seed=7), r])
    return _quantised(b.model(y), uint8_activations=True)


def depthwise3x3_relu6() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """Clip(depthwise Conv 3x3 pad 1 (group = 32 channels), 0, 6) on 1x32x16x16."""
    b = GraphBuilder()
    y = _conv(b, b.input("x", IMAGE), 32, 32, 3, seed=5, group=32)
    y = b.op("Clip", [y, b.const(np.float32(0.0)), b.const(np.float32(6.0))])
    return _quantised(b.model(y))


def residual_convs() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A residual block of two 1x1 convs, 32 channels: r = Relu(conv1(x)); conv2(r) + r."""
    b = GraphBuilder()
    r = b.op("Relu", [_conv(b, b.input("x", IMAGE), 32, 32, 1, seed=6)])
    y = b.op("Add", [_conv(b, r, 32, 32, 1, seed=7), r])
    return _quantised(b.model(y))


def heads_split_and_merged() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """An attention's head reshapes between two matmuls: x[64,128] @ W1, reshaped to 4 heads
    of 32 and transposed [4,64,32], transposed and reshaped back, @ W2[128,64], Relu.
    quantize_static puts each Reshape and Transpose between a DQ and a Q of one scale."""
    b = GraphBuilder()
    y = b.op("MatMul", [b.input("x", [64, 128]), b.const(_weight((128, 128), 11))])
    y = b.op("Transpose", [b.op("Reshape", [y, b.const(np.array([64, 4, 32], np.int64))])],
             perm=[1, 0, 2])
    y = b.op("Reshape", [b.op("Transpose", [y], perm=[1, 0, 2]),
                         b.const(np.array([64, 128], np.int64))])
    y = b.op("Relu", [b.op("MatMul", [y, b.const(_weight((128, 64), 12))])])
    return _quantised(b.model(y))


def concat_of_branches() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A C2f-like join on 1x32x16x16: two 1x1 conv branches (Relu, Sigmoid-gated), their
    channel concatenation (each branch its own scale, the concat another) and a 1x1 conv of it,
    64 -> 32."""
    b = GraphBuilder()
    x = b.input("x", IMAGE)
    left = b.op("Relu", [_conv(b, x, 32, 32, 1, seed=13)])
    gated = _conv(b, x, 32, 32, 1, seed=14)
    right = b.op("Mul", [gated, b.op("Sigmoid", [gated])])
    y = _conv(b, b.op("Concat", [left, right], axis=1), 64, 32, 1, seed=15)
    return _quantised(b.model(y))


def squeeze_excite() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A squeeze-and-excite block with its projection, as MobileNetV3's and PP-LCNet's: on
    1x32x16x16, the channels' means (GlobalAveragePool), a 1x1 conv 32 -> 32 with Relu, a 1x1
    conv 32 -> 32 with HardSigmoid, the image gated by it, and a 1x1 projection 32 -> 64. Every
    conv of depth 32: all three int8, each dequantised by a per-channel Mul and Add."""
    b = GraphBuilder()
    x = b.input("x", IMAGE)
    squeezed = b.op("Relu", [_conv(b, b.op("GlobalAveragePool", [x]), 32, 32, 1, seed=16)])
    gate = b.op("HardSigmoid", [_conv(b, squeezed, 32, 32, 1, seed=17)], alpha=1 / 6, beta=0.5)
    y = _conv(b, b.op("Mul", [x, gate]), 32, 64, 1, seed=18)
    return _quantised(b.model(y))


def dequantised_twice() -> onnx.ModelProto:
    """HardSwish as a QDQ model writes it, at 200 x 192 (a ppocr_cls_v2 tensor): r =
    Q(Relu(x)) read twice (the DQ's two readers), y = DQ(Q(DQ(r) * DQ(Q(DQ(r) + 3)))) / 6,
    each step requantised."""
    init = [numpy_helper.from_array(np.float32(value), name) for name, value in
            (("s", 0.05), ("s2", 0.03), ("three", 3.0), ("six", 6.0))]
    init += [numpy_helper.from_array(np.int8(value), name) for name, value in
             (("z", 3), ("z2", -10))]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Add", ["d", "three"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "s2", "z2"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "s2", "z2"], ["ad"]),
             helper.make_node("Mul", ["d", "ad"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "s2", "z2"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "s2", "z2"], ["md"]),
             helper.make_node("Div", ["md", "six"], ["y"])]
    graph = helper.make_graph(
        nodes, "dq_twice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [200, 192])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [200, 192])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def input_quantisation() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """y = DQ(Q(x, 1/255, -128)) on 64 x 256 (an image's quantisation, nudenet's first op),
    and inputs just above the ties k + 0.5 of x / scale: ``x / scale + zero_point`` rounds
    to the tie in fp32 (-127.5 + 2e-6 is -127.5), ONNX rounds x / scale first."""
    scale = np.float32(1 / 255)
    init = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(np.int8(-128), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(
        nodes, "input_quantisation",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])], init)
    ties = (np.arange(64 * 256) % 16 + np.float32(0.5) + np.float32(2e-6)).astype(np.float32)
    inputs = {"x": (ties * scale).astype(np.float32).reshape(64, 256)}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), inputs


BUILDERS = {f.__name__: f for f in (matmul_bias_relu, conv1x1_relu, conv3x3_relu,
                                    conv3x3_qoperator, residual_uint8,
                                    depthwise3x3_relu6, residual_convs,
                                    heads_split_and_merged, concat_of_branches,
                                    squeeze_excite)}
