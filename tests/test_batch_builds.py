"""Issue 20's batch builds: several models for several targets in one invocation, one worker pool
and one kernel cache; ``--output-dir`` names the files; ``--json`` prints one JSON object per
build per line, in the order given; the exit code is the worst of the builds; outputs are
checked before any work."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.json_schema import schema_validator
from tests.malformed import EXAMPLE
from tests.onnx_builders import GraphBuilder, one_node

REPO = Path(__file__).resolve().parent.parent
TARGETS = "kirin9050,ascend910b"


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pypto_offline", *map(str, args)],
                          capture_output=True, text=True, env=environment, cwd=cwd, timeout=900)


def small_model(path: Path) -> Path:
    b = GraphBuilder()
    x = b.input("frames", [1, 8, 16, 16])  # not the example's x: --input-shape x is not its
    path.write_bytes(b.model(b.op("Sigmoid", [b.op("Neg", [b.op("Relu", [x])])]))
                     .SerializeToString())
    return path


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Two models (the example and a small one) for two targets, in one invocation."""
    folder = tmp_path_factory.mktemp("batch")
    models = [folder / "example.onnx", small_model(folder / "small.onnx")]
    shutil.copy(EXAMPLE, models[0])
    done = run_cli(*models, "--target", TARGETS, "--input-shape", "x=1,3,64,64",
                   "--output-dir", folder / "out", "--cache-dir", folder / "cache",
                   "--no-tile-search", "--json", "--quiet")
    return folder, models, done


@pytest.mark.pypto
def test_a_batch_writes_every_build_and_one_json_line_each_in_order(batch):
    folder, models, done = batch
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    builds = [json.loads(line) for line in lines]
    assert [(Path(b["model"]).stem, b["target"]) for b in builds] == [
        (m.stem, t) for m in models for t in TARGETS.split(",")]
    for build in builds:
        assert build["schema_version"] == 8 and build["verification"]["status"] == "passed"
        assert Path(build["blob"]) == folder / "out" / f"{Path(build['model']).stem}." \
                                                       f"{build['target']}.ptom"
        assert Path(build["blob"]).is_file() and Path(build["report"]).is_file()
    # one cache, two platforms (docs/platform.md): each target compiles under its own chip's
    assert builds[1]["kernel_cache"]["pypto_compiles"] > 0
    assert builds[0]["platform"]["digest"] != builds[1]["platform"]["digest"]
    assert (builds[0]["platform"]["native"], builds[1]["platform"]["native"]) == (False, True)


@pytest.mark.pypto
def test_a_batch_blob_is_the_blob_of_a_build_alone(batch, tmp_path):
    folder, models, _ = batch
    alone = tmp_path / "small.kirin9050.ptom"
    done = run_cli(models[1], "--target", "kirin9050", "-o", alone, "--no-report",
                   "--cache-dir", tmp_path / "cache", "--no-tile-search", "--quiet")
    assert done.returncode == 0, done.stderr
    assert alone.read_bytes() == (folder / "out" / "small.kirin9050.ptom").read_bytes()


