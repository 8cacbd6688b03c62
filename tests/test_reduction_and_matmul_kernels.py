"""Issue 18's patterns: a reduction with its elementwise neighbours, a matmul (or a 1x1
convolution) with its epilogue, and comparisons with their casts, each compile into exactly one
kernel with the real PyPTO 0.2.0, pass the functional check against onnxruntime, and the whole
compiled graph matches the original. All patterns are
compiled in one build (one shared cache, both worker threads busy) to keep the suite short."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from pypto_offline.fusion.cost import cube_handoff_bytes, cube_reread_bytes
from pypto_offline.registry.ops import MATMUL, REDUCTION, kind_of
from pypto_offline.pypto_kernels import compile_kernels
from pypto_offline.pypto_kernels.compiler import setup_for
from pypto_offline.pypto_kernels.measured_baseline import unfused_costs
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.onnx_builders import GraphBuilder

RNG = np.random.default_rng(18)
HIDDEN, TOKENS = 64, 32


def _weights(*shape, scale=0.1):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _scalar(b: GraphBuilder, value: float) -> str:
    return b.const(np.float32(value))


def decomposed_layer_norm():
    """torch.nn.LayerNorm as older exporters write it: nine ONNX ops."""
    b = GraphBuilder()
    x = b.input("x", [1, TOKENS, HIDDEN])
    mean = b.op("ReduceMean", [x, b.const([-1])], keepdims=1)
    centred = b.op("Sub", [x, mean])
    variance = b.op("ReduceMean", [b.op("Pow", [centred, _scalar(b, 2.0)]), b.const([-1])],
                    keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [variance, _scalar(b, 1e-5)])])
    scaled = b.op("Mul", [b.op("Div", [centred, std]), b.const(_weights(HIDDEN) + 1)])
    return b.model(b.op("Add", [scaled, b.const(_weights(HIDDEN))]))


def layer_normalization_op():
    """The opset-17 op with its residual add, as the dynamo exporter writes BERT's."""
    b = GraphBuilder()
    x, residual = b.input("x", [1, TOKENS, HIDDEN]), b.input("r", [1, TOKENS, HIDDEN])
    return b.model(b.op("LayerNormalization", [b.op("Add", [x, residual]),
                                               b.const(_weights(HIDDEN) + 1),
                                               b.const(_weights(HIDDEN))], axis=-1,
                        epsilon=1e-12))


def llama_rms_norm():
    """LlamaRMSNorm: x * 1/sqrt(mean(x^2) + eps) * weight, the reciprocal as 1 / (...)."""
    b = GraphBuilder()
    x = b.input("x", [1, TOKENS, HIDDEN])
    mean_square = b.op("ReduceMean", [b.op("Pow", [x, _scalar(b, 2.0)]), b.const([-1])],
                       keepdims=1)
    inverse = b.op("Div", [_scalar(b, 1.0),
                           b.op("Sqrt", [b.op("Add", [mean_square, _scalar(b, 1e-6)])])])
    return b.model(b.op("Mul", [b.const(_weights(HIDDEN) + 1), b.op("Mul", [x, inverse])]))


def attention_softmax():
    """Scaled scores plus a broadcast padding mask, then Softmax over the keys."""
    b = GraphBuilder()
    scores, mask = b.input("scores", [1, 4, TOKENS, TOKENS]), b.input("mask", [1, 1, 1, TOKENS])
    scaled = b.op("Mul", [scores, _scalar(b, 0.125)])
    return b.model(b.op("Softmax", [b.op("Add", [scaled, mask])], axis=-1))


def masked_attention_softmax():
    """Issue 37: a causal mask [1, 1, 64, 128] broadcast over 8 heads of scores, then Softmax:
    the mask is expanded to the rows in UB (fusion/rows.py, EXPANDED); 2 kernels before."""
    b = GraphBuilder()
    scores, mask = b.input("scores", [1, 8, 64, 128]), b.input("mask", [1, 1, 64, 128])
    scaled = b.op("Mul", [scores, _scalar(b, 0.125)])
    return b.model(b.op("Softmax", [b.op("Add", [scaled, mask])], axis=-1))


def matmul_bias_gelu():
    """A BERT intermediate layer: Linear then GELU written with Erf."""
    b = GraphBuilder()
    x = b.input("x", [1, TOKENS, HIDDEN])
    h = b.op("Add", [b.op("MatMul", [x, b.const(_weights(HIDDEN, 2 * HIDDEN))]),
                     b.const(_weights(2 * HIDDEN))])
    erf = b.op("Erf", [b.op("Div", [h, _scalar(b, 1.4142135623730951)])])
    gelu = b.op("Mul", [b.op("Mul", [h, b.op("Add", [erf, _scalar(b, 1.0)])]), _scalar(b, 0.5)])
    return b.model(gelu)


