"""The model drawn as a layered DAG by Graphviz's ``dot``: every op a box, every fused region a
cluster holding its ops, the model's inputs and outputs at the ends, every tensor edge labelled
with its shape and dtype (docs/report.md, "The graph").

``dot`` lays out a DAG in layers with few crossings, as Netron and TensorBoard draw models; the
page embeds the SVG it writes (no request leaves the page) and its script adds pan, zoom, search
and collapsing. Graphviz is a system package (Debian's ``graphviz``): a build that writes a
report checks for it before any work (``require_dot``).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

import onnx

from pypto_offline.errors import PyptoOfflineError
from pypto_offline.report.tensors import TensorType, UNKNOWN

# The attributes dot writes on each label for the fonts set below (the page's CSS sets them)
FONT_ATTRIBUTES = (' text-anchor="middle"', ' font-family="Helvetica,sans-Serif"',
                   ' font-size="10.00"', ' font-size="8.00"')
MAX_NAME = 32           # characters of a node's name shown in its box (all of it on hover)
DOT_TIMEOUT_S = 120     # a graph of ~900 ops and ~100 clusters lays out in a few seconds


class GraphvizMissing(PyptoOfflineError):
    """The machine cannot lay out the report's graph: an environment to fix, exit code 2."""


def require_dot() -> str:
    """The path of ``dot``; raises GraphvizMissing (what to install) when there is none."""
    found = shutil.which("dot")
    if not found:
        raise GraphvizMissing("the report's graph is laid out by Graphviz's 'dot', which is "
                              "not on PATH", fix="install Graphviz (Debian: apt-get install "
                              "graphviz), or pass --no-report")
    return found


def graphviz_version() -> str:
    done = subprocess.run([require_dot(), "-V"], capture_output=True, text=True, check=False)
    found = re.search(r"version (\S+)", done.stderr)
    return found.group(1) if found else "unknown"


@dataclass(frozen=True)
class Drawing:
    svg: str                      # the <svg> element dot wrote, prolog and comments removed
    search: dict[str, str]        # svg element id -> text a search matches (op, names, tensors)
    members: dict[str, list[str]] # region id -> svg ids of its ops and inner edges
    nodes: int
    regions: int


@dataclass(frozen=True)
class GraphFacts:
    """What the drawing shows of the model, apart from how dot places it."""
    model: onnx.ModelProto
    types: dict[str, TensorType]
    region_of: dict[str, str]     # node id (first output) -> region id
    compiled: dict[str, bool]     # region id -> its kernel shipped
    unfused: dict[str, str]       # node id -> "category: reason"


def draw(facts: GraphFacts) -> Drawing:
    source, search, members = dot_source(facts)
    return Drawing(_clean(_run_dot(source)), search, members, len(facts.model.graph.node),
                   len(facts.compiled))


def dot_source(facts: GraphFacts) -> tuple[str, dict[str, str], dict[str, list[str]]]:
    """The graph in dot's language, with the search text and cluster members of each id."""
    graph = facts.model.graph
    weights = {init.name for init in graph.initializer}
    node_id = {node.output[0]: f"op{index}" for index, node in enumerate(graph.node)}
    producer = {out: node_id[node.output[0]] for node in graph.node for out in node.output}
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
    for node in graph.node:
        key, ident = node.output[0], node_id[node.output[0]]
        line = _op_node(ident, node, facts)
        search[ident] = " ".join([node.op_type, node.name, *node.input, *node.output])
        region = facts.region_of.get(key)
        if region is None:
            lines.append(line)
        else:
            by_region.setdefault(region, []).append(line)
            members[region].append(ident)
    for region, body in by_region.items():
        lines.append(_cluster(region, body, facts.compiled[region]))
    for index, value in enumerate(graph.output):
        ident = f"out{index}"
        lines.append(_tensor_node(ident, value.name, facts, "output"))
        search[ident] = f"output {value.name}"
        if value.name in producer:
            lines.append(_edge(producer[value.name], ident, value.name, facts, f"e_{ident}"))
    edge_index = 0
    for node in graph.node:
        target = node_id[node.output[0]]
        for name in dict.fromkeys(node.input):
            if not name or name in weights or name not in producer:
                continue
            edge = f"e{edge_index}"
            edge_index += 1
            lines.append(_edge(producer[name], target, name, facts, edge))
            region = facts.region_of.get(node.output[0])
            if region is not None and producer[name] in members[region]:
                members[region].append(edge)
    lines.append("}")
    return "\n".join(lines), search, members


