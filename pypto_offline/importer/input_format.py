"""ATC's ``--input_format`` for an ONNX model: the layout its image inputs are in. ATC takes
NCHW (its default for ONNX), NCDHW or ND (anything) for an ONNX model; NHWC and NDHWC are for
TensorFlow's. ONNX's own ops read NCHW, so the format changes nothing compiled: it is checked
against the model (an NCHW model has a 4-D input, an NCDHW one a 5-D input) and recorded in the
blob's provenance when given (docs/outputs.md, "ATC's spellings")."""
from __future__ import annotations

from pypto_offline.errors import UsageError

# ATC's formats for an ONNX model → the rank of the inputs they describe (ND: any)
RANK_OF = {"NCHW": 4, "NCDHW": 5, "ND": None}
TENSORFLOW_ONLY = ("NHWC", "NDHWC")
ONNX_FORMATS = ", ".join(RANK_OF)


def parse_input_format(text: str) -> str:
    """``text`` as one of ATC's formats for an ONNX model, in upper case (any case is taken,
    as chip names are)."""
    value = text.strip().upper()
    if value in RANK_OF:
        return value
    if value in TENSORFLOW_ONLY:
        raise UsageError(f"--input_format {text} is ATC's for TensorFlow models; for an ONNX "
                         f"model ATC takes {ONNX_FORMATS}",
                         fix="an ONNX model's image inputs are NCHW: give --input_format NCHW, "
                             "or ND")
    raise UsageError(f"--input_format {text!r} is none of ATC's formats for an ONNX model "
                     f"({ONNX_FORMATS})", fix="give one of them, or leave the option out")


def check_input_format(graph, input_format: str | None) -> None:
    """An NCHW (NCDHW) model has at least one input of rank 4 (5), as ATC applies the format
    to those; ND, or no format given, takes any model. ``graph``: an ``ImportedGraph``, its
    inputs' shapes static."""
    rank = RANK_OF[input_format] if input_format else None
    if rank is None:
        return
    ranks = {name: len(graph.tensors[name].shape) for name in graph.inputs}
    if rank in ranks.values():
        return
    inputs = ", ".join(f"{name!r} {r}-D" for name, r in ranks.items()) or "none"
    raise UsageError(f"--input_format {input_format} describes {rank}-D inputs and the model has "
                     f"none (its inputs: {inputs})",
                     fix="give --input_format ND for inputs that are not images")
