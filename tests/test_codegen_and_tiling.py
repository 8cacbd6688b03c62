"""The kernel generator and the tiling policy, without compiling (fast unit tests)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import pytest

from pypto_offline.pypto_kernels.codegen import float_literal, flat_row, kernel_source, swaps_for
from pypto_offline.pypto_kernels.compiler import compile_order, distinct_sources
from pypto_offline.pypto_kernels.jobs.protocol import CandidateResult
from pypto_offline.pypto_kernels.search import default_candidate
from pypto_offline.fusion.rows import conv_rows
from pypto_offline.pypto_kernels.tiling import (BIAS_TABLE_COLUMNS, L0_BYTES, MAX_TILES,
                                                L0C_BYTES, TilePolicy, candidate_policies,
                                                cube_tiles, default_policy, fits_ub,
                                                search_rounds)
from pypto_offline.targets import TARGETS
from pypto_offline.pypto_kernels.program_figures import ub_peak
from pypto_offline.pypto_kernels.compiler import compile_region, setup_for
from pypto_offline.pypto_kernels.search import cheap_to_check
from tests.executors import ScriptedExecutor, figures, policy_of
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


def test_candidates_leave_room_for_an_input_and_an_output_tile_in_the_target_ub():
    large = 64 << 20
    kirin, ascend = candidate_policies(122880, large), candidate_policies(188416, large)
    assert max(p.budget_bytes for p in kirin) == 32768  # 2 x 64 KiB would pass 120 KiB
    assert max(p.budget_bytes for p in ascend) == 65536
    assert default_policy(122880) == TilePolicy(8192)  # four operand tiles fit without measuring


def test_every_budget_comes_in_both_transpose_tile_orientations():
    policies = candidate_policies(122880, 1 << 20)
    assert {p.budget_bytes for p in policies if p.swap_transpose_tiles} == \
        {p.budget_bytes for p in policies if not p.swap_transpose_tiles}


def test_the_flat_row_layout_is_tried_from_the_default_budget_up():
    policies = candidate_policies(122880, 1 << 20)
    assert {p.budget_bytes for p in policies if p.flat_rows} == \
        {p.budget_bytes for p in policies if p.budget_bytes >= 8192}


def _transposing_source(swap: bool, shape=(1, 16, 64, 128), perm=(0, 2, 1, 3)):
    b = GraphBuilder()
    x = b.op("Relu", [b.input("x", list(shape))])
    region, constants = _only_region(b.model(b.op("Neg", [b.op("Transpose", [x], perm=perm)])))
    return kernel_source(region, TilePolicy(32768, swap), constants)


def _tiles_before(source: str, statement: str) -> str:
    return source.split(statement)[0].rsplit("pypto.set_vec_tile_shapes(", 1)[1].split(")")[0]


def test_the_default_orientation_tiles_a_transpose_as_its_output():
    source = _transposing_source(False)
    assert _tiles_before(source, "pypto.transpose(") == "1, 4, 16, 128"  # over 1x64x16x128


def test_the_other_orientation_runs_a_transpose_under_its_inputs_tile_and_its_reader_swapped():
    """PyPTO tiles a transpose over its input; the op reading the result follows the swapped
    tile and the output statement too (docs/pypto-ops.md, "Transposes")."""
    source = _transposing_source(True)
    relu = _tiles_before(source, "pypto.relu(")
    assert _tiles_before(source, "pypto.transpose(") == relu == "1, 1, 64, 128"  # over 1x16x64x128
    assert _tiles_before(source, "pypto.neg(") == _tiles_before(source, "out0[:]") \
        == "1, 64, 1, 128"


@pytest.mark.parametrize("swap", [False, True])
def test_a_transpose_with_the_last_axis_keeps_the_new_last_axis_aligned(swap):
    """whisper's log-mel Transpose(1, 2) of rows of 80 fp32 frames: whatever the producer's tile,
    the axis that becomes the innermost stays a whole number of 32-byte blocks."""
    source = _transposing_source(swap, shape=(1, 3000, 80), perm=(0, 2, 1))
    tile = [int(v) for v in _tiles_before(source, "pypto.transpose(").split(", ")]
    inner = tile[1] if swap else tile[2]  # over the input (swapped) or the output
    assert inner * 4 % 32 == 0 or inner == 3000


def test_a_candidate_fits_only_if_its_measured_ub_does():
    assert fits_ub(122880, 122880) and not fits_ub(122881, 122880)
    assert not fits_ub(None, 122880)  # an unread program is not trusted


def test_the_default_tile_shrinks_until_its_leaves_fit():
    fitting = [CandidateResult(b, s) for b in (1024, 2048, 4096, 32768)
               for s in (False, True)]  # 8192 overflowed the UB
    assert default_candidate(fitting, 8192) == CandidateResult(4096, False)
    assert default_candidate([CandidateResult(16384, False)], 8192) is None


def test_the_default_tile_keeps_the_own_shape_layout():
    fitting = [CandidateResult(b, False, f) for b in (4096, 8192) for f in (True, False)]
    assert default_candidate(fitting, 8192) == CandidateResult(8192, False, False)


def test_ub_peak_reads_the_highest_range_a_leaf_allocates_in_ub():
    def tensor(mem_id, mem_range, mem_type):
        return {"mem_id": mem_id, "mem_range": mem_range,
                "mem_type": {"asis": mem_type, "tobe": mem_type}}
    ub, l1, l0c, gm = 0, 1, 4, 15
    leaf = {"graphtype": 3, "tensors": [tensor(15, [0, 0], gm), tensor(39, [0, 7680], ub),
                                        tensor(88, [7680, 23040], ub),
                                        tensor(-1, [0, 99999], ub),
                                        tensor(90, [0, 131072], l0c),  # a cube leaf's product
                                        tensor(91, [0, 65536], l1)]}
    tile_graph = {"graphtype": 1, "tensors": [tensor(1, [0, 50000], ub)]}
    assert ub_peak({"functions": [tile_graph, leaf]}) == 23040


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


def _silu_region(shape, bias_shape=None):
    """nudenet's SiLU (x * sigmoid(x)), with a broadcast Add in front when ``bias_shape``."""
    b = GraphBuilder()
    x = b.input("x", shape)
    if bias_shape is not None:
        x = b.op("Add", [x, b.input("bias", bias_shape)])
    graph, plan = fuse(b.model(b.op("Mul", [x, b.op("Sigmoid", [x])])))
    assert len(plan.regions) == 1
    return plan.regions[0], graph.constant_values()


