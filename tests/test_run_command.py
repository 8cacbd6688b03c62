"""``pypto-offline run`` (issue 51): the blob alone executed on the host, its outputs written as
.npy files, its host and modelled device time reported; every bad input refused with exit 2
before any run, nothing written. The models are one MatMul, which builds without a PyPTO
kernel: the fast tier (tests/test_given_inputs.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from pypto_offline import cli
from pypto_offline.cli.run_command import output_file_name
from tests.json_schema import schema_validator
from tests.test_given_inputs import built, matmul

X23 = np.arange(6, dtype=np.float32).reshape(2, 3) / 7


def with_output_name(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``model`` with its one output renamed ``name``."""
    model.graph.node[0].output[0] = name
    model.graph.output[0].name = name
    return model


@pytest.fixture(scope="module")
def blobs(tmp_path_factory) -> dict[str, tuple[Path, bytes]]:
    """Blobs whose .onnx is deleted once built (the blob alone runs), each with the original
    model's bytes for onnxruntime's reference."""
    folder = tmp_path_factory.mktemp("run-blobs")
    made = {"one": (matmul(np.float32), ["--input-shape", "x=2,3"]),
            "gears": (matmul(np.float32), ["--dim", "batch=1,2"]),
            "slash": (with_output_name(matmul(np.float32), "../y/a\x1bb"),
                      ["--input-shape", "x=2,3"])}
    result = {}
    for name, (model, options) in made.items():
        blob = built(folder, name, model, *options)
        (folder / f"{name}.onnx").unlink()
        result[name] = (blob, model.SerializeToString())
    return result


def onnxruntime_outputs(model: bytes, feeds: dict) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def npz(folder: Path, **arrays) -> str:
    path = folder / "in.npz"
    np.savez(path, **arrays)
    return str(path)


def run(blob: Path, *options: str) -> int:
    return cli.main(["run", str(blob), *options])


@pytest.mark.parametrize("which,x", [("one", X23), ("gears", X23), ("gears", X23[:1])])
def test_run_of_the_blob_alone_equals_onnxruntime_on_the_original_model(blobs, tmp_path, which,
                                                                        x, capfd):
    blob, original = blobs[which]
    assert not blob.with_suffix(".onnx").exists()
    out = tmp_path / "out"
    assert run(blob, "--inputs", npz(tmp_path, x=x), "--output-dir", str(out), "--quiet") == 0
    [expected] = onnxruntime_outputs(original, {"x": x})
    got = np.load(out / "y0.npy", allow_pickle=False)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert capfd.readouterr().out == ""  # --quiet


def test_the_default_output_folder_is_beside_the_blob_and_name_eq_file_npy_is_read(blobs,
                                                                                   tmp_path):
    blob, original = blobs["one"]
    np.save(tmp_path / "x.npy", X23)
    copy = tmp_path / "model.ptom"
    copy.write_bytes(blob.read_bytes())
    assert run(copy, "--inputs", f"x={tmp_path / 'x.npy'}", "--quiet") == 0
    [expected] = onnxruntime_outputs(original, {"x": X23})
    np.testing.assert_allclose(np.load(tmp_path / "model.outputs" / "y0.npy"), expected,
                               rtol=1e-5)


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


BAD = {  # what is given → what the one-line refusal names
    "wrong name": (lambda d: ["--inputs", npz(d, z=X23)], "--inputs names 'z'"),
    "wrong dtype": (lambda d: ["--inputs", npz(d, x=X23.astype(np.float64))],
                    "--inputs gives dtype float64, the model expects float32"),
    "no gear's shape": (lambda d: ["--inputs", npz(d, x=np.zeros((3, 3), np.float32))],
                        "no gear of this blob takes inputs of shapes x=3,3"),
    "missing": (lambda d: [], "--inputs gives no value for 'x'"),
    "another gear's shape": (lambda d: ["--inputs", npz(d, x=X23), "--gear", "0"],
                             "--gear 0 takes inputs of shapes x=1,3, not x=2,3"),
    "a FIFO": (lambda d: (os.mkfifo(d / "fifo"), ["--inputs", str(d / "fifo")])[1],
               "--inputs names a pipe (FIFO)"),
    "a FIFO as NAME=FILE": (lambda d: (os.mkfifo(d / "x.npy"), ["--inputs", f"x={d / 'x.npy'}"])[1],
                            "--inputs names a pipe (FIFO)"),
    "an output dir that is a file": (
        lambda d: ((d / "taken").write_text("mine"),
                   ["--inputs", npz(d, x=X23), "--output-dir", str(d / "taken")])[1],
        "is a file"),
    "--loop 0": (lambda d: ["--inputs", npz(d, x=X23), "--loop", "0"], "--loop 0 is out of range"),
}


@pytest.mark.parametrize("case", BAD)
def test_each_bad_input_exits_2_naming_it_with_nothing_written(blobs, tmp_path, capfd, case):
    blob = tmp_path / "m.ptom"
    blob.write_bytes(blobs["gears"][0].read_bytes())
    options = BAD[case][0](tmp_path)
    before = {p: (p.read_bytes() if p.is_file() else None) for p in tmp_path.iterdir()
              if not p.is_fifo()}
    assert run(blob, *options) == 2
    err = capfd.readouterr().err
    assert BAD[case][1] in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    after = {p: (p.read_bytes() if p.is_file() else None) for p in tmp_path.iterdir()
             if not p.is_fifo()}
    assert after == before  # no output folder, no .npy, the blob unchanged


