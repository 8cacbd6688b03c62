"""Content-addressed kernel cache, safe when several builds share it.

Key = sha256 over the kernel source, tensor shapes and dtypes, tiling candidates, target and PyPTO
version; never a region's or tensor's name, so regions (of one model or several) that do the same
work share an entry. An entry is a folder written under a temporary name and renamed into place
in one step: a reader sees a whole entry or none, and when two builds race the first rename wins.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pypto-offline" / "kernels"


def cache_key(**parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class KernelCache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_cache_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    @contextmanager
    def holding(self, keys) -> Iterator[None]:
        """Within one build, one thread at a time computes an entry: a second region wanting the
        same key waits and then finds it, instead of compiling it again. Keys are taken in sorted
        order, so two threads holding several never wait on each other."""
        with self._locks_guard:
            locks = [self._locks.setdefault(key, threading.Lock()) for key in sorted(set(keys))]
        with ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> Path | None:
        path = self.entry(key)
        return path if (path / "kernel.json").exists() else None

    def put(self, key: str, staged: Path) -> Path:
        """Move a filled staging folder into place (atomically); returns the entry."""
        final = self.entry(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staged, final)
        except OSError:  # another build stored the same kernel first: keep theirs
            shutil.rmtree(staged, ignore_errors=True)
        return final

    def staging(self) -> Path:
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=self.root / "tmp"))
