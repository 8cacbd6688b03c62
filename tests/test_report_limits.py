"""The report never fails after the work (issue 34): names dot cannot take are made printable
and short for it (kept whole in the page's text), a graph too large for dot in seconds is drawn
with one box per region or not at all, a layout that fails or runs out of time leaves a page
without its drawing that says why, and an odd blob (a node without outputs) still gets its page.
Nothing here compiles a kernel: the blobs are of MatMul models (no memory-bound op, no PyPTO),
the large graphs synthetic."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench import browser
from pypto_offline import cli
from pypto_offline.offline_compiler import blob, ptom_pb2
from pypto_offline.report import graph_view, render_report
from pypto_offline.report.dot import LayoutFailed, lay_out
from pypto_offline.report.graph_view import GraphFacts, dot_source, draw
from pypto_offline.report.tensors import tensor_types
from tests.onnx_builders import one_node

TARGET = ["--target", "kirin9050"]
LONG_NAME = "t" * 20_000            # past dot's 16 KB quoted string
NUL_NAME = "mat\x00mul"             # dot's scanner ends a string at the NUL


def named_model(path: Path) -> Path:
    """Two MatMuls: the first named with a NUL, their tensor between them named with 20,000
    characters (MatMul is not memory-bound: the build compiles no PyPTO kernel)."""
    weights = [numpy_helper.from_array(np.ones((3, 4), np.float32), "w1"),
               numpy_helper.from_array(np.ones((4, 2), np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], [LONG_NAME], name=NUL_NAME),
             helper.make_node("MatMul", [LONG_NAME, "w2"], ["y"], name="second")]
    graph = helper.make_graph(nodes, "named", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 2])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def parallel_model(branches: int, length: int, joined: bool = False) -> onnx.ModelProto:
    """``x`` read by ``branches`` chains of ``length`` Relus, each chain's end a model output
    (or with ``joined`` their Sum the one output): one rank as wide as the branches, the shape
    dot takes longest over."""
    typed = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 8])  # noqa
    nodes, ends = [], []
    for branch in range(branches):
        tensor = "x"
        for step in range(length):
            nodes.append(helper.make_node("Relu", [tensor], [f"b{branch}_{step}"]))
            tensor = f"b{branch}_{step}"
        ends.append(tensor)
    if joined:
        nodes.append(helper.make_node("Sum", ends, ["sum"]))
        ends = ["sum"]
    graph = helper.make_graph(nodes, "parallel", [typed("x")], [typed(e) for e in ends],
                              value_info=[typed(n.output[0]) for n in nodes])
    return helper.make_model(graph)


def parallel_facts(branches: int, length: int, regions: bool, joined: bool = False
                   ) -> GraphFacts:
    """Each branch a fused region of its own, or no region at all."""
    model = parallel_model(branches, length, joined)
    region_of = ({f"b{branch}_{step}": f"region_{branch}" for branch in range(branches)
                  for step in range(length)} if regions else {})
    return GraphFacts(model, tensor_types(model), region_of,
                      {region: True for region in region_of.values()}, {})


def quoted_strings(source: str) -> list[str]:
    return re.findall(r'"((?:[^"\\]|\\.)*)"', source)


@pytest.fixture(scope="module")
def plain_message(tmp_path_factory) -> ptom_pb2.CompiledModel:
    """The blob of a one-MatMul model, built without any PyPTO kernel: its graph is replaced
    by the tests' large ones."""
    folder = tmp_path_factory.mktemp("plain")
    model = folder / "matmul.onnx"
    onnx.save(one_node("MatMul", [2, 3], opset=17,
                       params={"w": np.ones((3, 4), np.float32)}), model)
    out = folder / "matmul.ptom"
    assert cli.main([str(model), *TARGET, "-o", str(out), "--no-report", "--quiet",
                     "--cache-dir", str(folder / "cache")]) == 0
    return blob.read(out)


def with_graph(message: ptom_pb2.CompiledModel, model: onnx.ModelProto,
               regions: bool = False) -> ptom_pb2.CompiledModel:
    """``message`` holding ``model`` as its imported graph, with ``regions`` each op producing
    an output a kernel that fell back."""
    copy = ptom_pb2.CompiledModel()
    copy.CopyFrom(message)
    copy.source_onnx_model = model.SerializeToString()
    if regions:
        for index, value in enumerate(model.graph.output):
            copy.kernels.add(id=f"region_{index}", nodes=[value.name], compiled=False,
                             fallback_reason="a reason", fallback_category="compile failed")
    return copy


