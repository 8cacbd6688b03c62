"""The fork server (docs/workers.md): one process imports torch and pypto once and forks a child
per job. A failed compile leaves a PyPTO process unusable, so it must die with its child; a job
that runs out of time loses its whole process group, and the server serves on.

Real PyPTO throughout, on the tiny Relu→Neg kernel (1x8x16x16 fp32), all jobs of a test in one
pool thread of one build, so that they share one server; and the worker's garbage collection
around its jobs (the last two tests)."""
from __future__ import annotations

import gc
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from pypto_offline.pypto_kernels import program_figures, tiling
from pypto_offline.pypto_kernels.cache import STAGING, KernelCache
from pypto_offline.pypto_kernels.codegen import KERNEL_FUNCTION, kernel_source
from pypto_offline.pypto_kernels.compiler import compile_region, distinct_sources, setup_for
from pypto_offline.pypto_kernels.jobs import pool
from pypto_offline.pypto_kernels.jobs.executor import LocalExecutor, run_job
from pypto_offline.pypto_kernels.jobs.protocol import (STARTED_MARKER, WORK, WORKSPACE_CHARS,
                                                       PAD, Job, JobResult, timed_out)
from pypto_offline.pypto_kernels.region_data import output_specs, region_data
from pypto_offline.pypto_kernels.search import (job_candidate, largest_tensor_bytes,
                                                run_region_job)
from pypto_offline.targets import TARGETS

from tests.fusion_helpers import fuse
from tests.onnx_builders import GraphBuilder

TARGET = TARGETS["kirin9050"]
# Fails inside PyPTO's frontend (RenderedParserError F21004 on 0.2.0) once it has entered the
# kernel function: the process that ran it cannot compile another kernel.
BROKEN = ("    t2 = pypto.neg(t1)\n",
          "    t2 = pypto.add(t1, pypto.view(t1, [1, 8, 8, 16], [0, 0, 0, 0]))\n")
# Appended to the kernel's module, run as the job loads it: starts a process (the job's own
# child, as PyPTO's g++ would be) that writes its pid, then hangs, as a compile that never ends.
# The hanging job's time limit: from the hand-over to a started server, whose child reaches the
# hang and starts its own child at once (0.05 s, tests/test_trust_signals.py TIME_LIMIT_S); the
# test checks both happened. 20 s before: 15 s of waiting for nothing.
HANG_LIMIT_S = 5
HANGING = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import os, time; "
                  "open('grandchild.tmp', 'w').write(str(os.getpid())); "
                  "os.rename('grandchild.tmp', 'grandchild.pid'); time.sleep(300)"])
time.sleep(300)
"""

# Appended to the kernel's module, run as the job's child loads it: what the child's garbage
# collector will never walk (the objects the server froze before forking).
FROZEN_PROBE = """
import gc
open("frozen.txt", "w").write(str(gc.get_freeze_count()))
"""


def tiny_job(edit: tuple[str, str] | None = None, append: str = "") -> tuple[Job, list]:
    """A search job (no check) of the Relu→Neg region at its default tile, its kernel text
    edited by ``edit`` (old, new) and ``append``, and the job's input arrays."""
    b = GraphBuilder()
    graph, plan = fuse(b.model(b.op("Neg", [b.op("Relu", [b.input("x", [1, 8, 16, 16])])])))
    (region,) = plan.regions
    policy = tiling.default_policy(TARGET.ub_plan_bytes.value)
    source = kernel_source(region, policy, graph.constant_values())
    if edit:
        assert edit[0] in source, "the generator's kernel text changed: update the edit"
        source = source.replace(*edit)
    source += append
    arrays, _ = region_data(region, graph, graph.constant_values())
    return (Job(KERNEL_FUNCTION, False, (job_candidate(policy, "0" * 64, source),),
                output_specs(region)), arrays)


SECONDS: list[float] = []


def run_jobs(cache_dir: Path, jobs: list[tuple[Job, list]], timeout: float = 300,
             target=TARGET) -> list[tuple[JobResult, Path, int]]:
    """``run_jobs_here`` in one pool thread of one build."""
    (done,) = pool.each([None], 1, lambda _: run_jobs_here(cache_dir, jobs, timeout, target))
    return done


