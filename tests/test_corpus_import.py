"""Every corpus model imports with its test shapes to a fully static graph that matches the original
in onnxruntime. A model that cannot be fetched or exported is a failure, never a skip."""
from __future__ import annotations

import onnx
import pytest

from bench import corpus
from pypto_offline import import_model
from pypto_offline.importer.contractions import CONV_FORM, MATMUL_FORM
from pypto_offline.runtime import max_abs_diff, run_model

FP32_TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=sorted(corpus.MODELS))
def imported(request):
    spec = corpus.MODELS[request.param]
    path = corpus.model_path(spec.name)  # raises CorpusError with the reason when unavailable
    return spec, path, import_model(path, spec.input_shapes)


def test_every_tensor_is_static(imported):
    spec, _, graph = imported
    assert graph.symbolic == ()
    for node in graph.nodes:
        for name in node.outputs:
            if name:
                assert graph.tensors[name].shape is not None, f"{spec.name}: {name} not static"
    onnx.checker.check_model(graph.model)


DECLINED_FORMS = (CONV_FORM, MATMUL_FORM)


def test_in_scope_ops_carry_canonical_parameters(imported):
    spec, _, graph = imported
    assert any(node.in_scope for node in graph.nodes), spec.name
    for node in graph.nodes:
        if node.op_type in ("Slice", "Transpose", "Reshape", "Concat") and node.in_scope:
            assert node.params, f"{spec.name}: {node.name} has no canonical parameters"
        if not node.in_scope and node.why_not_canonical:  # a run-time parameter, or a
            # convolution or matmul of a form no kernel takes (importer/canonical.py)
            assert "computed at run time" in node.why_not_canonical or \
                node.why_not_canonical.startswith(DECLINED_FORMS), node.why_not_canonical


def test_imported_graph_matches_the_original(imported):
    spec, path, graph = imported
    feeds = spec.make_inputs(seed=0)
    expected = run_model(onnx.load(path), feeds)
    actual = run_model(graph.model, feeds)
    assert set(expected) == set(actual)
    for name, want in expected.items():
        diff = max_abs_diff(want, actual[name])
        tolerance = FP32_TOLERANCE if want.dtype.kind == "f" else 0.0
        assert diff <= tolerance, f"{spec.name}: output {name} differs by {diff}"


def test_folding_removes_constant_subgraphs():
    spec = corpus.MODELS["ppocrv4_det"]  # a PaddleOCR export: hundreds of Constant nodes
    graph = import_model(corpus.model_path(spec.name), spec.input_shapes)
    assert graph.stats.nodes_after_folding < graph.stats.nodes_in_source / 2
    assert not any(node.op_type in ("Constant", "Shape") for node in graph.nodes)
