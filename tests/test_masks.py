"""Masks made in the kernel (issue 54): a band constant recognised from its values
(``importer/bands.py``), written from its bounds, read by no kernel argument and counted in no
lower bound; an additive mask the graph shares between layers copied once per reader
(``importer/masks.py``)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from pypto_offline import api
from pypto_offline.importer.bands import Band, band_of
from pypto_offline.importer.masks import one_mask_per_reader
from pypto_offline.pypto_kernels.codegen import kernel_source
from pypto_offline.pypto_kernels.tiling import default_policy
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.onnx_builders import GraphBuilder
from tests.test_attention import decoder_attention, encoder_layers

CAUSAL = np.arange(16)[None, :] <= np.arange(4)[:, None] + 12  # 4 new tokens after 12


@pytest.mark.parametrize("value, band", [
    (CAUSAL[None, None], Band(4, 16, None, 12, True, False)),
    (np.where(CAUSAL, 0.0, -1e4).astype(np.float32)[None], Band(4, 16, None, 12, 0.0, -1e4)),
    (~CAUSAL, Band(4, 16, None, 12, False, True)),  # the blocked keys: the same bounds
    (np.abs(np.arange(6)[None, :] - np.arange(6)[:, None]) <= 1, Band(6, 6, -1, 1, True, False)),
])
def test_a_band_is_recognised_with_its_bounds_and_values(value, band):
    assert band_of(value) == band


@pytest.mark.parametrize("value", [
    np.ones((1, 1, 16, 1), np.bool_),  # uniform: no mask
    np.where(np.random.default_rng(0).random((4, 4)) < 0.5, 0.0, -1e4).astype(np.float32),
    np.stack([CAUSAL, CAUSAL]),  # a leading axis of extent 2
    CAUSAL.astype(np.int64),  # not bool or fp32
    np.where(CAUSAL, 0.0, np.arange(16.0)).astype(np.float32),  # three values or more
    np.arange(16) <= 12,  # rank 1
])
def test_what_is_no_band_is_not_taken_for_one(value):
    assert band_of(value) is None


def test_a_shared_additive_mask_is_copied_for_each_reader_but_the_first():
    """Three layers reading one mask made from the attention mask input: its Reshape, Cast and
    Where copied twice, each layer's Add reading its own; the input is not copied."""
    model = encoder_layers(layers=3)
    assert len(one_mask_per_reader(model.graph)) == 6
    wheres = [n for n in model.graph.node if n.op_type == "Where"]
    adds = [n for n in model.graph.node if n.op_type == "Add"]
    assert len(wheres) == 3 and sorted(a.input[1] for a in adds) == sorted(
        w.output[0] for w in wheres)
    onnx.checker.check_model(model)


def test_a_mask_read_by_other_ops_or_returned_is_left_shared():
    """Only an additive mask (a Where of two scalars) read by Adds alone is copied: one the
    graph returns, or that a Mul reads too, stays one tensor."""
    for returned in (True, False):
        b = GraphBuilder()
        keep = b.op("Greater", [b.input("m", [1, 16]), b.const(np.float32(0.5))])
        mask = b.op("Where", [keep, b.const(np.float32(0.0)), b.const(np.float32(-1e4))])
        x = b.input("x", [1, 16])
        second = b.op("Add", [x, mask]) if returned else b.op("Mul", [x, mask])
        model = b.model(b.op("Add", [x, mask]), second, *([mask] if returned else []))
        assert len(one_mask_per_reader(model.graph)) == 0


def test_a_band_is_neither_an_argument_nor_a_byte_of_the_lower_bound():
    """The decoder's causal band, a [1, 1, 4, 16] fp32 constant (256 B), is not among what its
    core reads from GM in the plan's lower bound: q, the keys and values, the output."""
    graph, plan = fuse(decoder_attention())
    (core,) = [r for r in plan.regions if "Softmax" in [op.op_type for op in r.original]]
    band = [t for t in core.inputs if t in graph.constants and t in graph.made_in_kernel
            and graph.tensors[t].shape == (1, 1, 4, 16)]
    assert band
    read = [t for t in core.inputs if t not in graph.made_in_kernel]
    assert core.fused.gm_bytes == sum(graph.tensors[t].nbytes for t in read) + sum(
        graph.tensors[t].nbytes for t in core.outputs)


def masked_softmax():
    """A Softmax of scores read from outside plus a mask made of a causal band And a padding
    input, Where: no attention core (no MatMul), a row region."""
    b = GraphBuilder()
    padding = b.input("padding", [1, 1, 1, 16], onnx.TensorProto.BOOL)
    scores = b.input("scores", [1, 4, 4, 16])
    keep = b.op("And", [b.const(CAUSAL[None, None], np.bool_), padding])
    mask = b.op("Where", [keep, b.const(np.float32(0.0)), b.const(np.float32(-1e4))])
    return b.model(b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1))


def test_a_mask_made_in_a_row_region_is_written_and_computes_what_onnxruntime_does():
    """The mask's ops on region inputs are broadcast to the rows of the Add reading them
    (``fusion/rows._on_expanded``); the Where's two values are scalars of the layout (before,
    they had no kind there and the generator failed with an internal error)."""
    graph, plan = fuse(masked_softmax())
    assert [[op.op_type for op in r.original] for r in plan.regions] == [
        ["And", "Where", "Add", "Softmax"]]
    assert_compiled_matches(graph, plan)
    text = kernel_source(plan.regions[0],
                         default_policy(TARGETS["kirin9050"].ub_plan_bytes.value),
                         graph.constant_values())
    assert "pypto.cumsum(" in text and "DT_BOOL" in text  # the band made, the padding read


@pytest.mark.pypto
def test_a_mask_made_in_a_row_region_compiles_and_checks(tmp_path):
    summary = api.compile(masked_softmax(), "kirin9050", cache_dir=tmp_path,
                          verify=True).summary()
    (kernel,) = summary["kernels"]
    assert kernel["status"] == "compiled"
    assert summary["build_record"]["kernels_passed"] == 1
    assert summary["verification"]["status"] == "passed"


def test_a_band_a_matmul_multiplies_by_is_made_in_the_kernel_too():
    """A lower-triangular matrix of ones (a running sum written as a product) is a band: the
    kernel writes it and the cube multiplies it, no argument holding it."""
    b = GraphBuilder()
    product = b.op("MatMul", [b.input("x", [1, 16, 16]),
                              b.const(np.tril(np.ones((16, 16), np.float32)))])
    graph, plan = fuse(b.model(b.op("Add", [product, b.input("r", [1, 16, 16])])))
    (region,) = plan.regions
    text = kernel_source(region, default_policy(TARGETS["kirin9050"].ub_plan_bytes.value),
                         graph.constant_values())
    assert "pypto.cumsum(" in text and text.count("pypto.Tensor(") == 3  # x, r and the output
    assert_compiled_matches(graph, plan)
