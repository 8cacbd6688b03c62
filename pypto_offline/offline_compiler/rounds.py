"""Builds run in rounds of compiles: one or several builds (a blob's gears) in step, so that
every build's next regions go to the PyPTO pool in one round.

A build is a generator (``build.build_steps``): it imports and plans, then yields a
``Compiles`` whenever it needs kernels and is sent them back, in the order of its regions, until
it returns its result. ``in_rounds`` runs every build to its next request, compiles all the
requests of the round together (``compile_regions``: one pool, one cache, one order that takes
one region of each kind of work first across every build), and sends each build its own kernels.
Built one after another, each gear's compiles ended with the pool idling on its last kernels
and its serial stages; in rounds, a kernel two gears share is one region's compile with the
other gear's copy a cache hit at the end of the round, and a farm (``--executor ray``) is given
every gear's regions at once (docs/gears.md, "Building").

The result does not depend on the rounds: a kernel is the same whether compiled or read from
the cache (docs/kernel-cache.md), and each build's kernels come back in its regions' order.
"""
from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass

from pypto_offline.fusion.records import Region
from pypto_offline.importer import ImportedGraph
from pypto_offline.progress import Progress, Timings
from pypto_offline.pypto_kernels import Kernel
from pypto_offline.pypto_kernels.compiler import compile_regions
from pypto_offline.targets import Target


@dataclass(frozen=True)
class Compiles:
    """A build's request: the kernels of ``regions`` (of ``graph``) compiled for ``target``."""

    graph: ImportedGraph
    regions: tuple[Region, ...]
    target: Target


Steps = Generator[Compiles, tuple[Kernel, ...], object]


def in_rounds(steps: Sequence[Steps], context, progress: Progress, timings: Timings) -> list:
    """Each build's result, in order. ``context`` (a ``build.BuildContext``): how the kernels
    compile (each target's cache, executor and time limit; jobs, tile search), the same for
    every build here; the compile rounds' seconds go to ``timings``' ``kernels_s``."""
    results: list = [None] * len(steps)
    answers: dict[int, tuple[Kernel, ...] | None] = dict.fromkeys(range(len(steps)))
    while answers:
        asks = {}
        for index, answer in answers.items():
            try:
                asks[index] = steps[index].send(answer)
            except StopIteration as finished:
                results[index] = finished.value
        answers = _compiled_together(asks, context, progress, timings)
    return results


def _compiled_together(asks: Mapping[int, Compiles], context, progress: Progress,
                       timings: Timings) -> dict[int, tuple[Kernel, ...]]:
    """Every request of a round compiled, one ``compile_regions`` per target (a build's
    --compare-platform round asks for PyPTO's 910B platform), each build's kernels split back
    out in its regions' order."""
    answers: dict[int, tuple[Kernel, ...]] = {}
    for target in _distinct(ask.target for ask in asks.values()):
        mine = [index for index, ask in asks.items() if ask.target == target]
        work = [(region, asks[index].graph) for index in mine for region in asks[index].regions]
        if len(mine) > 1:
            progress.stage(f"compiling the {len(work)} kernels of {len(mine)} builds together")
        kernels: Sequence[Kernel] = ()
        if work:
            with timings.stage("kernels_s"):
                kernels = compile_regions(work, context.setup(target),
                                          jobs=context.options.jobs,
                                          search=context.options.tile_search, progress=progress)
        start = 0
        for index in mine:
            count = len(asks[index].regions)
            answers[index] = tuple(kernels[start:start + count])
            start += count
    return answers


def _distinct(targets) -> list[Target]:
    found: list[Target] = []
    for target in targets:
        if target not in found:
            found.append(target)
    return found