def matmul_bias_residual():
    """A BERT output projection: Linear then the residual add."""
    b = GraphBuilder()
    x, residual = b.input("x", [1, TOKENS, HIDDEN]), b.input("r", [1, TOKENS, HIDDEN])
    h = b.op("Add", [b.op("MatMul", [x, b.const(_weights(HIDDEN, HIDDEN))]),
                     b.const(_weights(HIDDEN))])
    return b.model(b.op("Add", [h, residual]))


def gemm_gelu_tanh():
    """GPT-2's MLP as its exporter writes it: a Gemm with a transposed weight, then gelu_new
    (the tanh approximation, with Pow)."""
    b = GraphBuilder()
    x = b.input("x", [TOKENS, HIDDEN])
    h = b.op("Gemm", [x, b.const(_weights(2 * HIDDEN, HIDDEN)), b.const(_weights(2 * HIDDEN))],
             transB=1)
    cubic = b.op("Mul", [b.op("Pow", [h, _scalar(b, 3.0)]), _scalar(b, 0.044715)])
    inner = b.op("Mul", [b.op("Add", [h, cubic]), _scalar(b, 0.7978845608)])
    half = b.op("Mul", [h, _scalar(b, 0.5)])
    return b.model(b.op("Mul", [half, b.op("Add", [b.op("Tanh", [inner]), _scalar(b, 1.0)])]))


def pointwise_conv_hardswish():
    """A MobileNetV3 expansion: a 1x1 convolution with bias, then HardSwish."""
    b = GraphBuilder()
    x = b.input("x", [1, 32, 16, 16])
    conv = b.op("Conv", [x, b.const(_weights(64, 32, 1, 1)), b.const(_weights(64))])
    return b.model(b.op("HardSwish", [conv]))


def comparisons():
    """Every comparison, a scalar on either side, summed as floats."""
    b = GraphBuilder()
    x, y = b.input("x", [2, 8, 32]), b.input("y", [2, 8, 32])
    flags = [b.op("Equal", [x, y]), b.op("Less", [_scalar(b, 0.25), x]),
             b.op("Greater", [x, y]), b.op("LessOrEqual", [x, _scalar(b, -0.5)]),
             b.op("GreaterOrEqual", [y, x])]
    total = b.op("Cast", [flags[0]], to=onnx.TensorProto.FLOAT)
    for flag in flags[1:]:
        total = b.op("Add", [total, b.op("Cast", [flag], to=onnx.TensorProto.FLOAT)])
    return b.model(total)


def one_hot():
    """magika's one-hot of its input bytes, as jax2tf writes it: int32 Equal, then Cast."""
    b = GraphBuilder()
    x = b.input("bytes", [1, 64], onnx.TensorProto.INT32)
    column = b.op("Expand", [b.op("Reshape", [x, b.const([1, 64, 1])]), b.const([1, 64, 257])])
    equal = b.op("Equal", [column, b.const(np.arange(257).reshape(1, 1, 257), dtype=np.int32)])
    return b.model(b.op("Cast", [equal], to=onnx.TensorProto.FLOAT))


def attention_times_values():
    """Attention probabilities times V, the heads merged back behind the tokens."""
    b = GraphBuilder()
    probs, values = b.input("p", [1, 4, TOKENS, TOKENS]), b.input("v", [1, 4, TOKENS, 16])
    merged = b.op("Transpose", [b.op("MatMul", [probs, values])], perm=[0, 2, 1, 3])
    return b.model(b.op("Reshape", [merged, b.const([1, TOKENS, 64])]))


def scaled_scores_with_mask():
    """Q times K transposed, scaled, plus a mask broadcast over the heads."""
    b = GraphBuilder()
    q, k_t = b.input("q", [1, 4, TOKENS, 16]), b.input("kt", [1, 4, 16, TOKENS])
    mask = b.input("mask", [1, 1, TOKENS, TOKENS])
    scaled = b.op("Mul", [b.op("MatMul", [q, k_t]), _scalar(b, 0.25)])
    return b.model(b.op("Add", [scaled, mask]))


def silu_then_concat():
    """YOLOv8's C2f tail: the split halves and a SiLU'd bottleneck output, concatenated; the
    bottleneck's residual reads a half that the concat copies too."""
    b = GraphBuilder()
    x, y, z = (b.input(name, [1, 16, 8, 8]) for name in "xyz")
    silu = b.op("Mul", [x, b.op("Sigmoid", [x])])
    return b.model(b.op("Concat", [z, y, b.op("Add", [y, silu])], axis=1))