# -- row 6: names dot cannot take -----------------------------------------------------------

def test_a_nul_or_a_20000_character_name_is_printable_and_short_for_dot_and_whole_in_search():
    weights = [numpy_helper.from_array(np.ones((3, 4), np.float32), "w1")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], [LONG_NAME], name=NUL_NAME)]
    graph = helper.make_graph(nodes, "named", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info(
            LONG_NAME, TensorProto.FLOAT, [2, 4])], weights)
    model = helper.make_model(graph)
    facts = GraphFacts(model, tensor_types(model), {LONG_NAME: "region\x00" + LONG_NAME},
                       {"region\x00" + LONG_NAME: True}, {})
    source, search, members = dot_source(facts)
    assert "\x00" not in source and "mat\\\\x00mul" in source  # shown as Python writes it
    assert max(len(text) for text in quoted_strings(source)) <= graph_view.MAX_DOT_TEXT + 10
    assert search["op0"] == f"MatMul {NUL_NAME} x w1 {LONG_NAME}"  # the whole names
    assert list(members) == ["region\x00" + LONG_NAME]
    drawing = draw(facts)
    assert drawing.notice == "" and drawing.svg.count('class="node op fused"') == 1
    assert drawing.svg.count('class="cluster region"') == 1  # named by a head and a digest


def test_a_build_of_a_model_with_such_names_writes_its_report(tmp_path):
    """Before, the whole compile ran and dot's 16 KB string limit failed it: exit 3, nothing
    written; and `report` on such a blob exited 3."""
    model = named_model(tmp_path / "named.onnx")
    assert cli.main([str(model), *TARGET, "--quiet", "--cache-dir", str(tmp_path / "cache")]) == 0
    page = (tmp_path / "named.kirin9050.report.html").read_text()
    assert 'id="graph-svg"' in page and 'id="graph-notice"' not in page
    assert "mat\\x00mul" in page                # the box's label
    data = json.loads(re.search(r'id="graph-data">(.*?)</script>', page).group(1))
    assert any(NUL_NAME in text and LONG_NAME in text for text in data["search"].values())
    again = tmp_path / "again.html"
    assert cli.main(["report", str(tmp_path / "named.kirin9050.ptom"), "-o", str(again),
                     "--quiet"]) == 0
    assert again.read_text() == page            # the same blob, the same page


# -- row 7: graphs too large for dot in seconds ---------------------------------------------

def test_1000_parallel_3_op_regions_are_drawn_one_box_each():
    """Before, dot took 117 of its 120 s on such a graph, each branch a cluster (measured here:
    1,000 clusters of one op side by side took 142 s)."""
    facts = parallel_facts(1000, 3, regions=True)
    assert graph_view.box_count(facts, whole_regions=False) == 4001
    drawing = draw(facts)
    assert drawing.notice.startswith("The graph has 4,001 boxes (ops, inputs and outputs) and "
                                     "1,000 fused regions")
    assert "each fused region is drawn as one box" in drawing.notice
    svg = html.unescape(drawing.svg)  # dot writes a class's dash as an entity
    assert svg.count('class="node op fused region-box"') == 1000
    assert 'class="cluster' not in svg and drawing.members == {
        f"region_{index}": [] for index in range(1000)}
    # a region's box is searched by every op's names in it
    assert drawing.search["region-region_7"] == " ".join(
        f"Relu  {i} {o}" for i, o in (("x", "b7_0"), ("b7_0", "b7_1"), ("b7_1", "b7_2")))


def test_past_300_regions_a_small_graph_draws_them_one_box_each_too():
    """dot's time grows far faster with clusters than with boxes (measured: 1,000 clusters of
    one op side by side, 2,001 boxes, took 142 s)."""
    drawing = draw(parallel_facts(graph_view.MAX_CLUSTERS + 1, 1, regions=True))
    assert "and 301 fused regions" in drawing.notice
    assert html.unescape(drawing.svg).count('region-box"') == 301
    assert draw(parallel_facts(graph_view.MAX_CLUSTERS, 1, regions=True)).notice == ""


@pytest.mark.parametrize("branches, length", [(1000, 3), (3000, 1)])
def test_a_graph_past_the_bound_without_regions_to_merge_is_not_drawn(branches, length,
                                                                       monkeypatch):
    def no_layout(source, budget_s):
        raise AssertionError("dot was run on a graph past the bound")

    monkeypatch.setattr(graph_view, "lay_out", no_layout)
    drawing = draw(parallel_facts(branches, length, regions=False))
    assert drawing.svg == "" and drawing.notice.startswith("The graph is not drawn")
    assert f"{branches * length + branches + 1:,} boxes" in drawing.notice


