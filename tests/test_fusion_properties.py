"""Random chains of memory-bound ops go through import, fusion and simplification; the compiled
graph must compute what onnxruntime computes on the original."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.onnx_builders import GraphBuilder


def _slice(draw, b, x, shape):
    axis = draw(st.integers(0, len(shape) - 1))
    dim = shape[axis]
    start = draw(st.integers(-dim, dim - 1))
    end = draw(st.integers(-dim, dim + 2))
    step = draw(st.sampled_from([1, 1, 2]))
    out = list(shape)
    out[axis] = len(range(*slice(start, end, step).indices(dim)))
    if out[axis] == 0:
        return x, shape
    return b.op("Slice", [x], starts=[start], ends=[end], axes=[axis], steps=[step]), out


def _pad(draw, b, x, shape):
    pads = [draw(st.integers(0, 2)) for _ in range(2 * len(shape))]
    rank = len(shape)
    return b.op("Pad", [x], pads=pads, value=0.5), [d + pads[i] + pads[i + rank]
                                                    for i, d in enumerate(shape)]


def _transpose(draw, b, x, shape):
    perm = draw(st.permutations(range(len(shape))))
    return b.op("Transpose", [x], perm=list(perm)), [shape[p] for p in perm]


def _reshape(draw, b, x, shape):
    if len(shape) > 1 and draw(st.booleans()):
        axis = draw(st.integers(0, len(shape) - 2))
        out = shape[:axis] + [shape[axis] * shape[axis + 1]] + shape[axis + 2:]
    else:
        out = shape + [1]
    return b.op("Reshape", [x], shape=out), out


def _tile(draw, b, x, shape):
    repeats = [1] * len(shape)
    repeats[draw(st.integers(0, len(shape) - 1))] = 2
    return b.op("Tile", [x], repeats=repeats), [d * r for d, r in zip(shape, repeats)]


def _elementwise(draw, b, x, shape):
    kind = draw(st.sampled_from(["Neg", "Relu", "AddConst", "Sigmoid"]))
    if kind == "AddConst":
        return b.op("Add", [x, b.const(np.float32(0.25))]), shape
    return b.op(kind, [x]), shape


def _self_concat(draw, b, x, shape):
    axis = draw(st.integers(0, len(shape) - 1))
    neg = b.op("Neg", [x])
    out = list(shape)
    out[axis] *= 2
    return b.op("Concat", [x, neg], axis=axis), out


def _split_swap(draw, b, x, shape):
    axes = [a for a, d in enumerate(shape) if d >= 2]
    if not axes:
        return x, shape
    axis = draw(st.sampled_from(axes))
    first = draw(st.integers(1, shape[axis] - 1))
    low, high = b.op("Split", [x], outputs=2, axis=axis, split=[first, shape[axis] - first])
    return b.op("Concat", [high, low], axis=axis), shape


STEPS = [_slice, _pad, _transpose, _reshape, _tile, _elementwise, _self_concat, _split_swap]


@st.composite
def chains(draw):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    b = GraphBuilder()
    x = b.input("x", shape)
    current, cur_shape = x, list(shape)
    for _ in range(draw(st.integers(2, 7))):
        step = draw(st.sampled_from(STEPS))
        current, cur_shape = step(draw, b, current, cur_shape)
        if int(np.prod(cur_shape)) > 4096 or len(cur_shape) > 5:
            break
    return b.model(b.op("Relu", [current]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_fused_chains_compute_what_the_original_computes(model):
    graph, plan = fuse(model)
    assert_compiled_matches(graph, plan)
    assert plan.totals.kernels_after <= plan.totals.kernels_before
    assert plan.totals.gm_bytes_after <= plan.totals.gm_bytes_before


def _descendants(dag, sources) -> set:
    import networkx as nx

    return set().union(*(nx.descendants(dag, s) for s in sources))


def assert_regions_convex(graph, plan) -> None:
    """No path leaves a region and comes back into it (fusing it would make a cycle)."""
    import networkx as nx

    producer = {name: n.outputs[0] for n in graph.nodes for name in n.outputs}
    dag = nx.DiGraph((producer[name], n.outputs[0]) for n in graph.nodes for name in n.inputs
                     if name in producer)
    dag.add_nodes_from(n.outputs[0] for n in graph.nodes)
    for region in plan.regions:
        inside = set(region.nodes)
        left = _descendants(dag, inside) - inside
        assert not _descendants(dag, left) & inside, (region.id, region.nodes)


@st.composite
def dags(draw):
    """Random DAGs of fusable ops around boundary ops (CumSum is outside the op registry):
    paths leave a would-be region through a boundary op and come back into it."""
    b = GraphBuilder()
    tensors = [b.input("x", [2, 8, 16])]
    consumed = set()
    for _ in range(draw(st.integers(3, 16))):
        kind = draw(st.sampled_from(["Relu", "Neg", "Sigmoid", "Add", "Mul", "CumSum"]))
        first = draw(st.sampled_from(tensors))
        if kind in ("Add", "Mul"):
            second = draw(st.sampled_from(tensors))
            inputs = [first, second]
        elif kind == "CumSum":
            inputs = [first, b.const(np.int64(2))]
        else:
            inputs = [first]
        consumed.update(inputs)
        tensors.append(b.op(kind, inputs))
    sinks = [t for t in tensors[1:] if t not in consumed]
    return b.model(*sinks)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_regions_of_random_dags_are_convex_and_compute_the_same(model):
    """Issue 34 made the convexity check search only up to the consumer in graph order."""
    graph, plan = fuse(model)
    assert_regions_convex(graph, plan)
    assert_compiled_matches(graph, plan)
