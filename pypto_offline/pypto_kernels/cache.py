"""Content-addressed kernel cache, safe when several builds share it, trusting nothing it reads.

Key = sha256 over the kernel source, tensor shapes and dtypes, tiling candidates, target and PyPTO
version; never a region's or tensor's name, so regions (of one model or several) that do the same
work share an entry. An entry is a folder written under a temporary name and renamed into place
in one step: a reader sees a whole entry or none, and when two builds race the first rename wins.

Only deterministic outcomes are stored (the caller decides which); every entry carries a manifest
(its key, each file's sha256) and is read back through ``KernelCache.read``, which checks it and
moves a damaged entry aside. See docs/kernel-cache.md.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar

from pypto_offline.errors import UsageError

MANIFEST = "manifest.json"
# A staging folder whose build cannot be asked whether it still runs (another host sharing the
# cache) is removed only when it is this old: no build takes a day.
STALE_STAGING_S = 24 * 3600
STAGING = "tmp"  # the folder of a cache where builds stage entries and worker jobs
Parsed = TypeVar("Parsed")


class DamagedEntry(Exception):
    """A cache entry that is not what was stored, or not what this build would store."""


def absolute(path) -> Path:
    """A user-given folder as an absolute path: workers run in their own folders, where a
    relative path (or an unexpanded ``~``) names something else."""
    return Path(path).expanduser().resolve()


def user_cache_base() -> Path:
    return absolute(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "pypto-offline"


# Moves the default kernel cache (a build farm's shared disk, a CI cache folder); --cache-dir
# (``KernelCache(root)``) wins over it.
CACHE_ENV = "PYPTO_OFFLINE_CACHE"


def default_cache_dir() -> Path:
    """``$PYPTO_OFFLINE_CACHE``, else ``<XDG cache home>/pypto-offline/kernels``."""
    chosen = os.environ.get(CACHE_ENV)
    return absolute(chosen) if chosen else user_cache_base() / "kernels"


def cache_folder(root=None) -> Path:
    """The kernel cache a build or a ``cache`` command uses: ``root`` (--cache-dir) if given."""
    return absolute(root) if root else default_cache_dir()


def cache_key(**parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def new_staging(root: Path, label: str = "") -> Path:
    """A fresh private folder in a cache's staging area ``root``, named after this host and
    process so that a later build can tell whether its owner is gone (``remove_dead_staging``)."""
    return Path(tempfile.mkdtemp(dir=root, prefix=f"{socket.gethostname()}-{os.getpid()}-{label}"))


class KernelCache:
    def __init__(self, root: Path | None = None):
        self.root = cache_folder(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._staging_root = private_folder(self.root / STAGING)
        remove_dead_staging(self._staging_root)

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

    def read(self, key: str, parse: Callable[[dict[str, bytes]], Parsed]) -> Parsed | None:
        """The entry of ``key`` as ``parse`` makes it from the entry's files (relative path →
        bytes, checked against the manifest), or None on a miss. ``parse`` raises DamagedEntry
        (or ValueError, KeyError, TypeError) when the files are not what this build would store.
        A damaged entry is a miss: it is moved aside, with one warning, so that the entry this
        build computes replaces it."""
        path = self.entry(key)
        if not os.path.lexists(path):
            return None
        try:
            found = parse(verified_files(path, key))
        except DamagedEntry as why:
            reason = str(why)
        except (ValueError, KeyError, TypeError) as why:
            reason = f"kernel.json does not describe its kernel ({type(why).__name__})"
        else:
            touch(path)
            return found
        if not os.path.lexists(path):  # removed as we read it (`cache clean`): a miss, no damage
            return None
        print(f"pypto-offline: warning: kernel cache entry {path} is damaged ({reason}); "
              f"compiling it again", file=sys.stderr)
        self._discard(path)
        return None

    def put(self, key: str, staged: Path) -> dict[str, bytes]:
        """Sign a filled staging folder (its manifest) and move it into place atomically; returns
        the files stored. When another build stored the same key first, theirs is kept: the
        outcome is deterministic, so both are the same kernel."""
        files = folder_files(staged)
        manifest = {"key": key, "files": {name: sha256(data) for name, data in files.items()}}
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        final = self.entry(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staged, final)
        except OSError:
            shutil.rmtree(staged, ignore_errors=True)
        return files

    def staging(self) -> Path:
        """A fresh private folder, named after this host and process so that a later build can
        tell whether its owner is gone (``remove_dead_staging``)."""
        return new_staging(self._staging_root)

    def _discard(self, path: Path) -> None:
        """Move a damaged entry out of the way in one rename, then delete it: a reader sees it
        whole or not at all, never half deleted. Someone else may have moved it already."""
        aside = self.staging()
        try:
            os.rename(path, aside / "damaged")
        except OSError:
            pass
        shutil.rmtree(aside, ignore_errors=True)


def touch(entry: Path) -> None:
    """Mark an entry used now (its folder's mtime), for `cache clean`'s least-recently-used
    order: the access time is no guide, as most mounts update it once a day at most. Best
    effort: a cache another user shares, or a read-only one, is read all the same."""
    try:
        os.utime(entry)
    except OSError:
        pass


def entry_folders(root: Path) -> list[Path]:
    """The entries of the cache in ``root`` (``<root>/<key[:2]>/<key>``, ``KernelCache.entry``),
    sorted: not its staging folders, nor the caches kept inside it under names of their own
    (the host g++ outputs and precompiled headers, pypto_kernels/host_compiler_cache.py)."""
    return sorted(p for p in Path(root).glob("??/*") if p.is_dir())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, without following links (a link in an
    entry is damage: it could point anywhere)."""
    files = {}
    for parent, dirs, names in os.walk(folder):
        for name in sorted(dirs + names):
            path = Path(parent) / name
            if path.is_symlink():
                raise DamagedEntry(f"{path.relative_to(folder)} is a symbolic link")
        for name in names:
            path = Path(parent) / name
            files[path.relative_to(folder).as_posix()] = path.read_bytes()
    return dict(sorted(files.items()))


def verified_files(entry: Path, key: str) -> dict[str, bytes]:
    """The entry's files, less its manifest, after checking them against it: the key it was
    stored under, the same set of files, each with the recorded sha256."""
    if entry.is_symlink() or not entry.is_dir():
        raise DamagedEntry("not a folder")
    try:
        files = folder_files(entry)
    except OSError as error:  # e.g. moved aside by another build as we read it
        raise DamagedEntry(f"unreadable: {error.strerror}") from None
    try:
        manifest = json.loads(files.pop(MANIFEST))
        recorded_key, recorded = manifest["key"], manifest["files"]
    except KeyError:
        raise DamagedEntry(f"no {MANIFEST}") from None
    except (ValueError, TypeError):
        raise DamagedEntry(f"{MANIFEST} is not a manifest") from None
    if recorded_key != key:
        raise DamagedEntry(f"it was stored under key {str(recorded_key)[:16]}…")
    if set(files) != set(recorded):
        missing, extra = sorted(set(recorded) - set(files)), sorted(set(files) - set(recorded))
        raise DamagedEntry(", ".join(f"{what} {names}" for what, names in (
            ("files missing", missing), ("files not in its manifest", extra)) if names))
    for name, data in files.items():
        if sha256(data) != recorded[name]:
            raise DamagedEntry(f"{name} differs from its manifest")
    return files


def private_folder(path: Path) -> Path:
    """A folder only this user can enter, where builds stage kernels and their worker jobs. It
    must be a real folder of ours: through a link or in a folder of someone else's, a job (and
    the kernel source in it, which the worker runs) could be swapped under the worker."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise UsageError(f"cannot create the kernel cache's staging folder: {error.strerror}",
                         where=str(path), fix="choose a --cache-dir you can write to") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise UsageError("the kernel cache's staging folder is not a folder of this user's "
                         "(a symbolic link, a file, or owned by someone else)", where=str(path),
                         fix="remove it, or choose another --cache-dir")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours, so ours to close: others must not write in it
    return path


def remove_dead_staging(staging_root: Path, now: float | None = None) -> None:
    """Delete the staging folders of builds that died (killed, power cut) before cleaning up:
    those of this host whose process is gone, and any a day old. A live build's are kept."""
    host = socket.gethostname()
    now = time.time() if now is None else now
    for folder in staging_root.iterdir():
        owner_host, _, pid = folder.name.rpartition("-")[0].rpartition("-")
        try:
            old = now - folder.lstat().st_mtime > STALE_STAGING_S
        except FileNotFoundError:
            continue
        gone = owner_host == host and pid.isdigit() and not process_alive(int(pid))
        if old or gone:
            if folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder, ignore_errors=True)
            else:
                folder.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def cache_root_of(folder: Path) -> Path | None:
    """The kernel cache a folder staged by ``KernelCache.staging`` (or a folder inside one)
    belongs to: staging folders are ``<cache>/tmp/<host>-<pid>-<random>``. None elsewhere."""
    folder = absolute(folder)
    for staging, staging_root in zip((folder, *folder.parents), folder.parents):
        if staging_root.name == STAGING and re.fullmatch(r".+-\d+-[a-z0-9_]{8}", staging.name):
            return staging_root.parent
    return None
