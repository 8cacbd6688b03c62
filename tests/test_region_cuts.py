"""Split, never drop (issue 37): a planned region that cannot ship is cut in two convex parts at
the cut that moves the fewest bytes, and each part is planned again, down to single ops
(fusion/split.py, docs/regions.md)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import pypto_offline
from pypto_offline import cli
from pypto_offline.fusion import with_parts, without_regions
from pypto_offline.fusion.records import CANNOT_EXPRESS
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.json_schema import schema_validator
from tests.onnx_builders import GraphBuilder
from tests.test_fusion_properties import assert_regions_convex, dags

KIRIN = TARGETS["kirin9050"]


def _op_types(graph, node_ids) -> list[str]:
    nodes = {n.outputs[0]: n for n in graph.nodes}
    return [nodes[nid].op_type for nid in node_ids]


def _chain(*op_types, shape=(1, 4, 16, 32)):
    b = GraphBuilder()
    y = b.input("x", list(shape))
    for op_type in op_types:
        y = b.op(op_type, [y])
    return b.model(y)


def test_a_chain_of_equal_tensors_is_cut_in_the_middle():
    graph, plan = fuse(_chain("Relu", "Sigmoid", "Neg", "Tanh", "Abs"))
    (region,) = plan.regions
    planned, parts = with_parts(plan, graph, KIRIN, {region.id: "no tile fits"})
    (cut,) = planned.cuts
    assert (cut.region, cut.reason) == (region.id, "no tile fits")
    assert [_op_types(graph, part) for part in cut.parts] == [["Relu", "Sigmoid"],
                                                              ["Neg", "Tanh", "Abs"]]
    assert cut.tensors == (cut.parts[0][-1],) and cut.bytes_moved == 2 * 4 * 16 * 32 * 4
    assert [p.id for p in parts] == ["region_0_0", "region_0_1"]
    assert planned.regions == plan.regions + parts


def test_the_cut_moves_the_fewest_bytes_even_off_the_middle():
    """A Slice that keeps an eighth of its input: the cut after it hands over the eighth."""
    b = GraphBuilder()
    y = b.input("x", [1, 4, 16, 64])
    for op_type in ("Relu", "Neg", "Abs", "Exp"):
        y = b.op(op_type, [y])
    y = b.op("Slice", [y], starts=[0], ends=[8], axes=[3])
    graph, plan = fuse(b.model(b.op("Tanh", [b.op("Sigmoid", [y])])))
    (region,) = plan.regions
    planned, _ = with_parts(plan, graph, KIRIN, {region.id: "no tile fits"})
    (cut,) = planned.cuts
    assert [_op_types(graph, part) for part in cut.parts] == [
        ["Relu", "Neg", "Abs", "Exp", "Slice"], ["Sigmoid", "Tanh"]]
    assert cut.bytes_moved == 2 * 4 * 16 * 8 * 4


def test_a_region_of_two_ops_is_not_cut():
    """Its parts would be its ops alone: the same as falling back whole."""
    graph, plan = fuse(_chain("Relu", "Sigmoid"))
    planned, parts = with_parts(plan, graph, KIRIN, {plan.regions[0].id: "timed out"})
    assert planned == plan and parts == ()


def test_a_part_of_one_op_ships_alone_with_the_reason_of_its_region():
    graph, plan = fuse(_chain("Relu", "Sigmoid", "Neg"))
    region = plan.regions[0]
    planned, parts = with_parts(plan, graph, KIRIN, {region.id: "compile failed"})
    (part,) = parts
    assert _op_types(graph, part.nodes) == ["Sigmoid", "Neg"]
    shipped = without_regions(planned, graph, KIRIN,
                              {region.id: (CANNOT_EXPRESS, "compile failed")})
    assert [r.id for r in shipped.regions] == [part.id]
    (alone,) = shipped.unfused
    assert (alone.op_type, alone.reason) == ("Relu", "compile failed")
    assert shipped.cuts == planned.cuts and shipped.totals.kernels_after == 2
    assert_compiled_matches(graph, shipped)


def test_a_matmul_region_cut_keeps_the_matmul_its_parts_root():
    b = GraphBuilder()
    x = b.input("x", [64, 128])
    y = b.op("MatMul", [x, b.const(np.ones((128, 64), np.float32) / 128)])
    y = b.op("Relu", [b.op("Add", [y, b.const(np.ones(64, np.float32))])])
    y = b.op("Sigmoid", [y])
    graph, plan = fuse(b.model(y))
    (region,) = plan.regions
    planned, parts = with_parts(plan, graph, KIRIN, {region.id: "compile failed"})
    (cut,) = planned.cuts
    assert _op_types(graph, cut.parts[0])[0] == "MatMul"
    assert all(len(p.nodes) >= 2 for p in parts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_regions_cut_again_and_again_stay_convex_and_compute_the_same(model):
    """Every region of three ops or more cut, and its parts, until none is left: what ships is
    convex and the compiled graph computes what the model does."""
    graph, plan = fuse(model)
    failed: dict[str, tuple[str, str]] = {}
    while True:
        cannot = {r.id: "test" for r in plan.regions
                  if r.id not in failed and len(r.nodes) >= 3}
        if not cannot:
            break
        failed.update({region_id: (CANNOT_EXPRESS, why) for region_id, why in cannot.items()})
        plan, _ = with_parts(plan, graph, KIRIN, cannot)
    shipped = without_regions(plan, graph, KIRIN, failed)
    assert all(len(r.nodes) <= 2 for r in shipped.regions)
    assert_regions_convex(graph, shipped)
    assert_compiled_matches(graph, shipped)


def tile_beyond_concat_model(path: Path) -> Path:
    """Relu, Sigmoid, a Tile by 150 (a concat of 150 inputs: PyPTO 0.2.0 takes 128) and an Add
    and Tanh after it: one region whose kernel the generator cannot write."""
    b = GraphBuilder()
    x, z = b.input("x", [1, 2, 8, 32]), b.input("z", [1, 300, 8, 32])
    y = b.op("Sigmoid", [b.op("Relu", [x])])
    y = b.op("Tile", [y, b.const(np.array([1, 150, 1, 1], dtype=np.int64))])
    path.write_bytes(b.model(b.op("Tanh", [b.op("Add", [y, z])])).SerializeToString())
    return path


@pytest.mark.pypto
def test_a_region_that_cannot_ship_is_cut_and_its_parts_ship(tmp_path, capfd):
    """5 ops, one region that falls back: cut after Sigmoid (the 2 KiB tensor before the Tile),
    then the Tile from the Add+Tanh; 3 kernels where 5 shipped before, verified."""
    out = tmp_path / "tile.ptom"
    assert cli.main([str(tile_beyond_concat_model(tmp_path / "tile.onnx")), "--target",
                     "kirin9050", "-o", str(out), "--json", "--cache-dir",
                     str(tmp_path / "cache")]) == 0
    summary = json.loads(capfd.readouterr().out)
    assert not [e.message for e in schema_validator("build").iter_errors(summary)]
    assert (summary["kernels_before"], summary["kernels_after"]) == (5, 3)
    assert summary["verification"]["status"] == "passed"
    kernels = {k["id"]: k for k in summary["kernels"]}
    assert list(kernels) == ["region_0", "region_0_0", "region_0_1", "region_0_1_1"]
    assert [kernels[k]["status"] for k in kernels] == ["fell_back", "compiled", "fell_back",
                                                        "compiled"]
    first, then = kernels["region_0"]["cut"], kernels["region_0_1"]["cut"]
    assert "Tile by 150" in kernels["region_0"]["fallback_reason"]
    assert (len(first["parts"][0]), len(first["parts"][1])) == (2, 3)
    assert first["bytes_moved"] == 2 * 2 * 8 * 32 * 4
    assert (len(then["parts"][0]), len(then["parts"][1])) == (1, 2)
    assert kernels["region_0_0"]["cut"] is None
    (tile,) = pypto_offline.load(out).message.unfused
    assert tile.op_type == "Tile" and "Tile by 150" in tile.reason
    report = Path(summary["report"]).read_text()
    assert "fell back: cannot express, cut in two" in report and "Cut in two" in report


def eleven_activations():
    """Issue 37's chain of eleven ONNX activations on 1x8x32x64: planned as one region, it found
    no tile within kirin9050's UB (the smallest compiled candidate's leaves needed 186,400 B)
    and shipped as 11 single-op kernels."""
    b = GraphBuilder()
    y = b.input("x", [1, 8, 32, 64])
    for op_type in ("HardSwish", "HardSigmoid", "Erf"):
        y = b.op(op_type, [y])
    y = b.op("Pow", [y, b.const(np.float32(2.0))])
    for op_type in ("Softplus", "Mish", "Elu", "LeakyRelu", "Tanh"):
        y = b.op(op_type, [y])
    return b.model(b.op("Floor", [b.op("Mul", [y, y])]))


@pytest.mark.pypto
def test_eleven_activations_ship_in_at_most_three_kernels_none_alone_for_want_of_ub(tmp_path):
    compiled = pypto_offline.compile(eleven_activations(), "kirin9050", cache_dir=tmp_path,
                                     verify=True)
    message = compiled.message
    assert message.totals.kernels_before == 11 and message.totals.kernels_after <= 3
    assert message.verification.status == "passed"
    assert not [u for u in message.unfused if u.category == "no tile fits"], message.unfused
