"""Kernels compiled with the real PyPTO 0.2.0 (SIM run mode), checked functionally, cached."""
from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
import pytest

from pypto_offline.fusion import without_regions
from pypto_offline.fusion.records import FAILED_CHECK
from pypto_offline.pypto_kernels import compile_kernels, compile_region, setup_for
from pypto_offline.pypto_kernels import measured_baseline, search
from pypto_offline.pypto_kernels.cache import STAGING
from tests.executors import RecordingExecutor
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.test_fusion_anchors import channel_shuffle, rotary, slice_pad_tile_transpose_reshape_add


def test_importing_the_package_does_not_import_pypto_or_torch():
    import subprocess

    code = ("import sys, pypto_offline, pypto_offline.pypto_kernels, pypto_offline.fusion; "
            "print('pypto' in sys.modules, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "False"]


@pytest.fixture(scope="module")
def anchor_kernels(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernel-cache")
    results = {}
    for build in (slice_pad_tile_transpose_reshape_add, channel_shuffle, rotary):
        graph, plan = fuse(build(), "kirin9050")
        started = time.perf_counter()
        kernels = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=cache)
        results[build.__name__] = (graph, plan, kernels, time.perf_counter() - started)
    return cache, results


@pytest.mark.pypto
@pytest.mark.parametrize("name", ["slice_pad_tile_transpose_reshape_add", "channel_shuffle",
                                  "rotary"])
def test_anchor_kernels_compile_and_pass_their_functional_check(anchor_kernels, name):
    _, results = anchor_kernels
    _, plan, (kernel,), _ = results[name]
    assert kernel.compiled, kernel.fallback_reason
    assert kernel.functional_ok and kernel.max_abs_diff == 0.0
    passes = dict(kernel.verdicts)
    assert set(passes) == {"tensor_graph", "Pass_36_CodegenPreproc"}  # codegen.VERIFIED_PASSES
    assert all(v == "PASS" for v in passes.values())
    assert kernel.tuned_tile.aicore_us <= kernel.default_tile.aicore_us
    assert kernel.tuned_tile.tasks > 0
    # UB measured on the compiled leaves, within what Kirin plans with
    ub_plan = TARGETS["kirin9050"].ub_plan_bytes.value
    assert 0 < kernel.tuned_tile.ub_bytes <= ub_plan and 0 < kernel.default_tile.ub_bytes <= ub_plan
    assert kernel.gm_bytes_read > 0 and kernel.gm_bytes_written > 0
    assert "program.json.gz" in kernel.artifacts and "dyn_topo.txt" in kernel.artifacts
    assert any(name.endswith("_aiv.cpp") for name in kernel.artifacts)  # AICore source
    assert "control_flow_host.cpp" in kernel.artifacts
    assert "@pypto.frontend.jit" in kernel.source and "def kernel(" in kernel.source


@pytest.mark.pypto
def test_a_warm_rebuild_compiles_nothing(anchor_kernels):
    cache, results = anchor_kernels
    graph, plan, (cold,), _ = results["rotary"]
    started = time.perf_counter()
    (warm,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=cache)
    assert warm.from_cache and not cold.from_cache
    assert time.perf_counter() - started < 2.0  # no worker process was started
    assert (warm.cache_key, warm.tuned_tile, warm.artifacts) == \
        (cold.cache_key, cold.tuned_tile, cold.artifacts)


def unfoldable_transpose():
    """One fusable region the kernel generator refuses: a rank-6 transpose that reverses every
    axis, so no two stay adjacent and it cannot fold to PyPTO's rank 4 (a scalar divided by a
    tensor was the example until the generator learnt RMSNorm's 1 / sqrt(...))."""
    from tests.onnx_builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", [2, 3, 2, 3, 2, 8])
    return b.model(b.op("Transpose", [b.op("Relu", [x])], perm=[5, 4, 3, 2, 1, 0]))


def test_a_region_the_generator_cannot_write_falls_back_with_its_reason(tmp_path):
    graph, plan = fuse(unfoldable_transpose())
    (region,) = plan.regions
    kernel = compile_region(region, graph, setup_for(TARGETS["kirin9050"], tmp_path),
                            graph.constant_values())
    assert not kernel.compiled and "does not fold to 4 axes" in kernel.fallback_reason
    assert not kernel.reached_pypto and not kernel.from_cache
    replanned = without_regions(plan, graph, TARGETS["kirin9050"],
                                {region.id: (FAILED_CHECK, kernel.fallback_reason)})
    assert replanned.regions == () and replanned.totals.kernels_after == plan.totals.kernels_before
    assert {u.category for u in replanned.unfused} == {FAILED_CHECK}
    assert_compiled_matches(graph, replanned)


def test_a_region_the_generator_refuses_is_not_counted_as_a_compile(tmp_path):
    """Found on ppocrv4_rec: its two rank-5 regions made every warm build report 2 compiles,
    though PyPTO compiled nothing for them."""
    import pypto_offline

    compiled = pypto_offline.compile(unfoldable_transpose(), "kirin9050", cache_dir=tmp_path)
    assert compiled.summary()["pypto"] == {**compiled.summary()["pypto"], "compiled": 0,
                                           "fell_back": 1}
    assert compiled.kernel_cache == {"hits": 0, "compiled": 0, "pypto_compiles": 0}


@pytest.mark.pypto
@pytest.mark.parametrize("sabotage,expected", [
    ("import os\nos._exit(3)\n", "crashed (exit code 3)"),
    ("import time\ntime.sleep(60)\n", "did not finish within 2 s"),
])
def test_a_crashing_or_hanging_compile_falls_back_and_the_build_goes_on(
        sabotage, expected, tmp_path, monkeypatch):
    from pypto_offline.pypto_kernels import codegen

    graph, plan = fuse(rotary())
    honest = codegen.kernel_source
    monkeypatch.setattr("pypto_offline.pypto_kernels.compiler.kernel_source",
                        lambda region, policy, constants: honest(region, policy, constants)
                        + sabotage)
    started = time.perf_counter()
    # 2 s: the sabotage runs as the child loads the kernel, 0.05 s after the hand-over
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False, timeout=2)
    assert not kernel.compiled and expected in kernel.fallback_reason
    assert time.perf_counter() - started < 30
    # never cached: a crash or time-out says nothing about the kernel, the next build retries
    assert [p for p in tmp_path.glob("*/*") if p.parent.name != STAGING] == []
    (again,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                               search=False, timeout=2)
    assert not again.from_cache and expected in again.fallback_reason
    replanned = without_regions(plan, graph, TARGETS["kirin9050"],
                                {kernel.region_id: (FAILED_CHECK, kernel.fallback_reason)})
    assert_compiled_matches(graph, replanned)