def _silu_graph_region(shape):
    """``_silu_region``'s graph too: a search made up by a ScriptedExecutor still runs the
    region's reference in onnxruntime."""
    b = GraphBuilder()
    x = b.input("x", shape)
    graph, plan = fuse(b.model(b.op("Mul", [x, b.op("Sigmoid", [x])])))
    return graph, plan.regions[0]


def test_an_elementwise_region_runs_on_unpadded_rows_in_its_flat_layout():
    region, constants = _silu_region([1, 64, 20, 20])  # rows of 20 floats pad to 24
    assert flat_row(region, constants) == 128  # 512-byte rows of fp32; 25600 = 200 x 128
    flat = kernel_source(region, TilePolicy(8192, flat_rows=True), constants)
    compile(flat, "kernel.py", "exec")
    assert "pypto.reshape(in0, [200, 128])" in flat
    assert "pypto.set_vec_tile_shapes(16, 128)" in flat  # 8 KiB of whole rows, none padded
    assert "[200, 128]" not in kernel_source(region, TilePolicy(8192), constants)


@pytest.mark.parametrize("shape,bias", [([1, 64, 20, 20], [1, 64, 1, 1]),  # broadcasts
                                        ([1, 3, 5, 5], None)])  # 75 floats: no aligned row
def test_a_region_that_broadcasts_or_has_no_aligned_row_keeps_its_own_layout(shape, bias):
    region, constants = _silu_region(shape, bias)
    assert flat_row(region, constants) is None
    assert kernel_source(region, TilePolicy(8192, flat_rows=True), constants) == \
        kernel_source(region, TilePolicy(8192), constants)  # compiled once (distinct_sources)


def _flat_budgets(region, constants):
    policies = candidate_policies(TARGETS["kirin9050"].ub_plan_bytes.value, 1 << 22)
    return {p.budget_bytes for p in distinct_sources(region, policies, constants) if p.flat_rows}