def test_an_output_that_would_overwrite_the_blob_is_refused(blobs, tmp_path, capfd):
    blob = tmp_path / "y0.npy"  # the file the output y0 would be written to
    blob.write_bytes(blobs["one"][0].read_bytes())
    assert run(blob, "--inputs", npz(tmp_path, x=X23), "--output-dir", str(tmp_path)) == 2
    assert "is the same file as the blob" in capfd.readouterr().err
    assert blob.read_bytes() == blobs["one"][0].read_bytes()


def test_random_inputs_are_seeded_and_said(blobs, tmp_path, capfd):
    blob, _ = blobs["gears"]
    runs = []
    for index, seed in enumerate(["0", "0", "1"]):
        out = tmp_path / str(index)
        assert run(blob, "--random-inputs", "--gear", "1", "--seed", seed, "--output-dir",
                   str(out), "--json") == 0
        captured = capfd.readouterr()
        assert "generated inputs x (--random-inputs, seed " + seed in captured.err
        summary = json.loads(captured.out)
        assert summary["inputs"] == {"given": [], "generated": ["x"], "seed": int(seed)}
        runs.append(np.load(out / "y0.npy"))
    assert runs[0].shape == (2, 4)
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])


def test_random_inputs_with_several_gears_ask_which(blobs, tmp_path, capfd):
    blob, _ = blobs["gears"]
    assert run(blob, "--random-inputs", "--output-dir", str(tmp_path / "out")) == 2
    assert "gears 0, 1 all take the given inputs (say which with --gear N)" in \
        capfd.readouterr().err
    assert listing(tmp_path) == []


def test_loop_reports_each_host_time_and_the_modelled_device_time(blobs, tmp_path, capfd):
    blob, _ = blobs["one"]
    assert run(blob, "--inputs", npz(tmp_path, x=X23), "--loop", "3", "--json",
               "--output-dir", str(tmp_path / "out")) == 0
    captured = capfd.readouterr()
    summary = json.loads(captured.out)
    schema_validator("run").validate(summary)
    assert summary["loop"] == 3 and len(summary["host"]["seconds"]) == 3
    host = summary["host"]
    assert 0 < host["min_ms"] <= host["median_ms"] <= host["max_ms"]
    device = summary["device"]
    # one MatMul left unfused: a launch and its bytes at the chip's bandwidth, an estimate
    assert device["estimate"] is True and device["kernels"] == [] and device["unfused_ops"] == 1
    assert device["total_us"] == pytest.approx(device["unfused_us"]) and \
        device["total_us"] > device["launch_us"] > 0
    assert summary["outputs"] == [{"name": "y0", "file": str(tmp_path / "out" / "y0.npy"),
                                   "dtype": "float32", "shape": [2, 4]}]
    assert captured.err.count("pypto-offline: run ") == 3  # progress: the first runs each
    assert not schema_validator("run").is_valid({**summary, "loop": 0})  # the schema checks


def test_an_output_name_that_is_no_safe_file_name_is_written_encoded(blobs, tmp_path, capfd):
    blob, original = blobs["slash"]
    out = tmp_path / "out"
    assert run(blob, "--inputs", npz(tmp_path, x=X23), "--output-dir", str(out), "--json") == 0
    summary = json.loads(capfd.readouterr().out)
    [output] = summary["outputs"]
    assert output["name"] == "../y/a\x1bb"
    assert Path(output["file"]).parent == out and listing(tmp_path) == \
        ["in.npz", "out", "out/%2E.%2Fy%2Fa%1Bb.npy"]
    [expected] = onnxruntime_outputs(original, {"x": X23})
    np.testing.assert_allclose(np.load(output["file"]), expected, rtol=1e-5)


@pytest.mark.parametrize("name,file", [
    ("y", "y.npy"), ("..", "%2E..npy"), (".", "%2E.npy"), ("a/b", "a%2Fb.npy"),
    ("%2F", "%252F.npy"), ("", "%00.npy"), ("\n", "%0A.npy")])
def test_output_file_names_are_safe_and_distinct(name, file):
    assert output_file_name(name) == file
    long = output_file_name("x" * 300)
    assert len(long) <= 210 and long != output_file_name("x" * 301)


@pytest.mark.pypto
def test_run_of_the_bundled_example_equals_onnxruntime_and_times_its_kernel(example_cache,
                                                                           tmp_path, capfd):
    """The example's one compiled kernel: the modelled time is its PyPTO cost-model time, a
    launch, and the unfused Conv's bandwidth estimate."""
    from tests.malformed import EXAMPLE

    blob = tmp_path / "example.ptom"  # conftest's build, alone in a folder of its own
    blob.write_bytes((example_cache.parent / "example.ptom").read_bytes())
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)
    assert run(blob, "--inputs", npz(tmp_path, x=x), "--loop", "2", "--json") == 0
    summary = json.loads(capfd.readouterr().out)
    schema_validator("run").validate(summary)
    [expected] = onnxruntime_outputs(EXAMPLE.read_bytes(), {"x": x})
    np.testing.assert_allclose(np.load(summary["outputs"][0]["file"]), expected, rtol=1e-5,
                               atol=1e-5)
    device = summary["device"]
    [kernel] = device["kernels"]
    assert kernel["basis"] == "pypto cost model" and kernel["kernel_us"] > 0
    assert kernel["total_us"] == pytest.approx(kernel["kernel_us"] + device["launch_us"])
    assert device["total_us"] == pytest.approx(kernel["total_us"] + device["unfused_us"],
                                               abs=1e-2)
    assert device["unfused_ops"] >= 1 and device["unfused_us"] > device["launch_us"]
    assert [k["id"] for k in summary["kernels"]] == [kernel["id"]]
