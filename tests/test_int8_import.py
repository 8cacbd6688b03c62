"""Issue 52, import and planning of QDQ models (no PyPTO): the quantised contractions become
int8 ones whose graph computes what onnxruntime computes on the QDQ model, bit for bit; what
the cube cannot take stays float with its reason; the plan puts each int8 contraction, its
quantising prologue and its epilogue in one region (docs/int8.md)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.backend_cases import qoperator_cases
from pypto_offline import import_model
from pypto_offline.fusion import plan_fusion
from pypto_offline.importer.int8_movers import MOVERS
from pypto_offline.pypto_kernels.codegen import kernel_source
from pypto_offline.pypto_kernels.tiling import default_policy
from pypto_offline.runtime import run_model
from pypto_offline.targets import resolve_target
from tests.qdq_models import BUILDERS, dequantised_twice, inputs_of

TARGET = resolve_target("kirin9050")
# builder -> the integer contractions its import makes
INTEGER = {"matmul_bias_relu": {"MatMulInteger": 1}, "conv1x1_relu": {"ConvInteger": 1},
           "conv3x3_relu": {"ConvInteger": 1}, "residual_convs": {"ConvInteger": 2},
           "conv3x3_qoperator": {"ConvInteger": 2}, "residual_uint8": {"ConvInteger": 2},
           "depthwise3x3_relu6": {}, "heads_split_and_merged": {"MatMulInteger": 2},
           "concat_of_branches": {"ConvInteger": 3}, "squeeze_excite": {"ConvInteger": 3}}


@pytest.fixture(scope="module")
def built() -> dict:
    return {name: builder() for name, builder in BUILDERS.items()}


def _integer_ops(graph) -> dict[str, int]:
    ops = [n.op_type for n in graph.nodes if n.op_type in ("MatMulInteger", "ConvInteger")]
    return {op: ops.count(op) for op in sorted(set(ops))}


@pytest.mark.parametrize("name", sorted(INTEGER))
def test_the_int8_graph_computes_what_onnxruntime_computes_on_the_qdq_model(built, name):
    qdq, _ = built[name]
    graph = import_model(qdq)
    assert _integer_ops(graph) == INTEGER[name]
    assert len(graph.stats.quantised.get("integer", [])) == sum(INTEGER[name].values())
    for seed in range(3):
        feeds = inputs_of(qdq, seed)
        want = run_model(qdq, feeds)
        got = run_model(graph.model, feeds)
        for output in qdq.graph.output:
            assert np.array_equal(want[output.name], got[output.name]), (name, seed)


def test_a_padded_conv_of_an_activation_with_a_zero_point_pads_the_float_image(built):
    """Q(0) is the zero point: the image padded with zeros and quantised again is the int8
    image padded with its zero point, and the ConvInteger has no pads of its own."""
    graph = import_model(built["conv3x3_relu"][0])
    ops = [n.op_type for n in graph.nodes]
    assert ops[:3] == ["Pad", "QuantizeLinear", "ConvInteger"]
    conv = graph.nodes[2]
    assert not any(conv.params.get("pads", ())) and conv.params["kernel_shape"] == (3, 3)
    assert graph.nodes[0].params["value"] == 0 and graph.nodes[0].params["pads"] == (
        0, 0, 1, 1, 0, 0, 1, 1)


def test_qlinear_convs_are_read_as_their_qdq_pattern_and_made_integer(built):
    """QOperator format (QLinearConv) is expanded to DQ -> Conv -> Q (importer/qoperator.py)
    and folded as a QDQ model's: no QLinear op is left for onnxruntime."""
    graph = import_model(built["conv3x3_qoperator"][0])
    assert [n.op_type for n in built["conv3x3_qoperator"][0].graph.node].count("QLinearConv") == 2
    assert graph.stats.quantised["qoperators"] == 2
    assert not any(n.op_type.startswith("QLinear") for n in graph.nodes)
    assert all(n.in_scope for n in graph.nodes)


def test_uint8_activations_are_int8_shifted_by_128(built):
    """quantize_static's default (uint8 activations): each quantised activation only DQs read
    becomes int8 with its zero point less 128, so the contractions are integer as in an int8
    model (the computed values: test_the_int8_graph_computes_what_onnxruntime_computes...)."""
    qdq = built["residual_uint8"][0]
    graph = import_model(qdq)
    assert graph.stats.quantised["uint8_shifted"] == 4
    quantised = [n.outputs[0] for n in graph.nodes if n.op_type == "QuantizeLinear"]
    assert {graph.tensors[name].np_dtype.name for name in quantised} == {"int8"}


