"""The view algebra: each view op is the index map numpy's own op implies, and chains compose."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_offline.fusion.views import View, ViewStack


def arange(shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1


def run(shape, *steps):
    stack = ViewStack.of(shape)
    for op_type, params in steps:
        stack = stack.apply(op_type, params)
    return stack


def test_slice_with_steps_including_negative():
    x = arange([5, 7])
    stack = run([5, 7], ("Slice", {"starts": (4, 1), "ends": (-1, 7), "steps": (-2, 3)}))
    np.testing.assert_array_equal(stack.gather(x), x[4::-2, 1:7:3])
    assert len(stack.views) == 1


def test_pad_is_a_mask_and_composes_with_slice():
    x = arange([3, 4])
    stack = run([3, 4], ("Pad", {"pads": (1, 0, 0, 2), "mode": "constant", "value": 9.0}),
                ("Slice", {"starts": (0, 2), "ends": (3, 6), "steps": (1, 1)}))
    expected = np.pad(x, ((1, 0), (0, 2)), constant_values=9.0)[0:3, 2:6]
    np.testing.assert_array_equal(stack.gather(x), expected)
    assert len(stack.views) == 1 and stack.views[0].mask is not None


def test_negative_pads_crop():
    x = arange([4, 6])
    stack = run([4, 6], ("Pad", {"pads": (-1, 2, 0, -3), "mode": "constant", "value": 0.0}))
    expected = np.pad(x[1:, :3], ((0, 0), (2, 0)))
    np.testing.assert_array_equal(stack.gather(x), expected)


def test_transpose_then_inverse_is_identity():
    stack = run([2, 3, 4], ("Transpose", {"perm": (2, 0, 1)}), ("Transpose", {"perm": (1, 2, 0)}))
    assert stack.is_identity


def test_expand_uses_zero_strides():
    x = arange([3, 1])
    stack = run([3, 1], ("Expand", {"shape": (3, 5)}))
    assert stack.views[0].strides == (1, 0)
    np.testing.assert_array_equal(stack.gather(x), np.broadcast_to(x, (3, 5)))


def test_expanding_an_axis_that_holds_only_padding_keeps_it_padding():
    x = arange([1, 1])
    stack = run([1, 1], ("Pad", {"pads": (0, 1, 1, 0), "mode": "constant", "value": 0.0}),
                ("Slice", {"starts": (0, 0), "ends": (2, 1), "steps": (1, 1)}),
                ("Expand", {"shape": (2, 2)}))
    np.testing.assert_array_equal(stack.gather(x), np.zeros((2, 2), np.float32))


def test_reshape_merges_and_splits_strided_axes():
    x = arange([2, 6, 4, 5])
    stack = run([2, 6, 4, 5], ("Transpose", {"perm": (1, 0, 2, 3)}),
                ("Reshape", {"shape": (3, 2, 2, 20)}))  # 6 splits, 4 and 5 merge
    assert len(stack.views) == 1
    np.testing.assert_array_equal(stack.gather(x), x.transpose(1, 0, 2, 3).reshape(3, 2, 2, 20))


def test_reshape_that_no_single_view_can_say_stacks_a_view():
    x = arange([4, 6])
    stack = run([4, 6], ("Transpose", {"perm": (1, 0)}), ("Reshape", {"shape": (24,)}))
    assert len(stack.views) == 2
    np.testing.assert_array_equal(stack.gather(x), x.T.reshape(24))


def test_contiguous_view_of_a_prefix_is_not_the_identity():
    stack = run([4, 10], ("Slice", {"starts": (0, 0), "ends": (2, 10), "steps": (1, 1)}))
    assert stack.views[0].is_contiguous and not stack.is_identity
    assert View.of((2, 10)).is_contiguous


@st.composite
def view_chains(draw):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    current, steps = list(shape), []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["Slice", "Pad", "Transpose", "Reshape", "Expand"]))
        rank = len(current)
        if kind == "Slice":
            starts, ends, steps_ = [], [], []
            for dim in current:
                step = draw(st.sampled_from([1, 1, 2, -1]))
                start = draw(st.integers(0, dim - 1))
                end = draw(st.integers(start + 1, dim)) if step > 0 else draw(st.integers(-1, start - 1))
                starts.append(start), ends.append(end), steps_.append(step)
            params = {"starts": tuple(starts), "ends": tuple(ends), "steps": tuple(steps_)}
            current = [len(range(s, e, k)) for s, e, k in zip(starts, ends, steps_)]
        elif kind == "Pad":
            pads = tuple(draw(st.integers(0, 2)) for _ in range(2 * rank))
            params = {"pads": pads, "mode": "constant", "value": 0.0}
            current = [d + pads[i] + pads[i + rank] for i, d in enumerate(current)]
        elif kind == "Transpose":
            perm = tuple(draw(st.permutations(range(rank))))
            params, current = {"perm": perm}, [current[p] for p in perm]
        elif kind == "Reshape":
            params = {"shape": (int(np.prod(current)),) if rank > 1 else tuple(current) + (1,)}
            current = list(params["shape"])
        else:
            if 1 not in current:
                continue
            target = tuple(draw(st.integers(1, 3)) if d == 1 else d for d in current)
            params, current = {"shape": target}, list(target)
        steps.append((kind, params))
    return shape, steps


def numpy_apply(x, op_type, p):
    if op_type == "Slice":
        index = tuple(slice(s, None if e == -1 and k < 0 else e, k)
                      for s, e, k in zip(p["starts"], p["ends"], p["steps"]))
        return x[index]
    if op_type == "Pad":
        rank = x.ndim
        return np.pad(x, [(p["pads"][i], p["pads"][i + rank]) for i in range(rank)])
    if op_type == "Transpose":
        return x.transpose(p["perm"])
    if op_type == "Reshape":
        return x.reshape(p["shape"])
    return np.broadcast_to(x, p["shape"])


@settings(max_examples=200, deadline=None)
@given(view_chains())
def test_any_chain_of_views_moves_what_numpy_moves(chain):
    shape, steps = chain
    x = arange(shape)
    expected = x
    stack = ViewStack.of(shape)
    for op_type, params in steps:
        expected = numpy_apply(expected, op_type, params)
        stack = stack.apply(op_type, params)
        assert stack is not None
    np.testing.assert_array_equal(stack.gather(x), expected)