def test_the_flat_layout_is_not_compiled_where_it_tiles_as_the_own_shapes_do():
    """magika's 1x2048x64 fp32 elementwise region: own tiles of whole 256-byte rows are as many
    and as full as the flat rows' at every budget (the cost model timed both alike)."""
    region, constants = _silu_region([1, 2048, 64])
    assert flat_row(region, constants) == 128
    assert _flat_budgets(region, constants) == set()


def test_the_flat_layout_is_compiled_where_its_rows_are_fewer_or_fuller():
    region, constants = _silu_region([1, 64, 20, 20])  # own rows of 20 floats pad to 24
    assert _flat_budgets(region, constants) == {8192, 16384, 32768}
    region, constants = _silu_region([1, 16, 320, 320])  # ppocrv4_det: 25 of 320 rows vs 64 x 128
    assert _flat_budgets(region, constants) == {8192, 16384, 32768}


def test_the_search_compiles_the_largest_budgets_and_the_default_first():
    for ub, top in ((122880, {32768, 16384, 8192}), (188416, {65536, 32768, 16384})):
        policies = candidate_policies(ub, 1 << 22)
        first, rest = search_rounds(policies, default_policy(ub))
        assert {p.budget_bytes for p in first} == top | {8192}  # the default always, for the report
        assert rest and max(p.budget_bytes for p in rest) < 8192
        assert sorted(first + rest, key=policies.index) == policies  # nothing lost, nothing twice


def test_the_smaller_budgets_are_compiled_only_when_no_large_tile_fits_ub(tmp_path):
    """The worker's answers are made up here (no kernel is claimed compiled): every first-round
    tile overflows UB, so the search goes on with the rest and the kernel takes a small tile."""
    b = GraphBuilder()
    graph, plan = fuse(b.model(b.op("Neg", [b.op("Relu", [b.input("x", [1, 64, 64, 64])])])))
    target = TARGETS["kirin9050"]
    executor = ScriptedExecutor(figures(lambda p, job, folder: dict(
        compiled=True, aicore_us=1.0, total_us=2.0, tasks=4, ub_bytes=16 * p.budget_bytes,
        verdicts=(), max_abs_diff=0.0, gm_bytes={"read": 1, "written": 1})))
    (region,) = plan.regions
    kernel = compile_region(region, graph, setup_for(target, tmp_path, executor),
                            graph.constant_values())
    searched = [sorted(c.budget for c in job.candidates) for _, job in executor.jobs]
    first, rest = searched[0], searched[1]
    assert min(first) == 8192 and max(rest) < 8192  # the large tiles first, then the rest
    assert kernel.tuned_tile.budget_bytes * 16 <= target.ub_plan_bytes.value


def test_a_concat_runs_under_its_own_tile_after_its_inputs_are_reshaped():
    """nudenet's YOLO head: the inputs' reshapes set tiles of their own; emitted after the
    concat's tile, the last of them was the one the concat ran under."""
    b = GraphBuilder()
    parts = [b.op("Reshape", [b.op("Relu", [b.input(f"x{i}", [1, 16, 10, 10])]),
                              b.const(np.array([1, 16, 100], dtype=np.int64))]) for i in range(3)]
    graph, plan = fuse(b.model(b.op("Concat", parts, axis=2)))
    assert len(plan.regions) == 1
    source = kernel_source(plan.regions[0], TilePolicy(8192), graph.constant_values())
    lines = [line.strip() for line in source.splitlines()]
    at = next(i for i, line in enumerate(lines) if "pypto.concat(" in line)
    assert lines[at - 1] == "pypto.set_vec_tile_shapes(1, 6, 304)", lines[at - 3:at + 1]


def test_the_biggest_distinct_work_is_compiled_first_and_repeats_last():
    b = GraphBuilder()
    # 7x7 convolutions: boundaries (a smaller one would join its region as its root)
    weights = lambda cout: b.const(np.ones((cout, 8, 7, 7), dtype=np.float32))  # noqa: E731
    first = b.op("Neg", [b.op("Relu", [b.input("x", [1, 8, 16, 16])])])
    same = b.op("Neg", [b.op("Relu", [b.op("Conv", [first, weights(8)], pads=[3, 3, 3, 3])])])
    bigger = b.op("Neg", [b.op("Relu", [b.op("Conv", [same, weights(32)],
                                                 pads=[3, 3, 3, 3])])])  # 4x the bytes
    graph, plan = fuse(b.model(bigger))
    assert [len(r.simplified) for r in plan.regions] == [2, 2, 2]
    by_id = {r.id: i for i, r in enumerate(plan.regions)}
    order = compile_order(plan.regions, [graph.constant_values()] * len(plan.regions))
    assert sorted(order) == [0, 1, 2]  # every region once
    biggest = max(plan.regions, key=lambda r: max(s[0][1] for s in r.tensor_types.values()))
    assert order[0] == by_id[biggest.id]
    assert order[2] == max(i for i in by_id.values() if i != by_id[biggest.id])  # the repeat