def test_a_uint8_tensor_the_graph_returns_stays_uint8():
    """A quantised tensor the model returns keeps its type: only what no one sees is shifted."""
    scale, zero = numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(
        np.uint8(140), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "returned", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32]),
         helper.make_tensor_value_info("q", TensorProto.UINT8, [8, 32])], [scale, zero]),
        opset_imports=[helper.make_opsetid("", 13)])
    graph = import_model(model)
    assert graph.tensors["q"].np_dtype == np.uint8
    assert "uint8_shifted" not in graph.stats.quantised
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)}
    want, got = run_model(model, feeds), run_model(graph.model, feeds)
    assert all(np.array_equal(want[name], got[name]) for name in ("y", "q"))


def test_reshapes_and_transposes_of_a_quantised_tensor_move_its_int8_elements(built):
    """quantize_static writes each head reshape and transpose between a DQ and a Q of the same
    scale and zero point: imported, they move the int8 tensor, no Q/DQ pair around them, and
    the head split and merge is in the first contraction's kernel, which writes int8."""
    qdq, _ = built["heads_split_and_merged"]
    graph = import_model(qdq)
    assert graph.stats.quantised["moved_int8"] == 4
    moves = [n for n in graph.nodes if n.op_type in ("Reshape", "Transpose")]
    assert len(moves) == 4
    for node in moves:
        assert graph.tensors[node.inputs[0]].np_dtype == np.int8, node
        assert graph.tensors[node.outputs[0]].np_dtype == np.int8, node
    assert [n.op_type for n in graph.nodes].count("DequantizeLinear") == 1  # the output's
    first, _ = plan_fusion(graph, TARGET).regions
    (written,) = first.outputs
    assert graph.tensors[written].np_dtype == np.int8


def _moved(nodes: list, outputs: dict[str, list[int]]) -> onnx.ModelProto:
    """A hand-made QDQ graph on x[2, 8]: ``nodes`` between the quantisation of x (``q``, scale
    s, zero point z) and ``outputs`` (float, by name, with their shapes)."""
    init = [numpy_helper.from_array(np.float32(0.05), "s"),
            numpy_helper.from_array(np.float32(0.07), "s2"),
            numpy_helper.from_array(np.int8(3), "z"),
            numpy_helper.from_array(np.array([8, 2], np.int64), "shape"),
            numpy_helper.from_array(np.array([8, 2], np.int64), "shape_again"),
            numpy_helper.from_array(np.float32(0.0), "zero_scale"),
            numpy_helper.from_array(np.array([1], np.int64), "start"),
            numpy_helper.from_array(np.array([2], np.int64), "end")]
    quantise = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"])]
    graph = helper.make_graph(
        quantise + nodes, "moved", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info(
            name, TensorProto.INT8 if name.endswith("_q") else TensorProto.FLOAT, shape)
         for name, shape in outputs.items()], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _dq(name: str, scale: str = "s") -> onnx.NodeProto:
    return helper.make_node("DequantizeLinear", [f"{name}_q", scale, "z"], [f"{name}_d"])


def _q(name: str, scale: str = "s") -> onnx.NodeProto:
    return helper.make_node("QuantizeLinear", [name, scale, "z"], [f"{name}_q"])


