"""The build's options as a pipeline uses them (issue 20): ATC's spellings (--soc_version and the
chip names users type, --input_shape, --output as a stem), --dim for symbolic dimensions, a
--input-shape that contradicts the model refused, --fail-on-fallback, and a kernel cache one can
inspect and clean (PYPTO_OFFLINE_CACHE, `cache info`, `cache clean`) while builds use it.

One real PyPTO compile (the bundled example, no tile search) is shared by the module; the other
builds hit its cache or compile no kernel."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

import pypto_offline
from pypto_offline import api, cli, import_model
from pypto_offline.cli import builds
from pypto_offline.errors import UsageError
from pypto_offline.importer.gears import parse_dim_values
from pypto_offline.importer.input_shapes import parse_atc_shapes
from pypto_offline.pypto_kernels import cache as kernel_cache
from pypto_offline.pypto_kernels import cache_maintenance
from pypto_offline.pypto_kernels.cache import KernelCache
from pypto_offline.targets import TARGETS, known_names, resolve_target
from tests.malformed import EXAMPLE
from tests.onnx_builders import GraphBuilder

KIRIN = ["--target", "kirin9050"]


@pytest.fixture(scope="module")
def example_build(tmp_path_factory):
    """The example built as an ATC user would write it: the chip's name through --soc_version,
    the batch by name, the output as a stem, failing on any fallback."""
    folder = tmp_path_factory.mktemp("atc")
    (folder / "out").mkdir()
    cache = folder / "cache"
    done = subprocess.run(
        [sys.executable, "-m", "pypto_offline", str(EXAMPLE), "--soc_version", "KIRIN9050",
         "--dim", "batch=1", "--output", "out/model_k9050", "--fail-on-fallback",
         "--no-tile-search", "--cache-dir", str(cache), "--json"],
        capture_output=True, text=True, cwd=folder, timeout=900)
    return folder, cache, done


# --- chip names ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,target", [
    ("Kirin9030", "kirin9030"), ("kirin9030", "kirin9030"), ("Kirin9050", "kirin9050"),
    ("KirinDev0000", "kirin9050"), ("KirinX90", "kirin90"), ("Kirin90", "kirin90"),
    ("KIRINX90", "kirin90"), ("Ascend910B", "ascend910b"), ("Ascend910B1", "ascend910b"),
    ("Ascend910B2", "ascend910b"), ("ascend910b3", "ascend910b"), ("Ascend910B4", "ascend910b"),
    ("Ascend950PR", "ascend950"), ("Ascend950DT", "ascend950"), ("Ascend950PR_9589", "ascend950"),
    ("ascend950", "ascend950"),
])
def test_a_chip_name_resolves_to_the_target_that_models_it(name, target):
    assert resolve_target(name).name == target
    assert api.get_target(name) is TARGETS[target]


def test_every_target_answers_to_its_own_name_and_soc_version():
    for name, target in TARGETS.items():
        assert resolve_target(name.upper()) is target
        assert resolve_target(target.soc_version.value) is target


def test_an_unknown_chip_name_is_one_line_listing_the_known_ones(capfd):
    assert cli.main([str(EXAMPLE), "--soc_version", "Ascend310P3"]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert "unknown target 'Ascend310P3'" in line
    assert all(name in line for name in known_names())


def test_targets_lists_each_targets_chip_names(capfd):
    assert cli.main(["targets", "--json"]) == 0
    listing = json.loads(capfd.readouterr().out)["targets"]
    assert listing["kirin9050"]["chip_names"] == ["KirinDev0000", "Kirin9050"]
    assert "Ascend950DT" in listing["ascend950"]["chip_names"]
    assert cli.main(["targets"]) == 0
    assert "Ascend910B3" in capfd.readouterr().out


@pytest.mark.pypto
def test_a_blob_is_checked_against_a_chip_name(example_build):
    folder, _, done = example_build
    assert done.returncode == 0, done.stderr
    blob = folder / "out" / "model_k9050.ptom"
    assert pypto_offline.load(blob, expected_target="Kirin9050").target == "kirin9050"
    with pytest.raises(pypto_offline.ModelError, match="compiled for 'kirin9050'"):
        pypto_offline.load(blob, expected_target="Ascend910B3")


# --- the ATC-style build ------------------------------------------------------------------------

@pytest.mark.pypto
def test_the_atc_spelled_build_writes_the_stem_and_passes(example_build):
    folder, _, done = example_build
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert sorted(p.name for p in (folder / "out").iterdir()) == [
        "model_k9050.ptom", "model_k9050.report.html"]
    assert summary["blob"] == "out/model_k9050.ptom"
    assert summary["report"] == "out/model_k9050.report.html"
    assert summary["target"] == "kirin9050"
    assert [k["status"] for k in summary["kernels"]] == ["compiled"]
    assert summary["verification"]["status"] == "passed"
    message = pypto_offline.load(folder / "out" / "model_k9050.ptom").message
    assert message.provenance.options["dims"] == "batch=1"
    assert [d.dim_value for d in onnx.load_from_string(message.source_onnx_model)
            .graph.input[0].type.tensor_type.shape.dim] == [1, 3, 64, 64]


@pytest.mark.pypto
def test_atc_input_shape_builds_the_same_graph_as_dim(example_build, tmp_path):
    """Same shapes, same kernel: the second build is a cache hit of the first's."""
    folder, cache, done = example_build
    assert done.returncode == 0, done.stderr
    out = tmp_path / "again.ptom"
    assert cli.main([str(EXAMPLE), *KIRIN, "--input_shape", "x:1,3,64,64", "-o", str(out),
                     "--no-tile-search", "--cache-dir", str(cache), "--quiet",
                     "--no-report"]) == 0
    again = pypto_offline.load(out)
    first = pypto_offline.load(folder / "out" / "model_k9050.ptom")
    assert again.message.onnx_model == first.message.onnx_model
    assert again.message.provenance.options["input_shapes"] == "x=1,3,64,64"