@pytest.mark.parametrize("flat_ub,flat_us,compiled_flat", [
    # ppocrv4_det: no less UB at 16 KiB than at 32, so none at 8 KiB
    (lambda budget: 196608, lambda budget: 1.0, [32768, 16384]),
    # nudenet: the UB shrinks with the tile, fits at 16 KiB; 8 KiB tried as 16 was the fastest
    (lambda budget: 4 * budget, lambda budget: 1.0, [32768, 16384, 8192]),
    # every flat tile fits; 16 KiB slower than 32: the descent stops
    (lambda budget: budget, lambda budget: 32768 / budget, [32768, 16384]),
])
def test_smaller_flat_row_tiles_are_compiled_only_while_they_may_fit_and_gain(
        tmp_path, flat_ub, flat_us, compiled_flat):
    """The worker's answers are made up here (no kernel is claimed compiled)."""
    graph, region = _silu_graph_region([1, 64, 20, 20])  # rows pad: the flat layout is searched
    executor = ScriptedExecutor(figures(lambda p, job, folder: dict(
        compiled=True, aicore_us=flat_us(p.budget_bytes) if p.flat_rows else 2.0,
        total_us=2.0, tasks=4, verdicts=(), max_abs_diff=0.0,
        ub_bytes=flat_ub(p.budget_bytes) if p.flat_rows else 2 * p.budget_bytes,
        gm_bytes={"read": 1, "written": 1})))
    kernel = compile_region(region, graph, setup_for(TARGETS["kirin9050"], tmp_path, executor),
                            graph.constant_values())
    compiled = [policy_of(c) for folder, job in executor.jobs if folder.name != "final"
                for c in job.candidates]  # the search's
    assert [p.budget_bytes for p in compiled if p.flat_rows] == compiled_flat
    assert {p.budget_bytes for p in compiled if not p.flat_rows} == {8192, 16384, 32768}
    assert kernel.tuned_tile.flat_rows == (flat_ub(16384) <= 122880 or flat_ub(32768) <= 122880)


@pytest.mark.parametrize("own_ub,expected", [
    (lambda budget: 2 * budget, [16384]),  # the fastest own tile is at 16 KiB: swapped there
    (lambda budget: 200000, [8192, 16384, 32768]),  # no own tile fits: every swapped one
])
def test_the_swapped_transpose_tiles_are_compiled_at_the_best_own_budget(tmp_path,
                                                                         own_ub, expected):
    """The worker's answers are made up here (no kernel is claimed compiled)."""
    b = GraphBuilder()
    x = b.op("Relu", [b.input("x", [1, 16, 32, 128])])
    graph, plan = fuse(b.model(b.op("Neg", [b.op("Transpose", [x], perm=[0, 1, 3, 2])])))
    (region,) = plan.regions
    executor = ScriptedExecutor(figures(lambda p, job, folder: dict(
        compiled=True, aicore_us=3.0 if p.budget_bytes == 16384 else 4.0, total_us=5.0,
        tasks=4, verdicts=(), max_abs_diff=0.0,
        ub_bytes=2 * p.budget_bytes if p.swap_transpose_tiles else own_ub(p.budget_bytes),
        gm_bytes={"read": 1, "written": 1})))
    compile_region(region, graph, setup_for(TARGETS["kirin9050"], tmp_path, executor),
                   graph.constant_values())
    rounds = [[policy_of(c) for c in job.candidates] for folder, job in executor.jobs
              if folder.name != "final"]  # the search's
    assert not any(p.swap_transpose_tiles for p in rounds[0])  # the own orientation first
    assert {p.budget_bytes for p in rounds[0]} == {8192, 16384, 32768}
    swapped = sorted(p.budget_bytes for r in rounds[1:] for p in r if p.swap_transpose_tiles)
    assert swapped == expected