MOVED = {  # what each hand-made graph computes, and what moves int8: {summary key: count}
    "two alike reshapes, one kept": (
        [helper.make_node("Reshape", ["d", "shape"], ["r1"]), _q("r1"), _dq("r1"),
         helper.make_node("Reshape", ["d", "shape_again"], ["r2"]), _q("r2"), _dq("r2"),
         helper.make_node("Add", ["r1_d", "r2_d"], ["y"])], {"y": [8, 2]}, {"moved_int8": 2}),
    "a slice": (
        [helper.make_node("Slice", ["d", "start", "end"], ["c"]), _q("c"), _dq("c")],
        {"c_d": [1, 8]}, {"moved_int8": 1}),
    "a slice requantised to another scale stays float": (
        [helper.make_node("Slice", ["d", "start", "end"], ["c"]), _q("c", "s2"), _dq("c", "s2")],
        {"c_d": [1, 8]}, {}),
    "a concat of two scales, each part quantised": (
        [helper.make_node("Relu", ["x"], ["r"]), _q("r", "s2"), _dq("r", "s2"),
         helper.make_node("Concat", ["d", "r_d"], ["c"], axis=0), _q("c", "s2"),
         _dq("c", "s2")], {"c_d": [4, 8]}, {"concats_int8": 1}),
    "a concat the graph returns stays float": (
        [helper.make_node("Concat", ["d", "d"], ["c"], axis=0), _q("c")], {"c": [4, 8]}, {}),
    "alike reshapes both returned, both kept": (
        [helper.make_node("Reshape", ["d", "shape"], ["r1"]), _q("r1"),
         helper.make_node("Reshape", ["d", "shape_again"], ["r2"]), _q("r2")],
        {"r1_q": [8, 2], "r2_q": [8, 2]}, {"moved_int8": 2}),
    "a slice between quantisations of scale 0 stays float": (  # Q(DQ(q)) is not q
        [helper.make_node("DequantizeLinear", ["q", "zero_scale", "z"], ["d0"]),
         helper.make_node("Slice", ["d0", "start", "end"], ["c"]), _q("c", "zero_scale")],
        {"c_q": [1, 8]}, {}),
    "a transpose the graph returns stays float": (
        [helper.make_node("Transpose", ["d"], ["t"], perm=[1, 0]), _q("t"),
         helper.make_node("Relu", ["t"], ["y"])], {"t": [8, 2], "y": [8, 2]}, {}),
}


@pytest.mark.parametrize("case", sorted(MOVED))
def test_an_op_moves_int8_only_between_one_scale_and_computes_what_onnxruntime_does(case):
    nodes, outputs, moved = MOVED[case]
    model = _moved(nodes, outputs)
    graph = import_model(model)
    for key in ("moved_int8", "concats_int8"):
        assert graph.stats.quantised.get(key, 0) == moved.get(key, 0), key
    if case.startswith("two alike"):  # one reshape left, read twice
        assert [n.op_type for n in graph.nodes].count("Reshape") == 1
    if case.startswith("alike reshapes both returned"):  # each the producer of an output
        assert [n.op_type for n in graph.nodes].count("Reshape") == 2
    for concat in (n for n in graph.nodes if n.op_type == "Concat" and moved):
        assert all(graph.tensors[name].np_dtype == np.int8 for name in concat.inputs), concat
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((2, 8)).astype(np.float32)}
        want, got = run_model(model, feeds), run_model(graph.model, feeds)
        for name in outputs:
            assert np.array_equal(want[name], got[name]), (case, seed, name)


def test_a_depthwise_conv_stays_float_with_its_reason(built):
    graph = import_model(built["depthwise3x3_relu6"][0])
    (why,) = graph.stats.quantised["left_float"].values()
    assert "depthwise" in why
    assert all(n.in_scope for n in graph.nodes)


@pytest.mark.parametrize("name", sorted(n for n, ops in INTEGER.items() if ops))
def test_each_int8_contraction_is_one_region_with_its_prologue_and_epilogue(built, name):
    """No more kernels than the fp32 model's plan; each integer contraction in a region that
    quantises its operand (a Q, or Pad then Q) and dequantises its product."""
    qdq, fp32 = built[name]
    graph = import_model(qdq)
    plan = plan_fusion(graph, TARGET)
    assert plan.totals.kernels_after <= plan_fusion(import_model(fp32), TARGET).totals.kernels_after
    nodes = {n.outputs[0]: n for n in graph.nodes}
    contractions = [n for n in graph.nodes if n.op_type in ("MatMulInteger", "ConvInteger")]
    for contraction in contractions:
        (region,) = [r for r in plan.regions if contraction.outputs[0] in r.nodes]
        ops = [nodes[nid].op_type for nid in region.nodes]
        computed = [op for op in ops if op not in MOVERS | {"Concat"}]  # int8 moved after Q
        assert {"Cast", "Mul"} <= set(ops) and computed[-1] in ("QuantizeLinear",
                                                                "DequantizeLinear"), ops
    (region,) = [r for r in plan.regions if contractions[0].outputs[0] in r.nodes]
    assert "QuantizeLinear" in [nodes[nid].op_type for nid in region.nodes[:3]]


