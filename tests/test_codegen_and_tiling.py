"""The kernel generator and the tiling policy, without compiling (fast unit tests)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pypto_offline.pypto_kernels.codegen import float_literal, kernel_source, swaps_for
from pypto_offline.pypto_kernels.tiling import (MAX_TILES, TilePolicy, candidate_policies,
                                                default_policy)
from tests.fusion_helpers import fuse
from tests.onnx_builders import GraphBuilder


@pytest.mark.parametrize("perm", list(itertools.permutations(range(4))))
def test_axis_swaps_compose_to_the_permutation(perm):
    axes = list(range(4))
    for i, j in swaps_for(perm):
        axes[i], axes[j] = axes[j], axes[i]
    assert tuple(axes) == perm
    assert len(swaps_for(perm)) <= 3


def test_float_literals_are_valid_python_for_every_value():
    for value in (0.0, -2.5, 1e-30, math.inf, -math.inf):
        assert eval(float_literal(value)) == value  # noqa: S307 - our own literal
    assert math.isnan(eval(float_literal(math.nan)))  # noqa: S307


@pytest.mark.parametrize("shape,itemsize", [((1, 16, 64, 64), 4), ((3, 5, 7), 2), ((1000,), 4),
                                            ((2, 3), 1)])
def test_tiles_are_row_aligned_and_within_budget(shape, itemsize):
    for policy in candidate_policies(122880, int(np.prod(shape)) * itemsize):
        tile = policy.tile(shape, itemsize)
        assert len(tile) == len(shape)
        assert (tile[-1] * itemsize) % 32 == 0
        assert all(1 <= t for t in tile)
        assert np.prod(tile) * itemsize <= max(policy.budget_bytes, tile[-1] * itemsize)


def test_candidates_fit_the_target_ub():
    large = 64 << 20
    kirin, ascend = candidate_policies(122880, large), candidate_policies(188416, large)
    assert max(p.budget_bytes for p in kirin) * 4 <= 122880
    assert max(p.budget_bytes for p in ascend) > max(p.budget_bytes for p in kirin)
    assert default_policy(122880) == TilePolicy(8192)


@pytest.mark.parametrize("tensor_bytes", [64, 4096, 100_000, 4 << 20, 64 << 20])
def test_candidates_span_one_to_max_tiles_and_keep_the_default(tensor_bytes):
    budgets = [p.budget_bytes for p in candidate_policies(122880, tensor_bytes)]
    assert 8192 in budgets and budgets == sorted(budgets)
    below_default = [b for b in budgets if b < 8192]
    assert all(b * MAX_TILES >= tensor_bytes for b in below_default)
    # no budget beyond the first that holds the tensor whole: it would compile the same tiles
    assert sum(b >= tensor_bytes for b in budgets) <= 1 or tensor_bytes <= 8192


def test_small_tensors_search_below_the_default():
    assert min(p.budget_bytes for p in candidate_policies(122880, 4096)) < 4096


def test_whole_axes_stay_whole():
    assert TilePolicy(4096).tile((1, 64, 32, 32), 4, whole_axes=(1,))[1] == 64


def _source_for(pads, value, extra_constant=None):
    b = GraphBuilder()
    x = b.input("x", [4, 32])
    y = b.op("Pad", [x], pads=pads, value=value)
    other = b.const(np.float32(extra_constant if extra_constant is not None else 1.0))
    graph, plan = fuse(b.model(b.op("Relu", [b.op("Max", [y, other])])))
    constants = graph.constant_values()
    source = kernel_source(plan.regions[0], TilePolicy(8192), constants)
    compile(source, "kernel.py", "exec")
    return source


def test_generated_module_is_python_and_spells_infinity():
    source = _source_for([0, 0, 0, 8], float("-inf"), extra_constant=-np.inf)
    assert 'float("-inf")' in source and " inf" not in source.replace('"-inf"', "")


def test_pad_at_the_end_with_zero_or_infinity_uses_pypto_pad():
    assert 'pypto.pad(' in _source_for([0, 0, 2, 8], 0.0)
    assert 'pypto.pad(' in _source_for([0, 0, 0, 8], float("-inf"))


def test_pad_on_any_side_or_value_uses_full_blocks():
    for pads, value in (([1, 0, 0, 8], 0.0), ([0, 0, 0, 8], 1.5)):
        source = _source_for(pads, value)
        assert "pypto.full(" in source and "pypto.pad(" not in source
