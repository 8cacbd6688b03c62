"""Graphviz's ``dot``, the program that lays out the report's graph: found and tried before any
work (``require_dot``), run within a time budget, and its SVG cleaned for the page
(docs/report.md, "The graph").

Graphviz is a system package (Debian's ``graphviz``). A layout that fails or runs out of time
raises ``LayoutFailed``: the page is still written, with a notice in place of the drawing.
"""
from __future__ import annotations

import re
import shutil
import subprocess

from pypto_offline.errors import PyptoOfflineError
from pypto_offline.progress import seconds_text

# The attributes dot writes on each label for the fonts the drawing sets (the page's CSS sets them)
FONT_ATTRIBUTES = (' text-anchor="middle"', ' font-family="Helvetica,sans-Serif"',
                   ' font-size="10.00"', ' font-size="8.00"')
# A graph of one node: what require_dot asks dot to draw, to know it can write SVG at all
TRIAL = b'digraph trial { a -> b; }'
TRIAL_TIMEOUT_S = 30


class GraphvizMissing(PyptoOfflineError):
    """The machine cannot lay out the report's graph: an environment to fix, exit code 2."""


class LayoutFailed(Exception):
    """dot failed on, or ran out of time for, one graph: that page is written without its
    drawing, and says why (the message is the page's words)."""


def dot_path() -> str:
    """The path of ``dot``; raises GraphvizMissing (what to install) when there is none."""
    found = shutil.which("dot")
    if not found:
        raise GraphvizMissing("the report's graph is laid out by Graphviz's 'dot', which is "
                              "not on PATH", fix="install Graphviz (Debian: apt-get install "
                              "graphviz), or pass --no-report")
    return found


def require_dot() -> str:
    """``dot``'s path once it has drawn a graph of two nodes as SVG: called before the work, so
    that a Graphviz without its SVG plugin (a package half installed, ``dot -c`` never run)
    stops the build with exit code 2 and what to do, rather than after the compiles."""
    found = dot_path()
    try:
        done = subprocess.run([found, "-Tsvg"], input=TRIAL, capture_output=True,
                              timeout=TRIAL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GraphvizMissing(f"Graphviz's dot ({found}) cannot run: {error}",
                              fix="reinstall Graphviz, or pass --no-report") from None
    if done.returncode != 0 or b"<svg" not in done.stdout:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise GraphvizMissing(f"Graphviz's dot ({found}) cannot draw SVG: "
                              f"{said[0] if said else f'exit code {done.returncode}'}",
                              fix="reinstall Graphviz (Debian: apt-get install --reinstall "
                                  "graphviz; then 'dot -c' as root), or pass --no-report")
    return found


def graphviz_version() -> str:
    done = subprocess.run([dot_path(), "-V"], capture_output=True, text=True, check=False)
    found = re.search(r"version (\S+)", done.stderr)
    return found.group(1) if found else "unknown"


def lay_out(source: str, budget_s: float) -> str:
    """The SVG element dot draws of ``source``, cleaned for the page; LayoutFailed when dot
    fails or takes longer than ``budget_s``."""
    try:
        done = subprocess.run([dot_path(), "-Tsvg"], input=source.encode(), capture_output=True,
                              timeout=budget_s, check=False)
    except subprocess.TimeoutExpired:
        raise LayoutFailed(f"Graphviz's dot did not lay the graph out within its budget of "
                           f"{seconds_text(budget_s)}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise LayoutFailed(f"Graphviz's dot failed on the graph (exit code {done.returncode}"
                           f"{': ' + said[0][:300] if said else ''})")
    svg = done.stdout.decode(errors="replace")
    if "<svg" not in svg:
        raise LayoutFailed("Graphviz's dot wrote no SVG for the graph")
    return clean(svg)


def clean(svg: str) -> str:
    """The <svg> element alone: no XML prolog, doctype or comments (they name dot's version
    and the graph; the page says which Graphviz drew it), the fixed size left to the page."""
    svg = re.sub(r"<!--.*?-->\s*", "", svg[svg.index("<svg"):], flags=re.S)
    # the font of every label is the page's CSS (#graph-svg text): a page of 300 kernels
    # carries ~2,000 labels, and these attributes were 150 KB of it
    for attribute in FONT_ATTRIBUTES:
        svg = svg.replace(attribute, "")
    # dot puts each element on a line of its own: those line breaks were ~13,000 text nodes in
    # that page's document; a label is inside its <text>, never between two tags
    svg = re.sub(r">\s+<", "><", svg)
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg id="graph-svg"', svg, count=1)
