"""Kernel cache entries made by hand, for the tests of the cache's checks (no PyPTO), and
copies of a cache compiled once for the run (``warm_cache``)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from pypto_offline.pypto_kernels.cache import KernelCache


def warm_cache(cache: Path, folder: Path) -> Path:
    """A copy of ``cache`` (conftest's ``example_cache``) at ``folder``/cache, the test's own to
    write to: its builds of the example hit instead of compiling cold."""
    return Path(shutil.copytree(cache, folder / "cache", symlinks=True))


def stored(cache: KernelCache, key: str, files: dict[str, str]) -> Path:
    """An entry of ``files`` (relative path → text) put under ``key`` as the cache puts one."""
    staged = cache.staging()
    for name, text in files.items():
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_text(text)
    cache.put(key, staged)
    return cache.entry(key)


def as_json(files: dict[str, bytes]) -> dict:
    """An entry read back: its kernel.json."""
    return json.loads(files["kernel.json"])