def test_a_checked_round_whose_worker_crashes_is_searched_again_unchecked(tmp_path):
    """A small region's first round is checked as it compiles (docs/compile-time.md); when a
    candidate's process dies under the check (ppocrv4_rec: SIGSEGV in PyPTO's interpreter), the
    round runs again unchecked and only the tile it picks gets a checked compile, as a large
    region's would: the region ships instead of falling back. The worker's answers are made up
    here (no kernel is claimed compiled)."""
    graph, region = _silu_graph_region([1, 16, 16, 16])
    assert cheap_to_check(region)

    def made_up(p, job, folder):
        if job.verify and len(job.candidates) > 1:
            return None  # the worker died under the check
        return dict(compiled=True, aicore_us=4.0 - p.budget_bytes / 16384, total_us=5.0,
                    tasks=4, max_abs_diff=0.0, ub_bytes=2 * p.budget_bytes,
                    verdicts=({"pass": "tensor_graph", "result": "PASS"},) * job.verify,
                    gm_bytes={"read": 1, "written": 1})
    executor = ScriptedExecutor(figures(made_up))
    kernel = compile_region(region, graph, setup_for(TARGETS["kirin9050"], tmp_path, executor),
                            graph.constant_values())
    jobs = [(folder.name, job.verify, len(job.candidates)) for folder, job in executor.jobs]
    assert [(name, verify) for name, verify, _ in jobs] == [
        ("search", True), ("search-unchecked", False), ("final", True)]
    assert jobs[0][2] == jobs[1][2] > 1 and jobs[2][2] == 1
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason


@pytest.mark.parametrize("m,k,n,itemsize", [
    (64, 64, 1600, 4), (128, 256, 400, 4), (16, 64, 6400, 4), (196, 32, 128, 4),
    (3000, 201, 80, 4), (65, 16, 65, 4), (128, 256, 6400, 2), (16, 16, 16, 2)])
def test_cube_tiles_fit_the_cube_buffers(m, k, n, itemsize):
    (m_tile, _), (k_tile, _), (n_tile, _) = cube_tiles(m, k, n, itemsize, 16384)
    assert all(side % 16 == 0 for side in (m_tile, k_tile, n_tile))
    assert max(m_tile, n_tile) * k_tile * max(itemsize, 2) <= L0_BYTES  # L0A and L0B
    assert m_tile * n_tile * 4 <= L0C_BYTES  # the fp32 product tile, in L0C


def test_cube_tiles_cover_the_long_side_of_a_pointwise_convolution():
    """nudenet's 64-filter 1x1 convolution of 1600 pixels: the 16 KiB weight is read once per
    N tile, so N 512 (4 reads) beats N 128 (13 reads); x is read once either way."""
    (m_tile, _), _, (n_tile, _) = cube_tiles(64, 64, 1600, 4, 16384)
    assert (m_tile, n_tile) == (64, 512)
    assert cube_tiles(16, 16, 16, 4, 16384) == ([16, 16], [16, 16], [16, 16])


def test_a_bias_keeps_the_n_tile_within_the_bias_table():
    """swin's 16x128x512 fc1 with its bias failed to compile at N 512 (FFFFFF)."""
    assert cube_tiles(16, 128, 512, 4, 16384)[2][0] == 512
    assert cube_tiles(16, 128, 512, 4, 16384, bias=True)[2][0] <= BIAS_TABLE_COLUMNS


def _conv_region(consumer):
    b = GraphBuilder()
    x = b.input("x", [1, 32, 8, 8])
    rng = np.random.default_rng(0)
    conv = b.op("Conv", [x, b.const(rng.standard_normal((64, 32, 1, 1)).astype(np.float32)),
                         b.const(rng.standard_normal(64).astype(np.float32))])
    graph, plan = fuse(b.model(*consumer(b, conv)))
    (region,) = plan.regions
    return region, graph.constant_values()