def elementwise_then_transpose():
    """nemo80's log-mel tail: an elementwise chain, then the frames moved behind the channels,
    then another op on the transposed tensor."""
    b = GraphBuilder()
    x = b.input("x", [1, 64, 96])
    moved = b.op("Transpose", [b.op("Relu", [b.op("Mul", [x, _scalar(b, 2.0)])])], perm=[0, 2, 1])
    return b.model(b.op("Add", [moved, _scalar(b, 1.0)]))


def many_filters_conv_hardswish():
    """ppocrv4's 1x1 convolutions: more filters than one cube tile holds, with bias and
    HardSwish."""
    b = GraphBuilder()
    x = b.input("x", [1, 96, 10, 10])
    conv = b.op("Conv", [x, b.const(_weights(384, 96, 1, 1)), b.const(_weights(384))])
    return b.model(b.op("HardSwish", [conv]))


def instance_norm_fp16():
    """A CNN's InstanceNormalization in half precision (accumulated in fp32 inside), after a
    residual add and before a ReLU."""
    b = GraphBuilder()
    half = onnx.TensorProto.FLOAT16
    x, residual = b.input("x", [1, 16, 16, 16], half), b.input("r", [1, 16, 16, 16], half)
    normalised = b.op("InstanceNormalization", [b.op("Add", [x, residual]),
                                                b.const(_weights(16) + 1, np.float16),
                                                b.const(_weights(16), np.float16)], epsilon=1e-5)
    return b.model(b.op("Relu", [normalised]))


def torch_group_norm():
    """torch.nn.GroupNorm(4, 16) as the dynamo exporter writes it: the groups as rows of an
    InstanceNormalization of unit scale, reshaped back, then the per-channel affine."""
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    grouped = b.op("Reshape", [b.op("Relu", [x])], shape=[1, 4, -1])
    normalised = b.op("InstanceNormalization", [grouped, b.const(np.ones(4)),
                                                b.const(np.zeros(4))], epsilon=1e-5)
    back = b.op("Reshape", [normalised], shape=[1, 16, 8, 8])
    scaled = b.op("Mul", [back, b.const(_weights(16, 1, 1) + 1)])
    return b.model(b.op("Add", [scaled, b.const(_weights(16, 1, 1))]))


PATTERNS = {build.__name__: build for build in (
    decomposed_layer_norm, layer_normalization_op, llama_rms_norm, attention_softmax,
    masked_attention_softmax, matmul_bias_gelu, matmul_bias_residual, gemm_gelu_tanh,
    pointwise_conv_hardswish, attention_times_values, scaled_scores_with_mask,
    instance_norm_fp16, torch_group_norm)}
COMPARISON_PATTERNS = {build.__name__: build for build in (comparisons, one_hot)}
# Kernels whose GM traffic is their lower bound (each input read once, each output written once)
AT_LOWER_BOUND = {build.__name__: build for build in (attention_times_values, silu_then_concat,
                                                      elementwise_then_transpose)}
# Kernels whose GM traffic is the platform's bound: the lower bound, the product's hand-off to
# the vector cores and the least re-reads of the cube's operands (docs/figures.md)
AT_PLATFORM_BOUND = {build.__name__: build for build in (many_filters_conv_hardswish,)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernel-cache")
    planned = {name: fuse(build()) for name, build in
               {**PATTERNS, **COMPARISON_PATTERNS, **AT_LOWER_BOUND,
                **AT_PLATFORM_BOUND}.items()}
    kernels = {}
    for name, (graph, plan) in planned.items():
        kernels[name] = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=cache)
    return planned, kernels


@pytest.mark.pypto
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_pattern_is_one_kernel_that_passes_its_check(built, name):
    planned, kernels = built
    graph, plan = planned[name]
    (region,) = plan.regions
    assert set(region.nodes) == {node.outputs[0] for node in graph.nodes}, plan.unfused
    assert plan.totals.kernels_after == 1
    (kernel,) = kernels[name]
    assert kernel.compiled, kernel.fallback_reason
    assert kernel.functional_ok, (kernel.max_abs_diff, kernel.verdicts)
    assert all(verdict == "PASS" for _, verdict in kernel.verdicts)
    kinds = {kind_of(op.op_type) for op in region.simplified}
    assert kinds & {REDUCTION, MATMUL}, kinds
    assert_compiled_matches(graph, plan)


@pytest.mark.pypto
@pytest.mark.parametrize("name", sorted(COMPARISON_PATTERNS))
def test_comparisons_fuse_with_their_casts_and_match_onnxruntime(built, name):
    planned, kernels = built
    graph, plan = planned[name]
    assert plan.totals.kernels_after == 1, plan.unfused
    (kernel,) = kernels[name]
    assert kernel.compiled and kernel.functional_ok, (kernel.fallback_reason, kernel.verdicts)
    assert_compiled_matches(graph, plan)


