"""Issue 54, an attention's core as one kernel: the scores' batched MatMul, its scale and mask,
the Softmax over the keys and the MatMul by the values, with the heads merged after it, are one
region (``fusion.attention.attention_core``) that the kernel generator runs as a loop over the
heads, each head's scores in UB between its two products (``codegen.matmul.batched_matmul_loop``;
docs/regions.md, "Attention")."""
from __future__ import annotations

import re
import numpy as np
import onnx
import pytest

from pypto_offline import api
from pypto_offline.pypto_kernels.codegen import kernel_source
from pypto_offline.pypto_kernels.codegen.matmul import batched_matmul_loop
from pypto_offline.pypto_kernels.tiling import default_policy
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.onnx_builders import GraphBuilder

CORE = ["MatMul", "Mul", "Add", "Softmax", "MatMul", "Transpose", "Reshape"]


def encoder_attention(heads=4, tokens=16, depth=16, softmax_axis=-1, mask_in_graph=False,
                      values_made=False, scores_returned=False, heads_split=False):
    """Self-attention of an encoder with a padding mask, from the projected heads on:
    ``softmax(q @ kᵀ * depth^-0.5 + mask) @ v``, the heads merged back to ``[1, S, H*D]``.
    ``mask_in_graph``: the mask made from a 0/1 attention mask in the graph (Where), not an
    input; ``values_made``: v computed from an input (a Relu) before the product;
    ``scores_returned``: the masked scores a model output too; ``heads_split``: q, k and v
    the projections' ``[1, S, H, D]``, their heads split by Transposes (ViT's)."""
    b = GraphBuilder()
    if heads_split:
        q, k, v = (b.input(name, [1, tokens, heads, depth]) for name in "qkv")
        q, v = (b.op("Transpose", [t], perm=[0, 2, 1, 3]) for t in (q, v))
        kt = b.op("Transpose", [k], perm=[0, 2, 3, 1])
    else:
        q = b.input("q", [1, heads, tokens, depth])
        kt = b.input("kt", [1, heads, depth, tokens])
        v = b.input("v", [1, heads, tokens, depth])
    if mask_in_graph:
        keep = b.input("keep", [1, 1, 1, tokens])
        mask = b.op("Where", [b.op("Greater", [keep, b.const(np.float32(0.5))]),
                              b.const(np.float32(0.0)), b.const(np.float32(-1e4))])
    else:
        mask = b.input("mask", [1, 1, 1, tokens])
    if values_made:
        v = b.op("Relu", [v])
    scores = b.op("Mul", [b.op("MatMul", [q, kt]), b.const(np.float32(depth ** -0.5))])
    masked = b.op("Add", [scores, mask])
    probabilities = b.op("Softmax", [masked], axis=softmax_axis)
    merged = b.op("Transpose", [b.op("MatMul", [probabilities, v])], perm=[0, 2, 1, 3])
    out = b.op("Reshape", [merged, b.const(np.array([1, tokens, heads * depth], np.int64))])
    return b.model(out, *([masked] if scores_returned else []))


def _regions(plan) -> list[list[str]]:
    return [[op.op_type for op in r.original] for r in plan.regions]


def _built_and_checked(model, folder) -> tuple[dict, list[dict]]:
    """The model built as a user builds it (kirin9050, verified): every kernel compiled and
    passing PyPTO's check, the outputs equal to onnxruntime's; the summary and its kernels."""
    summary = api.compile(model, "kirin9050", cache_dir=folder, verify=True).summary()
    kernels = summary["kernels"]
    assert all(k["status"] == "compiled" for k in kernels), kernels
    assert summary["build_record"]["kernels_checked"] == summary["build_record"][
        "kernels_passed"] == len(kernels)
    assert summary["verification"]["status"] == "passed"
    return summary, kernels


def test_an_attention_core_is_one_region_that_computes_what_onnxruntime_does():
    graph, plan = fuse(encoder_attention())
    assert _regions(plan) == [CORE] and not plan.unfused
    assert plan.totals.kernels_after == 1
    assert_compiled_matches(graph, plan)


