"""Compile every fused region with the real PyPTO, in fresh worker processes, through the cache.

Per region:
1. generate the kernel source for every tile candidate;
2. look the key up in the cache (a warm rebuild stops here);
3. search the tiles (``search``): each round one job, compiled by the build's executor
   (``jobs/``), every compile through the compile cache;
4. the fastest that fits ships, compiled with pass-verify and compared with onnxruntime running
   the region's original ops.
A region whose kernel cannot be written, crashes, times out or fails its check falls back to
unfused ops, with the reason and its kind. Only deterministic outcomes are cached: a worker that
dies or runs out of time says nothing about the kernel, so the next build tries again
(docs/kernel-cache.md). A worker that cannot even start, or an interrupted build, ends the
build instead: the worker processes belong to their build (docs/workers.md).
"""
from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from pypto_offline.fusion.records import FusionPlan, Region
from pypto_offline.importer import ImportedGraph
from pypto_offline.progress import SILENT, Progress
from pypto_offline.pypto_kernels.cache import KernelCache
from pypto_offline.pypto_kernels.cache_trust import Trust
from pypto_offline.pypto_kernels.codegen import (CannotExpress, flat_rows_change_the_tiling,
                                                 is_scalar_constant, kernel_source)
from pypto_offline.pypto_kernels.entries import (cached_kernel, kernel_key, load_kernel,
                                                 save_kernel)
from pypto_offline.pypto_kernels.jobs import pool
from pypto_offline.pypto_kernels.jobs.executor import (Executor, LocalExecutor,
                                                       noticing_first_build)
from pypto_offline.pypto_kernels.jobs.protocol import Failure, FailureKind
from pypto_offline.pypto_kernels.records import Kernel
from pypto_offline.pypto_kernels.search import Setup, largest_tensor_bytes, search_tiles
from pypto_offline.pypto_kernels.tiling import TilePolicy, candidate_policies, default_policy
from pypto_offline.pypto_kernels.versions import DEFAULT_TIMEOUT_S, PYPTO_VERSION
from pypto_offline.targets import Target

__all__ = ["compile_kernels", "compile_region", "compile_regions", "distinct_sources",
           "kernel_interface", "setup_for"]


def setup_for(target: Target, cache_dir: Path | None = None, executor: Executor | None = None,
              timeout: float = DEFAULT_TIMEOUT_S, cache_trust: Trust | None = None) -> Setup:
    """What a build's compiles share: by default the local fork servers and the user's cache
    (trusting what ``cache_trust`` says: docs/kernel-cache.md, "The trust rule")."""
    return Setup(target, KernelCache(cache_dir, cache_trust), executor or LocalExecutor(),
                 timeout)


def compile_kernels(graph: ImportedGraph, plan: FusionPlan, target: Target, *,
                    cache_dir: Path | None = None, jobs: int = 2, search: bool = True,
                    timeout: float = DEFAULT_TIMEOUT_S, progress: Progress = SILENT,
                    executor: Executor | None = None, cache_trust: Trust | None = None
                    ) -> list[Kernel]:
    return compile_regions([(region, graph) for region in plan.regions],
                           setup_for(target, cache_dir, executor, timeout, cache_trust),
                           jobs=jobs, search=search, progress=progress)


def compile_regions(work: Sequence[tuple[Region, ImportedGraph]], setup: Setup, *,
                    jobs: int = 2, search: bool = True, progress: Progress = SILENT
                    ) -> list[Kernel]:
    """The kernel of each region, in order, the regions of any graphs (each with the graph it
    is in) compiled by one pool of ``jobs`` threads and one cache."""
    constants = {id(graph): graph.constant_values() for _, graph in work}
    graph_of = {id(region): graph for region, graph in work}
    regions = [region for region, _ in work]
    said = threading.Lock()  # one line at a time on ``progress``, from any pool thread
    reported = _reporting(progress, len(regions), said)
    setup = replace(setup, executor=noticing_first_build(setup.executor,
                                                         _saying(progress, said)))
    spare = pool.SpareThreads(jobs, len(regions))

    def compile_one(region: Region) -> Kernel:
        graph = graph_of[id(region)]
        return spare.done(reported(region, compile_region(
            region, graph, setup, constants[id(graph)], search=search, parallel=spare.share)))
    return pool.each(regions, jobs, compile_one, order=compile_order(
        regions, [constants[id(graph_of[id(region)])] for region in regions]))


