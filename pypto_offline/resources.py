"""Where and with what a build runs, checked before any work: the executor of its PyPTO jobs
(local fork servers or a Ray cluster), a pool of workers shared by several builds, the kernel
cache it may use, and the bounds of --jobs and --kernel-timeout. Part of the Python API
(``pypto_offline.api`` re-exports each)."""
from __future__ import annotations

import math
from contextlib import nullcontext

from pypto_offline.errors import UsageError

# More PyPTO workers than this only queue on any machine this runs on, and each holds its own
# memory; the bound keeps a typo (--jobs 10000) from forking the machine to death.
MAX_JOBS = 64
# A compile past a day is stuck, not slow (the largest corpus region compiles in minutes); the
# bound also keeps the limit within what the workers' poll() takes (a C int of milliseconds).
MAX_KERNEL_TIMEOUT_S = 86_400


def executor(name: str = "local", address: str | None = None):
    """A block with an executor for the PyPTO jobs of the builds given it (``compile(...,
    executor=...)``): ``local`` (fork servers on this machine) or ``ray`` (a Ray cluster at
    ``address``, default ``RAY_ADDRESS``, else one started for the block;
    ``pypto_kernels/jobs/ray.py``). Its ``slots``: the jobs it runs at once (None: as many as
    the build's ``jobs``)."""
    if name == "local":
        from pypto_offline.pypto_kernels.jobs.executor import LocalExecutor

        return nullcontext(LocalExecutor())
    if name == "ray":
        from pypto_offline.pypto_kernels.jobs.ray import ray_executor

        return ray_executor(address)
    raise UsageError(f"unknown executor {name!r}", fix="use --executor local or ray")


def shared_workers(jobs: int = 2):
    """A block in which every ``compile`` shares one pool of ``jobs`` PyPTO worker threads and
    their fork servers (torch and PyPTO imported once for a batch of models and targets)::

        with pypto_offline.api.shared_workers(2):
            for model in models:
                pypto_offline.compile(model, "kirin9050").save(...)
    """
    from pypto_offline.pypto_kernels.jobs.pool import shared_pool

    check_limits(jobs, None)
    return shared_pool(jobs)


def check_cache(cache_dir=None, trust_group: str | None = None):
    """Refuse, before any work, a kernel cache a build could not use: a path that is no folder,
    a folder another user could change (docs/kernel-cache.md, "The trust rule"), or a folder
    holding anything but a cache of ours ("What a cache may touch"). Returns the cache's trust,
    for ``compile``."""
    from pypto_offline.pypto_kernels.cache import cache_folder, check_cache_root
    from pypto_offline.pypto_kernels.cache_trust import trust_for

    trust = trust_for(trust_group)
    check_cache_root(cache_folder(cache_dir), trust)
    return trust


def check_limits(jobs: int, kernel_timeout: float | None) -> None:
    """Refuse resource options outside what makes sense, before any work."""
    if not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
        raise UsageError(f"--jobs must be positive and at most {MAX_JOBS}, not {jobs}",
                         fix="give the number of parallel PyPTO compiles, e.g. --jobs 2")
    if kernel_timeout is not None and not (math.isfinite(kernel_timeout)
                                           and 0 < kernel_timeout <= MAX_KERNEL_TIMEOUT_S):
        raise UsageError(f"--kernel-timeout must be positive and at most {MAX_KERNEL_TIMEOUT_S} "
                         f"s (a day), not {kernel_timeout}", fix="e.g. --kernel-timeout 300")
