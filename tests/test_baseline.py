"""The unfused baseline (docs/baseline.md): a default build estimates it from the shipped fit and
compiles nothing for it; --measure-baseline compiles each op alone, cached per op; the blob, the
JSON and the report say which figure they hold."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pypto_offline import api
from pypto_offline.pypto_kernels import baseline
from pypto_offline.pypto_kernels.platform import platform_of
from pypto_offline.report.content import summary_figures
from pypto_offline.targets import TARGETS
from tests.onnx_builders import GraphBuilder


def scaled_sum():
    """One region of two elementwise ops on a small tensor (few tile candidates per op)."""
    b = GraphBuilder()
    x = b.input("x", [1, 2, 16, 16])
    total = b.op("Add", [x, b.const(np.linspace(-1, 1, 512, dtype=np.float32).reshape(
        1, 2, 16, 16))])
    return b.model(b.op("Mul", [total, b.const(np.float32(0.5))]))


def _entries(cache) -> list[dict]:
    """The records of the cache's kernel and op cost entries (each kind's own file)."""
    return [json.loads(path.read_text()) for name in ("kernel.json", "op_cost.json")
            for path in sorted(cache.glob(f"*/*/{name}"))]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The model built twice on one cache: by default, then with --measure-baseline; the cache's
    records after each."""
    cache = tmp_path_factory.mktemp("baseline") / "cache"
    estimated = api.compile(scaled_sum(), "kirin9050", cache_dir=cache)
    after_default = _entries(cache)
    measured = api.compile(scaled_sum(), "kirin9050", cache_dir=cache, measure_baseline=True)
    return estimated, after_default, measured, _entries(cache)


@pytest.mark.pypto
def test_a_default_build_compiles_nothing_for_the_baseline(both):
    estimated, after_default, _, _ = both
    assert estimated.summary()["pypto"]["compiled"] == 1
    assert [e for e in after_default if "unfused_us" in e] == []  # no op was compiled alone
    assert estimated.summary()["pypto"]["cost_us_unfused_basis"] == baseline.ESTIMATED
    assert estimated.message.provenance.options["baseline"] == baseline.ESTIMATED


@pytest.mark.pypto
def test_the_estimate_is_the_shipped_fit_of_the_regions_ops(both):
    estimated = both[0]
    (kernel,) = estimated.message.kernels
    family = baseline.cost_model_family(platform_of(TARGETS["kirin9050"]))  # its own machine
    fit = baseline.shipped_fit()["families"][family]["elementwise"]
    read_kib = 2 * 512 * 4 / 1024  # Add: x and the 512-float constant; Mul: its input
    moved = [read_kib + 2, 2 + 2]  # (the scalar is an immediate), each writing 2 KiB
    expected = sum(fit[0] + fit[1] * kib for kib in moved)
    assert kernel.cost_us_unfused == pytest.approx(expected, abs=1e-3)
    assert kernel.cost_us_unfused_basis == baseline.ESTIMATED
    assert estimated.message.totals.cost_us_unfused == pytest.approx(expected, abs=1e-3)


@pytest.mark.pypto
def test_measure_baseline_compiles_each_op_once_into_the_shared_cache(both):
    _, _, measured, after_measured = both
    ops = [e for e in after_measured if "unfused_us" in e]
    assert len(ops) == 2 and all(e["unfused_us"] > 0 for e in ops)  # Add and Mul, each alone
    pypto = measured.summary()["pypto"]
    assert pypto["cost_us_unfused_basis"] == baseline.MEASURED
    assert pypto["cost_us_unfused"] == pytest.approx(sum(e["unfused_us"] for e in ops), abs=1e-3)
    assert measured.message.provenance.options["baseline"] == baseline.MEASURED


@pytest.mark.pypto
def test_the_baseline_choice_does_not_change_the_kernel_shipped(both):
    estimated, _, measured, _ = both
    (a,), (b,) = estimated.message.kernels, measured.message.kernels
    assert a.source == b.source and list(a.artifacts) == list(b.artifacts)


@pytest.mark.pypto
def test_the_report_marks_an_estimated_baseline_as_an_estimate(both):
    estimated, _, measured, _ = both
    for compiled, is_estimate in ((estimated, True), (measured, False)):
        figures = {f.key: f for f in summary_figures(compiled.summary())}
        assert figures["pypto.cost_us_unfused"].estimate is is_estimate
        assert figures["pypto.cost_us_unfused_basis"].text == \
            compiled.summary()["pypto"]["cost_us_unfused_basis"]


def test_the_shipped_fit_covers_every_target_and_op_class():
    fit = baseline.shipped_fit()
    for target in TARGETS:
        family = baseline.cost_model_family(platform_of(TARGETS[target]))
        for name in baseline.OP_CLASSES:
            intercept, per_kib = fit["families"][family][name]
            assert intercept >= 0 and per_kib >= 0 and intercept + per_kib > 0
    assert fit["errors"] and len(fit["provenance"]["models"]) >= 3  # measured, on real models


