"""The threads a build runs its regions' work in, each with the PyPTO processes it started.

Threads are enough: each only waits on its worker process. A pool thread starts its fork
servers on its first job, and they live as long as the thread (PDEATHSIG); the pool's
``Workers`` kill them all on an interrupt (docs/workers.md).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

from pypto_offline.errors import BuildInterrupted
from pypto_offline.pypto_kernels.jobs.processes import Workers

Item = TypeVar("Item")
_thread = threading.local()  # the Workers of the build a pool thread works for


@contextlib.contextmanager
def current_workers() -> Iterator[Workers]:
    """The build's workers in one of its pool threads; elsewhere (a region compiled on its own)
    a set of one's own for this job, shut down after it (on an interrupt too)."""
    workers = getattr(_thread, "workers", None)
    if workers is not None:
        yield workers
        return
    workers = Workers()
    try:
        yield workers
    finally:  # its server dies (a child that ran out of time or was interrupted died already)
        workers.shutdown()


def cancelled() -> bool:
    """Whether the build this thread works for was interrupted (an executor waiting on a remote
    job stops waiting then)."""
    workers = getattr(_thread, "workers", None)
    return workers is not None and workers.cancelled


@contextlib.contextmanager
def working_for(workers: Workers) -> Iterator[None]:
    """This thread's jobs run in ``workers``' processes within the block (a Ray node's actor
    thread, a pool thread)."""
    _thread.workers = workers
    try:
        yield
    finally:
        _thread.workers = None


def _work_for(workers: Workers, work: Callable, item):
    with working_for(workers):
        return work(item)


class Pool:
    """``jobs`` threads and the PyPTO processes they run (``Workers``)."""

    def __init__(self, jobs: int):
        self.workers = Workers()
        self.threads = ThreadPoolExecutor(max(1, jobs))

    def close(self) -> None:
        self.threads.shutdown(wait=True, cancel_futures=True)
        self.workers.shutdown()


_shared: Pool | None = None  # the pool of a batch of builds (``shared_pool``), if any


def in_shared_pool() -> bool:
    """Whether a ``shared_pool`` block is open (its builds share it; blocks do not nest)."""
    return _shared is not None


@contextlib.contextmanager
def shared_pool(jobs: int) -> Iterator[None]:
    """One pool of ``jobs`` threads and fork servers for every build in the block (a batch of
    models and targets: the servers import torch and PyPTO once for all of them). An interrupt
    kills its processes; the block must run in one thread at a time."""
    global _shared
    if _shared is not None:
        raise RuntimeError("shared_workers blocks do not nest")
    _shared = Pool(jobs)
    try:
        yield
    except BaseException:
        _shared.workers.cancel()
        raise
    finally:
        pool, _shared = _shared, None
        pool.close()


def each(items: Sequence[Item], jobs: int, work: Callable[[Item], object],
         order: Sequence[int] | None = None) -> list:
    """``work`` of each item, in item order, ``jobs`` at a time (the shared pool's, in a
    batch), started in ``order`` (indices; default item order). On the first error the queued
    items are dropped and the running ones finish before it propagates; on an interrupt (which
    only the main thread receives) the running workers are killed first: an interrupted build
    makes no Kernel records."""
    pool = _shared or Pool(jobs)
    started = {}
    try:
        for i in range(len(items)) if order is None else order:
            started[i] = pool.threads.submit(_work_for, pool.workers, work, items[i])
        futures = [started[i] for i in range(len(items))]
        wait_interruptibly(futures)
        for future in futures:  # the first failure in item order, without waiting for others
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


# How long the main thread blocks at a time while the pool works (``wait_interruptibly``)
SIGNAL_CHECK_S = 0.25
_signalled: list[int] = []  # the signals ``interrupt`` was called for: the build must end


def interrupt(signum: int, _frame=None) -> None:
    """The build's SIGINT and SIGTERM handler (cli ``_signals_interrupt``): records the signal,
    then raises. The raise alone can be lost: Python runs a handler wherever the main thread
    next runs Python code, a finaliser included, and a finaliser's exception is only printed
    ("Exception ignored in ..."); the record is checked again (``raise_if_interrupted``)."""
    _signalled.append(signum)
    raise BuildInterrupted(signum)


def raise_if_interrupted() -> None:
    """BuildInterrupted if a signal was handled by ``interrupt`` (its own raise lost)."""
    if _signalled:
        raise BuildInterrupted(_signalled[0])


def forget_interrupts() -> None:
    _signalled.clear()


def wait_interruptibly(futures: list) -> None:
    """Until every future is done or one failed, waking every ``SIGNAL_CHECK_S``. A blocked
    wait returns to Python code only when a signal reaches the main thread itself, and the
    kernel may deliver it to any thread (Ray's driver runs threads of its own); the handler,
    left pending, then runs wherever Python code next runs in the main thread, and a finaliser
    there swallows what it raises. Waking up here raises the interrupt in this frame within
    ``SIGNAL_CHECK_S``, even one whose own raise was lost (``interrupt``)."""
    while True:
        raise_if_interrupted()
        done, not_done = wait(futures, timeout=SIGNAL_CHECK_S, return_when=FIRST_EXCEPTION)
        if not not_done or any(f.exception() is not None for f in done):
            return


class SpareThreads:
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

    def done(self, result):
        with self._lock:
            self._left -= 1
        return result
