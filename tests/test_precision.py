"""Precision modes (issue 36, docs/precision.md): ATC's four --precision_mode values and
--keep_dtype, the conversion by onnxruntime's float16 converter, and the verification of a
converted model against the original one with msaccucmp's metrics."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from tests.onnx_builders import GraphBuilder
from pypto_offline import cli
from pypto_offline.errors import UsageError
from pypto_offline.importer import import_model
from pypto_offline.offline_compiler import blob
from pypto_offline.report import render_report
from pypto_offline.importer.precision import (ALLOW_FP32_TO_FP16, ALLOW_MIX, FORCE_FP16,
                                              MAX_REL_DISTANCE, MIN_COSINE, MODES, MUST_KEEP,
                                              KeepDtype, check_mode, read_keep_dtype, to_half)
from pypto_offline.runtime import generate_inputs, precision_metrics
from pypto_offline.verify import Thresholds, compare

from tests.cache_entries import warm_cache
from tests.malformed import EXAMPLE

EXAMPLE_SHAPE = ["--input-shape", "x=1,3,64,64"]


def rms_norm(channels: int = 512, scale: float | None = None) -> onnx.ModelProto:
    """T5's RMSNorm: x / sqrt(mean(x^2) + eps) * w; x^2 of an activation past 256 overflows
    fp16 unless the squares are summed in fp32. ``scale``: x multiplied by it first (the
    activations of about 300 an RMSNorm sees in T5, from generated inputs within [-1, 1])."""
    b = GraphBuilder()
    x = b.input("x", [1, 8, channels])
    if scale is not None:
        x = b.op("Mul", [x, b.const(scale)])
    squares = b.op("Pow", [x, b.const(2.0)])
    mean = b.op("ReduceMean", [squares, b.const([-1])], keepdims=1)
    root = b.op("Sqrt", [b.op("Add", [mean, b.const(1e-6)])])
    normed = b.op("Div", [x, root])
    return b.model(b.op("Mul", [normed, b.const(np.full(channels, 0.5, np.float32))]))


def masked_softmax(columns: int = 16, scale: float | None = None) -> onnx.ModelProto:
    """An attention softmax whose masked positions add -1e9 (BERT's exporters write it so);
    ``scale``: the scores multiplied by it first (logits of about 40)."""
    b = GraphBuilder()
    scores = b.input("scores", [1, 4, 16, columns])
    if scale is not None:
        scores = b.op("Mul", [scores, b.const(scale)])
    mask = np.zeros((1, 1, 1, columns), np.float32)
    mask[..., columns * 3 // 4:] = -1e9
    return b.model(b.op("Softmax", [b.op("Add", [scores, b.const(mask)])], axis=-1))


def frame_normalisation(frames: int = 500) -> onnx.ModelProto:
    """nemo80's feature normalisation: (x - mean) / std over the frames, both divided by a
    frame count that is an input. The seeded check draws that count from (-1, 1) (0.207 here),
    so the fp16 sum of squares passes 65,504 in seven of the eight rows."""
    b = GraphBuilder()
    x, count, axes = b.input("x", [1, 8, frames]), b.input("n", [1, 1, 1]), b.const([-1])
    centred = b.op("Sub", [x, b.op("Div", [b.op("ReduceSum", [x, axes], keepdims=1), count])])
    variance = b.op("Div", [b.op("ReduceSumSquare", [centred, axes], keepdims=1), count])
    return b.model(b.op("Div", [centred, b.op("Add", [b.op("Sqrt", [variance]),
                                                         b.const(1e-5)])]))


def kv_cache_concat() -> onnx.ModelProto:
    """GPT-2's new keys (a MatMul, its heads split and transposed) after the past ones, a model
    input: under a converting mode the past keys arrive fp32 and are cast to fp16 first."""
    b = GraphBuilder()
    x, past = b.input("x", [1, 16, 64]), b.input("past", [1, 4, 8, 16])
    keys = b.op("MatMul", [x, b.const(np.full((64, 64), 0.01, np.float32))])
    keys = b.op("Transpose", [b.op("Reshape", [keys, b.const([1, 16, 4, 16])])], perm=[0, 2, 1, 3])
    return b.model(b.op("Concat", [past, keys], axis=2))


def saturated_weight(weight: float = 1e5) -> onnx.ModelProto:
    """x times a weight beyond fp16's range: the conversion saturates it to 65,504, so on
    inputs of about 0.5 the fp16 model gives 32,753 where the model gives 50,001, an output
    within fp16's range scaled by 0.655 at cosine 1 (issue 50, row 7)."""
    b = GraphBuilder()
    return b.model(b.op("Mul", [b.input("x", [1, 64]), b.const(np.full(64, weight, np.float32))]))


def about_a_half() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).uniform(0.4, 0.6, (1, 64)).astype(np.float32)}


def imported(model: onnx.ModelProto):
    return import_model(model).model


def large_inputs(model: onnx.ModelProto, scale: float) -> dict[str, np.ndarray]:
    return {name: value * scale for name, value in generate_inputs(model, 0).items()}


def converted_check(model, mode: str, feeds) -> tuple:
    original = imported(model)
    half, conversion = to_half(original, mode)
    return compare(original, import_model(half).model, feeds, Thresholds.of(mode)), conversion


# -- the modes -----------------------------------------------------------------------------

def test_an_unknown_mode_is_refused_listing_the_four():
    with pytest.raises(UsageError) as refused:
        check_mode("fp16")
    assert all(mode in str(refused.value) for mode in MODES) and len(MODES) == 4


