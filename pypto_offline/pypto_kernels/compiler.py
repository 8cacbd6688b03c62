"""Compile every fused region with the real PyPTO, in fresh worker processes, through the cache.

Per region:
1. generate the kernel source for every tile candidate;
2. look the key up in the cache (a warm rebuild stops here);
3. one search process compiles all candidates for the cost model;
4. one final process compiles the fastest with pass-verify and compares its output with
   onnxruntime running the region's original ops.
A region whose kernel cannot be written, crashes, times out or fails its check falls back to
unfused ops, with the reason. Only deterministic outcomes are cached: a worker that dies or runs
out of time says nothing about the kernel, so the next build tries again (docs/kernel-cache.md).
A worker that cannot even start, or an interrupted build, ends the build instead: the worker
processes belong to their build (docs/workers.md).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import astuple, replace
from functools import lru_cache, partial
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx
from onnx import helper

from pypto_offline.errors import WorkerCannotStart
from pypto_offline.fusion.classify import kernel_dtype
from pypto_offline.fusion.records import CANNOT_EXPRESS, FusionPlan, Region
from pypto_offline.importer import ImportedGraph
from pypto_offline.progress import SILENT, Progress
from pypto_offline.pypto_kernels import no_host_address
from pypto_offline.pypto_kernels.cache import (DamagedEntry, KernelCache, cache_key,
                                               cache_root_of, new_staging, user_cache_base)
from pypto_offline.pypto_kernels.codegen import (KERNEL_FUNCTION, CannotExpress,
                                                 flat_rows_change_the_tiling, is_scalar_constant,
                                                 itemsize_of, kernel_source)
from pypto_offline.pypto_kernels.records import (CHECK_FAILED, COMPILE_FAILED, CRASHED, NO_TILE_FITS,
                                                 TIMED_OUT, Kernel, TileResult)
from pypto_offline.pypto_kernels.tiling import (MERGE_CAPS, SEARCH_RULES, TilePolicy,
                                                candidate_policies, default_policy, defer_flat_rows,
                                                defer_swapped, fits_ub, next_flat_rows,
                                                next_swapped, search_rounds)
from pypto_offline.runtime import TOLERANCE, run_model
from pypto_offline.targets import Target

PYPTO_VERSION = "0.2.0"
KERNEL_FORMAT = 22  # bump when the generator changes what a cached entry means (22: an entry
# keeps every tile candidate tried, the report's tile table; 21: one OpenMP
# thread in the workers; 20: PyPTO sees no host address, no_host_address.py: artifacts alike on
# every host; 19: a checked compile's artifacts come from a heap of its own, before they followed the build's history,
# docs/determinism.md; 18: a matmul's L0C and L1 tensors were counted as UB; 17: compiles after
# a failed one in the same process were cached as failed, docs/workers.md)
DEFAULT_TIMEOUT_S = 300
# ascend950: the cost model can use its A5 tables (pypto-cpu.md §6); everything else is 910B.
COST_MODEL = {"ascend950": ("A5", "ASCEND_950PR_9579")}
# Written by a job's child in its folder before it compiles: from there a death is the kernel's.
STARTED_MARKER = "worker.started"
# In a job's folder: the working folder of each of its compiles (worker.enter_workspace), where
# PyPTO writes its run folder, home, pass-verify dumps; not kept in a kernel's entry.
WORK = "work"
# The fork server's first line, once torch and pypto are imported: a server that dies before it
# never ran a compile, so its death says something about the environment, not about a region.
SERVER_READY = "ready"
REAP_S = 10  # a killed child's group is gone at once; the server reports it within this
# PyPTO 0.2.0 orders some of its sets by object address (AssignMemoryType inserts a COPY_OUT/
# COPY_IN pair for each consumer in a std::set<Operation *>), so the op numbers and symbol names
# of its program.json and AICore sources follow where malloc puts its objects. With ASLR off,
# they are a function of the kernel once a compile allocates from a heap of its own
# (worker._in_fresh_thread, ``worker_environment``) and the strings it makes have the same
# lengths: the paths of its server's folder and of its own working folder (``workspace``), and
# its run folder's name, which PyPTO ends with the process id (worker.run_folder_name) and the
# host's address, which the workers hide (no_host_address.py).
# docs/determinism.md, "The heap a compile starts from".
WORKSPACE_CHARS = 400
COMPONENT_CHARS = 200  # the longest padding component (a file name has at most 255 bytes)
PAD = "_"


def workspace(folder: Path, name: str) -> Path:
    """``folder/name`` with underscores added (in components of at most ``COMPONENT_CHARS``)
    until its real path is ``WORKSPACE_CHARS`` long, whatever the cache folder, staging folder
    and job it is in: PyPTO takes the real path of every file it writes (``RealPath``) and of the
    config and log folders it reads, and their lengths are sizes of strings it allocates. A
    folder longer already (the cache folder would be ~300 characters long) keeps its length."""
    base = folder.resolve() / name
    components, tail = divmod(max(0, WORKSPACE_CHARS - len(str(base))), COMPONENT_CHARS + 1)
    return base.with_name(name + PAD * tail).joinpath(*[PAD * COMPONENT_CHARS] * components)


NO_TCACHE = "glibc.malloc.tcache_count=0"


def worker_environment() -> dict[str, str]:
    """PyPTO's frontend walks hash-ordered containers: its program.json (op seeds, symbol names)
    depends on the hash seed. A fixed seed makes every build of a kernel the same bytes.

    And malloc's per-thread cache (tcache) off. A compile allocates from an arena apart from the
    main heap (worker._in_fresh_thread; ``WORKSPACE_CHARS`` says why that matters), but a chunk
    of the main heap that the compile frees would go into its thread's cache and serve its next
    allocation of that size, at an address the server's import left. Measured on tf_swin's
    region_16: one more environment variable of the build, or a 3-digit pid, changed its op
    numbers; not with the cache off, which costs ~3% CPU.

    And one OpenMP thread: the threads a worker's libraries start leave malloc arenas that a
    forked job's compile thread takes over, so their number moved tf_swin's region_16 op
    numbers too (``OMP_NUM_THREADS=1``, as a Ray worker has it, against the default of one per
    core: two blobs; docs/determinism.md, "The host's address"). Pinned, a build does not
    depend on the machine's core count or the caller's setting."""
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":")
                if t and not t.startswith(NO_TCACHE.split("=")[0] + "=")]
    return {**os.environ, "PYTHONHASHSEED": "0", "GLIBC_TUNABLES": ":".join(tunables + [NO_TCACHE]),
            "OMP_NUM_THREADS": "1"}


ADDR_NO_RANDOMIZE = 0x0040000  # <sys/personality.h>


def _fixed_addresses(libc) -> None:
    """In the worker, before exec: no address-space randomisation. PyPTO orders some of its
    internal maps by object address, so its program differs from run to run unless every run
    lays out memory the same way (as `setarch -R` does)."""
    current = libc.personality(0xFFFFFFFF)
    if current != -1:
        libc.personality(current | ADDR_NO_RANDOMIZE)


PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def _worker_preexec(build_pid: int, libc) -> None:
    """In a fork server, before exec (it already leads a session of its own): fixed addresses,
    and SIGKILL when the build dies. PDEATHSIG fires when the *thread* that forked the server
    ends: a pool thread starts its own servers and lives until the end of ``_each_region``,
    which then kills them. ``libc`` is loaded in the build: no dlopen between fork and exec."""
    _fixed_addresses(libc)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != build_pid:  # the build died before the line above: nobody to serve
        os._exit(1)


class _Cancelled(BaseException):
    """In a pool thread: the build was interrupted, this region's work stops (no Kernel record,
    nothing cached; ``compile_region`` removes its staging folder on the way out)."""


class _Workers:
    """The PyPTO processes of one build: its fork servers (one per pool thread and cost-model
    config) and the job children they fork. Started, adopted and killed under one lock, so that
    an interrupt either finds a process (and kills its process group) or keeps it from
    starting."""

    def __init__(self):
        self._lock = threading.Lock()
        self._groups: set[int] = set()  # process groups (= their leader's pid) to kill on cancel
        self._servers: dict[tuple, _Server] = {}
        self.cancelled = False

    def start(self, command: list[str], **options) -> subprocess.Popen:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        with self._lock:
            if self.cancelled:
                raise _Cancelled
            # A session (and process group) of its own: killing the group takes PyPTO's
            # children too (host g++, cmake), and a terminal's Ctrl-C reaches the build only.
            process = subprocess.Popen(command, start_new_session=True,
                                       preexec_fn=partial(_worker_preexec, os.getpid(), libc),
                                       **options)
            self._groups.add(process.pid)
        return process

    def adopt(self, group: int) -> None:
        """A job child that leads its own session: killed with the others on cancel (at once
        when the build is cancelled already)."""
        with self._lock:
            if self.cancelled:
                _kill_group(group)
                raise _Cancelled
            self._groups.add(group)

    def finished(self, group: int) -> None:
        with self._lock:
            self._groups.discard(group)

    def cancel(self) -> None:
        """No process starts from now on; the running ones die with their process groups."""
        with self._lock:
            self.cancelled = True
            for group in self._groups:
                _kill_group(group)

    def server(self, staging_root: Path, config: tuple) -> _Server:
        """This thread's fork server for ``config`` (cost-model arch, device platform: PyPTO
        reads them at import), started on first use. One per thread: a server runs one job at
        a time, and the thread that forks it stays alive as long as it (PDEATHSIG)."""
        key = (threading.get_ident(), config)
        with self._lock:
            server = self._servers.get(key)
        if server is None:
            server = _Server(self, staging_root, config)  # starting takes the lock
            with self._lock:
                self._servers[key] = server
        return server

    def drop(self, server: _Server) -> None:
        """Kill a server (and its folder) that cannot serve on: the next job starts another."""
        with self._lock:
            self._servers = {k: v for k, v in self._servers.items() if v is not server}
        server.close(self)

    def shutdown(self) -> None:
        """At the end of the build's regions (or on its way out): every server dies."""
        with self._lock:
            servers = list(self._servers.values())
        for server in servers:
            self.drop(server)


