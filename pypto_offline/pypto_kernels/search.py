"""A region's tile search: which candidates to compile, in which rounds, which one ships.

The first round compiles the largest budgets (``tiling.search_rounds``); flat-row layouts and
the other transpose orientation follow only when the round's figures say they may win; smaller
budgets only when no large tile fits; PyPTO's leaf merging is capped when no tile fits under
its own. The fastest candidate that fits the target's UB ships, compiled once more with
pass-verify and compared with onnxruntime, unless its round was checked already. Every compile
goes through the compile cache (``entries``): the same source under the same platform compiles
once, whichever region, model or target asks (docs/compile-time.md).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple, dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from pypto_offline.fusion.records import Region
from pypto_offline.pypto_kernels.cache import KernelCache
from pypto_offline.pypto_kernels.codegen import (KERNEL_FUNCTION, itemsize_of, kernel_source,
                                                 region_tolerance)
from pypto_offline.pypto_kernels.entries import (CHOSEN_ARTIFACTS, cached_compile, compile_key,
                                                 store_compile)
from pypto_offline.pypto_kernels.jobs.executor import Executor, run_job
from pypto_offline.pypto_kernels.jobs.protocol import (Candidate, CandidateResult, Failure,
                                                       FailureKind, Job, JobResult)
from pypto_offline.pypto_kernels.records import Kernel, TileResult
from pypto_offline.pypto_kernels.region_data import output_specs, region_data
from pypto_offline.runtime import within_tolerance
from pypto_offline.pypto_kernels.tiling import (MERGE_CAPS, TilePolicy, defer_flat_rows,
                                                defer_swapped, fits_ub, next_flat_rows,
                                                next_swapped, search_rounds)
from pypto_offline.targets import Target

# A region whose largest tensor is at most this size checks the first round of its tile search
# as it compiles it (``search_tiles``), and needs no second, checked compile of the tile it picks.
# Pass-verify interprets the tensor graph and the lowered one tile by tile over the whole
# tensors: on ppocrv4_det's regions (a checked compile against the same candidate unchecked,
# 0.4-1.9 s) it added 0.0 s up to 300 KB, 0.15-0.7 s at 0.6-2.4 MB, 2.5-3.5 s at 4.9-9.8 MB and
# 11 s at 13 MB; tf_swin's (all small) 0.05 s median. Checking a first round of n candidates
# costs n checks instead of one compile more: a gain below ~0.5 MB. docs/compile-time.md.
CHECKED_SEARCH_BYTES = 512 * 1024


@dataclass(frozen=True)
class Setup:
    """What every compile of a build shares: the target, the kernel cache, where jobs run
    (``jobs.executor``) and a job's time limit."""

    target: Target
    cache: KernelCache
    executor: Executor
    timeout: float


@dataclass
class Search:
    """One region's search: its sources by policy, the kernel's cache key and the interface its
    compiles are keyed with, its staging folder, how many processes a job may use, and the
    count of PyPTO compiles it ran (not found in the cache)."""

    region: Region
    setup: Setup
    interface: list
    key: str
    staged: Path
    data: Callable[[], tuple]
    parallel: Callable[[], int]
    compiles: int = 0


def largest_tensor_bytes(region: Region) -> int:
    return max((int(np.prod(shape, dtype=np.int64)) * itemsize_of(dtype)
                for shape, dtype in region.tensor_types.values()), default=0)


def cheap_to_check(region: Region) -> bool:
    return largest_tensor_bytes(region) <= CHECKED_SEARCH_BYTES


def policy_of(candidate: CandidateResult) -> TilePolicy:
    return TilePolicy(candidate.budget, candidate.swapped, candidate.flat, candidate.merge)


def job_candidate(policy: TilePolicy, key: str, source: str) -> Candidate:
    """A tile candidate as the worker takes it: the module travels as text inside the job,
    with a name made of its content key (docs/kernel-cache.md)."""
    return Candidate(policy.budget_bytes, policy.swap_transpose_tiles, policy.flat_rows,
                     policy.vec_merge, f"kernel/{key[:16]}_{policy.name}.py", source)


