"""Executors for tests: the build takes one (``pypto_kernels/jobs/executor.py``), so a test
replaces or watches where jobs run without touching the compiler's insides."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from pypto_offline.pypto_kernels.jobs.executor import LocalExecutor
from pypto_offline.pypto_kernels.jobs.protocol import (CandidateResult, Job, JobResult,
                                                       crashed)
from pypto_offline.pypto_kernels.tiling import TilePolicy


def policy_of(candidate) -> TilePolicy:
    """A job's candidate as the tile policy it was generated for."""
    return TilePolicy(candidate.budget, candidate.swapped, candidate.flat, candidate.merge)


class ScriptedExecutor:
    """Compiles nothing: each job's answer is made up by ``answer(job, folder)`` (a JobResult,
    or a function of each candidate's policy giving the result's figures). Keeps every job it
    was given, with its folder. No kernel is claimed compiled by a test that uses it."""

    slots = None

    def __init__(self, answer: Callable):
        self._answer = answer
        self.jobs: list[tuple[Path, Job]] = []

    def run(self, folder: Path, job: Job, target, timeout: float) -> JobResult:
        self.jobs.append((folder, job))
        return self._answer(job, folder)


def figures(make: Callable[[TilePolicy, Job, Path], dict | None]) -> Callable:
    """An ``answer`` for ScriptedExecutor from per-candidate figures: ``make(policy, job,
    folder)`` gives the result's fields (compiled, aicore_us, ub_bytes, ...), or None when the
    whole job's worker crashed."""
    def answer(job: Job, folder: Path) -> JobResult:
        results = []
        for candidate in job.candidates:
            made = make(policy_of(candidate), job, folder)
            if made is None:
                return JobResult.failed(crashed("exit code -11"))
            results.append(CandidateResult(candidate.budget, candidate.swapped, candidate.flat,
                                           candidate.merge, **made))
        return JobResult(tuple(results))
    return answer


class RecordingExecutor:
    """The real local executor, every job and result kept (``on_result`` may look at a result
    as it comes back)."""

    slots = None

    def __init__(self, on_result: Callable[[Path, Job, JobResult], None] | None = None):
        self._local = LocalExecutor()
        self._on_result = on_result
        self.runs: list[tuple[Path, Job, JobResult]] = []

    def run(self, folder: Path, job: Job, target, timeout: float) -> JobResult:
        result = self._local.run(folder, job, target, timeout)
        self.runs.append((folder, job, result))
        if self._on_result:
            self._on_result(folder, job, result)
        return result