def test_the_fit_recovers_a_line_and_never_lets_more_bytes_cost_less():
    samples = [("data", kib) for kib in (1.0, 4.0, 16.0, 64.0)]
    line = baseline.fit_family(samples, [2.0 + 0.5 * kib for _, kib in samples])
    assert line["data"] == pytest.approx([2.0, 0.5], abs=1e-6)
    falling = baseline.fit_family(samples, [9.0, 8.0, 7.0, 6.0])
    assert falling["data"][1] == 0.0 and falling["data"][0] > 0


def test_the_cost_model_drops_a_kernel_slower_than_its_ops_unfused():
    """The arbiter (offline_compiler/build.py): the launches fusing saves are counted, and a
    kernel is kept exactly while its time is within its ops' time plus those launches."""
    from types import SimpleNamespace

    from pypto_offline.offline_compiler.build import Baseline, slower_than_unfused
    from pypto_offline.pypto_kernels.records import Kernel, TileResult
    from pypto_offline.targets import TARGETS

    target = TARGETS["kirin9050"]
    launch = target.launch_overhead_us.value
    regions = {"r": SimpleNamespace(unfused=SimpleNamespace(kernels=3))}

    def verdict(fused_us: float, unfused_us: float | None):
        kernel = Kernel("r", True, tuned_tile=TileResult(4096, fused_us, fused_us + 5, 8))
        return slower_than_unfused([kernel], regions, Baseline({"r": unfused_us},
                                                               baseline.MEASURED), target)

    assert verdict(10.0 + 2 * launch, 10.0) == {}
    (why,) = verdict(10.01 + 2 * launch, 10.0).values()
    assert why.startswith("slower fused") and "measured" in why
    assert verdict(1000.0, None) == {}  # no baseline (a matmul's estimate): nothing to judge


def test_a_kernel_that_moves_more_than_its_ops_is_judged_on_its_ops_measured():
    """A build that estimates measures the ops of a kernel that moves more bytes than they
    would unfused (offline_compiler/build.py, ``moves_more_than_its_ops``): that kernel is
    judged, and labelled, on the measured figure, and one whose ops PyPTO could not time alone
    does not ship; the others keep the estimate."""
    from types import SimpleNamespace

    from pypto_offline.offline_compiler.build import (Baseline, moves_more_than_its_ops,
                                                      slower_than_unfused)
    from pypto_offline.pypto_kernels.records import Kernel, TileResult

    target = TARGETS["kirin9050"]
    regions = {name: SimpleNamespace(unfused=SimpleNamespace(kernels=2, gm_bytes=1000))
               for name in ("up", "even", "untimed")}
    kernels = [Kernel(name, True, tuned_tile=TileResult(4096, 50.0, 55.0, 8),
                      gm_bytes_read=900, gm_bytes_written=read)
               for name, read in (("up", 101), ("even", 100), ("untimed", 500))]
    assert [moves_more_than_its_ops(k, regions[k.region_id]) for k in kernels] == \
        [True, False, True]
    judged = Baseline({"up": 10.0, "even": 10.0}, baseline.ESTIMATED, frozenset({"up"}),
                      frozenset({"untimed"}))
    assert [judged.basis_of(k.region_id) for k in kernels] == \
        [baseline.MEASURED, baseline.ESTIMATED, baseline.ESTIMATED]
    slower = slower_than_unfused(kernels, regions, judged, target)
    assert slower["up"].endswith("(measured)") and slower["even"].endswith("(estimated)")
    assert "more than its ops' 1000 B unfused" in slower["untimed"]


def test_a_pooling_op_alone_is_simplified_as_in_its_region_so_it_can_be_measured():
    """Found on nudenet's SPPF (Conv, SiLU, three MaxPools, Concat): each MaxPool alone was
    refused ("no PyPTO lowering for MaxPool"), so the kernel, which moves more bytes than its
    ops, could not be measured against them. Alone, an op is simplified as its region is."""
    from pypto_offline.pypto_kernels.codegen import kernel_source
    from pypto_offline.pypto_kernels.tiling import default_policy
    from tests.fusion_helpers import fuse

    b = GraphBuilder()
    pooled = b.op("MaxPool", [b.op("Relu", [b.input("x", [1, 8, 16, 16])])],
                  kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    graph, plan = fuse(b.model(b.op("Concat", [pooled, pooled], axis=1)))
    (region,) = plan.regions
    singles = {single.original[0].op_type: single
               for single in baseline.single_op_regions(region, graph)}
    pool = singles["MaxPool"]
    assert "MaxPool" not in {op.op_type for op in pool.simplified} and pool.rules_applied
    source = kernel_source(pool, default_policy(TARGETS["kirin9050"].ub_plan_bytes.value),
                           graph.constant_values())
    assert "pypto.maximum" in source