def test_a_pointwise_convolution_epilogue_runs_on_the_products_rows():
    """The product is [Cout, H*W] as the cube writes it; the SiLU runs on it, and only the
    output is reshaped to 4-D (fusion/rows.conv_rows)."""
    region, constants = _conv_region(lambda b, y: [b.op("Mul", [y, b.op("Sigmoid", [y])])])
    source = kernel_source(region, TilePolicy(8192), constants)
    compile(source, "kernel.py", "exec")
    assert "pypto.sigmoid(t" in source and "[1, 64, 8, 8]" in source
    body = source.split("pypto.matmul(")[1]
    assert body.count("pypto.reshape(t") == 1  # of a computed value: the output's, at the end


def test_a_convolution_whose_channels_split_keeps_its_own_layout():
    region, _ = _conv_region(lambda b, y: b.op("Split", [b.op("Relu", [y])], outputs=2,
                                               axis=1, split=[32, 32]))
    assert conv_rows(region.simplified, {t: s for t, (s, _) in region.tensor_types.items()}) \
        is None


def _only_region(model):
    graph, plan = fuse(model)
    (region,) = plan.regions
    return region, graph.constant_values()


def test_a_batched_matmul_is_a_loop_of_2d_matmuls_assembled_into_the_output():
    """[1, 4, 16, 16] x [1, 4, 16, 8], heads moved behind the tokens: one 2-D matmul per head,
    each assembled at column block h of the [16, 32] output; no 4-D matmul, no transpose."""
    b = GraphBuilder()
    p, v = b.input("p", [1, 4, 16, 16]), b.input("v", [1, 4, 16, 8])
    merged = b.op("Transpose", [b.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
    region, constants = _only_region(b.model(b.op("Reshape", [merged, b.const([1, 16, 32])])))
    source = kernel_source(region, TilePolicy(8192), constants)
    compile(source, "kernel.py", "exec")
    assert "ARGUMENT_SHAPES = [(64, 16), (64, 8), (16, 32)]" in source
    assert "for b1 in range(4):" in source and "pypto.transpose(" not in source
    assert "pypto.assemble(t3, [0 * 16, b1 * 8], out0)" in source


def attention_scores_cast_to_fp32():
    """Llama's attention scores under allow_mix_precision: an fp16 batched MatMul, its scale,
    the mask broadcast over heads, and the Cast back to fp32 the conversion adds."""
    b = GraphBuilder()
    half = onnx.TensorProto.FLOAT16
    q, k = b.input("q", [1, 4, 4, 16], half), b.input("k", [1, 4, 16, 16], half)
    scores = b.op("Mul", [b.op("MatMul", [q, k]), b.const(0.25, np.float16)])
    masked = b.op("Add", [scores, b.input("mask", [1, 1, 4, 16], half)])
    return b.model(b.op("Cast", [masked], to=onnx.TensorProto.FLOAT))


def test_a_batched_matmul_s_epilogue_may_end_in_a_cast():
    """The Cast an fp16 mode adds after the epilogue stays in the loop: one 2-D matmul per
    head, the slice cast in UB and assembled as fp32 (as one 4-D matmul PyPTO took 12.0 us
    against the loop's 7.7, docs/pypto-ops.md, "MatMul")."""
    region, constants = _only_region(attention_scores_cast_to_fp32())
    source = kernel_source(region, TilePolicy(8192), constants)
    compile(source, "kernel.py", "exec")
    assert "for b1 in range(4):" in source and source.count("pypto.matmul(") == 1
    assert "pypto.cast(" in source and "out0: pypto.Tensor((16, 16), pypto.DT_FP32)" in source


def test_a_batched_matmul_whose_epilogue_the_loop_cannot_hold_stays_one_matmul():
    """Erf has a lowering of its own (a polynomial), not a PyPTO elementwise call: the 4-D form
    stays (codegen.batched_matmul_loop takes UNARY and BINARY ops and Casts only)."""
    b = GraphBuilder()
    q, k = b.input("q", [1, 2, 16, 16]), b.input("k", [1, 2, 16, 16])
    region, constants = _only_region(b.model(b.op("Erf", [b.op("MatMul", [q, k])])))
    source = kernel_source(region, TilePolicy(8192), constants)
    assert "ARGUMENT_SHAPES" not in source and "for b" not in source
    assert source.count("pypto.matmul(") == 1


def test_a_concat_output_is_assembled_part_by_part_and_a_shared_input_read_once():
    b = GraphBuilder()
    x, y = b.input("x", [1, 16, 8, 8]), b.input("y", [1, 16, 8, 8])
    silu = b.op("Mul", [x, b.op("Sigmoid", [x])])
    region, constants = _only_region(b.model(b.op("Concat", [y, b.op("Add", [y, silu])],
                                                  axis=1)))
    source = kernel_source(region, TilePolicy(8192), constants)
    compile(source, "kernel.py", "exec")
    assert "pypto.concat(" not in source and "out0[:]" not in source
    assert source.count("pypto.assemble(") == 2 and ", [0, 16, 0, 0], out0)" in source
    copy = source.split(" = pypto.add(in1, 0.0)")[0].split()[-1]  # y, read once from GM
    assert f"pypto.assemble({copy}, [0, 0, 0, 0], out0)" in source


def test_the_worker_views_arguments_in_their_declared_shapes_and_refuses_others():
    import torch

    from pypto_offline.pypto_kernels.worker import as_arguments

    tensor = torch.arange(6.0)
    (viewed,) = as_arguments([tensor], [(2, 3)])
    assert tuple(viewed.shape) == (2, 3) and viewed.data_ptr() == tensor.data_ptr()
    assert as_arguments([tensor], None) == [tensor]
    with pytest.raises(ValueError, match="declares arguments"):
        as_arguments([tensor], [(4, 2)])
    with pytest.raises(ValueError, match="declares arguments"):
        as_arguments([tensor], [(2, 3), (1,)])


def _tile_rereads(m, k, n, itemsize, budget):
    (m_tile, _), _, (n_tile, _) = cube_tiles(m, k, n, itemsize, budget)
    return itemsize * (m * k * (-(-n // n_tile) - 1) + k * n * (-(-m // m_tile) - 1))


@pytest.mark.parametrize("m,k,n", [(192, 192, 1600), (64, 64, 1600), (384, 192, 400),
                                   (128, 256, 400), (2048, 257, 64), (16, 16, 16)])
def test_cube_tiles_reread_no_more_than_any_tile_within_l0c_must(m, k, n):
    """At a budget whose product tile may fill L0C, the generator's cube tiles re-read exactly
    the platform's floor (fusion/cost.cube_reread_bytes): ppocrv4_det's 192x192x1600 fp32
    convolution reads its 147 KiB weight 10 times (192 x 160 tiles), not 13 (192 x 128)."""
    from pypto_offline.fusion.cost import cube_reread_bytes
    from pypto_offline.fusion.records import RegionOp

    types = {"a": ((m, k), 1), "b": ((k, n), 1), "p": ((m, n), 1)}
    floor = cube_reread_bytes([RegionOp("MatMul", ("a", "b"), ("p",))], types)
    assert _tile_rereads(m, k, n, 4, 16384) == floor
    if (m, k, n) == (192, 192, 1600):
        assert floor == 9 * 192 * 192 * 4
    if (m, k, n) == (16, 16, 16):
        assert floor == 0


def test_a_convolution_and_a_batched_matmul_reread_per_filter_block_and_per_slice():
    from pypto_offline.fusion.cost import cube_reread_bytes
    from pypto_offline.fusion.records import RegionOp

    conv = {"x": ((1, 192, 40, 40), 1), "w": ((192, 192, 1, 1), 1), "y": ((1, 192, 40, 40), 1)}
    assert cube_reread_bytes([RegionOp("Conv", ("x", "w"), ("y",))], conv) == 9 * 192 * 192 * 4
    batched = {"q": ((1, 4, 16, 16), 1), "k": ((1, 4, 16, 16), 1), "s": ((1, 4, 16, 16), 1)}
    assert cube_reread_bytes([RegionOp("MatMul", ("q", "k"), ("s",))], batched) == 0
    wide = {"q": ((2, 64, 64), 1), "k": ((2, 64, 1024), 1), "s": ((2, 64, 1024), 1)}
    n_tile = 512  # 64 x 512 fp32 products fill L0C: the right operand is read once
    per_slice = 64 * 64 * 4 * (-(-1024 // n_tile) - 1)
    assert cube_reread_bytes([RegionOp("MatMul", ("q", "k"), ("s",))], wide) == 2 * per_slice


def _masked_softmax(mask_shape, computed_mask: bool = False, mask_returned: bool = False):
    b = GraphBuilder()
    scores, mask = b.input("scores", [1, 8, 64, 128]), b.input("mask", mask_shape)
    if computed_mask:  # the mask made in the region (a precision mode's Cast, here a Neg)
        mask = b.op("Neg", [mask])
    added = b.op("Add", [b.op("Mul", [scores, b.const(np.float32(0.125))]), mask])
    outputs = [b.op("Softmax", [added], axis=-1)] + ([mask] if mask_returned else [])
    return fuse(b.model(*outputs))


def test_a_mask_repeated_per_head_is_expanded_to_the_rows_of_its_softmax():
    """Issue 37: [1, 1, 64, 128] over [1, 8, 64, 128] is neither a row nor a column operand of
    the 512 x 128 rows; the kernel expands it in its own axes, then lays it out as rows."""
    from pypto_offline.fusion.rows import EXPANDED, row_layout
    from pypto_offline.pypto_kernels.codegen.layout import shapes_of

    graph, plan = _masked_softmax([1, 1, 64, 128])
    (region,) = plan.regions
    assert [op.op_type for op in region.original] == ["Mul", "Add", "Softmax"]
    rows = row_layout(region.simplified, shapes_of(region))
    mask = next(name for name in region.inputs if graph.tensors[name].shape == (1, 1, 64, 128))
    assert rows.kinds[mask] == EXPANDED and rows.shape(mask) == [512, 128]
    assert rows.expanded == {mask: (1, 8, 64, 128)}
    source = kernel_source(region, default_policy(122880), graph.constant_values())
    assert "pypto.expand_clone(in" in source and ", [1, 8, 64, 128])" in source


def test_a_tensor_computed_from_a_broadcast_mask_is_expanded_too():
    """Issue 37: an elementwise op on region inputs broadcast across the rows (a precision
    mode's Cast of an fp32 mask) is computed on them expanded to its reader's rows, so the
    Softmax joins (it stayed a kernel of its own); not when its result is read beyond the
    region, which would have to be written in its own shape."""
    from pypto_offline.fusion.rows import EXPANDED, row_layout
    from pypto_offline.pypto_kernels.codegen.layout import shapes_of

    graph, plan = _masked_softmax([1, 1, 64, 128], computed_mask=True)
    (region,) = plan.regions
    assert [op.op_type for op in region.original] == ["Neg", "Mul", "Add", "Softmax"]
    rows = row_layout(region.simplified, shapes_of(region), region.outputs)
    (negated,) = region.simplified[0].outputs
    mask = next(name for name in region.inputs if graph.tensors[name].shape == (1, 1, 64, 128))
    assert rows.kinds[negated] == rows.kinds[mask] == EXPANDED
    assert rows.expanded[mask] == rows.expanded[negated] == (1, 8, 64, 128)
    source = kernel_source(region, default_policy(122880), graph.constant_values())
    assert "pypto.expand_clone(in" in source and ", [1, 8, 64, 128])" in source
    _, plan = _masked_softmax([1, 1, 64, 128], computed_mask=True, mask_returned=True)
    assert [[op.op_type for op in r.original] for r in plan.regions] == [["Neg", "Mul", "Add"]]
    assert [u.op_type for u in plan.unfused] == ["Softmax"]

def _silu_split(channels: int = 256, parts=(128, 128)):
    """nudenet's C2f start at 10x10 (SPPF's input): SiLU, then its channels split in two."""
    b = GraphBuilder()
    x = b.input("x", [1, channels, 10, 10])
    silu = b.op("Mul", [x, b.op("Sigmoid", [x])])
    return fuse(b.model(*b.op("Split", [silu, b.const(list(parts))], outputs=len(parts),
                                axis=1)))


@pytest.mark.parametrize("budget", [4096, 8192, 16384, 32768, 65536])
def test_no_tile_straddles_two_parts_of_a_split(budget):
    """Every tile of the Split's source along its axis divides the parts' sizes (a tile of 12
    of 256 channels split at 128 failed PyPTO's compile or took 287 us)."""
    graph, plan = _silu_split()
    (region,) = plan.regions
    source = kernel_source(region, TilePolicy(budget), graph.constant_values())
    tiles = {line.strip() for line in source.splitlines() if "set_vec_tile_shapes" in line}
    channels = [int(t.split("(")[1].split(",")[1]) for t in tiles]
    assert channels and all(128 % c == 0 for c in channels), tiles
