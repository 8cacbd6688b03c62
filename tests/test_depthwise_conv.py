"""Issue 37's depthwise convolutions inside kernels: a depthwise KxK Conv (any stride up to 2,
dilation up to 2, its padding) is a window op (importer/canonical, importer/contractions), the
kernel writes it as its taps (pypto_kernels/codegen/convolution.py) and its epilogue fuses after
it; each compiles with the real PyPTO 0.2.0 and passes its check against onnxruntime. A
convolution no lowering takes (grouped, not depthwise; a 7x7 window) stays a boundary with its
reason. Small shapes: a few seconds of compile each."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from pypto_offline.importer.ops import WINDOW, kind_of
from pypto_offline.pypto_kernels import compile_kernels
from pypto_offline.runtime import generate_inputs, max_abs_diff, run_model
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import fuse
from tests.onnx_builders import GraphBuilder

RNG = np.random.default_rng(37)


def _depthwise(channels=8, size=16, kernel=3, stride=1, dilation=1, activation="HardSwish",
               dtype=np.float32, bias=True):
    b = GraphBuilder()
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = b.input("x", [1, channels, size, size], elem)
    inputs = [x, b.const(RNG.standard_normal((channels, 1, kernel, kernel)) * 0.3, dtype)]
    if bias:
        inputs.append(b.const(RNG.standard_normal(channels) * 0.3, dtype))
    pad = dilation * (kernel - 1) // 2
    conv = b.op("Conv", inputs, group=channels, kernel_shape=[kernel, kernel],
                strides=[stride, stride], dilations=[dilation, dilation], pads=[pad] * 4)
    return b.model(b.op(activation, [conv]) if activation else conv)


CASES = {
    "3x3 s1, bias, HardSwish": dict(),
    "3x3 s2, bias, Relu": dict(stride=2, activation="Relu"),
    "3x3 dilation 2, HardSwish": dict(dilation=2, bias=False),
    "5x5 s1, bias, Relu": dict(kernel=5, activation="Relu"),
    "3x3 s1, bias, Relu, fp16": dict(activation="Relu", dtype=np.float16),
    "3x3 s2 on an odd image, HardSwish, fp16": dict(stride=2, size=15, dtype=np.float16),
}


def test_a_depthwise_conv_is_a_window_op_fused_with_its_activation():
    for name, case in CASES.items():
        graph, plan = fuse(_depthwise(**case))
        (region,) = plan.regions
        assert [op.op_type for op in region.original] == ["Conv", case.get("activation",
                                                                             "HardSwish")], name
        (conv,) = [node for node in graph.nodes if node.op_type == "Conv"]
        assert kind_of(conv.op_type, conv.params) == WINDOW
        assert plan.totals.kernels_after == 1 and not plan.unfused, name


@pytest.mark.parametrize("grouped", [dict(kernel=7), dict(grouped=True)])
def test_a_convolution_no_lowering_takes_stays_a_boundary_with_its_reason(grouped):
    if grouped.get("grouped"):
        b = GraphBuilder()
        x = b.input("x", [1, 8, 16, 16])
        conv = b.op("Conv", [x, b.const(RNG.standard_normal((8, 2, 3, 3)).astype(np.float32))],
                    group=4, pads=[1, 1, 1, 1])
        model, reason = b.model(b.op("Relu", [conv])), "grouped, not depthwise"
    else:
        model, reason = _depthwise(**grouped), "depthwise kernel_shape [7, 7]: at most 5"
    graph, plan = fuse(model)
    (conv,) = [u for u in plan.unfused if u.op_type == "Conv"]
    assert reason in conv.reason, conv.reason


@pytest.mark.pypto
@pytest.mark.parametrize("name", list(CASES))
def test_a_depthwise_conv_and_its_epilogue_compile_to_one_kernel_that_checks(name, tmp_path):
    model = _depthwise(**CASES[name])
    graph, plan = fuse(model)
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok, (name, kernel.fallback_reason)
    assert kernel.tuned_tile.ub_bytes <= TARGETS["kirin9050"].ub_plan_bytes.value
    # the compiled graph (the region as its ONNX function) computes what the model does
    feeds = generate_inputs(model, seed=1)
    expected, actual = run_model(model, feeds), run_model(plan.compiled_model, feeds)
    for output, want in expected.items():
        assert max_abs_diff(want, actual[output]) <= 1e-3 * max(1.0, np.abs(want).max())
