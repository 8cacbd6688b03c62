"""The measured unfused baseline (``--measure-baseline``, docs/baseline.md): each op of a
region compiled alone at its best tile, its PyPTO cost-model time the figure a fused kernel is
compared with. A default build estimates it instead (``baseline.py``)."""
from __future__ import annotations

import shutil
from collections.abc import Sequence

import numpy as np

from pypto_offline.fusion.records import Region
from pypto_offline.importer import ImportedGraph
from pypto_offline.pypto_kernels.baseline import single_op_regions
from pypto_offline.pypto_kernels.codegen import KERNEL_FUNCTION, CannotExpress
from pypto_offline.pypto_kernels.compiler import distinct_sources, kernel_interface
from pypto_offline.pypto_kernels.entries import cached_op_cost, op_cost_key, store_op_cost
from pypto_offline.pypto_kernels.jobs import pool
from pypto_offline.pypto_kernels.jobs.executor import run_job
from pypto_offline.pypto_kernels.jobs.protocol import Candidate, Job
from pypto_offline.pypto_kernels.region_data import output_specs, region_data
from pypto_offline.pypto_kernels.search import Setup, job_candidate, largest_tensor_bytes
from pypto_offline.pypto_kernels.tiling import candidate_policies, fits_ub


def unfused_costs(graph: ImportedGraph, regions: Sequence[Region], setup: Setup, jobs: int = 2
                  ) -> dict[str, float | None]:
    """``unfused_cost_us`` of each region, by region id, on ``jobs`` parallel compiles like
    the kernels themselves: the baseline holds most of a cold build's PyPTO compiles."""
    constants = graph.constant_values()
    costs = pool.each(regions, jobs, lambda region: unfused_cost_us(
        region, graph, setup, constants))
    return {region.id: cost for region, cost in zip(regions, costs)}


def unfused_cost_us(region: Region, graph: ImportedGraph, setup: Setup, constants: dict
                    ) -> float | None:
    """PyPTO cost-model time of the region's ops as one kernel each (reshape-likes are free),
    each at its best tile. None when an op did not compile."""
    costs = [us for _, us in single_op_costs(region, graph, setup, constants)]
    return None if None in costs else sum(costs)


def single_op_costs(region: Region, graph: ImportedGraph, setup: Setup, constants: dict
                    ) -> list[tuple[Region, float | None]]:
    """Each device op of the region as a kernel of its own, with its cost-model time at its best
    tile (None: no tile compiled, or the op cannot be written). Cost only, no check. Each op's
    time is cached on its own, so an op that recurs (the same op on the same shapes in another
    region or model) is compiled once; the region's other ops share one worker process."""
    singles = single_op_regions(region, graph)
    if not singles:
        return []
    ub = setup.target.ub_plan_bytes.value
    sources, keys = {}, {}
    for single in singles:
        try:
            sources[single.id] = distinct_sources(
                single, candidate_policies(ub, largest_tensor_bytes(single)), constants)
        except CannotExpress:
            continue
        keys[single.id] = op_cost_key(sources[single.id], kernel_interface(single, constants),
                                      setup.target)
    cache = setup.cache
    with cache.holding(keys.values()):
        known = {}
        for single in singles:
            if single.id not in keys:
                continue
            record = cache.read(keys[single.id], lambda files, texts=sources[single.id]:
                                cached_op_cost(files, texts))
            if record is not None:
                known[keys[single.id]] = record["unfused_us"]
        missing = {keys[s.id]: s for s in singles if s.id in keys and keys[s.id] not in known}
        if missing:
            known.update(_measure_single_ops(missing, sources, graph, setup, constants))
    return [(s, known[keys[s.id]] if s.id in keys else None) for s in singles]


def _measure_single_ops(singles: dict[str, Region], sources: dict, graph: ImportedGraph,
                        setup: Setup, constants: dict) -> dict[str, float | None]:
    """Compile each op (by cache key) at each of its tiles in one worker process: its best time
    that fits the target's UB, or None when none compiled. Cached unless the worker died or
    ran out of time (then None for this build only)."""
    staged = setup.cache.staging()
    try:
        folder = staged / "unfused"
        folder.mkdir()
        arrays, candidates = {}, []
        for key, single in sorted(singles.items()):
            data, _ = region_data(single, graph, constants)
            names = [f"{key[:16]}_in{i}" for i in range(len(data))]
            arrays.update(zip(names, data))
            for policy, text in sources[single.id].items():
                candidate = job_candidate(policy, key, text)
                candidates.append(Candidate(**{**candidate.__dict__, "function": KERNEL_FUNCTION,
                                               "op": key, "inputs": tuple(names),
                                               "outputs": output_specs(single)}))
        np.savez(folder / "inputs.npz", **arrays)
        job = Job(KERNEL_FUNCTION, False, tuple(candidates), cache_group=setup.cache.trust.group)
        result = run_job(setup.executor, folder, job, setup.target, setup.timeout)
        best = {key: None for key in singles}
        ub = setup.target.ub_plan_bytes.value
        for c in result.candidates:
            if c.compiled and c.aicore_us and fits_ub(c.ub_bytes, ub):
                best[c.op] = min(best[c.op] or float("inf"), c.aicore_us)
        if result.transient:
            return best
        for key, us in best.items():
            store_op_cost(setup.cache, key, us, sources[singles[key].id])
        return best
    finally:
        shutil.rmtree(staged, ignore_errors=True)