@pytest.mark.parametrize("given,expected", [
    ("out/model", "out/model.ptom"), ("out/model.ptom", "out/model.ptom"),
    ("model.v1", "model.v1.ptom"), ("m.PTOM", "m.PTOM"),
])
def test_output_without_ptom_is_a_stem(given, expected):
    assert builds.blob_path(given) == Path(expected)


def test_a_stem_naming_a_folder_or_the_model_is_refused(tmp_path, capfd):
    """A stem is checked as given too: `-o out` where out is a folder, or `-o model.onnx`, is a
    slip, not a request for out.ptom or model.onnx.ptom."""
    model = tmp_path / "m.onnx"
    onnx.save(two_input_model(), model)
    (tmp_path / "out").mkdir()
    for output, message in ((tmp_path / "out", "names a folder, a device or a pipe"),
                            (model, "is the same file as the input model"),
                            (str(tmp_path / "new") + "/", "names a folder")):
        assert cli.main([str(model), *KIRIN, "-o", str(output)]) == 2
        assert message in capfd.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out"]


# --- input shapes and symbolic dimensions -------------------------------------------------------

def two_input_model() -> onnx.ModelProto:
    """ids [batch, seq] and mask [batch, seq, 4] (its last axis static), added."""
    b = GraphBuilder()
    ids = b.input("ids", ["batch", "seq", 1])
    mask = b.input("mask", ["batch", "seq", 4])
    return b.model(b.op("Add", [b.op("Relu", [ids]), mask]))


def test_atc_input_shape_parses_several_inputs():
    assert parse_atc_shapes("x:1,3,224,224;y:1,16") == [("x", [1, 3, 224, 224]), ("y", [1, 16])]
    assert parse_atc_shapes("input:0:1,4;") == [("input:0", [1, 4])]  # a TensorFlow name
    for bad in ("x=1,3", "x:1,a", ":1,2"):
        with pytest.raises(UsageError, match="--input_shape"):
            parse_atc_shapes(bad)