def search_tiles(region: Region, graph, setup: Setup, constants: dict, interface: list,
           sources: dict[TilePolicy, str], untuned: TilePolicy, key: str, staged: Path,
           parallel: Callable[[], int]) -> tuple[Kernel, bool, int]:
    """The region's kernel (or why not), whether that outcome is transient (a worker that died
    or ran out of time: not cached), and the PyPTO compiles run for it."""
    # onnxruntime's reference, made only when a compile misses the cache (another build under
    # the same platform finds every compile there)
    data = lru_cache(maxsize=1)(lambda: region_data(region, graph, constants))
    state = Search(region, setup, interface, key, staged, data, parallel)
    kernel, transient = _searched(state, constants, sources, untuned)
    return kernel, transient, state.compiles


def _searched(state: Search, constants: dict, sources: dict[TilePolicy, str],
              untuned: TilePolicy) -> tuple[Kernel, bool]:
    region, target, staged = state.region, state.setup.target, state.staged
    ub = target.ub_plan_bytes.value
    tried, searched = _rounds(state, sources, untuned)
    compiled = [c for c in tried if c.compiled and c.aicore_us]
    if compiled and not any(fits_ub(c.ub_bytes, ub) for c in compiled):
        capped = _merge_capped(region, constants, compiled)
        sources = {**sources, **capped}
        searched = _compiled(state, staged / "search-merge", capped, verify=False)
        if not searched.transient:
            tried += [replace(c, checked=False) for c in searched.candidates]
            compiled = [c for c in tried if c.compiled and c.aicore_us]
    fitting = [c for c in compiled if fits_ub(c.ub_bytes, ub)]
    candidates = tuple(_tile(c) for c in tried)

    def fell_back(failure: Failure, source: str) -> Kernel:  # every fallback keeps the search
        return Kernel(region.id, False, failure.reason, source=source, cache_key=state.key,
                      candidates=candidates, fallback_kind=failure.kind)
    if not compiled:
        return fell_back(_failure(searched), _untuned_source(sources, untuned)), searched.transient
    if not fitting:
        least = min((c.ub_bytes or 0 for c in compiled), default=0)
        return fell_back(Failure.of(FailureKind.NO_TILE_FITS,
                                    f" {target.name}'s planned UB of {ub} bytes: the smallest "
                                    f"compiled candidate's leaves need {least}"),
                         _untuned_source(sources, untuned)), False
    best = min(fitting, key=lambda c: (c.aicore_us, c.total_us or 0, astuple(policy_of(c))))
    default = default_candidate(fitting, untuned.budget_bytes)
    chosen = policy_of(best)
    final = JobResult((best,)) if best.checked else \
        _compiled(state, staged / "final", {chosen: sources[chosen]}, verify=True)
    result = final.candidates[0] if final.candidates else None
    if result is None or not result.compiled:
        return fell_back(_failure(final), sources[chosen]), final.transient
    _keep_chosen_artifacts(result, staged / CHOSEN_ARTIFACTS)  # placed by ``save_kernel``
    return _kernel_record(region, sources[chosen], state.key, best, default, result,
                          candidates), False


def _rounds(state: Search, sources: dict[TilePolicy, str], untuned: TilePolicy
            ) -> tuple[list[CandidateResult], JobResult]:
    """Every candidate the search rounds compiled (each marked ``checked`` when its round was),
    and the last round's result."""
    ub = state.setup.target.ub_plan_bytes.value
    first, rest = search_rounds(list(sources), untuned)
    first, flat_later = defer_flat_rows(first)
    first, swapped_later = defer_swapped(first)
    # The first round checked as it compiles, where a check costs little next to a compile:
    # the tile it picks needs no second, checked compile (the cost model times the same
    # program: the same figures). A lone candidate always: one compile instead of two.
    checked_first = cheap_to_check(state.region) or (
        len(first) == 1 and not flat_later and not swapped_later and not rest)
    tried, searched, pending, round_index = [], JobResult(), first, 0
    while pending:
        verify = checked_first and round_index == 0
        searched = _compiled(state, state.staged / f"search{round_index or ''}",
                             {p: sources[p] for p in pending}, verify=verify)
        if verify and len(pending) > 1 and _crashed(searched):
            # a check that kills a candidate's process (PyPTO's interpreter on some tiles:
            # ppocrv4_rec, SIGSEGV) must not cost the region: the round again unchecked, as
            # a large region's, and then a checked compile of the tile it picks only
            verify = checked_first = False
            searched = _compiled(state, state.staged / "search-unchecked",
                                 {p: sources[p] for p in pending}, verify=False)
        if searched.transient:
            break
        tried += [replace(c, checked=verify) for c in searched.candidates]
        round_index += 1
        flat = sorted((c for c in tried if c.flat), key=lambda c: -c.budget)
        pending = next_flat_rows([_measured(c) for c in flat], flat_later, ub)
        flat_later = [p for p in flat_later if p not in pending]
        if swapped_later:  # once, after the own orientation's round
            pending += next_swapped([_measured(c) for c in tried if not c.swapped],
                                    swapped_later, ub)
            swapped_later = []
        if not pending and not any(fits_ub(c.ub_bytes, ub) for c in tried):
            pending, rest = rest, []  # the smaller budgets, only when no large tile fits
    return tried, searched


