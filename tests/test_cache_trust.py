"""The kernel cache's trust rule (docs/kernel-cache.md, "The trust rule"), without PyPTO: what
another user could have written is never read, the folders the cache makes are closed to others
whatever the umask, a --cache-dir that is no folder is refused before any work, and a read-only
cache is read while what it misses is built uncached.

"Another user" is uid 12345: as root (CI, this machine) a path is really given to it (chown);
otherwise the owner the rule reads (``cache_trust.owner_of``) says so for that path."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_offline.cli import main
from pypto_offline.errors import UsageError
from pypto_offline.pypto_kernels import cache_trust
from pypto_offline.pypto_kernels.cache import (STAGING, KernelCache, entry_folders,
                                               nested_cache)
from pypto_offline.pypto_kernels.cache_trust import Trust, trust_for
from pypto_offline.pypto_kernels.jobs.protocol import Job
from tests import cache_entries
from tests.cache_entries import as_json
from tests.onnx_builders import GraphBuilder

REPO = Path(__file__).resolve().parents[1]
OTHER_UID = 12345
ROOT = os.getuid() == 0
KEY = "ab" * 32
FILES = {"kernel.json": '{"x": 1}', "final/artifacts/control_flow_host.cpp": "int f();\n"}


@pytest.fixture
def stranger(monkeypatch):
    """``give(path)``: make ``path`` (and with ``tree`` everything under it) another user's."""
    theirs: set[tuple[int, int]] = set()  # by inode and change time: an inode is reused
    real_owner = cache_trust.owner_of
    monkeypatch.setattr(cache_trust, "owner_of", lambda info: OTHER_UID
                        if (info.st_ino, info.st_ctime_ns) in theirs else real_owner(info))

    def give(path: Path, tree: bool = False) -> None:
        for p in [path, *(sorted(path.rglob("*")) if tree else [])]:
            if ROOT:
                os.chown(p, OTHER_UID, -1, follow_symlinks=False)
            else:
                info = os.lstat(p)
                theirs.add((info.st_ino, info.st_ctime_ns))
    return give


def stored(cache: KernelCache, key: str = KEY, files: dict[str, str] = FILES) -> Path:
    return cache_entries.stored(cache, key, files)


def tiny_model(path: Path) -> Path:
    b = GraphBuilder()
    path.write_bytes(b.model(b.op("Neg", [b.op("Relu", [b.input("x", [1, 8, 16, 16])])]))
                     .SerializeToString())
    return path


def cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


# -- row 1: an entry, a prefix folder or a root another user could have written ----------------

def test_a_cache_root_another_user_owns_is_refused_before_any_work(tmp_path, stranger, capsys):
    """On cb4dc9a only <cache>/tmp's owner was checked: another user's folder (a team cache
    named by PYPTO_OFFLINE_CACHE) was used, and what they planted in it shipped."""
    cache = tmp_path / "cache"
    cache.mkdir()
    stranger(cache)
    with pytest.raises(UsageError, match=r"owned by another user \(uid 12345\)"):
        KernelCache(cache)
    model, blob = tiny_model(tmp_path / "m.onnx"), tmp_path / "m.ptom"
    code, err = cli(capsys, model, "--target", "kirin9050", "-o", blob, "--no-report",
                    "--cache-dir", cache)
    assert code == 2 and not blob.exists()
    assert err.startswith(f"pypto-offline: error: {cache}: the kernel cache is owned by another "
                          f"user (uid 12345)") and "--cache-trust-group" in err, err
    code, err = cli(capsys, "cache", "clean", "--cache-dir", cache)
    assert code == 2 and "owned by another user" in err


def test_a_cache_root_or_a_folder_above_it_others_can_write_is_refused(tmp_path):
    open_root = tmp_path / "open"
    open_root.mkdir()
    open_root.chmod(0o777)
    with pytest.raises(UsageError, match="writable by every user"):
        KernelCache(open_root)
    shared = tmp_path / "shared"  # as /tmp without its sticky bit: anyone renames what is in it
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UsageError, match=f"the folder {shared} above the kernel cache"):
        KernelCache(shared / "mine" / "cache")
    shared.chmod(0o1777)  # sticky, as /tmp: only the owner of a folder in it may rename it
    KernelCache(shared / "mine" / "cache")


