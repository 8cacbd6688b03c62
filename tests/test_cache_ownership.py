"""A kernel cache only ever touches what it made (docs/kernel-cache.md, "What a cache may
touch"; issue 50, row 1), without PyPTO: a --cache-dir naming a folder that is not a cache of
ours is refused before anything in it is changed; a new or empty folder becomes one (its
marker); a cache of an earlier release is adopted by its layout, its `tmp/` left as it is.

On 1e2aec7 a build, `cache clean` and ``KernelCache`` took `<dir>/tmp` as their staging folder,
chmodded it to 0700 and deleted everything in it a day old: a home folder's `tmp/` lost its files.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pypto_offline import api, cli
from pypto_offline.errors import UsageError
from pypto_offline.pypto_kernels.cache import (MARKER, STAGING, KernelCache, entry_folders,
                                               nested_cache)
from tests.cache_entries import as_json, stored
from tests.malformed import EXAMPLE
from tests.test_cache_trust import REPO, run_read_only, snapshot, unprivileged

TWO_DAYS_AGO = time.time() - 2 * 86400
KEY, NESTED_KEY = "ab" * 32, "cd" * 32
REFUSED = "the folder is not a kernel cache"


def users_folder(folder: Path, others: bool) -> Path:
    """A folder of the user's own with a `tmp/` of theirs (a home folder): a file two days old
    in it, a newer one, and with ``others`` files beside it."""
    (folder / "tmp").mkdir(parents=True)
    (folder / "tmp").chmod(0o755)
    (folder / "tmp" / "draft.txt").write_text("two days of work")
    os.utime(folder / "tmp" / "draft.txt", (TWO_DAYS_AGO, TWO_DAYS_AGO))
    (folder / "tmp" / "today.txt").write_text("today's")
    if others:
        (folder / ".bashrc").write_text("export PATH\n")
        (folder / "notes.txt").write_text("notes")
    return folder


def state(folder: Path) -> dict:
    """Every path in ``folder``, the folder too: mode, mtime and content."""
    info = folder.lstat()
    return {".": (info.st_mode, info.st_mtime_ns), **snapshot(folder)}


def refusal(action: str, monkeypatch, capfd, folder: Path) -> str:
    """What ``action`` on the cache ``folder`` says on stderr, having refused it (exit 2)."""
    if action in ("KernelCache", "api.check_cache"):
        with pytest.raises(UsageError) as refused:
            (KernelCache if action == "KernelCache" else api.check_cache)(folder)
        return f"pypto-offline: error: {refused.value}\n"
    if action == "build":
        def began(*args, **kwargs):
            raise AssertionError("the build began")  # exit 3, not the refusal
        monkeypatch.setattr(api, "compile", began)
        argv = [str(EXAMPLE), "--target", "kirin9050", "--input-shape", "x=1,3,64,64",
                "-o", str(folder.parent / "out.ptom"), "--no-report", "--quiet"]
    else:
        argv = action.split()
    assert cli.main([*argv, "--cache-dir", str(folder)]) == 2
    return capfd.readouterr().err


@pytest.mark.parametrize("layout", ["home folder", "only a tmp/", "a link to a home folder"])
@pytest.mark.parametrize("action", ["build", "cache clean", "cache info", "KernelCache",
                                    "api.check_cache"])
def test_a_folder_that_is_no_cache_is_refused_and_left_as_it_was(action, layout, tmp_path,
                                                                  monkeypatch, capfd):
    home = users_folder(tmp_path / "home", others=layout != "only a tmp/")
    given = home
    if layout == "a link to a home folder":
        given = tmp_path / "cache-link"
        given.symlink_to(home)
    before = state(home)
    (line,) = refusal(action, monkeypatch, capfd, given).splitlines()
    assert line.startswith(f"pypto-offline: error: {home}: {REFUSED}"), line
    first_not_ours = "'tmp/draft.txt'" if layout == "only a tmp/" else "'.bashrc'"
    assert f"it holds {first_not_ours}" in line, line
    assert state(home) == before, "the user's folder was changed"


def test_a_marker_that_is_not_ours_is_refused(tmp_path):
    (tmp_path / MARKER).write_text("another tool's")
    with pytest.raises(UsageError, match=f"{MARKER} is not pypto-offline's marker"):
        KernelCache(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [MARKER]


@pytest.mark.parametrize("exists", [True, False])
def test_a_new_or_empty_folder_becomes_a_cache_of_ours_and_stays_one(exists, tmp_path, capfd):
    root = tmp_path / "kernels"
    if exists:
        root.mkdir()
    api.check_cache(root)  # a check only: nothing is written before the build's work
    assert not root.exists() or list(root.iterdir()) == []
    cache = KernelCache(root)
    assert json.loads((root / MARKER).read_text()) == {"tool": "pypto-offline",
                                                       "what": "kernel cache"}
    assert stat.S_IMODE((root / STAGING).stat().st_mode) == 0o700
    assert not (root / "tmp").exists()
    stored(cache, KEY, {"kernel.json": '{"x": 1}'})
    assert KernelCache(root).read(KEY, as_json) == {"x": 1}
    assert cli.main(["cache", "info", "--cache-dir", str(root), "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["entries"] == 1
    assert cli.main(["cache", "clean", "--cache-dir", str(root), "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["removed"]["entries"] == 1
    assert sorted(p.name for p in root.iterdir()) == [MARKER, STAGING, KEY[:2]]
    assert KernelCache(root).read(KEY, as_json) is None  # still a cache: a miss, no refusal


def earlier_release_cache(root: Path) -> Path:
    """A cache as releases before the marker left it: an entry, one in `host-compiler/`, each
    staging area named `tmp/`, with a dead build's staging folder two days old in it."""
    cache = KernelCache(root)
    stored(cache, KEY, {"kernel.json": '{"x": 1}'})
    stored(nested_cache(root, "host-compiler", cache.trust), NESTED_KEY, {"out.s": "nop"})
    for folder in (root, root / "host-compiler"):
        (folder / MARKER).unlink()
        (folder / STAGING).rename(folder / "tmp")
    dead = root / "tmp" / f"{socket.gethostname()}-1-abcdefgh"
    (dead / "search").mkdir(parents=True)
    os.utime(dead, (TWO_DAYS_AGO, TWO_DAYS_AGO))
    return root


