"""The kernel cache stores only deterministic outcomes and trusts nothing it cannot re-derive
(docs/kernel-cache.md): a killed worker leaves no entry, a relative --cache-dir works, a damaged
or tampered entry is compiled again (one warning, same blob), and no planted file is ever run.

Builds are real (PyPTO workers) on one tiny elementwise region without tile search; the clean
cold build is shared by the module."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pypto_offline.errors import UsageError
from pypto_offline.pypto_kernels import cache as kernel_cache
from pypto_offline.pypto_kernels.cache import KernelCache, entry_folders
from pypto_offline.pypto_kernels.tiling import TilePolicy
from tests.cache_entries import as_json, stored
from tests.onnx_builders import GraphBuilder

REPO = Path(__file__).resolve().parents[1]
WARNING = "pypto-offline: warning: kernel cache entry "


def tiny_model(path: Path) -> Path:
    """One fusable region (Relu → Neg → Sigmoid on 1x8x16x16): one kernel, three baseline ops."""
    b = GraphBuilder()
    x = b.input("x", [1, 8, 16, 16])
    path.write_bytes(b.model(b.op("Sigmoid", [b.op("Neg", [b.op("Relu", [x])])]))
                     .SerializeToString())
    return path


def build(model: Path, blob: Path, cache: str | Path, *, cwd: Path, env: dict | None = None,
          expect_exit: int = 0) -> tuple[dict, str]:
    """The CLI in its own process (as a user runs it): its JSON summary and its stderr."""
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [(env or {}).get("PYTHONPATH"), str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "pypto_offline", str(model), "--target",
                           "kirin9050", "-o", str(blob), "--no-tile-search", "--no-report",
                           "--json", "--quiet", "--cache-dir", str(cache),
                           "--measure-baseline"],  # the baseline's per-op entries too
                          cwd=cwd, env=environment, capture_output=True, text=True, timeout=900)
    assert done.returncode == expect_exit, done.stderr
    return (json.loads(done.stdout) if expect_exit == 0 else {}), done.stderr


def entries(cache: Path) -> dict[str, Path]:
    """The cache's entries by kind: the kernel's, each baseline op's, and each PyPTO compile's
    (the search's candidate, and the checked final compile: docs/compile-time.md); the host
    g++ entries and precompiled headers, caches of their own, are left out."""
    found, counts = {}, {"op": 0}
    for entry in entry_folders(cache):
        if (entry / "result.json").exists():
            kind = "final" if (entry / "artifacts").is_dir() else "search"
        elif (entry / "kernel.json").exists():
            kind = "kernel"
        else:
            assert (entry / "op_cost.json").exists(), list(entry.iterdir())
            counts["op"] += 1
            kind = f"op{counts['op']}"
        found[kind] = entry
    return found


def fused(summary: dict) -> bool:
    return summary["pypto"]["compiled"] == 1 and summary["pypto"]["fell_back"] == 0 and \
        summary["verification"]["status"] == "passed"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A cold build with a relative --cache-dir (run from the model's folder)."""
    folder = tmp_path_factory.mktemp("clean")
    model = tiny_model(folder / "tiny.onnx")
    summary, err = build(model, folder / "tiny.ptom", "cache", cwd=folder)
    return folder, model, summary, err


@pytest.mark.pypto
def test_a_relative_cache_dir_is_resolved_and_the_region_fuses(clean):
    """On main every worker (run in its job folder) looked for its job under the relative path,
    crashed, and the build shipped the region unfused with exit 0, caching the crash."""
    folder, _, summary, err = clean
    assert fused(summary), summary["pypto"]
    assert summary["kernel_cache"] == {"hits": 0, "compiled": 1, "pypto_compiles": 1}
    assert WARNING not in err
    found = entries(folder / "cache")
    assert set(found) == {"kernel", "op1", "op2", "op3", "final"}, found  # one tile: one compile
    record = json.loads((found["kernel"] / "kernel.json").read_text())
    assert record["compiled"] and (found["kernel"] / "manifest.json").is_file()
    assert not list((folder / "cache" / kernel_cache.STAGING).iterdir())  # no staging left behind


# Loaded by every Python process of the build (through PYTHONPATH); acts in workers only: once
# PyPTO has started compiling the kernel (its run folder exists in the compile's working folder,
# the current one), the job's process gets the signal. Jobs run in children the fork server
# forks (a thread does not survive a fork), so the watch starts in each child.
KILL_WORKER_IN_COMPILE = '''
import glob, os, signal, sys, threading, time

def _signal_when_compiling():
    while not glob.glob("run*/output_*"):
        time.sleep(0.005)
    os.kill(os.getpid(), signal.{signal})

def _watch():
    threading.Thread(target=_signal_when_compiling, daemon=True).start()

if "pypto_offline.pypto_kernels.worker" in sys.orig_argv:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a worker started from a shell
    os.register_at_fork(after_in_child=_watch)
'''


@pytest.mark.pypto
@pytest.mark.parametrize("signal", ["SIGINT", "SIGKILL"])
def test_a_worker_killed_mid_compile_leaves_no_entry_and_the_next_build_fuses(signal, tmp_path):
    """SIGINT is what Ctrl-C in the terminal sends the workers too, SIGKILL what the OOM killer
    sends. On main the compile was cached as a failed (KeyboardInterrupt) or crashed kernel, and
    every later build shipped the region unfused with exit 0."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_WORKER_IN_COMPILE.format(signal=signal))
    model, cache = tiny_model(tmp_path / "tiny.onnx"), tmp_path / "cache"
    interrupted, _ = build(model, tmp_path / "a.ptom", cache, cwd=tmp_path,
                           env={"PYTHONPATH": str(hook)})
    # the region and the part of two ops it is cut into (split, never drop): both killed
    assert interrupted["pypto"]["fell_back"] == 2 and interrupted["pypto"]["compiled"] == 0
    assert [k["cut"] is not None for k in interrupted["kernels"]] == [True, False]
    assert interrupted["verification"]["status"] == "passed"  # the unfused ops ran instead
    assert entries(cache) == {}, "an interrupted compile was cached"
    assert not list((cache / kernel_cache.STAGING).iterdir())
    again, _ = build(model, tmp_path / "b.ptom", cache, cwd=tmp_path)
    assert fused(again), again["pypto"]
    assert again["kernel_cache"] == {"hits": 0, "compiled": 1, "pypto_compiles": 1}


def rewrite_json(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record, indent=1, sort_keys=True))


def resign(entry: Path) -> None:
    """What a forger with write access does: the manifest made to match the edited files."""
    manifest = entry / "manifest.json"
    record = json.loads(manifest.read_text()) if manifest.exists() else {}
    record["files"] = {p.relative_to(entry).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted(entry.rglob("*")) if p.is_file() and p != manifest}
    manifest.write_text(json.dumps(record, indent=1, sort_keys=True))


def edit_cost(found):
    rewrite_json(found["kernel"] / "kernel.json",
                 lambda r: r["tuned_tile"].update(aicore_us=r["tuned_tile"]["aicore_us"] / 10))
    return found["kernel"], "kernel.json differs from its manifest"


def edit_source(found):
    rewrite_json(found["kernel"] / "kernel.json",
                 lambda r: r.update(source=r["source"] + "\nopen('/tmp/owned', 'w')\n"))
    resign(found["kernel"])
    return found["kernel"], "its kernel source is not the one generated for this build"


def add_file(found):
    (found["kernel"] / "final" / "artifacts" / "extra.cpp").write_text("// planted\n")
    return found["kernel"], "files not in its manifest ['final/artifacts/extra.cpp']"


def break_json(found):
    (found["kernel"] / "kernel.json").write_text('{"compiled": true,')
    resign(found["kernel"])
    return found["kernel"], "kernel.json does not describe its kernel (JSONDecodeError)"


def edit_baseline(found):
    rewrite_json(found["op1"] / "op_cost.json", lambda r: r.update(unfused_us=0.001))
    return found["op1"], "op_cost.json differs from its manifest"


def edit_final_compile(found):
    """A new target of the same cost tables asks (no kernel entry yet) and finds the checked
    compile it would share edited: a faster time forged."""
    shutil.rmtree(found["kernel"])
    rewrite_json(found["final"] / "result.json", lambda r: r.update(aicore_us=r["aicore_us"] / 10))
    return found["final"], "result.json differs from its manifest"


@pytest.mark.pypto
@pytest.mark.parametrize("tamper", [edit_cost, edit_source, add_file, break_json, edit_baseline,
                                    edit_final_compile])
def test_a_damaged_entry_is_compiled_again_with_one_warning_and_the_same_blob(
        clean, tamper, tmp_path):
    """On main these entries were used as they were: an edited cost, source or baseline went
    into the blob, and broken JSON crashed the build."""
    folder, model, clean_summary, _ = clean
    cache = tmp_path / "cache"
    shutil.copytree(folder / "cache", cache)
    damaged, why = tamper(entries(cache))
    summary, err = build(model, tmp_path / "rebuilt.ptom", cache, cwd=tmp_path)
    assert [line for line in err.splitlines() if WARNING in line] == [
        f"{WARNING}{damaged} is damaged ({why}); compiling it again"]
    assert fused(summary)
    recompiled_kernel = tamper is not edit_baseline
    recompiled_final = tamper is edit_final_compile
    assert summary["kernel_cache"] == {"hits": int(not recompiled_kernel),
                                       "compiled": int(recompiled_kernel),
                                       "pypto_compiles": int(recompiled_final)}
    assert (tmp_path / "rebuilt.ptom").read_bytes() == (folder / "tiny.ptom").read_bytes()
    # the bad entry was replaced by a whole, verifiable one with the clean build's artifacts
    key = damaged.name

    def artifacts(entry: Path) -> dict:
        return {name: data for name, data in kernel_cache.verified_files(entry, key).items()
                if name.startswith(("final/artifacts/", "artifacts/"))}
    assert artifacts(damaged) == artifacts(folder / "cache" / key[:2] / key)


PLANTED = "open({marker!r}, 'w').write('ran')\n"


@pytest.mark.pypto
def test_a_file_planted_where_kernel_sources_went_is_never_run(clean, tmp_path):
    """On main kernel modules were imported from a fixed shared folder, and one already there
    was not rewritten: any user could plant the next build's kernel."""
    folder, model, _, _ = clean
    record = json.loads((entries(folder / "cache")["kernel"] / "kernel.json").read_text())
    tile = record["tuned_tile"]
    policy = TilePolicy(tile["budget_bytes"], tile["swapped_transposes"], tile["flat_rows"])
    marker = tmp_path / "planted-code-ran"
    shared = tmp_path / "shared-kernels"
    shared.mkdir()
    (shared / f"{record['cache_key'][:16]}_{policy.name}.py").write_text(
        PLANTED.format(marker=str(marker)))
    summary, _ = build(model, tmp_path / "cold.ptom", tmp_path / "cache", cwd=tmp_path,
                       env={"PYPTO_OFFLINE_KERNEL_SRC": str(shared)})
    assert not marker.exists(), "a planted kernel source was run"
    assert fused(summary) and summary["kernel_cache"] == {"hits": 0, "compiled": 1,
                                                          "pypto_compiles": 1}


def stranger_owns(paths: list[Path]) -> str:
    """Another user's (uid 12345) as root; otherwise writable by every user, as what another
    user planted under umask 000 is. Why the trust rule refuses them."""
    for path in paths:
        if os.getuid() == 0:
            os.chown(path, 12345, -1)
        else:
            path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o002)
    return "owned by another user (uid 12345)" if os.getuid() == 0 else "writable by every user"


