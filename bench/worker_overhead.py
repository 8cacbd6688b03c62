"""Per-job overhead of a PyPTO worker, as ``compiler._run_job`` pays it: the wall time of a job
with no candidate (process start or fork, imports, result) and of a one-candidate job (the tiny
Relu→Neg kernel on 1x8x16x16 fp32, no check), median of ``--repeat`` runs, all in one pool
thread of one build (as a build's jobs are). docs/workers.md.

    python -m bench.worker_overhead [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tests import test_fork_server as jobs


def timed(job: tuple[dict, list], repeat: int, root: Path) -> list[float]:
    jobs.SECONDS.clear()
    for result, _, _ in jobs.run_jobs(root, [job] * repeat):
        assert jobs.compiled(result), result
    return [round(s, 3) for s in jobs.SECONDS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    job, arrays = jobs.tiny_job()
    with tempfile.TemporaryDirectory() as root:
        empty = timed(({**job, "candidates": []}, arrays), repeat, Path(root) / "empty")
        one = timed((job, arrays), repeat, Path(root) / "one")
    print(json.dumps({"zero_candidates_s": empty, "one_candidate_s": one,
                      "median_zero_s": statistics.median(empty),
                      "median_one_s": statistics.median(one)}, indent=1))


if __name__ == "__main__":
    main()
