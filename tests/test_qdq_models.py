"""The QDQ unit models of tests/qdq_models.py are what they claim (no PyPTO): quantised by
onnxruntime's quantize_static with per-channel int8 weights, the same bytes on every call, small,
and close to their fp32 models in onnxruntime."""
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pypto_offline.runtime import precision_metrics, run_model
from tests import qdq_models
from tests.qdq_models import BUILDERS

WEIGHTED = ("MatMul", "Conv")


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def built(request):
    return request.param, *BUILDERS[request.param]()


def test_quantised_with_per_channel_int8_weights(built):
    name, qdq, fp32 = built
    ops = [n.op_type for n in qdq.graph.node]
    if "QLinearConv" in ops:  # QOperator format: the weights are the op's 4th to 6th inputs
        _check_qoperator_weights(name, qdq, fp32)
        return
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops, name
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in fp32.graph.node}
    assert sorted(o for o in ops if o in WEIGHTED) == sorted(
        n.op_type for n in fp32.graph.node if n.op_type in WEIGHTED)
    constants = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    made_by = {out: n for n in qdq.graph.node for out in n.output}
    for node in (n for n in qdq.graph.node if n.op_type in WEIGHTED):
        data, weight = (made_by.get(i) for i in node.input[:2])
        assert data is not None and data.op_type == "DequantizeLinear", (name, node.name)
        assert weight is not None and weight.op_type == "DequantizeLinear", (name, node.name)
        values, scale = constants[weight.input[0]], constants[weight.input[1]]
        assert values.dtype == np.int8, (name, node.name)
        channels = values.shape[1] if node.op_type == "MatMul" else values.shape[0]
        assert scale.shape == (channels,), (name, node.name)  # per output channel
        assert not constants[weight.input[2]].any()  # symmetric weights


def _check_qoperator_weights(name, qdq, fp32):
    constants = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    convs = [n for n in qdq.graph.node if n.op_type == "QLinearConv"]
    assert len(convs) == sum(n.op_type == "Conv" for n in fp32.graph.node), name
    assert "Conv" not in {n.op_type for n in qdq.graph.node}, name  # every conv quantised
    for node in convs:
        values, scale, zero = (constants[i] for i in node.input[3:6])
        assert values.dtype == np.int8 and scale.shape == (values.shape[0],), (name, node.name)
        assert not zero.any()  # symmetric weights


def test_the_same_bytes_every_call_and_small(built):
    name, qdq, fp32 = built
    again, fp32_again = BUILDERS[name]()
    assert qdq.SerializeToString() == again.SerializeToString(), name
    assert fp32.SerializeToString() == fp32_again.SerializeToString(), name
    assert len(qdq.SerializeToString()) < 50_000, name
    onnx.checker.check_model(qdq, full_check=True)


def test_close_to_the_fp32_model_in_onnxruntime(built):
    name, qdq, fp32 = built
    feeds = qdq_models.inputs_of(fp32, seed=0)
    want, got = run_model(fp32, feeds), run_model(qdq, feeds)
    assert len(want) == len(got) == 1
    metrics = precision_metrics(next(iter(want.values())), next(iter(got.values())))
    assert metrics["cosine"] > 0.99, (name, metrics)
    assert metrics["max_abs"] > 0, name  # quantised for real: not the float arithmetic