def test_the_transposes_splitting_the_projections_heads_join_the_core():
    """ViT's Q, K and V arrive as ``[1, S, H, D]`` projections (65 tokens: no projection's
    epilogue transposes them) and their heads are split by three Transposes, kernels of their
    own before: now the core's, each head read as a ``[S, D]`` block of the projection (Kᵀ
    multiplied transposed), and the loop writes no transposed copy."""
    graph, plan = fuse(encoder_attention(heads_split=True))
    assert _regions(plan) == [["Transpose"] * 3 + CORE] and not plan.unfused
    assert_compiled_matches(graph, plan)
    (region,) = plan.regions
    text = kernel_source(region, default_policy(TARGETS["kirin9050"].ub_plan_bytes.value),
                         graph.constant_values())
    assert "b_trans=True" in text and "pypto.transpose" not in text
    assert text.count("[0 * 16, b1 * 16]") == 4  # q, k and v heads, and the output's


def test_what_the_loop_cannot_take_stays_apart():
    """A Softmax over another axis than the keys', or of scores read beyond it (only the
    core's last tensor may be), keeps it apart from the MatMuls, as before.
    Values made from an input join no region holding both products (the loop takes region
    inputs there): they are a kernel of its own that the core reads. Every region holding both
    products is one the loop takes."""
    for model in (encoder_attention(softmax_axis=2), encoder_attention(scores_returned=True)):
        graph, plan = fuse(model)
        assert not any("Softmax" in ops and "MatMul" in ops for ops in _regions(plan))
        assert_compiled_matches(graph, plan)
    for model in (encoder_attention(values_made=True),):
        graph, plan = fuse(model)
        cores = [r for r in plan.regions if [op.op_type for op in r.original].count("MatMul") > 1]
        assert [[op.op_type for op in r.original] for r in cores] == [CORE]
        loop = batched_matmul_loop(cores[0], graph.constant_values())
        assert loop is not None and loop.softmax and loop.values
        assert plan.totals.kernels_after == 2
        assert_compiled_matches(graph, plan)


def test_keys_beyond_what_a_tiles_row_holds_leave_the_attention_its_ops_with_the_reason():
    """4 queries over 16,384 keys: a row of scores (64 KiB) is more than kirin9050's UB holds
    whole, so no core is made and the Softmax says why; the graph computes what it did."""
    b = GraphBuilder()
    q, kt = b.input("q", [1, 1, 4, 64]), b.input("kt", [1, 1, 64, 16384])
    scores = b.op("Mul", [b.op("MatMul", [q, kt]), b.const(np.float32(0.125))])
    probabilities = b.op("Softmax", [scores], axis=-1)
    graph, plan = fuse(b.model(b.op("MatMul", [probabilities,
                                               b.input("v", [1, 1, 16384, 64])])))
    assert not plan.regions
    (softmax,) = [u for u in plan.unfused if u.op_type == "Softmax"]
    assert "rows of 65536 bytes" in softmax.reason and "UB" in softmax.reason
    assert_compiled_matches(graph, plan)


def test_the_kernel_keeps_each_heads_scores_between_its_two_products():
    """One loop over the heads: each head's scores, scaled, masked and normalised on its
    ``[S, S]`` slice, multiplied by its values' slice, and assembled at its place among the
    merged heads."""
    graph, plan = fuse(encoder_attention())
    (region,) = plan.regions
    text = kernel_source(region, default_policy(TARGETS["kirin9050"].ub_plan_bytes.value),
                         graph.constant_values())
    loop = text[text.index("for b1 in range(4):"):]
    assert loop.count("pypto.matmul(") == 2 and "pypto.exp(" in loop
    assert loop.index("pypto.amax(") < loop.rindex("pypto.matmul(") < loop.index("assemble(")
    assert "[0 * 16, b1 * 16]" in loop  # head b1's columns of the merged rows


@pytest.mark.pypto
@pytest.mark.parametrize("heads_split", [False, True])
def test_an_encoder_attention_with_a_padding_mask_compiles_to_one_kernel_that_checks(
        heads_split, tmp_path):
    """Built as a user builds it (kirin9050, verified): one kernel, checked by PyPTO's run of it,
    the model's output equal to onnxruntime's. Its scores cross GM only as PyPTO 0.2.0 hands a
    product from the cube to the vector unit and back (no L0C -> UB path): the bytes beyond
    its inputs and output are that hand-off."""
    summary, (kernel,) = _built_and_checked(encoder_attention(heads_split=heads_split),
                                            tmp_path)
    assert kernel["ops"] == ["Transpose"] * 3 * heads_split + CORE
    assert summary["kernels_after"] == 1
    assert kernel["gm_bytes"] <= kernel["gm_bytes_lower_bound"] + 2 * kernel["gm_bytes_handoff"]


