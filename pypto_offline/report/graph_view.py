"""The model drawn as a layered DAG by Graphviz's ``dot``: every op a box, every fused region a
cluster holding its ops, the model's inputs and outputs at the ends, every tensor edge labelled
with its shape and dtype (docs/report.md, "The graph").

``dot`` lays out a DAG in layers with few crossings, as Netron and TensorBoard draw models; the
page embeds the SVG it writes (no request leaves the page) and its script adds pan, zoom, search
and collapsing. A graph past ``MAX_BOXES`` boxes or ``MAX_CLUSTERS`` regions is drawn with one
box per fused region, and past ``MAX_BOXES`` with that too not at all; a layout that fails or
runs out of its time budget leaves the page without a drawing. In each case the page says why
(``Drawing.notice``), and its tables and cards still name every op and tensor in full. Names
are made printable and short for dot.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

import onnx

from pypto_offline.report.dot import LayoutFailed, lay_out
from pypto_offline.report.tensors import TensorType, UNKNOWN

MAX_NAME = 32           # characters of a node's name shown in its box (all of it on hover)
# Characters of any one string given to dot: its scanner refuses a quoted string of 16 KB
# (Graphviz 2.43 measured: 16,383 bytes fail), and a hover text is past reading long before.
MAX_DOT_TEXT = 1000
MAX_DOT_ID = 200        # characters of a region's id used as dot's cluster name and svg id
# What dot lays out within seconds, and a page of under 5 MB holds (an SVG takes ~1 KB a box).
# dot's time grows with a rank's width, and with clusters far faster than with boxes: measured
# on a loaded machine, 2,500 boxes of one input read by 625 three-op branches took 5 s, 1,250
# region boxes beside 1,250 outputs 10 s; 300 clusters of five ops side by side 9 s, 500 of
# three 35 s, 1,000 of one 142 s. The largest corpus graph has 400 boxes and 50 clusters. Past
# either bound each region is one box; past MAX_BOXES with that too, the graph is not drawn.
MAX_BOXES = 2500        # ops, inputs and outputs (weights are not drawn)
MAX_CLUSTERS = 300      # fused regions drawn as clusters of their ops
# dot's time: a base and a share per box, so a small graph is not given minutes and a large one
# is not cut short; ten times the measured times, so that the same blob gives the same page.
DOT_BUDGET_S = 30.0
DOT_BUDGET_PER_BOX_S = 0.03


@dataclass(frozen=True)
class Drawing:
    svg: str                      # the <svg> element dot wrote, prolog and comments removed;
                                  # "" when the graph is not drawn
    search: dict[str, str]        # svg element id -> text a search matches (op, names, tensors)
    members: dict[str, list[str]] # region id -> svg ids of its ops and inner edges
    nodes: int
    regions: int
    notice: str = ""              # why the drawing is simplified or missing, for the page


@dataclass(frozen=True)
class GraphFacts:
    """What the drawing shows of the model, apart from how dot places it."""
    model: onnx.ModelProto
    types: dict[str, TensorType]
    region_of: dict[str, str]     # node id (first output) -> region id
    compiled: dict[str, bool]     # region id -> its kernel shipped
    unfused: dict[str, str]       # node id -> "category: reason"


def draw(facts: GraphFacts) -> Drawing:
    """The drawing of the whole graph when dot lays it out in seconds (MAX_BOXES,
    MAX_CLUSTERS), else of its regions as one box each, else none; a page without a drawing
    says why."""
    ops, regions = len(facts.model.graph.node), len(facts.compiled)
    boxes, clusters = box_count(facts, whole_regions=False), len(_drawn_regions(facts))
    whole_regions = boxes > MAX_BOXES or clusters > MAX_CLUSTERS
    notice = ""
    if whole_regions:
        notice = (f"The graph has {boxes:,} boxes (ops, inputs and outputs) and {clusters:,} "
                  f"fused regions, more than dot lays out in seconds ({MAX_BOXES:,} boxes, "
                  f"{MAX_CLUSTERS:,} regions): each fused region is drawn as one box (its ops "
                  f"are in its kernel card).")
        boxes = box_count(facts, whole_regions=True)
        if boxes > MAX_BOXES:
            return Drawing("", {}, {}, ops, regions, (
                f"The graph is not drawn: it has {boxes:,} boxes with each fused region drawn "
                f"as one box, more than the {MAX_BOXES:,} dot lays out in seconds. The kernel "
                f"table and cards below hold every region."))
    source, search, members = dot_source(facts, whole_regions)
    try:
        svg = lay_out(source, DOT_BUDGET_S + DOT_BUDGET_PER_BOX_S * boxes)
    except LayoutFailed as failed:
        return Drawing("", {}, {}, ops, regions, f"The graph is not drawn: {failed}. The kernel "
                       f"table and cards below hold every region.")
    return Drawing(svg, search, members, ops, regions, notice)


def box_count(facts: GraphFacts, whole_regions: bool) -> int:
    """The boxes dot would lay out: the model's inputs (weights are not drawn) and outputs, and
    its ops, or with ``whole_regions`` one box per region and the ops outside them."""
    graph = facts.model.graph
    weights = {init.name for init in graph.initializer}
    ends = sum(v.name not in weights for v in graph.input) + len(graph.output)
    if not whole_regions:
        return ends + len(graph.node)
    outside = sum(facts.region_of.get(_key(node)) is None for node in graph.node)
    return ends + outside + len(_drawn_regions(facts))


def dot_source(facts: GraphFacts, whole_regions: bool = False
               ) -> tuple[str, dict[str, str], dict[str, list[str]]]:
    """The graph in dot's language, with the search text and cluster members of each id. With
    ``whole_regions`` each region is one box (its search text all of its ops'), no cluster."""
    graph = facts.model.graph
    weights = {init.name for init in graph.initializer}
    box = _boxes(facts, whole_regions)
    producer = {out: box[index] for index, node in enumerate(graph.node) for out in node.output}
    search: dict[str, str] = {}
    members: dict[str, list[str]] = {region: [] for region in facts.compiled}
    lines = ['digraph model {', 'graph [rankdir=TB, nodesep=0.25, ranksep=0.35, '
             'fontname="Helvetica", fontsize=10, newrank=true];',
             'node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, '
             'height=0.3, margin="0.08,0.03"];',
             'edge [fontname="Helvetica", fontsize=8, arrowsize=0.6];']
    for index, value in enumerate(v for v in graph.input if v.name not in weights):
        ident = f"in{index}"
        producer[value.name] = ident
        lines.append(_tensor_node(ident, value.name, facts, "input"))
        search[ident] = f"input {value.name}"
    by_region: dict[str, list[str]] = {}
    region_text: dict[str, list[str]] = {}  # a whole region's box -> its ops' search texts
    for index, node in enumerate(graph.node):
        ident, region = box[index], facts.region_of.get(_key(node))
        text = " ".join([node.op_type, node.name, *node.input, *node.output])
        if whole_regions and region is not None:
            region_text.setdefault(ident, []).append(text)
            continue
        line = _op_node(ident, node, facts)
        search[ident] = text
        if region is None:
            lines.append(line)
        else:
            by_region.setdefault(region, []).append(line)
            members[region].append(ident)
    for region, body in by_region.items():
        lines.append(_cluster(region, body, facts.compiled[region]))
    if whole_regions:
        lines.extend(_region_box(region, ops, facts.compiled[region])
                     for region, ops in _drawn_regions(facts).items())
        search.update((ident, " ".join(texts)) for ident, texts in region_text.items())
    for index, value in enumerate(graph.output):
        ident = f"out{index}"
        lines.append(_tensor_node(ident, value.name, facts, "output"))
        search[ident] = f"output {value.name}"
        if value.name in producer:
            lines.append(_edge(producer[value.name], ident, value.name, facts, f"e_{ident}"))
    lines.extend(_edges(facts, box, producer, members, whole_regions))
    lines.append("}")
    return "\n".join(lines), search, members


def _edges(facts: GraphFacts, box: list[str], producer: dict[str, str],
           members: dict[str, list[str]], whole_regions: bool) -> list[str]:
    """An edge per tensor an op reads from another box (weights are not drawn); between two
    whole regions, one per tensor, and none inside a region."""
    graph = facts.model.graph
    weights = {init.name for init in graph.initializer}
    lines, drawn = [], set()
    for index, node in enumerate(graph.node):
        target = box[index]
        for name in dict.fromkeys(node.input):
            if not name or name in weights or name not in producer:
                continue
            if whole_regions and (producer[name] == target or (name, target) in drawn):
                continue
            drawn.add((name, target))
            edge = f"e{len(lines)}"
            lines.append(_edge(producer[name], target, name, facts, edge))
            region = facts.region_of.get(_key(node))
            if region is not None and producer[name] in members[region]:
                members[region].append(edge)
    return lines


def _key(node: onnx.NodeProto) -> str | None:
    """A node's id in the blob (its first output); None for a node without outputs, which an
    odd or hostile blob may hold: it is drawn, in no region."""
    return node.output[0] if node.output else None


def _boxes(facts: GraphFacts, whole_regions: bool) -> list[str]:
    """Per op, in the graph's order, the dot node that draws it: its own box ``op<index>``, or
    with ``whole_regions`` its region's box."""
    nodes = facts.model.graph.node
    if not whole_regions:
        return [f"op{index}" for index in range(len(nodes))]
    return [f"op{index}" if facts.region_of.get(_key(node)) is None else
            _region_ident(facts.region_of[_key(node)]) for index, node in enumerate(nodes)]


def _drawn_regions(facts: GraphFacts) -> Counter[str]:
    """The regions that hold an op of the graph, with their ops' count, in the order of their
    first op."""
    regions = (facts.region_of.get(_key(node)) for node in facts.model.graph.node)
    return Counter(region for region in regions if region is not None)


def _tensor_node(ident: str, name: str, facts: GraphFacts, kind: str) -> str:
    shown = facts.types.get(name, UNKNOWN).text
    label = f"{kind} {_short(name)}\n{shown}"
    return (f'{ident} [id="{ident}", class="tensor {kind}", shape=ellipse, fillcolor="#eef5e9", '
            f'label={_quote(label)}, '
            f'tooltip={_quote(f"{kind} {name}: {shown}")}];')


def _op_node(ident: str, node: onnx.NodeProto, facts: GraphFacts) -> str:
    key = _key(node)
    region = facts.region_of.get(key)
    reason = facts.unfused.get(key)
    if region is not None:
        kind, fill = ("fused", "#d7e9f7") if facts.compiled[region] else ("fell-back", "#fde0dc")
    elif reason is not None:
        kind, fill = "unfused", "#fff3e0"
    else:
        kind, fill = "other", "#ffffff"
    outputs = "\n".join(f"{out}: {facts.types.get(out, UNKNOWN).text}" for out in node.output)
    tip = f"{node.op_type} {node.name or key or ''}\n{outputs}" + (f"\nnot fused: {reason}"
                                                                   if reason else "")
    label = node.op_type + (f"\n{_short(node.name)}" if node.name else "")
    return (f'{ident} [id="{ident}", class="op {kind}", fillcolor="{fill}", '
            f'label={_quote(label)}, tooltip={_quote(tip)}];')


def _cluster(region: str, body: list[str], compiled: bool) -> str:
    state = "compiled" if compiled else "fell back"
    colour, fill = ("#2b7bb9", "#eef6fc") if compiled else ("#b3261e", "#fdf1ef")
    head = (f'subgraph {_quote(f"cluster_{_dot_id(region)}")} {{ '
            f'id={_quote(_region_ident(region))}; '
            f'class="region{"" if compiled else " fell-back"}"; '
            f'label={_quote(f"{region} ({len(body)} ops, {state})")}; labeljust=l; '
            f'style="rounded,filled"; color="{colour}"; fillcolor="{fill}"; '
            f'tooltip={_quote(f"{region}: click for its kernel card")};')
    return "\n".join([head, *body, "}"])


def _region_box(region: str, ops: int, compiled: bool) -> str:
    """A whole region as one box, coloured as its cluster would be; a click opens its card."""
    kind, fill = ("fused", "#d7e9f7") if compiled else ("fell-back", "#fde0dc")
    ident, label = _region_ident(region), f"{_short(region)}\n{ops} ops"
    return (f'{_quote(ident)} [id={_quote(ident)}, class="op {kind} region-box", '
            f'fillcolor="{fill}", label={_quote(label)}, '
            f'tooltip={_quote(f"{region}: {ops} ops, click for its kernel card")}];')


def _region_ident(region: str) -> str:
    """The svg id of a region's cluster or box: the page's script reads the region back from it."""
    return f"region-{_dot_id(region)}"


def _edge(tail: str, head: str, tensor: str, facts: GraphFacts, ident: str) -> str:
    shown = facts.types.get(tensor, UNKNOWN)
    return (f'{_ref(tail)} -> {_ref(head)} [id="{ident}", label={_quote(_dims(shown))}, '
            f'tooltip={_quote(f"{tensor}: {shown.text}")}];')


def _dims(tensor: TensorType) -> str:
    """The edge's label: ``1×64×32 f32``, short enough to sit beside the edge."""
    short = tensor.dtype.replace("float", "f").replace("uint", "u").replace("int", "i")
    return f"{'×'.join(str(d) for d in tensor.shape) or 'scalar'} {short}"


def _short(text: str) -> str:
    """A name as its box shows it: printable, its last MAX_NAME characters."""
    text = _visible(text)
    return text if len(text) <= MAX_NAME else "…" + text[-(MAX_NAME - 1):]


def _visible(text: str) -> str:
    """Every character one cannot see written as Python writes it (``\\x00``): dot's scanner
    ends a string at a NUL, and an SVG may not hold most control characters."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _dot_id(text: str) -> str:
    """A region's id as dot's cluster name and the svg's id: itself when short and printable;
    else a printable head and a digest of the whole, so that two regions never share one."""
    if len(text) <= MAX_DOT_ID and text.isprintable():
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{_visible(text)[:MAX_DOT_ID // 2]}…{digest}"


def _ref(ident: str) -> str:
    """A node's name in an edge: the plain ``op3``, or quoted (a region's box)."""
    return ident if ident.isidentifier() else _quote(ident)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _quote(text: str) -> str:
    """``text`` as a dot string: its lines made visible, at most MAX_DOT_TEXT characters."""
    text = "\n".join(_visible(line) for line in text.split("\n"))
    if len(text) > MAX_DOT_TEXT:
        text = text[:MAX_DOT_TEXT - 1] + "…"
    return f'"{_escape(text)}"'