@pytest.mark.pypto
def test_same_kernel_same_artifacts_whatever_the_cache_folder(tmp_path):
    graph, plan = fuse(rotary())
    first, second = (compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path / d,
                                     search=False)[0] for d in ("a", "b"))
    assert not first.from_cache and not second.from_cache
    assert first.artifacts == second.artifacts and first.artifacts
    assert b"kernel/" in __import__("gzip").decompress(first.artifacts["program.json.gz"])
    assert str(tmp_path).encode() not in __import__("gzip").decompress(
        first.artifacts["program.json.gz"])


@pytest.mark.pypto
def test_gm_bytes_of_an_elementwise_chain_meet_the_lower_bound(tmp_path):
    from tests.onnx_builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", [1, 32, 64, 64])
    y = b.op("Sigmoid", [b.op("Neg", [b.op("Relu", [x])])])
    graph, plan = fuse(b.model(y))
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path)
    assert kernel.compiled, kernel.fallback_reason
    lower_bound = plan.regions[0].fused.gm_bytes
    assert kernel.gm_bytes_read == kernel.gm_bytes_written == lower_bound // 2
    assert kernel.gm_bytes <= 1.05 * lower_bound


@pytest.mark.pypto
def test_an_elementwise_region_on_padded_rows_gains_from_the_flat_layout(tmp_path):
    from tests.onnx_builders import GraphBuilder

    b = GraphBuilder()  # nudenet's SiLU on a 10x10 map: each 40-byte row pads to 64 in a tile
    x = b.input("x", [1, 64, 10, 10])
    graph, plan = fuse(b.model(b.op("Mul", [x, b.op("Sigmoid", [x])])))
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert kernel.tuned_tile.flat_rows and not kernel.default_tile.flat_rows
    assert kernel.tuned_tile.aicore_us <= 0.8 * kernel.default_tile.aicore_us  # 1.66 vs 4.41 us
    assert kernel.gm_bytes == plan.regions[0].fused.gm_bytes