FLT_MIN = float(np.finfo(np.float32).min)


def _padding_of(b: GraphBuilder, keys: int) -> str:
    """Which keys a 0/1 ``attention_mask`` input ``[1, keys]`` (int64, as transformers export
    it) keeps, as a bool ``[1, 1, 1, keys]``."""
    mask = b.input("attention_mask", [1, keys], onnx.TensorProto.INT64)
    shaped = b.op("Reshape", [mask, b.const(np.array([1, 1, 1, keys], np.int64))])
    return b.op("Cast", [shaped], to=onnx.TensorProto.BOOL)


def _additive(b: GraphBuilder, keep: str) -> str:
    """0 where ``keep``, the lowest float elsewhere: the additive mask transformers make."""
    return b.op("Where", [keep, b.const(np.float32(0.0)), b.const(np.float32(FLT_MIN))])


def encoder_layers(layers=2, heads=4, tokens=16, depth=16):
    """``layers`` self-attentions of an encoder reading one padding mask made in the graph
    from the ``attention_mask`` input (BERT's export: Cast to bool, Where), each layer's
    ``softmax(q @ kᵀ / √d + mask) @ v`` a model output."""
    b = GraphBuilder()
    mask = _additive(b, _padding_of(b, tokens))
    outs = []
    for layer in range(layers):
        q = b.input(f"q{layer}", [1, heads, tokens, depth])
        kt = b.input(f"kt{layer}", [1, heads, depth, tokens])
        v = b.input(f"v{layer}", [1, heads, tokens, depth])
        scores = b.op("Mul", [b.op("MatMul", [q, kt]), b.const(np.float32(depth ** -0.5))])
        probabilities = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
        outs.append(b.op("Transpose", [b.op("MatMul", [probabilities, v])],
                         perm=[0, 2, 1, 3]))
    return b.model(*outs)


def _arguments(text: str) -> list[str]:
    """The kernel's argument annotations, in order."""
    signature = text[text.index("def kernel("):].splitlines()[0]
    return re.findall(r"(?:in|out)\d+: pypto\.Tensor\(\([\d, ]*\), [\w.]+\)", signature)


def test_each_layer_makes_its_padding_mask_from_the_attention_mask_input():
    """The mask the graph makes once for every layer is made in each layer's core
    (``importer/masks.py`` copies it per reader): one kernel per attention, reading the
    ``attention_mask`` input (16 int64, as int32) and not the ``[S, S]`` additive mask, made by
    each head in UB (made once before the heads' loop, PyPTO staged it through GM)."""
    graph, plan = fuse(encoder_layers())
    assert _regions(plan) == [["Reshape", "Cast", "Where", *CORE[:-1]]] * 2 and not plan.unfused
    assert plan.totals.kernels_after == 2
    assert_compiled_matches(graph, plan)
    for region in plan.regions:
        text = kernel_source(region, default_policy(TARGETS["kirin9050"].ub_plan_bytes.value),
                             graph.constant_values())
        arguments = _arguments(text)
        assert arguments[0].endswith("pypto.Tensor((1, 16), pypto.DT_INT32)")
        assert len(arguments) == 5  # the mask input, q, kᵀ, v and the output
        loop = text[text.index("for b1"):]  # made by each head, between its products
        assert loop.index("pypto.matmul(") < loop.index("pypto.where(") < loop.index("amax(")


@pytest.mark.pypto
def test_each_layers_core_makes_its_mask_compiles_and_checks(tmp_path):
    """Built as a user builds it (kirin9050, verified): one kernel per layer, each making its
    mask from the attention mask input, checked by PyPTO's run of it."""
    summary, kernels = _built_and_checked(encoder_layers(), tmp_path)
    assert [k["ops"] for k in kernels] == [["Reshape", "Cast", "Where", *CORE[:-1]]] * 2
    assert summary["kernels_after"] == 2


