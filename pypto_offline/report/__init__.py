"""The HTML fusion report: one self-contained page made from a compiled model's blob content."""
from pypto_offline.report.render import render_report, write_report

__all__ = ["render_report", "write_report"]
