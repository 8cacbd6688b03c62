"""``--inputs`` as the blob takes them (issue 56; issue 50 row 6): each array exactly in the
dtype of the blob's own input, as onnxruntime requires, and of a shape the blob (one of its
gears) takes. A cast, or an array no gear uses, would check something other than what the user
gave and still say "passed" (docs/outputs.md, "Real inputs"). The models are one MatMul, which
builds without a PyPTO kernel: the fast tier."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from pypto_offline import api, cli
from pypto_offline.errors import UsageError
from tests.onnx_builders import one_node

TARGET = ["--target", "kirin9050", "--no-report", "--quiet"]


def matmul(dtype, rows="batch") -> onnx.ModelProto:
    """x[rows, 3] @ w[3, 4] in ``dtype``: a contraction, no memory-bound op to compile."""
    return one_node("MatMul", [rows, 3], opset=17,
                    x_dtype=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                    params={"w": np.arange(12).astype(dtype).reshape(3, 4)})


def built(folder: Path, name: str, model: onnx.ModelProto, *options: str) -> Path:
    onnx.save(model, folder / f"{name}.onnx")
    out = folder / f"{name}.ptom"
    assert cli.main([str(folder / f"{name}.onnx"), *TARGET, "-o", str(out), *options]) == 0
    return out


@pytest.fixture(scope="module")
def blobs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("given-inputs")
    return {"float32": built(folder, "float32", matmul(np.float32), "--input-shape", "x=2,3"),
            "int64": built(folder, "int64", matmul(np.int64), "--input-shape", "x=2,3"),
            "gears": built(folder, "gears", matmul(np.float32), "--dim", "batch=1,4")}


def npz(folder: Path, **arrays) -> str:
    path = folder / "given.npz"
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("blob_dtype,given", [
    ("float32", np.float16), ("float32", np.float64), ("int64", np.int32)])
def test_verify_and_run_refuse_inputs_of_another_dtype_than_the_blob_s(blobs, tmp_path, capfd,
                                                                         blob_dtype, given):
    """Issue 56: a float16 array for a float32 input was cast and verified, exit 0."""
    path = blobs[blob_dtype]
    before = path.read_bytes()
    assert cli.main(["verify", str(path), "--inputs",
                     npz(tmp_path, x=np.ones((2, 3), given))]) == 2
    err = capfd.readouterr().err
    assert f"input 'x': --inputs gives dtype {np.dtype(given)}, the model expects " \
           f"{blob_dtype}" in err and "Traceback" not in err
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == \
        ["given.npz"]
    with pytest.raises(UsageError, match=f"gives dtype {np.dtype(given)}"):
        api.load(path).run({"x": np.ones((2, 3), given)})
    assert cli.main(["verify", str(path), "--inputs",
                     npz(tmp_path, x=np.ones((2, 3), blob_dtype))]) == 0


def test_a_build_refuses_inputs_of_another_dtype_and_writes_nothing(tmp_path, capfd):
    onnx.save(matmul(np.int64), tmp_path / "m.onnx")
    assert cli.main([str(tmp_path / "m.onnx"), *TARGET, "--input-shape", "x=2,3", "--inputs",
                     npz(tmp_path, x=np.ones((2, 3), np.int32))]) == 2
    assert "gives dtype int32, the model expects int64" in capfd.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given.npz", "m.onnx"]


def test_inputs_of_a_shape_no_gear_takes_are_refused_by_the_build_and_by_verify(blobs, tmp_path,
                                                                               capfd):
    """Issue 50 row 6: an array of a third shape served no gear and was left unused, exit 0."""
    third = npz(tmp_path, x=np.ones((2, 3), np.float32))
    named = "input 'x': --inputs gives shape [2, 3], which no gear takes " \
            "(gear 0: x=1,3 | gear 1: x=4,3)"
    assert cli.main(["verify", str(blobs["gears"]), "--inputs", third]) == 2
    assert named in capfd.readouterr().err
    onnx.save(matmul(np.float32), tmp_path / "m.onnx")
    assert cli.main([str(tmp_path / "m.onnx"), *TARGET, "--dim", "batch=1,4",
                     "--inputs", third]) == 2
    assert named in capfd.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given.npz", "m.onnx"]
    # an array of a gear's shape serves that gear; the other's inputs are generated
    assert cli.main(["verify", str(blobs["gears"]), "--inputs",
                     npz(tmp_path, x=np.ones((4, 3), np.float32))]) == 0
    model = api.load(blobs["gears"])
    assert model.run({"x": np.ones((4, 3), np.float32)})["y0"].tolist() == [[12, 15, 18, 21]] * 4
    with pytest.raises(UsageError, match="gives dtype float16, the model expects float32"):
        model.run({"x": np.ones((4, 3), np.float16)})


def test_a_blob_taking_fp16_takes_fp16_inputs_and_only_its_check_casts_them(tmp_path, capfd):
    """--input_fp16_nodes: the build, verify and run take x in float16, the blob's own dtype;
    the check against the original model casts them to its float32, and float32 is refused."""
    onnx.save(matmul(np.float32), tmp_path / "m.onnx")
    half = ["--precision_mode", "force_fp16", "--input_fp16_nodes", "x", "--output_type", "FP16"]
    build = [str(tmp_path / "m.onnx"), *TARGET, "--input-shape", "x=2,3", *half]
    assert cli.main([*build, "--inputs", npz(tmp_path, x=np.ones((2, 3), np.float32))]) == 2
    assert "gives dtype float32, the model expects float16 (--input_fp16_nodes)" in \
        capfd.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given.npz", "m.onnx"]
    fp16 = npz(tmp_path, x=np.full((2, 3), 0.5, np.float16))
    assert cli.main([*build, "--inputs", fp16, "-o", str(tmp_path / "m.ptom")]) == 0
    assert cli.main(["verify", str(tmp_path / "m.ptom"), "--inputs", fp16]) == 0
    assert cli.main(["verify", str(tmp_path / "m.ptom"), "--inputs",
                     npz(tmp_path, x=np.ones((2, 3), np.float32))]) == 2
    outputs = api.load(tmp_path / "m.ptom").run({"x": np.full((2, 3), 0.5, np.float16)})
    assert np.array_equal(outputs["y0"], np.full((2, 3), 0.5) @ np.arange(12).reshape(3, 4))