def test_dim_parses_and_refuses_what_is_no_size():
    assert parse_dim_values("batch=1") == ("batch", (1,))
    assert parse_dim_values("past=16,32") == ("past", (16, 32))  # two gears
    for bad in ("batch", "=1", "batch=x", "batch=1,,2"):
        with pytest.raises(UsageError, match="--dim"):
            parse_dim_values(bad)


def test_dim_fixes_a_symbolic_dimension_in_every_input_and_input_shape_wins():
    graph = import_model(two_input_model(), {"mask": [2, 5, 4]}, dims={"batch": 2, "seq": 5})
    assert graph.tensors["ids"].shape == (2, 5, 1) and graph.tensors["mask"].shape == (2, 5, 4)
    graph = import_model(two_input_model(), {"ids": [3, 7, 1]}, dims={"batch": 3, "seq": 7})
    assert graph.tensors["mask"].shape == (3, 7, 4)


@pytest.mark.parametrize("dims,message", [
    ({"batc": 1}, "--dim 'batc' names no symbolic dimension of the model's inputs (its symbolic "
                  "dimensions are: batch, seq)"),
    ({"batch": -1}, "--dim batch=-1: a dimension is a whole number from 1 to"),
    ({"batch": 0}, "--dim batch=0: a dimension is a whole number from 1 to"),
])
def test_a_wrong_dim_is_a_usage_error(dims, message):
    with pytest.raises(UsageError) as error:
        import_model(two_input_model(), dims=dims)
    assert message in str(error.value)


@pytest.mark.parametrize("options,message", [
    (["--dim", "batch=0", "--dim", "seq=4"], "--dim batch=0: a dimension is a whole number from 1"),
    (["--input-shape", "ids=0,4,1", "--dim", "seq=4"],
     "has a dimension of size 0: the input would be empty")])
def test_a_zero_sized_input_is_refused_before_any_work(options, message, tmp_path, capfd):
    """Issue 34 row 18: on cb4dc9a an empty input was accepted and its region fell back
    ("compile failed", cached), exit 0."""
    model = tmp_path / "m.onnx"
    onnx.save(two_input_model(), model)
    assert cli.main([str(model), *KIRIN, *options]) == 2
    (line,) = capfd.readouterr().err.splitlines()[-1:]
    assert message in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("options,message", [
    ([], "input 'ids' has symbolic dims ['batch', 'seq']: give --dim batch=N --dim seq=N or "
         "--input-shape ids=..."),
    (["--dim", "batch=1"], "input 'ids' has symbolic dims ['seq']: give --dim seq=N or "
                           "--input-shape ids=..."),
])
def test_an_input_left_dynamic_names_its_symbolic_dims(options, message, tmp_path, capfd):
    model = tmp_path / "m.onnx"
    onnx.save(two_input_model(), model)
    assert cli.main([str(model), *KIRIN, *options]) == 2
    (line,) = capfd.readouterr().err.splitlines()[-1:]
    assert line == f"pypto-offline: error: m.onnx: {message}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_an_unnamed_dynamic_dim_asks_for_input_shape(tmp_path, capfd):
    model = two_input_model()
    model.graph.input[0].type.tensor_type.shape.dim[1].Clear()  # seq of ids: no name at all
    onnx.save(model, tmp_path / "m.onnx")
    assert cli.main([str(tmp_path / "m.onnx"), *KIRIN, "--dim", "batch=1", "--dim",
                     "seq=2"]) == 2
    assert ("input 'ids' has 1 dynamic dim(s) without a name: give --input-shape ids=..."
            in capfd.readouterr().err)


