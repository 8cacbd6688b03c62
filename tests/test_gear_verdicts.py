"""A build of gears is as strict as the strictest of its gears built alone (issue 50 row 2,
docs/gears.md, "How a gear's verdict reaches the build's"): a later gear's failed check or
fallback fails the build, the summary lists every gear's kernels, and ``inspect --gear N``
shows one gear alone."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.json_schema import schema_validator
from tests.onnx_builders import GraphBuilder
from pypto_offline import cli

pytestmark = pytest.mark.pypto


def tile_by_width() -> onnx.ModelProto:
    """out = Relu(x[1, 8]) tiled by y's width m, times 2: the Tile's repeats come from the
    shape of y, so a gear of m = 200 tiles past PyPTO's 128 concat inputs (its region cannot be
    expressed and falls back) where a gear of m = 2 compiles."""
    nodes = [helper.make_node("Shape", ["y"], ["y_shape"]),
             helper.make_node("Slice", ["y_shape", "one", "two"], ["m"]),
             helper.make_node("Concat", ["one", "m"], ["repeats"], axis=0),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Tile", ["r", "repeats"], ["t"]),
             helper.make_node("Mul", ["t", "k"], ["out"])]
    graph = helper.make_graph(
        nodes, "tile_by_width",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "m"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, "w"])],
        [helper.make_tensor("one", TensorProto.INT64, [1], [1]),
         helper.make_tensor("two", TensorProto.INT64, [1], [2]),
         helper.make_tensor("k", TensorProto.FLOAT, [], [2.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def sum_of_n() -> onnx.ModelProto:
    """ReduceSum(|x| * 40) over x[1, n], times 0.001: the verification's inputs are uniform in
    [-1, 1], so the sum is about 20 n: 320 for n = 16, past fp16's 65,504 for n = 4096 (an
    infinity in fp16, where the model gives about 82)."""
    b = GraphBuilder()
    x = b.input("x", [1, "n"])
    scaled = b.op("Mul", [b.op("Abs", [x]), b.const(np.float32(40.0))])
    total = b.op("ReduceSum", [scaled, b.const(np.array([1], np.int64))])
    return b.model(b.op("Mul", [total, b.const(np.float32(0.001))]))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("gear-verdicts")


def build(folder, model: onnx.ModelProto, name: str, *options: str) -> tuple[int, object]:
    path = folder / f"{name}.onnx"
    onnx.save(model, path)
    code = cli.main([str(path), "--target", "kirin9050", "-o", str(folder / f"{name}.ptom"),
                     "--no-report", "--cache-dir", str(folder / "cache"), "--json", *options])
    return code, folder / f"{name}.ptom"


def test_a_fallback_in_a_later_gear_fails_the_build_under_fail_on_fallback(folder, capsys):
    code, blob = build(folder, tile_by_width(), "tiles", "--dim", "m=2,200",
                       "--fail-on-fallback")
    out, err = capsys.readouterr()
    assert code == 1, err
    summary = json.loads(out)
    schema_validator("build").validate(summary)
    fell_back = [(k["gear"], k["id"]) for k in summary["kernels"] if k["status"] == "fell_back"]
    assert fell_back and {gear for gear, _ in fell_back} == {1}
    assert summary["pypto"]["fell_back"] == len(fell_back)
    assert [g["fell_back"] for g in summary["gears"]] == [0, len(fell_back)]
    assert "pypto-offline: fell back: gear 1: region_0 " in err
    assert "Tile by 200 exceeds concat's 128 inputs" in err

    # inspect lists every gear's kernels; --gear N shows that gear alone
    assert cli.main(["inspect", str(blob), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {k["gear"] for k in listed["kernels"]} == {0, 1}
    assert cli.main(["inspect", str(blob), "--gear", "1", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    schema_validator("inspect").validate(alone)
    assert alone["gear"] == 1 and [g["index"] for g in alone["gears"]] == [1]
    assert {k["gear"] for k in alone["kernels"]} == {1}
    assert alone["kernels_after"] == summary["gears"][1]["kernels_after"]
    assert alone["pypto"]["fell_back"] == len(fell_back)
    assert cli.main(["inspect", str(blob), "--gear", "1"]) == 0
    text = capsys.readouterr().out
    assert "gear 1 of 2: x=1,8; y=1,200" in text and "gear 1: region_0: " in text
    assert cli.main(["inspect", str(blob), "--gear", "2"]) == 2
    assert "--gear 2: the blob has 2 gear(s)" in capsys.readouterr().err


def test_a_later_gear_s_fp16_overflow_fails_the_build_and_verify(folder, capsys):
    code, blob = build(folder, sum_of_n(), "sums", "--dim", "n=16,4096",
                       "--precision_mode", "force_fp16")
    out, err = capsys.readouterr()
    assert code == 1, err
    summary = json.loads(out)
    check = summary["verification"]
    assert check["status"] == "failed" and check["gear"] == 1 and check["failed_gears"] == [1]
    assert [g["verification"]["status"] for g in summary["gears"]] == ["passed", "failed"]

    # verify against the original model (the blob's own graph is the fp16 one): every gear
    # checked, the worst one's verdict; --gear N: that gear's
    model = ["--onnx", str(folder / "sums.onnx")]
    assert cli.main(["verify", str(blob), *model]) == 1
    text = capsys.readouterr().out
    assert "verification: failed (gear 1 failed; gear 1's check below)" in text
    assert "kernels beyond: region_" in text
    assert cli.main(["verify", str(blob), *model, "--gear", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verification"]["status"] == "passed"
    assert cli.main(["verify", str(blob), *model, "--gear", "1", "--json"]) == 1
    alone = json.loads(capsys.readouterr().out)
    assert alone["verification"]["status"] == "failed" and alone["gears"][0]["index"] == 1
