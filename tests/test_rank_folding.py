"""Rank folding above PyPTO 0.2.0's rank 4 (pypto_kernels/folding.py): a slice taken on fewer axes
takes the same elements, and a transformer's rank-5 qkv split compiles as one kernel."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_offline.pypto_kernels import compile_kernels
from pypto_offline.pypto_kernels.folding import Window, fold_slice
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.onnx_builders import GraphBuilder, seeded


def _taken(x: np.ndarray, window: Window) -> np.ndarray:
    return x[tuple(slice(start, start + span, step)
                   for start, span, step in zip(window.starts, window.spans, window.steps))]


@st.composite
def windows(draw):
    shape = draw(st.lists(st.sampled_from([1, 1, 2, 3, 4]), min_size=1, max_size=6))
    starts, spans, steps = [], [], []
    for size in shape:
        start = draw(st.integers(0, size - 1))
        span = draw(st.integers(1, size - start))
        starts.append(start), spans.append(span), steps.append(draw(st.sampled_from([1, 1, 2])))
    return Window(tuple(shape), tuple(starts), tuple(spans), tuple(steps))


@settings(max_examples=300, deadline=None)
@given(windows())
def test_a_folded_slice_takes_the_same_elements(window):
    x = np.arange(int(np.prod(window.shape))).reshape(window.shape)
    folded = fold_slice(window)
    assert len(folded.shape) <= len(window.shape)
    assert np.array_equal(_taken(x.reshape(folded.shape), folded).reshape(-1),
                          _taken(x, window).reshape(-1))


def test_the_qkv_split_s_slice_folds_to_two_axes():
    """PP-OCRv4's recogniser: [1, 40, 3, 8, 15] (tokens, q/k/v, heads, head size), one of the three
    taken: a view of 120 columns of the [40, 360] projection."""
    folded = fold_slice(Window((1, 40, 3, 8, 15), (0, 0, 1, 0, 0), (1, 40, 1, 8, 15),
                               (1, 1, 1, 1, 1)))
    assert folded == Window((40, 360), (0, 120), (40, 120), (1, 1))


def _qkv_split(tokens=40, heads=8, size=15):
    """SVTR's attention input as Paddle exports it (PP-OCRv4's recogniser): the qkv projection
    reshaped to rank 5, transposed so q/k/v lead, each sliced out and squeezed, q scaled and k
    transposed for the scores."""
    b = GraphBuilder(opset=13)
    width = heads * size
    x = b.input("x", [1, tokens, width])
    qkv = b.op("Add", [b.op("MatMul", [x, b.const(seeded([width, 3 * width], seed=1))]),
                       b.const(seeded([3 * width], seed=2))])
    heads_first = b.op("Transpose", [b.op("Reshape", [qkv, b.const(
        np.array([0, tokens, 3, heads, size], np.int64))])], perm=[2, 0, 3, 1, 4])
    q, k, v = (b.op("Squeeze", [b.op("Slice", [heads_first, b.const(np.array([i], np.int64)),
                                               b.const(np.array([i + 1], np.int64)),
                                               b.const(np.array([0], np.int64))]),
                                b.const(np.array([0], np.int64))]) for i in range(3))
    scaled = b.op("Mul", [q, b.const(np.array([size ** -0.5], np.float32))])
    return b.model(scaled, b.op("Transpose", [k], perm=[0, 1, 3, 2]), v)


@pytest.mark.pypto
def test_a_rank_5_qkv_split_compiles_as_one_kernel(tmp_path):
    """Fell back before ("rank 5 of 'reshape2_25.tmp_0' exceeds PyPTO's 4"), cut four times to a
    6-op part: its slices now view the projection's rows folded to rank 2. PP-OCRv4's
    recogniser on kirin9050: 87 -> 79 kernels (docs/regions.md, "Rank 5")."""
    graph, plan = fuse(_qkv_split())
    (region,) = plan.regions
    assert {"MatMul", "Reshape", "Transpose", "Slice", "Mul"} <= {op.op_type
                                                                for op in region.simplified}
    assert any(len(region.tensor_types[t][0]) == 5 for t in region.tensor_types)
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert_compiled_matches(graph, plan)


@pytest.mark.pypto
def test_a_region_with_rank_6_inputs_and_outputs_declares_them_folded(tmp_path):
    """Refused before ("rank 6 of 'y' exceeds PyPTO's 4"): a kernel argument above rank 4 is
    declared with its leading axes merged (``ARGUMENT_SHAPES``; the worker passes the same
    buffers viewed so), and the region's ops run on folded shapes."""
    b = GraphBuilder()
    y = b.op("Neg", [b.op("Relu", [b.input("x", [2, 3, 2, 3, 2, 4])])])
    graph, plan = fuse(b.model(y))
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert "ARGUMENT_SHAPES = [(12, 3, 2, 4), (12, 3, 2, 4)]" in kernel.source
    assert_compiled_matches(graph, plan)
