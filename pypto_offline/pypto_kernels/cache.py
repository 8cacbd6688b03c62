"""Content-addressed kernel cache, safe when several builds share it.

Key = sha256 over the kernel source, tensor shapes and dtypes, tiling candidates, target and PyPTO
version. An entry is a folder written under a temporary name and renamed into place in one step:
a reader sees a whole entry or none, and when two builds race the first rename wins.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
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