def test_input_shape_contradicting_a_static_dim_is_refused(tmp_path, capfd):
    """Before, the model's 64x64 was silently replaced: a model built for one size compiled at
    another."""
    for shape in (["--input-shape", "x=1,3,65,64"], ["--input_shape", "x:1,3,64,65"]):
        assert cli.main([str(EXAMPLE), *KIRIN, *shape, "-o", str(tmp_path / "b.ptom")]) == 2
        err = capfd.readouterr().err
        assert f"input 'x': {shape[0]} gives" in err  # the option typed, of two syntaxes
        assert "but the model declares ['batch', 3, 64, 64]" in err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UsageError, match="dimension 2 is static, 4"):
        import_model(two_input_model(), {"mask": [1, 2, 5]}, dims={"batch": 1, "seq": 2})


def test_the_same_input_given_twice_is_refused(capfd):
    assert cli.main([str(EXAMPLE), *KIRIN, "--input-shape", "x=1,3,64,64", "--input_shape",
                     "x:1,3,64,64"]) == 2
    assert "--input-shape and --input_shape both name 'x'" in capfd.readouterr().err
    assert cli.main([str(EXAMPLE), *KIRIN, "--dim", "batch=1", "--dim", "batch=2"]) == 2
    assert "--dim names 'batch' twice" in capfd.readouterr().err


# --- --fail-on-fallback -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def refused_region_model(tmp_path_factory) -> Path:
    """One fusable region the kernel generator refuses before PyPTO (a rank-6 transpose that
    reverses every axis cannot fold to PyPTO's rank 4): it falls back and costs no compile."""
    b = GraphBuilder()
    x = b.input("x", [2, 3, 2, 3, 2, 8])
    path = tmp_path_factory.mktemp("fallback") / "deep.onnx"
    onnx.save(b.model(b.op("Transpose", [b.op("Relu", [x])], perm=[5, 4, 3, 2, 1, 0])), path)
    return path


def test_fail_on_fallback_exits_1_with_the_reasons_and_still_writes(refused_region_model,
                                                                    tmp_path, capfd):
    out = tmp_path / "deep.ptom"
    assert cli.main([str(refused_region_model), *KIRIN, "-o", str(out), "--json",
                     "--fail-on-fallback", "--cache-dir", str(tmp_path / "cache")]) == 1
    captured = capfd.readouterr()
    (fell_back,) = json.loads(captured.out)["kernels"]
    assert fell_back["id"] == "region_0" and fell_back["ops"] == ["Relu", "Transpose"]
    assert fell_back["status"] == "fell_back" and fell_back["fallback_category"] == "cannot express"
    assert "does not fold to 4 axes" in fell_back["fallback_reason"]
    lines = [line for line in captured.err.splitlines() if line.startswith("pypto-offline:")]
    assert lines[0].startswith("pypto-offline: fell back: region_0 Relu+Transpose: ")
    assert "does not fold to 4 axes" in lines[0]
    assert lines[1] == (f"pypto-offline: --fail-on-fallback: {refused_region_model} for "
                        "kirin9050: 1 of 1 planned regions fell back (the blob and report are "
                        "written)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "deep.ptom",
                                                          "deep.report.html"]
    assert pypto_offline.load(out).summary()["verification"]["status"] == "passed"


def test_without_the_flag_a_fallback_is_listed_and_exits_0(refused_region_model, tmp_path,
                                                           capfd):
    assert cli.main([str(refused_region_model), *KIRIN, "-o", str(tmp_path / "d.ptom"),
                     "--json", "--no-report", "--cache-dir", str(tmp_path / "cache")]) == 0
    captured = capfd.readouterr()
    assert [(k["id"], k["status"]) for k in json.loads(captured.out)["kernels"]] == [
        ("region_0", "fell_back")]
    assert "--fail-on-fallback" not in captured.err


def test_fail_on_fallback_is_in_the_help(capfd):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "--fail-on-fallback" in capfd.readouterr().out


# --- the kernel cache ---------------------------------------------------------------------------

def stored(cache: KernelCache, key: str, files: dict[str, str], used: float | None = None) -> Path:
    staged = cache.staging()
    for name, text in files.items():
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_text(text)
    cache.put(key, staged)
    if used is not None:
        os.utime(cache.entry(key), (used, used))
    return cache.entry(key)