@pytest.mark.pypto
def test_a_kernel_entry_another_user_planted_is_never_shipped(clean, tmp_path):
    """Issue 34 row 1: another user plants the kernel's entry, its control_flow_host.cpp edited
    and its manifest signed again. On cb4dc9a the build hit it and shipped the planted file
    (verification passed, exit 0). Now a cache root another user owns stops the build before
    any work, and in the user's own cache (its prefix folder left open by umask 000) the planted
    entry is not trusted: compiled again, the clean build's blob."""
    folder, model, _, _ = clean
    cache = tmp_path / "cache"
    shutil.copytree(folder / "cache", cache)
    kernel = entries(cache)["kernel"]
    (planted,) = kernel.rglob("control_flow_host.cpp")
    planted.write_text(planted.read_text() + "\n// planted by another user\n")
    resign(kernel)
    kernel.parent.chmod(0o777)
    why = stranger_owns([kernel, *kernel.rglob("*")])
    mode = stat.S_IMODE(cache.stat().st_mode)
    stranger_owns([cache])
    _, err = build(model, tmp_path / "refused.ptom", cache, cwd=tmp_path, expect_exit=2)
    assert f"{cache}: the kernel cache is {why}" in err and not (tmp_path / "refused.ptom").exists()
    os.chown(cache, os.getuid(), -1)
    cache.chmod(mode)
    summary, err = build(model, tmp_path / "rebuilt.ptom", cache, cwd=tmp_path)
    assert [line for line in err.splitlines() if WARNING in line] == [
        f"{WARNING}{kernel} is not trusted (its folder is {why}, another user could have written "
        f"it); compiling it again"]
    assert fused(summary)
    assert summary["kernel_cache"] == {"hits": 0, "compiled": 1, "pypto_compiles": 0}
    shipped = (tmp_path / "rebuilt.ptom").read_bytes()
    assert shipped == (folder / "tiny.ptom").read_bytes() and b"planted" not in shipped


