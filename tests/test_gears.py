"""Gears (issue 38, docs/gears.md): the input sizes one blob is compiled for, ATC's spellings
and ours, one blob with a kernel identical across gears stored once, the run-time contract."""
from __future__ import annotations

import json
import time

import numpy as np
import onnx
import pytest

from tests.json_schema import schema_validator
from tests.onnx_builders import GraphBuilder
from pypto_offline import api, cli
from pypto_offline.errors import ModelError, UsageError
from pypto_offline.importer.gears import MAX_GEARS, GearRequest, gear_values, plan
from pypto_offline.offline_compiler import blob, gears, ptom_pb2
from pypto_offline.progress import Progress


def two_branches() -> onnx.ModelProto:
    """x[batch, 64] through Add, Relu, Mul, and z[1, 64] through Sub, Sigmoid, Mul: the second
    kernel does not change with the batch, so the gears share it."""
    b = GraphBuilder()
    x, z = b.input("x", ["batch", 64]), b.input("z", [1, 64])
    y = b.op("Mul", [b.op("Relu", [b.op("Add", [x, b.const(np.float32(1.0))])]),
                     b.const(np.float32(2.0))])
    w = b.op("Mul", [b.op("Sigmoid", [b.op("Sub", [z, b.const(np.float32(1.0))])]),
                     b.const(np.float32(2.0))])
    return b.model(y, w)


def atc(option: str, text: str, **shapes) -> GearRequest:
    from pypto_offline.importer.gears import parse_atc_gears

    return GearRequest(shapes, atc=(option, parse_atc_gears(option, text)))


# -- the options ---------------------------------------------------------------------------

def test_atc_s_three_spellings_give_each_gear_s_values():
    batch = gear_values(atc("dynamic_batch_size", "1,2,4", x=[-1, 3], y=[-1]))
    assert batch == [{"x": [1], "y": [1]}, {"x": [2], "y": [2]}, {"x": [4], "y": [4]}]
    image = gear_values(atc("dynamic_image_size", "320,320;640,480", img=[1, 3, -1, -1]))
    assert image == [{"img": [320, 320]}, {"img": [640, 480]}]
    dims = gear_values(atc("dynamic_dims", "20,20,1;40,40,2", a=[1, -1, -1], b=[-1]))
    assert dims == [{"a": [20, 20], "b": [1]}, {"a": [40, 40], "b": [2]}]


def test_dim_lists_are_taken_together_or_as_every_combination():
    together = GearRequest(dims={"past": (16, 32), "seq": (1, 4), "batch": (1,)})
    assert gear_values(together) == [{"past": 16, "seq": 1}, {"past": 32, "seq": 4}]
    product = GearRequest(dims={"past": (16, 32), "seq": (1, 4)}, product=True)
    assert gear_values(product) == [{"past": 16, "seq": 1}, {"past": 16, "seq": 4},
                                    {"past": 32, "seq": 1}, {"past": 32, "seq": 4}]
    assert gear_values(GearRequest(dims={"batch": (1,)})) == [{}]  # one value: no gears


@pytest.mark.parametrize("request_,message", [
    (GearRequest(dims={"past": tuple(range(1, MAX_GEARS + 2))}), "101 gears: at most 100"),
    (GearRequest(dims={"a": (1, 2), "b": (1, 2, 3)}), "different counts"),
    (GearRequest(dims={"a": (1, 2)}, atc=("dynamic_batch_size", ((1,), (2,))),
                 shapes={"x": [-1]}), "both ATC's gears and --dim"),
    (GearRequest(shapes={"x": [-1, 3]}), "a -1 dimension, the mark of a gear, and no gears"),
    (GearRequest(shapes={"x": [1, 3]}, atc=("dynamic_batch_size", ((1,), (2,)))),
     "no -1 dimension"),
    (GearRequest(shapes={"x": [1, -1]}, atc=("dynamic_image_size", ((4, 4),))),
     "has 1 -1 dimension"),
    (GearRequest(shapes={"x": [-1, -1]}, atc=("dynamic_dims", ((4,),))), "has 1 value(s)"),
    (GearRequest(dims={"a": (1, 2, 1)}), "given twice"),
    (GearRequest(dims={"a": (1,)}, product=True), "--gear-product takes"),
])
def test_gears_that_cannot_be_built_are_refused(request_, message):
    with pytest.raises(UsageError) as error:
        gear_values(request_)
    assert message in str(error.value)