def test_the_cli_exits_2_on_an_unknown_mode_before_any_work(tmp_path, capsys):
    out = tmp_path / "x.ptom"
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", *EXAMPLE_SHAPE, "-o", str(out),
                     "--precision_mode", "half"]) == 2
    assert "allow_mix_precision" in capsys.readouterr().err and not out.exists()


def test_must_keep_origin_dtype_leaves_the_graph_as_it_came():
    model = imported(rms_norm())
    same, conversion = to_half(model, MUST_KEEP)
    assert same is model and conversion.kept == () and conversion.clamped == ()


def test_every_target_names_its_toolchain_s_default_mode_with_a_source(capsys):
    assert cli.main(["targets", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)["targets"]
    for name, figures in listing.items():
        assert figures["precision_mode"]["value"] == FORCE_FP16, name
        assert "ATC" in figures["precision_mode"]["source"], name
    assert listing["kirin9030"]["cube_fp32"]["value"] is False
    assert listing["ascend910b"]["cube_fp32"]["value"] is True


# -- numerics ------------------------------------------------------------------------------

def test_an_rms_norm_verifies_mixed_with_its_squares_and_their_mean_in_fp32():
    """Activations of about 300: their squares overflow fp16 (65,504) unless computed in fp32.
    (Under force_fp16 onnxruntime's CPU provider still runs those fp16 ops in fp32, so the
    whole-model check passes there: docs/precision.md, "What the check sees".)"""
    model = rms_norm()
    feeds = large_inputs(imported(model), 300.0)
    mixed, conversion = converted_check(model, ALLOW_MIX, feeds)
    assert mixed.status == "passed", mixed
    assert min(o.cosine for o in mixed.outputs) >= MIN_COSINE[ALLOW_MIX]
    assert {k.op_type for k in conversion.kept} >= {"Pow", "ReduceMean", "Sqrt", "Div"}


def test_a_minus_1e9_mask_saturates_to_fp16_s_range_reported_and_the_softmax_stays_right():
    model = masked_softmax()
    feeds = generate_inputs(imported(model), 0)
    check, conversion = converted_check(model, ALLOW_MIX, feeds)
    assert check.status == "passed" and check.outputs[0].cosine >= 0.9999
    (clamped,) = conversion.clamped
    assert clamped.largest == 1e9 and clamped.values == 4 and clamped.node


def test_ops_kept_in_fp32_read_each_other_s_fp32_values_not_an_fp16_round_trip():
    """The converter casts a kept op's output to fp16 and back for the next kept op; the
    conversion reads the fp32 value itself (docs/precision.md)."""
    half, conversion = to_half(imported(rms_norm()), ALLOW_MIX)
    to = {n.output[0]: a.i for n in half.graph.node if n.op_type == "Cast"
          for a in n.attribute if a.name == "to"}
    round_trips = [n for n in half.graph.node if n.op_type == "Cast" and n.input[0] in to
                   and to[n.input[0]] == onnx.TensorProto.FLOAT16
                   and to[n.output[0]] == onnx.TensorProto.FLOAT]
    assert round_trips == [] and len(conversion.kept) >= 4
    onnx.checker.check_model(half)  # in an order that runs


def test_a_model_s_own_cast_of_an_integer_is_not_taken_for_a_round_trip():
    """An int64 cast to float, read by an op kept in fp32: the converter makes the Cast give
    fp16 and casts it back for the kept op; that is no fp32 value to read instead (it is an
    integer: asr_frontend_nemo80's Div of float and int64)."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8])
    count = b.op("Cast", [b.input("n", [1], onnx.TensorProto.INT64)], to=onnx.TensorProto.FLOAT)
    mean = b.op("ReduceSum", [x, b.const([-1])], keepdims=1)
    model = imported(b.model(b.op("Div", [mean, count])))
    half, _ = to_half(model, ALLOW_MIX)
    feeds = {"x": np.ones((1, 4, 8), np.float32), "n": np.array([4], np.int64)}
    out = compare(model, import_model(half).model, feeds, Thresholds(MIN_COSINE[ALLOW_MIX]))
    assert out.status == "passed"


def test_allow_fp32_to_fp16_puts_only_the_cube_s_ops_in_fp16_where_it_takes_no_fp32():
    b = GraphBuilder()
    x = b.input("x", [1, 16, 32])
    product = b.op("MatMul", [x, b.const(np.ones((32, 8), np.float32))])
    model = imported(b.model(b.op("Relu", [product])))
    _, phone = to_half(model, ALLOW_FP32_TO_FP16, cube_fp32=False)
    _, ascend = to_half(model, ALLOW_FP32_TO_FP16, cube_fp32=True)
    assert {k.op_type for k in phone.kept} == {"Relu"}
    assert {k.op_type for k in ascend.kept} == {"MatMul", "Relu"}


def test_the_metrics_are_msaccucmp_s():
    a = np.array([1.0, 2.0, 4.0])
    assert precision_metrics(a, a) == {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0, "rms": 0.0,
                                       "rel_distance": 0.0}
    assert precision_metrics(a, -a)["cosine"] == pytest.approx(-1.0)
    overflowed = precision_metrics(a, np.array([1.0, np.inf, 4.0]))
    assert overflowed["cosine"] == 0.0 and overflowed["max_abs"] > 1e300
    off = precision_metrics(a, np.array([1.0, 2.0, 5.0]))
    assert off["max_rel"] == 0.25 and off["rms"] == pytest.approx(np.sqrt(1 / 3))
    assert off["rel_distance"] == pytest.approx(1 / np.sqrt(21))  # ||(0, 0, 1)|| / ||a||
    assert overflowed["rel_distance"] == np.inf


# -- --keep_dtype --------------------------------------------------------------------------

def test_keep_dtype_reads_atc_s_format(tmp_path):
    path = tmp_path / "keep.cfg"
    path.write_text("n3\n\nOpType::ReduceMean\n")
    keep = read_keep_dtype(path)
    assert keep.nodes == {"n3"} and keep.op_types == {"ReduceMean"}
    assert keep.lines == ["n3", "OpType::ReduceMean"]


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", None])
def test_a_keep_dtype_file_that_is_not_text_or_is_endless_is_refused(tmp_path, content):
    path = tmp_path / "keep.cfg"
    if content is None:
        path = "/dev/zero"  # read up to its bound, never whole
    else:
        path.write_bytes(content)
    with pytest.raises(UsageError) as refused:
        read_keep_dtype(path)
    assert str(path) in str(refused.value)


def test_the_cli_exits_2_on_a_keep_dtype_line_naming_nothing(tmp_path, capsys):
    keep = tmp_path / "keep.cfg"
    keep.write_text("OpType::Softmax\n")
    out = tmp_path / "x.ptom"
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", *EXAMPLE_SHAPE, "-o", str(out),
                     "--precision_mode", ALLOW_MIX, "--keep_dtype", str(keep)]) == 2
    assert "OpType::Softmax" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("line, named", [("no_such_node", "'no_such_node'"),
                                         ("OpType::Conv", "OpType::Conv")])
def test_a_keep_dtype_line_naming_nothing_in_the_model_is_refused(tmp_path, line, named):
    path = tmp_path / "keep.cfg"
    path.write_text(line + "\n")
    with pytest.raises(UsageError) as refused:
        read_keep_dtype(path).check_against(imported(rms_norm()))
    assert named in str(refused.value) and str(path) in str(refused.value)


def test_keep_dtype_keeps_the_named_node_in_fp32_under_force_fp16():
    model = imported(masked_softmax())
    add = next(n.name for n in model.graph.node if n.op_type == "Add")
    _, conversion = to_half(model, FORCE_FP16, KeepDtype(frozenset({add})))
    assert [(k.node, k.reason) for k in conversion.kept] == [(add, "--keep_dtype names it")]


# -- a build -------------------------------------------------------------------------------

@pytest.mark.pypto
def test_a_mixed_precision_build_moves_fewer_bytes_and_verifies_against_the_original(
        tmp_path, capsys, example_cache):
    """The example model (fp32) under allow_mix_precision against an explicit
    must_keep_origin_dtype build, which is byte for byte the build without the option."""
    warm_cache(example_cache, tmp_path)  # the fp32 kernel: only the fp16 ones compile here
    summaries = {}
    for mode in (MUST_KEEP, ALLOW_MIX, None):
        out = tmp_path / f"{mode}.ptom"
        option = ["--precision_mode", mode] if mode else []
        assert cli.main([str(EXAMPLE), "--target", "kirin9050", *EXAMPLE_SHAPE, "-o", str(out),
                         "--json", "--no-report", "--cache-dir", str(tmp_path / "cache"),
                         *option]) == 0
        summaries[mode] = json.loads(capsys.readouterr().out)
    keep = tmp_path / "keep.cfg"
    keep.write_text("add\n")  # ATC's --keep_dtype: the Add stays fp32, inside the fp16 kernel
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", *EXAMPLE_SHAPE, "-o",
                     str(tmp_path / "kept.ptom"), "--json", "--no-report", "--cache-dir",
                     str(tmp_path / "cache"), "--precision_mode", FORCE_FP16,
                     "--keep_dtype", str(keep)]) == 0
    forced = json.loads(capsys.readouterr().out)
    assert [(k["node"], k["reason"]) for k in forced["precision"]["kept_fp32"]] == [
        ("add", "--keep_dtype names it")]
    # the Add's operands cast to fp32 in the kernel: more fp32 than the mixed build's (whose
    # only fp32 is the model's output)
    assert blob_source(tmp_path / "kept.ptom").count("DT_FP32") > \
        blob_source(tmp_path / f"{ALLOW_MIX}.ptom").count("DT_FP32")
    kept, mixed = summaries[MUST_KEEP], summaries[ALLOW_MIX]
    assert (tmp_path / f"{MUST_KEEP}.ptom").read_bytes() == (tmp_path / "None.ptom").read_bytes()
    assert kept["precision_mode"] == MUST_KEEP and kept["precision"] is None
    assert mixed["precision_mode"] == ALLOW_MIX and mixed["fused_kernels"] >= 1
    # fp16 halves what a kernel must move but the model's output, which stays fp32 (ATC keeps
    # the model's types): 524,288 B of the fp32 kernels' 1,038,528 B bound; the 3x3
    # convolution stays out of kernels in both (fusion/cost.why_staging_does_not_pay) and the
    # input's cast to fp16 is a kernel of its own
    assert mixed["gm_bytes_lower_bound"] < 0.85 * kept["gm_bytes_lower_bound"]
    assert mixed["gm_bytes_after"] < 0.65 * kept["gm_bytes_after"]
    # PyPTO's cost is compared with no unfused baseline for a region holding a convolution
    # (docs/baseline.md), so the build's own estimate (launches and bytes) says it
    assert mixed["est_time_us_after"] < kept["est_time_us_after"]
    check = mixed["verification"]
    assert check["status"] == "passed" and check["reference"] == "original model"
    assert check["thresholds"] == {"min_cosine": MIN_COSINE[ALLOW_MIX],
                                   "max_rel_distance": MAX_REL_DISTANCE[ALLOW_MIX]}
    assert all(m["cosine"] >= MIN_COSINE[ALLOW_MIX] for m in check["metrics"].values())
    assert all(m["rel_distance"] <= MAX_REL_DISTANCE[ALLOW_MIX] for m in check["metrics"].values())


@pytest.mark.pypto
def test_an_rms_norm_kernel_passes_mixed_and_fails_named_under_force_fp16(tmp_path, capsys):
    """onnxruntime runs the fp16 graph's Pow and ReduceMean in fp32 and sees no overflow; the
    kernel, run on the original model's values, does (docs/precision.md)."""
    model = tmp_path / "rms.onnx"
    onnx.save(rms_norm(scale=300.0), model)
    results = {}
    for mode in (ALLOW_MIX, FORCE_FP16):
        code = cli.main([str(model), "--target", "kirin9050", "-o", str(tmp_path / f"{mode}.ptom"),
                         "--json", "--no-report", "--cache-dir", str(tmp_path / "cache"),
                         "--precision_mode", mode])
        results[mode] = code, json.loads(capsys.readouterr().out)
    code, mixed = results[ALLOW_MIX]
    (kernel,) = mixed["kernels"]
    assert code == 0 and kernel["status"] == "compiled"
    assert kernel["precision"]["cosine"] >= MIN_COSINE[ALLOW_MIX]
    assert "DT_FP32" in blob_source(tmp_path / f"{ALLOW_MIX}.ptom")
    page = render_report(blob.read(tmp_path / f"{ALLOW_MIX}.ptom"))
    kept = {k["node"] for k in mixed["precision"]["kept_fp32"]}
    assert page.count('<tr class="kept-fp32">') == len(kept) >= 4
    assert "Precision: allow_mix_precision" in page
    code, forced = results[FORCE_FP16]
    check = forced["verification"]
    assert code == 1 and check["status"] == "failed" and check["onnxruntime"] == "passed"
    assert check["kernels_beyond_thresholds"] == [check["worst_kernel"]] == ["region_0"]
    assert forced["kernels"][0]["precision"]["cosine"] < MIN_COSINE[FORCE_FP16]
    # the squares: reported beyond fp16's range, with the op that makes them
    beyond = forced["precision"]["beyond_fp16"]
    assert beyond and all(b["largest"] > 65504 for b in beyond)
    assert "Pow" in {op_types(tmp_path / f"{FORCE_FP16}.ptom")[b["node"]] for b in beyond}
    assert mixed["precision"]["beyond_fp16"] == []  # the squares are fp32 there
    page = render_report(blob.read(tmp_path / f"{FORCE_FP16}.ptom"))
    assert page.count('<tr class="beyond-fp16">') == len(beyond)


@pytest.mark.pypto
def test_a_masked_softmax_kernel_compiles_and_verifies_in_fp16(tmp_path, capsys):
    """Its softmax in fp32 inside the kernel (mixed) or in fp16 (forced): both within the
    thresholds, as the mask saturates to -65504 and the kernel subtracts the row's largest
    logit; PyPTO's own check of an fp16 kernel held to fp16's tolerance, not its 1e-3, which
    failed it (docs/precision.md)."""
    for summary, kernel in _one_kernel_in_fp16_modes(masked_softmax(64, scale=40.0), tmp_path,
                                                     capsys):
        assert kernel["precision"]["cosine"] >= MIN_COSINE[ALLOW_MIX]
        (clamped,) = summary["precision"]["clamped"]
        assert clamped["largest"] == 1e9 and summary["verification"]["status"] == "passed"


def _one_kernel_in_fp16_modes(model: onnx.ModelProto, tmp_path, capsys):
    """The model built under allow_mix_precision and force_fp16 (exit 0): each build's summary
    and its one kernel, compiled."""
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    builds = []
    for mode in (ALLOW_MIX, FORCE_FP16):
        assert cli.main([str(path), "--target", "kirin9050", "-o", str(tmp_path / f"{mode}.ptom"),
                         "--json", "--no-report", "--cache-dir", str(tmp_path / "cache"),
                         "--precision_mode", mode]) == 0
        summary = json.loads(capsys.readouterr().out)
        (kernel,) = summary["kernels"]
        assert kernel["status"] == "compiled", kernel["fallback_reason"]
        builds.append((summary, kernel))
    return builds


@pytest.mark.pypto
def test_a_mask_broadcast_over_heads_and_cast_to_fp16_fuses_with_its_softmax(tmp_path, capsys):
    """Issue 37's masked softmax ([1, 1, 64, 128] over [1, 8, 64, 128]) with fp32 inputs under
    both fp16 modes: the mask's Cast joins the region, computed on the mask expanded to the
    rows (``fusion/rows._on_expanded``), so the whole softmax is one kernel (it was two: the
    Softmax stayed out); it compiles and the build verifies."""
    b = GraphBuilder()
    scores, mask = b.input("scores", [1, 8, 64, 128]), b.input("mask", [1, 1, 64, 128])
    added = b.op("Add", [b.op("Mul", [scores, b.const(np.float32(0.125))]), mask])
    model = b.model(b.op("Softmax", [added], axis=-1))
    for summary, kernel in _one_kernel_in_fp16_modes(model, tmp_path, capsys):
        assert {"Cast", "Add", "Softmax"} <= set(kernel["ops"]), kernel["ops"]
        assert summary["verification"]["status"] == "passed"


@pytest.mark.pypto
def test_an_fp16_attention_mask_added_then_cast_to_fp32_passes_its_check(tmp_path, capsys):
    """BERT's, GPT-2's and Llama's mask under allow_mix_precision (bench/results/precision):
    And, Where(0, -65504), Add, Cast to fp32 failed its functional check by 1.0 and fell back
    in fp16 only. PyPTO adds in fp32 before the cast while the reference rounds to fp16 first,
    whose spacing at 65504 is 32: the check's bound scales with the reference's magnitude
    (runtime.within_tolerance)."""
    b = GraphBuilder()
    keep = b.op("And", [b.input("a", [1, 1, 16, 1], onnx.TensorProto.BOOL),
                        b.input("b", [1, 1, 1, 16], onnx.TensorProto.BOOL)])
    mask = b.op("Where", [keep, b.const(0.0, np.float16), b.const(-65504.0, np.float16)])
    scores = b.op("Add", [b.input("x", [1, 4, 16, 16], onnx.TensorProto.FLOAT16), mask])
    model = tmp_path / "mask.onnx"
    onnx.save(b.model(b.op("Cast", [scores], to=onnx.TensorProto.FLOAT)), model)
    assert cli.main([str(model), "--target", "kirin9050", "-o", str(tmp_path / "mask.ptom"),
                     "--json", "--no-report", "--cache-dir", str(tmp_path / "cache")]) == 0
    (kernel,) = json.loads(capsys.readouterr().out)["kernels"]
    assert kernel["status"] == "compiled", kernel["fallback_reason"]
    assert kernel["ops"] == ["And", "Where", "Add", "Cast"]


@pytest.mark.pypto
def test_causal_scores_past_fp16_s_range_pass_their_check_under_force_fp16(tmp_path, capsys):
    """GPT-2's and Llama's scores: q @ k^T scaled (to logits of tens, as theirs are), plus a
    causal mask of float32's minimum, then the softmax; a Relu reads the masked scores too, so
    they are a kernel's output (an attention's core takes the softmax only when its last
    tensor alone is read beyond it: ``attention.attention_core``; before, a MatMul's epilogue
    took no softmax at all). The original model holds -3.4e38 there,
    the fp16 kernel -inf (-65,504 plus a logit below -16 rounds past fp16's largest): both
    builds failed on that kernel (cosine 0; bench/results/precision run4) while every output
    matched. Checked as fp16 can tell them, the build passes; the mask is reported as
    saturated (docs/precision.md)."""
    b = GraphBuilder()
    q, keys = b.input("q", [1, 4, 16, 16]), b.input("kt", [1, 4, 16, 16])
    scores = b.op("Mul", [b.op("MatMul", [q, keys]), b.const(np.float32(10.0))])
    causal = np.triu(np.full((16, 16), np.finfo(np.float32).min, np.float32), 1)
    masked = b.op("Add", [scores, b.const(causal[None, None])])
    path = tmp_path / "scores.onnx"
    onnx.save(b.model(b.op("Softmax", [masked], axis=-1), b.op("Relu", [masked])), path)
    assert cli.main([str(path), "--target", "kirin9050", "-o", str(tmp_path / "s.ptom"),
                     "--json", "--no-report", "--cache-dir", str(tmp_path / "cache"),
                     "--precision_mode", FORCE_FP16]) == 0
    summary = json.loads(capsys.readouterr().out)
    (kernel,) = [k for k in summary["kernels"] if "MatMul" in k["ops"]]
    assert kernel["status"] == "compiled" and "Softmax" not in kernel["ops"], kernel
    assert kernel["precision"]["cosine"] >= MIN_COSINE[FORCE_FP16]
    assert summary["verification"]["status"] == "passed"
    assert summary["precision"]["clamped"][0]["largest"] == pytest.approx(3.4028235e38)


@pytest.mark.pypto
def test_attention_scores_cast_to_fp32_compile_as_a_loop_and_check(tmp_path):
    """Llama's and GPT-2's mixed-precision attention scores (an fp16 batched MatMul, scale,
    mask, Cast to fp32) compile as the loop of 2-D matmuls the fp32 build has, and pass the
    kernel's check."""
    from pypto_offline.pypto_kernels import compile_kernels
    from pypto_offline.targets import TARGETS
    from tests.fusion_helpers import fuse
    from tests.test_codegen_and_tiling import attention_scores_cast_to_fp32

    graph, plan = fuse(attention_scores_cast_to_fp32())
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert "for b1 in range(4):" in kernel.source and "pypto.cast(" in kernel.source


def test_an_fp16_region_s_reference_overflows_where_fp16_arithmetic_does():
    """onnxruntime keeps the fp16 sum of squares it runs in fp32 unrounded; each op in its
    declared type (onnx's reference evaluator) makes it infinity and the rows 0, as the kernel
    does (region_data._per_op_where_apart)."""
    from pypto_offline.fusion import plan_fusion
    from pypto_offline.pypto_kernels.region_data import region_data, region_model
    from pypto_offline.runtime import run_model
    from pypto_offline.targets import TARGETS

    converted, _ = to_half(imported(frame_normalisation()), FORCE_FP16)
    graph = import_model(converted)
    (region,) = plan_fusion(graph, TARGETS["kirin9050"]).regions
    arrays, (reference,) = region_data(region, graph, graph.constant_values())
    overflowed = (reference == 0).all(axis=-1).ravel()
    assert overflowed.any() and not overflowed.all()
    feeds = dict(zip(["x", "n"], [a.astype(np.float32) for a in arrays]))
    (onnxruntime_s,) = run_model(region_model(region, graph), feeds).values()
    assert not (onnxruntime_s == 0).all(axis=-1).any()


@pytest.mark.pypto
def test_a_kernel_that_overflows_as_fp16_must_ships_under_force_fp16_named(tmp_path, capsys):
    """nemo80's normalisation fell back under force_fp16 only: its seeded check failed against
    onnxruntime's unrounded sum of squares. Now compiled; the error is what it is, and the
    verification names the kernel (docs/precision.md)."""
    model = tmp_path / "norm.onnx"
    onnx.save(frame_normalisation(), model)
    assert cli.main([str(model), "--target", "kirin9050", "-o", str(tmp_path / "norm.ptom"),
                     "--json", "--no-report", "--cache-dir", str(tmp_path / "cache"),
                     "--precision_mode", FORCE_FP16]) == 1
    summary = json.loads(capsys.readouterr().out)
    (kernel,) = summary["kernels"]
    assert kernel["status"] == "compiled", kernel["fallback_reason"]
    assert summary["verification"]["worst_kernel"] == "region_0"


@pytest.mark.pypto
def test_a_weight_saturated_by_force_fp16_fails_the_build_naming_its_kernel_and_clamp(
        tmp_path, capsys):
    """Issue 50, row 7: a weight of 1e5 saturated to 65,504 scales the output by 0.655 at
    cosine 1, and the build passed. The relative distance fails it (exit 1), in the model's
    output and in its kernel on the original values, and the verdict names the kernel and the
    weight it reads (docs/precision.md)."""
    from pypto_offline.cli.text import verification_text

    model, inputs = tmp_path / "scaled.onnx", tmp_path / "x.npz"
    onnx.save(saturated_weight(), model)
    np.savez(inputs, **about_a_half())
    assert cli.main([str(model), "--target", "kirin9050", "-o", str(tmp_path / "scaled.ptom"),
                     "--json", "--no-report", "--cache-dir", str(tmp_path / "cache"),
                     "--precision_mode", FORCE_FP16, "--inputs", str(inputs)]) == 1
    summary = json.loads(capsys.readouterr().out)
    check = summary["verification"]
    assert check["status"] == "failed" and check["onnxruntime"] == "failed"
    assert check["thresholds"] == {"min_cosine": MIN_COSINE[FORCE_FP16],
                                   "max_rel_distance": MAX_REL_DISTANCE[FORCE_FP16]}
    output = check["metrics"][check["worst_output"]]
    assert output["cosine"] > 0.999999 and output["rel_distance"] == pytest.approx(0.345, 1e-2)
    (kernel,) = summary["kernels"]
    assert kernel["precision"]["rel_distance"] == pytest.approx(0.345, 1e-2)
    assert check["kernels_beyond_thresholds"] == [check["worst_kernel"]] == [kernel["id"]]
    (weight,) = summary["precision"]["clamped"]
    assert check["saturated_weights"] == [{**weight, "kernel": kernel["id"]}]
    assert weight["largest"] == 1e5
    text = "\n".join(verification_text(summary))
    assert f"kernels beyond: {kernel['id']}" in text
    assert (f"weight saturated to fp16's range: {weight['tensor']} (largest 100000, clamped to "
            f"±65504; read by {weight['node']} in {kernel['id']})") in text


@pytest.mark.parametrize("mode", [MUST_KEEP, ALLOW_MIX, FORCE_FP16])
def test_the_cast_of_an_epilogue_s_operand_joins_the_matmul_s_region(mode):
    """GPT-2's and Llama's past keys and values: in fp32 the Concat is the matmul's epilogue;
    converted, the cast of the past (a model input) was a region of its own with the Concat,
    four more kernels in each model (docs/precision.md)."""
    from pypto_offline.fusion import plan_fusion
    from pypto_offline.targets import TARGETS

    model = imported(kv_cache_concat())
    graph = import_model(to_half(model, mode)[0] if mode != MUST_KEEP else model)
    (region,) = plan_fusion(graph, TARGETS["kirin9050"]).regions
    ops = [op.op_type for op in region.simplified]
    assert ops[0] == "MatMul" and "Concat" in ops
    assert ("Cast" in ops) == (mode != MUST_KEEP)


@pytest.mark.pypto
def test_a_kv_cache_concat_with_its_cast_compiles_as_one_kernel_mixed(tmp_path, capsys):
    model = tmp_path / "kv.onnx"
    onnx.save(kv_cache_concat(), model)
    assert cli.main([str(model), "--target", "kirin9050", "-o", str(tmp_path / "kv.ptom"),
                     "--json", "--no-report", "--cache-dir", str(tmp_path / "cache"),
                     "--precision_mode", ALLOW_MIX]) == 0
    summary = json.loads(capsys.readouterr().out)
    (kernel,) = summary["kernels"]
    assert kernel["status"] == "compiled", kernel["fallback_reason"]
    assert kernel["ops"] == ["MatMul", "Reshape", "Transpose", "Cast", "Concat", "Cast"]


def test_a_kernel_whose_differences_are_all_fp16_subnormals_holds():
    """tf_convnext's layer scale (1e-6 times a block's output): cosine 0.947 on the original
    model's values, differences of about 1e-7; an overflow's or a wrong kernel's are not."""
    thresholds = Thresholds(MIN_COSINE[ALLOW_MIX])
    subnormal = {"cosine": 0.947, "max_abs": 1e-7}
    assert thresholds.kernel_holds(subnormal) and not thresholds.holds(subnormal)
    assert not thresholds.kernel_holds({"cosine": 0.947, "max_abs": 1e-3})
    assert not thresholds.kernel_holds({"cosine": 0.0, "max_abs": float("inf")})


def test_the_relative_distance_sees_the_scale_the_cosine_does_not():
    """msaccucmp's relative Euclidean distance, ||actual - expected|| / ||expected||: a weight
    saturated to 65,504 scales the output by 0.655 at cosine 1; near-zero elements, which make
    the largest relative difference huge, do not trip it (docs/precision.md)."""
    from pypto_offline.runtime import kernel_check

    forced = Thresholds.of(FORCE_FP16)
    want = np.linspace(0.4, 0.6, 64) * 1e5
    scaled = precision_metrics(want, want * (65504 / 1e5))
    assert scaled["cosine"] > 0.999999 and scaled["rel_distance"] == pytest.approx(0.34496)
    assert not forced.holds(scaled) and not forced.kernel_holds(scaled)
    assert Thresholds(MIN_COSINE[FORCE_FP16]).holds(scaled)  # what the cosine alone said
    near_zero = np.array([1.0, -2.0, 1e-9, 0.0])
    rounded = precision_metrics(near_zero, near_zero.astype(np.float16) + [0, 0, 1e-7, 1e-7])
    assert rounded["max_rel"] > 50 and rounded["rel_distance"] < 1e-6 and forced.holds(rounded)
    masked = np.array([-np.inf, 0.5, -0.25])
    assert precision_metrics(masked, masked.copy())["rel_distance"] == 0.0  # a mask's -inf
    assert precision_metrics(np.zeros(3), np.full(3, 1e-3))["rel_distance"] == np.inf
    # a kernel of two outputs: the least similar one's cosine, the largest distance of any
    check = kernel_check([want, near_zero], [want * 0.65504, -near_zero])
    assert check["metrics"]["cosine"] == pytest.approx(-1.0)
    assert check["metrics"]["rel_distance"] == pytest.approx(2.0)
    check = kernel_check([want, near_zero], [want * 0.65504, near_zero * 1.001])
    assert check["metrics"]["rel_distance"] == pytest.approx(0.34496)
    # a kernel of a blob checked before the distance was recorded: its cosine decides
    assert forced.kernel_holds({"cosine": 1.0, "max_abs": 1.0})


def test_a_weight_saturated_to_fp16_s_range_fails_the_model_s_check():
    """The whole-model check (onnxruntime) of issue 50's reproducer: 32,753 where the model
    gives 50,001, cosine 1.0 and a pass before; the conversion reports the weight it clamped."""
    check, conversion = converted_check(saturated_weight(), FORCE_FP16, about_a_half())
    (output,) = check.outputs
    assert check.status == "failed" and not output.passed
    assert output.cosine > 0.999999 and output.rel_distance == pytest.approx(0.345, abs=1e-3)
    (clamped,) = conversion.clamped
    assert clamped.largest == 1e5 and clamped.values == 64


def test_the_kernel_check_s_bound_grows_with_the_reference_s_magnitude():
    from pypto_offline.runtime import TOLERANCE, kernel_check, within_tolerance

    want = np.array([-65504.0, 0.5], np.float32)
    check = kernel_check([want], [want + np.float32(1.0)])
    assert check["max_abs_diff"] == 1.0 and check["magnitude"] == 65504.0
    assert within_tolerance(1.0, TOLERANCE["float16"], check["magnitude"])
    assert not within_tolerance(1.0, TOLERANCE["float16"], 0.5)  # values near 1: as before
    masked = kernel_check([np.array([-np.inf, 2.0], np.float32)], [np.array([-np.inf, 2.0])])
    assert masked["magnitude"] == 2.0  # an attention mask's -inf makes no bound infinite


def test_an_fp16_output_is_checked_against_the_original_as_fp16_can_tell_them():
    """GPT-2's causal mask adds float32's minimum to the scores: the model holds -3.4e38
    where an fp16 kernel can hold at best -65,504 and holds -inf, the same to the softmax
    that reads it. Against the original model (``saturating``) both are clipped to fp16's
    range; an fp16 value that is wrong within it, and an fp32 output, are not excused."""
    from pypto_offline.runtime import kernel_check

    minimum = np.finfo(np.float32).min
    want = np.array([minimum, 0.5, -0.25], np.float32)
    masked = np.array([-np.inf, 0.5, -0.25], np.float16)
    assert kernel_check([want], [masked], saturating=[True])["metrics"]["cosine"] == 1.0
    assert kernel_check([want], [masked])["metrics"]["cosine"] == 0.0  # the model's outputs
    assert kernel_check([want], [masked.astype(np.float32)],
                        saturating=[True])["metrics"]["cosine"] == 0.0
    wrong = np.array([-np.inf, -0.5, -0.25], np.float16)
    assert kernel_check([want], [wrong], saturating=[True])["metrics"]["max_abs"] == 1.0
    overflowed = np.array([np.inf, 0.5, -0.25], np.float16)  # the wrong sign is not saturation
    assert kernel_check([want], [overflowed], saturating=[True])["metrics"]["cosine"] < 0.5


def test_a_converted_graph_s_tensors_name_the_original_ones():
    from pypto_offline.importer.precision import original_name

    names = (["x", "mask"], ["y"])
    assert original_name("graph_input_cast_1", *names) == "mask"
    assert original_name("graph_output_cast_0", *names) == "y"
    assert original_name("t4_0_cast_to_fp16", *names) == "t4_0"
    assert original_name("t4_0", *names) == "t4_0"


def op_types(path) -> dict[str, str]:
    """Node name -> op type in a blob's imported graph."""
    graph = onnx.load_from_string(blob.read(path).source_onnx_model).graph
    return {n.name: n.op_type for n in graph.node}


def blob_source(path) -> str:
    return "\n".join(k.source for k in blob.read(path).kernels)


def test_input_fp16_nodes_and_output_type_fp16_give_the_boundary_in_fp16():
    from pypto_offline.importer.precision import half_io

    model = imported(rms_norm())
    half, _ = to_half(model, FORCE_FP16, io=half_io("x", "FP16"))
    types = {v.name: v.type.tensor_type.elem_type for v in [*half.graph.input, *half.graph.output]}
    assert set(types.values()) == {onnx.TensorProto.FLOAT16}
    kept, _ = to_half(model, FORCE_FP16)
    assert {v.type.tensor_type.elem_type for v in kept.graph.input} == {onnx.TensorProto.FLOAT}


@pytest.mark.parametrize("inputs, output_type, mode, named", [
    ("x;nope", None, FORCE_FP16, "'nope'"), (None, "INT8", FORCE_FP16, "'INT8'"),
    ("x", None, MUST_KEEP, "converts nothing")])
def test_fp16_boundary_options_that_cannot_apply_are_refused(inputs, output_type, mode, named):
    from pypto_offline.importer.precision import half_io

    with pytest.raises(UsageError) as refused:
        half_io(inputs, output_type).check_against(imported(rms_norm()), mode)
    assert named in str(refused.value)


def test_the_bench_s_model_time_counts_every_kernel_once_whatever_pypto_compared():
    """bench.precision's ``model_us``: a launch for every kernel, compiled kernels at their
    PyPTO time, every other kernel at the build's estimate, so that two modes whose compiled
    sets differ still compare (a compiled kernel without its launch made a build with more of
    them look faster)."""
    from bench.precision import model_us
    from pypto_offline.fusion.cost import time_us
    from pypto_offline.targets import TARGETS

    target = TARGETS["kirin9050"]
    kernels = [{"status": "compiled", "tuned_us": 7.0, "gm_bytes": 4096},
               {"status": "fell_back", "tuned_us": None, "gm_bytes": 8192}]
    unfused = time_us(3, 10_000, target)  # three ops left to kernels of their own
    summary = {"kernels": kernels,
               "est_time_us_after": time_us(1, 4096, target) + time_us(1, 8192, target) + unfused}
    assert model_us(summary, "kirin9050") == pytest.approx(
        7.0 + target.launch_overhead_us.value + time_us(1, 8192, target) + unfused, abs=1e-3)


def test_a_part_of_a_region_that_fell_back_in_fp32_does_not_count_as_falling_back_in_fp16():
    """bench.precision's "fall back only here": whisper80's normalisation falls back in fp32
    and, cut in parts with the conversion's Casts, in fp16: none of those is new; a region
    whose ops never fell back in fp32 is."""
    from bench.precision import fell_back_only_here

    fp32 = ["Max+Add", "Sub+Max+Add+Div+Transpose"]
    fp16 = ["Max+Cast", "Max+Cast+Add", "Sub+Cast+Max+Cast+Add+Div+Transpose+Cast",
            "LayerNormalization+Cast", "Max+Max+Add"]
    assert fell_back_only_here(fp16, fp32) == ["LayerNormalization+Cast", "Max+Max+Add"]


def test_only_an_output_kernels_alone_read_is_compared_saturated():
    """An fp16 overflow is excused as saturation only where the kernels reading the tensor see
    it (they run on the model's values rounded to fp16): an output an unfused op or the model's
    output reads is compared as it is, since onnxruntime's run of the model computes those fp16
    ops in fp32 and does not overflow (a sum of 4096 values past 65,504 passed force_fp16)."""
    from pypto_offline.importer.graph import Node
    from pypto_offline.pypto_kernels.precision_check import read_by_kernels_alone

    def node(op: str, inputs: tuple, output: str) -> Node:
        return Node(output, op, "", inputs, (output,))

    graph = SimpleNamespace(
        nodes=(node("ReduceSum", ("x",), "s"), node("Softmax", ("s",), "p"),
               node("Mul", ("s",), "m"), node("Cast", ("m",), "y"), node("Relu", ("p",), "z")),
        outputs=("y", "z"))
    kernels = [SimpleNamespace(nodes=("s", "p", "m")), SimpleNamespace(nodes=("z",))]
    # s: read by kernels alone; m: by an unfused Cast; z: the model's output; p: a kernel's
    assert read_by_kernels_alone(graph, kernels) == {"x", "s", "p"}


@pytest.mark.pypto
def test_a_kernel_overflowing_into_an_unfused_op_fails_force_fp16(tmp_path, capsys):
    """ReduceSum(|x| * 40) over 4096 values is about 82,000 on the verification's inputs: an
    infinity in the fp16 kernel, read by the model's output cast (unfused). onnxruntime's run of
    the converted model sums in fp32 and passes; the kernel's check, compared unsaturated since
    no kernel reads its output, fails (it passed, saturated, before)."""
    b = GraphBuilder()
    scaled = b.op("Mul", [b.op("Abs", [b.input("x", [1, 4096])]), b.const(np.float32(40.0))])
    path = tmp_path / "sum.onnx"
    onnx.save(b.model(b.op("ReduceSum", [scaled, b.const(np.array([1], np.int64))])), path)
    assert cli.main([str(path), "--target", "kirin9050", "--precision_mode", "force_fp16",
                     "--no-report", "--json", "--cache-dir", str(tmp_path / "cache"),
                     "-o", str(tmp_path / "sum.ptom")]) == 1
    check = json.loads(capsys.readouterr().out)["verification"]
    assert check["onnxruntime"] == "passed" and check["kernels_beyond_thresholds"] == ["region_0"]
