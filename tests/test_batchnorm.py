"""BatchNormalization at inference (importer/batchnorm.py): folded into the convolution or Gemm
before it, else a per-channel Mul and Add that fuse with their neighbours; a fold is checked
against the model in onnxruntime; one in training mode stays, with its reason."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pypto_offline import import_model
from pypto_offline.importer.batchnorm import same_outputs
from pypto_offline.runtime import generate_inputs, max_abs_diff, run_model
from tests.fusion_helpers import fuse
from tests.onnx_builders import GraphBuilder

RNG = np.random.default_rng(19)
CHANNELS = 8


def _batch_norm(b: GraphBuilder, x: str, **attributes) -> str:
    scale, bias, mean = (RNG.standard_normal(CHANNELS).astype(np.float32) for _ in range(3))
    variance = RNG.uniform(0.5, 2.0, CHANNELS).astype(np.float32)
    return b.op("BatchNormalization", [x, b.const(scale), b.const(bias), b.const(mean),
                                       b.const(variance)], epsilon=1e-3, **attributes)


def _conv(b: GraphBuilder, x: str, kernel: int = 3, bias: bool = True) -> str:
    weights = b.const(RNG.standard_normal((CHANNELS, 4, kernel, kernel)).astype(np.float32))
    inputs = [x, weights] + ([b.const(RNG.standard_normal(CHANNELS).astype(np.float32))]
                             if bias else [])
    return b.op("Conv", inputs, pads=[kernel // 2] * 4)


def _same_as_source(model: onnx.ModelProto, graph) -> None:
    feeds = generate_inputs(graph.model, seed=3)
    expected, actual = run_model(model, feeds), run_model(graph.model, feeds)
    for name, want in expected.items():
        assert max_abs_diff(want, actual[name]) <= 1e-4 * max(1.0, np.abs(want).max()), name


def test_a_batch_norm_after_a_convolution_disappears_into_its_weights():
    for bias in (True, False):
        b = GraphBuilder()
        model = b.model(b.op("Relu", [_batch_norm(b, _conv(b, b.input("x", [1, 4, 12, 12]),
                                                           bias=bias))]))
        graph = import_model(model)
        assert [n.op_type for n in graph.nodes] == ["Conv", "Relu"], bias
        (conv,) = [n for n in graph.nodes if n.op_type == "Conv"]
        assert len(conv.inputs) == 3  # the shift became the convolution's bias
        _same_as_source(model, graph)


def test_a_batch_norm_after_a_gemm_disappears_into_its_weights():
    b = GraphBuilder()
    x = b.input("x", [2, 16])
    gemm = b.op("Gemm", [x, b.const(RNG.standard_normal((CHANNELS, 16)).astype(np.float32))],
                transB=1)
    model = b.model(_batch_norm(b, gemm))
    graph = import_model(model)
    assert [n.op_type for n in graph.nodes] == ["Gemm"]
    _same_as_source(model, graph)


def test_a_batch_norm_after_an_add_is_a_per_channel_affine_that_fuses():
    """ppocrv4_det has one after a residual Add: a Mul and an Add by [C, 1, 1] constants,
    fused with the Add before them and the ReLU after into one kernel."""
    b = GraphBuilder()
    x, y = b.input("x", [1, CHANNELS, 16, 16]), b.input("y", [1, CHANNELS, 16, 16])
    model = b.model(b.op("Relu", [_batch_norm(b, b.op("Add", [x, y]))]))
    graph, plan = fuse(model)
    assert [n.op_type for n in graph.nodes] == ["Add", "Mul", "Add", "Relu"]
    scale = numpy_helper.to_array(next(t for t in graph.model.graph.initializer
                                       if t.name.endswith("_scale")))
    assert scale.shape == (CHANNELS, 1, 1)
    assert plan.totals.kernels_after == 1, plan.unfused
    _same_as_source(model, graph)


def test_a_convolution_read_elsewhere_keeps_its_weights_and_the_batch_norm_is_an_affine():
    """Folding would change what the other reader sees."""
    b = GraphBuilder()
    conv = _conv(b, b.input("x", [1, 4, 12, 12]))
    model = b.model(_batch_norm(b, conv), b.op("Sigmoid", [conv]))
    graph = import_model(model)
    assert sorted(n.op_type for n in graph.nodes) == ["Add", "Conv", "Mul", "Sigmoid"]
    _same_as_source(model, graph)


def test_a_batch_norm_in_training_mode_stays_with_its_reason():
    b = GraphBuilder(opset=15)
    normalised = _batch_norm(b, _conv(b, b.input("x", [1, 4, 12, 12])), training_mode=1)
    model = b.model(normalised)
    # onnx's shape inference leaves a training-mode output untyped; an exporter types it
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info(
        normalised, onnx.TensorProto.FLOAT, [1, CHANNELS, 12, 12]))
    graph = import_model(model)
    (node,) = [n for n in graph.nodes if n.op_type == "BatchNormalization"]
    assert not node.in_scope and "training mode" in node.why_not_canonical


def test_a_rewrite_that_changes_the_outputs_is_refused():
    b = GraphBuilder()
    model = b.model(b.op("Relu", [b.op("Mul", [b.input("x", [1, 4]), b.const(np.ones(4))])]))
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    wrong.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.full(4, 1.001, np.float32), wrong.graph.initializer[0].name))
    assert same_outputs(model, model) and not same_outputs(model, wrong)


@pytest.mark.pypto
def test_a_per_channel_affine_runs_on_channel_rows_at_its_lower_bound(tmp_path):
    """A transposed convolution's bias, a BatchNorm's scale and shift and a ReLU over NCHW run
    as [C, H*W] rows with the per-channel operands [C, 1] (fusion/rows.channel_rows): on the
    4-D tensors PyPTO needed two expand_clone calls per operand, and ppocrv4_det's such region
    found no tile within kirin9050's UB; as rows it reads and writes each tensor once."""
    from pypto_offline.pypto_kernels import compile_kernels
    from pypto_offline.targets import TARGETS

    b = GraphBuilder()
    x = b.input("x", [1, CHANNELS, 64, 64])
    biased = b.op("Add", [x, b.const(RNG.standard_normal((1, CHANNELS, 1, 1)).astype(np.float32))])
    model = b.model(b.op("Relu", [_batch_norm(b, biased)]))
    graph, plan = fuse(model)
    (region,) = plan.regions
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok, (kernel.fallback_reason, kernel.verdicts)
    assert f"ARGUMENT_SHAPES = [({CHANNELS}, 4096)" in kernel.source
    assert "expand_clone" not in kernel.source
    assert kernel.gm_bytes_read + kernel.gm_bytes_written <= 1.05 * region.fused.gm_bytes
    _same_as_source(model, graph)