def _tensor_node(ident: str, name: str, facts: GraphFacts, kind: str) -> str:
    shown = facts.types.get(name, UNKNOWN).text
    label = f"{kind} {_short(name)}\n{shown}"
    return (f'{ident} [id="{ident}", class="tensor {kind}", shape=ellipse, fillcolor="#eef5e9", '
            f'label={_quote(label)}, '
            f'tooltip={_quote(f"{kind} {name}: {shown}")}];')


def _op_node(ident: str, node: onnx.NodeProto, facts: GraphFacts) -> str:
    key = node.output[0]
    region = facts.region_of.get(key)
    reason = facts.unfused.get(key)
    if region is not None:
        kind, fill = ("fused", "#d7e9f7") if facts.compiled[region] else ("fell-back", "#fde0dc")
    elif reason is not None:
        kind, fill = "unfused", "#fff3e0"
    else:
        kind, fill = "other", "#ffffff"
    outputs = "\n".join(f"{out}: {facts.types.get(out, UNKNOWN).text}" for out in node.output)
    tip = f"{node.op_type} {node.name or key}\n{outputs}" + (f"\nnot fused: {reason}"
                                                             if reason else "")
    label = node.op_type + (f"\n{_short(node.name)}" if node.name else "")
    return (f'{ident} [id="{ident}", class="op {kind}", fillcolor="{fill}", '
            f'label={_quote(label)}, tooltip={_quote(tip)}];')


def _cluster(region: str, body: list[str], compiled: bool) -> str:
    state = "compiled" if compiled else "fell back"
    colour, fill = ("#2b7bb9", "#eef6fc") if compiled else ("#b3261e", "#fdf1ef")
    head = (f'subgraph "cluster_{_escape(region)}" {{ id="region-{_escape(region)}"; '
            f'class="region{"" if compiled else " fell-back"}"; '
            f'label={_quote(f"{region} ({len(body)} ops, {state})")}; labeljust=l; '
            f'style="rounded,filled"; color="{colour}"; fillcolor="{fill}"; '
            f'tooltip={_quote(f"{region}: click for its kernel card")};')
    return "\n".join([head, *body, "}"])


def _edge(tail: str, head: str, tensor: str, facts: GraphFacts, ident: str) -> str:
    shown = facts.types.get(tensor, UNKNOWN)
    return (f'{tail} -> {head} [id="{ident}", label={_quote(_dims(shown))}, '
            f'tooltip={_quote(f"{tensor}: {shown.text}")}];')


def _dims(tensor: TensorType) -> str:
    """The edge's label: ``1×64×32 f32``, short enough to sit beside the edge."""
    short = tensor.dtype.replace("float", "f").replace("uint", "u").replace("int", "i")
    return f"{'×'.join(str(d) for d in tensor.shape) or 'scalar'} {short}"


def _short(text: str) -> str:
    return text if len(text) <= MAX_NAME else "…" + text[-(MAX_NAME - 1):]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _quote(text: str) -> str:
    return f'"{_escape(text)}"'


def _run_dot(source: str) -> str:
    done = subprocess.run([require_dot(), "-Tsvg"], input=source.encode(), capture_output=True,
                          timeout=DOT_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"Graphviz's dot failed on the report's graph: "
                           f"{done.stderr.decode(errors='replace')[-500:]}")
    return done.stdout.decode()


def _clean(svg: str) -> str:
    """The <svg> element alone: no XML prolog, doctype or comments (they name dot's version
    and the graph; the page says which Graphviz drew it), the fixed size left to the page."""
    svg = re.sub(r"<!--.*?-->\s*", "", svg[svg.index("<svg"):], flags=re.S)
    # the font of every label is the page's CSS (#graph-svg text): a page of 300 kernels
    # carries ~2,000 labels, and these attributes were 150 KB of it
    for attribute in FONT_ATTRIBUTES:
        svg = svg.replace(attribute, "")
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg id="graph-svg"', svg, count=1)