def _kill_group(group: int) -> None:
    """SIGKILL a process group (its leader's pid: it leads a session of its own). The number
    is not reused while the leader is unreaped or any process of its group lives; at worst (a
    leader reaped but not yet unregistered, its group empty) the kill finds nobody."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # already gone, and all of its group with it
        pass


class _Replies:
    """The lines a fork server writes on its stdout, read with a deadline (``select``: a pool
    thread must notice a time-out, and the server's death as end of file)."""

    def __init__(self, stream):
        self._fd = stream.fileno()
        self._buffer = b""

    def next(self, deadline: float) -> str | None:
        """The next line; "" once the server is gone, None at the deadline."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._fd], [], [], remaining)[0]:
                return None
            chunk = os.read(self._fd, 4096)
            if not chunk:
                return ""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


class _ServerGone(Exception):
    """The fork server died, or stopped answering within the job's time (``timed_out``)."""

    def __init__(self, timed_out: bool = False):
        super().__init__()
        self.timed_out = timed_out


class _Server:
    """A fork server (``worker.serve``): imports torch and pypto once, then forks one child per
    job. Its folder, in the build's staging area, holds the PyPTO config it imported with, its
    import-time side files and its log (docs/workers.md)."""

    def __init__(self, workers: _Workers, staging_root: Path, config: tuple):
        arch, platform = config
        self.staging = new_staging(staging_root, "server")
        # PyPTO reads its config and log folder's paths at import: of one length (``workspace``)
        self.folder = workspace(self.staging, "server")
        self.folder.mkdir(parents=True)
        (self.folder / "server.json").write_text(json.dumps(
            {"cost_model_arch": arch, "device_platform": platform,
             "calculator_cache": str(calculator_cache())}))
        with open(self.folder / "server.log", "wb") as log:
            self.process = workers.start(
                [sys.executable, "-m", WORKER_MODULE, "--serve", str(self.folder)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=self.folder,
                env=no_host_address.preloaded(worker_environment(),
                                              no_host_address.build(self.folder)))
        self._replies = _Replies(self.process.stdout)
        self.ready = False

    def wait_ready(self, limit: float, workers: _Workers) -> bool:
        """Until the server has imported torch and pypto; False when it ran out of time. A
        server that dies first never compiled: its environment is broken, for every region
        (unless the build killed it)."""
        reply = self._replies.next(time.monotonic() + limit)
        if reply is None:
            return False
        if reply != SERVER_READY:
            self.process.wait()
            if workers.cancelled:
                raise _Cancelled
            raise WorkerCannotStart(
                f"a PyPTO worker process could not start (exit code {self.process.returncode}): "
                f"{_last_line(self.folder / 'server.log')}",
                fix=f"check that '{sys.executable} -m {WORKER_MODULE}' can import torch and "
                    f"pypto {PYPTO_VERSION}")
        self.ready = True
        return True

    def run(self, job_path: Path, timeout: float, workers: _Workers) -> int | None:
        """Run one job in a forked child: its exit code (negative: the signal that killed it),
        or None when it ran out of time (its whole process group is killed then)."""
        try:
            self.process.stdin.write(f"{job_path}\n".encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            raise _ServerGone from None
        child, deadline = None, time.monotonic() + timeout
        try:
            reply = self._replies.next(deadline)
            if reply and " " not in reply:  # "<pid>": the child leads its own session now
                child = int(reply)
                workers.adopt(child)
                reply = self._replies.next(deadline)
            if reply is None:  # out of time: the child's group dies, and the server, which
                if child is not None:  # reaps it, serves the next job
                    _kill_group(child)
                    if self._replies.next(time.monotonic() + REAP_S):
                        return None
                raise _ServerGone(timed_out=True)
            if not reply:
                raise _ServerGone
            return int(reply.split()[1])
        except BaseException:
            if child is not None:
                _kill_group(child)
            raise
        finally:
            if child is not None:
                workers.finished(child)

    def close(self, workers: _Workers) -> None:
        _kill_group(self.process.pid)
        self.process.wait()
        workers.finished(self.process.pid)
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        shutil.rmtree(self.staging, ignore_errors=True)


_pool_thread = threading.local()  # the _Workers of the build a pool thread works for


@contextlib.contextmanager
def _current_workers() -> Iterator[_Workers]:
    """The build's workers in one of its pool threads; elsewhere (``compile_region`` called on
    its own) a set of one's own for this job, shut down after it (on an interrupt too)."""
    workers = getattr(_pool_thread, "workers", None)
    if workers is not None:
        yield workers
        return
    workers = _Workers()
    try:
        yield workers
    finally:  # its server dies (a child that ran out of time or was interrupted died already)
        workers.shutdown()


def _working_for(workers: _Workers, work, region):
    _pool_thread.workers = workers
    try:
        return work(region)
    finally:
        _pool_thread.workers = None


def calculator_cache() -> Path:
    return user_cache_base() / "calculator"


def compile_kernels(graph: ImportedGraph, plan: FusionPlan, target: Target, *,
                    cache_dir: Path | None = None, jobs: int = 2, search: bool = True,
                    timeout: float = DEFAULT_TIMEOUT_S, progress: Progress = SILENT
                    ) -> list[Kernel]:
    return compile_regions([(region, graph) for region in plan.regions], target,
                           cache_dir=cache_dir, jobs=jobs, search=search, timeout=timeout,
                           progress=progress)


def compile_regions(work: Sequence[tuple[Region, ImportedGraph]], target: Target, *,
                    cache_dir: Path | None = None, jobs: int = 2, search: bool = True,
                    timeout: float = DEFAULT_TIMEOUT_S, progress: Progress = SILENT
                    ) -> list[Kernel]:
    """The kernel of each region, in order, the regions of any graphs (each with the graph it
    is in) compiled by one pool of ``jobs`` fork servers and one cache."""
    cache = KernelCache(cache_dir)
    constants = {id(graph): graph.constant_values() for _, graph in work}
    graph_of = {id(region): graph for region, graph in work}
    regions = [region for region, _ in work]
    reported = _reporting(progress, len(regions))
    spare = _SpareThreads(jobs, len(regions))

    def compile_one(region: Region) -> Kernel:
        graph = graph_of[id(region)]
        return spare.done(reported(region, compile_region(
            region, graph, target, cache, constants[id(graph)], search=search, timeout=timeout,
            parallel=spare.share)))
    return _each_region(regions, jobs, compile_one, order=compile_order(
        regions, [constants[id(graph_of[id(region)])] for region in regions]))


class _SpareThreads:
    """How many processes a region's tile search may compile its candidates in at once: one,
    unless fewer regions are left than the build's ``jobs`` (a model of one region, the end of
    a build), where the threads without a region would idle (the bundled example's 7
    candidates ran one after another on one of the two cores)."""

    def __init__(self, jobs: int, regions: int):
        self._lock = threading.Lock()
        self._jobs, self._left = max(1, jobs), regions

    def share(self) -> int:
        with self._lock:
            return max(1, self._jobs - max(self._left, 1) + 1)

    def done(self, kernel: Kernel) -> Kernel:
        with self._lock:
            self._left -= 1
        return kernel


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


def _reporting(progress: Progress, total: int):
    """A pool thread's hand-over of a finished kernel to ``progress``: counted and reported
    under one lock, so the numbers follow completion order and no two lines interleave."""
    lock = threading.Lock()
    done = 0

    def report(region: Region, kernel: Kernel) -> Kernel:
        nonlocal done
        with lock:
            done += 1
            progress.kernel(done, total, region, kernel)
        return kernel
    return report


def unfused_costs(graph: ImportedGraph, regions: Sequence[Region], target: Target, *,
                  cache_dir: Path | None = None, jobs: int = 2,
                  timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, float | None]:
    """``unfused_cost_us`` of each region, by region id, on ``jobs`` parallel compiles like
    the kernels themselves: the baseline holds most of a cold build's PyPTO compiles."""
    cache = KernelCache(cache_dir)
    constants = graph.constant_values()
    costs = _each_region(regions, jobs, lambda region: unfused_cost_us(
        region, graph, target, cache, constants, timeout))
    return {region.id: cost for region, cost in zip(regions, costs)}


class _Pool:
    """``jobs`` threads and the PyPTO processes they run (``_Workers``): each thread starts its
    fork servers on its first job, and they live as long as the thread (PDEATHSIG)."""

    def __init__(self, jobs: int):
        self.workers = _Workers()
        self.threads = ThreadPoolExecutor(max(1, jobs))

    def close(self) -> None:
        self.threads.shutdown(wait=True, cancel_futures=True)
        self.workers.shutdown()


_shared: _Pool | None = None  # the pool of a batch of builds (``shared_workers``), if any


@contextlib.contextmanager
def shared_workers(jobs: int) -> Iterator[None]:
    """One pool of ``jobs`` threads and fork servers for every build in the block (a batch of
    models and targets: the servers import torch and PyPTO once for all of them). An interrupt
    kills its processes; the block must run in one thread at a time."""
    global _shared
    if _shared is not None:
        raise RuntimeError("shared_workers blocks do not nest")
    _shared = _Pool(jobs)
    try:
        yield
    except BaseException:
        _shared.workers.cancel()
        raise
    finally:
        pool, _shared = _shared, None
        pool.close()


def _each_region(regions, jobs: int, work, order: Sequence[int] | None = None) -> list:
    """``work`` of each region, in region order, ``jobs`` at a time (the shared pool's, in a
    batch), started in ``order`` (indices; default region order): threads are enough, as each
    only waits on its PyPTO worker process. On the first error the queued regions are dropped
    and the running ones finish before it propagates; on an interrupt (which only the main
    thread receives) the running workers are killed first: an interrupted build makes no Kernel
    records."""
    pool = _shared or _Pool(jobs)
    started = {}
    try:
        for i in range(len(regions)) if order is None else order:
            started[i] = pool.threads.submit(_working_for, pool.workers, work, regions[i])
        futures = [started[i] for i in range(len(regions))]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:  # the first failure in region order, without waiting for others
            if future.done() and future.exception() is not None:
                future.result()
        return [future.result() for future in futures]
    except KeyboardInterrupt:
        pool.workers.cancel()
        raise
    except BaseException:
        if pool is not _shared:  # its own processes: they go with it
            pool.workers.cancel()
        raise
    finally:
        for future in started.values():
            future.cancel()
        wait(list(started.values()))
        if pool is not _shared:
            pool.close()


def largest_tensor_bytes(region: Region) -> int:
    return max((int(np.prod(shape, dtype=np.int64)) * itemsize_of(dtype)
                for shape, dtype in region.tensor_types.values()), default=0)


def compile_region(region: Region, graph: ImportedGraph, target: Target, cache: KernelCache,
                   constants: dict, *, search: bool = True, timeout: float = DEFAULT_TIMEOUT_S,
                   parallel: Callable[[], int] = lambda: 1) -> Kernel:
    started = time.perf_counter()
    ub = target.ub_plan_bytes.value
    default = default_policy(ub)
    policies = candidate_policies(ub, largest_tensor_bytes(region)) if search else [default]
    try:
        sources = distinct_sources(region, policies, constants)
    except CannotExpress as why:
        return Kernel(region.id, False, f"{CANNOT_EXPRESS} in PyPTO 0.2.0: {why}")
    interface = kernel_interface(region, constants)
    key = cache_key(sources={p.name: text for p, text in sources.items()}, interface=interface,
                    target=target.name, pypto=PYPTO_VERSION, format=KERNEL_FORMAT,
                    default=default.budget_bytes, cost_model=COST_MODEL.get(target.name),
                    search=SEARCH_RULES)
    with cache.holding([key]):
        hit = cache.read(key, lambda files: _cached_kernel(
            files, region.id, key, sources, partial(_source_of, region, constants, sources)))
        if hit is not None:
            return hit
        staged = cache.staging()
        try:
            compiles = [0]
            kernel, transient = _build(region, graph, target, cache, constants, interface,
                                       sources, default, key, staged, timeout, compiles,
                                       parallel)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        kernel = replace(kernel, compile_seconds=round(time.perf_counter() - started, 3),
                         pypto_compiles=compiles[0])
        if transient:  # this build falls back; the next one tries again
            shutil.rmtree(staged, ignore_errors=True)
            return kernel
        _save(kernel, staged)
        return replace(_load(cache.put(key, staged), region.id, from_cache=False),
                       pypto_compiles=compiles[0])


def _source_of(region: Region, constants: dict, sources: dict[TilePolicy, str],
               policy: TilePolicy) -> str | None:
    """The module this build would compile for ``policy``: a searched tile's, or a leaf merge
    cap of one (``_merge_capped``); None for any other."""
    if policy.vec_merge:
        return kernel_source(region, policy, constants) \
            if replace(policy, vec_merge=0) in sources else None
    return sources.get(policy)


def _cached_kernel(files: dict[str, bytes], region_id: str, key: str,
                   sources: dict[TilePolicy, str],
                   source_of: Callable[[TilePolicy], str | None]) -> Kernel:
    """A cache entry's kernel, if it is the one this build would compile: stored under this key
    and from the very source generated now for its tile (the manifest only shows the files are
    as they were stored)."""
    kernel = _load(files, region_id, from_cache=True)
    if kernel.cache_key != key:
        raise DamagedEntry("its kernel.json names another key")
    tile = kernel.tuned_tile
    expected = (source_of(TilePolicy(tile.budget_bytes, tile.swapped_transposes,
                                     tile.flat_rows, tile.vec_merge)) if tile is not None
                else kernel.source if kernel.source in sources.values() else None)
    if kernel.source != expected:
        raise DamagedEntry("its kernel source is not the one generated for this build")
    return kernel


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


def _untuned_source(sources: dict, untuned: TilePolicy) -> str:
    """The default tile's source; where another policy wrote the same text first, that one's
    (``_sources`` keeps each text once)."""
    return sources.get(untuned) or next(iter(sources.values()))


def _job_candidate(policy: TilePolicy, key: str, source: str) -> dict:
    """A tile candidate as the worker takes it (and hands back, with its results). The policy
    fields are named here and read back in ``_policy`` only. The module travels as text inside
    the job, in this build's private staging folder, with a name made of its content key: the
    worker runs it under that name and imports no file (docs/kernel-cache.md)."""
    return {"budget": policy.budget_bytes, "swapped": policy.swap_transpose_tiles,
            "flat": policy.flat_rows, "merge": policy.vec_merge,
            "module": f"kernel/{key[:16]}_{policy.name}.py", "source": source}


def _policy(candidate: dict) -> TilePolicy:
    return TilePolicy(candidate["budget"], candidate["swapped"], candidate.get("flat", False),
                      candidate.get("merge", 0))


def _build(region, graph, target, cache, constants, interface, sources, untuned, key, staged,
           timeout, compiles: list[int], parallel: Callable[[], int]) -> tuple[Kernel, bool]:
    """The region's kernel (or why not), and whether that outcome is transient: a worker that
    died or ran out of time, which is not cached. ``compiles[0]`` counts the PyPTO compiles run."""
    # onnxruntime's reference, made only when a compile misses the cache (another target of
    # the same cost tables finds every compile there)
    data = lru_cache(maxsize=1)(lambda: _region_data(region, graph, constants))
    compile_ = partial(_compiled, region=region, target=target, cache=cache,
                       interface=interface, key=key, data=data, timeout=timeout,
                       compiles=compiles, parallel=parallel)
    ub = target.ub_plan_bytes.value
    first, rest = search_rounds(list(sources), untuned)
    first, flat_later = defer_flat_rows(first)
    first, swapped_later = defer_swapped(first)
    # The first round checked as it compiles, where a check costs little next to a compile:
    # the tile it picks needs no second, checked compile (the cost model times the same
    # program: the same figures). A lone candidate always: one compile instead of two.
    checked_first = cheap_to_check(region) or (
        len(first) == 1 and not flat_later and not swapped_later and not rest)
    tried, searched, pending, round_index = [], {}, first, 0
    while pending:
        verify = checked_first and round_index == 0
        searched = compile_(staged / f"search{round_index or ''}",
                            {p: sources[p] for p in pending}, verify=verify)
        if verify and len(pending) > 1 and _crashed(searched):
            # a check that kills a candidate's process (PyPTO's interpreter on some tiles:
            # ppocrv4_rec, SIGSEGV) must not cost the region: the round again unchecked, as
            # a large region's, and then a checked compile of the tile it picks only
            verify = checked_first = False
            searched = compile_(staged / "search-unchecked", {p: sources[p] for p in pending},
                                verify=False)
        if searched.get("transient"):
            break
        tried += [{**c, "checked": verify} for c in searched.get("candidates", [])]
        round_index += 1
        flat = sorted((c for c in tried if c.get("flat")), key=lambda c: -c["budget"])
        pending = next_flat_rows([_measured(c) for c in flat], flat_later, ub)
        flat_later = [p for p in flat_later if p not in pending]
        if swapped_later:  # once, after the own orientation's round
            pending += next_swapped([_measured(c) for c in tried if not c.get("swapped")],
                                    swapped_later, ub)
            swapped_later = []
        if not pending and not any(fits_ub(c.get("ub_bytes"), ub) for c in tried):
            pending, rest = rest, []  # the smaller budgets, only when no large tile fits
    compiled = [c for c in tried if c.get("compiled") and c["aicore_us"]]
    if compiled and not any(fits_ub(c.get("ub_bytes"), ub) for c in compiled):
        capped = _merge_capped(region, constants, compiled)
        sources = {**sources, **capped}
        searched = compile_(staged / "search-merge", capped, verify=False)
        if not searched.get("transient"):
            tried += [{**c, "checked": False} for c in searched.get("candidates", [])]
            compiled = [c for c in tried if c.get("compiled") and c["aicore_us"]]
    fitting = [c for c in compiled if fits_ub(c.get("ub_bytes"), ub)]
    candidates = tuple(_tile(c) for c in tried)
    fell_back = lambda reason, source: Kernel(  # noqa: E731 - every fallback keeps the search
        region.id, False, reason, source=source, cache_key=key, candidates=candidates)
    if not compiled:
        return (fell_back(_failure(searched), _untuned_source(sources, untuned)),
                bool(searched.get("transient")))
    if not fitting:
        least = min((c.get("ub_bytes") or 0 for c in compiled), default=0)
        return (fell_back(f"{NO_TILE_FITS} {target.name}'s planned UB of {ub} bytes: the "
                          f"smallest compiled candidate's leaves need {least}",
                          _untuned_source(sources, untuned)), False)
    best = min(fitting, key=lambda c: (c["aicore_us"], c["total_us"] or 0,
                                       astuple(_policy(c))))
    default = default_candidate(fitting, untuned.budget_bytes)
    chosen = _policy(best)
    final = {"candidates": [best]} if best["checked"] else \
        compile_(staged / "final", {chosen: sources[chosen]}, verify=True)
    result = (final.get("candidates") or [{}])[0]
    if not result.get("compiled"):
        return fell_back(_failure(final), sources[chosen]), bool(final.get("transient"))
    _keep_chosen_artifacts(result, staged / CHOSEN_ARTIFACTS)  # placed by ``_save``
    return _kernel_record(region, sources[chosen], key, best, default, result, candidates), False


def _merge_capped(region: Region, constants: dict, compiled: list[dict]
                  ) -> dict[TilePolicy, str]:
    """The candidate whose leaves need the least UB, with PyPTO's merging of identical vector
    subgraphs capped (``tiling.MERGE_CAPS``): where no tile fits under PyPTO's own merging,
    the leaves' size is the merge's, not the tile's (``TilePolicy.vec_merge``)."""
    smallest = _policy(min(compiled, key=lambda c: c.get("ub_bytes") or 0))
    return {policy: kernel_source(region, policy, constants)
            for policy in (replace(smallest, vec_merge=cap) for cap in MERGE_CAPS)}


# A region whose largest tensor is at most this size checks the first round of its tile search
# as it compiles it (``_build``), and needs no second, checked compile of the tile it picks.
# Pass-verify interprets the tensor graph and the lowered one tile by tile over the whole
# tensors: on ppocrv4_det's regions (a checked compile against the same candidate unchecked,
# 0.4-1.9 s) it added 0.0 s up to 300 KB, 0.15-0.7 s at 0.6-2.4 MB, 2.5-3.5 s at 4.9-9.8 MB and
# 11 s at 13 MB; tf_swin's (all small) 0.05 s median. Checking a first round of n candidates
# costs n checks instead of one compile more: a gain below ~0.5 MB. docs/compile-time.md.
CHECKED_SEARCH_BYTES = 512 * 1024


def cheap_to_check(region: Region) -> bool:
    return largest_tensor_bytes(region) <= CHECKED_SEARCH_BYTES


def _crashed(result: dict) -> bool:
    """A worker's answer that says its process died (not that it ran out of time)."""
    return bool(result.get("transient")) and not result.get("error", "").startswith(TIMED_OUT)


def _measured(candidate: dict) -> tuple[int, int | None, float | None]:
    """A compiled candidate as the search's next-round rules read it: (budget, UB bytes,
    AICore µs), the time None when it did not compile."""
    return (candidate["budget"], candidate.get("ub_bytes"),
            candidate.get("aicore_us") if candidate.get("compiled") else None)


# What a compile of one candidate says about it, whatever the target it was compiled for: the
# fields a compile cache entry keeps (not the worker's timing or its run folder).
COMPILE_FIELDS = ("compiled", "error", "aicore_us", "total_us", "tasks", "ub_bytes", "gm_bytes",
                  "verdicts", "max_abs_diff")
COMPILE_RESULT = "result.json"


def _compiled(folder: Path, sources: dict[TilePolicy, str], *, verify: bool, region, target,
              cache: KernelCache, interface: list, key: str, data, timeout: float,
              compiles: list[int], parallel: Callable[[], int]) -> dict:
    """The worker's answer for each candidate, as ``_run_worker`` gives it, from the compile
    cache where it can: the same source with the same interface on the same cost model compiles
    to the same program whichever region, model or target asks (kirin90, kirin9030, kirin9050
    and ascend910b all compile for the 910B tables). Misses go to one worker; their outcomes are
    stored unless the worker died or ran out of time. With ``verify``, the entry also holds the
    artifacts, put back into ``folder`` on a hit (docs/kernel-cache.md)."""
    keys = {policy: cache_key(compile_source=text, interface=interface, verify=verify,
                              pypto=PYPTO_VERSION, format=KERNEL_FORMAT,
                              cost_model=COST_MODEL.get(target.name))
            for policy, text in sources.items()}
    with cache.holding(keys.values()):
        known = {policy: cache.read(keys[policy], _cached_compile) for policy in sources}
        missing = {policy: text for policy, text in sources.items() if known[policy] is None}
        result = {"candidates": []}
        if missing:
            compiles[0] += len(missing)
            arrays, reference = data()
            result = _run_worker(folder, region, target, missing, key, arrays, reference, verify,
                                 timeout, parallel())
            if not result.get("transient"):
                for answer in result.get("candidates", []):
                    known[_policy(answer)] = _store_compile(cache, keys[_policy(answer)], answer)
    # a hit's artifacts stay in memory: only the tile the search picks is written out
    hits = [{**_policy_fields(policy), **known[policy]["result"],
             **({"artifact_files": known[policy]["artifacts"]} if known[policy]["artifacts"]
                else {})}
            for policy in sources if policy not in missing]
    return {**result, "candidates": hits + result.get("candidates", [])}


def _policy_fields(policy: TilePolicy) -> dict:
    return {k: v for k, v in _job_candidate(policy, "", "").items() if k not in ("module",
                                                                                "source")}


def _store_compile(cache: KernelCache, key: str, answer: dict) -> dict:
    """A compile's entry: its figures, and a checked compile's artifacts (the worker's
    ``artifacts`` folder for that candidate)."""
    entry = cache.staging()
    record = {name: answer[name] for name in COMPILE_FIELDS if name in answer}
    (entry / COMPILE_RESULT).write_text(json.dumps(record, indent=1, sort_keys=True))
    if answer.get("compiled") and answer.get("artifacts"):
        shutil.copytree(answer["artifacts"], entry / "artifacts")
    return _cached_compile(cache.put(key, entry))


def _cached_compile(files: dict[str, bytes]) -> dict:
    result = json.loads(files[COMPILE_RESULT])
    if not isinstance(result, dict) or set(result) - set(COMPILE_FIELDS):
        raise DamagedEntry("its compile result holds unknown fields")
    return {"result": result, "artifacts": {name[len("artifacts/"):]: data
                                            for name, data in files.items()
                                            if name.startswith("artifacts/")}}


def _keep_chosen_artifacts(result: dict, target: Path) -> None:
    """The shipped compile's artifacts into ``target``: the worker's folder for a compile run
    now (``artifacts``), the cached files for a hit (``artifact_files``)."""
    if result.get("artifacts"):
        os.rename(result["artifacts"], target)
    for name, data in result.get("artifact_files", {}).items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def default_candidate(fitting: list[dict], default_budget: int) -> dict | None:
    """What an untuned build would run: the default budget in the default orientation and
    layout, or when its leaves overflow the target's UB, the largest smaller budget that fits."""
    smaller = [c for c in fitting
               if c["budget"] <= default_budget and _policy(c) == TilePolicy(c["budget"])]
    return max(smaller, key=lambda c: c["budget"], default=None)


def _kernel_record(region, source, key, best, default, result, candidates) -> Kernel:
    verdicts = tuple((v["pass"], v["result"]) for v in result.get("verdicts", []))
    tolerance = max((TOLERANCE.get(str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(
        region.tensor_types[o][1]))), 0.0) for o in region.outputs), default=0.0)
    diff = result.get("max_abs_diff")
    functional_ok = bool(verdicts) and all(v == "PASS" for _, v in verdicts) and \
        diff is not None and diff <= tolerance
    reason = None if functional_ok else (
        f"{CHECK_FAILED} (max abs diff {diff}, passes "
        f"{[p for p, v in verdicts if v != 'PASS'] or 'none recorded'})")
    traffic = result.get("gm_bytes", {"read": 0, "written": 0})
    return Kernel(
        region.id, functional_ok, reason, source=source, cache_key=key,
        default_tile=_tile(default), tuned_tile=_tile(best),
        gm_bytes_read=traffic["read"], gm_bytes_written=traffic["written"],
        functional_ok=functional_ok, max_abs_diff=diff, verdicts=verdicts, candidates=candidates)


def _tile(candidate: dict | None) -> TileResult | None:
    """A candidate of the search as a kernel keeps it: its figures when it compiled."""
    if candidate is None:
        return None
    policy, compiled = _policy(candidate), bool(candidate.get("compiled"))
    return TileResult(policy.budget_bytes, candidate.get("aicore_us") if compiled else None,
                      candidate.get("total_us") if compiled else None, candidate.get("tasks") or 0,
                      candidate.get("ub_bytes"), policy.swap_transpose_tiles, policy.flat_rows,
                      policy.vec_merge)


def _failure(result: dict) -> str:
    if "error" in result:
        return result["error"]
    errors = [c.get("error") for c in result.get("candidates", []) if c.get("error")]
    return f"{COMPILE_FAILED}: {errors[0] if errors else 'no candidate compiled'}"


def _run_worker(folder: Path, region: Region, target: Target, sources: dict, key: str, arrays,
                reference, verify: bool, timeout: float, parallel: int = 1) -> dict:
    folder.mkdir(parents=True)
    np.savez(folder / "inputs.npz", **{f"in{i}": a for i, a in enumerate(arrays)})
    np.savez(folder / "reference.npz", **{f"out{i}": a for i, a in enumerate(reference)})
    job = {"function": KERNEL_FUNCTION, "verify": verify, "parallel": parallel,
           "candidates": [_job_candidate(p, key, text) for p, text in sources.items()],
           "outputs": _output_specs(region)}
    return _run_job(folder, job, target, timeout)


WORKER_MODULE = "pypto_offline.pypto_kernels.worker"


def _run_job(folder: Path, job: dict, target: Target, timeout: float) -> dict:
    """Every candidate's answer, from as many children as it takes. A child stops at its first
    failed compile (``worker.run_job``): a failed compile leaves PyPTO unusable in its process,
    and the candidates after it would fail with "function nested is not allowed", a false
    verdict the cache would keep. The candidates it left run in another child, from a copy of
    the job's folder's data (its inputs and reference)."""
    answer, attempt = _run_job_once(folder, job, target, timeout), 0
    while not answer.get("transient") and 0 < len(answer.get("candidates", [])) \
            < len(job["candidates"]):
        attempt += 1
        rest = {**job, "candidates": job["candidates"][len(answer["candidates"]):]}
        again = folder.with_name(f"{folder.name}-{attempt}")
        again.mkdir()
        for data in ("inputs.npz", "reference.npz"):  # linked: the same files, not rewritten
            if (folder / data).exists():
                os.link(folder / data, again / data)
        more = _run_job_once(again, rest, target, timeout)
        answer = {**more, "candidates": answer["candidates"] + more.get("candidates", [])}
    return answer


# Where jobs run when not here: a compile farm's ``run`` (``farm.ray_executor``), or None.
_remote = None


def _run_job_once(folder: Path, job: dict, target: Target, timeout: float) -> dict:
    """Write the job, run it in a child of this thread's fork server (or on the compile farm),
    read its result (or say why there is none). A failure that says nothing about the kernel
    (time-out, crash, kill) is ``transient``: the region falls back for this build only."""
    folder = folder.absolute()  # the worker runs in it: a relative --cache-dir would not resolve
    if _remote is not None:
        return _remote(folder, job, target, timeout)
    arch, platform = COST_MODEL.get(target.name, (None, None))
    host_compiler_cache = cache_root_of(folder)  # the kernel cache this job is staged in
    job = {**job, "folder": str(folder),
           "host_compiler_cache": host_compiler_cache and str(host_compiler_cache)}
    (folder / "job.json").write_text(json.dumps(job, indent=1))
    with _current_workers() as workers:
        # job folders are <cache>/tmp/<staging>/<job>: the server's goes next to the staging
        server = workers.server(folder.parent.parent, (arch, platform))
        try:
            if not server.ready and not server.wait_ready(max(timeout, DEFAULT_TIMEOUT_S),
                                                          workers):
                workers.drop(server)
                return _timed_out(max(timeout, DEFAULT_TIMEOUT_S))
            code = server.run(folder / "job.json", timeout, workers)
        except _ServerGone as gone:
            workers.drop(server)
            code = None if gone.timed_out else server.process.returncode
        if workers.cancelled:
            raise _Cancelled
    if code is None:
        return _timed_out(timeout)
    result_path = folder / "result.json"
    if code == 0 and result_path.exists():  # a child killed or failed after writing its
        return json.loads(result_path.read_text())  # answer is not trusted with it either
    return {"error": f"{CRASHED} (exit code {code})", "transient": True}


def _timed_out(limit: float) -> dict:
    return {"error": f"{TIMED_OUT} {limit:.0f} s", "transient": True}


def _last_line(log: Path) -> str:
    """The last non-blank line of a worker's log: for an import failure, the exception itself."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    meaningful = [line for line in lines if line]
    return meaningful[-1][:300] if meaningful else "it printed nothing"


def _output_specs(region: Region) -> list[dict]:
    """The region's outputs as the worker allocates them."""
    return [{"shape": list(region.tensor_types[o][0]),
             "dtype": _torch_dtype(kernel_dtype(region.tensor_types[o][1]))}
            for o in region.outputs]


def _torch_dtype(elem_type: int) -> str:
    return {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
            onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.INT32: "int32",
            onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT8: "int8",
            onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT16: "int16",
            onnx.TensorProto.BOOL: "bool"}[elem_type]


def _region_data(region: Region, graph: ImportedGraph, constants: dict):
    """Kernel arguments (seeded, or the constant's own value) and onnxruntime's result for the
    region's original ops on them."""
    rng = np.random.default_rng(0)
    feeds, arrays = {}, []
    for name in region.inputs:
        if name in constants:
            if not is_scalar_constant(name, constants):
                arrays.append(np.asarray(constants[name]))
            continue
        info = graph.tensors[name]
        dtype = info.np_dtype
        if dtype == np.bool_:
            value = rng.integers(0, 2, size=info.shape).astype(bool)
        elif np.issubdtype(dtype, np.floating):
            value = rng.uniform(-1.0, 1.0, size=info.shape).astype(dtype)
        else:
            value = rng.integers(0, 4, size=info.shape).astype(dtype)
        feeds[name] = value
        arrays.append(value)
    outputs = run_model(region_model(region, graph), feeds)
    # in the kernel's element types: an int64 tensor narrowed to int32 (classify.kernel_dtype)
    return ([_in_kernel_dtype(a) for a in arrays],
            [_in_kernel_dtype(outputs[name]) for name in region.outputs])


def _in_kernel_dtype(array: np.ndarray) -> np.ndarray:
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    return array.astype(onnx.helper.tensor_dtype_to_np_dtype(kernel_dtype(elem_type)),
                        copy=False)


def region_model(region: Region, graph: ImportedGraph) -> onnx.ModelProto:
    """The region's original nodes as a model of their own (the functional check's reference)."""
    members = set(region.nodes)
    nodes = [n for n in graph.model.graph.node if n.output[0] in members]
    used = {name for n in nodes for name in n.input}
    initializers = [t for t in graph.model.graph.initializer if t.name in used]
    constant_names = {t.name for t in initializers}
    value_info = lambda name: helper.make_tensor_value_info(  # noqa: E731
        name, graph.tensors[name].dtype, list(graph.tensors[name].shape))
    model = helper.make_model(
        helper.make_graph(nodes, region.id,
                          [value_info(n) for n in region.inputs if n not in constant_names],
                          [value_info(n) for n in region.outputs], initializers),
        opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    return model


def _save(kernel: Kernel, staged: Path) -> None:
    # keep the chosen compile's artifacts (``ARTIFACTS``), drop the simulator's bulky output
    # and the other checked candidates' artifacts
    for name in (p.name for p in staged.iterdir() if p.is_dir() and p.name != CHOSEN_ARTIFACTS):
        for bulky in (WORK, "ascend_log", "artifacts"):
            shutil.rmtree(staged / name / bulky, ignore_errors=True)
        for data in ("inputs.npz", "reference.npz"):  # re-derived by any build; every stored
            (staged / name / data).unlink(missing_ok=True)  # byte is hashed on each read
    if (staged / CHOSEN_ARTIFACTS).is_dir():
        (staged / "final").mkdir(exist_ok=True)
        os.rename(staged / CHOSEN_ARTIFACTS, staged / ARTIFACTS)
    record = {k: v for k, v in kernel.__dict__.items()
              if k not in ("artifacts", "from_cache", "pypto_compiles")}
    for tile in ("default_tile", "tuned_tile"):
        if record[tile] is not None:
            record[tile] = record[tile].__dict__
    record["candidates"] = [c.__dict__ for c in record["candidates"]]
    (staged / "kernel.json").write_text(json.dumps(record, indent=1, sort_keys=True))


ARTIFACTS = "final/artifacts/"  # in a kernel's entry: the shipped compile's artifacts
CHOSEN_ARTIFACTS = "chosen-artifacts"  # in its staging folder, until ``_save`` places them


def _load(files: dict[str, bytes], region_id: str, from_cache: bool) -> Kernel:
    """An entry's kernel (from its files, by relative path) as ``region_id``'s: an entry serves
    every region with the same work."""
    record = json.loads(files["kernel.json"])
    for tile in ("default_tile", "tuned_tile"):
        if record[tile] is not None:
            record[tile] = TileResult(**record[tile])
    record["candidates"] = tuple(TileResult(**c) for c in record["candidates"])
    record["verdicts"] = tuple(tuple(v) for v in record["verdicts"])
    artifacts = {name[len(ARTIFACTS):]: data for name, data in files.items()
                 if name.startswith(ARTIFACTS)}
    return Kernel(**{**record, "region_id": region_id}, artifacts=artifacts,
                  from_cache=from_cache)


__all__ = ["compile_kernels", "compile_region", "compile_regions", "region_model", "single_op_costs",
           "single_op_regions", "unfused_cost_us", "unfused_costs"]


def unfused_cost_us(region: Region, graph: ImportedGraph, target: Target, cache: KernelCache,
                    constants: dict, timeout: float = DEFAULT_TIMEOUT_S) -> float | None:
    """PyPTO cost-model time of the region's ops as one kernel each (reshape-likes are free),
    each at its best tile: the measured baseline fused kernels are compared with (a default
    build estimates it instead: pypto_kernels/baseline.py). None when an op did not compile."""
    costs = [us for _, us in single_op_costs(region, graph, target, cache, constants, timeout)]
    return None if None in costs else sum(costs)


def single_op_costs(region: Region, graph: ImportedGraph, target: Target, cache: KernelCache,
                    constants: dict, timeout: float = DEFAULT_TIMEOUT_S
                    ) -> list[tuple[Region, float | None]]:
    """Each device op of the region as a kernel of its own, with its cost-model time at its best
    tile (None: no tile compiled, or the op cannot be written). Cost only, no check. Each op's
    time is cached on its own, so an op that recurs (the same op on the same shapes in another
    region or model) is compiled once; the region's other ops share one worker process."""
    singles = single_op_regions(region, graph)
    if not singles:
        return []
    ub = target.ub_plan_bytes.value
    sources, keys = {}, {}
    for single in singles:
        try:
            sources[single.id] = distinct_sources(
                single, candidate_policies(ub, largest_tensor_bytes(single)), constants)
        except CannotExpress:
            continue
        keys[single.id] = cache_key(
            unfused_op=sorted(f"{p.name}:{t}" for p, t in sources[single.id].items()),
            interface=kernel_interface(single, constants), target=target.name,
            pypto=PYPTO_VERSION, format=KERNEL_FORMAT, cost_model=COST_MODEL.get(target.name))
    with cache.holding(keys.values()):
        known = {}
        for single in singles:
            if single.id not in keys:
                continue
            record = cache.read(keys[single.id], lambda files, texts=sources[single.id]:
                                _cached_op_cost(files, texts))
            if record is not None:
                known[keys[single.id]] = record["unfused_us"]
        missing = {keys[s.id]: s for s in singles if s.id in keys and keys[s.id] not in known}
        if missing:
            known.update(_measure_single_ops(missing, sources, graph, target, cache, constants,
                                             timeout))
    return [(s, known[keys[s.id]] if s.id in keys else None) for s in singles]


def _op_cost_record(us: float | None, sources: dict[TilePolicy, str]) -> dict:
    """A single op's cached baseline: its best time and the sources it was measured on."""
    return {"unfused_us": us, "sources": {p.name: text for p, text in sources.items()}}


def _cached_op_cost(files: dict[str, bytes], sources: dict[TilePolicy, str]) -> dict:
    """A cached baseline entry, if it is the one this build would measure."""
    record = json.loads(files["kernel.json"])
    if record["sources"] != _op_cost_record(None, sources)["sources"]:
        raise DamagedEntry("its kernel sources are not the ones generated for this build")
    if not isinstance(record["unfused_us"], (int, float, type(None))):
        raise DamagedEntry("its time is not a number")
    return record


def _measure_single_ops(singles: dict[str, Region], sources: dict, graph: ImportedGraph,
                        target: Target, cache: KernelCache, constants: dict,
                        timeout: float) -> dict[str, float | None]:
    """Compile each op (by cache key) at each of its tiles in one worker process: its best time
    that fits the target's UB, or None when none compiled. Cached unless the worker died or
    ran out of time (then None for this build only)."""
    staged = cache.staging()
    try:
        folder = staged / "unfused"
        folder.mkdir()
        arrays, candidates = {}, []
        for key, single in sorted(singles.items()):
            data, _ = _region_data(single, graph, constants)
            names = [f"{key[:16]}_in{i}" for i in range(len(data))]
            arrays.update(zip(names, data))
            for policy, text in sources[single.id].items():
                candidates.append({
                    **_job_candidate(policy, key, text), "function": KERNEL_FUNCTION, "op": key,
                    "inputs": names, "outputs": _output_specs(single)})
        np.savez(folder / "inputs.npz", **arrays)
        result = _run_job(folder, {"function": KERNEL_FUNCTION, "verify": False,
                                   "candidates": candidates, "outputs": []}, target, timeout)
        best = {key: None for key in singles}
        ub = target.ub_plan_bytes.value
        for c in result.get("candidates", []):
            if c.get("compiled") and c.get("aicore_us") and fits_ub(c.get("ub_bytes"), ub):
                best[c["op"]] = min(best[c["op"]] or float("inf"), c["aicore_us"])
        if result.get("transient"):
            return best
        for key, us in best.items():
            entry = cache.staging()
            record = _op_cost_record(us, sources[singles[key].id])
            (entry / "kernel.json").write_text(json.dumps(record, indent=1, sort_keys=True))
            cache.put(key, entry)
        return best
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def single_op_regions(region: Region, graph: ImportedGraph) -> list[Region]:
    """Each device op of the region's original program as a region of its own."""
    singles = []
    for index, op in enumerate(region.original):
        if op.op_type in ("Reshape", "Identity"):
            continue  # metadata on contiguous data: no kernel before fusion either
        names = list(op.inputs) + list(op.outputs)
        types = {n: (tuple(graph.tensors[n].shape), graph.tensors[n].dtype) for n in names}
        singles.append(Region(
            id=f"{region.id}_op{index}", nodes=(op.outputs[0],), inputs=tuple(op.inputs),
            outputs=tuple(op.outputs), original=(op,), simplified=(op,), rules_applied=(),
            unfused=region.unfused, fused=region.fused, tensor_types=MappingProxyType(types)))
    return singles