# Cheap checks of the cache's parts, no PyPTO needed.

def test_an_entry_reads_back_whole_and_a_stranger_under_its_key_is_a_miss(tmp_path, capfd):
    cache = KernelCache(tmp_path)
    key, other = "ab" * 32, "cd" * 32
    stored(cache, key, {"kernel.json": '{"x": 1}', "final/artifacts/a.txt": "a"})
    assert cache.read(key, as_json) == {"x": 1}
    assert capfd.readouterr().err == ""
    # a whole, well-signed entry copied under another key
    shutil.copytree(cache.entry(key), cache.entry(other).parent / other)
    assert cache.read(other, as_json) is None
    err = capfd.readouterr().err
    assert err.count(WARNING) == 1 and f"stored under key {key[:16]}" in err
    assert not os.path.lexists(cache.entry(other))  # moved aside, ready to be replaced
    assert cache.read(other, as_json) is None and capfd.readouterr().err == ""  # a plain miss
    assert not list((tmp_path / kernel_cache.STAGING).iterdir())


@pytest.mark.parametrize("damage,why", [
    (lambda e: (e / "manifest.json").unlink(), "no manifest.json"),
    (lambda e: (e / "manifest.json").write_text("[1"), "manifest.json is not a manifest"),
    (lambda e: (e / "final" / "artifacts" / "a.txt").unlink(),
     "files missing ['final/artifacts/a.txt']"),
    (lambda e: (e / "final" / "link").symlink_to("/etc/passwd"), "final/link is a symbolic link"),
])
def test_a_damaged_entry_is_a_miss_with_its_reason(damage, why, tmp_path, capfd):
    cache = KernelCache(tmp_path)
    key = "ef" * 32
    damage(stored(cache, key, {"kernel.json": "{}", "final/artifacts/a.txt": "a"}))
    assert cache.read(key, as_json) is None
    (line,) = capfd.readouterr().err.splitlines()
    assert line == f"{WARNING}{cache.entry(key)} is damaged ({why}); compiling it again"