def test_kernels_hand_each_other_int8_each_reader_dequantising_in_its_prologue(built):
    """The residual block: r = Relu(conv1(x)) is read by conv2 (its int8 operand) and by the
    Add (dequantised). Both are in the second kernel, the Add's DequantizeLinear with them, so
    the first kernel writes the int8 r only: 1 byte an element where the requantised fp32 r
    took 4 (docs/int8.md, "Regions")."""
    qdq, _ = built["residual_convs"]
    graph = import_model(qdq)
    kinds = {n.outputs[0]: n.op_type for n in graph.nodes}
    inputs_of = {n.outputs[0]: n.inputs for n in graph.nodes}
    first, second = plan_fusion(graph, TARGET).regions
    assert kinds[first.nodes[-1]] == "QuantizeLinear"
    (written,) = first.outputs
    assert graph.tensors[written].np_dtype == np.int8
    readers = sorted(kinds[nid] for nid in second.nodes if written in inputs_of[nid])
    assert readers == ["ConvInteger", "DequantizeLinear"] and written in second.inputs


def test_a_dequantisation_read_twice_is_one_for_each_reader_in_its_kernel():
    """A DQ read by two float ops is imported as two, one per reader, and each joins its
    reader's region: the producer's kernel writes int8, never the dequantised fp32."""
    graph = import_model(dequantised_twice())
    kinds = {n.outputs[0]: n.op_type for n in graph.nodes}
    dequantisations = [n for n in graph.nodes if n.op_type == "DequantizeLinear"
                       and n.inputs[0] == "q"]
    assert len(dequantisations) == 2
    assert [sum(d.outputs[0] in n.inputs for n in graph.nodes) for d in dequantisations] == [1, 1]
    feeds = {"x": np.random.default_rng(0).standard_normal((200, 192)).astype(np.float32)}
    assert np.array_equal(run_model(graph.model, feeds)["y"],
                          run_model(dequantised_twice(), feeds)["y"])
    for region in plan_fusion(graph, TARGET).regions:
        written = [kinds.get(name) for name in region.outputs]
        assert "DequantizeLinear" not in written, region


def test_a_quantisation_only_dequantised_in_its_kernel_stays_fp32_between_them():
    """Each QuantizeLinear of the HardSwish chain is read only by DequantizeLinear nodes of its
    kernel: it rounds (fp32 -> int32 -> fp32: two casts), adds its zero point in fp32 and its
    DQs read that as it is. Held as int32, each Q cast three times and each DQ once: 13 casts
    where 6 do (docs/int8.md, "Kernels")."""
    graph = import_model(dequantised_twice())
    (region,) = plan_fusion(graph, TARGET).regions
    source = kernel_source(region, default_policy(TARGET.ub_plan_bytes.value),
                           graph.constant_values())
    quantisations = [n for n in graph.nodes if n.op_type == "QuantizeLinear"]
    assert len(quantisations) == 3
    assert source.count("pypto.cast(") == 2 * len(quantisations)


def test_a_depthwise_conv_is_planned_as_in_the_float_model_its_quantisations_beside_it(built):
    """The gap left (docs/int8.md): the float depthwise conv stays out of kernels as in the
    fp32 model (its staging does not pay), so its Q->DQ pairs are kernels of their own."""
    qdq, fp32 = built["depthwise3x3_relu6"]
    plan, float_plan = plan_fusion(import_model(qdq), TARGET), plan_fusion(import_model(fp32),
                                                                          TARGET)
    for planned in (plan, float_plan):
        (conv,) = [u for u in planned.unfused if u.op_type == "Conv"]
        assert conv.category == "does not pay"
    assert plan.totals.kernels_after == float_plan.totals.kernels_after + 1