def test_a_gear_that_contradicts_a_static_dimension_is_refused_before_any_work():
    request = atc("dynamic_dims", "1,64;2,32", x=[-1, 64], z=[1, -1])
    with pytest.raises(UsageError, match="dimension 1 is static, 64"):
        plan(two_branches(), request, "model")


def test_a_dim_whose_gears_name_no_dimension_is_refused():
    """Fixed as an ordinary build's shapes are: a typo is not two identical gears."""
    with pytest.raises(UsageError, match="--dim 'batc' names no symbolic dimension"):
        plan(two_branches(), GearRequest(dims={"batc": (1, 4)}), "model")


def test_one_gear_is_the_build_its_shapes_make_without_gears():
    one = plan(two_branches(), atc("dynamic_batch_size", "4", x=[-1, 64]), "model")
    assert (one.input_shapes, one.dims, one.gears) == ({"x": [4, 64]}, {}, [])
    named = plan(two_branches(), GearRequest(dims={"batch": (4,)}), "model")
    assert (named.input_shapes, named.dims, named.gears) == ({}, {"batch": 4}, [])


def test_both_spellings_give_every_input_s_full_shape_per_gear():
    ours = plan(two_branches(), GearRequest(dims={"batch": (1, 4)}), "model")
    theirs = plan(two_branches(), atc("dynamic_batch_size", "1,4", x=[-1, 64]), "model")
    assert ours.gears == theirs.gears == [{"x": [1, 64], "z": [1, 64]},
                                          {"x": [4, 64], "z": [1, 64]}]


def test_an_exporter_s_expression_of_dimensions_takes_the_named_values():
    """torch.export names a KV-cache decoder's mask ``past + 4``: ``--dim past=16`` fixes it
    too (20), and the error for a dimension left open names ``past``. Only names, whole numbers
    and + - * // % are evaluated; anything else in a model's dimension name is a name."""
    from pypto_offline.importer import import_model
    from pypto_offline.importer.input_shapes import dim_size

    b = GraphBuilder()
    mask, keys = b.input("mask", [1, "past + 4"]), b.input("keys", [1, "past", 16])
    model = b.model(b.op("Relu", [mask]), b.op("Relu", [keys]))
    graph = import_model(model, dims={"past": 16})
    assert graph.tensors["mask"].shape == (1, 20) and graph.tensors["keys"].shape == (1, 16, 16)
    gear = plan(model, GearRequest(dims={"past": (16, 32)}), "model").gears[1]
    assert gear == {"mask": [1, 36], "keys": [1, 32, 16]}
    assert dim_size("2 * s0 - 1", {"s0": 3}) == 5 and dim_size("past + 4", {}) is None
    for hostile in ('__import__("os")', "9 // 0", "past ** 99", "(" * 200 + "1" + ")" * 200):
        assert dim_size(hostile, {"past": 1}) is None