def _layer_norm(b: GraphBuilder, x: str, width: int, rng) -> str:
    return b.op("LayerNormalization", [x, b.const((rng.standard_normal(width) * 0.1 + 1)
                                                  .astype(np.float32)),
                                       b.const((rng.standard_normal(width) * 0.1)
                                               .astype(np.float32))], axis=-1, epsilon=1e-5)


def _rms_norm(b: GraphBuilder, x: str, width: int, rng) -> str:
    """LLaMA's RMSNorm as transformers exports it: ``w * (x * 1 / sqrt(mean(x ** 2) + eps))``."""
    mean = b.op("ReduceMean", [b.op("Pow", [x, b.const(np.float32(2.0))]),
                               b.const(np.array([-1], np.int64))], keepdims=1)
    scale = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [mean,
                                                            b.const(np.float32(1e-6))])])])
    weight = (rng.standard_normal(width) * 0.1 + 1).astype(np.float32)
    return b.op("Mul", [b.const(weight), b.op("Mul", [x, scale])])


RMS_OPS = ["Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"]


def normalised_projection(tokens=16, hidden=64, out=128, residual=True, summed=False,
                          norm=_layer_norm):
    """A transformer block's LayerNorm and the projection after it: LayerNorm over the hidden
    axis of ``[1, S, K]``, ``@ W[K, N] + b`` and SiLU, its normalised rows also read by a Relu
    (``residual``: the LayerNorm's output read beyond the projection); ``summed``: the
    LayerNorm's input the sum of two inputs (BERT's embeddings); ``norm``: how the rows are
    normalised (``_rms_norm``: LLaMA's)."""
    b = GraphBuilder()
    x = b.input("x", [1, tokens, hidden])
    if summed:
        x = b.op("Add", [x, b.input("position", [1, tokens, hidden])])
    rng = np.random.default_rng(7)
    normed = norm(b, x, hidden, rng)
    weights = (rng.standard_normal((hidden, out)) / np.sqrt(hidden)).astype(np.float32)
    y = b.op("Add", [b.op("MatMul", [normed, b.const(weights)]),
                     b.const((rng.standard_normal(out) * 0.1).astype(np.float32))])
    y = b.op("Mul", [y, b.op("Sigmoid", [y])])
    outputs = [y, b.op("Relu", [normed])] if residual else [y]
    return b.model(*outputs)


def projection_then_norm(tokens=16, hidden=64, norm=_layer_norm):
    """An attention's output projection and the post-norm after it (BERT's): ``x @ W + b``,
    the residual ``x`` added, LayerNorm over the hidden axis (``norm``)."""
    b = GraphBuilder()
    x = b.input("x", [1, tokens, hidden])
    rng = np.random.default_rng(8)
    weights = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    y = b.op("Add", [b.op("MatMul", [x, b.const(weights)]),
                     b.const((rng.standard_normal(hidden) * 0.1).astype(np.float32))])
    return b.model(norm(b, b.op("Add", [y, x]), hidden, rng))


def test_a_layernorm_of_a_projections_rows_is_its_epilogue():
    """The LayerNorm of what a projection's epilogue makes (the residual's sum) joins it
    (``normalising.normalising_epilogue``): the product's whole rows are normalised in UB, and
    the sum is never written. Before, it was a kernel of its own (BERT's four, GPT-2's)."""
    graph, plan = fuse(projection_then_norm())
    assert _regions(plan) == [["MatMul", "Add", "Add", "LayerNormalization"]]
    assert plan.totals.kernels_after == 1
    assert_compiled_matches(graph, plan)


@pytest.mark.parametrize("residual,summed", [(False, False), (True, False), (False, True)])
def test_a_layernorm_is_the_prologue_of_the_projection_after_it(residual, summed):
    """The LayerNorm over the hidden axis joins the projection reading it
    (``normalising.normalising_prologue``): the kernel normalises whole rows in UB and the cube
    multiplies them; the normalised rows are an output too where another op reads them (here
    a Relu, which joins as well), and elementwise ops making its input from inputs join too.
    Before, a matmul took no reduction beside it and the LayerNorm was a kernel of its own."""
    graph, plan = fuse(normalised_projection(residual=residual, summed=summed))
    (region,) = plan.regions
    assert [op.op_type for op in region.original][summed:4 + summed] == [
        "LayerNormalization", "MatMul", "Add", "Sigmoid"]
    assert len(region.outputs) == 1 + residual and plan.totals.kernels_after == 1
    assert_compiled_matches(graph, plan)