@pytest.mark.pypto
@pytest.mark.parametrize("model", ["asr_frontend_whisper80_conv", "asr_frontend_nemo80"])
def test_every_region_of_a_corpus_model_compiles_or_falls_back_with_a_reason(model, tmp_path):
    """Through the build: a matmul whose kernel with its epilogue does not compile (whisper's
    3000x201x80 mel filterbank: no tile fits Kirin's UB) is split off and the epilogue fused
    again without it."""
    import pypto_offline
    from bench import corpus

    spec = corpus.MODELS[model]
    compiled = pypto_offline.compile(corpus.model_path(model), "kirin9050", spec.input_shapes,
                                     cache_dir=tmp_path)
    kernels = compiled.message.kernels
    assert len(kernels) >= 2  # nemo80: 2 since its MatMul fuses
    for kernel in kernels:
        assert kernel.compiled or kernel.fallback_reason
        if kernel.compiled:
            assert kernel.functional_ok and all(v.result == "PASS" for v in kernel.verdicts)
    # compiled: shipped, or compiled and checked but dropped by the cost model as slower than
    # its ops (whisper's filterbank epilogue on kirin9050's four cores)
    assert sum(k.compiled or k.fallback_category == "slower fused" for k in kernels) >= \
        0.9 * len(kernels), [k.fallback_reason for k in kernels if not k.compiled]
    assert compiled.verify(spec.make_inputs(seed=0)).status == "passed"


@pytest.mark.pypto
def test_ascend950_kernels_are_costed_with_the_a5_tables(anchor_kernels, tmp_path):
    _, results = anchor_kernels
    graph, plan, (on_kirin,), _ = results["rotary"]
    (on_950,) = compile_kernels(graph, plan, TARGETS["ascend950"], cache_dir=tmp_path,
                                search=False)
    assert on_950.compiled and on_950.cache_key != on_kirin.cache_key
    assert on_950.tuned_tile.aicore_us != on_kirin.default_tile.aicore_us


@pytest.mark.pypto
def test_a_region_that_simplifies_to_a_rename_compiles_as_one_copy(tmp_path):
    from tests.onnx_builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", [2, 6, 8, 16])
    parts = b.op("Split", [x], outputs=3, axis=1, split=[1, 2, 3])
    y = b.op("Concat", parts, axis=1)
    y = b.op("Transpose", [b.op("Transpose", [y], perm=[0, 2, 1, 3])], perm=[0, 2, 1, 3])
    graph, plan = fuse(b.model(y))
    assert [op.op_type for op in plan.regions[0].simplified] == ["Identity"]
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok
    assert kernel.gm_bytes == plan.regions[0].fused.gm_bytes  # read once, written once


def test_the_unfused_baseline_measures_regions_in_parallel(monkeypatch, tmp_path):
    """With --jobs 2 two baseline regions are measured at once, like the kernels: the baseline
    holds most of a cold build's PyPTO compiles. Costs come back by region id, in plan order.
    (No PyPTO here: this is about scheduling only.)"""
    import threading
    from types import SimpleNamespace

    both_running = threading.Barrier(2, timeout=10)

    def cost(region, *_):
        both_running.wait()  # raises BrokenBarrierError if the other region never starts
        return {"a": 1.5, "b": None}[region.id]

    monkeypatch.setattr(measured_baseline, "unfused_cost_us", cost)
    regions = [SimpleNamespace(id="a"), SimpleNamespace(id="b")]
    graph = SimpleNamespace(constant_values=dict)
    costs = measured_baseline.unfused_costs(graph, regions, setup_for(TARGETS["kirin9050"],
                                                                      tmp_path), jobs=2)
    assert list(costs.items()) == [("a", 1.5), ("b", None)]


@pytest.mark.pypto
def test_two_regions_doing_the_same_work_compile_once(tmp_path):
    """Same ops on the same shapes, other tensor names: one cache entry serves both regions,
    for the kernel and for each op of the unfused baseline, even when both are compiled at once
    (the second waits for the first instead of compiling it again)."""
    from tests.onnx_builders import GraphBuilder

    b = GraphBuilder()
    outputs = [b.op("Neg", [b.op("Relu", [b.input(name, [1, 8, 16, 16])])]) for name in "ab"]
    graph, plan = fuse(b.model(*outputs))
    assert len(plan.regions) == 2
    executor = RecordingExecutor()
    target = TARGETS["kirin9050"]
    kernels = compile_kernels(graph, plan, target, cache_dir=tmp_path, jobs=2, search=False,
                              executor=executor)
    jobs = [(job.verify, len(job.candidates)) for _, job, _ in executor.runs]
    assert [k.region_id for k in kernels] == [r.id for r in plan.regions]
    assert all(k.compiled and k.functional_ok for k in kernels)
    assert sorted(k.from_cache for k in kernels) == [False, True]
    assert kernels[0].artifacts == kernels[1].artifacts and kernels[0].source == kernels[1].source
    assert [verify for verify, _ in jobs] == [True]  # one candidate: its checked compile only
    costs = measured_baseline.unfused_costs(graph, plan.regions,
                                            setup_for(target, tmp_path, executor), jobs=2)
    assert len(executor.runs) == 2  # one worker measured Relu and Neg once, for both regions
    (first, second) = costs.values()
    assert first == second and first > 0