def cache_cli(capfd, *argv: str) -> dict:
    assert cli.main(["cache", *argv, "--json"]) == 0
    return json.loads(capfd.readouterr().out)


def test_the_env_var_moves_the_default_cache_and_cache_dir_wins(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("PYPTO_OFFLINE_CACHE", str(tmp_path / "shared"))
    assert kernel_cache.default_cache_dir() == tmp_path / "shared"
    assert KernelCache().root == tmp_path / "shared"
    assert cache_cli(capfd, "info")["folder"] == str(tmp_path / "shared")
    assert cache_cli(capfd, "info", "--cache-dir", str(tmp_path / "mine"))["folder"] == \
        str(tmp_path / "mine")
    monkeypatch.delenv("PYPTO_OFFLINE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.default_cache_dir() == tmp_path / "xdg" / "pypto-offline" / "kernels"


@pytest.mark.pypto
def test_info_counts_a_real_builds_entries_by_kind(example_build, capfd):
    _, cache, done = example_build
    assert done.returncode == 0, done.stderr
    info = cache_cli(capfd, "info", "--cache-dir", str(cache))
    kinds = info["entries_by_kind"]
    assert kinds["kernels"] == 1 and kinds["compiles"] == 1 and kinds["host_compiler"] >= 1
    assert info["entries"] == sum(kinds.values())
    files = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    assert info["total_bytes"] == files and 0 < info["entry_bytes"] <= files
    assert cli.main(["cache", "info", "--cache-dir", str(cache)]) == 0
    assert f"entries: {info['entries']} (" in capfd.readouterr().out


@pytest.mark.pypto
def test_clean_removes_every_entry_and_leaves_a_live_builds_staging(example_build, tmp_path,
                                                                    capfd):
    _, cache, done = example_build
    assert done.returncode == 0, done.stderr
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    before = cache_cli(capfd, "info", "--cache-dir", str(copy))
    host, dead = socket.gethostname(), subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = copy / kernel_cache.STAGING / f"{host}-{os.getpid()}-building"
    (live / "final").mkdir(parents=True)
    (live / "final" / "half-written.json").write_text("{")
    (copy / kernel_cache.STAGING / f"{host}-{dead.pid}-died").mkdir()
    result = cache_cli(capfd, "clean", "--cache-dir", str(copy))
    assert result["removed"] == {"entries": before["entries"], "bytes": before["entry_bytes"]}
    assert result["left"]["entries"] == 0
    assert cache_maintenance.entries(copy) == []
    # the dead build's went
    assert [p.name for p in (copy / kernel_cache.STAGING).iterdir()] == [live.name]
    assert (live / "final" / "half-written.json").read_text() == "{"
    assert cli.main(["cache", "clean", "--cache-dir", str(copy)]) == 0
    assert capfd.readouterr().out.startswith("removed 0 entries, 0 bytes")


def test_clean_older_than_removes_what_was_not_used_for_that_long(tmp_path, capfd):
    cache = KernelCache(tmp_path)
    now = time.time()
    old = stored(cache, "aa" * 32, {"kernel.json": "{}"}, used=now - 40 * 86400)
    used_again = stored(cache, "bb" * 32, {"result.json": "{}"}, used=now - 40 * 86400)
    recent = stored(cache, "cc" * 32, {"kernel.json": "{}"}, used=now - 86400)
    assert cache.read("bb" * 32, lambda files: files) is not None  # a hit marks it used
    result = cache_cli(capfd, "clean", "--older-than", "30", "--cache-dir", str(tmp_path))
    assert result["removed"]["entries"] == 1
    assert not old.exists() and used_again.exists() and recent.exists()


def test_clean_max_size_evicts_the_least_recently_used_first(tmp_path, capfd):
    cache = KernelCache(tmp_path)
    now = time.time()
    big = "x" * 100_000
    entries = [stored(cache, f"{i:02x}" * 32, {"kernel.json": big}, used=now - (10 - i) * 60)
               for i in range(4)]  # entries[0] used longest ago
    size = cache_maintenance.folder_bytes(tmp_path)
    result = cache_cli(capfd, "clean", "--max-size", str((size - 150_000) / 1e9),
                       "--cache-dir", str(tmp_path))
    assert result["removed"]["entries"] == 2
    assert [e.exists() for e in entries] == [False, False, True, True]
    assert result["left"]["total_bytes"] <= size - 150_000


def test_an_entry_is_renamed_aside_whole_before_it_is_deleted(tmp_path, monkeypatch):
    """A reader sees an entry whole or not at all: it leaves its place in one rename, into the
    cache's staging area, and is deleted only there."""
    cache = KernelCache(tmp_path)
    entry = stored(cache, "dd" * 32, {"kernel.json": "{}", "final/artifacts/a.bin": "a"})
    deleted = []

    def record(path, ignore_errors=False):
        if not deleted:
            deleted.append(sorted(p.relative_to(path).as_posix() for p in Path(path).rglob("*")))
            deleted.append(Path(path).parent.parent)
            assert not entry.exists()

    monkeypatch.setattr(cache_maintenance.shutil, "rmtree", record)
    cache_maintenance.clean_cache(tmp_path)
    assert deleted[0] == ["final", "final/artifacts", "final/artifacts/a.bin", "kernel.json",
                          "manifest.json"]
    assert deleted[1] == tmp_path / kernel_cache.STAGING


def test_a_reader_losing_an_entry_to_clean_takes_it_for_a_miss(tmp_path, monkeypatch, capfd):
    cache = KernelCache(tmp_path)
    key = "ee" * 32
    stored(cache, key, {"kernel.json": "{}"})
    honest = kernel_cache.verified_files

    def cleaned_midway(entry, wanted, *trust):
        files = honest(entry, wanted, *trust)
        cache_maintenance.clean_cache(tmp_path)
        raise kernel_cache.DamagedEntry("unreadable: No such file or directory")

    monkeypatch.setattr(kernel_cache, "verified_files", cleaned_midway)
    assert cache.read(key, lambda files: files) is None
    assert capfd.readouterr().err == ""  # no "damaged" warning: it was removed, not broken


def test_clean_removes_only_entry_folders(tmp_path, capfd):
    """Even from a cache of ours: what else is in it is no entry (a folder that is no cache is
    refused: tests/test_cache_ownership.py)."""
    KernelCache(tmp_path)
    (tmp_path / "ab" / "photos").mkdir(parents=True)
    (tmp_path / "ab" / "photos" / "cat.jpg").write_text("meow")
    (tmp_path / "cd" / ("ef" * 32)).mkdir(parents=True)  # a key under the wrong prefix
    result = cache_cli(capfd, "clean", "--cache-dir", str(tmp_path))
    assert result["removed"] == {"entries": 0, "bytes": 0}
    assert (tmp_path / "ab" / "photos" / "cat.jpg").read_text() == "meow"
    assert (tmp_path / "cd" / ("ef" * 32)).is_dir()


@pytest.mark.parametrize("argv,message", [
    (["clean", "--older-than", "-1"], "--older-than must be a number of at least 0"),
    (["clean", "--max-size", "nan"], "--max-size must be a number of at least 0"),
    (["clean", "--max-size", "big"], "argument --max-size: invalid float value"),
    (["purge"], "invalid choice: 'purge'"),
    ([], "the following arguments are required"),
])
def test_cache_usage_errors_are_one_line(argv, message, tmp_path, capfd):
    assert cli.main(["cache", *argv, "--cache-dir", str(tmp_path)] if argv else ["cache"]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert message in line


def test_a_cache_dir_that_is_a_file_is_refused(tmp_path, capfd):
    (tmp_path / "file").write_text("")
    for action in ("info", "clean"):
        assert cli.main(["cache", action, "--cache-dir", str(tmp_path / "file")]) == 2
        assert "the kernel cache is not a folder" in capfd.readouterr().err