def test_an_op_cost_entry_of_an_earlier_release_is_read_and_a_stranger_is_damaged(tmp_path):
    """Before issue 33 an op cost entry kept its record in kernel.json: an upgrade must not
    measure every baseline op again (bench/results/behaviour/). A record of another schema,
    or of other sources, is still refused."""
    from functools import partial

    from pypto_offline.pypto_kernels.entries import cached_op_cost

    cache, policy = KernelCache(tmp_path), TilePolicy(65536, False, False)
    sources = {policy: "source of the op"}
    record = {"unfused_us": 1.5, "sources": {policy.name: "source of the op"}}
    for key, name in (("a1" * 32, "kernel.json"), ("a2" * 32, "op_cost.json")):
        stored(cache, key, {name: json.dumps(record)})
        assert cache.read(key, partial(cached_op_cost, sources=sources)) == record
    with pytest.raises(kernel_cache.DamagedEntry, match="no op cost record"):
        cached_op_cost({"kernel.json": b'{"cache_key": "x", "compiled": true}'}, sources)
    with pytest.raises(kernel_cache.DamagedEntry, match="not the ones generated"):
        cached_op_cost({"op_cost.json": json.dumps(record).encode()},
                       {policy: "another source"})


def test_cache_folders_are_absolute_whatever_the_user_gave(tmp_path, monkeypatch):
    from pypto_offline.pypto_kernels.jobs.processes import calculator_cache

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYPTO_OFFLINE_CACHE", raising=False)  # it would move the kernel cache
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-xdg")
    assert KernelCache("rel").root == tmp_path / "rel"
    assert kernel_cache.default_cache_dir() == tmp_path / "relative-xdg/pypto-offline/kernels"
    assert calculator_cache() == tmp_path / "relative-xdg/pypto-offline/calculator"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert kernel_cache.default_cache_dir() == tmp_path / "home/.cache/pypto-offline/kernels"
    assert KernelCache("~/c").root == tmp_path / "home/c"