def run_jobs_here(cache_dir: Path, jobs: list[tuple[Job, list]], timeout: float = 300,
                  target=TARGET) -> list[tuple[JobResult, Path, int]]:
    """Each job through the local executor (``run_job``), in order, in this pool thread: its
    result, its folder, and the pid of the fork server that ran it. ``run_job``'s wall time of
    each is in ``SECONDS`` (as docs/workers.md measured the per-job overhead)."""
    cache, done = KernelCache(cache_dir), []
    for job, arrays in jobs:
        folder = cache.staging() / "job"
        folder.mkdir()
        np.savez(folder / "inputs.npz", **{f"in{i}": a for i, a in enumerate(arrays)})
        started = time.perf_counter()
        result = run_job(LocalExecutor(), folder, job, target, timeout)
        SECONDS.append(time.perf_counter() - started)
        with pool.current_workers() as workers:
            (server,) = workers.servers()
        done.append((result, folder, server.process.pid))
    return done


def written(folder: Path, name: str) -> Path:
    """A file the job's first candidate wrote in its working folder (its current folder)."""
    (path,) = (folder / WORK).glob(f"c0*/**/{name}")
    return path


def compiled(result: JobResult) -> bool:
    return result.failure is None and all(c.compiled for c in result.candidates)


@pytest.mark.pypto
def test_a_failed_compile_does_not_poison_the_next_job_in_the_same_server(tmp_path):
    broken, good = tiny_job(BROKEN), tiny_job()
    # the hazard: the two kernels as candidates of one job, the good one after the failed one;
    # the job's child stops at the failure, and the good one runs in a child of its own
    # (compiled in the failed one's process, it failed: "function nested is not allowed")
    both = Job(**{**good[0].__dict__, "candidates": broken[0].candidates + good[0].candidates})
    ((one_job, _, _),) = run_jobs(tmp_path / "one-job", [(both, good[1])])
    assert [c.compiled for c in one_job.candidates] == [False, True], one_job
    # the fork server: each job in a child of its own, so the failure dies with its child
    (failed, _, first), (then, _, second) = run_jobs(tmp_path / "server", [broken, good])
    assert not failed.candidates[0].compiled and not failed.transient, failed
    assert compiled(then), then
    assert first == second, "the two jobs did not run in the same server"