@pytest.mark.pypto
@pytest.mark.parametrize("name", sorted(AT_LOWER_BOUND))
def test_the_kernel_moves_its_lower_bound(built, name):
    """A batched matmul runs as 2-D matmuls assembled at their place in the output (no
    transpose of a computed tensor), a Concat output is assembled part by part (no staging of
    a computed part), an input read twice is read once, a transpose runs under its input's
    tile and the op after it under the swapped one (docs/pypto-ops.md)."""
    planned, kernels = built
    graph, plan = planned[name]
    (region,) = plan.regions
    (kernel,) = kernels[name]
    assert kernel.compiled and kernel.functional_ok, (kernel.fallback_reason, kernel.verdicts)
    assert "pypto.concat(" not in kernel.source
    if name != "elementwise_then_transpose":
        assert "pypto.assemble(" in kernel.source and "pypto.transpose(" not in kernel.source
    moved = kernel.gm_bytes_read + kernel.gm_bytes_written
    assert moved <= 1.05 * region.fused.gm_bytes, (moved, region.fused.gm_bytes)
    assert_compiled_matches(graph, plan)


@pytest.mark.pypto
@pytest.mark.parametrize("name", sorted(AT_PLATFORM_BOUND))
def test_the_kernel_moves_its_platform_bound(built, name):
    """384 filters take two cube tiles of 192 rows, and the epilogue's vector tiles stay within
    them: no staging beyond the hand-off (docs/pypto-ops.md, "Vector tiles within cube
    tiles")."""
    planned, kernels = built
    graph, plan = planned[name]
    (region,) = plan.regions
    (kernel,) = kernels[name]
    assert kernel.compiled and kernel.functional_ok, (kernel.fallback_reason, kernel.verdicts)
    bound = region.fused.gm_bytes + cube_handoff_bytes(region.simplified, region.tensor_types) \
        + cube_reread_bytes(region.simplified, region.tensor_types)
    moved = kernel.gm_bytes_read + kernel.gm_bytes_written
    assert moved <= 1.05 * bound, (moved, bound, kernel.source)
    assert_compiled_matches(graph, plan)


@pytest.mark.pypto
def test_a_matmul_moves_its_lower_bound_plus_the_cube_to_vector_hand_off(built):
    """The bias joins the cube (no hand-off for it); the residual add is a vector op, so the
    product crosses to a vector core through GM once (docs/figures.md, "The platform bound")."""
    planned, kernels = built
    (region,) = planned["matmul_bias_residual"][1].regions
    (kernel,) = kernels["matmul_bias_residual"]
    assert [op.op_type for op in region.simplified] == ["MatMul", "Add"]
    handoff = cube_handoff_bytes(region.simplified, region.tensor_types)
    assert handoff == 2 * TOKENS * HIDDEN * 4
    moved = kernel.gm_bytes_read + kernel.gm_bytes_written
    assert region.fused.gm_bytes < moved <= 1.05 * (region.fused.gm_bytes + handoff)


@pytest.mark.pypto
def test_a_decomposed_layer_norm_is_at_least_three_times_faster_fused(built, tmp_path):
    """Under PyPTO's cost model (AICore time, launches included), against the same nine ops
    compiled one kernel each (what --measure-baseline does)."""
    planned, kernels = built
    graph, plan = planned["decomposed_layer_norm"]
    (kernel,) = kernels["decomposed_layer_norm"]
    unfused = unfused_costs(graph, plan.regions, setup_for(TARGETS["kirin9050"], tmp_path))
    (unfused_us,) = unfused.values()
    assert unfused_us >= 3 * kernel.tuned_tile.aicore_us, (unfused_us, kernel.tuned_tile)


def _group_normalization(groups: int):
    b = GraphBuilder(opset=21)
    x = b.input("x", [1, 16, 8, 8])
    model = b.model(b.op("GroupNormalization", [b.op("Relu", [x]), b.const(_weights(16) + 1),
                                                b.const(_weights(16))], num_groups=groups))
    # onnx's shape inference leaves the output of this function op untyped; an exporter types it
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info(
        model.graph.output[0].name, onnx.TensorProto.FLOAT, [1, 16, 8, 8]))
    return model


def test_a_group_normalization_fuses_where_its_scale_is_per_row_and_says_why_not_elsewhere():
    """Opset 21's scale and bias are per channel: with one channel a group they apply per row
    and the op joins its neighbours; with groups of four channels a channel is a part of a row,
    which no row layout holds, and the reason says so."""
    graph, plan = fuse(_group_normalization(16))
    assert plan.totals.kernels_after == 1, plan.unfused
    graph, plan = fuse(_group_normalization(4))
    (reason,) = [u.reason for u in plan.unfused if u.op_type == "GroupNormalization"]
    assert "does not run as rows" in reason and "16 elements for 4 rows" in reason, reason