def test_a_layernorm_over_other_axes_or_of_a_batched_matmul_stays_apart():
    """A LayerNorm over two axes, or one before a batched MatMul (an attention's, whose loop
    takes no prologue), stays a kernel of its own."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 16, 16])
    normed = b.op("LayerNormalization", [x, b.const(np.ones((16, 16), np.float32))], axis=-2)
    b_model = b.model(b.op("MatMul", [normed, b.const(np.ones((16, 8), np.float32))]))
    c = GraphBuilder()
    y = c.input("y", [1, 4, 16, 16])
    normed = c.op("LayerNormalization", [y, c.const(np.ones(16, np.float32))], axis=-1)
    c_model = c.model(c.op("MatMul", [normed, c.input("w", [1, 4, 16, 8])]))
    for model in (b_model, c_model):
        for ops in _regions(fuse(model)[1]):
            assert not ("LayerNormalization" in ops and "MatMul" in ops), ops


def test_an_rmsnorm_written_as_its_ops_is_a_projections_prologue_or_epilogue():
    """LLaMA's RMSNorm, its ops as exported (a mean of squares over the hidden axis, kept:
    ``normalising._mean_of_squared_rows``), joins the projection after it, as a LayerNorm does,
    or the projection whose residual's sum it normalises. Before, each was a kernel of its own
    (LLaMA's five)."""
    graph, plan = fuse(normalised_projection(residual=False, norm=_rms_norm))
    assert _regions(plan) == [RMS_OPS + ["MatMul", "Add", "Sigmoid", "Mul"]]
    assert_compiled_matches(graph, plan)
    graph, plan = fuse(projection_then_norm(norm=_rms_norm))
    assert _regions(plan) == [["MatMul", "Add", "Add"] + RMS_OPS]
    assert_compiled_matches(graph, plan)


def reshaped_projection(tokens=16, hidden=64, out=128):
    """GPT-2's first LayerNorm and the Gemm after it: the normalised ``[1, S, K]`` reshaped to
    the Gemm's ``[S, K]`` rows, ``@ W + b``."""
    b = GraphBuilder()
    rng = np.random.default_rng(5)
    normed = _layer_norm(b, b.input("x", [1, tokens, hidden]), hidden, rng)
    rows = b.op("Reshape", [normed, b.const(np.array([tokens, hidden], np.int64))])
    weights = (rng.standard_normal((hidden, out)) / np.sqrt(hidden)).astype(np.float32)
    return b.model(b.op("Gemm", [rows, b.const(weights),
                                 b.const((rng.standard_normal(out) * 0.1).astype(np.float32))]))


def test_a_layernorm_reshaped_to_a_gemms_rows_is_its_prologue():
    """A Reshape keeping the hidden axis between the LayerNorm and the Gemm (GPT-2's) joins
    with it (``normalising._rows_reshaped``): before, the first layer's LayerNorm was a kernel."""
    graph, plan = fuse(reshaped_projection())
    assert _regions(plan) == [["LayerNormalization", "Reshape", "Gemm"]]
    assert_compiled_matches(graph, plan)


def test_a_mean_of_the_rows_that_is_no_rmsnorm_stays_apart():
    """A mean over the hidden axis of something else than a square (centring the rows)
    before a projection is no RMSNorm: the matmul takes no reduction beside it."""
    b = GraphBuilder()
    x = b.input("x", [1, 16, 64])
    mean = b.op("ReduceMean", [b.op("Abs", [x]), b.const(np.array([-1], np.int64))],
                keepdims=1)
    centred = b.op("Sub", [x, mean])
    graph, plan = fuse(b.model(b.op("MatMul", [centred, b.const(np.ones((64, 32),
                                                                        np.float32))])))
    assert not any("ReduceMean" in ops and "MatMul" in ops for ops in _regions(plan))
    assert_compiled_matches(graph, plan)


def rms_projection():
    return normalised_projection(norm=_rms_norm)


def projection_then_rms():
    return projection_then_norm(norm=_rms_norm)


@pytest.mark.pypto
@pytest.mark.parametrize("model", [normalised_projection, projection_then_norm,
                                   rms_projection, projection_then_rms, reshaped_projection])
def test_a_layernorm_and_its_projection_compile_to_one_kernel_that_checks(model, tmp_path):
    _, kernels = _built_and_checked(model(), tmp_path)
    (projection,) = [k for k in kernels if {"MatMul", "Gemm"} & set(k["ops"])]
    assert {"LayerNormalization", "ReduceMean"} & set(projection["ops"]) and len(kernels) == 1


def decoder_attention(heads=4, new=4, past=12, depth=16, padded=False):
    """A decoder's self-attention over its KV cache (GPT-2's, LLaMA's): the new tokens' keys
    and values concatenated after the cache's, ``softmax(q @ kᵀ / √d + causal) @ v``, the
    causal mask a constant (``-1e4`` above the diagonal, shifted by the cache's length), the
    heads merged back. ``padded``: the mask as transformers export it, the causal band a bool
    constant and the attention mask input's padding, And, Where."""
    b = GraphBuilder()
    q = b.input("q", [1, heads, new, depth])
    keys = b.op("Concat", [b.input("past_k", [1, heads, past, depth]),
                           b.input("k", [1, heads, new, depth])], axis=2)
    values = b.op("Concat", [b.input("past_v", [1, heads, past, depth]),
                             b.input("v", [1, heads, new, depth])], axis=2)
    causal = np.triu(np.full((new, past + new), -1e4, np.float32), past + 1)[None, None]
    if padded:
        kept = b.const(causal == 0, np.bool_)
        causal = _additive(b, b.op("And", [kept, _padding_of(b, past + new)]))
    else:
        causal = b.const(causal)
    scores = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [keys], perm=[0, 1, 3, 2])]),
                          b.const(np.float32(depth ** -0.5))])
    probabilities = b.op("Softmax", [b.op("Add", [scores, causal])], axis=-1)
    merged = b.op("Transpose", [b.op("MatMul", [probabilities, values])], perm=[0, 2, 1, 3])
    return b.model(b.op("Reshape", [merged, b.const(np.array([1, new, heads * depth],
                                                              np.int64))]))


