"""The command line on the bundled example, and the ways a model can be handed to the importer."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from pypto_offline import ModelError, cli, import_model
from pypto_offline.runtime import run_model
from tests.malformed import EXAMPLE

EXAMPLE_SHAPE = ["--input-shape", "x=1,3,64,64"]


def test_example_compiles_from_a_real_process_and_prints_json():
    done = subprocess.run([sys.executable, "-m", "pypto_offline", str(EXAMPLE), *EXAMPLE_SHAPE,
                           "--target", "kirin9050", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    imported, fusion = summary["import"], summary["fusion"]
    assert imported["inputs"] == {"x": [1, 3, 64, 64]}
    assert imported["outputs"] == {"y": [1, 1024, 128]}
    assert imported["symbolic"] == []
    # Shape -> Gather -> Concat folded into the Reshape's constant target
    assert imported["nodes_in_source"] == 10 and imported["nodes_after_folding"] == 7
    assert imported["ops"] == {"Add": 1, "Conv": 1, "Pad": 1, "Reshape": 1, "Slice": 1,
                               "Tile": 1, "Transpose": 1}
    # Conv stays a boundary; Slice → Pad → Tile → Transpose → Reshape → Add is one kernel
    assert (fusion["kernels_before"], fusion["kernels_after"], fusion["fused_kernels"]) == (6, 2, 1)
    assert fusion["ops_fused"] == 6 and fusion["gm_bytes_after"] < fusion["gm_bytes_before"]
    assert summary["verification"]["status"] == "passed"


@pytest.mark.parametrize("target", ["kirin90", "kirin9030", "kirin9050", "ascend910b",
                                    "ascend950"])
def test_example_compiles_for_every_target(target, capfd):
    assert cli.main([str(EXAMPLE), *EXAMPLE_SHAPE, "--target", target]) == 0
    assert "verification: passed" in capfd.readouterr().out


def test_unknown_target_is_a_usage_error(capfd):
    assert cli.main([str(EXAMPLE), "--target", "kirin99"]) == 2
    assert "kirin9050" in capfd.readouterr().err


def test_human_summary_warns_about_symbolic_inputs(capfd):
    assert cli.main([str(EXAMPLE)]) == 0
    out, err = capfd.readouterr()
    assert "tensors stay symbolic" in out and "--input-shape" in out
    assert err == ""


@pytest.mark.parametrize("bad", ["x", "x=1,a,3", "=1,2"])
def test_malformed_shape_option_is_a_usage_error(bad, capfd):
    assert cli.main([str(EXAMPLE), "--input-shape", bad]) == 2
    assert "--input-shape" in capfd.readouterr().err


def test_unknown_option_is_a_usage_error(capfd):
    assert cli.main([str(EXAMPLE), "--frobnicate"]) == 2
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--frobnicate" in err


def test_path_bytes_and_modelproto_give_the_same_graph():
    shapes = {"x": [1, 3, 64, 64]}
    from_path = import_model(EXAMPLE, shapes)
    from_bytes = import_model(EXAMPLE.read_bytes(), shapes)
    from_proto = import_model(onnx.load(EXAMPLE), shapes)
    blobs = {g.model.SerializeToString() for g in (from_path, from_bytes, from_proto)}
    assert len(blobs) == 1


def test_external_data_inside_the_folder_loads(tmp_path):
    model = onnx.load(EXAMPLE)
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(model, folder / "m.onnx", save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    graph = import_model(folder / "m.onnx", {"x": [1, 3, 64, 64]})
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    expected = run_model(onnx.load(EXAMPLE), {"x": x})["y"]
    np.testing.assert_allclose(run_model(graph.model, {"x": x})["y"], expected, rtol=0, atol=1e-6)


def test_missing_external_data_file_is_named(tmp_path):
    onnx.save(onnx.load(EXAMPLE), tmp_path / "m.onnx", save_as_external_data=True,
              location="w.bin", size_threshold=0)
    (tmp_path / "w.bin").unlink()
    with pytest.raises(ModelError, match="'w.bin' is missing"):
        import_model(tmp_path / "m.onnx")


def test_import_is_deterministic():
    first = import_model(EXAMPLE, {"x": [1, 3, 64, 64]}).model.SerializeToString()
    second = import_model(EXAMPLE, {"x": [1, 3, 64, 64]}).model.SerializeToString()
    assert first == second