def test_the_folders_the_cache_makes_are_closed_to_others_whatever_the_umask(tmp_path):
    """On cb4dc9a, under umask 000, the prefix folders (and host-compiler/) were made 0777:
    anyone could plant into the user's own cache."""
    previous = os.umask(0)
    try:
        cache = KernelCache(tmp_path / "new" / "kernels")
        stored(cache)
        stored(nested_cache(cache.root, "host-compiler", cache.trust))
    finally:
        os.umask(previous)
    made = [tmp_path / "new", *sorted((tmp_path / "new").rglob("*"))]
    assert len(made) > 10
    open_to_others = {str(p): oct(stat.S_IMODE(p.lstat().st_mode)) for p in made
                      if p.lstat().st_mode & 0o022}
    assert open_to_others == {}
    assert stat.S_IMODE((cache.root / STAGING).stat().st_mode) == 0o700


def test_a_whole_entry_another_user_planted_is_not_trusted(tmp_path, stranger, capfd):
    """Signed as this build would sign it (the manifest matches): on cb4dc9a it was a hit."""
    cache = KernelCache(tmp_path)
    entry = stored(cache)
    stranger(entry, tree=True)
    assert cache.read(KEY, as_json) is None
    (line,) = capfd.readouterr().err.splitlines()
    assert line == (f"pypto-offline: warning: kernel cache entry {entry} is not trusted (its "
                    f"folder is owned by another user (uid 12345), another user could have "
                    f"written it); compiling it again")
    assert not os.path.lexists(entry)  # moved aside: the entry this build computes replaces it
    stored(cache)
    assert cache.read(KEY, as_json) == {"x": 1}


WROTE = "another user could have written it"


def file_of_another_user(entry: Path, stranger, monkeypatch) -> str:
    stranger(entry / "final" / "artifacts" / "control_flow_host.cpp")
    return f"final/artifacts/control_flow_host.cpp is owned by another user (uid 12345), {WROTE}"


def file_anyone_can_write(entry: Path, stranger, monkeypatch) -> str:
    (entry / "kernel.json").chmod(0o666)  # as a file written under umask 000 by another release
    return f"kernel.json is writable by every user, {WROTE}"


def folder_its_group_can_write(entry: Path, stranger, monkeypatch) -> str:
    monkeypatch.setattr(cache_trust, "private_group", lambda gid: False)  # a group of several
    (entry / "final").chmod(0o775)
    return f"final is writable by its group (gid {(entry / 'final').stat().st_gid}), {WROTE}"


def prefix_folder_of_another_user(entry: Path, stranger, monkeypatch) -> str:
    stranger(entry.parent)
    return (f"the folder {entry.parent} is owned by another user (uid 12345), another user "
            f"could have put it there")


@pytest.mark.parametrize("plant", [file_of_another_user, file_anyone_can_write,
                                   folder_its_group_can_write, prefix_folder_of_another_user])
def test_an_entry_with_a_path_another_user_could_write_is_not_trusted(plant, tmp_path, stranger,
                                                                      monkeypatch, capfd):
    cache = KernelCache(tmp_path)
    entry = stored(cache)
    why = plant(entry, stranger, monkeypatch)
    assert cache.read(KEY, as_json) is None
    (line,) = capfd.readouterr().err.splitlines()
    assert line == (f"pypto-offline: warning: kernel cache entry {entry} is not trusted "
                    f"({why}); compiling it again")


