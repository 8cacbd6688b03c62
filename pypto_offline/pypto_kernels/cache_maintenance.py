"""The kernel cache seen from outside a build: what it holds (``pypto-offline cache info``) and
removing entries (``pypto-offline cache clean``), safe while builds use it. docs/kernel-cache.md,
"Managing the cache".

Safe, because only whole entries are removed, the way a damaged one is (``KernelCache._discard``):
renamed in one step into the cache's staging area, then deleted there, so a reader sees an entry
whole or not at all, and a build that loses one as it reads it takes it for a miss. An entry is
written under a temporary name in a staging folder and renamed into place only once complete
(``KernelCache.put``), so no entry is ever half-written in place. Staging folders are left to
``remove_dead_staging``, which keeps those of live builds.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pypto_offline.errors import UsageError
from pypto_offline.pypto_kernels.cache import (KEY_NAME, STAGING, check_cache_root, check_ours,
                                               entry_folders, new_staging, remove_dead_staging,
                                               writable_staging)
from pypto_offline.pypto_kernels.cache_trust import Trust, check_folder, trust_for
from pypto_offline.pypto_kernels.entries import KIND_OF_FILE
from pypto_offline.pypto_kernels.host_compiler_cache import PCH_SUBFOLDER, SUBFOLDER

# The caches kept inside a kernel cache, each with entries and staging of its own, by the kind
# of their entries (the kernel cache's own entries are told apart by their files: ``_kind``).
NESTED = {"host_compiler": SUBFOLDER, "host_compiler_pch": PCH_SUBFOLDER}
KINDS = (*KIND_OF_FILE.values(), "host_compiler", "host_compiler_pch", "other")
SECONDS_PER_DAY = 86400
BYTES_PER_GB = 10**9  # --max-size is in GB, as disk sizes are written


@dataclass(frozen=True)
class Entry:
    path: Path
    kind: str
    size: int  # bytes of its files
    last_used: float  # its folder's mtime: set when stored, renewed on each hit (cache.touch)


def cache_info(root: Path) -> dict:
    """What the cache in ``root`` holds: its entries by kind and its size in bytes (entries,
    staging folders and anything else in it). A folder that is no cache is refused
    (``cache.check_ours``), as a build refuses it."""
    check_ours(root)
    found = entries(root)
    by_kind = {kind: sum(e.kind == kind for e in found) for kind in KINDS}
    return {"folder": str(root), "exists": root.is_dir(), "entries": len(found),
            "entries_by_kind": {k: n for k, n in by_kind.items() if n},
            "entry_bytes": sum(e.size for e in found), "total_bytes": folder_bytes(root)}


def clean_cache(root: Path, older_than_days: float | None = None,
                max_size_gb: float | None = None, now: float | None = None,
                trust: Trust | None = None) -> dict:
    """Remove entries: all of them without a limit; with ``older_than_days``, those not used
    for that long; with ``max_size_gb``, then the least recently used until the whole cache
    fits. Returns what was removed and what is left. A cache another user could change, or a
    folder that is no cache, is refused as a build refuses it, and so is a read-only cache
    (nothing could be removed)."""
    _check_limit("--older-than", older_than_days)
    _check_limit("--max-size", max_size_gb)
    trust = trust_for() if trust is None else trust
    if not check_folder(root):
        return _cleaned(root, [])
    check_cache_root(root, trust)
    staging = writable_staging(root, trust)
    if staging is None:
        raise UsageError("the kernel cache is read-only: no entry can be removed from it",
                         where=str(root), fix="clean it where it is mounted writable, or as "
                                              "its owner")
    for folder in (root, *(root / nested for nested in NESTED.values())):
        staging_area = folder / STAGING  # a dead build's leftovers go too; a live build's stay
        if staging_area.is_dir() and not staging_area.is_symlink():
            remove_dead_staging(staging_area)
    chosen = _to_remove(entries(root), root, older_than_days, max_size_gb,
                        time.time() if now is None else now)
    return _cleaned(root, _remove(chosen, staging))


def entries(root: Path) -> list[Entry]:
    """Every entry of the cache in ``root`` and of the caches nested in it."""
    found = [Entry(path, _kind(path), folder_bytes(path), _mtime(path))
             for path in _entry_folders(root)]
    for kind, nested in NESTED.items():
        found += [Entry(path, kind, folder_bytes(path), _mtime(path))
                  for path in _entry_folders(root / nested)]
    return [e for e in found if e.last_used is not None]  # not removed as we listed


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` (links not followed); a file removed as we count
    (a build finishing) counts nothing."""
    if folder.is_symlink() or not folder.is_dir():
        return 0
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                pass
    return total


def _entry_folders(cache: Path) -> list[Path]:
    """Only entry folders are ever removed: a sha256 key (``cache.KEY_NAME``) under its first two
    hex digits."""
    return [p for p in entry_folders(cache)
            if KEY_NAME.fullmatch(p.name) and p.name[:2] == p.parent.name]


def _kind(entry: Path) -> str:
    """Each kind of entry has a file of its own (``entries.KIND_OF_FILE``; docs/kernel-cache.md,
    "An entry")."""
    return next((kind for name, kind in KIND_OF_FILE.items() if (entry / name).exists()),
                "other")


def _mtime(path: Path) -> float | None:
    try:
        return path.lstat().st_mtime
    except OSError:
        return None


def _check_limit(option: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{option} must be a number of at least 0, not {value}",
                         fix=f"e.g. {option} 30" if option == "--older-than" else
                         f"e.g. {option} 10")


def _to_remove(found: list[Entry], root: Path, older_than_days: float | None,
               max_size_gb: float | None, now: float) -> list[Entry]:
    """The entries to remove, least recently used first."""
    oldest_first = sorted(found, key=lambda e: (e.last_used, str(e.path)))
    if older_than_days is None and max_size_gb is None:
        return oldest_first
    cutoff = None if older_than_days is None else now - older_than_days * SECONDS_PER_DAY
    chosen = [e for e in oldest_first if cutoff is not None and e.last_used < cutoff]
    if max_size_gb is not None:
        left = folder_bytes(root) - sum(e.size for e in chosen)
        taken = set(chosen)
        for entry in (e for e in oldest_first if e not in taken):
            if left <= max_size_gb * BYTES_PER_GB:
                break
            chosen.append(entry)
            left -= entry.size
    return chosen


def _remove(chosen: list[Entry], staging: Path) -> list[Entry]:
    """Rename each entry into a staging folder of this process (in the cache's ``staging``
    area), then delete it there; the entries it removed (not one another build removed
    first). The staging folder is named after this process, so if it dies midway the next
    build deletes what is left."""
    if not chosen:
        return []
    aside = new_staging(staging, "clean-")
    removed = []
    try:
        for number, entry in enumerate(chosen):
            moved = aside / f"{number}-{entry.path.name}"
            try:
                os.rename(entry.path, moved)
            except OSError:  # gone already, or no longer ours to move
                continue
            removed.append(entry)
            shutil.rmtree(moved, ignore_errors=True)
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return removed


def _cleaned(root: Path, removed: list[Entry]) -> dict:
    left = entries(root) if root.is_dir() else []
    return {"folder": str(root),
            "removed": {"entries": len(removed), "bytes": sum(e.size for e in removed)},
            "left": {"entries": len(left), "total_bytes": folder_bytes(root)}}