def decoder_layer(heads=4, new=4, past=12, depth=16):
    """GPT-2's attention as its export has it: the new tokens' ``[1, S, H*D]`` projected to
    q, k and v (MatMuls by weights), each reshaped to its heads and transposed; k and v
    concatenated after the cache's and returned (the model's ``present`` outputs); the causal
    band And the attention mask input's padding as the mask."""
    b = GraphBuilder()
    rng = np.random.default_rng(11)
    x = b.input("x", [1, new, heads * depth])

    def heads_of(name: str) -> str:
        weights = (rng.standard_normal((heads * depth, heads * depth)) /
                   np.sqrt(heads * depth)).astype(np.float32)
        split = b.op("Reshape", [b.op("MatMul", [x, b.const(weights)]),
                                 b.const(np.array([1, new, heads, depth], np.int64))])
        return b.op("Transpose", [split], perm=[0, 2, 1, 3])

    q = heads_of("q")
    keys = b.op("Concat", [b.input("past_k", [1, heads, past, depth]), heads_of("k")], axis=2)
    values = b.op("Concat", [b.input("past_v", [1, heads, past, depth]), heads_of("v")],
                  axis=2)
    causal = np.triu(np.ones((new, past + new), np.bool_), past + 1)[None, None]
    mask = _additive(b, b.op("And", [b.const(~causal, np.bool_), _padding_of(b, past + new)]))
    scores = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [keys], perm=[0, 1, 3, 2])]),
                          b.const(np.float32(depth ** -0.5))])
    probabilities = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
    merged = b.op("Transpose", [b.op("MatMul", [probabilities, values])], perm=[0, 2, 1, 3])
    out = b.op("Reshape", [merged, b.const(np.array([1, new, heads * depth], np.int64))])
    return b.model(out, keys, values)


