"""Render the report: a jinja2 template and its script, one self-contained page.

Kernel sources are shown as plain text: highlighted, they tripled the bytes of a card, and a page
of 300 kernels went past its 5 MB bound (docs/report.md)."""
from __future__ import annotations

import base64
import re
from functools import lru_cache
from pathlib import Path

import jinja2
from markupsafe import Markup

from pypto_offline.offline_compiler import gears as gear_table
from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.offline_compiler.blob import write_atomically
from pypto_offline.offline_compiler.summary import shown, summarise
from pypto_offline.report.content import context

TEMPLATES = Path(__file__).with_name("templates")


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["kib"] = lambda n: f"{n / 1024:,.1f} KiB"
    env.filters["figure"] = shown  # "not measured" for a missing figure, "inf" for an infinite one
    env.filters["script_text"] = script_text
    return env


def script_text(markup: str) -> Markup:
    """Markup made the text of a <script type="text/html"> (a kernel card's body, docs/report.md):
    taken as it is, so it must not hold what ends or escapes a script's text. Every name and
    value in it is escaped (``<`` is ``&lt;``), so only the template itself could put one there."""
    if re.search(r"</script|<!--", markup, flags=re.I):
        raise ValueError("a report card's body holds '</script' or '<!--': the template must not")
    return Markup(markup)


def render_report(message: ptom_pb2.CompiledModel) -> str:
    """The page of a blob; of a blob of gears, a page that selects among each gear's page."""
    if message.gears:
        return _gears_page(message)
    template = _environment().get_template("report.html.j2")
    return template.render(**context(message))


def _gears_page(message: ptom_pb2.CompiledModel) -> str:
    """Each gear's figures and the kernels it shares with an earlier gear, and each gear's own
    page (headline, graph, kernel table and cards) in a frame of its own, one shown at a time
    (docs/report.md, "Gears"): a data: URL, so that each page keeps its ids and script."""
    summary = summarise(message)
    gears = []
    for index, gear in enumerate(summary["gears"]):
        own = gear_table.build_of(message, index)
        page = render_report(gear_table.gear_build(message, index)).encode()
        gears.append({**gear, "inputs": gear_table.shapes_text(gear["inputs"]),
                      "shared": [{"id": k.id, "gear": k.stored_in_gear} for k in own.kernels
                                 if index and k.HasField("stored_in_gear")],
                      "page": base64.b64encode(page).decode()})
    return _environment().get_template("gears.html.j2").render(
        model=message.provenance.model_name, target=message.target.name, gears=gears,
        verdict=summary["verification"], fell_back=summary["pypto"]["fell_back"])


def write_report(path: Path, message: ptom_pb2.CompiledModel) -> Path:
    """Written whole or not at all (temp file, then rename)."""
    write_atomically(path, render_report(message).encode())
    return path