def test_a_prefix_folder_of_ours_left_open_is_closed_and_read_through(tmp_path, capfd):
    """An earlier release under umask 000 left prefix folders 0777: closed, each entry in it is
    still judged by itself (one of ours is read; one another user put there is not)."""
    cache = KernelCache(tmp_path)
    entry = stored(cache)
    entry.parent.chmod(0o777)
    assert cache.read(KEY, as_json) == {"x": 1} and capfd.readouterr().err == ""
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o755


def test_a_teams_cache_trusts_the_group_it_was_told_to_and_no_one_else(tmp_path, stranger,
                                                                       monkeypatch, capfd):
    team = os.getgid()  # a group this user is in: what the cache makes is given to it
    monkeypatch.setattr(cache_trust, "private_group", lambda gid: False)  # a team: several
    previous = os.umask(0)
    try:
        cache = KernelCache(tmp_path / "team", Trust(team))
        entry = stored(cache)
    finally:
        os.umask(previous)
    root = cache.root
    assert stat.S_IMODE(root.stat().st_mode) == 0o2775 and root.stat().st_gid == team
    # sticky: staging stays one's own
    assert stat.S_IMODE((root / STAGING).stat().st_mode) == 0o3770
    assert not any(p.lstat().st_mode & stat.S_IWOTH for p in root.rglob("*"))
    stranger(entry, tree=True)  # a teammate's entry, the team's group, writable by the team
    assert KernelCache(root, Trust(team)).read(KEY, as_json) == {"x": 1}
    assert capfd.readouterr().err == ""
    monkeypatch.delenv(cache_trust.GROUP_ENV, raising=False)
    with pytest.raises(UsageError, match="writable by its group"):  # never the default
        KernelCache(root)
    monkeypatch.setenv(cache_trust.GROUP_ENV, str(team))
    assert KernelCache(root).read(KEY, as_json) == {"x": 1}
    with pytest.raises(UsageError, match="names no group of this machine"):
        trust_for("no-such-group-of-this-machine")


def test_the_team_group_reaches_the_g_plus_plus_cache_and_only_when_named():
    job = Job("kernel", False, ())
    assert "cache_group" not in {**job.to_dict(), **Job(**{**job.__dict__,
                                                           "folder": "/f"}).to_dict()}
    shared = Job(**{**job.__dict__, "folder": "/f", "cache_group": 42})
    assert shared.to_dict()["cache_group"] == 42
    assert Job.from_dict(shared.to_dict()).cache_group == 42


# -- row 10: a --cache-dir that is no folder -------------------------------------------------

@pytest.mark.parametrize("link", [False, True])
def test_a_cache_dir_naming_a_file_is_refused_before_any_work(link, tmp_path, capsys):
    """On cb4dc9a `cache info`/`clean` said so (exit 2) but a build failed inside (exit 3)."""
    file = tmp_path / "a-file"
    file.write_text("not a cache")
    given = file
    if link:
        given = tmp_path / "link-to-a-file"
        given.symlink_to(file)
    model, blob = tiny_model(tmp_path / "m.onnx"), tmp_path / "m.ptom"
    expected = f"pypto-offline: error: {file}: the kernel cache is not a folder"
    for argv in ([model, "--target", "kirin9050", "-o", blob, "--no-report"],
                 ["cache", "info"], ["cache", "clean"]):
        code, err = cli(capsys, *argv, "--cache-dir", given)
        assert (code, err.splitlines()[-1]) == (2, f"{expected} (give the cache's folder with "
                                                   f"--cache-dir)"), argv
    assert not blob.exists() and file.read_text() == "not a cache"
    with pytest.raises(UsageError, match="not a folder"):
        KernelCache(given)


# -- row 11: a read-only cache ------------------------------------------------------------------