def test_a_cache_of_an_earlier_release_is_adopted_and_its_tmp_left_alone(tmp_path, capfd):
    root = earlier_release_cache(tmp_path / "kernels")
    (root / "tmp").chmod(0o755)
    earlier_tmp = state(root / "tmp")
    assert cli.main(["cache", "info", "--cache-dir", str(root), "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["entries"] == 2
    assert not (root / MARKER).exists()  # `cache info` only reads
    assert KernelCache(root).read(KEY, as_json) == {"x": 1}
    assert (root / MARKER).is_file() and (root / STAGING).is_dir()
    assert cli.main(["cache", "clean", "--cache-dir", str(root), "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["removed"]["entries"] == 2
    assert entry_folders(root) == [] and entry_folders(root / "host-compiler") == []
    assert state(root / "tmp") == earlier_tmp, "the earlier release's tmp/ was changed"


READ_ONLY_READ = '''
import json, sys
from pathlib import Path
from pypto_offline.pypto_kernels.cache import KernelCache
from tests.cache_entries import as_json

cache = KernelCache(Path(sys.argv[1]))
print(json.dumps({"read_only": cache.read_only, "read": cache.read(sys.argv[2], as_json)}))
'''


def test_a_read_only_cache_of_an_earlier_release_is_read_without_a_marker(tmp_path):
    root = earlier_release_cache(tmp_path / "kernels")
    done, before, after = run_read_only(root, READ_ONLY_READ, KEY, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"read_only": True, "read": {"x": 1}}
    assert after == before  # no marker, nothing written