def test_the_cli_refuses_more_gears_than_atc_with_exit_2(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(two_branches(), path)
    values = ",".join(str(v) for v in range(1, MAX_GEARS + 2))
    assert cli.main([str(path), "--target", "kirin9050", "--dim", f"batch={values}",
                     "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert "101 gears: at most 100 (ATC's limit)" in err and "Traceback" not in err
    assert not list(tmp_path.glob("*.ptom"))


def test_gears_the_shapes_make_identical_are_refused_with_exit_2_before_any_work(tmp_path,
                                                                                   capsys):
    """--input-shape gives x, the only input with batch, its whole shape: both gears would be
    x=3,64, a blob no reader loads (issue 50 row 3)."""
    path, out = tmp_path / "m.onnx", tmp_path / "out"
    onnx.save(two_branches(), path)
    assert cli.main([str(path), "--target", "kirin9050", "--dim", "batch=1,2", "--input-shape",
                     "x=3,64", "--output-dir", str(out), "--cache-dir",
                     str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert "gears 0 (batch=1) and 1 (batch=2) have the same shapes (x=3,64; z=1,64)" in err
    assert "--dim batch sizes only x, whose shape --input-shape gives" in err
    assert "leave x out of --input-shape" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "cache").exists()  # --output-dir removed too


def test_gears_no_input_tells_apart_are_refused():
    """past % 2 is 1 for past 1 and 3: the gears' shapes are the same whatever is given."""
    b = GraphBuilder()
    model = b.model(b.op("Relu", [b.input("x", [1, "past % 2"])]))
    with pytest.raises(UsageError, match=r"gears 0 \(past=1\) and 1 \(past=3\) have the same "
                                         r"shapes \(x=1,1\): no input's shape changes"):
        plan(model, GearRequest(dims={"past": (1, 3)}), "model")


def test_the_api_refuses_identical_or_empty_gears_before_any_work(tmp_path, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(two_branches(), path)
    monkeypatch.setattr(api, "build_together", lambda *a, **k: pytest.fail("built"))
    same = [{"x": [1, 64], "z": [1, 64]}, {"z": (1, 64), "x": (1, 64)}]
    with pytest.raises(UsageError, match=r"gears 0 and 1 have the same input shapes"):
        api.compile(path, gears=same)
    with pytest.raises(UsageError, match="gear 0 gives no input shapes"):
        api.compile(path, gears=[{}, {"x": [1, 64]}])


def symbolic(*names: str) -> onnx.ModelProto:
    b = GraphBuilder()
    return b.model(b.op("Relu", [b.input("x", list(names))]))


@pytest.mark.parametrize("names,count,message", [
    (("a", "b"), 3000, "9000000 gears (--gear-product of 3000 x 3000 values): at most 100"),
    (("a", "b", "c", "d"), 100, "100000000 gears (--gear-product of 100 x 100 x 100 x 100"),
    (("a", "b"), 3000, "--dim 'typo' names no symbolic dimension"),
])
def test_gear_product_is_counted_and_named_before_the_gears_are_made(tmp_path, capsys, names,
                                                                     count, message):
    """Counted as the product of the lists' lengths, the names checked first: refused at
    once, where making every combination first took seconds and gigabytes, or ran out of
    memory (issue 50 row 4)."""
    path = tmp_path / "m.onnx"
    onnx.save(symbolic(*names), path)
    given = ("typo", *names[1:]) if "typo" in message else names
    values = ",".join(str(v) for v in range(1, count + 1))
    dims = [option for name in given for option in ("--dim", f"{name}={values}")]
    started = time.perf_counter()
    code = cli.main([str(path), "--target", "kirin9050", *dims, "--gear-product",
                     "--cache-dir", str(tmp_path / "cache")])
    assert (code, time.perf_counter() - started < 2) == (2, True)
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# -- the blob --------------------------------------------------------------------------------

def fake_build(batch: int, shared_source: str = "shared") -> ptom_pb2.CompiledModel:
    """A build's message with what the gear table relies on: graphs taking x[batch, 64], a
    kernel that changes with the gear and one that does not."""
    message = ptom_pb2.CompiledModel()
    message.target.name = "kirin9050"
    with_weights(message, batch=batch)
    message.provenance.tool_version, message.provenance.model_sha256 = "t", "ab" * 32
    message.kernels.add(id="region_0", source=f"batch {batch}", sha256=f"{batch:064x}")
    message.kernels.add(id="region_1", source=shared_source, sha256="f" * 64)
    return message


def test_a_kernel_identical_across_gears_is_stored_once_and_read_back_whole():
    packed = gears.pack([({"x": [1, 64]}, fake_build(1)), ({"x": [4, 64]}, fake_build(4))])
    stub = packed.gears[1].build.kernels[1]
    assert stub.stored_in_gear == 0 and not stub.source and stub.sha256 == "f" * 64
    second = gears.gear_build(packed, 1)
    assert [k.source for k in second.kernels] == ["batch 4", "shared"]
    assert not any(k.HasField("stored_in_gear") for k in second.kernels)
    gears.check(packed, True, "blob", "rebuild")


def with_weights(message: ptom_pb2.CompiledModel, batch: int | None = None,
                 **weights) -> ptom_pb2.CompiledModel:
    """``message`` with both graphs holding these weights (name → array) and taking
    x[batch, 64] (by default: what they took)."""
    inputs = [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, 64])] \
        if batch else list(onnx.load_from_string(message.onnx_model).graph.input)
    graph = onnx.helper.make_graph([], "g", inputs, [], [onnx.numpy_helper.from_array(
        np.asarray(value, np.float32), name) for name, value in weights.items()])
    data = onnx.helper.make_model(graph).SerializeToString()
    message.onnx_model = message.source_onnx_model = data
    return message


def test_a_weight_the_gears_share_is_stored_once_and_read_back_whole():
    first = with_weights(fake_build(1), w=np.arange(1000), b=[1.0])
    second = with_weights(fake_build(4), w=np.arange(1000), b=[2.0])
    packed = gears.pack([({"x": [1, 64]}, first), ({"x": [4, 64]}, second)])
    stored = onnx.load_from_string(packed.gears[1].build.onnx_model).graph.initializer
    assert [(t.name, t.data_location, len(t.raw_data)) for t in stored] == \
        [("w", onnx.TensorProto.EXTERNAL, 0), ("b", onnx.TensorProto.DEFAULT, 4)]
    assert len(packed.gears[1].build.onnx_model) < len(second.onnx_model) - 3000
    whole = onnx.load_from_string(gears.gear_build(packed, 1).source_onnx_model)
    assert [onnx.numpy_helper.to_array(t).tolist() for t in whole.graph.initializer] == \
        [list(range(1000)), [2.0]]
    packed.onnx_model = with_weights(fake_build(1), v=[0.0]).onnx_model  # no "w" any more
    with pytest.raises(ModelError, match="a weight 'w' the first gear does not hold"):
        gears.check(packed, True, "blob", "rebuild")


def test_the_run_time_contract_is_an_exact_match_or_a_refusal_listing_the_gears():
    packed = gears.pack([({"x": [1, 64]}, fake_build(1)), ({"x": [4, 64]}, fake_build(4))])
    assert gears.pick(gears.shapes_of(packed), {"x": (4, 64)}) == 1
    with pytest.raises(UsageError) as error:
        gears.pick(gears.shapes_of(packed), {"x": (2, 64)})
    assert "gear 0: x=1,64 | gear 1: x=4,64" in str(error.value)


@pytest.mark.parametrize("damage,message", [
    (lambda m: setattr(m.gears[1].build.kernels[1], "stored_in_gear", 1), "does not store"),
    (lambda m: setattr(m.gears[1].build.kernels[1], "sha256", "e" * 64), "does not store"),
    (lambda m: m.gears[1].inputs[0].dims.__setitem__(0, 1), "another gear's"),
    (lambda m: m.gears[0].build.CopyFrom(fake_build(1)), "has a build of its own"),
    (lambda m: setattr(m.gears[1].build.target, "name", "ascend910b"), "not a build of its"),
    # issue 50 row 8: the row a loader picks a gear by is exactly what its graphs take
    (lambda m: m.gears[1].inputs[0].dims.__setitem__(0, 8),
     "gear 1 lists inputs x=8,64 but its onnx_model takes x=4,64"),
    (lambda m: m.gears[1].inputs[0].dims.__setitem__(0, -4), "gear 1 lists a dimension below 1"),
    (lambda m: m.gears[1].inputs[0].dims.__setitem__(0, 0), "gear 1 lists a dimension below 1"),
    (lambda m: m.gears[0].inputs.add(name="y", dims=[1]), "gear 0 lists inputs x=1,64; y=1"),
    (lambda m: setattr(m.gears[1].inputs[0], "name", "y"), "but its onnx_model takes x=4,64"),
    (lambda m: m.gears.add().CopyFrom(ptom_pb2.Gear(inputs=[ptom_pb2.InputShape(
        name="x", dims=[8, 64])], build=m.gears[1].build)), "gear 2 lists inputs x=8,64"),
    (lambda m: setattr(m.gears[1].build, "source_onnx_model", fake_build(8).onnx_model),
     "gear 1 lists inputs x=4,64 but its source_onnx_model takes x=8,64"),
    (lambda m: setattr(m.gears[1].build, "onnx_model", b"\xff"), "onnx_model does not parse"),
])
def test_a_gear_table_that_is_wrong_is_refused(damage, message):
    packed = gears.pack([({"x": [1, 64]}, fake_build(1)), ({"x": [4, 64]}, fake_build(4))])
    damage(packed)
    with pytest.raises(ModelError) as error:
        gears.check(packed, True, "blob", "rebuild")
    assert message in str(error.value)


def test_gears_are_format_version_2_and_a_blob_of_one_shape_stays_version_1():
    packed = gears.pack([({"x": [1, 64]}, fake_build(1)), ({"x": [4, 64]}, fake_build(4))])
    assert blob.format_version(packed) == 2 and blob.format_version(fake_build(1)) == 1
    with pytest.raises(ModelError, match="gears do not match its format version"):
        gears.check(packed, False, "blob", "rebuild")
    with pytest.raises(ModelError, match="gears do not match its format version"):
        gears.check(fake_build(1), True, "blob", "rebuild")


# -- built -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The model built with two gears in ATC's spelling and in ours, and with one gear and
    with its shapes given outright, on one kernel cache (the second of each pair is warm)."""
    folder = tmp_path_factory.mktemp("gears")
    path = folder / "m.onnx"
    onnx.save(two_branches(), path)
    spellings = {"dim": ["--dim", "batch=1,4"],
                 "atc": ["--input_shape", "x:-1,64", "--dynamic_batch_size", "1,4"],
                 "one_gear": ["--input_shape", "x:-1,64", "--dynamic_batch_size", "4"],
                 "static": ["--input-shape", "x=4,64"]}
    out = {}
    for name, options in spellings.items():
        blob_path = folder / f"{name}.ptom"
        code = cli.main([str(path), "--target", "kirin9050", "-o", str(blob_path), "--no-report",
                         "--cache-dir", str(folder / "cache"), "--quiet", *options])
        assert code == 0, name
        out[name] = blob_path
    return {**out, "model": path, "cache": folder / "cache"}


@pytest.mark.pypto
def test_a_two_gear_blob_verifies_each_gear_and_stores_the_shared_kernel_once(built, capsys):
    assert cli.main(["verify", str(built["dim"]), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    schema_validator("summary").validate(summary)  # schema_version 8
    assert [g["verification"]["status"] for g in summary["gears"]] == ["passed", "passed"]
    assert [g["inputs"]["x"] for g in summary["gears"]] == [[1, 64], [4, 64]]
    assert [(g["kernels_stored"], g["kernels_referenced"]) for g in summary["gears"]] == \
        [(2, 0), (1, 1)]
    assert summary["verification"]["kernel_sources"]["differing"] == []


class Said(Progress):
    def __init__(self):
        self.stages, self.totals = [], set()

    def stage(self, name):
        self.stages.append(name)

    def kernel(self, done, total, region, kernel):
        self.totals.add(total)


@pytest.mark.pypto
def test_the_gears_compile_in_one_round_each_gear_the_build_of_its_shapes_alone(built):
    """offline_compiler/rounds.py: both gears' regions in one round of the pool, and each
    gear's build byte for byte the build of its shapes without gears (warm: no compile)."""
    shapes = [{"x": [1, 64], "z": [1, 64]}, {"x": [4, 64], "z": [1, 64]}]
    said = Said()
    both = api.compile(built["model"], cache_dir=built["cache"], gears=shapes, progress=said)
    assert said.stages.count("compiling the 4 kernels of 2 builds together") == 1, said.stages
    assert said.totals == {4}  # every kernel counted in the one round
    assert "gear 1 (x=4,64; z=1,64): compiling 2 kernels with PyPTO" in said.stages
    for index, gear in enumerate(shapes):
        alone = api.compile(built["model"], input_shapes=gear, cache_dir=built["cache"])
        assert both.gear(index).to_bytes() == alone.to_bytes(), index
        assert blob.to_bytes(gears.gear_build(both.message, index)) == alone.to_bytes(), index


@pytest.mark.pypto
def test_the_runtime_runs_the_matching_gear_and_refuses_other_shapes(built):
    model = api.load(built["dim"])
    x = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)
    outputs = model.run({"x": x, "z": np.zeros((1, 64), np.float32)})
    assert np.allclose(next(iter(outputs.values())), np.maximum(x + 1, 0) * 2)
    with pytest.raises(UsageError, match=r"gear 0: x=1,64; z=1,64 \| gear 1: x=4,64; z=1,64"):
        model.run({"x": np.zeros((2, 64), np.float32), "z": np.zeros((1, 64), np.float32)})


@pytest.mark.pypto
def test_atc_s_spelling_and_ours_give_byte_identical_blobs(built):
    assert built["dim"].read_bytes() == built["atc"].read_bytes()


@pytest.mark.pypto
def test_a_single_gear_build_is_byte_identical_to_one_without_gears(built):
    assert built["one_gear"].read_bytes() == built["static"].read_bytes()
    assert blob.from_bytes(built["static"].read_bytes()).gears == []


@pytest.mark.pypto
def test_verify_checks_one_gear_when_asked_and_refuses_a_gear_it_lacks(built, capsys):
    assert cli.main(["verify", str(built["dim"]), "--gear", "1", "--quiet"]) == 0
    assert cli.main(["verify", str(built["dim"]), "--gear", "2"]) == 2
    assert "--gear 2: the blob has 2 gear(s)" in capsys.readouterr().err


def _renamed(message: ptom_pb2.CompiledModel) -> None:
    """Every build of the blob said to be for another target, its kernels still Kirin's."""
    for build in [message, *(gear.build for gear in message.gears[1:])]:
        build.target.name = "ascend910b"


@pytest.mark.pypto
@pytest.mark.parametrize("name,damage,message", [
    ("dim", lambda m: m.gears[1].inputs[0].dims.__setitem__(0, 8),
     "gear 1 lists inputs x=8,64; z=1,64 but its onnx_model takes x=4,64; z=1,64"),
    ("dim", lambda m: m.gears.add(inputs=[ptom_pb2.InputShape(name="x", dims=[8, 64]),
                                          ptom_pb2.InputShape(name="z", dims=[1, 64])],
                                  build=m.gears[1].build), "gear 2 lists inputs x=8,64"),
    ("dim", lambda m: m.gears[1].inputs[0].dims.__setitem__(0, -4),
     "gear 1 lists a dimension below 1"),
    ("dim", _renamed, "for 'ascend910b' (chip Ascend910B1) but its kernels were compiled under "
                      "KirinDev0000"),
    ("static", _renamed, "but its kernels were compiled under KirinDev0000"),
    ("static", lambda m: m.target.figures[0].__setattr__("value", '"Ascend910B1"'),
     "its target descriptor names \"Ascend910B1\""),
])
def test_a_re_signed_blob_whose_gears_or_target_lie_is_refused(built, tmp_path, capsys, name,
                                                                damage, message):
    """Issue 50 row 8: the digest is a checksum, not a signature (anyone re-signs a blob), so
    reading checks each gear's row against its graphs and the target against the chip its
    kernels were compiled under; before, each verified with exit 0 and run() ran the wrong
    graph."""
    tampered = blob.read(built[name])
    assert tampered.target.figures[0].name == "soc_version"
    damage(tampered)
    path = tmp_path / "tampered.ptom"
    path.write_bytes(blob.to_bytes(tampered))  # re-signed as an attacker would
    assert cli.main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ModelError, match="rebuild it with pypto-offline"):
        api.load(path)


@pytest.mark.pypto
def test_a_blob_of_gears_given_by_some_inputs_lists_every_input_its_graphs_take(built):
    """api.compile(gears=...) may name only the inputs that change: each gear's row is still
    every input its graph takes, so the blob it writes loads."""
    both = api.compile(built["model"], gears=[{"x": [1, 64]}, {"x": [4, 64]}], verify=False,
                       cache_dir=built["cache"])
    assert gears.shapes_of(blob.from_bytes(both.to_bytes())) == \
        [{"x": (1, 64), "z": (1, 64)}, {"x": (4, 64), "z": (1, 64)}]


@pytest.mark.browser
@pytest.mark.pypto
def test_the_report_shows_each_gear_s_page_on_selection_and_the_shared_kernels(built, tmp_path):
    from bench import browser

    page = tmp_path / "gears.html"
    assert cli.main(["report", str(built["dim"]), "-o", str(page), "--quiet"]) == 0
    shared = [k.id for k in blob.read(built["dim"]).gears[1].build.kernels
              if k.HasField("stored_in_gear")]
    assert len(shared) == 1 and f"<code>{shared[0]}</code> (gear 0)" in page.read_text()
    try:
        with browser.page() as opened:
            opened.goto(page.as_uri())
            shown = "() => [...document.querySelectorAll('iframe.gear')].map(f => !f.hidden)"
            first = opened.evaluate(shown)
            opened.select_option("#gear-select", "1")
            second = opened.evaluate(shown)
            inputs = [opened.frame_locator(f"#gear-{i}").locator("#io-table .model-input .shape")
                      .first.inner_text() for i in (0, 1)]
            errors, requests = opened.errors, opened.requests
    except browser.ChromiumMissing as missing:
        pytest.fail(str(missing))
    assert (first, second) == ([True, False], [False, True])
    assert inputs == ["1×64", "4×64"] and errors == [] and requests == [page.as_uri()]