@pytest.mark.browser
@pytest.mark.parametrize("regions", [False, True])
def test_the_page_of_a_3000_output_graph_has_its_tables_and_says_why_no_drawing(
        plain_message, regions, tmp_path):
    message = with_graph(plain_message, parallel_model(3000, 1), regions)
    page = render_report(message)
    assert page == render_report(message)       # deterministic
    assert 'id="graph-svg"' not in page and 'id="graph-data"' not in page
    assert re.search(r'<div class="notice" id="graph-notice">The graph is not drawn', page)
    # 3,000 identical kernels that fell back: one row and one card
    assert page.count('<tr class="kernel-row"') == page.count('<details class="card"') == regions
    path = tmp_path / "page.html"
    path.write_text(page)
    try:
        with browser.page() as opened:
            opened.goto(path.as_uri())
            errors = opened.errors
            notice = opened.text_content("#graph-notice")
    except browser.ChromiumMissing as missing:
        pytest.fail(str(missing))
    assert errors == [] and "not drawn" in notice  # the script runs on a page without a drawing


@pytest.mark.browser
def test_a_click_on_a_region_drawn_as_one_box_opens_its_card(plain_message, tmp_path):
    message = with_graph(plain_message, parallel_model(graph_view.MAX_CLUSTERS + 1, 1), True)
    path = tmp_path / "page.html"
    path.write_text(render_report(message))
    try:
        with browser.page() as opened:
            opened.goto(path.as_uri())
            box = opened.locator("#graph g.region-box").nth(5)
            clicked = box.get_attribute("id").removeprefix("region-")
            box.dispatch_event("click")  # a wide row of boxes: most are out of the view
            cards = opened.evaluate("() => [...document.querySelectorAll('details.card[open]')]"
                                    ".map(c => c.dataset.kernels.split(' '))")
            errors = opened.errors
    except browser.ChromiumMissing as missing:
        pytest.fail(str(missing))
    # the 301 kernels are identical: one card for all, and it opens
    assert errors == [] and clicked == "region_5" and len(cards) == 1 and clicked in cards[0]


def test_a_layout_past_its_time_budget_leaves_a_page_that_says_so(monkeypatch):
    monkeypatch.setattr(graph_view, "DOT_BUDGET_S", 0.0)
    monkeypatch.setattr(graph_view, "DOT_BUDGET_PER_BOX_S", 1e-6)
    drawing = draw(parallel_facts(300, 3, regions=True))
    assert drawing.svg == "" and "did not lay the graph out within its budget" in drawing.notice


def test_a_layout_dot_fails_leaves_a_page_that_says_why(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Error: out of memory' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    drawing = draw(parallel_facts(2, 3, regions=True))
    assert drawing.svg == ""
    assert "dot failed on the graph (exit code 1: Error: out of memory)" in drawing.notice
    with pytest.raises(LayoutFailed):
        lay_out("digraph {", 10)


def test_a_graphviz_that_cannot_draw_svg_stops_the_build_before_the_work(tmp_path, monkeypatch,
                                                                         capfd):
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Format: \"svg\" not recognized. Use one of:' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    out = tmp_path / "out"
    out.mkdir()
    model = tmp_path / "model.onnx"
    onnx.save(one_node("Relu", [2, 3], opset=17), model)
    assert cli.main([str(model), *TARGET, "-o", str(out / "model.ptom"),
                     "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capfd.readouterr().err
    assert "cannot draw SVG" in err and "--no-report" in err and "Traceback" not in err
    assert list(out.iterdir()) == []


# -- row 20: a blob whose graph has a node without outputs ----------------------------------

def test_report_on_a_blob_with_a_node_without_outputs_draws_it(plain_message, tmp_path):
    """Before: IndexError, exit 3."""
    graph = onnx.load_from_string(plain_message.source_onnx_model)
    graph.graph.node.append(helper.make_node("Relu", ["x"], [], name="dangling"))
    odd = tmp_path / "odd.ptom"
    blob.write(odd, with_graph(plain_message, graph))
    page = tmp_path / "odd.html"
    assert cli.main(["report", str(odd), "-o", str(page), "--quiet"]) == 0
    text = page.read_text()
    assert re.search(r'<g id="op1" class="node op other">', text) and "dangling" in text
