"""Issue 19: the ONNX backend node cases of every elementwise op and activation of the standard
compile into a kernel with the real PyPTO 0.2.0, pass its functional check against
onnxruntime, and the compiled graph reproduces the case's expected outputs, for kirin9050 and
ascend910b; the float ones in fp16 too. An op that cannot be expressed exactly is refused
before PyPTO, with its reason.

Every case is a region of its one op (``fusion.make_region``: the partition makes none, as it
saves nothing) and all compile in one pool (``compile_regions``) without tile search; the second
target's kernels come from the compiles the first one cached (both use PyPTO's 910B tables)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bench.backend_cases import in_scope_cases
from tests.test_backend_conformance import POOL_BOUNDARIES
from pypto_offline import import_model
from pypto_offline.fusion import make_region
from pypto_offline.fusion.classify import why_not_fusable
from pypto_offline.fusion.lower import compiled_model
from pypto_offline.pypto_kernels.compiler import compile_regions, setup_for
from pypto_offline.runtime import (TOLERANCE, magnitude, max_abs_diff, run_model,
                                   within_tolerance)
from pypto_offline.targets import TARGETS

pytestmark = pytest.mark.pypto  # every test here compiles with PyPTO

ISSUE_19_OPS = frozenset(
    "Abs Acos Acosh Asin Asinh Atan Atanh Ceil Celu Clip Cos Cosh Elu Erf Exp Floor Gelu "
    "HardSigmoid HardSwish LeakyRelu Log Mish Neg Not And Or Xor Pow PRelu Reciprocal Relu "
    "Round Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh ThresholdedRelu "
    "Where Max Min Sum Mean Mod BitShift IsNaN IsInf MaxPool AveragePool GlobalAveragePool "
    "GlobalMaxPool".split())
# Refused before PyPTO, and why: not expressible exactly with what PyPTO 0.2.0 compiles, or a
# dtype no target's kernels hold (docs/pypto-ops.md, "Activations")
REFUSALS = ("do not compile", "kernels take no", "computes in floating point", "fills no",
            *POOL_BOUNDARIES)
TARGET_NAMES = ("kirin9050", "ascend910b")


def _admitted(case, graph) -> bool:
    (node,) = graph.nodes
    verdict = why_not_fusable(node, graph, TARGETS["kirin9050"])
    if verdict is not None:
        assert any(reason in verdict[1] for reason in REFUSALS), (case.name, verdict)
    return verdict is None


def _as_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The case in half precision: every fp32 input, output and constant as fp16."""
    half = onnx.ModelProto()
    half.CopyFrom(model)
    for value in list(half.graph.input) + list(half.graph.output):
        if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    for index, tensor in enumerate(half.graph.initializer):
        if tensor.data_type == onnx.TensorProto.FLOAT:
            half.graph.initializer[index].CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    return half


def _fp16_variant(case):
    """The op's first fp32 case with one float input, in fp16, its reference from onnxruntime
    (or onnx's evaluator where onnxruntime has no fp16 kernel)."""
    model = _as_fp16(case.model)
    feeds = {name: value.astype(np.float16) for name, value in case.inputs.items()}
    outputs = run_model(model, feeds)
    return f"{case.name}_fp16", model, feeds, [outputs[o.name] for o in model.graph.output]


def _cases():
    """(name, imported graph, inputs, expected outputs) of every admitted case, fp16 variants
    included, and the refused cases' names."""
    admitted, refused, halved = [], [], set()
    for case in in_scope_cases():
        if case.op_type not in ISSUE_19_OPS:
            continue
        graph = import_model(case.model)
        if not _admitted(case, graph):
            refused.append(case.name)
            continue
        admitted.append((case.name, graph, case.inputs, case.outputs))
        floats = all(np.asarray(v).dtype == np.float32 for v in case.inputs.values())
        if floats and case.op_type not in halved and case.op_type not in ("Where",):
            halved.add(case.op_type)
            name, model, feeds, expected = _fp16_variant(case)
            admitted.append((name, import_model(model), feeds, expected))
    return admitted, refused


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    admitted, refused = _cases()
    regions = [(make_region(name, list(graph.nodes), graph, TARGETS["kirin9050"]), graph)
               for name, graph, _, _ in admitted]
    cache = tmp_path_factory.mktemp("kernel-cache")
    kernels = {target: compile_regions(regions, setup_for(TARGETS[target], cache))
               for target in TARGET_NAMES}
    return admitted, refused, regions, kernels


def test_every_issue_19_op_has_cases_that_compile_and_the_refusals_say_why(compiled):
    admitted, refused, _, _ = compiled
    ops = {graph.nodes[0].op_type for _, graph, _, _ in admitted}
    assert ops >= ISSUE_19_OPS - {"Mod", "BitShift"}, ISSUE_19_OPS - ops
    assert {"test_maxpool_2d_pads", "test_maxpool_2d_strides",
            "test_averagepool_2d_strides"} <= {name for name, *_ in admitted}
    assert any(name.startswith("test_mod") for name in refused)
    assert any(name.startswith("test_bitshift") for name in refused)
    assert sum(name.endswith("_fp16") for name, *_ in admitted) >= 40


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_every_admitted_case_compiles_passes_its_check_and_reproduces_the_case(compiled, target):
    admitted, _, regions, kernels = compiled
    failures = []
    for (name, graph, feeds, expected), (region, _), kernel in zip(admitted, regions,
                                                                   kernels[target]):
        if not (kernel.compiled and kernel.functional_ok):
            failures.append((name, kernel.fallback_reason))
            continue
        model = compiled_model(graph, [region])
        outputs = run_model(model, feeds)
        for output, want in zip(model.graph.output, expected):
            tolerance = TOLERANCE.get(str(np.asarray(want).dtype), 0.0)
            diff = max_abs_diff(np.asarray(want), outputs[output.name])
            if not within_tolerance(diff, tolerance, magnitude(np.asarray(want))):
                failures.append((name, f"compiled graph off by {diff}"))
    assert not failures, failures