def test_a_decoders_cache_is_concatenated_by_its_projection_and_its_attention_is_one_core():
    """In a decoder as exported, the cache's concatenation joins the projection making the
    new keys (values), whose kernel writes the ``present`` output anyway; the attention with
    its mask made from the band and the padding is one core reading them, no Concat a kernel
    of its own (GPT-2's plan: docs/regions.md, "Masks made in the kernel")."""
    graph, plan = fuse(decoder_layer())
    regions = _regions(plan)
    cores = [ops for ops in regions if "Softmax" in ops]
    assert len(cores) == 1 and cores[0].count("MatMul") == 2 and "Where" in cores[0]
    assert all("MatMul" in ops for ops in regions if "Concat" in ops)
    assert sum(ops.count("Concat") for ops in regions) == 2
    assert_compiled_matches(graph, plan)


def windowed_attention(windows=4, heads=2, tokens=16, depth=16):
    """Swin's windowed attention: ``windows`` windows of ``tokens`` tokens, scores plus a
    relative-position bias per head ``[1, H, S, S]`` and a shifted window's mask per window
    ``[W, 1, S, S]``, Softmax, by V."""
    rng = np.random.default_rng(9)
    b = GraphBuilder()
    q = b.input("q", [windows, heads, tokens, depth])
    kt = b.input("kt", [windows, heads, depth, tokens])
    v = b.input("v", [windows, heads, tokens, depth])
    bias = (rng.standard_normal((1, heads, tokens, tokens)) * 0.5).astype(np.float32)
    mask = np.where(rng.random((windows, 1, tokens, tokens)) < 0.2, -100.0, 0.0)
    scores = b.op("Add", [b.op("Mul", [b.op("MatMul", [q, kt]),
                                       b.const(np.float32(depth ** -0.5))]), b.const(bias)])
    scores = b.op("Add", [scores, b.const(mask.astype(np.float32))])
    out = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    return b.model(b.op("Transpose", [out], perm=[0, 2, 1, 3]))


def padded_decoder_attention():
    return decoder_attention(padded=True)


# each model and whether its mask is made in the kernel (a band and an input's padding) or read
# as is (swin's shifted windows' mask is no band)
ATTENTIONS = [(decoder_attention, True), (padded_decoder_attention, True),
              (windowed_attention, False)]


@pytest.mark.parametrize("model, made", ATTENTIONS)
def test_a_decoder_and_a_windowed_attention_are_one_core(model, made):
    """GPT-2's and LLaMA's shape (new tokens over a KV cache, a causal mask) and swin's (a
    relative-position bias per head and a mask per window, both broadcast over the other
    axis): each core one region, the cache's concatenation a kernel of its own before it.
    The causal mask, a band, is made in the kernel from its bounds, with the attention mask
    input's padding where the model has it: no argument of the kernel holds the ``[4, 16]``
    mask; swin's mask, no band, is read as is."""
    graph, plan = fuse(model())
    cores = [r for r in plan.regions if "Softmax" in [op.op_type for op in r.original]]
    assert len(cores) == 1 and [op.op_type for op in cores[0].original].count("MatMul") == 2
    assert batched_matmul_loop(cores[0], graph.constant_values()) is not None
    assert_compiled_matches(graph, plan)
    text = kernel_source(cores[0], default_policy(TARGETS["kirin9050"].ub_plan_bytes.value),
                         graph.constant_values())
    arguments = _arguments(text)
    if made:
        assert not [a for a in arguments if "(4, 16)" in a or "(1, 1, 4, 16)" in a]
    else:  # swin's mask of its 4 windows, as [4 * 16, 16] rows
        assert [a for a in arguments if "(64, 16)" in a]
    assert ("pypto.cumsum(" in text) == made


@pytest.mark.pypto
@pytest.mark.parametrize("model", [padded_decoder_attention, decoder_layer, windowed_attention])
def test_a_decoder_and_a_windowed_attention_compile_to_one_core_that_checks(model, tmp_path):
    """Built, checked and verified: a decoder's core makes its mask (from the attention mask
    input and the causal band), one kernel with the mask's ops; the decoder layer's cache is
    concatenated by its projections' kernels."""
    _, kernels = _built_and_checked(model(), tmp_path)
    (core,) = [k for k in kernels if "Softmax" in k["ops"]]
    assert core["ops"].count("MatMul") == 2
    assert ("Where" in core["ops"]) == (model is not windowed_attention)
    if model is decoder_layer:
        assert len(kernels) == 4 and all("MatMul" in k["ops"] for k in kernels)