def compile_order(regions: Sequence[Region], constants: Sequence[dict]) -> list[int]:
    """The order the pool threads take the regions in (results stay in region order): one
    region of each kind of work first, the biggest first (largest tensor x ops, a proxy of its
    compile time), so the long compiles do not start last; the regions doing the same work
    after them, as cache hits. Taken in region order, ppocrv4_det's 9 identical HardSwish
    regions stood next to each other, and the second thread waited on the first one's compile
    (``KernelCache.holding``) instead of compiling something else. A guess only: two regions
    taken for the same kind here still compile separately if their sources differ.
    ``constants``: those of each region's graph."""
    kinds: dict[str, int] = {}
    first, repeats = [], []
    for index, (region, known) in enumerate(zip(regions, constants)):
        kind = repr((kernel_interface(region, known),
                     [(op.op_type, op.params) for op in region.simplified]))
        (repeats if kind in kinds else first).append(index)
        kinds.setdefault(kind, index)
    work = {i: largest_tensor_bytes(regions[i]) * len(regions[i].simplified) for i in first}
    return sorted(first, key=lambda i: -work[i]) + repeats


def _saying(progress: Progress, lock: threading.Lock) -> Callable[[str], None]:
    """``progress.stage`` from a pool thread, under the lock finished kernels are reported
    under."""
    def say(stage: str) -> None:
        with lock:
            progress.stage(stage)
    return say


def _reporting(progress: Progress, total: int, lock: threading.Lock):
    """A pool thread's hand-over of a finished kernel to ``progress``: counted and reported
    under one lock, so the numbers follow completion order and no two lines interleave."""
    done = 0

    def report(region: Region, kernel: Kernel) -> Kernel:
        nonlocal done
        with lock:
            done += 1
            progress.kernel(done, total, region, kernel)
        return kernel
    return report


def compile_region(region: Region, graph: ImportedGraph, setup: Setup, constants: dict, *,
                   search: bool = True, parallel: Callable[[], int] = lambda: 1) -> Kernel:
    started = time.perf_counter()
    ub = setup.target.ub_plan_bytes.value
    default = default_policy(ub)
    policies = candidate_policies(ub, largest_tensor_bytes(region)) if search else [default]
    try:
        sources = distinct_sources(region, policies, constants)
    except CannotExpress as why:
        failure = Failure.of(FailureKind.CANNOT_EXPRESS, f" in PyPTO {PYPTO_VERSION}: {why}")
        return Kernel(region.id, False, failure.reason, fallback_kind=failure.kind)
    interface = kernel_interface(region, constants)
    key = kernel_key(sources, interface, setup.target, default.budget_bytes)
    cache = setup.cache
    with cache.holding([key]):
        hit = cache.read(key, lambda files: cached_kernel(
            files, region.id, key, sources, partial(_source_of, region, constants, sources)))
        if hit is not None:
            return hit
        staged = cache.staging()
        try:
            kernel, transient, compiles = search_tiles(region, graph, setup, constants,
                                                       interface, sources, default, key,
                                                       staged, parallel)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        kernel = replace(kernel, compile_seconds=round(time.perf_counter() - started, 3),
                         pypto_compiles=compiles)
        if transient:  # this build falls back; the next one tries again
            shutil.rmtree(staged, ignore_errors=True)
            return kernel
        save_kernel(kernel, staged)
        return replace(load_kernel(cache.put(key, staged), region.id, from_cache=False),
                       pypto_compiles=compiles)


def _source_of(region: Region, constants: dict, sources: dict[TilePolicy, str],
               policy: TilePolicy) -> str | None:
    """The module this build would compile for ``policy``: a searched tile's, or a leaf merge
    cap of one (``search._merge_capped``); None for any other."""
    if policy.vec_merge:
        return kernel_source(region, policy, constants) \
            if replace(policy, vec_merge=0) in sources else None
    return sources.get(policy)


def kernel_interface(region: Region, constants: dict) -> list:
    """What a kernel's cache key needs besides its source: the types of its inputs and outputs
    by position, and the content of the constant arrays it is checked with (tensor names left
    out, so two regions doing the same work share one entry). The functional check's other
    inputs are seeded from these types, so the shared entry's check is the one each would run."""
    def described(tensor: str) -> list:
        shape, dtype = region.tensor_types[tensor]
        if tensor in constants and not is_scalar_constant(tensor, constants):
            value = np.ascontiguousarray(constants[tensor])
            return [list(shape), dtype, hashlib.sha256(value.tobytes()).hexdigest()]
        return [list(shape), dtype]
    return [[described(t) for t in region.inputs], [described(t) for t in region.outputs]]


def distinct_sources(region: Region, policies: list[TilePolicy], constants: dict
                     ) -> dict[TilePolicy, str]:
    """Each policy's module, less those another policy already gives (a region without a
    transpose reads the same in both transpose-tile orientations) and flat-row layouts that tile
    the region as its own shapes do (``flat_rows_change_the_tiling``): one compile each."""
    sources: dict[TilePolicy, str] = {}
    for policy in policies:
        if policy.flat_rows and not flat_rows_change_the_tiling(region, policy, constants):
            continue
        text = kernel_source(region, policy, constants)
        if text not in sources.values():
            sources[policy] = text
    return sources
