"""The kernel cache's trust rule (docs/kernel-cache.md, "The trust rule"): the cache reads only
what no other user could have written.

A path is trusted when it is owned by this user or root and neither its group nor others may
write it (a group-writable path is still this user's when the group is the user's private one,
as Debian and Red Hat give every user, with umask 002). A team's shared cache is an explicit
choice, never the default: with a group named (``--cache-trust-group``,
``$PYPTO_OFFLINE_CACHE_GROUP``), a path of that group that others may not write is trusted too,
whoever owns it, and what the cache creates is that group's and writable by it.

Every folder the cache creates gets its mode set explicitly (``chmod`` after ``mkdir``), so that
under umask 000 no folder of it is left open to other users; entries are sealed the same way
before they are renamed into place. An entry's own folders and files are trusted only as they
are (``distrust``); the folders leading to it that are the cache's own (the prefix folders,
the staging folder, the nested caches' roots), when this user's and left open by an earlier
release, are closed (``secure_folder``): what they hold is checked one by one as it is read.
"""
from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pypto_offline.errors import UsageError

GROUP_ENV = "PYPTO_OFFLINE_CACHE_GROUP"
GROUP_OPTION = "--cache-trust-group"
# What a folder the cache cannot write answers: a read-only mount, or a folder of read-only mode
# (EPERM: some file systems answer chmod on a read-only mount with it)
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
# Said in every refusal: how to share a cache between users on purpose.
SHARED_FIX = (f"for a team's shared cache, name the team's group with {GROUP_OPTION} GROUP or "
              f"${GROUP_ENV}")


@dataclass(frozen=True)
class Trust:
    """Whose paths the cache trusts: this user's and root's, and with ``group`` (a gid) those of
    a team's group."""

    group: int | None = None

    def folder_mode(self) -> int:
        """The cache root, its prefix folders, an entry's folders, the nested caches' roots:
        readable by all (an entry is no secret), writable by the owner (and the team); setgid in
        a team's cache, so that what a teammate creates in it is the team's."""
        return 0o755 if self.group is None else 0o2775

    def staging_mode(self) -> int:
        """The staging folder (``cache.STAGING``): this user's alone; in a team's cache the
        team's, sticky (no teammate removes or renames another's staging folder, where jobs wait
        for the worker)."""
        return 0o700 if self.group is None else 0o3770

    def file_mode(self, executable: bool) -> int:
        base = 0o755 if executable else 0o644
        return base if self.group is None else base | 0o020


def trust_for(group: str | int | None = None) -> Trust:
    """The trust of a build or ``cache`` command: ``group`` (a group's name or number), else
    ``$PYPTO_OFFLINE_CACHE_GROUP``, else this user's own cache."""
    chosen = os.environ.get(GROUP_ENV) if group is None else group
    if chosen is None or chosen == "":
        return Trust()
    if isinstance(chosen, int) or str(chosen).isdigit():
        return Trust(int(chosen))
    try:
        return Trust(grp.getgrnam(str(chosen)).gr_gid)
    except KeyError:
        raise UsageError(f"{GROUP_OPTION} (or ${GROUP_ENV}) names no group of this machine: "
                         f"{chosen!r}", fix="give the team's group (`getent group` lists them), "
                                            "or leave it out for a cache of your own") from None


def owner_of(info: os.stat_result) -> int:
    return info.st_uid


def trusted_owner(uid: int) -> bool:
    return uid in (os.getuid(), 0)


