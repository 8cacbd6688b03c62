"""Where a job runs: the ``Executor`` interface, the local fork-server executor, and the retry
of the candidates a child left.

An executor takes a job and the folder holding its data (``protocol.DATA_FILES``), and gives
the job's result with the files it made (a checked compile's artifacts) in that folder. The
build asks no more of it, so a job runs the same here (``LocalExecutor``) as on a cluster
(``jobs/ray.py``), and a test can give the build an executor of its own.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable, Protocol

from pypto_offline.pypto_kernels.cache import cache_root_of
from pypto_offline.pypto_kernels.jobs import pool
from pypto_offline.pypto_kernels.jobs.processes import Cancelled, ServerGone, calculator_built
from pypto_offline.pypto_kernels.jobs.protocol import (DATA_FILES, JOB_FILE, RESULT_FILE, Job,
                                                       JobResult, crashed, timed_out)
from pypto_offline.pypto_kernels.platform import platform_of
from pypto_offline.pypto_kernels.versions import DEFAULT_TIMEOUT_S
from pypto_offline.targets import Target


class Executor(Protocol):
    # how many jobs it runs at once (a cluster's CPUs), or None: as many as the build asks
    slots: int | None

    def run(self, folder: Path, job: Job, target: Target, timeout: float) -> JobResult:
        """Run ``job`` once, its data in ``folder`` (absolute), under ``target``'s platform,
        within ``timeout`` seconds; its result, the files it made in ``folder``. A failure
        that says nothing about the kernel (time-out, crash, kill) is transient."""


class LocalExecutor:
    """Jobs in a child of a fork server of this machine: the calling pool thread's (``pool``),
    or those of ``workers`` when given (a Ray node's)."""

    slots = None  # the build's --jobs

    def __init__(self, workers=None):
        self._workers = workers

    def run(self, folder: Path, job: Job, target: Target, timeout: float) -> JobResult:
        host_compiler_cache = cache_root_of(folder)  # the kernel cache this job is staged in
        job = Job(**{**job.__dict__, "folder": str(folder),
                     "host_compiler_cache": host_compiler_cache and str(host_compiler_cache)})
        (folder / JOB_FILE).write_text(job.to_json())
        if self._workers is not None:
            with pool.working_for(self._workers):
                return self._run_in(self._workers, folder, target, timeout)
        with pool.current_workers() as workers:
            return self._run_in(workers, folder, target, timeout)

    @staticmethod
    def _run_in(workers, folder: Path, target: Target, timeout: float) -> JobResult:
        # job folders are <cache>/<STAGING>/<staging>/<job>: the server's goes next to the staging
        server = workers.server(folder.parent.parent, platform_of(target))
        startup = max(timeout, DEFAULT_TIMEOUT_S)
        try:
            if not server.ready and not server.wait_ready(startup, workers):
                workers.drop(server)
                return JobResult.failed(timed_out(startup))
            code = server.run(folder / JOB_FILE, timeout, workers)
        except ServerGone as gone:
            workers.drop(server)
            code = None if gone.timed_out else server.process.returncode
        if workers.cancelled:
            raise Cancelled
        if code is None:
            return JobResult.failed(timed_out(timeout))
        result_path = folder / RESULT_FILE
        if code == 0 and result_path.exists():  # a child killed or failed after writing its
            return JobResult.from_dict(json.loads(result_path.read_text()))  # answer is not
        return JobResult.failed(crashed(f"exit code {code}"))  # trusted with it either


# What a build says before the job whose fork server builds PyPTO's calculator (docs/workers.md)
HOST_LIBRARY_NOTICE = "building PyPTO's host library once (~2 min)"


class FirstBuildNotice:
    """``executor`` (this machine's fork servers), saying ``HOST_LIBRARY_NOTICE`` through
    ``say`` before its first job when PyPTO's calculator is not built yet: the first server on a
    machine builds it, about two minutes in which nothing else would be said. Asked once, at the
    first job: a build whose kernels all come from the cache starts no server and says nothing."""

    def __init__(self, executor: Executor, say: Callable[[str], None]):
        self._executor, self._say = executor, say
        self.slots = executor.slots
        self._lock, self._asked = threading.Lock(), False

    def run(self, folder: Path, job: Job, target: Target, timeout: float) -> JobResult:
        with self._lock:
            if not self._asked:
                self._asked = True
                if not calculator_built():
                    self._say(HOST_LIBRARY_NOTICE)
        return self._executor.run(folder, job, target, timeout)


def noticing_first_build(executor: Executor, say: Callable[[str], None]) -> Executor:
    """``executor`` with a ``FirstBuildNotice`` when its jobs run on this machine (a Ray node
    builds its own calculator, out of the build's sight)."""
    return FirstBuildNotice(executor, say) if isinstance(executor, LocalExecutor) else executor


def run_job(executor: Executor, folder: Path, job: Job, target: Target,
            timeout: float) -> JobResult:
    """Every candidate's answer, from as many runs as it takes. A child stops at its first
    failed compile (``worker.run_job``): a failed compile leaves PyPTO unusable in its process,
    and the candidates after it would fail with "function nested is not allowed", a false
    verdict the cache would keep. The candidates it left run again, from a folder of their own
    linked to the job's data (its inputs and reference)."""
    folder = folder.absolute()  # the worker runs in it: a relative --cache-dir would not resolve
    answer, attempt = executor.run(folder, job, target, timeout), 0
    while not answer.transient and 0 < len(answer.candidates) < len(job.candidates):
        attempt += 1
        rest = job.rest(len(answer.candidates))  # of the job as given: its candidates not
        again = folder.with_name(f"{folder.name}-{attempt}")
        again.mkdir()
        for data in DATA_FILES:  # linked: the same files, not rewritten
            if (folder / data).exists():
                os.link(folder / data, again / data)
        more = executor.run(again, rest, target, timeout)
        answer = JobResult(answer.candidates + more.candidates, more.failure)  # answered yet
    return answer