def _merge_capped(region: Region, constants: dict, compiled: list[CandidateResult]
                  ) -> dict[TilePolicy, str]:
    """The candidate whose leaves need the least UB, with PyPTO's merging of identical vector
    subgraphs capped (``tiling.MERGE_CAPS``): where no tile fits under PyPTO's own merging,
    the leaves' size is the merge's, not the tile's (``TilePolicy.vec_merge``)."""
    smallest = policy_of(min(compiled, key=lambda c: c.ub_bytes or 0))
    return {policy: kernel_source(region, policy, constants)
            for policy in (replace(smallest, vec_merge=cap) for cap in MERGE_CAPS)}


def _crashed(result: JobResult) -> bool:
    """A worker's answer that says its process died (not that it ran out of time)."""
    return result.transient and result.failure.kind is FailureKind.CRASHED


def _measured(candidate: CandidateResult) -> tuple[int, int | None, float | None]:
    """A compiled candidate as the search's next-round rules read it: (budget, UB bytes,
    AICore µs), the time None when it did not compile."""
    return (candidate.budget, candidate.ub_bytes,
            candidate.aicore_us if candidate.compiled else None)


def _compiled(state: Search, folder: Path, sources: dict[TilePolicy, str], *,
              verify: bool) -> JobResult:
    """The worker's answer for each candidate, from the compile cache where it can: the same
    source with the same interface under the same platform compiles to the same program
    whichever region, model or target asks (targets of one platform share their compiles).
    Misses go to one job; their outcomes are stored unless the
    worker died or ran out of time. With ``verify``, the entry also holds the artifacts, put
    back into the kernel's folder from memory on a hit (docs/kernel-cache.md)."""
    setup = state.setup
    keys = {policy: compile_key(text, state.interface, verify, setup.target)
            for policy, text in sources.items()}
    with setup.cache.holding(keys.values()):
        known = {policy: setup.cache.read(keys[policy], cached_compile) for policy in sources}
        missing = {policy: text for policy, text in sources.items() if known[policy] is None}
        result = JobResult()
        if missing:
            state.compiles += len(missing)
            arrays, reference = state.data()
            result = run_region_job(setup, folder, state.region, missing, state.key, arrays,
                                    reference, verify, state.parallel())
            if not result.transient:
                for answer in result.candidates:
                    known[policy_of(answer)] = store_compile(setup.cache,
                                                             keys[policy_of(answer)], answer)
    # a hit's artifacts stay in memory: only the tile the search picks is written out
    hits = tuple(_hit(policy, known[policy]) for policy in sources if policy not in missing)
    return JobResult(hits + result.candidates, result.failure)


def _hit(policy: TilePolicy, entry: dict) -> CandidateResult:
    """A compile entry as the answer its worker gave."""
    tile = {"budget": policy.budget_bytes, "swapped": policy.swap_transpose_tiles,
            "flat": policy.flat_rows, "merge": policy.vec_merge}
    return replace(CandidateResult.from_dict({**tile, **entry["result"]}),
                   artifact_files=entry["artifacts"] or None)