def live(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.pypto
def test_a_timed_out_job_loses_its_process_group_and_the_server_serves_the_next(tmp_path):
    started = time.monotonic()
    (hung, folder, first), (then, _, second) = run_jobs(
        tmp_path, [tiny_job(append=HANGING), tiny_job()], timeout=HANG_LIMIT_S)
    assert hung == JobResult.failed(timed_out(HANG_LIMIT_S)), hung
    assert (folder / STARTED_MARKER).exists(), "the job never reached its kernel"
    grandchild = int(written(folder, "grandchild.pid").read_text())
    assert not live(grandchild), "the timed-out job's own child runs on"
    assert compiled(then), then
    assert first == second, "the server did not survive the time-out"
    assert time.monotonic() - started < 200


@pytest.mark.pypto
def test_the_servers_are_gone_when_the_build_is(tmp_path):
    """After ``pool.each``: no server process, no server folder in the staging area."""
    ((result, folder, server),) = run_jobs(tmp_path, [tiny_job()])
    assert compiled(result), result
    assert not live(server) and not servers_running(tmp_path), "a fork server outlived its build"
    assert [p.name for p in (tmp_path / STAGING).iterdir()] == [folder.parent.name]


@pytest.mark.pypto
def test_every_child_writes_its_pypto_side_files_into_its_job_folder(tmp_path):
    """PyPTO reads its config and log folder at import: one server per cost-model config, whose
    log folder the child points at its job's folder; the run data folder (read per compile)
    goes into the compile's working folder there, whose path has one length. A 910B build and
    an ascend950 one (A5 cost tables) in turn."""
    times = {}
    for target in ("kirin9050", "ascend950"):
        ((result, folder, _),) = run_jobs(tmp_path / target, [tiny_job()],
                                          target=TARGETS[target])
        assert compiled(result), result
        (rundata,) = (folder / WORK).glob("c0*/**/pypto_home/run/*/rundata.json")
        assert len(str(rundata.parents[3])) == WORKSPACE_CHARS, rundata
        assert (folder / "ascend_log").is_dir() and not (folder / "ascend_log").is_symlink()
        config = (folder / "tile_fwk_config.json").read_text()
        assert ("Model.deviceArch=A5" in config) == (target == "ascend950")
        times[target] = result.candidates[0].aicore_us
    assert times["kirin9050"] != times["ascend950"], times  # the A5 tables were used


@pytest.mark.pypto
def test_a_kernel_compiled_after_other_jobs_of_its_server_has_the_same_artifacts(tmp_path):
    """Each child starts from the server's state as it was after import, whatever jobs (a failed
    one among them) the server ran before: the same kernel, the same bytes."""
    b = GraphBuilder()
    graph, plan = fuse(b.model(b.op("Neg", [b.op("Relu", [b.input("x", [1, 8, 16, 16])])])))
    (region,) = plan.regions

    def kernel(cache: str):
        return compile_region(region, graph, setup_for(TARGET, tmp_path / cache),
                              graph.constant_values(), search=False)

    def work(_):
        first = kernel("first")
        ((failed, _, server),) = run_jobs_here(tmp_path / "broken", [tiny_job(BROKEN)])
        later = kernel("later")
        with pool.current_workers() as workers:
            (serving,) = workers.servers()
        return first, failed, later, serving.process.pid == server
    (first, failed, later, one_server) = pool.each([None], 1, work)[0]
    assert first.compiled and not failed.candidates[0].compiled
    assert one_server, "the jobs did not share one server"
    assert later.artifacts == first.artifacts and not later.from_cache


def window_merge() -> onnx.ModelProto:
    """tf_swin's region_16 in small: a window's projection (MatMul, bias), the windows put back
    in place (Reshape, Transpose, Reshape), the shift rolled back (Slice and Concat on two
    axes), cropped and added to the residual. PyPTO inserts a COPY_OUT/COPY_IN pair for each
    consumer of the product in the order of their addresses (docs/determinism.md)."""
    b = GraphBuilder()
    rng = np.random.default_rng(0)
    product = b.op("Add", [b.op("MatMul", [b.input("x", [16, 16, 32]), b.const(
        rng.standard_normal((32, 32)))]), b.const(rng.standard_normal(32))])
    window = b.op("Reshape", [b.op("Transpose", [b.op("Reshape", [product],
                                                      shape=[1, 4, 4, 4, 4, 32])],
                                   perm=[0, 1, 3, 2, 4, 5])], shape=[1, 16, 16, 32])
    for axis in (1, 2):
        window = b.op("Concat", [b.op("Slice", [window], starts=[14], ends=[16], axes=[axis]),
                                 b.op("Slice", [window], starts=[0], ends=[14], axes=[axis])],
                      axis=axis)
    crop = b.op("Slice", [window], starts=[0, 0], ends=[14, 14], axes=[1, 2])
    return b.model(b.op("Reshape", [b.op("Add", [b.input("r", [1, 14, 14, 32]), crop])],
                        shape=[1, 196, 32]))


@pytest.mark.pypto
def test_a_kernel_ships_the_same_artifacts_whatever_its_folder_and_the_jobs_before(tmp_path):
    """The compile whose artifacts ship allocates from a heap of its own, with paths of one
    length (docs/determinism.md, "The heap a compile starts from"). Three checked compiles of
    the window-merge kernel's 512-byte tile in one server: alone in job folders of 1 and 30
    characters, and second of two candidates (in a child of its job's process): the same
    artifacts. Before, the op numbers differed with the folder's length and the server's jobs
    (tf_swin built with --jobs 2: 6 artifact sets of that kernel in 7 builds)."""
    graph, plan = fuse(window_merge())
    (region,) = plan.regions
    constants = graph.constant_values()
    sources = distinct_sources(region, tiling.candidate_policies(
        TARGET.ub_plan_bytes.value, largest_tensor_bytes(region)), constants)
    tile, other = (next(p for p in sources if p.budget_bytes == budget) for budget in (512, 32768))
    arrays, reference = region_data(region, graph, constants)
    jobs = {"a": [tile], "b" * 30: [other, tile], "c": [tile]}

    setup = setup_for(TARGET, tmp_path / "cache")

    def work(_):  # one pool thread: one server runs the three jobs
        return [run_region_job(setup, tmp_path / name / "final", region,
                               {p: sources[p] for p in tiles}, "0" * 64, arrays, reference,
                               True).candidates[-1] for name, tiles in jobs.items()]
    answers = pool.each([None], 1, work)[0]
    assert all(a.compiled and a.tasks > 100 for a in answers), answers  # 105 tasks
    shipped = [{p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in
                Path(a.artifacts).iterdir()} for a in answers]
    assert "program.json.gz" in shipped[0] and len(shipped[0]) > 10, shipped[0]
    differ = sorted(name for name in set().union(*shipped)
                    if len({files.get(name) for files in shipped}) > 1)
    assert not differ, f"artifacts that differ between the three compiles: {differ}"


def servers_running(folder: Path) -> list[int]:
    """Live fork servers (and their children) whose folder is under ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "--serve" in cmdline and str(folder) in cmdline and live(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.mark.pypto
def test_a_region_compiled_on_its_own_starts_a_server_and_stops_it(tmp_path):
    """``compile_region`` outside a build's pool: a server of its own for the job, gone after."""
    b = GraphBuilder()
    graph, plan = fuse(b.model(b.op("Neg", [b.op("Relu", [b.input("x", [1, 8, 16, 16])])])))
    (region,) = plan.regions
    kernel = compile_region(region, graph, setup_for(TARGET, tmp_path),
                            graph.constant_values(), search=False)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert not servers_running(tmp_path)
    assert list((tmp_path / STAGING).iterdir()) == [], "a server's folder is left behind"


@pytest.mark.pypto
def test_a_job_child_never_collects_the_objects_its_server_imported(tmp_path):
    """The server freezes torch's and pypto's objects before forking (docs/compile-time.md,
    "Where one compile's time goes"): without it, every full collection in a child walked them
    all (and wrote to, hence copied, the server's pages)."""
    ((result, folder, _),) = run_jobs(tmp_path, [tiny_job(append=FROZEN_PROBE)])
    assert compiled(result), result
    frozen = int(written(folder, "frozen.txt").read_text())
    assert frozen > 100_000, f"only {frozen} objects frozen: the server did not freeze its imports"


def test_program_json_is_parsed_with_the_collector_paused(tmp_path, monkeypatch):
    """An 8 MB program.json parsed with the collector running took 2-4x as long; the collector
    is on again afterwards (and stays off when it was off)."""
    program = tmp_path / "program.json"
    program.write_text(json.dumps({"functions": [{"graphtype": 1, "tensors": []}]}))
    seen = []
    parse = json.loads
    monkeypatch.setattr(program_figures.json, "loads", lambda text: seen.append(gc.isenabled())
                        or parse(text))
    assert program_figures.read_program(program) == {"functions": [{"graphtype": 1,
                                                                     "tensors": []}]}
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        program_figures.read_program(program)
        assert not gc.isenabled(), "read_program turned on a collector that was off"
    finally:
        gc.enable()


@pytest.mark.pypto
def test_a_search_job_may_compile_its_candidates_in_parallel_children(tmp_path):
    """``parallel``: each candidate in a child of the job's process, two at a time; the same
    answers as one after another, and a failed candidate spoils none of the others."""
    broken, good = tiny_job(BROKEN), tiny_job()
    candidates = broken[0].candidates + good[0].candidates * 2
    one_by_one = good[0]
    side_by_side = Job(**{**good[0].__dict__, "candidates": candidates, "parallel": 2})
    (alone, _, _), (together, folder, _) = run_jobs(tmp_path, [(one_by_one, good[1]),
                                                               (side_by_side, good[1])])
    assert [c.compiled for c in together.candidates] == [False, True, True], together
    figures = ("aicore_us", "total_us", "tasks", "ub_bytes", "gm_bytes")
    for answer in together.candidates[1:]:
        assert {k: getattr(answer, k) for k in figures} == \
            {k: getattr(alone.candidates[0], k) for k in figures}
    assert sorted(p.name.rstrip(PAD) for p in (folder / WORK).iterdir()) == \
        ["c0", "c1", "c2"]


def test_a_region_searches_in_parallel_only_where_a_thread_would_idle():
    spare = pool.SpareThreads(jobs=2, regions=3)
    assert spare.share() == 1
    spare.done(None)
    assert spare.share() == 1  # two regions left, one per thread
    spare.done(None)
    assert spare.share() == 2  # the last region: both threads' worth
