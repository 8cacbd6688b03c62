"""The command line on the bundled example, and the ways a model can be handed to the importer."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from pypto_offline import ModelError, cli, import_model
from pypto_offline.runtime import run_model
from tests.malformed import EXAMPLE



def test_symbolic_inputs_are_a_usage_error(capfd, tmp_path):
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", "-o", str(tmp_path / "b.ptom")]) == 2
    err = capfd.readouterr().err
    assert "input 'x' has symbolic dims ['batch']: give --dim batch=N or --input-shape x=" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["x", "x=1,a,3", "=1,2"])
def test_malformed_shape_option_is_a_usage_error(bad, capfd):
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", "--input-shape", bad]) == 2
    assert "--input-shape" in capfd.readouterr().err


def test_unknown_option_is_a_usage_error(capfd):
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", "--frobnicate"]) == 2
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--frobnicate" in err


def test_unknown_target_is_a_usage_error(capfd):
    assert cli.main([str(EXAMPLE), "--target", "kirin99"]) == 2
    assert "kirin9050" in capfd.readouterr().err


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
