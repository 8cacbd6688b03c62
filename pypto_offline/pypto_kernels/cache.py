"""Content-addressed kernel cache, safe when several builds share it, trusting nothing it reads.

Key = sha256 over the kernel source, tensor shapes and dtypes, tiling candidates, target and PyPTO
version; never a region's or tensor's name, so regions (of one model or several) that do the same
work share an entry. An entry is a folder written under a temporary name and renamed into place
in one step: a reader sees a whole entry or none, and when two builds race the first rename wins.

Only deterministic outcomes are stored (the caller decides which); every entry carries a manifest
(its key, each file's sha256) and is read back through ``KernelCache.read``, which checks it and
moves a damaged entry aside. What it reads must be what no other user could have written
(``cache_trust``); a read-only cache is read, and what a build compiles is then not stored. A
cache only ever changes what it made: a folder holding anything else is refused (``check_ours``).
See docs/kernel-cache.md.
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
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar

from pypto_offline.errors import UsageError
from pypto_offline.pypto_kernels.cache_trust import (Trust, check_folder, check_root, close,
                                                     distrust, folder_distrust, make_folder,
                                                     make_folders, owner_of, read_only, seal,
                                                     secure_folder, set_mode, trust_for)
from pypto_offline.pypto_kernels.host_compiler_cache import PCH_SUBFOLDER, SUBFOLDER

MANIFEST = "manifest.json"
# A staging folder whose build cannot be asked whether it still runs (another host sharing the
# cache) is removed only when it is this old: no build takes a day.
STALE_STAGING_S = 24 * 3600
# The folder of a cache where builds stage entries and worker jobs: a name of the cache's own,
# never a `tmp/` that may be the user's (a --cache-dir naming a home folder).
STAGING = ".pypto-offline-staging"
# At a cache's root: the folder is a kernel cache of ours (``check_ours``), written (``mark``)
# when the cache is first written; a small JSON naming the tool.
MARKER = ".pypto-offline-cache"
MARKER_TEXT = {"tool": "pypto-offline", "what": "kernel cache"}
# The staging folder of releases before the marker: a cache of theirs is adopted by its layout
# (``foreign_item``), and its `tmp/` is never touched (nothing proves what is in it is ours).
EARLIER_STAGING = "tmp"
STAGING_NAME = re.compile(r".+-\d+-.+")  # ``new_staging``'s <host>-<pid>-<label><random>
KEY_NAME = re.compile(r"[0-9a-f]{64}")  # an entry's folder: ``cache_key``, under its first two
Parsed = TypeVar("Parsed")


class DamagedEntry(Exception):
    """A cache entry that is not what was stored, or not what this build would store."""


class UntrustedEntry(DamagedEntry):
    """A cache entry another user could have written (``cache_trust``): never read."""


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
    """The cache in ``root`` (--cache-dir; by default ``default_cache_dir``), trusting what
    ``trust`` says (by default ``$PYPTO_OFFLINE_CACHE_GROUP``'s: ``cache_trust.trust_for``). A
    root that is no folder, or that another user could change, is refused (UsageError, exit 2).
    A cache it cannot write is read all the same: hits are used, and what misses is compiled
    in a staging folder outside it and not stored (one warning)."""

    def __init__(self, root: Path | None = None, trust: Trust | None = None):
        self.root = cache_folder(root)
        self.trust = trust_for() if trust is None else trust
        open_root(self.root, self.trust)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._staging_root = writable_staging(self.root, self.trust)
        self.read_only = self._staging_root is None
        if not self.read_only:
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
        A damaged entry, or one another user could have written (``cache_trust``), is a miss: it
        is moved aside, with one warning, so that the entry this build computes replaces it."""
        path = self.entry(key)
        if not os.path.lexists(path):
            return None
        state = "damaged"
        try:
            found = parse(verified_files(path, key, self.trust, self._prefix_checked(path)))
        except DamagedEntry as why:
            reason = str(why)
            if isinstance(why, UntrustedEntry):
                state = "not trusted"
        except (ValueError, KeyError, TypeError) as why:
            reason = f"kernel.json does not describe its kernel ({type(why).__name__})"
        else:
            if not self.read_only:
                touch(path)
            return found
        if not os.path.lexists(path):  # removed as we read it (`cache clean`): a miss, no damage
            return None
        print(f"pypto-offline: warning: kernel cache entry {path} is {state} ({reason}); "
              f"compiling it again", file=sys.stderr)
        self._discard(path)
        return None

    def _prefix_checked(self, entry: Path) -> str | None:
        """Why the prefix folder of ``entry`` (``<key[:2]>``) is not trusted, or None: one of
        ours left open by an earlier release is closed first (``cache_trust.secure_folder``)."""
        try:
            if self.read_only:
                return distrust(os.lstat(entry.parent), self.trust)
            return secure_folder(entry.parent, self.trust.folder_mode(), self.trust)
        except OSError as error:
            return f"its folder cannot be checked: {error.strerror}"

    def put(self, key: str, staged: Path) -> dict[str, bytes]:
        """Sign a filled staging folder (its manifest) and move it into place atomically; returns
        the files stored. When another build stored the same key first, theirs is kept: the
        outcome is deterministic, so both are the same kernel. In a read-only cache nothing is
        stored (one warning a process)."""
        files = folder_files(staged)
        if self.read_only:
            warn_read_only(self.root)
            shutil.rmtree(staged, ignore_errors=True)
            return files
        manifest = {"key": key, "files": {name: sha256(data) for name, data in files.items()}}
        (staged / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        final = self.entry(key)
        try:
            seal(staged, self.trust)
            make_folder(final.parent, self.trust.folder_mode(), self.trust)
            os.rename(staged, final)
        except OSError:  # stored first by another build (or the cache could not take it)
            shutil.rmtree(staged, ignore_errors=True)
        return files

    def staging(self) -> Path:
        """A fresh private folder, named after this host and process so that a later build can
        tell whether its owner is gone (``remove_dead_staging``). For a read-only cache, in a
        private folder of the system's temporary folder, removed when this cache object goes
        (or at exit), once empty."""
        with self._locks_guard:
            if self._staging_root is None:
                self._staging_root = Path(tempfile.mkdtemp(prefix="pypto-offline-uncached-"))
                weakref.finalize(self, remove_if_empty, self._staging_root)
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


def nested_cache(root: Path, name: str, trust: Trust) -> KernelCache:
    """A cache kept inside the kernel cache in ``root`` (the host g++ outputs, the precompiled
    headers: ``host_compiler_cache``). Its folder is the kernel cache's own, so one of ours an
    earlier release left open (umask 000) is closed, as a prefix folder is; one another user
    could change is refused as any cache root is."""
    folder = absolute(root) / name
    if folder.is_dir() and not folder.is_symlink():
        try:
            secure_folder(folder, trust.folder_mode(), trust)
        except OSError:  # read-only: KernelCache judges it as it is
            pass
    return KernelCache(folder, trust)


def touch(entry: Path) -> None:
    """Mark an entry used now (its folder's mtime), for `cache clean`'s least-recently-used
    order: the access time is no guide, as most mounts update it once a day at most. Best
    effort: a cache another user shares, or a read-only one, is read all the same."""
    try:
        os.utime(entry)
    except OSError:
        pass


def remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # still used (a fork server's folder) or gone: left to the system
        pass


_warned_read_only: set[Path] = set()
_warned_guard = threading.Lock()


def warn_read_only(root: Path) -> None:
    """One warning a process for a read-only cache, at its first miss."""
    with _warned_guard:
        if root in _warned_read_only:
            return
        _warned_read_only.add(root)
    print(f"pypto-offline: warning: the kernel cache {root} is read-only: its entries are used, "
          f"and what this build compiles is not stored in it", file=sys.stderr)


def entry_folders(root: Path) -> list[Path]:
    """The entries of the cache in ``root`` (``<root>/<key[:2]>/<key>``, ``KernelCache.entry``),
    sorted: not its staging folders, nor the caches kept inside it under names of their own
    (the host g++ outputs and precompiled headers, pypto_kernels/host_compiler_cache.py)."""
    return sorted(p for p in Path(root).glob("??/*") if p.is_dir())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def folder_files(folder: Path, trust: Trust | None = None) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, without following links (a link in an
    entry is damage: it could point anywhere). With ``trust``, each folder and file must be
    one no other user could have written (``UntrustedEntry`` otherwise)."""
    files = {}
    for parent, dirs, names in os.walk(folder):
        for name in sorted(dirs + names):
            path = Path(parent) / name
            if path.is_symlink():
                raise DamagedEntry(f"{path.relative_to(folder)} is a symbolic link")
        if trust is not None:
            for path in (Path(parent), *(Path(parent) / name for name in names)):
                why = distrust(os.lstat(path), trust)
                if why is not None:
                    shown = path.relative_to(folder).as_posix()
                    raise UntrustedEntry(f"{'its folder' if shown == '.' else shown} is {why}, "
                                         f"another user could have written it")
        for name in names:
            path = Path(parent) / name
            files[path.relative_to(folder).as_posix()] = path.read_bytes()
    return dict(sorted(files.items()))


def verified_files(entry: Path, key: str, trust: Trust | None = None,
                   prefix_distrusted: str | None = None) -> dict[str, bytes]:
    """The entry's files, less its manifest, after checking them against it: the key it was
    stored under, the same set of files, each with the recorded sha256; and first that no other
    user could have written the entry, its prefix folder (``prefix_distrusted``: why not, as
    ``KernelCache.read`` found) or anything in it (``trust``; by default this user's own)."""
    if entry.is_symlink() or not entry.is_dir():
        raise DamagedEntry("not a folder")
    if prefix_distrusted is not None:
        raise UntrustedEntry(f"the folder {entry.parent} is {prefix_distrusted}, another user "
                             f"could have put it there")
    try:
        files = folder_files(entry, Trust() if trust is None else trust)
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


def open_root(root: Path, trust: Trust) -> None:
    """A cache's root, created when missing (none of its folders open to other users), refused
    (UsageError) when it is no folder, another user could change it (``cache_trust.check_root``)
    or it is no cache of ours (``check_ours``)."""
    check_cache_root(root, trust)
    try:
        make_folders(root, trust)
    except OSError as error:
        raise UsageError(f"cannot create the kernel cache folder: {error.strerror}",
                         where=str(root), fix="choose a --cache-dir you can write to") from None


def check_cache_root(root: Path, trust: Trust) -> None:
    """Refuse (UsageError, exit 2), before any work, a cache root that is no folder, that another
    user could change (``cache_trust.check_root``) or that is no cache of ours (``check_ours``):
    the check of builds (``api.check_cache``, ``KernelCache``) and ``cache clean``."""
    check_root(root, trust)
    check_ours(root)


def check_ours(root: Path) -> bool:
    """Whether ``root`` is marked a cache of ours (``MARKER``); False when it is missing, empty,
    or a cache of an earlier release (``foreign_item``), which ``mark`` adopts. Any other folder
    is refused (UsageError, exit 2): a cache closes its folders and deletes what it takes for
    its own, so a --cache-dir naming a home folder, say, must lose nothing."""
    if not check_folder(root):
        return False
    marker = root / MARKER
    if os.path.lexists(marker):
        if not is_marker(marker):
            raise UsageError(f"the kernel cache's {MARKER} is not pypto-offline's marker",
                             where=str(root), fix="choose another --cache-dir, or remove it if "
                                                  "the folder is a cache of pypto-offline's")
        return True
    try:
        foreign = foreign_item(root)
    except OSError as error:  # a folder this user cannot list: no cache of this user's either
        raise UsageError(f"the kernel cache folder cannot be read: {error.strerror}",
                         where=str(root), fix="choose a --cache-dir you can read and write") \
            from None
    if foreign is not None:
        raise UsageError(f"the folder is not a kernel cache (it holds {foreign!r} and no "
                         f"{MARKER} marker): a cache changes and deletes what is in it, so it "
                         f"is refused", where=str(root),
                         fix=f"give --cache-dir (or ${CACHE_ENV}) a new or empty folder, or an "
                             f"existing cache")
    return False


def is_marker(path: Path) -> bool:
    """Whether ``path`` is a marker ``mark`` wrote: a file (no link) naming this tool."""
    try:
        return not path.is_symlink() and json.loads(path.read_text()).get("tool") == \
            MARKER_TEXT["tool"]
    except (OSError, ValueError, AttributeError):
        return False


def foreign_item(root: Path) -> str | None:
    """The first thing in ``root`` (sorted) that no cache of ours holds, or None: what a kernel
    cache (or one nested in it) held before the marker. Its entries ``<key[:2]>/<key>``, its
    staging folder (``tmp/``, holding only folders named as ``new_staging`` names them),
    ``host-compiler/``, ``host-compiler-pch/`` and ``STAGING``, each a real folder; and a
    file system's ``lost+found`` (a cache on a volume of its own), which a cache never touches."""
    for name in sorted(os.listdir(root)):
        path = root / name
        if path.is_symlink() or not path.is_dir():
            return name
        if name in (STAGING, SUBFOLDER, PCH_SUBFOLDER, "lost+found"):
            continue
        if name != EARLIER_STAGING and not re.fullmatch(r"[0-9a-f]{2}", name):
            return name
        stray = next((inner for inner in sorted(os.listdir(path))
                      if not held_before_the_marker(name, inner)), None)
        if stray is not None:
            return f"{name}/{stray}"
    return None


def held_before_the_marker(folder: str, name: str) -> bool:
    """Whether a cache of an earlier release held ``name`` in its ``folder``: ``tmp`` (a staging
    folder) or a prefix folder (an entry of a key it prefixes)."""
    if folder == EARLIER_STAGING:
        return STAGING_NAME.fullmatch(name) is not None
    return KEY_NAME.fullmatch(name) is not None and name[:2] == folder


def mark(root: Path, staging_root: Path, trust: Trust) -> None:
    """Make ``root`` a cache of ours (``MARKER``) when it is not yet: the marker is written in
    a staging folder and renamed into place, so that it is whole or absent."""
    if os.path.lexists(root / MARKER):
        return
    folder = new_staging(staging_root, "marker-")
    try:
        written = folder / MARKER
        written.write_text(json.dumps(MARKER_TEXT, sort_keys=True) + "\n")
        set_mode(written, trust.file_mode(False), trust)
        os.replace(written, root / MARKER)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def writable_staging(root: Path, trust: Trust) -> Path | None:
    """``<root>/.pypto-offline-staging`` (``STAGING``), where builds stage entries and worker
    jobs, made when missing, and the cache marked ours (``mark``); None when the cache is
    read-only. It must be a real folder no other user could change: through a link or in a
    folder of someone else's, a job (and the kernel source in it, which the worker runs) could
    be swapped under the worker. One of ours that is open to others is closed (0700; a team's:
    ``Trust.staging_mode``). ``root`` must have passed ``check_ours``."""
    path = root / STAGING
    try:
        if not make_folder(path, trust.staging_mode(), trust):
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and owner_of(info) == os.getuid():
                close(path, trust.staging_mode(), trust)  # ours, so ours to close
    except OSError as error:
        if read_only(error):
            return None
        raise UsageError(f"cannot create the kernel cache's staging folder: {error.strerror}",
                         where=str(path), fix="choose a --cache-dir you can write to") from None
    why = folder_distrust(os.lstat(path), trust)
    if why is not None:
        raise UsageError(f"the kernel cache's staging folder is {why}: not a folder of this "
                         f"user's", where=str(path), fix="remove it, or choose another --cache-dir")
    if not (os.access(path, os.W_OK | os.X_OK) and os.access(root, os.W_OK | os.X_OK)):
        return None
    mark(root, path, trust)
    return path


def remove_dead_staging(staging_root: Path, now: float | None = None) -> None:
    """Delete the staging folders of builds that died (killed, power cut) before cleaning up:
    those of this host whose process is gone, and any a day old. A live build's are kept, and
    so is anything not named as ``new_staging`` names its folders, or not a real folder."""
    host = socket.gethostname()
    now = time.time() if now is None else now
    for folder in staging_root.iterdir():
        if not STAGING_NAME.fullmatch(folder.name) or folder.is_symlink() or \
                not folder.is_dir():
            continue
        owner_host, _, pid = folder.name.rpartition("-")[0].rpartition("-")
        try:
            old = now - folder.lstat().st_mtime > STALE_STAGING_S
        except FileNotFoundError:
            continue
        gone = owner_host == host and pid.isdigit() and not process_alive(int(pid))
        if old or gone:
            shutil.rmtree(folder, ignore_errors=True)


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
    belongs to: staging folders are ``<cache>/.pypto-offline-staging/<host>-<pid>-<random>``.
    None elsewhere."""
    folder = absolute(folder)
    for staging, staging_root in zip((folder, *folder.parents), folder.parents):
        if staging_root.name == STAGING and re.fullmatch(r".+-\d+-[a-z0-9_]{8}", staging.name):
            return staging_root.parent
    return None