def run_region_job(setup: Setup, folder: Path, region: Region, sources: dict[TilePolicy, str],
                   key: str, arrays, reference, verify: bool, parallel: int = 1,
                   original_reference: bool = False,
                   saturated_outputs: tuple[int, ...] = (),
                   save_outputs: bool = False) -> JobResult:
    """One job compiling ``sources`` of the region (its data written into ``folder``);
    ``original_reference``, ``saturated_outputs`` and ``save_outputs``: ``Job``'s."""
    folder.mkdir(parents=True)
    np.savez(folder / "inputs.npz", **{f"in{i}": a for i, a in enumerate(arrays)})
    np.savez(folder / "reference.npz", **{f"out{i}": a for i, a in enumerate(reference)})
    job = Job(KERNEL_FUNCTION, verify,
              tuple(job_candidate(p, key, text) for p, text in sources.items()),
              output_specs(region), parallel, cache_group=setup.cache.trust.group,
              original_reference=original_reference, saturated_outputs=saturated_outputs,
              save_outputs=save_outputs)
    return run_job(setup.executor, folder, job, setup.target, setup.timeout)


def _keep_chosen_artifacts(result: CandidateResult, target: Path) -> None:
    """The shipped compile's artifacts into ``target``: the worker's folder for a compile run
    now (``artifacts``), the cached files for a hit (``artifact_files``)."""
    if result.artifacts:
        Path(result.artifacts).rename(target)
    for name, data in (result.artifact_files or {}).items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def default_candidate(fitting: list[CandidateResult], default_budget: int
                      ) -> CandidateResult | None:
    """What an untuned build would run: the default budget in the default orientation and
    layout, or when its leaves overflow the target's UB, the largest smaller budget that fits."""
    smaller = [c for c in fitting
               if c.budget <= default_budget and policy_of(c) == TilePolicy(c.budget)]
    return max(smaller, key=lambda c: c.budget, default=None)


def _kernel_record(region, source, key, best, default, result: CandidateResult,
                   candidates) -> Kernel:
    verdicts = tuple((v["pass"], v["result"]) for v in result.verdicts or ())
    tolerance = region_tolerance(region)
    diff = result.max_abs_diff
    functional_ok = bool(verdicts) and all(v == "PASS" for _, v in verdicts) and \
        diff is not None and within_tolerance(diff, tolerance, result.magnitude or 0.0)
    failure = None if functional_ok else Failure.of(
        FailureKind.CHECK_FAILED, f" (max abs diff {diff}, passes "
                                  f"{[p for p, v in verdicts if v != 'PASS'] or 'none recorded'})")
    traffic = result.gm_bytes or {"read": 0, "written": 0}
    return Kernel(
        region.id, functional_ok, failure and failure.reason, source=source, cache_key=key,
        default_tile=_tile(default), tuned_tile=_tile(best),
        gm_bytes_read=traffic["read"], gm_bytes_written=traffic["written"],
        functional_ok=functional_ok, max_abs_diff=diff, verdicts=verdicts, candidates=candidates,
        fallback_kind=failure and failure.kind)


def _tile(candidate: CandidateResult | None) -> TileResult | None:
    """A candidate of the search as a kernel keeps it: its figures when it compiled."""
    if candidate is None:
        return None
    policy, compiled = policy_of(candidate), candidate.compiled
    return TileResult(policy.budget_bytes, candidate.aicore_us if compiled else None,
                      candidate.total_us if compiled else None, candidate.tasks or 0,
                      candidate.ub_bytes, policy.swap_transpose_tiles, policy.flat_rows,
                      policy.vec_merge, None if compiled else candidate.error)


def _failure(result: JobResult) -> Failure:
    if result.failure is not None:
        return result.failure
    errors = [c.error for c in result.candidates if c.error]
    return Failure.of(FailureKind.COMPILE_FAILED,
                      f": {errors[0] if errors else 'no candidate compiled'}")


def _untuned_source(sources: dict, untuned: TilePolicy) -> str:
    """The default tile's source; where another policy wrote the same text first, that one's
    (``distinct_sources`` keeps each text once)."""
    return sources.get(untuned) or next(iter(sources.values()))
