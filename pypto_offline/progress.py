"""What a build says about itself while it runs: its stages and finished kernels (``Progress``),
and where its time went (``Timings``). Neither reaches the blob nor the report, which must be
byte-identical between two builds of the same model (docs/outputs.md, "Progress and timings").
"""
from __future__ import annotations

import time
from contextlib import contextmanager

# The stages of a build, as the JSON summary's `timings` names them; a stage the build skipped
# (no --verify, nothing written) took 0 s.
TIMED_STAGES = ("import_s", "plan_s", "kernels_s", "baseline_s", "verify_s", "write_s")


def seconds_text(seconds: float) -> str:
    """A time limit in a message, as it was given: ``300 s``, ``0.5 s`` (``--kernel-timeout
    0.5`` rounded to whole seconds said "within 0 s")."""
    return f"{seconds:g} s"


class Progress:
    """The protocol a build reports through; this base says nothing (the API's default).
    ``kernel`` is called from the kernel pool's threads, one call at a time, in completion
    order: ``done`` counts the kernels finished so far, this one included."""

    def stage(self, name: str) -> None:
        """A stage starts: "importing", "planning fusion", "compiling 3 kernels with PyPTO"..."""

    def kernel(self, done: int, total: int, region, kernel) -> None:
        """``region`` (a fusion Region) finished as ``kernel`` (a pypto_kernels Kernel):
        compiled, read from the cache, or fallen back."""


SILENT = Progress()


class Labelled(Progress):
    """``progress`` with each stage said as ``label: stage``: whose stage it is, where several
    builds run in step (a blob's gears, ``offline_compiler/rounds.py``)."""

    def __init__(self, progress: Progress, label: str):
        self._progress, self._label = progress, label

    def stage(self, name: str) -> None:
        self._progress.stage(f"{self._label}: {name}")

    def kernel(self, done: int, total: int, region, kernel) -> None:
        self._progress.kernel(done, total, region, kernel)


class Timings:
    """Wall-clock seconds per stage of one build, added up over each ``stage`` block."""

    def __init__(self):
        self._seconds = dict.fromkeys(TIMED_STAGES, 0.0)

    @contextmanager
    def stage(self, name: str):
        if name not in self._seconds:
            raise ValueError(f"unknown build stage {name!r}: one of {', '.join(TIMED_STAGES)}")
        started = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] += time.perf_counter() - started

    def as_dict(self) -> dict[str, float]:
        return {name: round(seconds, 3) for name, seconds in self._seconds.items()}