def _hand_made(activation: int, channels: int, act_zero: int = 0, weight_zero: int = 0
               ) -> onnx.ModelProto:
    """x -> Q -> DQ -> MatMul(DQ(int8 weights [channels, 8])): a QDQ MatMul by hand."""
    zero_type = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8}[activation]
    weights = np.arange(channels * 8, dtype=np.int8).reshape(channels, 8) % 7 - 3
    init = [numpy_helper.from_array(np.array(0.05, np.float32), "sx"),
            numpy_helper.from_array(np.array(act_zero, zero_type), "zx"),
            numpy_helper.from_array(weights.astype(np.int8), "wq"),
            numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
            numpy_helper.from_array(np.array(weight_zero, np.int8), "zw")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, channels])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [4, 8])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("activation, channels, weight_zero, reason", [
    (TensorProto.INT8, 32, 2, "asymmetric weights"),
    (TensorProto.UINT8, 16, 0, "a depth of 16, not a multiple of 32")])
def test_what_the_cube_cannot_take_stays_float_and_says_why(activation, channels, weight_zero,
                                                           reason):
    model = _hand_made(activation, channels, act_zero=3, weight_zero=weight_zero)
    graph = import_model(model)
    assert not _integer_ops(graph)
    (why,) = graph.stats.quantised["left_float"].values()
    assert reason in why
    feeds = {"x": np.random.default_rng(0).standard_normal((4, channels)).astype(np.float32)}
    assert np.array_equal(run_model(model, feeds)["y"], run_model(graph.model, feeds)["y"])


@pytest.mark.parametrize("activation, zero", [(TensorProto.INT8, -7), (TensorProto.UINT8, 131)])
def test_an_int8_matmul_with_an_activation_zero_point_is_exact(activation, zero):
    """uint8 activations too: shifted to int8 (zero point 3), the same integers."""
    model = _hand_made(activation, 64, act_zero=zero)
    graph = import_model(model)
    assert _integer_ops(graph) == {"MatMulInteger": 1}
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}
    # a float output: the int32 product scaled once against onnxruntime's sum of float
    # products, a rounding apart (a quantised output, above, is bit-exact)
    np.testing.assert_allclose(run_model(graph.model, feeds)["y"], run_model(model, feeds)["y"],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", qoperator_cases(), ids=[c.name for c in qoperator_cases()])
def test_onnx_backend_qlinear_cases_are_expanded_and_reproduce_their_outputs(case):
    """ONNX's own QLinearConv / QLinearMatMul cases (uint8, int8 with weight zero points, fp16
    scales), their parameters constants as in a quantised model: each is read as its QDQ
    pattern (no QLinear op left for onnxruntime), kept float with the reason PyPTO's cube
    cannot take it, and reproduces the expected output exactly."""
    graph = import_model(case.model)
    assert graph.stats.quantised["qoperators"] == 1
    assert not any(n.op_type.startswith("QLinear") for n in graph.nodes)
    (why,) = graph.stats.quantised["left_float"].values()
    assert "uint8" in why or "weight zero" in why
    (output,) = run_model(graph.model, case.inputs).values()
    assert np.array_equal(output, case.outputs[0])


def test_a_qlinear_matmul_of_int8_with_per_column_weights_is_an_int8_matmul():
    """QLinearMatMul(x int8 per tensor, W int8 [64, 32] scaled per column, symmetric): read as
    its QDQ pattern and folded into a MatMulInteger; its output within one int8 step of
    onnxruntime's QLinearMatMul (one float multiplier there, the folded scale and shift here)."""
    rng = np.random.default_rng(4)
    weights = rng.integers(-127, 128, size=(64, 32)).astype(np.int8)
    init = [numpy_helper.from_array(np.float32(0.05), "sx"),
            numpy_helper.from_array(np.int8(5), "zx"),
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(rng.uniform(0.001, 0.01, 32).astype(np.float32), "sw"),
            numpy_helper.from_array(np.zeros(32, np.int8), "zw"),
            numpy_helper.from_array(np.float32(0.8), "sy"),
            numpy_helper.from_array(np.int8(-3), "zy")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("QLinearMatMul", ["xq", "sx", "zx", "w", "sw", "zw", "sy", "zy"],
                              ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "qlinear_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])], init),
        opset_imports=[helper.make_opsetid("", 13)])
    graph = import_model(model)
    assert _integer_ops(graph) == {"MatMulInteger": 1}
    assert graph.stats.quantised["qoperators"] == 1
    feeds = {"x": rng.standard_normal((16, 64)).astype(np.float32)}
    steps = np.abs(run_model(graph.model, feeds)["y"] - run_model(model, feeds)["y"]) / 0.8
    assert steps.max() <= 1 + 1e-4
