"""Issue 52: a quantised blob's verification (docs/int8.md, "Verification"). An output a
DequantizeLinear makes of int8 passes at one step of its scale at most, reported in steps; more
fails, unless the reference computes its contractions in float (the QDQ model itself), where a
propagated difference is held to force_fp16's thresholds. ``verify --onnx FP32`` on an int8 blob
reports metrics against the float model without failing. Each kernel in the summary shows its
dtypes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pypto_offline.verify import (Thresholds, compare, float_original_of, int8_steps,
                                  quantised_outputs)
from tests.json_schema import schema_validator

SCALE = 0.02


def qdq_output_model(zero_point_type=TensorProto.INT8) -> onnx.ModelProto:
    """y = DequantizeLinear(QuantizeLinear(x)): a model whose output is a dequantised int8."""
    zero_point = numpy_helper.from_array(
        np.array(0, helper.tensor_dtype_to_np_dtype(zero_point_type)), "zp")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.array(SCALE, np.float32), "s"), zero_point])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def float_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "fp32",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).uniform(-1, 1, (4, 8)).astype(np.float32)}


def shifted(steps: dict[tuple[int, int], int]):
    """A candidate's run: the reference's outputs with elements moved by whole steps."""
    def run(model, inputs):
        from pypto_offline.runtime import run_model

        outputs = run_model(model, inputs)
        y = outputs["y"].copy()
        for index, count in steps.items():
            y[index] += np.float32(count * SCALE)
        return {**outputs, "y": y}
    return run


def test_steps_of_synthetic_arrays():
    expected = (np.arange(-8, 8) * SCALE).astype(np.float32)
    assert int8_steps(expected, expected.copy(), SCALE) == {
        "scale": SCALE, "off_by_one": 0, "max_steps": 0, "elements": 16}
    actual = expected.copy()
    actual[[2, 9]] += np.float32(SCALE)  # rounded in fp32: within STEP_SLACK of one step
    actual[4] -= np.float32(SCALE)
    assert int8_steps(expected, actual, SCALE) == {
        "scale": SCALE, "off_by_one": 3, "max_steps": 1, "elements": 16}
    actual[5] += np.float32(2 * SCALE)
    found = int8_steps(expected, actual, SCALE)
    assert found["max_steps"] == 2 and found["off_by_one"] == 3
    actual[6] = np.nan
    assert int8_steps(expected, actual, SCALE)["max_steps"] > 2


def test_quantised_outputs_are_dequantised_int8_with_their_scale():
    assert quantised_outputs(qdq_output_model()) == {"y": pytest.approx(SCALE)}
    assert quantised_outputs(qdq_output_model(TensorProto.UINT8)) == {"y": pytest.approx(SCALE)}
    assert quantised_outputs(qdq_output_model(TensorProto.INT32)) == {}  # a bias's dequantise
    assert quantised_outputs(float_model()) == {}


def test_one_step_off_passes_reported_and_more_fails():
    model = qdq_output_model()
    exact = compare(model, model, feeds(), run=shifted({}))
    assert exact.status == "passed" and exact.outputs[0].int8_steps["max_steps"] == 0
    one = compare(model, model, feeds(), run=shifted({(0, 0): 1, (3, 7): -1}))
    check = one.outputs[0]
    assert one.status == "passed" and check.passed
    assert check.int8_steps == {"scale": pytest.approx(SCALE), "off_by_one": 2, "max_steps": 1,
                                "elements": 32}
    assert check.max_abs_diff > 1e-4  # fp32's per-dtype tolerance would have failed it
    two = compare(model, model, feeds(), run=shifted({(1, 1): 2}))
    assert two.status == "failed" and two.outputs[0].int8_steps["max_steps"] == 2


def test_a_propagated_difference_is_held_to_the_thresholds_against_the_qdq_model():
    """Two steps on one element of 32 (as ppocr_cls_v2 showed three on its QDQ model: an early
    layer's off-by-one travelling): the float model's thresholds pass it, a gross one fails."""
    model, fp16 = qdq_output_model(), Thresholds.of("force_fp16")
    assert compare(model, model, feeds(), run=shifted({(1, 1): 2}),
                   propagated=fp16).status == "passed"
    gross = {(row, col): 20 for row in range(4) for col in range(8)}
    assert compare(model, model, feeds(), run=shifted(gross), propagated=fp16).status == "failed"


def test_metrics_against_the_float_original_never_fail():
    model = qdq_output_model()
    result = compare(model, model, feeds(), run=shifted({}), float_original=float_model())
    assert result.status == "passed"
    (check,) = result.float_original
    assert check.passed and 0 < check.max_abs_diff <= SCALE / 2 + 1e-6  # rounding to a step
    assert 0.99 < check.cosine < 1.0 and check.int8_steps is None


def test_a_float_original_is_told_from_another_model():
    qdq, fp32 = qdq_output_model(), float_model()
    assert float_original_of(qdq, fp32)
    assert not float_original_of(fp32, fp32)  # the blob is not quantised
    assert not float_original_of(qdq, qdq)  # a quantised model is no float original
    renamed = float_model()
    renamed.graph.output[0].name = renamed.graph.node[0].output[0] = "z"
    assert not float_original_of(qdq, renamed)


@pytest.mark.pypto
def test_a_qdq_build_verifies_in_steps_reports_the_float_model_and_its_kernels_dtypes(
        tmp_path, monkeypatch, int8_cache):
    from pypto_offline import api
    from tests.qdq_models import matmul_bias_relu

    qdq, fp32 = matmul_bias_relu()
    blob = api.compile(qdq, "kirin9050", cache_dir=int8_cache, verify=True)
    summary = blob.summary()
    schema_validator("summary").validate(summary)
    assert summary["schema_version"] == 8
    (metrics,) = summary["verification"]["metrics"].values()
    assert metrics["passed"] and metrics["int8_steps"]["max_steps"] == 0  # bit-exact
    integer = [k for k in summary["kernels"] if k["dtypes"]["accumulate"] == "int32"]
    assert integer and "int8" in integer[0]["dtypes"]["in"] and integer[0]["status"] == "compiled"
    assert integer[0]["dtypes"]["out"] == ["float32"]

    path = blob.save(tmp_path / "mm.ptom")
    loaded = api.load(path)
    loaded.use_reference(fp32)  # not the model it was built from: its float original
    loaded.verify()
    checked = loaded.summary()["verification"]
    assert checked["status"] == "passed" and checked["float_original"]
    (against_fp32,) = checked["float_original"].values()
    assert 0.99 < against_fp32["cosine"] < 1.0 and against_fp32["max_abs"] > 0

    # the compiled graph's run one step off on one element, then two: reported, then failed
    name = next(iter(checked["metrics"]))
    run = api.CompiledModel._as_its_ops
    for step, status in ((1, "passed"), (2, "failed")):
        def off(self, graph, inputs, step=step):
            outputs = run(self, graph, inputs)
            y = outputs[name].copy()
            y.flat[0] += np.float32(step * metrics["int8_steps"]["scale"])
            return {**outputs, name: y}
        monkeypatch.setattr(api.CompiledModel, "_as_its_ops", off)
        again = api.load(path)
        again.verify()
        steps = again.summary()["verification"]["metrics"][name]["int8_steps"]
        assert again.summary()["verification"]["status"] == status
        assert steps["max_steps"] == step and steps["off_by_one"] == (1 if step == 1 else 0)