@pytest.mark.pypto
def test_a_bad_model_in_a_batch_is_exit_2_and_the_others_are_built(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    good = small_model(tmp_path / "good.onnx")
    done = run_cli(broken, good, "--target", "kirin9050", "--output-dir", tmp_path / "out",
                   "--cache-dir", tmp_path / "cache", "--no-tile-search", "--no-report",
                   "--json", "--quiet")
    assert done.returncode == 2, done.stderr
    assert f"{broken} for kirin9050" in done.stderr and "Traceback" not in done.stderr
    failed, built = map(json.loads, done.stdout.splitlines())
    assert (failed["status"], failed["model"], built["model"]) == ("failed", str(broken), str(good))
    assert (tmp_path / "out" / "good.kirin9050.ptom").is_file()
    assert not (tmp_path / "out" / "broken.kirin9050.ptom").exists()


@pytest.mark.parametrize("options,expected", [
    (["-o", "one.ptom"], "use --output-dir"),
    (["--output-dir", "out"], "would both write"),
    (["--input-shape", "y=1,2"], "'y', an input of none of the models"),
])
def test_outputs_that_cannot_serve_a_batch_are_refused_before_any_work(options, expected,
                                                                        tmp_path, monkeypatch,
                                                                        capfd):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = small_model(tmp_path / "a" / "m.onnx"), small_model(tmp_path / "b" / "m.onnx")
    monkeypatch.chdir(tmp_path)
    code = main(first, second, "--target", "kirin9050", *options, "--cache-dir",
                tmp_path / "cache")
    err = capfd.readouterr().err
    assert code == 2 and expected in err, err
    assert not (tmp_path / "cache").exists()  # refused before any work


# --- issue 34: batches of models that need no PyPTO kernel (one MatMul: no memory-bound op),
# run in this process (cli.main) to keep the fast tier fast ---------------------------------

def matmul_model(path: Path) -> Path:
    import numpy as np

    path.write_bytes(one_node("MatMul", [2, 3], opset=17, params={
        "w": np.arange(12, dtype=np.float32).reshape(3, 4)}).SerializeToString())
    return path


def main(*args) -> int:
    from pypto_offline import cli

    return cli.main([str(a) for a in args])


def test_a_json_batch_prints_a_line_for_every_build_a_failed_one_too(tmp_path, capfd):
    """Row 14: on cb4dc9a good, bad, good printed 2 lines: the bad build had no line and no
    row."""
    models = [matmul_model(tmp_path / "first.onnx"), tmp_path / "broken.onnx",
              matmul_model(tmp_path / "second.onnx")]
    models[1].write_bytes(b"not a model")
    options = ["--target", "kirin9050", "--output-dir", tmp_path / "out", "--cache-dir",
               tmp_path / "cache", "--no-report"]
    assert main(*models, *options, "--json", "--quiet") == 2
    done = capfd.readouterr()
    lines = [json.loads(line) for line in done.out.splitlines()]
    assert [line["model"] for line in lines] == [str(m) for m in models]
    assert [line.get("status") for line in lines] == [None, "failed", None]
    assert lines[1]["exit_code"] == 2 and "broken.onnx" in done.err
    for line, kind in zip(lines, ("build", "build_failure", "build")):
        assert not list(schema_validator(kind).iter_errors(line)), (kind, line)
    assert main(*models, *options) == 2
    table = capfd.readouterr().out
    assert "broken.onnx  kirin9050  -" in table and "failed (exit 2)" in table, table


@pytest.mark.parametrize("twice", ["models", "targets"])
def test_a_model_or_a_target_given_twice_is_built_once_with_a_note(twice, tmp_path, capfd):
    """Row 15: on cb4dc9a the same model twice, or kirin9050,Kirin9050, was built twice into the
    same files, exit 0 (while a/m.onnx ./a/m.onnx was refused): one rule for both now."""
    model = matmul_model(tmp_path / "m.onnx")
    models = [model, tmp_path / "." / "m.onnx"] if twice == "models" else [model]
    targets = "kirin9050" if twice == "models" else "kirin9050,Kirin9050"
    assert main(*models, "--target", targets, "--cache-dir", tmp_path / "cache",
                "--no-report", "--json", "--quiet") == 0
    done = capfd.readouterr()
    assert len(done.out.splitlines()) == 1
    assert "pypto-offline: note:" in done.err and "twice" in done.err, done.err


def test_a_blob_path_that_is_a_link_replaces_the_link_not_its_target(tmp_path, capfd):
    """Row 16 (documented in docs/outputs.md): ``-o`` naming a symbolic link writes a new file
    in the link's place; the file it pointed to is left as it was."""
    model = matmul_model(tmp_path / "m.onnx")
    (tmp_path / "elsewhere.ptom").write_bytes(b"someone else's file")
    (tmp_path / "out.ptom").symlink_to(tmp_path / "elsewhere.ptom")
    assert main(model, "--target", "kirin9050", "-o", tmp_path / "out.ptom", "--cache-dir",
                tmp_path / "cache", "--no-report", "--quiet") == 0, capfd.readouterr().err
    assert not (tmp_path / "out.ptom").is_symlink() and (tmp_path / "out.ptom").stat().st_size
    assert (tmp_path / "elsewhere.ptom").read_bytes() == b"someone else's file"