def test_the_staging_folder_must_be_this_users_own_real_folder(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    linked = KernelCache(tmp_path / "linked").root / kernel_cache.STAGING  # a cache of ours
    linked.rmdir()
    linked.symlink_to(elsewhere)
    with pytest.raises(UsageError, match="not a folder of this user's"):
        KernelCache(tmp_path / "linked")
    opened = tmp_path / "open" / kernel_cache.STAGING
    opened.mkdir(parents=True)
    opened.chmod(0o777)
    KernelCache(tmp_path / "open")
    assert opened.stat().st_mode & 0o777 == 0o700


def test_staging_of_dead_builds_is_removed_and_a_live_builds_kept(tmp_path):
    """And nothing not named as a staging folder is: on 1e2aec7 anything a day old went."""
    staging = tmp_path / kernel_cache.STAGING
    staging.mkdir(mode=0o700)
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {"dead": f"{host}-{dead.pid}-x1", "live": f"{host}-{os.getpid()}-x2",
             "other-host": f"elsewhere.example-{os.getpid()}-x3", "old": f"{host}-1-x4",
             "not-staging": "photos"}
    for name in names.values():
        (staging / name / "search").mkdir(parents=True)
    (staging / f"{host}-1-file").write_text("not a folder")
    a_day_ago = time.time() - kernel_cache.STALE_STAGING_S - 60
    for old in (names["old"], names["not-staging"], f"{host}-1-file"):
        os.utime(staging / old, (a_day_ago, a_day_ago))
    kernel_cache.remove_dead_staging(staging)
    assert sorted(p.name for p in staging.iterdir()) == sorted(
        [names["live"], names["other-host"], "photos", f"{host}-1-file"])
