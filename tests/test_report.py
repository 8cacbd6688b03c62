"""The HTML fusion report: made from the blob alone, deterministic, and checked in a real browser
(Debian's headless Chromium driven by Playwright) against the build's --json summary."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from pypto_offline.offline_compiler import blob
from pypto_offline.report import render_report
from pypto_offline.report.graph_view import condense, layout, op_graph
from tests.onnx_builders import GraphBuilder

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("PYPTO_OFFLINE_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "build" / "test-artifacts"
# 3 fused regions (one the decoder's Sigmoid with its ReduceMean over one element); 18 ops the
# registry knows left unfused (its six 1-D convolutions among them)
REPORT_MODEL = "silero_vad_16k_static"
# Flags that keep Chromium from reaching out on its own (update checks, sync, safe browsing).
QUIET_CHROMIUM = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-quic", "--disable-default-apps"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "pypto_offline", *map(str, args)],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def corpus_build(tmp_path_factory):
    """A corpus model compiled by the CLI with its report, and the --json summary."""
    from bench import corpus

    folder = tmp_path_factory.mktemp("report")
    model = folder / f"{REPORT_MODEL}.onnx"
    shutil.copy(corpus.model_path(REPORT_MODEL), model)
    shapes = corpus.MODELS[REPORT_MODEL].shape_args
    done = run_cli(model, "--target", "kirin9050", *shapes, "--json",
                   "--cache-dir", folder / "cache")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    return summary, Path(summary["blob"]), Path(summary["report"])


def test_the_build_writes_the_report_beside_the_blob(corpus_build):
    summary, blob_path, report = corpus_build
    assert report == blob_path.with_name(f"{REPORT_MODEL}.kirin9050.report.html")
    assert report.stat().st_size > 10_000


def test_the_report_regenerates_byte_identical_from_the_blob(corpus_build, tmp_path):
    _, blob_path, report = corpus_build
    again = tmp_path / "again.html"
    done = run_cli("report", blob_path, "-o", again)
    assert done.returncode == 0, done.stderr
    assert again.read_bytes() == report.read_bytes()


def test_the_page_holds_everything_inline(corpus_build):
    html = corpus_build[2].read_text()
    for external in ("<link", "src=\"http", "src='http", "@import", "url(http"):
        assert external not in html
    assert "default-src 'none'" in html   # the page's own policy forbids any fetch


def test_report_in_headless_chromium_matches_the_json_summary(corpus_build):
    summary, blob_path, report = corpus_build
    message = blob.read(blob_path)
    page_facts = browse(report)
    assert page_facts["requests"] == [report.as_uri()], "the page made a network request"
    figures = page_facts["figures"]
    assert len(figures) >= 20
    for key, shown in figures.items():
        if key == "compile_seconds":
            continue
        value = summary
        for part in key.split("."):
            value = value[part]
        expected = os.path.basename(value) if key == "model" else value
        assert json.loads(shown["value"]) == expected, key
        assert shown["text"].strip(), key
    # one card per fused kernel, a reason per unfused memory-bound op
    assert sorted(page_facts["cards"]) == sorted(k.id for k in message.kernels)
    assert len(page_facts["cards"]) == summary["pypto"]["compiled"] + summary["pypto"]["fell_back"]
    assert page_facts["reasons"] == {u.node: u.reason for u in message.unfused}
    assert all(page_facts["reasons"].values()) and len(message.unfused) == 18
    # clicking a region in the graph opens that card, and only that one
    assert page_facts["opened_before"] == []
    assert page_facts["opened_after_click"] == [page_facts["clicked"]]


def browse(report: Path) -> dict:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: install Debian's 'chromium' package "
                    f"(.ci/run does) or set PYPTO_OFFLINE_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=QUIET_CHROMIUM)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            requests: list[str] = []
            page.on("request", lambda request: requests.append(request.url))
            page.goto(report.as_uri())
            facts = page.evaluate(PAGE_FACTS)
            region = page.locator("#graph g.region").first
            clicked = region.get_attribute("data-kernel")
            region.click()
            opened = page.evaluate(OPEN_CARDS)
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / f"report_{REPORT_MODEL}.png"))
        finally:
            browser.close()
    return {**facts, "requests": requests, "clicked": clicked, "opened_after_click": opened}


OPEN_CARDS = "() => [...document.querySelectorAll('details.card[open]')].map(c => c.dataset.kernel)"
PAGE_FACTS = """() => ({
  figures: Object.fromEntries([...document.querySelectorAll('#summary-table [data-key]')].map(
    td => [td.dataset.key, {value: td.dataset.value, text: td.textContent}])),
  cards: [...document.querySelectorAll('details.card')].map(c => c.dataset.kernel),
  reasons: Object.fromEntries([...document.querySelectorAll('tr.unfused-op')].map(
    tr => [tr.dataset.node, tr.querySelector('.reason').textContent])),
  opened_before: [...document.querySelectorAll('details.card[open]')].map(c => c.dataset.kernel),
})"""


# -- the graph drawing, on small synthetic graphs -------------------------------------------

def chain_model(length: int) -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 8], onnx.TensorProto.FLOAT)
    for _ in range(length):
        x = b.op("Relu", [x])
    return b.model(x)


def test_a_chain_outside_every_region_condenses_to_one_box():
    model = chain_model(6)
    graph = op_graph(model)
    condensed, members = condense(graph, {}, {})
    assert condensed.number_of_nodes() == 1
    (only,) = members.values()
    assert len(only) == 6


def test_regions_and_unfused_ops_keep_their_own_boxes():
    model = chain_model(6)
    nodes = [n.output[0] for n in model.graph.node]
    region_of = {nodes[2]: "region_0", nodes[3]: "region_0"}
    drawing = layout(model, region_of, {"region_0": True}, {nodes[5]: "boundary: graph output"})
    kinds = [box.kind for box in drawing.boxes]
    assert kinds == ["run", "region", "op", "unfused"]
    assert [box.kernel for box in drawing.boxes if box.kind == "region"] == ["region_0"]
    # each box in its own layer, one edge between consecutive boxes
    assert len({box.y for box in drawing.boxes}) == 4 and len(drawing.edges) == 3


def test_render_is_deterministic_for_the_same_blob(corpus_build):
    message = blob.read(corpus_build[1])
    assert render_report(message) == render_report(blob.read(corpus_build[1]))