def test_regions_checked_with_other_constant_values_do_not_share_a_kernel():
    from pypto_offline.pypto_kernels.compiler import kernel_interface
    from tests.onnx_builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", [4, 8])
    ones, twos = (b.const(np.full([4, 8], v, np.float32)) for v in (1.0, 2.0))
    outputs = [b.op("Relu", [b.op("Add", [x, c])]) for c in (ones, twos, ones)]
    graph, plan = fuse(b.model(*outputs))
    interfaces = [kernel_interface(r, graph.constant_values()) for r in plan.regions]
    assert len(interfaces) == 3
    assert interfaces[0] == interfaces[2] != interfaces[1]


@pytest.mark.pypto
def test_builds_under_one_platform_share_their_compiles_and_other_platforms_do_not(tmp_path):
    """A compile is keyed by its platform (docs/platform.md): kirin9050 compiled as on the 910B
    (``--compare-platform``'s search) finds every compile ascend910b made (search and checked
    final) and ships the same kernel with the same artifacts, running no worker; kirin9050 under
    its own platform compiles anew."""
    graph, plan = fuse(rotary())
    executor = RecordingExecutor()
    kernels = {}
    as_910b = dataclasses.replace(TARGETS["kirin9050"], pypto_platform="910b")
    for name, target in (("ascend910b", TARGETS["ascend910b"]), ("kirin9050@910b", as_910b),
                         ("kirin9050", TARGETS["kirin9050"])):
        before = len(executor.runs)
        (kernels[name],) = compile_kernels(graph, plan, target, cache_dir=tmp_path,
                                           search=False, executor=executor)
        kernels[name] = (kernels[name], [f.name for f, _, _ in executor.runs[before:]])
    (ascend, ascend_jobs), (shared, shared_jobs), (own, own_jobs) = kernels.values()
    # one tile: its checked compile is its search too
    assert ascend_jobs == ["search"] and shared_jobs == [] and own_jobs == ascend_jobs
    assert ascend.compiled and shared.compiled and own.compiled and not shared.from_cache
    assert shared.artifacts == ascend.artifacts and shared.tuned_tile == ascend.tuned_tile
    assert shared.max_abs_diff == ascend.max_abs_diff and shared.verdicts == ascend.verdicts
    # one AI core's worth of vector cores against 48: the same program timed on the chip
    assert own.tuned_tile.aicore_us != ascend.tuned_tile.aicore_us


@pytest.mark.pypto
def test_a_small_region_checks_its_first_round_and_ships_what_a_checked_final_compile_ships(
        monkeypatch, tmp_path):
    """Below ``CHECKED_SEARCH_BYTES`` the first round of the tile search runs pass-verify as it
    compiles, and the tile it picks is shipped from that compile: no final compile, the same
    kernel (tile, figures, verdicts, artifacts) as a search left unchecked followed by a checked
    compile of the chosen tile."""
    graph, plan = fuse(rotary())
    assert search.cheap_to_check(plan.regions[0])
    executor = RecordingExecutor()
    # one job at a time: its candidates compile one after another (each in a child of its own)
    (checked,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path / "a",
                                 jobs=1, executor=executor)
    checked_jobs = [f.name for f, _, _ in executor.runs]
    monkeypatch.setattr(search, "CHECKED_SEARCH_BYTES", 0)
    (unchecked,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path / "b",
                                   executor=executor)
    jobs = [f.name for f, _, _ in executor.runs]
    assert checked_jobs[0] == "search" and "final" not in checked_jobs
    assert jobs[len(checked_jobs):][-1] == "final"
    assert checked.compiled and checked.functional_ok and checked.artifacts
    same = ("tuned_tile", "default_tile", "functional_ok", "max_abs_diff", "verdicts",
            "gm_bytes_read", "gm_bytes_written", "source", "artifacts")
    assert {f: getattr(checked, f) for f in same} == {f: getattr(unchecked, f) for f in same}


@pytest.mark.pypto
def test_a_split_s_source_tiled_within_its_parts_compiles_and_checks(tmp_path):
    """nudenet's SiLU of 1x256x10x10 split into two 128-channel halves: under the tile that
    straddled the halves PyPTO failed (FFFFFF); under one that divides them it compiles and
    passes its check (docs/pypto-ops.md, "Split")."""
    from tests.test_codegen_and_tiling import _silu_split

    graph, plan = _silu_split()
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert kernel.gm_bytes_read == kernel.gm_bytes_written == 256 * 10 * 10 * 4