@lru_cache(maxsize=None)
def private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group, of which no one else is a member (nor has it as
    primary group): writing by that group is writing by this user."""
    try:
        me, group = pwd.getpwuid(os.getuid()), grp.getgrgid(gid)
    except KeyError:
        return False
    if me.pw_gid != gid or set(group.gr_mem) - {me.pw_name}:
        return False
    return not any(user.pw_gid == gid and user.pw_uid != me.pw_uid for user in pwd.getpwall())


def distrust(info: os.stat_result, trust: Trust) -> str | None:
    """Why a path (its ``lstat``) is not trusted: someone else could have written it; None when
    it is trusted."""
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if mode & stat.S_IWOTH:
        return "writable by every user"
    if trust.group is not None and info.st_gid == trust.group:
        return None  # the team's, named on purpose
    if not trusted_owner(owner_of(info)):
        return f"owned by another user (uid {owner_of(info)})"
    if mode & stat.S_IWGRP and not private_group(info.st_gid):
        return f"writable by its group (gid {info.st_gid})"
    return None


def folder_distrust(info: os.stat_result, trust: Trust) -> str | None:
    """``distrust`` of a path that must be a real folder."""
    if stat.S_ISLNK(info.st_mode) or stat.S_ISDIR(info.st_mode):
        return distrust(info, trust)
    return "not a folder"


def set_mode(path: Path, mode: int, trust: Trust) -> None:
    """``path``'s mode exactly (whatever the umask made it), and in a team's cache its group."""
    os.chmod(path, mode)
    if trust.group is not None and os.lstat(path).st_gid != trust.group:
        os.chown(path, -1, trust.group)


def close(path: Path, mode: int, trust: Trust) -> None:
    """Take from a folder of this user's what ``mode`` does not give (group or others' write,
    say), never adding any: a folder its owner made read-only stays read-only."""
    current = stat.S_IMODE(os.lstat(path).st_mode)
    narrowed = (current & mode & 0o777) | (mode & 0o7000)
    if narrowed != current or (trust.group is not None and os.lstat(path).st_gid != trust.group):
        set_mode(path, narrowed, trust)


def make_folder(path: Path, mode: int, trust: Trust) -> bool:
    """Create one folder with ``mode`` (set after ``mkdir``: the umask only narrows the mode
    ``mkdir`` is given); whether it was created (False: it was there)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return False
    set_mode(path, mode, trust)
    return True


def make_folders(path: Path, trust: Trust) -> None:
    """``path`` and the folders missing above it, none open to other users."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        make_folder(folder, trust.folder_mode(), trust)


def secure_folder(path: Path, mode: int, trust: Trust) -> str | None:
    """A folder of the cache's own (a prefix folder, the staging folder, a nested cache's root):
    why it is not trusted, or None. One of this user's left open by an earlier release (under
    umask 000) is given ``mode``: what it holds is checked one by one as it is read."""
    info = os.lstat(path)
    why = folder_distrust(info, trust)
    if why is not None and stat.S_ISDIR(info.st_mode) and owner_of(info) == os.getuid():
        close(path, mode, trust)
        why = distrust(os.lstat(path), trust)
    return why


def check_folder(root: Path) -> bool:
    """Whether the cache exists; refuses (exit 2) a path that names something else than a
    folder (a file, a link to one): the one check of builds and ``cache`` commands alike."""
    if os.path.lexists(root) and not root.is_dir():
        raise UsageError("the kernel cache is not a folder", where=str(root),
                         fix="give the cache's folder with --cache-dir")
    return root.is_dir()


def check_root(root: Path, trust: Trust) -> None:
    """Refuse (exit 2) a cache root that is not a folder, or that another user could change:
    the root itself and every folder above it. A folder above it may be writable by all when
    it is sticky and this user's or root's (``/tmp``): no one else can rename what is in it."""
    if check_folder(root):
        why = distrust(os.lstat(root), trust)
        if why is not None:
            raise UsageError(f"the kernel cache is {why}: another user could plant kernels in "
                             f"it, and it is not trusted", where=str(root),
                             fix=f"use a folder of your own (--cache-dir), `chmod go-w` it if "
                                 f"it is yours, or {SHARED_FIX}")
    for folder in root.parents:
        if not os.path.lexists(folder):
            continue
        info = os.lstat(folder)
        why = distrust(info, trust)
        if why is not None and not (info.st_mode & stat.S_ISVTX and trusted_owner(owner_of(info))):
            raise UsageError(f"the folder {folder} above the kernel cache is {why}: another "
                             f"user could replace the cache, and it is not trusted",
                             where=str(root), fix="choose a --cache-dir in folders only you (or "
                                                  "root) can write")


def seal(folder: Path, trust: Trust) -> None:
    """An entry's folder, everything in it, as the trust rule wants it whatever the umask was
    when its files were written: writable by this user alone (in a team's cache, by the team
    too)."""
    set_mode(folder, trust.folder_mode(), trust)
    for parent, dirs, names in os.walk(folder):
        for name in dirs:
            set_mode(Path(parent) / name, trust.folder_mode(), trust)
        for name in names:
            path = Path(parent) / name
            set_mode(path, trust.file_mode(bool(os.lstat(path).st_mode & 0o100)), trust)


def read_only(error: OSError) -> bool:
    return error.errno in READ_ONLY
