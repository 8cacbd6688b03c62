"""Malformed models, built by the tests themselves: (case name, files to write, argv tail, words
the one-line error must contain)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "example.onnx"


def _model(nodes, inputs, outputs, initializers=(), opset=13) -> bytes:
    graph = helper.make_graph(nodes, "bad", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def truncated(folder: Path) -> Path:
    path = folder / "truncated.onnx"
    data = EXAMPLE.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def not_onnx(folder: Path) -> Path:
    path = folder / "notes.onnx"
    path.write_text("this is a text file, not a model\n" * 20)
    return path


def cycle(folder: Path) -> Path:
    path = folder / "cycle.onnx"
    path.write_bytes(_model(
        [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
         helper.make_node("Relu", ["a"], ["b"], name="second")],
        [_vi("x", [2])], [_vi("b", [2])]))
    return path


def undefined_input(folder: Path) -> Path:
    path = folder / "undefined.onnx"
    path.write_bytes(_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")],
                            [_vi("x", [2])], [_vi("y", [2])]))
    return path


def unknown_op(folder: Path) -> Path:
    path = folder / "unknown_op.onnx"
    path.write_bytes(_model([helper.make_node("FrobnicateV2", ["x"], ["y"], name="frob")],
                            [_vi("x", [2])], [_vi("y", [2])]))
    return path


def escaping_external_data(folder: Path) -> Path:
    path = folder / "model" / "escape.onnx"
    path.parent.mkdir()
    (folder / "secret.bin").write_bytes(np.zeros(4, np.float32).tobytes())
    weight = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="../secret.bin")
    path.write_bytes(_model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
                            [_vi("x", [4])], [_vi("y", [4])], [weight]))
    return path


def declared_negative_dim(folder: Path) -> Path:
    path = folder / "negative.onnx"
    path.write_bytes(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                            [_vi("x", [2, -5])], [_vi("y", [2, -5])]))
    return path


def bad_reshape(folder: Path) -> Path:
    path = folder / "reshape.onnx"
    shape = numpy_helper.from_array(np.array([5, 7], np.int64), "shape")
    path.write_bytes(_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="squash")],
                            [_vi("x", [4, 6])], [_vi("y", [5, 7])], [shape]))
    return path


def wrong_opset(folder: Path) -> Path:
    path = folder / "opset.onnx"
    path.write_bytes(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                            [_vi("x", [2])], [_vi("y", [2])], opset=99))
    return path


def no_default_opset(folder: Path) -> Path:
    path = folder / "no_opset.onnx"
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "bad",
                              [_vi("x", [2])], [_vi("y", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def missing_initializer(folder: Path) -> Path:
    """A weight whose tensor was dropped (as a careless graph surgery leaves it)."""
    path = folder / "missing_weight.onnx"
    path.write_bytes(_model([helper.make_node("MatMul", ["x", "weight"], ["y"], name="proj")],
                            [_vi("x", [2, 4])], [_vi("y", [2, 3])]))
    return path


def short_initializer(folder: Path) -> Path:
    path = folder / "short_weight.onnx"
    weight = TensorProto(name="weight", data_type=TensorProto.FLOAT, dims=[4, 3],
                         float_data=[1.0] * 5)
    path.write_bytes(_model([helper.make_node("MatMul", ["x", "weight"], ["y"], name="proj")],
                            [_vi("x", [2, 4])], [_vi("y", [2, 3])], [weight]))
    return path


def mismatched_dtypes(folder: Path) -> Path:
    path = folder / "dtypes.onnx"
    path.write_bytes(_model([helper.make_node("Add", ["x", "n"], ["y"], name="mixed")],
                            [_vi("x", [2]), _vi("n", [2], TensorProto.INT64)], [_vi("y", [2])]))
    return path


def duplicate_names(folder: Path) -> Path:
    path = folder / "duplicate.onnx"
    path.write_bytes(_model([helper.make_node("Relu", ["x"], ["y"], name="one"),
                             helper.make_node("Neg", ["x"], ["y"], name="two")],
                            [_vi("x", [2])], [_vi("y", [2])]))
    return path


def huge_declared_dim(folder: Path) -> Path:
    path = folder / "huge.onnx"
    path.write_bytes(_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                            [_vi("x", [1 << 20, 1 << 20])], [_vi("y", [1 << 20, 1 << 20])]))
    return path


def over_2gb_external_data(folder: Path) -> Path:
    """A 2.4 GB weight in an external file (sparse: no disk is used), as a large LLM export has."""
    path = folder / "big.onnx"
    elements = 600_000_000
    with open(folder / "big.bin", "wb") as data:
        data.truncate(elements * 4)
    weight = TensorProto(name="weight", data_type=TensorProto.FLOAT, dims=[elements])
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="big.bin")
    path.write_bytes(_model([helper.make_node("Add", ["x", "weight"], ["y"], name="add")],
                            [_vi("x", [elements])], [_vi("y", [elements])], [weight]))
    return path


def example(folder: Path) -> Path:
    return EXAMPLE


# name → (builder, extra argv, words the message must contain)
CASES = {
    "truncated file": (truncated, [], ["truncated.onnx", "not a readable ONNX model"]),
    "not ONNX": (not_onnx, [], ["notes.onnx", "ONNX"]),
    "cycle": (cycle, [], ["cycle", "first", "second"]),
    "undefined input": (undefined_input, [], ["adder", "'ghost'"]),
    "unknown op": (unknown_op, [], ["frob", "FrobnicateV2", "not an ONNX operator"]),
    "external data escapes": (escaping_external_data, [], ["escapes", "'w'"]),
    "negative declared dim": (declared_negative_dim, [], ["input 'x'", "-5"]),
    "negative given dim": (example, ["--input-shape", "x=1,-3,64,64"], ["'x'", "negative"]),
    "absurd given dim": (example, ["--input-shape", "x=1,3,99999999999,64"], ["'x'", "larger"]),
    "absurd element count": (example, ["--input-shape", "x=4096,3,4096,4096"], ["'x'", "elements"]),
    "reshape does not multiply out": (bad_reshape, [], ["squash", "do not multiply out"]),
    "unknown opset version": (wrong_opset, [], ["opset.onnx", "99"]),
    "no default-domain opset": (no_default_opset, [], ["no_opset.onnx", "default ONNX domain"]),
    "missing initializer": (missing_initializer, [], ["proj", "'weight'"]),
    "initializer shorter than its dims": (short_initializer, [], ["weight", "too small"]),
    "mismatched dtypes": (mismatched_dtypes, [], ["dtypes.onnx", "mixed"]),
    "duplicate tensor names": (duplicate_names, [], ["'y'", "twice"]),
    "huge declared dim": (huge_declared_dim, [], ["'x'", "elements"]),
    "over 2 GB of external data": (over_2gb_external_data, [], ["big.onnx", "2 GB"]),
}