READ_ONLY_BUILD = '''
import json, sys
from pathlib import Path
from pypto_offline.cli import main
from pypto_offline.pypto_kernels.compiler import compile_region, setup_for
from pypto_offline.targets import TARGETS
from tests.executors import ScriptedExecutor, figures
from tests.test_cache_trust import made_up_figures, regions

cache = Path(sys.argv[1])
executor = ScriptedExecutor(figures(made_up_figures))
setup = setup_for(TARGETS["kirin9050"], cache, executor)
kernels = [compile_region(region, graph, setup, graph.constant_values(), search=False)
           for region, graph in regions()]
print(json.dumps({"read_only": setup.cache.read_only,
                  "from_cache": [k.from_cache for k in kernels], "jobs": len(executor.jobs),
                  "clean": main(["cache", "clean", "--cache-dir", str(cache)])}))
'''


def regions() -> list:
    """Three regions of different work: the first is stored before the cache is made
    read-only."""
    from tests.fusion_helpers import fuse

    found = []
    for ops in (("Relu", "Neg"), ("Sigmoid", "Neg"), ("Abs", "Neg")):
        b = GraphBuilder()
        graph, plan = fuse(b.model(b.op(ops[1], [b.op(ops[0], [b.input("x", [1, 8, 16, 16])])])))
        found += [(region, graph) for region in plan.regions]
    return found


def made_up_figures(policy, job, folder) -> dict:
    """A worker's answer for a cache test (no kernel is claimed compiled by PyPTO)."""
    return dict(compiled=True, aicore_us=1.0, total_us=2.0, tasks=4, ub_bytes=1024,
                verdicts=(), max_abs_diff=0.0, gm_bytes={"read": 1, "written": 1})


def snapshot(folder: Path) -> dict:
    return {str(p): (p.lstat().st_mode, p.lstat().st_mtime_ns,
                     p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def unprivileged() -> list[str]:
    """The command prefix of a process that cannot write a read-only folder: none for a user;
    for root, setpriv dropping the capabilities that let root write it."""
    if not ROOT:
        return []
    assert shutil.which("setpriv"), ("as root, setpriv (util-linux) is needed to drop the "
                                     "capabilities that let root write a read-only folder: "
                                     "apt-get install util-linux")
    return ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]


def run_read_only(root: Path, script: str, *args: str, timeout: int) -> tuple:
    """``script`` run (python -c) by a process that cannot write ``root``, every path in it
    made read-only for the run and writable again after (for pytest to remove it); the
    finished process and ``snapshot`` of ``root`` before and after."""
    for path in [root, *root.rglob("*")]:
        path.chmod(stat.S_IMODE(path.lstat().st_mode) & ~0o222)
    before = snapshot(root)
    try:
        done = subprocess.run([*unprivileged(), sys.executable, "-c", script, str(root), *args],
                              cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        after = snapshot(root)
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(stat.S_IMODE(path.lstat().st_mode) | 0o200)
    return done, before, after


def test_a_read_only_cache_is_read_and_what_it_misses_is_built_uncached(tmp_path):
    """A cache its user cannot write (a read-only mount, a CI cache restored read-only): on
    cb4dc9a a hit worked but a miss ended the build (exit 3, EROFS/EACCES) and `cache clean`
    too. Run by a process that cannot write it: this user, or root without its capabilities."""
    from pypto_offline.pypto_kernels.compiler import compile_region, setup_for
    from pypto_offline.targets import TARGETS
    from tests.executors import ScriptedExecutor, figures

    cache = tmp_path / "cache"
    (region, graph), *_ = regions()
    compile_region(region, graph, setup_for(TARGETS["kirin9050"], cache,
                                            ScriptedExecutor(figures(made_up_figures))),
                   graph.constant_values(), search=False)  # a made-up outcome, stored
    assert len(entry_folders(cache)) == 2  # the kernel's entry and its compile's
    done, before, after = run_read_only(cache, READ_ONLY_BUILD, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "read_only": True, "from_cache": [True, False, False], "jobs": 2, "clean": 2}
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [f"pypto-offline: warning: the kernel cache {cache} is read-only: its "
                        f"entries are used, and what this build compiles is not stored in it"]
    assert (f"pypto-offline: error: {cache}: the kernel cache is read-only: no entry can be "
            f"removed from it") in done.stderr
    assert after == before  # read, nothing written
